"""The padded-layout policies: uniform ℓ, Θ under R·(1 + L), causal early stop, lagged argmax, Appendix A."""

import random
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_dspark.ops.verification import verify_sampling
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling import get_policy
from hf_dspark.scheduling.padded import (
    batch1_outlook,
    padded_throughput,
    schedule_padded_greedy,
    schedule_padded_lagged,
    sunk_cost_stop,
)

CURVE = StepCurve([1, 2, 3, 4, 6, 8, 12, 16], [10.0, 8.0, 5.0, 7.0, 6.0, 5.5, 3.0, 2.0])


def test_throughput_by_hand():
    survival = torch.tensor([[0.9, 0.45], [0.6, 0.36]])
    theta = padded_throughput(survival, CURVE)
    # L=0: 2·SPS(2); L=1: (2 + 1.5)·SPS(4); L=2: (2 + 1.5 + 0.81)·SPS(6)
    assert torch.allclose(theta, torch.tensor([16.0, 24.5, 4.31 * 6.0], dtype=torch.float64))


def test_greedy_stops_at_the_first_non_improvement_and_lagged_finds_the_global_best():
    survival = torch.tensor([[0.9, 0.85, 0.8]])
    jagged = StepCurve([1, 2, 3, 4], [10.0, 5.0, 4.0, 3.9])  # Θ: 10, 9.5, 10.2, 13.1: a dip, then the best
    assert schedule_padded_greedy(survival, jagged).tolist() == [0]
    assert schedule_padded_lagged(survival, jagged, capacity_survival=survival).tolist() == [3]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5), gamma=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_properties(rows, gamma, seed):
    survival = torch.rand(rows, gamma, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).cumprod(1)
    for verify_len in (schedule_padded_greedy(survival, CURVE), schedule_padded_lagged(survival, CURVE, survival)):
        assert verify_len.shape == (rows,) and len(set(verify_len.tolist())) == 1
        assert 0 <= int(verify_len[0]) <= gamma
    theta = padded_throughput(survival, CURVE)
    assert theta[int(schedule_padded_greedy(survival, CURVE)[0])] >= theta[0]
    assert int(schedule_padded_lagged(survival, CURVE, survival)[0]) == int(torch.argmax(theta))


def test_registered_by_name():
    assert get_policy("greedy_padded").rule is schedule_padded_greedy
    assert get_policy("LAGGED_PADDED").uses_capacity_survival


def test_appendix_a_padded_greedy_is_lossless():
    """Appendix A's setup: c_2 depends on x_1; the padded greedy rule never reads c_2 to decide on x_1."""
    curve = StepCurve([1, 2, 3], [1.0, 0.5, 0.45])
    n = 100_000
    gen = torch.Generator().manual_seed(0)
    x1 = torch.multinomial(torch.tensor([0.5, 0.5]), n, replacement=True, generator=gen)
    # R = 1 per request; the survival row takes two values (x_1 = A or B), so schedule each once and map.
    decision = {v: int(schedule_padded_greedy(torch.tensor([[0.8, 0.8 * v]]), curve)[0]) for v in (0.9, 0.0)}
    verify_len = torch.where(x1 == 0, decision[0.9], decision[0.0])
    drafts = torch.stack([x1, torch.zeros_like(x1)], dim=1)
    p_draft = torch.tensor([0.5, 0.5]).expand(n, 2, 2)
    p_target = torch.tensor([0.7, 0.3]).expand(n, 3, 2)
    result = verify_sampling(drafts, p_draft, p_target, verify_len, generator=gen)
    first = torch.where(result.num_accepted >= 1, x1, result.next_token)
    rate = float((first == 0).double().mean())
    assert abs(rate - 0.7) < 4 * (0.21 / n) ** 0.5


# ---------------------------------------------------------------------------------------------- cost-aware round
FLAT = StepCurve([1, 1024], [1.0, 1.0])  # a verification forward costs 1 s whatever B


def _expected(gains: list[list[float]]) -> torch.Tensor:
    """E_r(L) = 1 + cumulative gains, `[R, γ + 1]`."""
    table = torch.tensor(gains, dtype=torch.float64).cumsum(dim=-1)
    return torch.cat([torch.ones(len(gains), 1, dtype=torch.float64), 1.0 + table], dim=1)


def test_draft_or_decode_by_hand():
    from hf_dspark.scheduling.padded import draft_or_decode, padded_verify_seconds

    good, flat = _expected([[0.9, 0.8, 0.7]] * 2), padded_verify_seconds(FLAT, 2, 3)
    chosen, length = draft_or_decode(good, flat)  # free drafting, free verification: everyone, full length
    assert chosen.tolist() == [True, True] and length == 3
    chosen, length = draft_or_decode(_expected([[0.0, 0.0, 0.0]] * 2), flat)
    assert not chosen.any() and length == 0  # nothing to gain: plain decoding (ties go to plain)
    # Θ(plain) = 2; drafting both rows for L = 3 gives (2 + 4.8) / (1 + T) > 2 iff T < 2.4
    assert draft_or_decode(good, flat, torch.tensor([0.0, 2.3, 2.3], dtype=torch.float64))[1] == 3
    assert draft_or_decode(good, flat, torch.tensor([0.0, 2.5, 2.5], dtype=torch.float64))[1] == 0


