"""The `evaluate` metric modules shipped in the package compute what the library functions compute."""

import evaluate
import pytest
import torch

from hf_dspark.eval.acceptance_metrics import acceptance_rate, accepted_length, conditional_acceptance
from hf_dspark.eval.metrics import METRICS, metric_path, position_metrics, round_metrics
from hf_dspark.ops.calibration import expected_calibration_error

ROUNDS = [[4, 3, 4], [4, 0, 1], [4, 4, 5], [2, 2, 2], [4, 1, 2]]  # [ℓ, m, c]; the fourth is censored


def test_every_metric_loads_through_evaluate_load():
    for name in METRICS:
        module = evaluate.load(metric_path(name))
        assert isinstance(module, evaluate.Metric) and module.description.strip()
    with pytest.raises(ValueError, match="no shipped metric 'bleu'"):
        metric_path("bleu")


def test_round_and_position_metrics_equal_the_library_functions():
    metrics = round_metrics(ROUNDS)
    assert metrics["tau"] == accepted_length(ROUNDS) == 14 / 5
    assert metrics["tau_without_bonus"] == (3 + 0 + 4 + 2 + 1) / 5
    assert metrics["acceptance_rate"] == acceptance_rate(ROUNDS)
    probs, reached = conditional_acceptance(ROUNDS, 4)
    assert position_metrics(ROUNDS, 4) == {"conditional_acceptance": probs, "reached": reached}
    assert round_metrics([])["tau"] is None and position_metrics([], 2)["reached"] == [0, 0]


def test_calibration_error_equals_the_ops_function():
    gen = torch.Generator().manual_seed(0)
    confidence = torch.rand(500, generator=gen, dtype=torch.float64)
    outcome = (torch.rand(500, generator=gen, dtype=torch.float64) < confidence**2).double()
    result = evaluate.load(metric_path("calibration_error")).compute(confidence=confidence.tolist(),
                                                                    outcome=outcome.tolist(), n_bins=10)
    assert result["ece"] == pytest.approx(expected_calibration_error(confidence, outcome, 10), abs=1e-12)


def test_final_answer_match():
    metric = evaluate.load(metric_path("final_answer_match"))
    result = metric.compute(predictions=["… \\boxed{18}", "it is 7", "no idea"], references=["18", "8", "3"])
    assert result == {"exact_match": 1 / 3, "matches": 1, "answered": 2}
