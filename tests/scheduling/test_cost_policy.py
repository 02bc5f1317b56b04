"""The "auto" policy's planner (hf_dspark.scheduling.cost_policy): the probe schedule and its back-off."""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling.acceptance import AcceptanceMemory, AcceptanceTracker
from hf_dspark.scheduling.cost_policy import CostAwarePlanner

GAMMA = 4
ONE_SECOND = StepCurve([1, 4096], [1.0, 1.0])  # a verification forward: 1 s for any B
TENTH = StepCurve([1, 4096], [10.0, 10.0])  # a proposal: 0.1 s


def _planner(rate: float) -> CostAwarePlanner:
    """A planner whose pool holds conditional acceptance `rate` at every position, firmly (1000 trials each)."""
    memory = AcceptanceMemory.empty(GAMMA)
    memory.trials = torch.full((GAMMA,), 1000.0, dtype=torch.float64)
    memory.successes = memory.trials * rate
    # A probe costs 0.1 s more than a plain round (the proposal): within a 1% budget, one per 10 rounds.
    return CostAwarePlanner(
        AcceptanceTracker(GAMMA, memory),
        ONE_SECOND,
        TENTH,
        probe_budget=0.01,
        min_interval=4,
        max_interval=64,
        measured_costs=False,
    )


def _probe_rounds(planner: CostAwarePlanner, rounds: int) -> list[int]:
    """Plan `rounds` rounds of request "a", whose drafts are never accepted; the indices of the probe rounds."""
    cap, probes = torch.tensor([GAMMA]), []
    for index in range(rounds):
        plan = planner.plan(["a"], cap)
        length = plan.length if plan.drafts else 0
        planner.tracker.observe(["a"], torch.tensor([length]), torch.tensor([0]))
        probes += [index] if plan.probe else []
    return probes


def test_futile_probes_back_off_and_drafts_that_pay_reset_the_wait():
    planner = _planner(rate=0.0)
    probes = _probe_rounds(planner, 300)
    gaps = [later - earlier for earlier, later in itertools.pairwise(probes)]
    # First probe once min_interval rounds passed; then the budget's 10 rounds, doubled per futile probe, capped.
    assert probes[0] == 3 and planner.tracker.memory.probe_interval == 10
    assert gaps == [20, 40, 64, 64, 64]
    assert planner.tracker.memory.futile_probes == len(probes)


def test_a_plan_that_drafts_forgets_the_back_off():
    planner = _planner(rate=0.9)  # drafts that pay: 4.1 tokens per 1.1 s against 1 per second
    memory = planner.tracker.memory
    memory.probe_interval, memory.futile_probes = 10, 3
    assert planner.probe_wait(memory) == 64
    assert planner.plan(["a"], torch.tensor([GAMMA])).drafts
    assert memory.futile_probes == 0 and planner.probe_wait(memory) == 10


def test_without_futile_probes_the_wait_is_the_budgeted_interval():
    planner = _planner(rate=0.0)
    memory = planner.tracker.memory
    memory.probe_interval = 10
    assert planner.probe_wait(memory) == 10
    memory.probe_interval = 2
    assert planner.probe_wait(memory) == 4  # never below min_interval
    memory.futile_probes = 40
    assert planner.probe_wait(memory) == 64  # never beyond max_interval


