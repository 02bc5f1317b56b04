"""Tests for hf_dspark.ops.calibration: ECE, ROC-AUC, sequential temperature scaling, reports and diagrams."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_dspark.ops.calibration import (
    CalibrationReport,
    conditional_acceptance,
    cumulative_survival,
    default_temperature_grid,
    evaluate_calibration,
    expected_calibration_error,
    fit_sts,
    reliability_diagram,
    roc_auc,
)

FEW = settings(max_examples=30, deadline=None)
GRID = default_temperature_grid()


def _overconfident_rollouts(rows: int = 20_000, gamma: int = 3, scale: float | list[float] = 3.0, seed: int = 0):
    """True conditional acceptance q_k; realised prefix survival = ∏_{i≤k} Bernoulli(q_i); logits = scale·logit(q)."""
    gen = torch.Generator().manual_seed(seed)
    true_logit = torch.randn(rows, gamma, generator=gen, dtype=torch.float64) * 1.2 + 1.0
    accepted = torch.rand(rows, gamma, generator=gen, dtype=torch.float64) < torch.sigmoid(true_logit)
    survived = torch.cumprod(accepted.to(torch.float64), dim=-1)
    return torch.as_tensor(scale, dtype=torch.float64) * true_logit, survived


def test_ece_of_perfect_predictions_is_zero():
    pred = torch.rand(5000, generator=torch.Generator().manual_seed(1))
    assert expected_calibration_error(pred, pred) == pytest.approx(0.0, abs=1e-12)  # soft labels
    labels = torch.rand(200_000, generator=torch.Generator().manual_seed(2)) < pred.repeat(40)
    assert expected_calibration_error(pred.repeat(40), labels) < 0.01  # binary labels, sampling noise only


def test_ece_by_hand():
    # Two bins used (n_bins=2): [0.2, 0.4] with labels [0, 1] -> |0.3 - 0.5| · 2/4; [0.9, 0.9] with [1, 1] -> 0.1·2/4.
    pred = torch.tensor([0.2, 0.4, 0.9, 0.9])
    label = torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert expected_calibration_error(pred, label, n_bins=2) == pytest.approx(0.2 * 0.5 + 0.1 * 0.5)
    assert expected_calibration_error(torch.tensor([1.0]), torch.tensor([0.0])) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        expected_calibration_error(torch.tensor([]), torch.tensor([]))


def _pairwise_auc(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@FEW
@given(data=st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=25))
def test_roc_auc_matches_pairwise_count(data):
    scores = [s / 5 for s, _ in data]
    labels = [int(y) for _, y in data]
    auc = roc_auc(torch.tensor(scores), torch.tensor(labels))
    if 0 < sum(labels) < len(labels):
        assert auc == pytest.approx(_pairwise_auc(scores, labels))
    else:
        assert math.isnan(auc)


def test_roc_auc_rejects_soft_labels():
    with pytest.raises(ValueError, match="binary"):
        roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([0.3, 1.0]))


def test_sts_recovers_the_overconfidence_and_lowers_ece():
    logits, survived = _overconfident_rollouts()
    temps = fit_sts(logits, survived)
    assert len(temps) == 3
    assert temps[0] == pytest.approx(3.0, rel=0.25)  # position 1 is a plain 3x overconfidence
    report = evaluate_calibration(logits, survived, temps)
    for k in range(3):
        assert report.ece_after[k] < report.ece_before[k]
        assert report.ece_after[k] < 0.02
    # The order of rows within a position is untouched by T_k > 0.
    assert report.auc_before[0] == pytest.approx(report.auc_after[0])


def test_sts_preserves_order_within_each_position():
    logits, survived = _overconfident_rollouts(rows=4000, gamma=4, seed=3)
    temps = fit_sts(logits, survived)
    scaled = torch.sigmoid(logits / torch.tensor(temps, dtype=torch.float64))
    for k in range(4):
        assert torch.equal(torch.argsort(logits[:, k], stable=True), torch.argsort(scaled[:, k], stable=True))


def test_sts_is_sequential():
    # Position 1 is 3x overconfident, positions 2-3 are calibrated. Fitted in order with T_1 in place, T_2 and T_3
    # stay near 1; fitting position 2 against σ(z_1)·σ(z_2/T) (T_1 = 1) would have to distort T_2 instead.
    logits, survived = _overconfident_rollouts(rows=30_000, gamma=3, scale=[3.0, 1.0, 1.0], seed=4)
    temps = fit_sts(logits, survived)
    assert temps[0] == pytest.approx(3.0, rel=0.25)
    assert all(0.75 < t < 1.35 for t in temps[1:]), temps
    # The non-sequential alternative (T_1 left at 1 while fitting T_2) lands far from 1: the test can tell them apart.
    prefix = torch.sigmoid(logits[:, 0])
    errors = [expected_calibration_error(prefix * torch.sigmoid(logits[:, 1] / t), survived[:, 1]) for t in GRID]
    assert GRID[min(range(len(GRID)), key=errors.__getitem__)] > 1.5
    # A constant label gives an ECE tie across many T: the tie goes to the temperature closest to 1.
    assert fit_sts(torch.zeros(10, 2), torch.full((10, 2), 0.5)) == [1.0, 1.0]


def test_fit_sts_validation_and_custom_grid():
    logits, survived = _overconfident_rollouts(rows=500, gamma=2)
    assert set(fit_sts(logits, survived, grid=[0.5, 2.0, 3.0])) <= {0.5, 2.0, 3.0}
    assert 1.0 in default_temperature_grid()
    with pytest.raises(ValueError, match="block_size"):
        fit_sts(logits, survived[:, :1])
    with pytest.raises(ValueError, match="grid"):
        fit_sts(logits, survived, grid=[0.0, 1.0])
    with pytest.raises(ValueError, match="survived"):
        fit_sts(logits, survived * 2)


def test_report_round_trip_and_reliability_diagram(tmp_path):
    logits, survived = _overconfident_rollouts(rows=3000, gamma=2)
    temps = fit_sts(logits, survived)
    report = evaluate_calibration(logits, survived, temps, mode="sampling")
    report.auc_after[1] = float("nan")  # NaN must survive JSON as null
    path = tmp_path / "calibration.json"
    report.save(path)
    payload = json.loads(path.read_text())
    assert payload["temperatures"] == temps and payload["mode"] == "sampling" and payload["auc_after"][1] is None
    loaded = CalibrationReport.load(path)
    assert loaded.ece_after == report.ece_after and math.isnan(loaded.auc_after[1])

    png = tmp_path / "reliability.png"
    before, after = cumulative_survival(logits), cumulative_survival(logits, temps)
    reliability_diagram(before, after, survived, png, title="test")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_conditional_acceptance_is_the_smoothed_rate_given_the_prefix_survived():
    # 4 rounds: survived 0, 1, 2 and 3 positions of γ = 4
    survived = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    rates = conditional_acceptance(survived)
    # position k: (kept + ½) / (reached + 1); reached = 4, 3, 2, 1 rounds; kept = 3, 2, 1, 0
    assert rates == pytest.approx([3.5 / 5, 2.5 / 4, 1.5 / 3, 0.5 / 2])
    never = conditional_acceptance(torch.tensor([[0.0, 0.0, 0.0]]))  # positions 2, 3 never reached: inherit
    assert never == pytest.approx([0.25, 0.25, 0.25])
    assert all(0.0 < q < 1.0 for q in conditional_acceptance(torch.ones(3, 5)))  # never exactly 0 or 1
    with pytest.raises(ValueError, match="non-empty"):
        conditional_acceptance(torch.zeros(0, 4))


def test_reports_written_before_the_acceptance_field_still_load(tmp_path):
    report = evaluate_calibration(torch.zeros(6, 2), torch.tensor([[1.0, 0.0]] * 6), [1.0, 1.0])
    payload = report.to_dict()
    assert payload["acceptance"] == pytest.approx([6.5 / 7, 0.5 / 7])
    del payload["acceptance"]
    (tmp_path / "old.json").write_text(json.dumps(payload))
    assert CalibrationReport.load(tmp_path / "old.json").acceptance is None
