"""Baseline `"fixed"`: the same ℓ for every row (default γ; 1 is the "MTP-1"-like budget)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ..profiling.step_curve import StepCurve
from .base import BasePolicy, PolicyOptions
from .records import PolicySettings


def schedule_fixed(
    survival: torch.Tensor, step_curve: StepCurve | None = None, length: int | None = None
) -> torch.Tensor:
    """Baseline: the same ℓ_r = `length` for every request (default γ; 1 is the "MTP-1"-like budget).

    survival: `[R, γ]` (only its shape and device are used); returns verify_len `LongTensor[R]`, clipped to [0, γ].
    """
    rows, gamma = survival.shape
    value = gamma if length is None else min(max(int(length), 0), gamma)
    return torch.full((rows,), value, dtype=torch.long, device=survival.device)


@dataclass(frozen=True)
class FixedOptions(PolicyOptions):
    """The options of `"fixed"`.

    Args:
        verify_len: ℓ, the drafts every row verifies, an integer 0..γ (`dspark_verify_len`; None: γ; 1 is the
            "MTP-1"-like budget).
    """

    verify_len: int | None = None

    def __post_init__(self) -> None:
        value = self.verify_len
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0):
            raise ValueError(f"dspark_verify_len must be a non-negative integer (at most γ), got {value!r}.")

    def check(self, settings: PolicySettings) -> None:
        if self.verify_len is not None and self.verify_len > settings.block_size:
            raise ValueError(f"dspark_verify_len must be in 0..{settings.block_size} (γ), got {self.verify_len}.")


class FixedPolicy(BasePolicy):
    """`"fixed"`: ℓ_r = `verify_len` (γ when unset) for every row; needs no confidence head."""

    options_class = FixedOptions
    rule = staticmethod(schedule_fixed)
    reads_survival = False

    def lengths(self, survival, rows, device):
        verify_len = self.options.verify_len
        length = self.settings.block_size if verify_len is None else int(verify_len)
        return torch.full((rows,), length, dtype=torch.long, device=device)
