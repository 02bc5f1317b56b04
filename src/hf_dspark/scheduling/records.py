"""Record types shared by the scheduling policies and the generation loop (no imports from either)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ScheduleRecord:
    """What a policy expected from its last decision (None when the drafter has no confidence head).

    expected_tokens: τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}); expected_throughput: Θ̂ = τ̂·SPS(B) (None without a curve).
    """

    expected_tokens: float | None = None
    expected_throughput: float | None = None


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
