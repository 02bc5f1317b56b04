"""The padded-layout policies: uniform ℓ, Θ under R·(1 + L), causal early stop, lagged argmax, Appendix A."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_dspark.padded_scheduler import padded_throughput, schedule_padded_greedy, schedule_padded_lagged
from hf_dspark.scheduler import StepCurve, get_policy
from hf_dspark.verification import verify_sampling

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
    assert get_policy("greedy_padded").fn is schedule_padded_greedy
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
