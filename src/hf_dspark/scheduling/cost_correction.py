"""Measured corrections for the "auto" policy: how far real rounds are from the cost curves (and drafts from their
forecast), learned online.

The curves the policy plans with (the target's SPS(B), the drafter's proposals per second) are profiled once, on
a quiet machine, with fixed context lengths. Real rounds differ: longer caches, the drafter's queued context
update, row-subset gathers, commit callbacks, other processes on the machine. Each finished round reports its wall
time (`RoundRecord`), and the policy keeps two running estimates:

    f_plain = measured ÷ predicted seconds of plain-decoding rounds,
    f_rel   = measured ÷ (f_plain · predicted) seconds of drafting rounds (drafter + verification),

each as log f ← log f + w_n · (clip(log ratio) − log f), w_n = max(w, 1 / (n + n₀ + 1)): an average over the
first rounds, an exponential moving average with weight w after; n₀ pseudo-rounds at f = 1 keep one slow round
(e.g. a cold first proposal) from deciding alone. The planner multiplies plain rounds' predicted cost by f_plain and
drafting rounds' by f_plain · f_rel, so only f_rel moves its decision, and a machine that is uniformly slower than
the curves (f_plain > 1, learned in a few rounds) does not make drafting look cheaper or dearer than it is.

Two guards keep one bad measurement from switching drafting off for good. The first drafting round a memory sees
is not measured (`cold_rounds`: the drafter's first `propose` in a process pays one-off kernel and buffer setup,
measured at 1.5-3× a warm round on CPU). And f_rel can only be re-measured by drafting rounds, which a high f_rel
prevents, so after `idle_grace` plain rounds in a row it drifts back towards 1 (log f_rel × `idle_relax` per
round): drafting is tried again, and if it really is dearer the new rounds raise f_rel again.

`AcceptanceCorrection` does the same for the other side of the decision: how many drafts the planned rounds'
lagged estimates forecast against how many verification accepted (the chosen rows' estimates run high).

Lossless: each correction is a function of earlier rounds' wall times or acceptances, never of the current round's
drafts or the target's outputs, so the decision stays a stopping rule measurable with respect to the past
(Appendix A).
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
        cold_rounds: the first drafting rounds, not measured (one-off setup).
        idle_grace / idle_relax: after `idle_grace` plain rounds in a row, each further one multiplies log f_rel by
            `idle_relax`.
    """

    weight: float = 0.1
    prior_rounds: int = 2
    limit: float = 4.0
    cold_rounds: int = 1
    idle_grace: int = 8
    idle_relax: float = 0.97
    log_plain: float = 0.0
    log_relative: float = 0.0
    plain_rounds: int = 0
    drafting_rounds: int = 0
    plain_streak: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.weight <= 1.0 or self.prior_rounds < 0 or self.limit <= 1.0:
            raise ValueError("CostCorrection needs 0 < weight <= 1, prior_rounds >= 0 and limit > 1.")
        if self.cold_rounds < 0 or self.idle_grace < 0 or not 0.0 <= self.idle_relax <= 1.0:
            raise ValueError("CostCorrection needs cold_rounds >= 0, idle_grace >= 0 and 0 <= idle_relax <= 1.")

    def observe(self, drafting: bool, measured_seconds: float, predicted_seconds: float) -> None:
        """One finished round: its wall time and what the curves predicted for it (both > 0; else ignored)."""
        if not (measured_seconds > 0.0 and predicted_seconds > 0.0 and math.isfinite(measured_seconds)):
            return
        bound = math.log(self.limit)
        value = min(max(math.log(measured_seconds / predicted_seconds), -bound), bound)
        if drafting:
            self.plain_streak = 0
            self.drafting_rounds += 1
            if self.drafting_rounds <= self.cold_rounds:
                return
            value = min(max(value - self.log_plain, -bound), bound)
            measured = self.drafting_rounds - 1 - self.cold_rounds
            self.log_relative = running_log_mean(self.log_relative, value, measured, self)
        else:
            self.log_plain = running_log_mean(self.log_plain, value, self.plain_rounds, self)
            self.plain_rounds += 1
            self.plain_streak += 1
            if self.plain_streak > self.idle_grace:
                self.log_relative *= self.idle_relax

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


@dataclass
class AcceptanceCorrection:
    """Realised ÷ forecast accepted drafts of the rounds the "auto" policy chose to draft: f_acc ≤ 1, learned online.

    A round drafts the rows whose lagged estimates promise the most, so among many rows the chosen ones' estimates
    run high on average (a winner's curse, strongest at high load where the margin of drafting over plain decoding
    is thinnest). Each planned drafting round (not a probe, which is optimistic on purpose) reports the drafts its
    plan's estimates forecast for the ℓ_r its rows verified, F = Σ_r Σ_{j≤ℓ_r} â_{r,j}, and the drafts accepted, A.
    Both are kept as decayed sums and f_acc = min(1, (A + w) / (F + w)), with w pseudo-drafts at f = 1; the planner
    scales every expected gain by f_acc. It only shrinks: estimates that run low are corrected by the per-request
    acceptance itself, which then drafts more.

    Args:
        decay: each drafting round multiplies the old sums by this (a window of ≈ 1 / (1 − decay) rounds).
        prior_drafts: w.
    """

    decay: float = 0.95
    prior_drafts: float = 8.0
    forecast: float = 0.0
    accepted: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0 or self.prior_drafts <= 0.0:
            raise ValueError("AcceptanceCorrection needs 0 <= decay < 1 and prior_drafts > 0.")

    def observe(self, forecast_drafts: float, accepted_drafts: float) -> None:
        """One planned drafting round: the drafts its estimates forecast and those verification accepted."""
        if not (forecast_drafts > 0.0 and math.isfinite(forecast_drafts)) or accepted_drafts < 0:
            return
        self.forecast = self.forecast * self.decay + forecast_drafts
        self.accepted = self.accepted * self.decay + accepted_drafts

    @property
    def factor(self) -> float:
        """f_acc ∈ (0, 1]."""
        return min(1.0, (self.accepted + self.prior_drafts) / (self.forecast + self.prior_drafts))

    def key(self, resolution: float = 0.02) -> int:
        """f_acc rounded to `resolution` in log space (what cached decisions key on)."""
        return round(math.log(self.factor) / resolution)
