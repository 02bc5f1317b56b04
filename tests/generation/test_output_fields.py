"""`return_dict_in_generate=True`: every field of DSpark's output against plain `generate`'s, and the returned
cache continues a later call exactly as plain's does (fp32, greedy)."""

import pytest
import torch

from tests.generation.test_families import make_family
from tests.helpers import make_drafter, make_target, ragged_prompts

NEW = 12


@pytest.fixture(scope="module")
def targets():
    return {"llama": make_target("llama", seed=21), "mistral": make_family("mistral", seed=3)}


def _continue(target, output, prompt_mask, new=10):
    """Plain greedy continuation from a generate output: its sequences, plain's final mask and its cache."""
    tail = prompt_mask.new_ones(len(prompt_mask), output.sequences.shape[1] - prompt_mask.shape[1])
    mask = torch.cat([prompt_mask, tail], dim=1)
    return target.generate(
        output.sequences,
        attention_mask=mask,
        cache=output.cache,
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )


def _scored_kwargs(eos: list[int], **extra) -> dict:
    """Greedy generate kwargs returning scores and logits, rows ending at `eos`, pad 0."""
    return dict(max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True, output_scores=True,
                output_logits=True, eos_token_id=eos, pad_token_id=0, **extra)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_returned_cache_matches_plain_and_continues_like_it(targets, name):
    target = targets[name]
    ids, mask = ragged_prompts(3, seed=5)
    reference = target.generate(
        ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True, pad_token_id=0
    )
    generated = reference.sequences[:, ids.shape[1] :]
    # EOS ids that end rows 1 and 2 early, so plain's cache holds the pad tokens it fed to finished rows
    eos = [int(generated[1, 2]), int(generated[2, 4])]
    kwargs = _scored_kwargs(eos)
    reference = target.generate(ids, attention_mask=mask, **kwargs)
    output = target.generate(ids, attention_mask=mask, assistant_model=make_drafter(target), **kwargs)
    assert set(output.keys()) == set(reference.keys()) == {"sequences", "scores", "logits", "cache"}
    assert torch.equal(output.sequences, reference.sequences)
    assert (output.sequences[1:, -3:] == 0).all()  # rows 1 and 2 finished early
    assert len(output.scores) == len(reference.scores) == len(output.logits) == NEW
    # finished rows included: plain reports the target's scores on the pad tokens it keeps feeding them
    for ours, theirs in zip(output.scores + output.logits, reference.scores + reference.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert type(output.cache) is type(reference.cache)
    assert output.cache.get_seq_length() == reference.cache.get_seq_length() == output.sequences.shape[1] - 1
    for ours, theirs in zip(output.cache.layers, reference.cache.layers):
        assert type(ours) is type(theirs)
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-5, rtol=1e-4)
    assert torch.equal(_continue(target, output, mask), _continue(target, reference, mask))


def test_no_cache_when_use_cache_is_off(targets):
    target = targets["llama"]
    ids, mask = ragged_prompts(2, seed=6)
    kwargs = dict(max_new_tokens=6, do_sample=False, return_dict_in_generate=True, use_cache=False)
    reference = target.generate(ids, attention_mask=mask, **kwargs)
    output = target.generate(ids, attention_mask=mask, assistant_model=make_drafter(target), **kwargs)
    assert reference.cache is None and output.cache is None
    assert torch.equal(output.sequences, reference.sequences)


def test_sampled_output_has_plain_fields_and_a_continuable_cache(targets):
    target = targets["llama"]
    ids, mask = ragged_prompts(2, seed=7)
    torch.manual_seed(0)
    output = target.generate(
        ids,
        attention_mask=mask,
        assistant_model=make_drafter(target),
        do_sample=True,
        max_new_tokens=NEW,
        return_dict_in_generate=True,
        output_scores=True,
        pad_token_id=0,
    )
    assert set(output.keys()) == {"sequences", "scores", "cache"} and len(output.scores) == NEW
    # the cache holds exactly the sequences' K/V: continuing from it equals continuing without a cache
    tail = mask.new_ones(2, NEW)
    full_mask = torch.cat([mask, tail], dim=1)
    without = target.generate(
        output.sequences,
        attention_mask=full_mask,
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert torch.equal(_continue(target, output, mask, new=8), without)


def test_prompt_cache_call_returns_the_full_cache(targets):
    """With a prompt cache passed in, the returned cache covers the whole sequence, as plain's does."""
    import copy

    from transformers.cache_utils import DynamicCache

    target = targets["llama"]
    ids, mask = ragged_prompts(2, seed=5)
    prefix = DynamicCache()
    with torch.no_grad():
        target(ids[:, :-2], attention_mask=mask[:, :-2], cache=prefix, use_cache=True)
    kwargs = dict(max_new_tokens=10, do_sample=False, return_dict_in_generate=True)
    reference = target.generate(ids, attention_mask=mask, cache=copy.deepcopy(prefix), **kwargs)
    output = target.generate(
        ids, attention_mask=mask, cache=copy.deepcopy(prefix), assistant_model=make_drafter(target), **kwargs
    )
    assert torch.equal(output.sequences, reference.sequences)
    assert output.cache.get_seq_length() == reference.cache.get_seq_length() == output.sequences.shape[1] - 1
    assert torch.equal(_continue(target, output, mask, new=6), _continue(target, reference, mask, new=6))


@pytest.mark.parametrize("use_cache", [True, False])
def test_finished_rows_scores_are_plains_processed_pad_scores(targets, use_cache):
    """After a row stops, plain keeps feeding it pad tokens and reports the target's processed scores on them;
    DSpark reports the same (it used to report a one-hot pad distribution)."""
    target = targets["llama"]
    ids, mask = ragged_prompts(3, seed=5)
    first = target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    eos = [int(first[1, ids.shape[1] + 2]), int(first[2, ids.shape[1] + 4])]
    kwargs = _scored_kwargs(eos, repetition_penalty=1.4, no_repeat_ngram_size=2, use_cache=use_cache)
    reference = target.generate(ids, attention_mask=mask, **kwargs)
    output = target.generate(ids, attention_mask=mask, assistant_model=make_drafter(target), **kwargs)
    assert torch.equal(output.sequences, reference.sequences)
    generated = output.sequences[:, ids.shape[1] : -3]
    assert bool(torch.isin(generated, torch.tensor(eos)).any())  # a row stopped 3 or more steps before the end
    assert (output.cache is None) == (not use_cache)
    for ours, theirs in zip(output.scores + output.logits, reference.scores + reference.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
