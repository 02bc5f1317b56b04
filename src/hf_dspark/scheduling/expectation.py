"""The one τ̂ / Θ̂ of a verification decision (the scheduling objective, docs/scheduling.md)."""

from __future__ import annotations

import torch


def expected_tokens(survival: torch.Tensor, verify_len: torch.Tensor) -> torch.Tensor:
    """Eq. τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}). survival `[R, γ]`, verify_len `[R]` -> float64 scalar tensor."""
    positions = torch.arange(1, survival.shape[1] + 1, device=survival.device)
    admitted = positions[None, :] <= verify_len.to(survival.device)[:, None]
    return (1.0 + (survival.to(torch.float64) * admitted).sum(dim=-1)).sum()


def uniform_expected_tokens(survival: torch.Tensor, length: int) -> torch.Tensor:
    """`expected_tokens` when every row verifies `length` drafts: the same sum without a mask (float64 scalar)."""
    return (1.0 + survival[:, :length].to(torch.float64).sum(dim=-1)).sum()


def expected_throughput(survival: torch.Tensor, verify_len: torch.Tensor, step_curve) -> torch.Tensor:
    """Eq. Θ̂ = τ̂·SPS(B), B = Σ_r (1 + ℓ_r). survival `[R, γ]`, verify_len `[R]` -> float64 scalar tensor."""
    batch_tokens = (1 + verify_len.to(torch.long)).sum()
    return expected_tokens(survival, verify_len) * step_curve.steps_per_second_at(batch_tokens)
