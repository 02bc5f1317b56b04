"""What the DSpark loop does not support fails with a message that says what to do."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, T5Config

from hf_dspark import DSparkConfig, DSparkDrafter, disable, enable
from hf_dspark.generation.dispatch import is_enabled
from tests.helpers import make_drafter, make_target, ragged_prompts


@pytest.fixture(scope="module")
def pair():
    target = make_target("llama", seed=3)
    return target, make_drafter(target)


def test_beam_search_is_refused(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match="beam search"):
        target.generate(ids, attention_mask=mask, num_beams=2, assistant_model=drafter, max_new_tokens=4)


def test_num_return_sequences_is_refused(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match="num_return_sequences"):
        target.generate(ids, attention_mask=mask, do_sample=True, num_return_sequences=2, assistant_model=drafter,
                        max_new_tokens=4)


def test_output_attentions_is_refused(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match="output_attentions"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4,
                        return_dict_in_generate=True, output_attentions=True)


def test_drafter_bound_to_another_target_is_refused(pair):
    _, drafter = pair
    twin = make_target("llama", seed=3)  # same shapes, another instance
    enable(twin)
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match="bound to a different target"):
        twin.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4)


def test_mismatched_vocabulary_is_refused(pair):
    target, _ = pair
    other = make_target("llama", vocab_size=80)
    drafter = DSparkDrafter(DSparkConfig.from_target(other.config, block_size=3, target_layer_ids=[0]))
    enable(target)
    ids, mask = ragged_prompts(1, vocab=80)
    with pytest.raises(ValueError, match="vocab"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4)


def test_encoder_decoder_targets_are_refused():
    config = T5Config(vocab_size=64, d_model=32, d_ff=64, num_layers=4, num_heads=2, d_kv=16,
                      decoder_start_token_id=0)
    t5 = AutoModelForSeq2SeqLM.from_config(config)
    with pytest.raises(ValueError, match="encoder-decoder"):
        DSparkConfig.from_target(t5.config)


def test_unbound_drafter_binds_to_the_generating_target():
    target = make_target("llama", seed=5)
    drafter = DSparkDrafter(DSparkConfig.from_target(target.config, block_size=3, target_layer_ids=[0]))
    enable(target)
    ids, mask = ragged_prompts(2)
    reference = target.generate(ids, attention_mask=mask, max_new_tokens=8)
    assert torch.equal(reference, target.generate(ids, attention_mask=mask, max_new_tokens=8,
                                                  assistant_model=drafter))
    assert drafter.bound_to(target)


def test_enable_disable_keep_other_assistants_on_the_stock_path(pair):
    target, _ = pair
    enable(target)
    assert is_enabled(target) and type(target).__name__ == "LlamaForCausalLM"
    ids = torch.randint(3, 96, (1, 6))
    # prompt lookup still runs transformers' own assisted loop
    reference = target.generate(ids, max_new_tokens=8)
    assert torch.equal(reference, target.generate(ids, max_new_tokens=8, prompt_lookup_num_tokens=3))
    disable(target)
    assert not is_enabled(target)
    enable(target)


@pytest.mark.parametrize(("settings", "match"), [
    (dict(threshold=5.0), "dspark_threshold must be a number in"),
    (dict(verify_len=2.5), "dspark_verify_len must be a non-negative integer"),
    (dict(block_size=0), "block_size"),
    (dict(name="lagged", step_curve={"a": 1}), "must be a StepCurve or the path"),
    (dict(name="lagged", step_curve="no/such/curve.json"), "no such file"),
    (dict(name="fastest"), "dspark_policy must be one of"),
])
def test_verification_policy_built_directly_is_validated_like_generate_options(settings, match):
    from hf_dspark.scheduling.verification_policy import VerificationPolicy

    with pytest.raises(ValueError, match=match):
        VerificationPolicy(**{"name": "fixed", "block_size": 4, **settings})


@pytest.fixture
def no_forward(pair):
    """Any forward of the target would mean the check came too late."""

    def forbidden(module, args, kwargs):
        raise AssertionError("the target ran a forward before the inputs were validated")

    handle = pair[0].register_forward_pre_hook(forbidden, with_kwargs=True)
    yield
    handle.remove()


class _Observer:
    def on_round(self, record) -> None:
        pass


@pytest.mark.parametrize(("observers", "match"), [
    ("rounds", r"dspark_observers must be a list of round observers .*got 'rounds' of type str"),
    (_Observer(), r"of type _Observer \(one observer: wrap it in a list, dspark_observers=\[observer\]\)"),
    ([_Observer(), 3], r"dspark_observers\[1\] \(3 of type int\) has no on_round\(record\) method"),
    ([print], r"dspark_observers\[0\] .* has no on_round\(record\) method; .*SimpleNamespace\(on_round=f\)"),
])
def test_bad_observers_are_refused_before_any_forward(pair, no_forward, observers, match):
    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match=match):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4,
                        dspark_observers=observers)


def test_bad_observers_are_refused_with_custom_generate(pair, no_forward):
    from hf_dspark.generation.dispatch import dspark_generate

    target, drafter = pair
    ids, mask = ragged_prompts(1)
    disable(target)
    try:
        with pytest.raises(ValueError, match="wrap it in a list"):
            target.generate(ids, attention_mask=mask, max_new_tokens=4, custom_generate=dspark_generate,
                            drafter=drafter, dspark_observers=_Observer())
    finally:
        enable(target)


def test_an_empty_prompt_is_refused_with_what_to_pass(pair, no_forward):
    target, drafter = pair
    empty = torch.zeros(2, 0, dtype=torch.long)
    match = r"input_ids has no tokens \(shape \[2, 0\]\): a prompt needs at least one token per row"
    with pytest.raises(ValueError, match=match):
        target.generate(empty, assistant_model=drafter, max_new_tokens=4)
    with pytest.raises(ValueError, match=match):
        target.generate(input_ids=empty, attention_mask=empty, assistant_model=drafter, max_new_tokens=4)


@pytest.mark.parametrize(("settings", "match"), [
    (dict(do_sample=True, top_p=1.5), r"top_p must be a number in \(0, 1\]"),
    (dict(do_sample=True, temperature=0.0), "temperature=0 cannot be sampled from"),
    (dict(eos_token_id="</s>"), "eos_token_id must be a token id"),
    (dict(eos_token_id=2.5), "eos_token_id must be a token id"),
])
def test_generate_refuses_bad_decoding_settings_before_any_forward(pair, no_forward, settings, match):
    from transformers import GenerationConfig

    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match=match):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4, **settings)
    with pytest.raises(ValueError, match=match):  # the same settings on a GenerationConfig
        target.generate(ids, attention_mask=mask, assistant_model=drafter,
                        generation_config=GenerationConfig(max_new_tokens=4, **settings))


@pytest.mark.parametrize(("settings", "match"), [
    (dict(do_sample=True, top_p=1.5), r"top_p must be a number in \(0, 1\]"),
    (dict(eos_token_id=2.5), "eos_token_id must be a token id"),
])
def test_custom_generate_refuses_bad_decoding_settings_before_any_forward(pair, no_forward, settings, match):
    from hf_dspark.generation.dispatch import dspark_generate

    target, drafter = pair
    ids, mask = ragged_prompts(1)
    disable(target)
    try:
        with pytest.raises(ValueError, match=match):
            target.generate(ids, attention_mask=mask, max_new_tokens=4, custom_generate=dspark_generate,
                            drafter=drafter, **settings)
    finally:
        enable(target)


def test_the_drafters_own_generation_config_is_there_and_its_knobs_are_refused_at_generate_time():
    """transformers' assisted tests set `assistant_model.generation_config.num_assistant_tokens`: on a drafter bound
    to this target the config is there (no "bound to another target"); a knob DSpark would ignore is refused at
    generate time, naming where it was set; transformers' defaults are accepted."""
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    ids, mask = ragged_prompts(2)
    drafter.generation_config.num_assistant_tokens_schedule = "constant"  # transformers' default: accepted
    reference = target.generate(ids, attention_mask=mask, max_new_tokens=6)
    assert torch.equal(reference, target.generate(ids, attention_mask=mask, max_new_tokens=6, assistant_model=drafter))
    drafter.generation_config.num_assistant_tokens = 2
    match = (r"assistant_model.generation_config.num_assistant_tokens=2 is not supported .* \(set it back to 20 or "
             r"drop the assignment\).*dspark_policy='fixed'")
    with pytest.raises(ValueError, match=match):
        target.generate(ids, attention_mask=mask, max_new_tokens=6, assistant_model=drafter)


