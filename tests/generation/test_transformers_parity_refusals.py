"""What transformers' assisted-generation tests pass that DSpark refuses, and the inputs met when running them by
hand: each is refused before any target forward, with a message naming the input and the fix, whether the drafter
was bound before the call or is bound inside it.

Bound inside the call (`target.generate(..., assistant_model=DSparkDrafter(cfg).bind_target(target))` on a target
DSpark was never enabled on), Python looks `target.generate` up before the argument binds, so the call starts in
transformers' own `generate`: the refusals must not depend on which `generate` runs.
"""

import pytest
import torch

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.generation import oracle_for, prompt_lookup_for
from tests.helpers import make_drafter, make_target, ragged_prompts

DRAFTER_FIELDS = dict(block_size=4, markov_rank=8, target_layer_ids=[0, 2])


def _generate(binding: str, target, *args, **kwargs):
    """`target.generate(*args, assistant_model=<a DSpark drafter>, **kwargs)`, the drafter bound before the call or
    inside it."""
    config = DSparkConfig.from_target(target.config, **DRAFTER_FIELDS)
    if binding == "before":
        drafter = DSparkDrafter(config).eval().bind_target(target)
        return target.generate(*args, assistant_model=drafter, **kwargs)
    return target.generate(*args, assistant_model=DSparkDrafter(config).eval().bind_target(target), **kwargs)


def _fresh_target():
    """A target DSpark was never enabled on, with a hook counting its forwards."""
    target = make_target("llama", seed=3)
    forwards = []
    target.register_forward_hook(lambda *args: forwards.append(1))
    return target, forwards


BINDINGS = ["before", "inside"]
IDS, MASK = ragged_prompts(2, seed=1)

# (generate kwargs, the message: the input and the fix it names)
REFUSED = {
    # found by hand
    "beam search, greedy": (dict(num_beams=2, do_sample=False), r"beam search.*num_beams=1"),
    "beam search, sampling": (dict(num_beams=2, do_sample=True), r"beam search.*num_beams=1"),
    "num_assistant_tokens": (dict(num_assistant_tokens=3), r"num_assistant_tokens=3.*dspark_policy='fixed'"),
    "assistant_confidence_threshold": (
        dict(assistant_confidence_threshold=0.7), r"assistant_confidence_threshold=0\.7.*dspark_threshold"
    ),
    "eos_token_id=-1": (dict(eos_token_id=-1), r"eos_token_id must be a token id"),
    "top_p=1.5": (dict(do_sample=True, top_p=1.5), r"top_p must be a number in \(0, 1\]"),
    "string EOS": (dict(eos_token_id="</s>"), r"eos_token_id must be a token id.*convert_tokens_to_ids"),
    # what transformers' assisted tests pass and test_transformers_parity.py adapts
    "output_attentions": (
        dict(return_dict_in_generate=True, output_attentions=True), r"output_attentions.*output_scores"
    ),
    "output_hidden_states": (
        dict(return_dict_in_generate=True, output_hidden_states=True), r"output_hidden_states.*output_scores"
    ),
    "prompt_lookup_num_tokens": (dict(prompt_lookup_num_tokens=2), r"prompt_lookup_num_tokens=2.*prompt_lookup_for"),
    "num_assistant_tokens_schedule": (
        dict(num_assistant_tokens_schedule="heuristic"), r"num_assistant_tokens_schedule.*dspark_policy"
    ),
}


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_any_forward(case, binding):
    kwargs, message = REFUSED[case]
    target, forwards = _fresh_target()
    with pytest.raises(ValueError, match=message):
        _generate(binding, target, IDS, attention_mask=MASK, max_new_tokens=4, **kwargs)
    assert not forwards, "refused only after a target forward (or beam search ran without the drafter)"


@pytest.mark.parametrize("binding", BINDINGS)
def test_empty_prompt_refused_with_the_prompt_message(binding):
    target, forwards = _fresh_target()
    with pytest.raises(ValueError, match=r"input_ids has no tokens.*at least one token"):
        _generate(binding, target, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=4)
    assert not forwards


def test_drafter_generation_config_as_upstream_sets_it():
    """`test_assisted_decoding_matches_greedy_search` sets `assistant_model.generation_config.num_assistant_tokens =
    2` (schedule "constant"). On a drafter bound to this target that must not be explained as "bound to another
    target": it is either accepted (the output is plain `generate`'s) or refused naming the setting."""
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    drafter.generation_config.num_assistant_tokens = 2
    drafter.generation_config.num_assistant_tokens_schedule = "constant"
    kwargs = dict(attention_mask=MASK, do_sample=False, max_new_tokens=6)
    try:
        output = target.generate(IDS, assistant_model=drafter, **kwargs)
    except ValueError as refusal:
        assert "num_assistant_tokens" in str(refusal) and "another target" not in str(refusal)
    else:
        assert torch.equal(output, target.generate(IDS, **kwargs))


@pytest.mark.parametrize("proposer", ["prompt lookup", "oracle"])
def test_model_free_drafters_accept_a_two_layer_target(proposer):
    """Model-free drafters tap no target layer, so any depth serves them (upstream's tiny testers have 2 layers)."""
    target = make_target("llama", seed=3, num_hidden_layers=2)
    kwargs = dict(attention_mask=MASK, do_sample=False, max_new_tokens=8)
    plain = target.generate(IDS, **kwargs)
    drafter = prompt_lookup_for(target, 4) if proposer == "prompt lookup" else oracle_for(target, 4, plain, MASK)
    assert torch.equal(target.generate(IDS, assistant_model=drafter, **kwargs), plain)
