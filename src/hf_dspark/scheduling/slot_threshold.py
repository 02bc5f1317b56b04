"""`"slot_threshold"`: DeepSpec's early-stop rule, a static threshold on each slot's own confidence.

`"threshold"` cuts where the running product a_{r,j} = Π_{i≤j} c_{r,i} drops below t; DeepSpec's evaluator cuts
before the first slot whose own confidence c_{r,j} drops below t. For the same t the product rule is never longer,
and usually much shorter: confidences of 0.6 each give ℓ = 4 of 4 here and ℓ = 1 under `"threshold"` at t = 0.5.
"""

from __future__ import annotations

import torch

from ..profiling.step_curve import StepCurve, check_survival
from .base import BasePolicy
from .threshold import ThresholdOptions


def slot_confidences(survival: torch.Tensor) -> torch.Tensor:
    """(S1) c_{r,j} = a_{r,j} / a_{r,j-1}, a_{r,0} = 1 (0 where a_{r,j-1} = 0).

    survival: `[R, γ]` prefix survivals a (non-increasing along j); returns the per-slot confidences c `[R, γ]`.
    """
    survival = check_survival(survival)
    previous = torch.cat([torch.ones_like(survival[:, :1]), survival[:, :-1]], dim=-1)
    safe = torch.where(previous > 0, previous, torch.ones_like(previous))
    return torch.where(previous > 0, survival / safe, torch.zeros_like(survival)).clamp(0.0, 1.0)


def schedule_slot_threshold(
    survival: torch.Tensor, step_curve: StepCurve | None = None, threshold: float = ThresholdOptions.threshold
) -> torch.Tensor:
    """(S2) ℓ_r = min{j : c_{r,j} < t} (γ when no slot falls below t; t ≤ 0 keeps all γ), c from (S1).

    survival: `[R, γ]`; returns verify_len `LongTensor[R]`. Per request, ignores load (step_curve unused).
    """
    confidences = slot_confidences(survival)
    keep = confidences >= threshold
    return keep.to(torch.long).cumprod(dim=-1).sum(dim=-1)


class SlotThresholdPolicy(BasePolicy):
    """`"slot_threshold"`: ℓ_r = slots before the first one whose own confidence c_{r,j} < `threshold` (DeepSpec)."""

    options_class = ThresholdOptions
    needs_confidence = True
    rule = staticmethod(schedule_slot_threshold)

    def lengths(self, survival, rows, device):
        return schedule_slot_threshold(survival, threshold=self.options.threshold)
