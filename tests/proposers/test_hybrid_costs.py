"""The hybrid's per-row cost in "auto": lookup rows are priced at zero, DSpark rows at the drafter's curve."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.proposers import hybrid_for
from hf_dspark.proposers.hybrid import DSPARK, LOOKUP
from hf_dspark.scheduling.acceptance import AcceptanceMemory, AcceptanceTracker
from hf_dspark.scheduling.cost_policy import CostAwarePlanner
from hf_dspark.scheduling.padded import draft_or_decode
from hf_dspark.scheduling.verification_policy import VerificationPolicy
from hf_dspark.serving.engine import DSparkEngine
from tests.generation.test_auto_policy import _assert_row_context
from tests.helpers import make_drafter, make_target

GAMMA = 4
FLAT = StepCurve([1, 4096], [1.0, 1.0])  # verification: 1 s whatever B
DEAR = StepCurve([1, 4096], [2.0, 2.0])  # a DSpark proposal: 0.5 s for any number of rows
RUINOUS = StepCurve([1, 4096], [0.05, 0.05])  # 20 s: DSpark drafts never pay, even if all were accepted


def _planner(rate: float) -> CostAwarePlanner:
    memory = AcceptanceMemory.empty(GAMMA)
    memory.trials = torch.full((GAMMA,), 1000.0, dtype=torch.float64)
    memory.successes = memory.trials * rate
    return CostAwarePlanner(AcceptanceTracker(GAMMA, memory), FLAT, DEAR, measured_costs=False)


def test_auto_drafts_a_lookup_row_where_a_dspark_row_at_equal_confidence_does_not_pay():
    # q = 0.3: E = 1.43 tokens. DSpark: 1.43 / 1.5 s < 1 token/s plain; lookup (free): 1.43 / 1 s > 1.
    cap = torch.tensor([GAMMA])
    dspark = _planner(0.3).plan(["a"], cap, torch.tensor([1.0]))
    lookup = _planner(0.3).plan(["a"], cap, torch.tensor([0.0]))
    assert not dspark.drafts
    assert lookup.drafts and lookup.length == GAMMA and lookup.priced_rows == 0
    assert not _planner(0.3).plan(["a"], cap).drafts  # no shares: every row pays, as before
    both = _planner(0.3).plan(["a", "b"], torch.tensor([GAMMA, GAMMA]), torch.tensor([1.0, 0.0]))
    assert both.rows.tolist() == [1] and both.priced_rows == 0


def test_draft_or_decode_ranks_cheaper_rows_first_and_prices_their_shares():
    expected = torch.tensor([[1.0, 1.5, 1.8], [1.0, 1.5, 1.8]], dtype=torch.float64)
    verify = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    draft = torch.tensor([0.0, 0.9, 0.9], dtype=torch.float64)
    assert draft_or_decode(expected, verify, draft)[1] == 0  # (2 + 1.6) / 1.9 < 2 plain
    chosen, length = draft_or_decode(expected, verify, draft, torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert chosen.tolist() == [False, True] and length == 2  # (2 + 0.8) / 1 > 2


def _repetitive_prompt(target) -> torch.Tensor:
    """A prompt whose greedy continuation the target repeats: its own reference output, twice."""
    seed = torch.tensor([[5, 9, 14, 3, 22, 7, 11]])
    out = target.generate(seed, attention_mask=torch.ones_like(seed), do_sample=False, max_new_tokens=24)
    return torch.cat([out, out], dim=1)


def test_auto_with_the_hybrid_drafts_lookup_rows_that_a_dspark_drafter_would_skip():
    target = make_target("llama", seed=21, eos_token_id=None)
    ids = _repetitive_prompt(target)
    mask = torch.ones_like(ids)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    config = GenerationConfig(do_sample=False, max_new_tokens=40, dspark_policy="auto", dspark_step_curve=FLAT,
                              dspark_draft_curve=RUINOUS, dspark_measured_costs=False)  # fmt: skip
    drafter = make_drafter(target, block_size=GAMMA)
    assert torch.equal(target.generate(ids, attention_mask=mask, assistant_model=drafter, generation_config=config),
                       reference)  # fmt: skip
    alone = drafter.last_generation_stats
    hybrid = hybrid_for(make_drafter(target, block_size=GAMMA), "prompt-lookup")
    output = target.generate(ids, attention_mask=mask, assistant_model=hybrid, generation_config=config)
    assert torch.equal(output, reference)
    mixed = hybrid.last_generation_stats
    assert hybrid.source_counts[LOOKUP] > hybrid.source_counts[DSPARK]
    assert alone.skipped_rounds == alone.rounds
    assert mixed.skipped_rounds < mixed.rounds / 2 and mixed.mean_accepted_length > 2.0


def test_the_dspark_context_waits_for_its_proposal_and_is_then_complete():
    target = make_target("llama", seed=21, eos_token_id=None)
    drafter = make_drafter(target, block_size=GAMMA)
    hybrid = hybrid_for(drafter, "prompt-lookup", prior=(0.0, 3.0))  # lookup first, DSpark once it fails
    policy = VerificationPolicy("fixed", block_size=GAMMA)
    engine = DSparkEngine(target, hybrid, policy=policy)
    prompt = _repetitive_prompt(target)[0]
    rid = engine.add_request(prompt, max_new_tokens=200)
    queued = 0
    for _ in range(8):
        engine.step()
        queued = max(queued, engine.batch.draft_cache.queued_slots())
    assert queued > 0, "lookup rounds queue the DSpark context update"
    cache = engine.batch.draft_cache
    cache.flush()
    assert not cache.queued
    _assert_row_context(target, drafter, cache.inner, 0, prompt, engine.result(rid).generated)


def test_the_hybrid_prices_its_dspark_rows_at_the_drafters_own_curve():
    from hf_dspark.profiling.draft_steps import load_or_profile_draft_curve

    target = make_target("llama", seed=21, eos_token_id=None)
    drafter = make_drafter(target, block_size=GAMMA)
    hybrid = hybrid_for(drafter, "prompt-lookup")
    curve = hybrid.draft_curve  # looked up (here profiled once) as generate does for the drafter alone
    assert curve is not None
    assert curve.to_dict() == load_or_profile_draft_curve(drafter, progress=False).to_dict()
    assert hybrid_for(drafter, "prompt-lookup", draft_curve=DEAR).draft_curve is DEAR


CHEAP = StepCurve([1, 4096], [1e6, 1e6])  # a DSpark proposal costs ~nothing: every plan drafts


def _auto_policy():
    from hf_dspark.scheduling.auto import AutoPolicy
    from hf_dspark.scheduling.records import PolicySettings

    settings = PolicySettings(block_size=GAMMA, step_curve=FLAT, draft_curve=CHEAP, measured_costs=False)
    return AutoPolicy(settings)


def test_auto_keeps_the_hybrids_acceptance_per_request_and_source():
    """A request alternating between lookup (every draft accepted) and DSpark (none accepted) is planned with the
    acceptance of the source it uses this round, not a mix of both; a plain drafter keeps one per request."""
    policy, cap = _auto_policy(), [GAMMA]
    for _ in range(12):
        for share, accepted in ((0.0, GAMMA), (1.0, 0)):
            plan = policy.plan(["a"], cap, torch.tensor([share]))
            assert plan.drafts and plan.length == GAMMA
            policy.observe(["a"], torch.tensor([GAMMA]), torch.tensor([accepted]))
    lookup = policy.plan(["a"], cap, torch.tensor([0.0])).forecast[0]
    dspark = policy.plan(["a"], cap, torch.tensor([1.0])).forecast[0]
    assert float(lookup[0]) > 0.8 and float(dspark[0]) < 0.25
    policy.forget(["a"])
    assert not policy.planner.tracker.observed(("a", 0.0)) and not policy.planner.tracker.observed(("a", 1.0))

    plain = _auto_policy()
    for accepted in (GAMMA, 0) * 12:
        plain.plan(["a"], cap)
        plain.observe(["a"], torch.tensor([GAMMA]), torch.tensor([accepted]))
    assert plain.planner.tracker.observed("a")
    assert 0.25 < float(plain.plan(["a"], cap).forecast[0, 0]) < 0.8  # one mixed estimate without sources
    plain.forget(["a"])
    assert not plain.planner.tracker.observed("a")
