"""Per-position conditional acceptance of speculative decoding."""

import datasets
import evaluate

from hf_dspark.eval.acceptance_metrics import conditional_acceptance

_DESCRIPTION = """
P(position k accepted | positions < k accepted) for k = 1..γ: over the rounds that reached position k (verified it,
accepted every earlier draft, and were not cut before it), the share that accepted it.
"""

_KWARGS_DESCRIPTION = """
Args:
    verify_len: drafts verified per round (ℓ).
    accepted: drafts accepted per round (m).
    committed: tokens committed per round (c).
    block_size: γ, the positions reported.
Returns:
    conditional_acceptance: one probability per position (None where no round reached it).
    reached: how many rounds reached each position.
Examples:
    >>> metric = evaluate.load(metric_path("position_acceptance"))
    >>> metric.compute(verify_len=[2, 2], accepted=[2, 0], committed=[3, 1], block_size=2)["conditional_acceptance"]
    [0.5, 1.0]
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PositionAcceptance(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"verify_len": datasets.Value("int64"), "accepted": datasets.Value("int64"),
                                        "committed": datasets.Value("int64")}),
        )

    def _compute(self, verify_len, accepted, committed, block_size):
        rounds = [list(r) for r in zip(verify_len, accepted, committed)]
        probs, reached = conditional_acceptance(rounds, int(block_size))
        return {"conditional_acceptance": probs, "reached": reached}