def test_a_single_rows_decision_on_floats_equals_the_array_path():
    """The batch-1 shortcut (`_decide_one`) makes the array path's decision, bit for bit, over random acceptance
    histories, curves, cost corrections, caps and draft-cost shares."""
    import random

    import numpy as np

    from hf_dspark.scheduling.padded import host_draft_or_decode

    rng = random.Random(0)
    drafting = 0
    for _ in range(400):
        gamma = rng.randint(1, 6)
        tracker = AcceptanceTracker(gamma, AcceptanceMemory.empty(gamma))
        for _ in range(rng.randint(0, 6)):
            length = rng.randint(0, gamma)
            tracker.observe(["r"], [length], [rng.randint(0, length)])
        tokens = [1, 2, 4, 8, 16, 32]
        step = StepCurve(tokens, sorted((rng.uniform(0.5, 2.0) for _ in tokens), reverse=True))
        draft = None if rng.random() < 0.3 else StepCurve([1, 2, 4], [rng.uniform(1.0, 50.0)] * 3)
        planner = CostAwarePlanner(tracker, step, draft, measured_costs=rng.random() < 0.5)
        costs = tracker.memory.costs
        costs.log_plain, costs.log_relative = rng.uniform(-0.5, 0.5), rng.uniform(-0.5, 0.5)
        cap = np.array([rng.randint(0, gamma + 1)])
        share = None if rng.random() < 0.5 else np.array([rng.choice([0.0, 0.3, 1.0])])
        one = planner._decide_one("r", int(cap[0]), None if share is None else float(share[0]))
        expected = planner._expected(tracker.host_survival(["r"]), cap)
        chosen, length = host_draft_or_decode(expected, *planner._host_costs(1), share)
        assert one[1] == length and np.array_equal(one[0], chosen)
        drafting += length > 0
    assert 50 < drafting < 350  # both outcomes are exercised


def test_a_plain_decision_kept_through_idle_decays_is_the_one_recomputing_gives():
    """`_decide` keeps a plain decision through idle decays while the cost ratio stays above the bound it
    certified (`_plain_floor_ratio`); a planner that never keeps it (recomputing after every decay, as the bound
    were infinite) decides the same in every round, over random histories, rows, curves, caps and drifting
    cost corrections, and the kept decisions do save recomputations."""
    import math
    import random

    import numpy as np

    rng = random.Random(1)
    kept = compared = 0
    recomputed = []  # one entry per decision computed afresh
    for _ in range(60):
        gamma, rows = rng.randint(1, 5), [f"r{i}" for i in range(rng.randint(1, 4))]
        tracker = AcceptanceTracker(gamma, AcceptanceMemory.empty(gamma))
        tokens = [1, 2, 4, 8, 16, 32, 64]
        step = StepCurve(tokens, sorted((rng.uniform(0.5, 2.0) for _ in tokens), reverse=True))
        draft = None if rng.random() < 0.3 else StepCurve([1, 2, 4], [rng.uniform(1.0, 50.0)] * 3)
        measured = rng.random() < 0.7
        planner, reference = (CostAwarePlanner(tracker, step, draft, measured_costs=measured) for _ in range(2))
        reference._plain_floor_ratio = lambda rows, cap: math.inf
        tracker.host_conditional = lambda rows, f=tracker.host_conditional: recomputed.append(1) or f(rows)
        planner._decide_one = lambda *args, f=planner._decide_one: recomputed.append(1) or f(*args)
        costs = tracker.memory.costs
        cap = np.array([rng.randint(0, gamma) if rng.random() < 0.2 else gamma for _ in rows])
        for _ in range(40):
            if rng.random() < 0.15:  # now and then a round drafts and observes
                lengths = [rng.randint(0, gamma) for _ in rows]
                tracker.observe(rows, lengths, [rng.randint(0, n) if rng.random() < 0.4 else 0 for n in lengths])
            else:
                tracker.observe(rows, [0] * len(rows), [0] * len(rows))  # an idle round: only decays
            costs.log_plain += rng.uniform(-0.05, 0.05)
            costs.log_relative += rng.uniform(-0.08, 0.06)
            before, cached = len(recomputed), planner._last
            decision = planner._decide(rows, cap)
            expected = reference._decide(rows, cap)
            assert decision[1] == expected[1] and np.array_equal(decision[0], expected[0])
            kept += len(recomputed) == before and (cached is None or cached[0] != planner._last[0])  # no cache hit
            compared += 1
    assert compared == 2400 and kept > 50


