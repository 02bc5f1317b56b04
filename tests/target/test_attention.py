"""Packed grouped-query attention for multi-token verification: same numbers as transformers' SDPA, no KV copy."""

from __future__ import annotations

import threading
import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hf_dspark.target.attention import PACKED_SDPA, packed_gqa_attention, packed_gqa_config, packed_gqa_sdpa
from tests.helpers import make_target, ragged_prompts


def _inputs(dtype, batch=3, heads=6, kv_heads=2, steps=5, width=23, additive=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, steps, 16, generator=gen).to(dtype)
    key = torch.randn(batch, kv_heads, width, 16, generator=gen).to(dtype)
    value = torch.randn(batch, kv_heads, width, 16, generator=gen).to(dtype)
    mask = torch.rand(batch, 1, steps, width, generator=gen) > 0.3
    mask[..., -1] = True
    if additive:
        mask = torch.where(mask, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    return module, query, key, value, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("additive", [False, True])
def test_packed_equals_transformers_sdpa_bit_for_bit(dtype, additive):
    module, query, key, value, mask = _inputs(dtype, additive=additive)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = packed_gqa_sdpa(module, query, key, value, mask, scaling=0.25)
    assert got.shape == expected.shape == (3, 5, 6, 16)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("case", ["one_token", "no_mask", "per_head_mask", "no_gqa"])
def test_other_cases_go_to_transformers_sdpa(case):
    module, query, key, value, mask = _inputs(torch.float32)
    if case == "one_token":
        query, mask = query[:, :, :1], mask[:, :, :1]
    elif case == "no_mask":
        mask = None
    elif case == "per_head_mask":
        mask = mask.expand(-1, 6, -1, -1)
    else:
        key, value = key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1)
        module.num_key_value_groups = 1
    expected, _ = sdpa_attention_forward(module, query, key, value, mask)
    got, _ = packed_gqa_sdpa(module, query, key, value, mask)
    assert torch.equal(got, expected)


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=2, eos_token_id=None)  # 4 query heads, 2 KV heads: GQA


def test_a_verification_forward_inside_gives_the_same_logits_and_restores_the_config(target):
    ids, mask = ragged_prompts(3, seed=1)
    prefix = target(input_ids=ids, attention_mask=mask, use_cache=True)
    new = torch.randint(3, 90, (3, 4))
    full_mask = torch.cat([mask, torch.ones(3, 4, dtype=mask.dtype)], dim=1)
    caches = [type(prefix.cache)() for _ in range(2)]
    for cache in caches:
        target(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    expected = target(input_ids=new, attention_mask=full_mask, cache=caches[0], use_cache=True).logits
    with packed_gqa_attention(target):
        assert target.config._attn_implementation == PACKED_SDPA
        got = target(input_ids=new, attention_mask=full_mask, cache=caches[1], use_cache=True).logits
    assert target.config._attn_implementation == "sdpa"
    assert torch.equal(got, expected)


def test_the_config_is_restored_after_an_error(target):
    with pytest.raises(RuntimeError, match="boom"), packed_gqa_attention(target):
        raise RuntimeError("boom")
    assert target.config._attn_implementation == "sdpa"


def test_a_held_config_packs_only_inside_blocks_and_is_switched_once(target, monkeypatch):
    """Under `packed_gqa_config`, blocks inside leave the config alone, forwards outside a block run transformers'
    SDPA function, and the config gets "sdpa" back at the end (an error included)."""
    ids, mask = ragged_prompts(3, seed=4)
    packed_calls = []
    monkeypatch.setattr("hf_dspark.target.attention.packed_gqa_sdpa",
                        lambda *args, **kwargs: packed_calls.append(1) or packed_gqa_sdpa(*args, **kwargs))
    expected = target(input_ids=ids, attention_mask=mask).logits
    with pytest.raises(RuntimeError, match="boom"), packed_gqa_config(target):
        assert target.config._attn_implementation == PACKED_SDPA
        assert torch.equal(target(input_ids=ids, attention_mask=mask).logits, expected)
        assert not packed_calls  # outside a block: transformers' own SDPA
        with packed_gqa_attention(target):
            target(input_ids=ids, attention_mask=mask)
        assert packed_calls and target.config._attn_implementation == PACKED_SDPA  # still held
        raise RuntimeError("boom")
    assert target.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("overrides", [{"attn_implementation": "eager"}, {"num_key_value_heads": 4}])
def test_eager_or_no_gqa_targets_are_left_alone(overrides):
    model = make_target("llama", seed=3, **overrides)
    before = model.config._attn_implementation
    with packed_gqa_attention(model):
        assert model.config._attn_implementation == before
    assert model.config._attn_implementation == before


def test_a_plain_forward_in_another_thread_keeps_transformers_sdpa(target, monkeypatch):
    from hf_dspark.target import attention

    ids, mask = ragged_prompts(2, seed=4)
    new = torch.randint(3, 90, (2, 3))
    full_mask = torch.cat([mask, torch.ones(2, 3, dtype=mask.dtype)], dim=1)

    def forward():
        cache = type(target(input_ids=ids[:, :1], use_cache=True).cache)()
        target(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
        return target(input_ids=new, attention_mask=full_mask, cache=cache, use_cache=True).logits

    with torch.no_grad():
        reference = forward()
    callers, original = [], attention.packed_gqa_sdpa

    def spy(*args, **kwargs):
        callers.append(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(attention, "packed_gqa_sdpa", spy)
    entered, release, inside = threading.Event(), threading.Event(), {}

    def verifier():
        with torch.no_grad(), packed_gqa_attention(target):
            inside["logits"] = forward()
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=verifier)
    thread.start()
    assert entered.wait(5)
    try:
        assert target.config._attn_implementation == PACKED_SDPA  # switched for the verifying thread
        with torch.no_grad():
            plain = forward()
    finally:
        release.set()
        thread.join()
    assert target.config._attn_implementation == "sdpa"
    assert torch.equal(plain, reference)  # bit for bit what it computes with no verifying thread
    torch.testing.assert_close(inside["logits"], reference)
    assert callers and set(callers) == {thread.ident}


def test_overlapping_blocks_in_two_threads_restore_the_config_at_the_last_exit(target):
    entered, release = threading.Event(), threading.Event()

    def worker():
        with packed_gqa_attention(target):
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=worker)
    thread.start()
    assert entered.wait(5)
    with packed_gqa_attention(target):
        assert target.config._attn_implementation == PACKED_SDPA
    assert target.config._attn_implementation == PACKED_SDPA  # the worker's block still runs
    release.set()
    thread.join()
    assert target.config._attn_implementation == "sdpa"
