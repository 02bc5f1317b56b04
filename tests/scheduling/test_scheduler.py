"""Tests for hf_dspark.scheduling (docs/scheduling.md: Algorithm 1, worked traces, Appendix A)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_dspark.ops.verification import verify_sampling
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling import BasePolicy, get_policy
from hf_dspark.scheduling.expectation import expected_throughput
from hf_dspark.scheduling.fixed import schedule_fixed
from hf_dspark.scheduling.greedy import schedule_greedy
from hf_dspark.scheduling.lagged import capacity_from_survival, schedule_lagged
from hf_dspark.scheduling.threshold import schedule_threshold

FEW = settings(max_examples=40, deadline=None)


def _theta(survival: torch.Tensor, verify_len: torch.Tensor, curve: StepCurve) -> float:
    return float(expected_throughput(survival, verify_len, curve))


def _sorted_candidates(survival: torch.Tensor) -> list[tuple[int, int]]:
    """The candidate order written out literally: a descending, then lower position j, then lower request r."""
    rows, gamma = survival.shape
    cands = [(r, j) for r in range(rows) for j in range(gamma) if survival[r, j] > 0]
    return sorted(cands, key=lambda rj: (-float(survival[rj]), rj[1], rj[0]))


def _algorithm1_loop(survival: torch.Tensor, curve: StepCurve) -> list[int]:
    """Algorithm 1 transcribed step by step (the plain Python loop the vectorised version must match)."""
    rows = survival.shape[0]
    lengths, best_lengths = [0] * rows, [0] * rows
    batch, tau = rows, float(rows)
    best = tau * curve.steps_per_second_at(batch)
    for r, j in _sorted_candidates(survival.double()):
        lengths[r], batch, tau = j + 1, batch + 1, tau + float(survival[r, j].double())
        theta = tau * curve.steps_per_second_at(batch)
        if theta > best:
            best, best_lengths = theta, list(lengths)
        else:
            break
    return best_lengths


def _brute_force_best(survival: torch.Tensor, curve: StepCurve) -> float:
    """Best Θ over every prefix-closed assignment within the candidate pool (Algorithm 1 step 2: a > 0 only;
    a zero-survival draft can only raise Θ through a curve that rises with B, which is not a real gain)."""
    positive = (survival > 0).sum(dim=-1).tolist()
    return max(
        _theta(survival, torch.tensor(lengths), curve)
        for lengths in itertools.product(*(range(n + 1) for n in positive))
    )


def _admitted_set(verify_len: torch.Tensor) -> set[tuple[int, int]]:
    return {(r, j) for r, length in enumerate(verify_len.tolist()) for j in range(length)}


@st.composite
def survivals(draw, max_rows: int = 4, max_gamma: int = 4, distinct: bool = False) -> torch.Tensor:
    """[R, γ] survival = cumprod of confidences; coarse grid values (many ties) unless `distinct`."""
    rows, gamma = draw(st.integers(1, max_rows)), draw(st.integers(1, max_gamma))
    if distinct:
        seed = draw(st.integers(0, 2**31 - 1))
        conf = torch.rand(rows, gamma, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    else:
        ints = draw(st.lists(st.integers(0, 10), min_size=rows * gamma, max_size=rows * gamma))
        conf = torch.tensor(ints, dtype=torch.float64).reshape(rows, gamma) / 10
    return torch.cumprod(conf, dim=-1)


@st.composite
def step_curves(draw) -> StepCurve:
    """Decreasing SPS at every B in 1..40, sometimes with jagged bumps."""
    drops = draw(st.lists(st.floats(0.0, 0.3), min_size=39, max_size=39))
    sps = [1.0]
    for drop in drops:
        sps.append(max(sps[-1] * (1.0 - drop), 1e-3))
    if draw(st.booleans()):
        bumps = draw(st.lists(st.floats(0.5, 1.5), min_size=40, max_size=40))
        sps = [s * b for s, b in zip(sps, bumps)]
    return StepCurve(list(range(1, 41)), sps)


# ---------------------------------------------------------------- StepCurve


def test_step_curve_interpolation_and_extrapolation():
    curve = StepCurve([2, 4, 8], [1.0, 0.6, 0.2])
    assert curve.steps_per_second_at(1) == pytest.approx(1.0)  # clamped below
    assert curve.steps_per_second_at(3) == pytest.approx(0.8)
    assert curve.steps_per_second_at(6) == pytest.approx(0.4)
    assert curve.steps_per_second_at(16) == pytest.approx(0.2 * 8 / 16)  # constant token throughput beyond
    table = curve.steps_per_second_at(torch.tensor([[1, 3], [6, 16]]))
    assert table.shape == (2, 2)
    assert table.reshape(-1).tolist() == pytest.approx([1.0, 0.8, 0.4, 0.1])
    single = StepCurve([4], [2.0])
    assert single.steps_per_second_at(torch.tensor([1, 4, 8])).tolist() == pytest.approx([2.0, 2.0, 1.0])


@pytest.mark.parametrize(
    ("tokens", "sps", "match"),
    [
        ([], [], "at least one"),
        ([1, 2], [1.0], "must match"),
        ([2, 1], [1.0, 1.0], "ascending"),
        ([1, 1], [1.0, 1.0], "ascending"),
        ([0, 1], [1.0, 1.0], "positive integers"),
        ([1, 2], [1.0, 0.0], "> 0"),
        ([1, 2], [1.0, float("inf")], "> 0"),
    ],
)
def test_step_curve_validation(tokens, sps, match):
    with pytest.raises(ValueError, match=match):
        StepCurve(tokens, sps)


def test_step_curve_save_load_plot(tmp_path):
    curve = StepCurve([1, 8, 64], [16.0, 9.0, 3.5], model="tiny", device="cpu", dtype="float32", threads=1)
    path = tmp_path / "sub" / "step_curve.json"
    curve.save(path)
    payload = json.loads(path.read_text())
    assert payload["batch_tokens"] == [1, 8, 64] and payload["threads"] == 1 and payload["format_version"] == 1
    assert StepCurve.load(path) == curve
    assert [p.name for p in path.parent.iterdir()] == ["step_curve.json"]  # no temp file left behind
    png = tmp_path / "curve.png"
    curve.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- exact traces


def test_review_two_request_trace():
    survival = torch.tensor([[0.9, 0.9 * 0.5], [0.6, 0.6 * 0.6]])
    curve = StepCurve([2, 3, 4, 5, 6], [1.0, 0.8, 0.55, 0.5, 0.3])
    verify_len = schedule_greedy(survival, curve)
    assert verify_len.dtype == torch.long
    assert verify_len.tolist() == [1, 0]
    assert _theta(survival, verify_len, curve) == pytest.approx(2.32)
    # The whole Θ(B) table is unimodal here, so the unconstrained optimum is the same.
    assert schedule_lagged(survival, curve, survival).tolist() == [1, 0]
    assert _brute_force_best(survival, curve) == pytest.approx(2.32)


def test_three_request_trace_with_ties():
    # R = 3, γ = 2, survival a:          sorted (a desc, then lower j, then lower r):
    #   r1: (0.8, 0.4)                     1. (1,1) 0.8   B=4  τ=3.8  Θ=3.8·0.90=3.42 > 3.00  admit
    #   r2: (0.8, 0.4)                     2. (2,1) 0.8   B=5  τ=4.6  Θ=4.6·0.80=3.68 > 3.42  admit
    #   r3: (0.4, 0.2)                     3. (3,1) 0.4   B=6  τ=5.0  Θ=5.0·0.75=3.75 > 3.68  admit  (j=1 before j=2)
    # SPS(3..9) = 1.0, 0.9, 0.8, 0.75,     4. (1,2) 0.4   B=7  τ=5.4  Θ=5.4·0.70=3.78 > 3.75  admit  (r=1 before r=2)
    #             0.7, 0.6, 0.55           5. (2,2) 0.4   B=8  τ=5.8  Θ=5.8·0.60=3.48 ≤ 3.78  stop
    # Start: B=3, τ=3, Θ=3.0. Result ℓ = (2, 1, 1), Θ_best = 3.78. Breaking the 0.4 ties by request first would
    # admit (1,2), (2,2) before (3,1) and give ℓ = (2, 2, 0): "lower j, then lower r" is what makes it (2, 1, 1).
    survival = torch.tensor([[0.8, 0.4], [0.8, 0.4], [0.4, 0.2]])
    curve = StepCurve([3, 4, 5, 6, 7, 8, 9], [1.0, 0.9, 0.8, 0.75, 0.7, 0.6, 0.55])
    verify_len = schedule_greedy(survival, curve)
    assert verify_len.tolist() == [2, 1, 1]
    assert _theta(survival, verify_len, curve) == pytest.approx(3.78)
    assert verify_len.tolist() == _algorithm1_loop(survival, curve)


def test_zero_survival_is_never_admitted():
    survival = torch.tensor([[0.9, 0.0], [0.0, 0.0]])
    flat = StepCurve([1, 100], [1.0, 1.0])
    jagged = StepCurve([2, 3, 4], [1.0, 0.9, 5.0])  # a bump that would reward admitting a zero candidate
    assert schedule_greedy(survival, flat).tolist() == [1, 0]
    assert schedule_greedy(survival, jagged).tolist() == [1, 0]
    assert schedule_lagged(survival, jagged, torch.ones(2, 2)).tolist() == [1, 0]
    assert schedule_threshold(survival, threshold=0.0).tolist() == [1, 0]


def test_empty_and_degenerate_shapes():
    curve = StepCurve([1, 8], [1.0, 0.5])
    assert schedule_greedy(torch.zeros(0, 4), curve).shape == (0,)
    assert schedule_greedy(torch.zeros(3, 0), curve).tolist() == [0, 0, 0]
    assert schedule_lagged(torch.zeros(0, 4), curve, torch.ones(2, 4)).shape == (0,)
    with pytest.raises(ValueError, match="non-increasing"):
        schedule_greedy(torch.tensor([[0.2, 0.9]]), curve)
    with pytest.raises(ValueError, match="capacity_survival"):
        schedule_lagged(torch.ones(2, 3), curve, torch.ones(2, 4))


# ---------------------------------------------------------------- properties


@FEW
@given(survival=survivals(), curve=step_curves(), policy=st.sampled_from(["greedy", "lagged"]))
def test_bounds_and_top_m_prefix(survival, curve, policy):
    verify_len = get_policy(policy).schedule(survival, curve, capacity_survival=survival)
    assert verify_len.dtype == torch.long and verify_len.shape == (survival.shape[0],)
    assert bool(((verify_len >= 0) & (verify_len <= survival.shape[1])).all())
    m = int(verify_len.sum())
    assert _admitted_set(verify_len) == set(_sorted_candidates(survival)[:m])


@FEW
@given(survival=survivals(), curve=step_curves())
def test_greedy_matches_the_literal_loop_and_never_loses(survival, curve):
    verify_len = schedule_greedy(survival, curve)
    assert verify_len.tolist() == _algorithm1_loop(survival, curve)
    zeros = torch.zeros_like(verify_len)
    assert _theta(survival, verify_len, curve) >= _theta(survival, zeros, curve) - 1e-12


@FEW
@given(survival=survivals(max_rows=3, max_gamma=3), curve=step_curves())
def test_lagged_with_current_capacity_is_the_unconstrained_optimum(survival, curve):
    verify_len = schedule_lagged(survival, curve, capacity_survival=survival)
    best = _brute_force_best(survival, curve)
    assert _theta(survival, verify_len, curve) == pytest.approx(best, rel=1e-9)
    assert _theta(survival, verify_len, curve) >= _theta(survival, schedule_greedy(survival, curve), curve) - 1e-12


@FEW
@given(survival=survivals())
def test_flat_curve_admits_every_positive_candidate(survival):
    flat = StepCurve([1, 1000], [3.0, 3.0])
    expected = (survival > 0).sum(dim=-1)
    assert schedule_greedy(survival, flat).tolist() == expected.tolist()
    assert schedule_lagged(survival, flat, survival).tolist() == expected.tolist()


@FEW
@given(survival=survivals())
def test_steep_curve_admits_nothing(survival):
    steep = StepCurve(list(range(1, 41)), [1.0 / b**2 for b in range(1, 41)])
    assert schedule_greedy(survival, steep).tolist() == [0] * survival.shape[0]
    assert schedule_lagged(survival, steep, survival).tolist() == [0] * survival.shape[0]


@FEW
@given(survival=survivals(max_rows=6, distinct=True), curve=step_curves(), seed=st.integers(0, 1000))
def test_batch_permutation_equivariance(survival, curve, seed):
    perm = torch.randperm(survival.shape[0], generator=torch.Generator().manual_seed(seed))
    for name in ("greedy", "lagged", "threshold", "fixed"):
        policy = get_policy(name)
        base = policy.schedule(survival, curve, capacity_survival=survival)
        permuted = policy.schedule(survival[perm], curve, capacity_survival=survival[perm])
        assert permuted.tolist() == base[perm].tolist(), name


# ---------------------------------------------------------------- lagged capacity


def test_lagged_escapes_a_jagged_cliff():
    # SPS dips at B=3 then recovers: greedy's first step sees Θ fall (2.9·0.6 = 1.74 < 2.0) and stops at ℓ = 0,
    # while the full path peaks at B = 6: sorted 0.9, 0.85, 0.8, 0.75 → τ = 5.3, Θ = 5.3·0.8 = 4.24.
    survival = torch.tensor([[0.9, 0.8, 0.7], [0.85, 0.75, 0.6]])
    curve = StepCurve([2, 3, 4, 5, 6, 7, 8], [1.0, 0.6, 0.9, 0.85, 0.8, 0.7, 0.6])
    greedy = schedule_greedy(survival, curve)
    lagged = schedule_lagged(survival, curve, capacity_survival=survival)
    assert greedy.tolist() == [0, 0]
    assert lagged.tolist() == [2, 2]
    assert _theta(survival, lagged, curve) == pytest.approx(4.24)
    assert _theta(survival, lagged, curve) == pytest.approx(_brute_force_best(survival, curve))
    # Last round's survivals (slightly different) give the same capacity; current values pick the members.
    previous = torch.tensor([[0.88, 0.8, 0.72], [0.86, 0.74, 0.62]])
    assert int(capacity_from_survival(previous, 2, curve)) == 4
    assert schedule_lagged(survival, curve, capacity_survival=previous).tolist() == [2, 2]


def test_lagged_capacity_with_a_different_number_of_rows():
    curve = StepCurve(list(range(1, 41)), [1.0 / (1 + 0.08 * b) for b in range(1, 41)])
    survival = torch.cumprod(torch.full((4, 3), 0.8), dim=-1)
    one_row = survival[:1]
    assert schedule_lagged(survival, curve, one_row).tolist() == schedule_lagged(survival, curve, survival).tolist()
    doubled = survival.repeat(2, 1)
    assert int(capacity_from_survival(doubled, 4, curve)) == int(capacity_from_survival(survival, 4, curve))
    # K is clipped to the current positive candidates.
    dead = torch.zeros(4, 3)
    assert schedule_lagged(dead, curve, survival).tolist() == [0, 0, 0, 0]


def test_lagged_without_capacity_falls_back_to_greedy():
    survival = torch.tensor([[0.9, 0.45], [0.6, 0.36]])
    curve = StepCurve([2, 3, 4, 5, 6], [1.0, 0.8, 0.55, 0.5, 0.3])
    assert schedule_lagged(survival, curve, None).tolist() == schedule_greedy(survival, curve).tolist()


# ---------------------------------------------------------------- baselines and registry


def test_baselines():
    survival = torch.tensor([[0.9, 0.6, 0.3], [0.4, 0.2, 0.1]])
    assert schedule_fixed(survival).tolist() == [3, 3]
    assert schedule_fixed(survival, length=1).tolist() == [1, 1]
    assert schedule_fixed(survival, length=9).tolist() == [3, 3]
    assert schedule_threshold(survival).tolist() == [2, 0]
    assert schedule_threshold(survival, threshold=0.3).tolist() == [3, 1]


def test_policy_registry():
    curve = StepCurve([2, 3, 4, 5, 6], [1.0, 0.8, 0.55, 0.5, 0.3])
    survival = torch.tensor([[0.9, 0.45], [0.6, 0.36]])
    for name in ("greedy", "lagged", "fixed", "threshold"):
        policy = get_policy(name)
        assert issubclass(policy, BasePolicy)
        assert policy.schedule(survival, curve).shape == (2,)
    assert get_policy(" Greedy ") is get_policy("greedy")
    assert get_policy("fixed").schedule(survival, length=1).tolist() == [1, 1]
    assert get_policy("threshold").schedule(survival, threshold=0.55).tolist() == [1, 1]
    with pytest.raises(ValueError, match="Unknown policy 'oracle'; choose one of"):
        get_policy("oracle")
    with pytest.raises(ValueError, match="step_curve"):
        get_policy("greedy").schedule(survival)


# ---------------------------------------------------------------- Appendix A (non-anticipation)

TOKEN_A = 0


def _first_token_rate_of_a(choose_len, rows: int = 200_000, seed: int = 0) -> tuple[float, float]:
    """Monte Carlo of the paper's Appendix A (docs/scheduling.md, section 3) through the real `verify_sampling`.

    R independent single-request rounds, V = {A, B}, γ = 2. p_draft = (0.5, 0.5) at both positions; p_target =
    (0.7, 0.3) at position 1 and (0.6, 0.4) at position 2 and for the bonus. c_1 = 0.8 and c_2 = 0.9 if x_1 = A
    else 0 (the Markov-dependent confidence), so survival = (0.8, 0.72) or (0.8, 0). `choose_len` maps one
    request's `[1, 2]` survival to its ℓ; it is evaluated once per distinct survival row (R = 1 each, exact).
    Returns (P̂(first emitted token = A), its standard error).
    """
    gen = torch.Generator().manual_seed(seed)
    draft_probs = torch.full((rows, 2, 2), 0.5, dtype=torch.float64)
    draft_ids = torch.multinomial(draft_probs.reshape(-1, 2), 1, generator=gen).reshape(rows, 2)
    target_probs = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.6, 0.4]], dtype=torch.float64).expand(rows, 3, 2)
    c2 = torch.where(draft_ids[:, 0] == TOKEN_A, 0.9, 0.0).to(torch.float64)
    survival = torch.stack([torch.full_like(c2, 0.8), 0.8 * c2], dim=-1)
    distinct, inverse = torch.unique(survival, dim=0, return_inverse=True)
    lengths = torch.stack([choose_len(row[None])[0] for row in distinct])  # at most 2 distinct rows
    verify_len = lengths[inverse]
    result = verify_sampling(draft_ids, draft_probs, target_probs.contiguous(), verify_len, generator=gen)
    first = torch.where(result.num_accepted >= 1, draft_ids[:, 0], result.next_token)
    rate = float((first == TOKEN_A).double().mean())
    return rate, math.sqrt(rate * (1 - rate) / rows)


APPENDIX_CURVE = StepCurve([1, 2, 3], [1.0, 0.5, 0.45])


def _anticipating(survival: torch.Tensor) -> torch.Tensor:
    """THE WRONG RULE: unconstrained argmax of Θ over the *current* survivals (looks at c_2, which depends on x_1)."""
    rows, gamma = survival.shape
    options = itertools.product(range(gamma + 1), repeat=rows)
    return torch.tensor(max(options, key=lambda ls: _theta(survival, torch.tensor(ls), APPENDIX_CURVE)))


def test_appendix_a_anticipating_scheduler_is_biased():
    assert _anticipating(torch.tensor([[0.8, 0.72]])).tolist() == [2]  # Θ_2 = 2.52·0.45 = 1.134 > 1.0
    assert _anticipating(torch.tensor([[0.8, 0.0]])).tolist() == [0]  # Θ_2 = 0.81 < Θ_0 = 1.0
    rate, sigma = _first_token_rate_of_a(_anticipating)
    assert abs(rate - 0.85) < 4 * sigma, rate  # 0.5·1 + 0.5·0.7: not the target's 0.7


@pytest.mark.parametrize(
    "capacity",
    [torch.tensor([[0.8, 0.72]]), torch.tensor([[0.8, 0.0]]), torch.tensor([[0.3, 0.1]])],
    ids=["last-round-A", "last-round-B", "low"],
)
def test_appendix_a_lagged_is_lossless(capacity):
    rate, sigma = _first_token_rate_of_a(lambda s: schedule_lagged(s, APPENDIX_CURVE, capacity_survival=capacity))
    assert abs(rate - 0.7) < 4 * sigma, rate


def test_appendix_a_greedy_is_lossless():
    assert schedule_greedy(torch.tensor([[0.8, 0.72]]), APPENDIX_CURVE).tolist() == [0]  # Θ_1 = 0.9 < 1.0: stop
    rate, sigma = _first_token_rate_of_a(lambda s: schedule_greedy(s, APPENDIX_CURVE))
    assert abs(rate - 0.7) < 4 * sigma, rate
