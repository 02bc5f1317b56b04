"""`auto`'s cross-call memory is a `PolicyMemory` the caller owns: no hidden state between `generate` calls."""

from __future__ import annotations

import torch

from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling import PolicyMemory
from tests.helpers import make_drafter, make_target, ragged_prompts

FLAT = StepCurve([1, 4096], [1.0, 1.0])
DRAFT = StepCurve([1, 4096], [1 / 0.9, 1 / 0.9])  # dear drafting: what "auto" remembers changes its plans
OPTIONS = dict(do_sample=True, temperature=1.0, max_new_tokens=24, dspark_policy="auto", dspark_step_curve=FLAT,
               dspark_draft_curve=DRAFT, dspark_measured_costs=False)


def _sample(target, drafter, ids, mask, **extra):
    torch.manual_seed(123)
    return target.generate(ids, attention_mask=mask, assistant_model=drafter, **OPTIONS, **extra)


def test_two_identical_seeded_sampling_calls_give_identical_output():
    target = make_target("llama", seed=5, eos_token_id=None)
    drafter = make_drafter(target, block_size=4, seed=3)
    ids, mask = ragged_prompts(3, seed=4)
    first = _sample(target, drafter, ids, mask)
    assert drafter.last_generation_stats.rounds > 0
    assert torch.equal(_sample(target, drafter, ids, mask), first)


def test_a_caller_owned_memory_learns_across_calls_and_resets():
    target = make_target("llama", seed=5, eos_token_id=None)
    drafter = make_drafter(target, block_size=4, seed=3)
    ids, mask = ragged_prompts(2, seed=4)
    memory = PolicyMemory()
    _sample(target, drafter, ids, mask, dspark_policy_memory=memory)
    learnt = memory.for_mode(4, greedy=False)
    assert learnt.observed  # the call's rounds landed in the caller's memory
    assert not memory.for_mode(4, greedy=True).observed  # per decoding mode
    memory.reset()
    assert not memory.for_mode(4, greedy=False).observed
