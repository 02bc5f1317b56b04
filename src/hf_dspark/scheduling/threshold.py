"""Baseline `"threshold"`: a static prefix-survival threshold per request (ignores load)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ..profiling.step_curve import StepCurve, check_survival
from .base import BasePolicy, PolicyOptions


@dataclass(frozen=True)
class ThresholdOptions(PolicyOptions):
    """The options of `"threshold"` and `"slot_threshold"`.

    Args:
        threshold: the confidence below which drafts are cut, a number in [0, 1] (`dspark_threshold`; 0 verifies
            every draft, 1 only certain ones).
    """

    threshold: float = 0.5

    def __post_init__(self) -> None:
        value = self.threshold
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(
                f"dspark_threshold must be a number in [0, 1] (a prefix-survival probability; 0 verifies every "
                f"draft, 1 only certain ones), got {value!r}."
            )


def schedule_threshold(
    survival: torch.Tensor, step_curve: StepCurve | None = None, threshold: float = ThresholdOptions.threshold
) -> torch.Tensor:
    """Baseline: static confidence threshold, ℓ_r = #leading positions with a_{r,j} ≥ threshold (and a_{r,j} > 0).

    survival: `[R, γ]`; returns verify_len `LongTensor[R]`. Per request, ignores load (step_curve unused).
    """
    survival = check_survival(survival)
    keep = (survival >= threshold) & (survival > 0)
    return keep.to(torch.long).cumprod(dim=-1).sum(dim=-1)


class ThresholdPolicy(BasePolicy):
    """`"threshold"`: ℓ_r = leading positions with a_{r,j} ≥ `threshold`."""

    options_class = ThresholdOptions
    needs_confidence = True
    rule = staticmethod(schedule_threshold)

    def lengths(self, survival, rows, device):
        return schedule_threshold(survival, threshold=self.options.threshold)
