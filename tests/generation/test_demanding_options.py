"""Generate options a demanding user tries with a DSpark drafter: each matches plain `generate` (greedy fp32, tiny
random Llama) or is refused before any work with the option named and the fix."""

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import WatermarkingConfig

from hf_dspark.generation import loop
from tests.helpers import make_drafter, make_target, ragged_prompts

NEW = 16


@pytest.fixture(scope="module")
def pair():
    target = make_target("llama", seed=3)
    return target, make_drafter(target)


def _plain_and_dspark(pair, batch: int, *args, **options):
    target, drafter = pair
    ids, mask = ragged_prompts(batch, seed=batch + 5)
    options = {"attention_mask": mask, "do_sample": False, **options}
    if not args:
        options.setdefault("max_new_tokens", NEW)
    reference = target.generate(ids, *args, **options)
    return reference, target.generate(ids, *args, assistant_model=drafter, **options)


def _same(reference, output) -> bool:
    """Equal sequences; scores (where returned) equal to rounding (verification batches several positions)."""
    if isinstance(reference, torch.Tensor):
        return torch.equal(reference, output)
    for ours, theirs in zip(output.scores, reference.scores, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    return torch.equal(reference.sequences, output.sequences)


OPTIONS = {
    "bad_words_ids": dict(bad_words_ids=[[5], [7, 8], [10, 11, 12]]),
    "sequence_bias": dict(sequence_bias=[[[5], -10.0], [[7, 8], 5.0], [[20], 3.0]]),
    "renormalize_logits": dict(
        renormalize_logits=True, repetition_penalty=1.5, return_dict_in_generate=True, output_scores=True
    ),
    "watermarking_config": dict(watermarking_config=WatermarkingConfig(bias=2.5, seeding_scheme="lefthash")),
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
    "low_memory": dict(low_memory=True),
    "use_cache=False": dict(use_cache=False),
    "prefix_allowed_tokens_fn": dict(prefix_allowed_tokens_fn=lambda row, ids: [3 + row, 4 + row, 9]),
}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_options_match_plain_generate(pair, name, batch):
    reference, output = _plain_and_dspark(pair, batch, **OPTIONS[name])
    assert _same(reference, output)


@pytest.mark.parametrize("batch", [1, 2])
def test_a_generation_config_passed_positionally_is_honoured(pair, batch):
    config = GenerationConfig(
        max_new_tokens=10, do_sample=False, repetition_penalty=2.0, pad_token_id=0, eos_token_id=2
    )
    reference, output = _plain_and_dspark(pair, batch, config)
    assert reference.shape[1] == ragged_prompts(batch, seed=batch + 5)[0].shape[1] + 10
    assert torch.equal(reference, output)


OTHER_DRAFTERS = {
    "assistant_early_exit": (2, r"assistant_early_exit=2.*target's own first layers.*Drop assistant_early_exit"),
    "prompt_lookup_num_tokens": (3, r"prompt_lookup_num_tokens=3.*prompt lookup.*prompt_lookup_for"),
    "use_mtp": (True, r"use_mtp=True.*multi-token prediction.*Drop use_mtp"),
    "speculation_type": ("dflash", r"speculation_type='dflash'.*Drop speculation_type"),
    "assistant_ensemble_weight": (0.5, r"assistant_ensemble_weight=0.5.*mixture.*Drop assistant_ensemble_weight"),
}


@pytest.mark.parametrize("where", ["kwarg", "generation_config", "custom_generate"])
@pytest.mark.parametrize("name", sorted(OTHER_DRAFTERS))
def test_options_that_pick_another_drafter_are_refused_before_any_work(pair, monkeypatch, name, where):
    """transformers would draft with something else than the given assistant_model (or verify against a mixture)
    for these; a DSpark drafter would silently ignore them."""

    target, drafter = pair
    value, message = OTHER_DRAFTERS[name]
    _assert_refused_before_any_work(target, drafter, monkeypatch, name, value, message, where)


ASSISTANT_KNOBS = {
    "num_assistant_tokens": (5, r"num_assistant_tokens=5.*ignored.*dspark_policy='fixed'.*0\.\.4"),
    "num_assistant_tokens_schedule": ("heuristic", r"num_assistant_tokens_schedule='heuristic'.*dspark_policy="),
    "assistant_confidence_threshold": (0.3, r"assistant_confidence_threshold=0.3.*'slot_threshold'.*dspark_threshold"),
}


@pytest.mark.parametrize("where", ["kwarg", "generation_config", "custom_generate"])
@pytest.mark.parametrize("name", sorted(ASSISTANT_KNOBS))
def test_assisted_decoding_knobs_are_refused_before_any_work(pair, monkeypatch, name, where):
    """transformers' knobs for its assistant's draft length would be silently ignored by a DSpark drafter: the
    refusal names the option and the DSpark policy that does the same (γ = 4 for this drafter)."""

    target, drafter = pair
    value, message = ASSISTANT_KNOBS[name]
    _assert_refused_before_any_work(target, drafter, monkeypatch, name, value, message, where)


@pytest.mark.parametrize("passed", ["nothing", "a copy of the target's config"])
def test_assisted_decoding_knobs_on_the_targets_own_config_are_not_refused(passed):
    """Values the target's own generation_config holds are not the caller's: the call runs as plain generate."""
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    for name, (value, _) in ASSISTANT_KNOBS.items():
        setattr(target.generation_config, name, value)
    ids, mask = ragged_prompts(2, seed=6)
    args = (target.generation_config,) if passed != "nothing" else ()
    reference = target.generate(ids, *args, attention_mask=mask, max_new_tokens=6, do_sample=False)
    output = target.generate(
        ids, *args, attention_mask=mask, max_new_tokens=6, do_sample=False, assistant_model=drafter
    )
    assert torch.equal(reference, output)


def _assert_refused_before_any_work(target, drafter, monkeypatch, name, value, message, where):
    """`name=value` passed `where` (a kwarg, in a GenerationConfig, or through custom_generate) is refused with
    `message` before any policy is built or any forward runs."""
    from hf_dspark import dspark_generate

    monkeypatch.setattr(loop, "policy_from_options", lambda *a, **k: pytest.fail("work started before the refusal"))
    handle = target.register_forward_pre_hook(lambda *_: pytest.fail("a forward ran before the refusal"))
    ids, mask = ragged_prompts(1, seed=6)
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    if where == "generation_config":
        kwargs["generation_config"] = GenerationConfig(**{name: value}, max_new_tokens=4, do_sample=False)
    else:
        kwargs[name] = value
    entry = (
        dict(custom_generate=dspark_generate, drafter=drafter)
        if where == "custom_generate"
        else dict(assistant_model=drafter)
    )
    try:
        with pytest.raises(ValueError, match=message):
            target.generate(ids, **kwargs, **entry)
    finally:
        handle.remove()
