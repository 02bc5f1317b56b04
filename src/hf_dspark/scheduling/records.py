"""Record types shared by the scheduling policies and the decoding loops (no imports from either; `expectation`,
the τ̂ function, is a leaf): what a policy expected (`ScheduleRecord`), what it planned (`DraftPlan`), what it is
built from (`PolicySettings`) and what a round did (`RoundRecord`, given to every `RoundObserver`). A policy
decides from these records only; the loops that fill them sit above."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

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
    """What every policy is built from; resolved before construction (no profiling or look-up in a policy). A
    policy's own settings (e.g. `"fixed"`'s ℓ) are its `options_class` (`hf_dspark.scheduling.base.PolicyOptions`).

    Args:
        block_size: γ, the drafter's draft tokens per round.
        step_curve: SPS(B) of the target (a `StepCurve`), for the load-aware policies.
        draft_curve: the drafter's proposals per second against rows (a `StepCurve`), for `"auto"`.
        greedy: the decoding mode of the requests (`not do_sample`).
        measured_costs: `"auto"` corrects its curves by the wall times of earlier rounds.
        acceptance_prior: γ conditional acceptance rates `"auto"` starts from (None: 0.5 per position, weakly held).
        memory: the caller-owned cross-call memory of `"auto"` (`PolicyMemory`; None: this call only).
    """

    block_size: int = 4
    step_curve: Any = None
    draft_curve: Any = None
    greedy: bool = True
    measured_costs: bool = True
    acceptance_prior: list[float] | None = None
    memory: Any = None


@dataclass
class RoundRecord:
    """What one decoding round did. Lists are per active row, in `rows` order.

    rows: the caller's row ids (batch index in `generate`, request id in the engine); verify_len: ℓ_r; accepted:
    drafts verification accepted; committed: tokens actually kept (EOS / budgets may cut); drafted: rows that ran
    the drafter (0: a plain-decoding round); probe: the round refreshed the "auto" policy's estimates;
    schedule: the policy's τ̂ / Θ̂; confidence_logits: `[A, γ]` raw confidence logits (logit(c_k) for drafters
    that give only calibrated c_k; NaN for rows that did not draft) or None (also when no observer wants them:
    `RoundObserver`); *_seconds: wall time of the policy's decisions, the drafter (with its queued context
    update), and the target forward with verification and commit; nodes_verified: in tree rounds, the drafts each
    row verified (its tree's nodes beyond the anchor; verify_len is then the kept tree's depth), None for chains.
    """

    rows: list[Any]
    verify_len: list[int]
    accepted: list[int]
    committed: list[int]
    drafted: int
    probe: bool = False
    schedule: ScheduleRecord = field(default_factory=ScheduleRecord)
    confidence_logits: torch.Tensor | None = None
    policy_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    nodes_verified: list[int] | None = None


class RoundObserver(Protocol):
    """Receives every round's `RoundRecord`. Optional: `wants_confidence_logits` (default True); when no observer
    wants them, records carry no `confidence_logits` (the rounds then skip converting the drafter's
    confidences)."""

    def on_round(self, record: RoundRecord) -> None: ...
