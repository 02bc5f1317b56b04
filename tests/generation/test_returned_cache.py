"""The cache object a DSpark call leaves behind is plain `generate`'s (`target/output_cache.py`, `CallCache`): its
class, layer types and shapes, and a later call continuing from it gives plain's tokens, for caches that
sliding-window layers hold only partly and for static caches, passed by the caller or built by `generate`."""

import pytest
import torch
from transformers import StaticCache

from hf_dspark.target.output_cache import continuation_inputs
from tests.generation.test_families import make_family
from tests.helpers import make_drafter, ragged_prompts

GREEDY = dict(do_sample=False, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)


def _three_calls(target, ids, mask, cache=None, **middle):
    """Plain, then a call continuing from the first's cache (with `middle`'s arguments), then plain again from the
    second's cache: the last call's sequences."""
    first = target.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=3, **GREEDY)
    grown = torch.nn.functional.pad(mask, (0, first.sequences.shape[1] - mask.shape[1]), value=1)
    second = target.generate(first.sequences, attention_mask=grown, cache=first.cache, max_new_tokens=3, **middle,
                             **GREEDY)
    assert second.cache is first.cache
    grown = torch.nn.functional.pad(mask, (0, second.sequences.shape[1] - mask.shape[1]), value=1)
    return target.generate(second.sequences, attention_mask=grown, cache=second.cache, max_new_tokens=6,
                           **GREEDY).sequences


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gemma3"])
def test_continuing_from_a_cache_longer_than_the_sliding_window(name):
    """The prompt (14 tokens) is longer than the window (8): the caller's sliding layers hold 7 positions of 17; the
    DSpark call extends the cache from the 17 it counts, not the 7 it holds."""
    target = make_family(name)
    ids = torch.randint(3, 96, (1, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    plain = _three_calls(target, ids, mask)
    assert torch.equal(_three_calls(target, ids, mask, assistant_model=make_drafter(target)), plain)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_continuing_from_a_callers_static_cache_holding_a_prefix(name):
    """A caller's `StaticCache` (full layers of 64 slots, sliding ones of the window) that already holds a prompt:
    the DSpark call extends it from the positions it counts, as plain `generate` does."""
    target = make_family(name)
    ids, mask = ragged_prompts(2, seed=3, min_len=4, max_len=14)
    plain = _three_calls(target, ids, mask, cache=StaticCache(config=target.config, max_cache_len=64))
    ours = _three_calls(target, ids, mask, cache=StaticCache(config=target.config, max_cache_len=64),
                        assistant_model=make_drafter(target))
    assert torch.equal(ours, plain)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_static_cache_implementation_returns_plains_static_cache(name):
    """`cache_implementation="static"`: the returned cache is the `StaticCache` `generate` built for the call
    (layers sized max_length - 1, sliding ones the window), holding plain's keys and values: the prompt's bit for
    bit (one forward over it, as plain's prefill), the generated positions within float rounding."""
    target = make_family(name)
    ids, mask = ragged_prompts(2, seed=4, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, cache_implementation="static", max_new_tokens=12, **GREEDY)
    plain = target.generate(ids, **kwargs)
    ours = target.generate(ids, assistant_model=make_drafter(target), **kwargs)
    assert torch.equal(ours.sequences, plain.sequences)
    assert type(ours.cache) is StaticCache
    assert int(ours.cache.get_seq_length()) == int(plain.cache.get_seq_length()) == plain.sequences.shape[1] - 1
    for mine, theirs in zip(ours.cache.layers, plain.cache.layers, strict=True):
        assert type(mine) is type(theirs) and mine.keys.shape == theirs.keys.shape
        if not theirs.is_sliding:
            assert torch.equal(mine.keys[:, :, : ids.shape[1]], theirs.keys[:, :, : ids.shape[1]])
        torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-4)


def test_continuation_positions_follow_generates_prompt_positions():
    """Generated tokens sit one past the prompt's last position (generate's own `position_ids`, or its rule from
    the mask with pads at 0)."""
    sequences = torch.arange(12).view(2, 6)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    _, full_mask, positions = continuation_inputs(mask, sequences)
    assert full_mask.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert positions.tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]]
    given = torch.tensor([[5, 6, 7, 8], [0, 1, 2, 3]])
    assert continuation_inputs(mask, sequences, given)[2].tolist() == [[5, 6, 7, 8, 9], [0, 1, 2, 3, 4]]