def test_an_unbound_drafter_has_no_generation_config_and_says_how_to_bind_it():
    target = make_target("llama", seed=3)
    drafter = DSparkDrafter(DSparkConfig.from_target(target.config, block_size=3, target_layer_ids=[0]))
    with pytest.raises(AttributeError, match=r"not bound to a target.*drafter.bind_target\(target\)"):
        drafter.generation_config  # noqa: B018
    ids, mask = ragged_prompts(1)
    with pytest.raises(AttributeError, match=r"not bound to a target.*drafter.bind_target\(target\)"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter)


def test_a_drafter_bound_elsewhere_on_a_target_never_enabled_says_so():
    """transformers' own loop runs (this target was never enabled): the message says the target is not
    DSpark-enabled and how to bind the drafter to it, not that the call's target is the drafter's."""
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    stranger = make_target("llama", seed=3)
    ids, mask = ragged_prompts(1)
    with pytest.raises(AttributeError, match=r"not DSpark-enabled.*bind the drafter to it \(drafter.bind_target"):
        stranger.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter)


def test_a_hybrid_of_an_unbound_drafter_fails_like_the_unbound_drafter():
    from hf_dspark.proposers import hybrid_for

    target = make_target("llama", seed=3)
    drafter = DSparkDrafter(DSparkConfig.from_target(target.config, block_size=3, target_layer_ids=[0]))
    ids, mask = ragged_prompts(1)
    with pytest.raises(AttributeError, match=r"not bound to a target.*drafter.bind_target\(target\)"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=hybrid_for(drafter))
    with pytest.raises(AttributeError, match="has no attribute 'not_there'"):
        hybrid_for(drafter).not_there  # noqa: B018


@pytest.mark.parametrize("kind", ["prompt lookup", "oracle"])
def test_model_free_drafters_accept_a_two_layer_target(kind):
    """A model-free drafter taps no layer, so a target of any depth fits (a DSpark drafter needs 3 layers)."""
    from hf_dspark.generation import oracle_for, prompt_lookup_for

    target = make_target("llama", seed=3, num_hidden_layers=2)
    ids, mask = ragged_prompts(2)
    reference = target.generate(ids, attention_mask=mask, max_new_tokens=8)
    drafter = (prompt_lookup_for(target, 3) if kind == "prompt lookup"
               else oracle_for(target, 3, reference, mask))
    assert torch.equal(reference, target.generate(ids, attention_mask=mask, max_new_tokens=8,
                                                  assistant_model=drafter))
    with pytest.raises(ValueError, match="needs at least 3"):
        DSparkConfig.from_target(target.config)
