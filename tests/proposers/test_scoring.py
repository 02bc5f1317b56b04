"""The hybrid's lagged scores: when an agreement is final, the lookup's per-position forecast, and how "auto" plans a
lookup row with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.proposers import hybrid_for
from hf_dspark.proposers.hybrid import HybridRowState
from hf_dspark.proposers.scoring import (
    LOOKUP,
    LOOKUP_PRIOR,
    agreement,
    forecast_conditional,
    observe_agreement,
    resolved_agreement,
)
from hf_dspark.scheduling.acceptance import AcceptanceMemory, AcceptanceTracker, observed_positions
from hf_dspark.scheduling.cost_policy import CostAwarePlanner
from hf_dspark.scheduling.verification_policy import VerificationPolicy
from tests.helpers import make_drafter, make_target

GAMMA = 4
STEEP = StepCurve([1, 5, 4096], [1.0, 1 / 1.8, 1 / 1.8])  # verifying 4 drafts costs 1.8 plain steps


def test_resolved_agreement_waits_while_every_committed_token_agrees():
    assert agreement([4, 5, 6], [4, 5, 9]) == 2
    assert resolved_agreement([4, 5, 6], [4]) is None  # one token committed: the count may still grow
    assert resolved_agreement([4, 5, 6], [4, 5]) is None
    assert resolved_agreement([4, 5, 6], [4, 5, 6]) == 3  # every proposed token has its committed one
    assert resolved_agreement([4, 5, 6], [4, 5, 6, 7]) == 3
    assert resolved_agreement([4, 5, 6], [4, 8]) == 1  # a mismatch decides it
    assert resolved_agreement([4, 5, 6], [8]) == 0
    assert resolved_agreement([4, 5, 6], []) is None


def test_observe_agreement_counts_positions_as_a_verified_round_of_gamma():
    successes, trials = observe_agreement([0.0] * GAMMA, [0.0] * GAMMA, 2)
    assert successes == [1.0, 1.0, 0.0, 0.0] and trials == [1.0, 1.0, 1.0, 0.0]  # position 4 censored
    seen, kept = observed_positions(torch.tensor([GAMMA]), torch.tensor([2]), GAMMA)
    assert trials == seen[0].double().tolist() and successes == kept[0].double().tolist()
    successes, trials = observe_agreement(successes, trials, GAMMA, decay=0.5)
    assert successes == [1.5, 1.5, 1.0, 1.0] and trials == [1.5, 1.5, 1.5, 1.0]


def test_forecast_conditional_moves_from_the_prior_to_the_observed_rate():
    assert forecast_conditional([0.0] * GAMMA, [0.0] * GAMMA) == [LOOKUP_PRIOR] * GAMMA
    successes, trials = [0.0] * GAMMA, [0.0] * GAMMA
    for _ in range(40):  # always 2 of 4 agree: q = 1, 1, 0 (position 4 never observed)
        successes, trials = observe_agreement(successes, trials, 2)
    rates = forecast_conditional(successes, trials)
    window = 1 / (1 - 0.8)  # decayed trials tend to 1 / (1 - decay) = 5, held against 2 pseudo-trials of 0.5
    kept, rejected = (window + 1) / (window + 2), 1 / (window + 2)
    assert rates[:3] == pytest.approx([kept, kept, rejected], abs=1e-4)
    assert rates[3] == LOOKUP_PRIOR


def test_a_lookup_scored_one_token_per_round_climbs_past_one():
    """Rounds that verify nothing commit one token each; the lookup's proposals must still be scored in full."""
    target = make_target("llama", seed=3, eos_token_id=None)
    hybrid = hybrid_for(make_drafter(target, block_size=GAMMA), "prompt-lookup", prior=(1.0, 0.0))
    state = HybridRowState(match=None, scores=[1.0, 0.0], lookup_counts=([0.0] * GAMMA, [0.0] * GAMMA))
    text = list(range(7, 21))
    last = len(text) - GAMMA
    for length in range(2, last):
        state.pending.append((LOOKUP, length, text[length : length + GAMMA]))  # a proposal that the text confirms
        hybrid._score(state, text[: length + 1])  # one more token committed
    assert state.scores[LOOKUP] > 3.0  # confirmed proposals of 4 tokens: the score tends to 4, not to 1
    assert min(forecast_conditional(*state.lookup_counts)) > 0.8  # and the forecast says so at every position
    assert [start for _, start, _ in state.pending] == [last - 3, last - 2, last - 1]  # the unresolved ones wait
    hybrid._score(state, [*text[: last + 2], 0])  # a mismatch resolves them all
    assert not state.pending


def _rejected_planner() -> CostAwarePlanner:
    """A planner whose pooled evidence says drafts are mostly rejected (q = 0.2 at every position)."""
    memory = AcceptanceMemory.empty(GAMMA)
    memory.trials = torch.full((GAMMA,), 1000.0, dtype=torch.float64)
    memory.successes = memory.trials * 0.2
    return CostAwarePlanner(AcceptanceTracker(GAMMA, memory), STEEP, None, measured_costs=False)


def test_auto_plans_a_row_with_the_drafters_own_forecast():
    cap = [GAMMA, GAMMA]
    assert not _rejected_planner().plan(["a", "b"], cap, torch.tensor([0.0, 0.0])).drafts
    plan = _rejected_planner().plan(["a", "b"], cap, torch.tensor([0.0, 0.0]), [None, [0.9] * GAMMA])
    assert 1 in plan.rows.tolist() and plan.length >= 1
    forecast = plan.forecast.numpy()[plan.rows.tolist().index(1)]
    np.testing.assert_allclose(forecast, [0.9] * GAMMA)  # the sunk-cost stop looks ahead with it
    low = _rejected_planner().plan(["a", "b"], cap, torch.tensor([0.0, 0.0]), [None, [0.05] * GAMMA])
    assert not low.drafts


def test_only_a_rule_that_declares_it_gets_the_forecasts():
    fixed = VerificationPolicy(name="fixed", block_size=GAMMA)
    assert fixed.plan(["a"], [GAMMA], None, [[0.9] * GAMMA]).drafts  # ignored: fixed drafts every row
    auto = VerificationPolicy(name="auto", block_size=GAMMA, step_curve=STEEP, measured_costs=False)
    assert auto.plan(["a"], [GAMMA], torch.tensor([0.0]), [[0.9] * GAMMA]).length >= 1
