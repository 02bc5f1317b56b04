"""Baseline `"fixed"`: the same ℓ for every row (default γ; 1 is the "MTP-1"-like budget)."""

from __future__ import annotations

import torch

from ..profiling.step_curve import StepCurve
from .base import BasePolicy


def schedule_fixed(
    survival: torch.Tensor, step_curve: StepCurve | None = None, length: int | None = None
) -> torch.Tensor:
    """Baseline: the same ℓ_r = `length` for every request (default γ; 1 is the "MTP-1"-like budget).

    survival: `[R, γ]` (only its shape and device are used); returns verify_len `LongTensor[R]`, clipped to [0, γ].
    """
    rows, gamma = survival.shape
    value = gamma if length is None else min(max(int(length), 0), gamma)
    return torch.full((rows,), value, dtype=torch.long, device=survival.device)


class FixedPolicy(BasePolicy):
    """`"fixed"`: ℓ_r = `verify_len` (γ when unset) for every row; needs no confidence head."""

    rule = staticmethod(schedule_fixed)
    reads_survival = False

    def lengths(self, survival, rows, device):
        length = self.settings.block_size if self.settings.verify_len is None else self.settings.verify_len
        return torch.full((rows,), length, dtype=torch.long, device=device)
