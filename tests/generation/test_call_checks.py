"""Up-front refusals of DSpark generate calls the loop cannot serve exactly (before any forward or profiling)."""

import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import Phi3Config, Phi3ForCausalLM

from hf_dspark.generation import call_checks, loop
from hf_dspark.model import binding
from hf_dspark.target import checks as target_checks
from hf_dspark.target.checks import rope_threshold
from tests.helpers import make_drafter, make_target, ragged_prompts


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the call reaches a target forward or builds its policy (where curves are profiled)."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the call was refused")

    monkeypatch.setattr(loop, "policy_from_options", refuse)
    return refuse


@pytest.mark.parametrize("with_ids", [True, False])
@pytest.mark.parametrize("entry", ["assistant_model", "custom_generate"])
def test_inputs_embeds_are_refused_before_any_work(no_work, monkeypatch, with_ids, entry):
    from hf_dspark import dspark_generate

    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    ids, mask = ragged_prompts(2, seed=5)
    embeds = target.get_input_embeddings()(ids).detach() + 0.5  # a soft prompt: not the ids' own embeddings
    monkeypatch.setattr(target, "forward", no_work)
    args = (ids,) if with_ids else ()
    extra = (
        dict(assistant_model=drafter)
        if entry == "assistant_model"
        else dict(custom_generate=dspark_generate, drafter=drafter)
    )
    with pytest.raises(ValueError, match=r"inputs_embeds.*soft prompt.*input_ids only"):
        target.generate(
            *args, inputs_embeds=embeds, attention_mask=mask, max_new_tokens=4, dspark_policy="auto", **extra
        )


def test_dola_layers_are_refused_like_plain_generate_does(no_work):
    target = make_target("llama", seed=3)
    ids, mask = ragged_prompts(1, seed=5)
    with pytest.raises(ValueError, match="dola_layers"):
        target.generate(
            ids, attention_mask=mask, max_new_tokens=4, dola_layers="low", assistant_model=make_drafter(target)
        )


@pytest.mark.parametrize("batch", [1, 3])
def test_encoder_repetition_penalty_matches_plain_generate(batch):
    target = make_target("llama", seed=8)
    drafter = make_drafter(target)
    ids, mask = ragged_prompts(batch, seed=12)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=24, encoder_repetition_penalty=3.0)
    reference = target.generate(ids, **options)
    assert not torch.equal(reference, target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24))
    assert torch.equal(target.generate(ids, assistant_model=drafter, **options), reference)


def _dynamic_target():
    return make_target(
        "llama",
        seed=4,
        max_position_embeddings=48,
        rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
    )


def test_dynamic_ntk_rope_below_the_threshold_matches_plain_generate():
    target = _dynamic_target()
    assert rope_threshold(target.config) == ("dynamic", 48)
    ids, mask = ragged_prompts(2, seed=3, min_len=8, max_len=8)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=36)  # 8 + 36 + γ 4 = 48
    assert torch.equal(
        target.generate(ids, assistant_model=make_drafter(target), **options), target.generate(ids, **options)
    )


def test_dynamic_ntk_rope_past_the_threshold_is_refused_before_any_work(no_work):
    target = _dynamic_target()
    ids, mask = ragged_prompts(2, seed=3, min_len=8, max_len=8)
    with pytest.raises(ValueError, match=r"'dynamic' RoPE scaling.*passes 48.*at most 44 tokens"):
        target.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=60, assistant_model=make_drafter(target)
        )


def test_hunyuan_alpha_ntk_rope_is_fixed_and_served_past_the_threshold():
    """HunYuan checkpoints label a fixed-`alpha` NTK scaling "dynamic", but the model runs it as "ntk_alpha",
    whose frequencies never change with length: DSpark serves it past max_position_embeddings like plain decoding."""
    import transformers

    config = transformers.HunYuanDenseV1Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=96,
        max_position_embeddings=24,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0},
    )
    torch.manual_seed(4)
    target = transformers.HunYuanDenseV1ForCausalLM(config).eval()
    assert rope_threshold(target.config) == ("dynamic", 24)  # the config alone would refuse it
    assert target_checks.runtime_rope_types(target) == {"ntk_alpha"}
    ids, mask = ragged_prompts(2, seed=3, min_len=8, max_len=8)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=30)  # 8 + 30 > 24
    assert torch.equal(
        target.generate(ids, assistant_model=make_drafter(target), **options), target.generate(ids, **options)
    )


