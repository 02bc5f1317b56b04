"""Record types shared by the scheduling policies and the generation loop (no imports from either; `expectation`,
the τ̂ function, is a leaf)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .expectation import expected_tokens_per_round


class ScheduleRecord:
    """What a policy expected from its last decision (None when the drafter has no confidence head).

    expected_tokens: τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}); expected_throughput: Θ̂ = τ̂·SPS(B) (None without a curve).

    A record is built with its values, or pending (`ScheduleRecord.pending`): it keeps the round's confidences
    `[S, γ]` on their device and its host ℓ, and computes τ̂ when first read. A decoding loop keeps its rounds'
    records pending, so no round pays for τ̂ or reads it from the device; `resolve_schedules` computes many in one
    pass and one device read.
    """

    __slots__ = ("_confidence", "_step_curve", "_throughput", "_tokens", "_verify_len")

    def __init__(self, expected_tokens: float | None = None, expected_throughput: float | None = None) -> None:
        self._tokens, self._throughput = expected_tokens, expected_throughput
        self._confidence: torch.Tensor | None = None
        self._verify_len: list[int] = []
        self._step_curve: Any = None

    @classmethod
    def pending(cls, confidence: torch.Tensor, verify_len: list[int], step_curve: Any = None) -> ScheduleRecord:
        """τ̂ (and Θ̂ with `step_curve`) of rows with confidences `[S, γ]` verifying `verify_len` `[S]` (host ints),
        computed when first read."""
        record = cls()
        record._confidence, record._verify_len, record._step_curve = confidence, list(verify_len), step_curve
        return record

    @property
    def is_pending(self) -> bool:
        return self._confidence is not None

    @property
    def expected_tokens(self) -> float | None:
        if self._confidence is not None:
            resolve_schedules([self])
        return self._tokens

    @property
    def expected_throughput(self) -> float | None:
        if self._confidence is not None:
            resolve_schedules([self])
        return self._throughput

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScheduleRecord):
            return NotImplemented
        return (self.expected_tokens, self.expected_throughput) == (other.expected_tokens, other.expected_throughput)

    def __repr__(self) -> str:
        if self._confidence is not None:
            return f"ScheduleRecord(pending, rows={len(self._verify_len)})"
        return f"ScheduleRecord(expected_tokens={self._tokens!r}, expected_throughput={self._throughput!r})"


def resolve_schedules(records: list[ScheduleRecord]) -> None:
    """Compute the τ̂ / Θ̂ of every pending record in `records` at once (`expectation.expected_tokens_per_round`): one
    concatenation per device and one read, however many rounds."""
    pending = [record for record in records if record._confidence is not None]
    by_device: dict[torch.device, list[ScheduleRecord]] = {}
    for record in pending:
        by_device.setdefault(record._confidence.device, []).append(record)
    for group in by_device.values():
        confidence = torch.cat([record._confidence for record in group])
        verify_len = [length for record in group for length in record._verify_len]
        rows = [len(record._verify_len) for record in group]
        for record, tau in zip(group, expected_tokens_per_round(confidence, verify_len, rows)):
            record._tokens = tau
            curve = record._step_curve
            if curve is not None:
                batch_tokens = len(record._verify_len) + sum(record._verify_len)
                record._throughput = tau * float(curve.steps_per_second_at(batch_tokens))
            record._confidence, record._verify_len, record._step_curve = None, [], None


@dataclass
class DraftPlan:
    """Rows that draft this round (`rows`, indices into the active rows; None = all) and their planned uniform
    verification length (`length`; None = the policy decides from the proposal). `probe`: a refresh round;
    `batch_rows`: active rows in the round (None: unknown), whose padding the verification pays for; `forecast`:
    the drafting rows' conditional acceptance `[S, γ]` from earlier rounds (the sunk-cost stop's look-ahead);
    `priced_rows`: the rows of the drafter's cost curve the drafting rows pay for (None: one each; a hybrid
    drafter's lookup rows pay none)."""

    rows: torch.Tensor | None = None
    length: int | None = None
    probe: bool = False
    batch_rows: int | None = None
    forecast: torch.Tensor | None = None
    priced_rows: int | None = None

    @property
    def drafts(self) -> bool:
        return self.rows is None or self.rows.numel() > 0


@dataclass
class PolicySettings:
    """Everything a policy is built from; resolved before construction (no profiling or look-up in a policy).

    Args:
        block_size: γ, the drafter's draft tokens per round.
        verify_len: ℓ of `"fixed"` (None: γ).
        threshold: survival threshold of `"threshold"`.
        step_curve: SPS(B) of the target (a `StepCurve`), for the load-aware policies.
        draft_curve: the drafter's proposals per second against rows (a `StepCurve`), for `"auto"`.
        greedy: the decoding mode of the requests (`not do_sample`).
        measured_costs: `"auto"` corrects its curves by the wall times of earlier rounds.
        acceptance_prior: γ conditional acceptance rates `"auto"` starts from (None: 0.5 per position, weakly held).
        memory: the caller-owned cross-call memory of `"auto"` (`PolicyMemory`; None: this call only).
    """

    block_size: int = 4
    verify_len: int | None = None
    threshold: float = 0.5
    step_curve: Any = None
    draft_curve: Any = None
    greedy: bool = True
    measured_costs: bool = True
    acceptance_prior: list[float] | None = None
    memory: Any = None
