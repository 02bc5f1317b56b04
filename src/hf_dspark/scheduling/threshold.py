"""Baseline `"threshold"`: a static prefix-survival threshold per request (ignores load)."""

from __future__ import annotations

import torch

from ..profiling.step_curve import StepCurve, check_survival
from .base import BasePolicy, require_survival


def schedule_threshold(
    survival: torch.Tensor, step_curve: StepCurve | None = None, threshold: float = 0.5
) -> torch.Tensor:
    """Baseline: static confidence threshold, ℓ_r = #leading positions with a_{r,j} ≥ threshold (and a_{r,j} > 0).

    survival: `[R, γ]`; returns verify_len `LongTensor[R]`. Per request, ignores load (step_curve unused).
    """
    survival = check_survival(survival)
    keep = (survival >= threshold) & (survival > 0)
    return keep.to(torch.long).cumprod(dim=-1).sum(dim=-1)


class ThresholdPolicy(BasePolicy):
    """`"threshold"`: ℓ_r = leading positions with a_{r,j} ≥ `threshold`."""

    needs_confidence = True
    rule = staticmethod(schedule_threshold)

    def lengths(self, survival, rows, device):
        return schedule_threshold(require_survival(self, survival, "threshold"), threshold=self.settings.threshold)
