"""The "auto" policy's measured-cost correction: the running averages, and decisions that follow measured costs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling import PolicyMemory
from hf_dspark.scheduling.acceptance import AcceptanceMemory, AcceptanceTracker
from hf_dspark.scheduling.cost_correction import CostCorrection
from hf_dspark.scheduling.cost_policy import CostAwarePlanner
from hf_dspark.scheduling.records import RoundRecord
from tests.helpers import make_drafter, make_target, ragged_prompts

GAMMA = 4
ONE_SECOND = StepCurve([1, 4096], [1.0, 1.0])  # a verification forward: 1 s for any B
HALF_SECOND = StepCurve([1, 4096], [2.0, 2.0])  # a proposal: 0.5 s for any number of rows


def test_first_rounds_average_with_the_prior_then_a_moving_average():
    costs = CostCorrection(weight=0.1, prior_rounds=2)
    costs.observe(False, measured_seconds=4.0, predicted_seconds=1.0)
    assert costs.plain == pytest.approx(4.0 ** (1 / 3))  # one round against two pseudo-rounds at f = 1
    for _ in range(200):
        costs.observe(False, 2.0, 1.0)
    assert costs.plain == pytest.approx(2.0, rel=1e-6)
    costs.observe(False, 4.0, 1.0)  # now an exponential moving average with weight 0.1
    assert math.log(costs.plain) == pytest.approx(math.log(2.0) + 0.1 * math.log(2.0), rel=1e-6)


def test_a_uniformly_slower_machine_leaves_drafting_relatively_unchanged():
    costs = CostCorrection()
    for _ in range(200):
        costs.observe(False, 3.0, 1.0)
        costs.observe(True, 6.0, 2.0)
    assert costs.plain == pytest.approx(3.0, rel=1e-3)
    assert costs.drafting == pytest.approx(3.0, rel=1e-3)
    assert costs.log_relative == pytest.approx(0.0, abs=1e-3)


def test_outliers_are_clipped_and_nonsense_is_ignored():
    costs = CostCorrection(limit=4.0, prior_rounds=0)
    costs.observe(False, 1e6, 1.0)
    assert costs.plain == pytest.approx(4.0)
    for measured, predicted in ((0.0, 1.0), (1.0, 0.0), (float("nan"), 1.0), (float("inf"), 1.0), (-1.0, 1.0)):
        costs.observe(True, measured, predicted)
    assert costs.drafting_rounds == 0 and costs.plain_rounds == 1


def test_the_first_drafting_round_is_not_measured():
    """The drafter's first proposal in a process pays one-off setup: it must not set f_rel."""
    costs = CostCorrection(cold_rounds=1)
    costs.observe(True, measured_seconds=3.0, predicted_seconds=1.0)
    assert costs.drafting_rounds == 1 and costs.log_relative == 0.0
    costs.observe(True, 2.0, 1.0)
    assert costs.drafting == pytest.approx(2.0 ** (1 / 3))  # one measured round against two pseudo-rounds


def test_a_long_run_of_plain_rounds_lets_the_drafting_cost_drift_back():
    costs = CostCorrection(cold_rounds=0, idle_grace=8, idle_relax=0.9)
    for _ in range(30):
        costs.observe(True, 2.0, 1.0)
    high = costs.log_relative
    for _ in range(8):  # within the grace: a plain round beside drafting rounds is no reason to forget
        costs.observe(False, 1.0, 1.0)
    assert costs.log_relative == high
    costs.observe(False, 1.0, 1.0)
    assert costs.log_relative == pytest.approx(0.9 * high)
    costs.observe(True, 2.0, 1.0)  # a drafting round ends the streak: the grace starts again
    assert costs.plain_streak == 0


def test_drafting_switched_off_by_one_bad_measurement_comes_back():
    """Locked out: f_rel can only be re-measured by drafting rounds, which a high f_rel prevents. The drift back
    switches drafting on again, and a drafter that really is dearer is declined again by its new rounds."""
    planner = _planner()
    planner.min_interval = planner.max_interval = 10**6  # no probes: the drift alone
    cap = torch.tensor([GAMMA, GAMMA])
    for _ in range(3):  # the cold round, then two rounds at 4× the curves (a burst of load on the machine)
        planner.observe_round(_record(2, 4.0, 2.0))
    assert not planner.plan(["a", "b"], cap).drafts
    plain_rounds = 0
    while not planner.plan(["a", "b"], cap).drafts:
        planner.observe_round(_record(0, 1.0))
        plain_rounds += 1
        assert plain_rounds < 100, "drafting never came back"
    assert plain_rounds > planner.tracker.memory.costs.idle_grace
    for _ in range(10):  # drafting now really costs 2× the curves: declined again
        planner.observe_round(_record(2, 2.0, 1.0))
    assert not planner.plan(["a", "b"], cap).drafts


@pytest.mark.parametrize(
    "bad",
    [
        {"weight": 0.0},
        {"weight": 1.5},
        {"prior_rounds": -1},
        {"limit": 1.0},
        {"cold_rounds": -1},
        {"idle_grace": -1},
        {"idle_relax": 1.5},
    ],
)
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="CostCorrection needs"):
        CostCorrection(**bad)


