"""Measured round costs for the "auto" policy: how far real rounds are from the cost curves, learned online.

The curves the policy plans with (the target's SPS(B), the drafter's proposals per second) are profiled once, on
an idle machine, with fixed context lengths. Real rounds differ: longer caches, the drafter's queued context
update, row-subset gathers, commit callbacks, other processes on the machine. Each finished round reports its wall
time (`RoundRecord`), and the policy keeps two running estimates:

    f_plain = measured ÷ predicted seconds of plain-decoding rounds,
    f_rel   = measured ÷ (f_plain · predicted) seconds of drafting rounds (drafter + verification),

each as log f ← log f + w_n · (clip(log ratio) − log f), w_n = max(w, 1 / (n + n₀ + 1)): an average over the
first rounds, an exponential moving average with weight w after; n₀ pseudo-rounds at f = 1 keep one slow round
(e.g. a cold first proposal) from deciding alone. The planner multiplies plain rounds' predicted cost by f_plain and
drafting rounds' by f_plain · f_rel, so only f_rel moves its decision, and a machine that is uniformly slower than
the curves (f_plain > 1, learned in a few rounds) does not make drafting look cheaper or dearer than it is.

Lossless: the correction is a function of earlier rounds' wall times, never of the current round's drafts or the
target's outputs, so the decision stays a stopping rule measurable with respect to the past (Appendix A).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class CostCorrection:
    """Measured ÷ predicted cost of plain-decoding rounds (f_plain) and of drafting rounds relative to them (f_rel).

    Args:
        weight: w, the moving average's weight once more than 1 / w rounds were seen.
        prior_rounds: n₀, pseudo-rounds at f = 1 (the curves' own prediction).
        limit: each observation's ratio is clipped to [1 / limit, limit].
    """

    weight: float = 0.1
    prior_rounds: int = 2
    limit: float = 4.0
    log_plain: float = 0.0
    log_relative: float = 0.0
    plain_rounds: int = 0
    drafting_rounds: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.weight <= 1.0 or self.prior_rounds < 0 or self.limit <= 1.0:
            raise ValueError("CostCorrection needs 0 < weight <= 1, prior_rounds >= 0 and limit > 1.")

    def observe(self, drafting: bool, measured_seconds: float, predicted_seconds: float) -> None:
        """One finished round: its wall time and what the curves predicted for it (both > 0; else ignored)."""
        if not (measured_seconds > 0.0 and predicted_seconds > 0.0 and math.isfinite(measured_seconds)):
            return
        bound = math.log(self.limit)
        value = min(max(math.log(measured_seconds / predicted_seconds), -bound), bound)
        if drafting:
            value = min(max(value - self.log_plain, -bound), bound)
            self.log_relative = running_log_mean(self.log_relative, value, self.drafting_rounds, self)
            self.drafting_rounds += 1
        else:
            self.log_plain = running_log_mean(self.log_plain, value, self.plain_rounds, self)
            self.plain_rounds += 1

    @property
    def plain(self) -> float:
        """f_plain: measured ÷ predicted seconds of plain-decoding rounds."""
        return math.exp(self.log_plain)

    @property
    def drafting(self) -> float:
        """f_plain · f_rel: measured ÷ predicted seconds of drafting rounds (drafter + verification)."""
        return math.exp(self.log_plain + self.log_relative)

    def key(self, resolution: float = 0.05) -> int:
        """f_rel rounded to `resolution` in log space, what cached decisions key on (f_plain scales plain and
        drafting rounds alike, so it cancels out of every comparison the planner makes)."""
        return round(self.log_relative / resolution)


def running_log_mean(current: float, value: float, seen: int, correction: CostCorrection) -> float:
    """log f ← log f + w_n (value − log f), w_n = max(w, 1 / (n + n₀ + 1)): the mean while n is small, then an
    exponential moving average. current / value: log ratios; seen: n, observations before this one."""
    step = max(correction.weight, 1.0 / (seen + correction.prior_rounds + 1))
    return current + step * (value - current)
