"""Up-front refusals of DSpark generate calls the loop cannot serve exactly (before any forward or profiling)."""

import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import Phi3Config, Phi3ForCausalLM

from hf_dspark.generation import loop
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


# ------------------------------------------------------------------ one check path, run once per call
def _fresh_pair(seed: int = 3):
    """A target DSpark was never enabled on and an unbound drafter for it."""
    from hf_dspark import DSparkConfig, DSparkDrafter

    target = make_target("llama", seed=seed)
    config = DSparkConfig.from_target(target.config, block_size=4, markov_rank=8, target_layer_ids=[0, 2])
    torch.manual_seed(seed + 1)
    return target, DSparkDrafter(config).eval()


@pytest.fixture
def counted(monkeypatch):
    """How often each entry runs `check_call` and the loop runs `check_prompt` (the functions wrapped where they
    are called)."""
    from hf_dspark.generation import dispatch
    from hf_dspark.serving import engine

    counts = {"check_call": 0, "check_prompt": 0}
    for module, name in ((dispatch, "check_call"), (engine, "check_call"), (loop, "check_prompt")):
        original = getattr(module, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    return counts


def _generate(entry: str, ids, mask, **settings):
    """One greedy call through `entry`; returns (its output, plain generate's output on a twin target)."""
    from hf_dspark import disable, dspark_generate
    from hf_dspark.proposers import hybrid_for

    target, drafter = _fresh_pair()
    reference = make_target("llama", seed=3).generate(ids, attention_mask=mask, max_new_tokens=6, **settings)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, **settings)
    if entry == "bound before":
        drafter.bind_target(target)
        return target.generate(ids, assistant_model=drafter, **kwargs), reference
    if entry == "bound inside":
        return target.generate(ids, assistant_model=drafter.bind_target(target), **kwargs), reference
    if entry == "hybrid":
        return target.generate(ids, assistant_model=hybrid_for(drafter.bind_target(target)), **kwargs), reference
    drafter.bind_target(target)
    if entry == "custom_generate (not enabled)":
        disable(target)
    return target.generate(ids, custom_generate=dspark_generate, drafter=drafter, **kwargs), reference


ENTRIES = ["bound before", "bound inside", "hybrid", "custom_generate", "custom_generate (not enabled)"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_each_entry_runs_the_checks_exactly_once_per_call(counted, entry):
    ids, mask = ragged_prompts(2, seed=7)
    output, reference = _generate(entry, ids, mask, do_sample=False)
    assert torch.equal(output, reference)
    assert counted == {"check_call": 1, "check_prompt": 1}


def test_the_stock_loop_runs_the_call_checks_once(counted):
    target, drafter = _fresh_pair()
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(2))
    reference = make_target("llama", seed=3).generate(ids, max_new_tokens=6, do_sample=False)
    output = target.generate(ids, assistant_model=drafter.bind_target(target), max_new_tokens=6, do_sample=False,
                             dspark_stock_loop=True)
    assert torch.equal(output, reference)
    assert counted == {"check_call": 1, "check_prompt": 0}  # transformers' own loop takes the prompt


def test_the_engine_runs_the_call_checks_once(counted):
    from hf_dspark.serving.engine import DSparkEngine

    target, drafter = _fresh_pair()
    engine = DSparkEngine(target, drafter, policy="fixed")
    assert drafter.bound_to(target)
    request = engine.add_request([5, 6, 7, 8], max_new_tokens=4)
    while engine.has_work():
        engine.step()
    assert len(engine.result(request).generated) == 4
    assert counted == {"check_call": 1, "check_prompt": 0}


def test_options_are_parsed_once_per_call(monkeypatch):
    from hf_dspark.generation.options import DSparkGenerationOptions

    parsed = []
    original = DSparkGenerationOptions.__post_init__

    def counting(self):
        parsed.append(self)
        original(self)

    monkeypatch.setattr(DSparkGenerationOptions, "__post_init__", counting)
    target, drafter = _fresh_pair()
    ids, mask = ragged_prompts(2, seed=7)
    target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter.bind_target(target),
                    dspark_policy="fixed", dspark_verify_len=2)
    assert len(parsed) == 1 and parsed[0].policy_options == {"dspark_verify_len": 2}


REFUSED = {
    "num_beams=2": (dict(num_beams=2), r"DSpark does not support beam search \(num_beams=2.*set num_beams=1"),
    "num_beams=2, sampling": (
        dict(num_beams=2, do_sample=True), r"DSpark does not support beam search \(num_beams=2.*set num_beams=1"
    ),
    "num_assistant_tokens=3": (
        dict(num_assistant_tokens=3), r"num_assistant_tokens=3 is not supported.*dspark_policy='fixed'"
    ),
    "assistant_confidence_threshold=0.7": (
        dict(assistant_confidence_threshold=0.7),
        r"assistant_confidence_threshold=0.7 is not supported.*dspark_threshold=",
    ),
    "eos_token_id=-1": (dict(eos_token_id=-1), r"eos_token_id must be a token id \(an int >= 0\).*got -1"),
    "eos_token_id='</s>'": (
        dict(eos_token_id="</s>"), r"eos_token_id must be a token id.*got '</s>'.*convert_tokens_to_ids"
    ),
    "top_p=1.5": (dict(do_sample=True, top_p=1.5), r"top_p must be a number in \(0, 1\].*got 1.5"),
    "empty prompt": (dict(), r"input_ids has no tokens \(shape \[2, 0\]\).*pass at least the BOS token"),
}


@pytest.mark.parametrize("bound", ["before", "inside"])
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_alike_whether_the_drafter_is_bound_before_or_inside_the_call(bound, case):
    """Each refusal names the input and the fix, before any forward, when the drafter was bound before the call
    and when `bind_target` ran while the call's arguments were evaluated (on a target never enabled before)."""
    settings, match = REFUSED[case]
    target, drafter = _fresh_pair()
    ids, mask = ragged_prompts(2, seed=7)
    if case == "empty prompt":
        ids, mask = ids[:, :0], mask[:, :0]
    if bound == "before":
        drafter.bind_target(target)
    handle = target.register_forward_pre_hook(lambda *_: pytest.fail("a forward ran before the refusal"))
    with pytest.raises(ValueError, match=match):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, **settings,
                        assistant_model=drafter if bound == "before" else drafter.bind_target(target))
    handle.remove()