def test_a_drafting_plans_forecast_is_the_trackers_estimate_of_its_rows():
    """The forecast a drafting plan carries (the decision's own estimates, not computed again) is bit for bit the
    tracker's conditional acceptance of the drafting rows, for one row and several."""
    import random

    import numpy as np

    rng = random.Random(2)
    plans = 0
    for _ in range(200):
        gamma, rows = rng.randint(1, 5), [f"r{i}" for i in range(rng.randint(1, 5))]
        tracker = AcceptanceTracker(gamma, AcceptanceMemory.empty(gamma))
        for _ in range(rng.randint(1, 6)):
            lengths = [rng.randint(0, gamma) for _ in rows]
            tracker.observe(rows, lengths, [rng.randint(0, n) for n in lengths])
        step = StepCurve([1, 64], sorted((rng.uniform(0.5, 2.0) for _ in range(2)), reverse=True))
        planner = CostAwarePlanner(tracker, step, TENTH if rng.random() < 0.5 else None, measured_costs=False)
        tracker.memory.rounds_since_probe = -(10**6)  # no probe: only plans that draft because they pay
        plan = planner.plan(rows, [gamma] * len(rows))
        if plan.length:
            drafting = [rows[i] for i in plan.rows.tolist()]
            assert torch.equal(plan.forecast, tracker.conditional(drafting))
            one = np.array([tracker.conditional_one(drafting[0])])
            assert np.array_equal(one, tracker.host_conditional(drafting[:1]))
            plans += 1
    assert plans > 40


def test_forecasts_that_run_high_shrink_later_gains():
    """Rows whose estimates promise 0.9 per position but whose drafts are accepted half as often: the planner's
    correction falls towards the realised ratio, and a marginal draft stops being planned."""
    planner = _planner(rate=0.9)
    correction = planner.tracker.memory.acceptance
    assert correction.factor == 1.0
    rows, cap = ["a", "b"], [GAMMA, GAMMA]
    plan = planner.plan(rows, cap)
    assert plan.drafts and plan.length == GAMMA
    forecast = float(planner.tracker.host_survival(["a"]).sum())  # ≈ Σ_j 0.9^j
    planner.observe_acceptance([GAMMA, 0], [1, 0])  # row b did not draft: it forecasts nothing
    assert correction.forecast == pytest.approx(forecast, rel=1e-12) and correction.accepted == 1.0
    for _ in range(40):  # the same plan again and again, half its forecast accepted
        planner.plan(rows, cap)
        planner.observe_acceptance([GAMMA, GAMMA], [1, 1])
    assert 0.3 < correction.factor < 0.4  # ≈ 2 / (2 · Σ 0.9^j) = 0.32, pulled up by the prior drafts
    assert planner.plan(rows, cap).drafts  # 2 + 2 · 0.37 · 3.1 tokens in 1.1 s still beat 2 in 1 s
    correction.forecast *= 100  # forecasts far too high: the shrunk gain no longer pays the 0.1 s proposal
    assert not planner.plan(rows, cap).drafts


def test_probes_and_plain_rounds_report_no_forecast():
    planner = _planner(rate=0.0)
    correction = planner.tracker.memory.acceptance
    for _ in range(20):
        plan = planner.plan(["a"], [GAMMA])
        planner.observe_acceptance([plan.length if plan.drafts else 0], [0])
    assert correction.forecast == 0.0 and correction.factor == 1.0


def test_a_probe_costs_at_most_its_cap():
    """A compute-bound batch of 8 rows: T_verify(B) = 1 + B/16 s, so verifying L drafts on every row costs
    (1 + (1 + L)/2) / 1.5 plain rounds. With good drafts L = γ = 4 would pay best, but a probe under the default
    cap of two plain rounds (3 s) verifies L = 3; without the cap it verifies all 4."""
    sizes = [8, 16, 24, 32, 40]
    curve = StepCurve(sizes, [1.0 / (1.0 + size / 16) for size in sizes])
    rows = [f"r{i}" for i in range(8)]

    def first_plan(**options):
        tracker = AcceptanceTracker(GAMMA, AcceptanceMemory.empty(GAMMA), prior=0.1)  # drafting would not pay …
        planner = CostAwarePlanner(tracker, curve, None, measured_costs=False, **options)
        return planner.plan(rows, [GAMMA] * 8)  # … but a memory never observed probes in its first round

    capped, uncapped = first_plan(), first_plan(probe_cost_cap=float("inf"))
    assert capped.probe and capped.length == 3
    assert uncapped.probe and uncapped.length == GAMMA
    assert first_plan(probe_cost_cap=1.0).length == 1  # no L fits: the shortest probe