def test_draft_or_decode_drafts_only_the_rows_that_pay():
    from hf_dspark.scheduling.padded import draft_or_decode, padded_verify_seconds

    expected = _expected([[0.05, 0.0], [0.95, 0.9], [0.1, 0.0]])
    per_row = torch.tensor([0.0, 0.3, 0.6, 0.9], dtype=torch.float64)  # the drafter costs 0.3 s per row
    chosen, length = draft_or_decode(expected, padded_verify_seconds(FLAT, 3, 2), per_row)
    assert chosen.tolist() == [False, True, False] and length == 2  # (3 + 1.85) / 1.3 beats 3 and the rest


@settings(max_examples=200, deadline=None)
@given(
    gains=st.lists(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3), min_size=1, max_size=5),
    per_row=st.floats(0.0, 0.5),
    verify_step=st.floats(0.0, 0.5),
)
def test_draft_or_decode_reaches_the_best_subset_of_rows_and_length(gains, per_row, verify_step):
    """Against every subset of rows and every L: the chosen rows and L reach the best Θ(k, L), and plain decoding is
    chosen exactly when no subset beats it."""
    import itertools

    from hf_dspark.scheduling.padded import draft_or_decode

    rows, gamma = len(gains), 3
    expected = _expected(gains)
    verify = torch.tensor([1.0 + verify_step * L for L in range(gamma + 1)], dtype=torch.float64)
    draft = torch.tensor([per_row * k for k in range(rows + 1)], dtype=torch.float64)

    def theta(subset, length):
        tokens = rows + sum(float(expected[r, length]) - 1.0 for r in subset)
        return tokens / (float(verify[length]) + float(draft[len(subset)]))

    best = max(theta(subset, length) for k in range(1, rows + 1) for subset in itertools.combinations(range(rows), k)
               for length in range(1, gamma + 1))
    chosen, length = draft_or_decode(expected, verify, draft)
    plain = rows / float(verify[0])
    if length == 0:
        assert not chosen.any() and best <= plain + 1e-12
    else:
        subset = chosen.nonzero().flatten().tolist()
        assert theta(subset, length) == pytest.approx(best, rel=1e-12) and best > plain - 1e-12


def test_sunk_cost_stop_looks_past_a_dip_in_the_curve():
    from hf_dspark.scheduling.padded import padded_verify_seconds, sunk_cost_stop

    rising = StepCurve([1, 2, 3, 4], [1.0, 0.9, 0.5, 0.45])
    verify = padded_verify_seconds(rising, 1, 3)
    survival = torch.tensor([[0.9, 0.8, 0.7]])
    # Θ(L) = (1 + Σ a) / (0.5 + 1/SPS(1 + L)): 0.667, 1.18, 1.08, 1.25: L = 2 dips, L = 3 is best
    assert sunk_cost_stop(survival, 1, verify, 0.5, 3) == 3
    # earlier rounds say position 3 is rarely accepted: forecast Θ(3) = (1 + 0.9 + 0.8 + 0.08) / 2.72 < Θ(1)
    assert sunk_cost_stop(survival, 1, verify, 0.5, 3, forecast=torch.tensor([[0.9, 0.9, 0.1]])) == 1
    assert sunk_cost_stop(survival, 1, padded_verify_seconds(FLAT, 1, 3), 0.5, 2) == 2  # capped by max_length
    # the oracle's case on the fp32 CPU curve: every draft kept, T_verify(4) ≫ T_verify(3): L = γ, not 2
    jagged = StepCurve([1, 2, 3, 4, 8], [1 / 58.9, 1 / 66.2, 1 / 73.5, 1 / 100.5, 1 / 140.3])
    assert sunk_cost_stop(torch.full((1, 7), 0.99), 1, padded_verify_seconds(jagged, 1, 7), 0.0, 7) == 7


def test_sunk_cost_stop_is_a_stopping_rule():
    """Lossless: when it returns L, survivals after position L + 1 (which depend on drafts x_{>L}) were not read."""
    from hf_dspark.scheduling.padded import padded_verify_seconds, sunk_cost_stop

    generator = torch.Generator().manual_seed(0)
    lengths = set()
    for _ in range(300):
        rows, gamma = int(torch.randint(1, 4, (1,), generator=generator)), 6
        costs = torch.rand(gamma + 2, generator=generator).cumsum(0)
        curve = StepCurve(list(range(1, rows * (gamma + 1) + 1)),
                          (1.0 / torch.rand(rows * (gamma + 1), generator=generator).add(0.5).cumsum(0)).tolist())
        verify = padded_verify_seconds(curve, rows, gamma) if costs[0] > 0 else None
        survival = torch.rand(rows, gamma, generator=generator).cumprod(-1)
        forecast = torch.rand(rows, gamma, generator=generator)
        draft = float(costs[-1])
        length = sunk_cost_stop(survival, rows, verify, draft, gamma, forecast)
        lengths.add(length)
        if length + 1 < gamma:
            changed = survival.clone()
            changed[:, length + 1 :] = torch.rand(rows, gamma - length - 1, generator=generator)
            changed[:, length + 1 :] = torch.minimum(changed[:, length + 1 :], changed[:, length : length + 1])
            assert sunk_cost_stop(changed, rows, verify, draft, gamma, forecast) == length
    assert len(lengths) > 3  # the cases reach several stopping points


