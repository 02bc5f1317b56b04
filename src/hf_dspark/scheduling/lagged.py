"""Paper §5.2 lagged capacity: K from survivals known before this round's drafts, then the current top-K.

Lossless: K does not depend on this round's drafts (Appendix A); robust to a jagged SPS(B).
"""

from __future__ import annotations

import torch

from ..profiling.step_curve import StepCurve, check_survival
from .base import BasePolicy
from .greedy import admit_top, schedule_greedy, sorted_path


def capacity_from_survival(capacity_survival: torch.Tensor, rows: int, step_curve: StepCurve) -> torch.Tensor:
    """Paper §5.2: capacity K = argmax_m Θ(m) over the whole sorted path of earlier survivals (no early stop).

    capacity_survival: `[R', γ]` survivals fixed before this round's drafts were sampled; rows: the current R.
    When R' ≠ R the rows are resampled evenly (row ⌊i·R'/R⌋ for i < R) so the path is evaluated at the current
    batch's anchor count B = R + m; the γ must match. Returns a scalar LongTensor K in [0, R·γ] (first argmax).
    """
    capacity_survival = check_survival(capacity_survival)
    cap_rows, gamma = capacity_survival.shape
    if rows == 0 or gamma == 0 or cap_rows == 0:
        return torch.zeros((), dtype=torch.long, device=capacity_survival.device)
    if cap_rows != rows:
        pick = torch.arange(rows, device=capacity_survival.device) * cap_rows // rows
        capacity_survival = capacity_survival[pick]
    _, theta, positive = sorted_path(capacity_survival, step_curve)
    # Only the a > 0 candidates form the pool (Algorithm 1, step 2): a zero-survival draft adds nothing to τ, so a
    # curve that happens to rise past the pool must not stretch K.
    admissible = torch.arange(theta.numel(), device=theta.device) <= positive
    return torch.argmax(torch.where(admissible, theta, torch.full_like(theta, -torch.inf)))


def schedule_lagged(
    survival: torch.Tensor, step_curve: StepCurve, capacity_survival: torch.Tensor | None = None
) -> torch.Tensor:
    """Paper §5.2 lagged capacity: K from `capacity_from_survival(capacity_survival)`, then the current top-K.

    survival: `[R, γ]` current survivals; capacity_survival: `[R', γ]` survivals known before this round's drafts
    (e.g. last round's, or two rounds back as in the paper), or None to fall back to `schedule_greedy`.
    Returns verify_len `LongTensor[R]`. K is clipped to the current candidates with a > 0. K does not depend on
    this round's drafts and the rank of (r, j) only on candidates ranked before it, so the policy is lossless,
    and the unconstrained argmax finds the global optimum of a jagged SPS(B) when survivals are stable. Unlike
    greedy it does not guarantee Θ(result) ≥ Θ(ℓ = 0) when the current survivals differ from the capacity ones:
    guarding that with current survivals would reintroduce the Appendix A leak.
    """
    if capacity_survival is None:
        return schedule_greedy(survival, step_curve)
    survival = check_survival(survival)
    rows, gamma = survival.shape
    if capacity_survival.dim() != 2 or capacity_survival.shape[1] != gamma:
        raise ValueError(
            f"capacity_survival must be [R', {gamma}] to match survival, got {tuple(capacity_survival.shape)}."
        )
    if rows * gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=survival.device)
    capacity = capacity_from_survival(capacity_survival.to(survival.device), rows, step_curve)
    row_of_rank, _, num_positive = sorted_path(survival, step_curve)
    return admit_top(row_of_rank, torch.minimum(capacity, num_positive), rows)


class LaggedPolicy(BasePolicy):
    """`"lagged"`: capacity from last round's survivals, then this round's top-K (first round: Algorithm 1)."""

    needs_step_curve = True
    needs_confidence = True
    uses_capacity_survival = True
    rule = staticmethod(schedule_lagged)

    def __init__(self, settings, options=None):
        super().__init__(settings, options)
        self._previous: torch.Tensor | None = None

    def lengths(self, survival, rows, device):
        previous, self._previous = self._previous, survival
        return schedule_lagged(survival, self.settings.step_curve, previous)
