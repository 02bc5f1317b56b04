"""τ, the accepted length of speculative decoding: tokens committed per verification round."""

import datasets
import evaluate

from hf_dspark.eval.acceptance_metrics import acceptance_rate, accepted_length, accepted_length_without_bonus

_DESCRIPTION = """
τ = Σ c / rounds: tokens committed per verification round, the correction or bonus token included (the DSpark
paper's accepted length), and τ without it: accepted drafts per round, Σ min(m, c) / rounds. Also the acceptance
rate, accepted drafts over verified drafts. One example per round: verified ℓ, accepted m, committed c.
"""

_KWARGS_DESCRIPTION = """
Args:
    verify_len: drafts verified per round (ℓ).
    accepted: drafts the verification accepted per round (m).
    committed: tokens the round committed (c = m + 1, or m when the row stopped on an accepted draft).
Returns:
    tau: mean committed tokens per round (None without rounds).
    tau_without_bonus: mean accepted drafts per round.
    acceptance_rate: accepted over verified drafts (None when nothing was verified).
    rounds: the number of rounds.
Examples:
    >>> metric = evaluate.load(metric_path("accepted_length"))
    >>> metric.compute(verify_len=[4, 4], accepted=[3, 0], committed=[4, 1])["tau"]
    2.5
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AcceptedLength(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"verify_len": datasets.Value("int64"), "accepted": datasets.Value("int64"),
                                        "committed": datasets.Value("int64")}),
        )

    def _compute(self, verify_len, accepted, committed):
        rounds = [list(r) for r in zip(verify_len, accepted, committed)]
        return {"tau": accepted_length(rounds), "tau_without_bonus": accepted_length_without_bonus(rounds),
                "acceptance_rate": acceptance_rate(rounds), "rounds": len(rounds)}
