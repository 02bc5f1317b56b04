"""The hybrid's lagged scores: when an agreement is final, what a mean agreement says per position, and how "auto"
plans a lookup row with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_dspark.generation.policy import VerificationPolicy
from hf_dspark.proposers import hybrid_for
from hf_dspark.proposers.hybrid import HybridRowState
from hf_dspark.proposers.scoring import (
    CONDITIONAL_RANGE,
    LOOKUP,
    agreement,
    lookup_conditional,
    resolved_agreement,
)
from hf_dspark.scheduler import StepCurve
from hf_dspark.scheduling.acceptance import AcceptanceMemory, AcceptanceTracker
from hf_dspark.scheduling.cost_policy import CostAwarePlanner
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


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_lookup_conditional_inverts_the_expected_agreement(gamma):
    scores = np.linspace(0.0, gamma, 57)
    rates = np.array(lookup_conditional(scores.tolist(), gamma))
    low, high = CONDITIONAL_RANGE
    assert np.all(np.diff(rates) >= 0) and rates.min() >= low and rates.max() <= high
    expected = (rates[:, None] ** np.arange(1, gamma + 1)[None, :]).sum(axis=1)
    inside = (rates > low) & (rates < high)
    np.testing.assert_allclose(expected[inside], scores[inside], atol=2e-3)
    assert rates[0] == low and rates[-1] == high


def test_lookup_conditional_reads_a_mean_agreement_as_a_rate_not_a_fraction():
    (rate,) = lookup_conditional([3.0], 7)  # 3 of 7 drafts accepted on average
    assert 0.7 < rate < 0.8  # a flat 3 / 7 = 0.43 per position would forecast 0.75 accepted drafts
    assert sum(rate**j for j in range(1, 8)) == pytest.approx(3.0, abs=2e-3)


def test_a_lookup_scored_one_token_per_round_climbs_past_one():
    """Rounds that verify nothing commit one token each; the lookup's proposals must still be scored in full."""
    target = make_target("llama", seed=3, eos_token_id=None)
    hybrid = hybrid_for(make_drafter(target, block_size=GAMMA), "prompt-lookup", prior=(1.0, 0.0))
    state = HybridRowState(match=None, scores=[1.0, 0.0])
    text = list(range(7, 21))
    last = len(text) - GAMMA
    for length in range(2, last):
        state.pending.append((LOOKUP, length, text[length : length + GAMMA]))  # a proposal that the text confirms
        hybrid._score(state, text[: length + 1])  # one more token committed
    assert state.scores[LOOKUP] > 3.0  # confirmed proposals of 4 tokens: the score tends to 4, not to 1
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