def _planner(measured_costs: bool = True) -> CostAwarePlanner:
    memory = AcceptanceMemory.empty(GAMMA)
    memory.trials = torch.tensor([1000.0, 500.0, 250.0, 125.0], dtype=torch.float64)
    memory.successes = memory.trials / 2  # q = 0.5 at every position: E = 1.94 tokens per row at L = 4
    return CostAwarePlanner(AcceptanceTracker(GAMMA, memory), ONE_SECOND, HALF_SECOND, measured_costs=measured_costs)


def _record(drafted: int, seconds: float, draft_seconds: float = 0.0) -> RoundRecord:
    length = GAMMA if drafted else 0
    return RoundRecord(
        ["a", "b"],
        [length, length],
        [1, 1],
        [2, 2],
        drafted=drafted,
        verify_seconds=seconds,
        draft_seconds=draft_seconds,
    )


def test_drafting_that_costs_more_than_the_curves_say_is_declined():
    planner = _planner()
    cap = torch.tensor([GAMMA, GAMMA])
    # By the curves: drafting 2·1.94 tokens / 1.5 s = 2.58 tok/s beats plain 2 tok/s.
    assert planner.plan(["a", "b"], cap).drafts
    for _ in range(30):  # measured: drafting rounds take 3 s (2× the curves), plain rounds 1 s as predicted
        planner.observe_round(_record(0, 1.0))
        planner.observe_round(_record(2, 2.0, 1.0))
    assert planner.tracker.memory.costs.drafting == pytest.approx(2.0, rel=0.05)
    assert not planner.plan(["a", "b"], cap).drafts


def test_plain_rounds_dearer_than_the_curves_make_drafting_pay():
    planner = _planner()
    planner.tracker.memory.successes = planner.tracker.memory.trials * 0.3  # E = 1.42 at L = 4: not worth 1.5 s
    cap = torch.tensor([GAMMA, GAMMA])
    assert not planner.plan(["a", "b"], cap).drafts
    for _ in range(10):  # plain rounds 1.5 s (curve: 1 s), drafting rounds 1.5 s as predicted
        planner.observe_round(_record(0, 1.5))
        planner.observe_round(_record(2, 1.0, 0.5))
    assert planner.plan(["a", "b"], cap).drafts


def test_measured_costs_off_keeps_the_curves():
    planner = _planner(measured_costs=False)
    for _ in range(10):
        planner.observe_round(_record(2, 20.0, 10.0))
    assert planner.tracker.memory.costs.drafting_rounds == 0
    assert planner.plan(["a", "b"], torch.tensor([GAMMA, GAMMA])).drafts


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=5, eos_token_id=None)


@pytest.mark.parametrize("measured", [True, False])
def test_generate_feeds_every_round_to_the_correction_and_stays_identical(target, measured):
    drafter = make_drafter(target, block_size=GAMMA, seed=3)
    ids, mask = ragged_prompts(2, seed=4)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=24,
        dspark_policy="auto",
        dspark_step_curve=ONE_SECOND,
        dspark_draft_curve=HALF_SECOND,
        dspark_measured_costs=measured,
    )
    memory = PolicyMemory()
    output = target.generate(
        ids, attention_mask=mask, assistant_model=drafter, generation_config=config, dspark_policy_memory=memory
    )
    assert torch.equal(output, reference)
    costs = memory.for_mode(GAMMA, greedy=True).costs
    rounds = drafter.last_generation_stats.rounds
    assert costs.plain_rounds + costs.drafting_rounds == (rounds if measured else 0)


def test_a_probe_dearer_than_planned_spaces_the_next_one_by_its_measured_cost():
    """The curves do not price the drafter's update over the context queued while it was skipped, which a probe
    pays: after a measured probe the interval keeps probes within the budget of the measured time."""
    planner = _planner()
    planner.probe_budget, planner.max_interval = 0.02, 10**6
    memory = planner.tracker.memory
    for _ in range(5):
        planner.observe_round(_record(0, 1.0))  # plain rounds: 1 s as the curves say
    memory.probe_interval = 8

    def probe(seconds: float) -> RoundRecord:
        record = _record(2, seconds, draft_seconds=0.5)
        record.probe = True
        return record

    planner.observe_round(probe(9.5))  # the cold first drafting round: one-off setup, not used
    assert memory.probe_interval == 8
    planner.observe_round(probe(2.5))  # 3 s measured: 2 s more than a plain round, 2% of 1 s each → 100 rounds
    assert memory.probe_interval == pytest.approx(100, abs=1)
    planner.observe_round(probe(0.6))  # a cheap probe never shortens a planned interval
    assert memory.probe_interval == pytest.approx(100, abs=1)
    planner.max_interval = 50
    planner.observe_round(probe(2.5))
    assert memory.probe_interval == 50


def test_acceptance_correction_is_a_shrunk_decayed_ratio():
    from hf_dspark.scheduling.cost_correction import AcceptanceCorrection

    correction = AcceptanceCorrection(decay=0.5, prior_drafts=2.0)
    assert correction.factor == 1.0 and correction.key() == 0
    correction.observe(4.0, 1.0)
    assert correction.factor == (1.0 + 2.0) / (4.0 + 2.0)
    correction.observe(4.0, 1.0)
    assert correction.forecast == 6.0 and correction.accepted == 1.5
    correction.observe(2.0, 8.0)  # more accepted than forecast: the factor never exceeds 1
    assert correction.factor == 1.0
    correction.observe(0.0, 3.0)  # a round that forecast nothing is ignored
    assert correction.forecast == 5.0
    with pytest.raises(ValueError):
        AcceptanceCorrection(decay=1.0)
