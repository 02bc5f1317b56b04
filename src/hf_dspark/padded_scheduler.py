"""Scheduling for a padded verification batch (this package's execution layout; a departure from paper §5).

The paper verifies a flattened batch whose cost grows with B = Σ_r (1 + ℓ_r). `generate` and `DSparkEngine`
pad every row to 1 + max_r ℓ_r slots, so a round costs like B = R·(1 + L) with L = max_r ℓ_r: once one row
verifies L drafts, every row can verify up to L for free. The best assignment for a given L is then ℓ_r = L for
all rows (prefix-closed by construction), and the objective reduces to one dimension:

    Θ(L) = (R + Σ_r Σ_{j≤L} a_{r,j}) · SPS(R·(1 + L)),  L = 0..γ.

- `schedule_padded_greedy`: raise L while Θ strictly improves, stop at the first L + 1 that does not (Algorithm
  1's early stop). Deciding on position L + 1 reads a_{·,L+1}, which depends on drafts x_{≤L} only: lossless.
- `schedule_padded_lagged`: L = unconstrained argmax of Θ over survivals fixed before this round's drafts (last
  round's), the padded analogue of the lagged-capacity policy: lossless and robust to a jagged curve.
"""

from __future__ import annotations

import torch

from .step_curve import StepCurve, check_survival


def padded_throughput(survival: torch.Tensor, step_curve: StepCurve) -> torch.Tensor:
    """Θ(L) for L = 0..γ with every row verifying L drafts. survival `[R, γ]` -> `[γ + 1]` (float64)."""
    rows, gamma = survival.shape
    gains = survival.to(torch.float64).clamp_min(0.0).sum(dim=0).cumsum(0)
    tau = rows + torch.cat([gains.new_zeros(1), gains])
    lengths = torch.arange(gamma + 1, device=survival.device)
    return tau * step_curve.steps_per_second_at(rows * (1 + lengths)).to(torch.float64)


def schedule_padded_greedy(survival: torch.Tensor, step_curve: StepCurve) -> torch.Tensor:
    """Uniform L with Algorithm 1's causal early stop under the padded cost. `[R, γ]` -> verify_len `[R]`."""
    survival = check_survival(survival)
    rows, gamma = survival.shape
    if rows * gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=survival.device)
    theta = padded_throughput(survival, step_curve)
    improves = theta[1:] > theta[:-1]
    stop = int(torch.argmin(improves.to(torch.int8))) if not bool(improves.all()) else gamma
    return torch.full((rows,), stop, dtype=torch.long, device=survival.device)


def schedule_padded_lagged(
    survival: torch.Tensor, step_curve: StepCurve, capacity_survival: torch.Tensor | None = None
) -> torch.Tensor:
    """Uniform L = argmax_L Θ(L) over `capacity_survival` (earlier survivals, `[R', γ]`; rows resampled to R).

    Falls back to `schedule_padded_greedy` without earlier survivals. `[R, γ]` -> verify_len `[R]`.
    """
    if capacity_survival is None:
        return schedule_padded_greedy(survival, step_curve)
    survival = check_survival(survival)
    rows, gamma = survival.shape
    capacity_survival = check_survival(capacity_survival.to(survival.device))
    if rows * gamma == 0 or capacity_survival.shape[0] == 0:
        return torch.zeros(rows, dtype=torch.long, device=survival.device)
    if capacity_survival.shape[1] != gamma:
        raise ValueError(f"capacity_survival must be [R', {gamma}], got {tuple(capacity_survival.shape)}.")
    pick = torch.arange(rows, device=survival.device) * capacity_survival.shape[0] // rows
    length = int(torch.argmax(padded_throughput(capacity_survival[pick], step_curve)))
    return torch.full((rows,), length, dtype=torch.long, device=survival.device)