def test_appendix_a_lagged_draft_or_decode_is_lossless_and_a_leaky_rule_is_not():
    """Round 2's ℓ comes from round 1's realised acceptance (the "auto" planner): the first token of round 2
    still follows p_target. Choosing ℓ from round 2's own draft (skip verification when it looks wrong) does not."""
    from hf_dspark.scheduling.acceptance import AcceptanceMemory, AcceptanceTracker
    from hf_dspark.scheduling.cost_policy import CostAwarePlanner

    n, gen = 100_000, torch.Generator().manual_seed(1)
    p_draft, p_target = torch.tensor([0.5, 0.5]), torch.tensor([0.7, 0.3])
    curve, draft_cost = StepCurve([1, 2], [1.0, 1.0]), StepCurve([1, 2], [1.6, 1.6])

    def round_of(verify_len: torch.Tensor):
        drafts = torch.multinomial(p_draft, n, replacement=True, generator=gen)[:, None]
        result = verify_sampling(drafts, p_draft.expand(n, 1, 2), p_target.expand(n, 2, 2), verify_len, generator=gen)
        return drafts[:, 0], result, torch.where(result.num_accepted >= 1, drafts[:, 0], result.next_token)

    _, first, _ = round_of(torch.ones(n, dtype=torch.long))
    decision = {}
    for accepted in (0, 1):  # the planner's choice after each possible round-1 history
        planner = CostAwarePlanner(AcceptanceTracker(1, AcceptanceMemory.empty(1)), curve, draft_cost)
        planner.tracker.observe(["r"], torch.tensor([1]), torch.tensor([accepted]))
        planner.tracker.memory.rounds_since_probe, planner.tracker.memory.probe_interval = 0, 10**6
        decision[accepted] = planner.plan(["r"], torch.tensor([1])).length or 0
    assert decision == {0: 0, 1: 1}  # the lag matters: it drafts only after an accepted draft
    lagged = torch.where(first.num_accepted == 1, decision[1], decision[0])
    _, _, token = round_of(lagged)
    rate = float((token == 0).double().mean())
    assert abs(rate - 0.7) < 4 * (0.21 / n) ** 0.5
    drafts = torch.multinomial(p_draft, n, replacement=True, generator=gen)[:, None]
    leaky = (drafts[:, 0] == 0).long()  # verify only drafts that look right: reads the current draft
    result = verify_sampling(drafts, p_draft.expand(n, 1, 2), p_target.expand(n, 2, 2), leaky, generator=gen)
    token = torch.where(result.num_accepted >= 1, drafts[:, 0], result.next_token)
    assert abs(float((token == 0).double().mean()) - 0.7) > 0.05


def test_batch1_outlook_by_hand():
    # L = 1: (1 + 0.5) / (1.5 + 0.1) = 0.9375 of plain; L = 2: (1 + 0.5 + 0.25) / (2.0 + 0.1) = 0.833.
    length, ratio = batch1_outlook([0.5, 0.5], [1.0, 1.5, 2.0], 0.1)
    assert length == 1 and ratio == pytest.approx(1.5 / 1.6)
    # Perfect drafts and a flat curve: verify everything, (1 + 2) / 1.2 = 2.5x.
    assert batch1_outlook([1.0, 1.0], [1.0, 1.1, 1.2], 0.0) == (2, pytest.approx(2.5))
    with pytest.raises(ValueError, match="γ \\+ 1 verification costs"):
        batch1_outlook([0.5, 0.5], [1.0, 1.5], 0.1)


def test_sunk_cost_stop_does_not_depend_on_the_order_of_rows():
    """At a tie between stopping and going on (costs chosen so that Θ(1) = Θ(0) in exact arithmetic), the rule's
    sums are correctly rounded: the decision is the same for any order of the rows, and on every Python version
    (3.12's `sum` compensates, 3.11's does not). A left-to-right float sum flips it for some of these batches."""
    for seed in range(200):
        gen = random.Random(seed)
        column = [gen.random() for _ in range(64)]
        exact = sum(Fraction(value) for value in column)
        verify = torch.tensor([1.0, float((64 + exact) / 64)], dtype=torch.float64)
        survival = torch.tensor(column, dtype=torch.float64)[:, None]
        decisions = {sunk_cost_stop(order, 64, verify, 0.0, 1) for order in (survival, survival.flip(0))}
        assert len(decisions) == 1, seed
