"""Paper Algorithm 1: causal greedy admission of the sorted candidates while Θ = τ·SPS(B) improves.

Every policy maps `survival` a_{r,j} = ∏_{i≤j} c_{r,i} (`[R, γ]`, non-increasing along j) to `verify_len` ℓ_r
(`LongTensor[R]`, 0 ≤ ℓ_r ≤ γ). The load-aware policies maximise Θ = τ·SPS(B), with τ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j})
and B = Σ_r (1 + ℓ_r), by walking the global candidate list sorted by a_{r,j} descending (ties: lower position j
first, then lower request index r; candidates with a = 0 are never admitted). Because a_{r,j} is non-increasing in
j, every prefix of that list is prefix-closed per request and is the best τ for its size (docs/scheduling.md §2),
so a policy only chooses how many candidates m to admit.
"""

from __future__ import annotations

import torch

from ..profiling.step_curve import StepCurve, check_survival
from .base import BasePolicy


def sorted_path(survival: torch.Tensor, step_curve: StepCurve) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 1 steps 2-5b for every prefix at once.

    survival: `[R, γ]`. Returns (row_of_rank `[R·γ]` the request of the m-th candidate, theta `[R·γ + 1]` Θ after
    admitting the first m candidates (float64), num_positive scalar tensor: candidates with a > 0).
    Order: survival descending; the flat index j·R + r plus a stable sort realises "lower j, then lower r" on ties.
    """
    rows = survival.shape[0]
    flat = survival.t().reshape(-1)
    values, order = torch.sort(flat, descending=True, stable=True)
    values = values.to(torch.float64).clamp_min(0.0)
    tau = rows + torch.cat([values.new_zeros(1), values.cumsum(0)])
    batch_tokens = rows + torch.arange(flat.numel() + 1, device=flat.device)
    theta = tau * step_curve.steps_per_second_at(batch_tokens)
    return order % max(rows, 1), theta, (values > 0).sum()


def admit_top(row_of_rank: torch.Tensor, count: torch.Tensor, rows: int) -> torch.Tensor:
    """ℓ_r = how many of the first `count` sorted candidates belong to request r (scatter_add; no host sync)."""
    rank = torch.arange(row_of_rank.numel(), device=row_of_rank.device)
    admitted = (rank < count).to(torch.long)
    return torch.zeros(rows, dtype=torch.long, device=row_of_rank.device).scatter_add_(0, row_of_rank, admitted)


def schedule_greedy(survival: torch.Tensor, step_curve: StepCurve) -> torch.Tensor:
    """Algorithm 1 (causal greedy with early stop): admit sorted candidates while Θ = τ·SPS(B) strictly improves.

    survival: `[R, γ]`; returns verify_len `LongTensor[R]`. Stops at the first candidate whose admission does not
    raise Θ above the best so far (= Θ of the previous prefix), so the decision on x_j looks only at candidates
    ranked before it: lossless. On a jagged SPS(B) the stop can be a local optimum; see `schedule_lagged`.
    """
    survival = check_survival(survival)
    rows, gamma = survival.shape
    if rows * gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=survival.device)
    row_of_rank, theta, num_positive = sorted_path(survival, step_curve)
    steps = torch.arange(1, theta.numel(), device=theta.device)
    stops = (theta[1:] <= theta[:-1]) | (steps > num_positive)
    stops = torch.cat([stops, stops.new_ones(1)]).to(torch.uint8)
    count = torch.argmax(stops)  # first non-improving (or non-positive) candidate = number admitted
    return admit_top(row_of_rank, count, rows)


class GreedyPolicy(BasePolicy):
    """`"greedy"`: Algorithm 1 on this round's survivals (flattened-batch cost B = Σ_r (1 + ℓ_r))."""

    needs_step_curve = True
    needs_confidence = True
    rule = staticmethod(schedule_greedy)

    def lengths(self, survival, rows, device):
        return schedule_greedy(survival, self.settings.step_curve)
