"""Hand-made examples for the pure bookkeeping of `hf-dspark eval` (rounds are [ℓ, m, c])."""

import pytest
import torch

from hf_dspark.eval.acceptance_metrics import (
    acceptance_rate,
    accepted_length,
    conditional_acceptance,
    leading_matches,
    macro_mean,
    survival_from_logits,
    survival_labels,
    threshold_sweep,
)

ROUNDS = [
    [4, 4, 5],  # all four accepted + bonus
    [4, 0, 1],  # rejected at position 1
    [4, 2, 3],  # rejected at position 3
    [2, 2, 3],  # ℓ capped at 2 by the length budget, both accepted
    [4, 3, 3],  # censored: EOS was the accepted draft at position 3; position 4 unknown
]


def test_leading_matches_stops_at_first_difference():
    assert leading_matches([5, 6, 7], [5, 6, 9, 7]) == 2
    assert leading_matches([5, 6], [5]) == 1  # only as many as were committed
    assert leading_matches([], [1]) == 0


def test_tau_and_acceptance_rate():
    assert accepted_length(ROUNDS) == pytest.approx((5 + 1 + 3 + 3 + 3) / 5)
    assert acceptance_rate(ROUNDS) == pytest.approx((4 + 0 + 2 + 2 + 3) / (4 + 4 + 4 + 2 + 4))
    assert accepted_length([]) is None and acceptance_rate([[0, 0, 1]]) is None


def test_position_wise_conditional_acceptance():
    probs, reached = conditional_acceptance(ROUNDS, 4)
    assert reached == [5, 4, 3, 1]
    assert probs == pytest.approx([4 / 5, 4 / 4, 2 / 3, 1 / 1])
    probs, reached = conditional_acceptance([[2, 0, 1]], 3)
    assert reached == [1, 0, 0] and probs[0] == 0.0 and probs[1:] == [None, None]


def test_threshold_sweep_replays_a_static_threshold():
    rounds = [[3, 2, 3], [3, 0, 1], [2, 2, 3]]
    survival = torch.tensor([[0.9, 0.6, 0.3], [0.4, 0.2, 0.1], [0.95, 0.9, 0.8]], dtype=torch.float64)
    out = {p["threshold"]: p for p in threshold_sweep(rounds, survival, [0.0, 0.5, 0.95, 0.99])}
    assert out[0.0]["mean_verified"] == pytest.approx(8 / 3)
    assert out[0.0]["acceptance_rate"] == pytest.approx(4 / 8)
    assert out[0.0]["tau"] == pytest.approx(7 / 3)
    assert out[0.5]["mean_verified"] == pytest.approx(4 / 3)  # ℓ_t = 2, 0, 2
    assert out[0.5]["acceptance_rate"] == pytest.approx(1.0)
    assert out[0.95]["mean_verified"] == pytest.approx(1 / 3) and out[0.95]["tau"] == pytest.approx(4 / 3)
    assert out[0.99]["acceptance_rate"] is None and out[0.99]["tau"] == pytest.approx(1.0)


def test_threshold_sweep_counts_leading_positions_only():
    out = threshold_sweep([[3, 3, 4]], torch.tensor([[0.9, 0.3, 0.6]]), [0.5])
    assert out[0]["mean_verified"] == 1.0


def test_survival_labels_keep_complete_rounds():
    complete, survived = survival_labels(ROUNDS, 4)
    assert complete.tolist() == [True, True, True, False, False]
    assert survived[2].tolist() == [1.0, 1.0, 0.0, 0.0]


def test_survival_from_logits_with_temperatures():
    logits = torch.zeros(1, 3)
    assert survival_from_logits(logits).tolist() == [[0.5, 0.25, 0.125]]
    assert survival_from_logits(torch.tensor([[2.0, 2.0]]), [2.0, 1.0])[0, 0].item() == pytest.approx(
        torch.sigmoid(torch.tensor(1.0)).item())


def test_macro_mean_skips_missing():
    assert macro_mean([1.0, None, 3.0, float("nan")]) == 2.0 and macro_mean([None]) is None
