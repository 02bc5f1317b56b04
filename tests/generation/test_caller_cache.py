"""A cache object the caller passes to `generate` is filled as plain `generate` fills it (it holds the keys and
values of the whole sequence but its last token), with or without `return_dict_in_generate`, so a later call that
continues from the caller's own object matches plain's continuation."""

import copy

import pytest
import torch
from transformers import DynamicCache, StaticCache

from tests.helpers import make_drafter, make_target, ragged_prompts

NEW = 10


@pytest.fixture(scope="module")
def pair():
    target = make_target("llama", seed=21)
    return target, make_drafter(target)


def _cache(target, ids, mask, kind: str):
    if kind == "static":
        return StaticCache(config=target.config, max_cache_len=64)
    cache = DynamicCache(config=target.config)
    if kind == "prefix":
        with torch.no_grad():
            target(ids[:, :-2], attention_mask=mask[:, :-2], cache=cache, use_cache=True)
    return cache


def _continue(target, sequences, prompt_mask, cache):
    tail = prompt_mask.new_ones(len(prompt_mask), sequences.shape[1] - prompt_mask.shape[1])
    return target.generate(sequences, attention_mask=torch.cat([prompt_mask, tail], dim=1), cache=cache,
                           max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)


@pytest.mark.parametrize("return_dict", [False, True])
@pytest.mark.parametrize("kind", ["empty", "prefix", "static"])
def test_the_callers_cache_is_filled_like_plain_generate_fills_it(pair, kind, return_dict):
    target, drafter = pair
    ids, mask = ragged_prompts(2, seed=5)
    theirs = _cache(target, ids, mask, kind)
    ours = copy.deepcopy(theirs)
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0,
                  return_dict_in_generate=return_dict)
    reference = target.generate(ids, cache=theirs, **kwargs)
    output = target.generate(ids, cache=ours, assistant_model=drafter, **kwargs)
    if return_dict:
        assert output.cache is ours and reference.cache is theirs
        reference, output = reference.sequences, output.sequences
    assert torch.equal(output, reference)
    assert ours.get_seq_length() == theirs.get_seq_length() == reference.shape[1] - 1
    for mine, plain in zip(ours.layers, theirs.layers, strict=True):
        width = theirs.get_seq_length()
        torch.testing.assert_close(mine.keys[:, :, :width], plain.keys[:, :, :width], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values[:, :, :width], plain.values[:, :, :width], atol=1e-5, rtol=1e-4)
    assert torch.equal(_continue(target, output, mask, ours), _continue(target, reference, mask, theirs))