def test_a_dynamic_rope_with_an_alpha_the_family_ignores_is_still_refused(no_work):
    target = make_target(
        "llama",
        seed=4,
        max_position_embeddings=48,
        rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 4.0, "rope_theta": 10000.0},
    )
    assert target_checks.runtime_rope_types(target) == {"dynamic"}
    ids, mask = ragged_prompts(2, seed=3, min_len=8, max_len=8)
    with pytest.raises(ValueError, match=r"'dynamic' RoPE scaling.*passes 48"):
        target.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=60, assistant_model=make_drafter(target)
        )


def _longrope_target():
    half = 4  # head_dim 16: 8 frequencies
    config = Phi3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        original_max_position_embeddings=32,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * (2 * half),
            "long_factor": [2.0] * (2 * half),
        },
    )
    torch.manual_seed(0)
    return Phi3ForCausalLM(config).eval()


def test_phi3_longrope_past_its_original_length_is_refused(no_work):
    target = _longrope_target()
    assert rope_threshold(target.config) == ("longrope", 32)
    ids, mask = ragged_prompts(1, seed=3, min_len=8, max_len=8)
    with pytest.raises(ValueError, match=r"'longrope' RoPE scaling.*passes 32"):
        target.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=40,
            assistant_model=make_drafter(target, target_layer_ids=[0, 1]),
        )


def test_phi3_longrope_up_to_its_original_length_matches_plain_generate():
    target = _longrope_target()
    ids, mask = ragged_prompts(2, seed=3, min_len=8, max_len=8)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=20)  # 8 + 20 + γ 4 = 32
    output = target.generate(ids, assistant_model=make_drafter(target, target_layer_ids=[0, 1]), **options)
    assert torch.equal(output, target.generate(ids, **options))


def test_length_dependent_rope_is_found_per_layer_type_and_other_scalings_are_not():
    per_type = SimpleNamespace(
        max_position_embeddings=64,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6},
        },
    )
    assert rope_threshold(per_type) == ("dynamic", 64)
    legacy = SimpleNamespace(max_position_embeddings=64, rope_scaling={"type": "dynamic", "factor": 2.0})
    assert rope_threshold(legacy) == ("dynamic", 64)
    for static in ("linear", "yarn", "llama3", "default"):
        config = SimpleNamespace(max_position_embeddings=64, rope_parameters={"rope_type": static, "factor": 2.0})
        assert rope_threshold(config) is None


def test_a_target_moved_to_bfloat16_after_binding_rebinds_the_drafter(caplog):
    target = make_target("llama", seed=6)
    drafter = make_drafter(target)
    target.to(torch.bfloat16)
    ids, mask = ragged_prompts(1, seed=4)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=16)
    with caplog.at_level(logging.WARNING, logger=binding.logger.name):
        output = target.generate(ids, assistant_model=drafter, dspark_packed_weights=False, **options)
    assert next(drafter.parameters()).dtype == torch.bfloat16
    assert "re-binding the drafter" in caplog.text
    assert torch.equal(output, target.generate(ids, **options))


def test_offloaded_static_cache_is_refused_not_replaced(no_work):
    target = make_target("llama", seed=3)
    ids, mask = ragged_prompts(2, seed=5)
    with pytest.raises(ValueError, match=r"cache_implementation='offloaded_static'.*cache_implementation='static'"):
        target.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=4,
            assistant_model=make_drafter(target),
            cache_implementation="offloaded_static",
        )


def test_flex_attention_target_is_refused(no_work):
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    target.config._attn_implementation = "flex_attention"  # only the name is read
    ids, mask = ragged_prompts(2, seed=5)
    with pytest.raises(ValueError, match=r"flex_attention.*BlockMask.*attn_implementation='sdpa'"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter)


def test_flash_attention_target_is_refused(no_work):
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    target.config._attn_implementation = "flash_attention_2"  # set after binding: no flash kernel on CPU
    ids, mask = ragged_prompts(2, seed=5)
    with pytest.raises(ValueError, match=r"flash_attention_2.*attn_implementation='sdpa'"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter)
