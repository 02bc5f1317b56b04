"""Expected calibration error (ECE) of a drafter's confidence against realised acceptance."""

import datasets
import evaluate
import torch

from hf_dspark.ops.calibration import expected_calibration_error

_DESCRIPTION = """
ECE = Σ_b (n_b / N) · |mean confidence − mean outcome| over equal-width bins of the confidence on [0, 1]: how far a
confidence (e.g. the drafter's prefix survival a_k) is from the frequency of the event it predicts (the draft
prefix up to k accepted). One example per prediction.
"""

_KWARGS_DESCRIPTION = """
Args:
    confidence: predicted probabilities in [0, 1].
    outcome: what happened, 1 or 0 (or a soft label in [0, 1]).
    n_bins: equal-width bins (default 15).
Returns:
    ece: the expected calibration error.
    mean_confidence, mean_outcome: the two averages (their gap is the calibration-in-the-large error).
Examples:
    >>> metric = evaluate.load(metric_path("calibration_error"))
    >>> metric.compute(confidence=[0.9, 0.9], outcome=[1, 0], n_bins=10)["ece"]
    0.4
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CalibrationError(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"confidence": datasets.Value("float64"),
                                        "outcome": datasets.Value("float64")}),
        )

    def _compute(self, confidence, outcome, n_bins=15):
        count = len(confidence)
        pred, label = torch.tensor(confidence, dtype=torch.float64), torch.tensor(outcome, dtype=torch.float64)
        return {"ece": expected_calibration_error(pred, label, int(n_bins)),
                "mean_confidence": sum(confidence) / count, "mean_outcome": sum(outcome) / count}
