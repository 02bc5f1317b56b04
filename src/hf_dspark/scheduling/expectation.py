"""The one τ̂ / Θ̂ of a verification decision (the scheduling objective, docs/scheduling.md)."""

from __future__ import annotations

import torch

from ..ops.functional import prefix_survival


def expected_row_tokens(survival: torch.Tensor, verify_len: torch.Tensor) -> torch.Tensor:
    """τ̂'s terms 1 + Σ_{j≤ℓ_r} a_{r,j}, one per row. survival `[R, γ]`, verify_len `[R]` -> float64 `[R]`."""
    positions = torch.arange(1, survival.shape[1] + 1, device=survival.device)
    admitted = positions[None, :] <= verify_len.to(survival.device)[:, None]
    return 1.0 + (survival.to(torch.float64) * admitted).sum(dim=-1)


def expected_tokens(survival: torch.Tensor, verify_len: torch.Tensor) -> torch.Tensor:
    """Eq. τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}). survival `[R, γ]`, verify_len `[R]` -> float64 scalar tensor."""
    return expected_row_tokens(survival, verify_len).sum()


def expected_throughput(survival: torch.Tensor, verify_len: torch.Tensor, step_curve) -> torch.Tensor:
    """Eq. Θ̂ = τ̂·SPS(B), B = Σ_r (1 + ℓ_r). survival `[R, γ]`, verify_len `[R]` -> float64 scalar tensor."""
    batch_tokens = (1 + verify_len.to(torch.long)).sum()
    return expected_tokens(survival, verify_len) * step_curve.steps_per_second_at(batch_tokens)


def expected_tokens_per_round(confidence: torch.Tensor, verify_len: list[int], rows: list[int]) -> list[float]:
    """τ̂ of many rounds at once: `expected_tokens` of each round's rows, the survivals a = cumprod(c) computed here.

    confidence: `[N, γ]`, the rows of every round one after another (round k has `rows[k]` of them); verify_len:
    `[N]` host ints. Returns one float per round (one device read for all of them).
    """
    if not rows:
        return []
    survival = prefix_survival(confidence)
    per_row = expected_row_tokens(survival, torch.tensor(verify_len, dtype=torch.long))
    round_of_row = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(rows)).to(survival.device)
    totals = torch.zeros(len(rows), dtype=torch.float64, device=survival.device).index_add_(0, round_of_row, per_row)
    return totals.tolist()
