"""Verification-length scheduling (docs/scheduling.md; paper Algorithm 1 and §5.2).

Every policy maps `survival` a_{r,j} = ∏_{i≤j} c_{r,i} (`[R, γ]`, non-increasing along j) to `verify_len` ℓ_r
(`LongTensor[R]`, 0 ≤ ℓ_r ≤ γ). The load-aware policies maximise Θ = τ·SPS(B), with τ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j})
and B = Σ_r (1 + ℓ_r), by walking the global candidate list sorted by a_{r,j} descending (ties: lower position j
first, then lower request index r; candidates with a = 0 are never admitted). Because a_{r,j} is non-increasing in
j, every prefix of that list is prefix-closed per request and is the best τ for its size (docs/scheduling.md §2),
so a policy only chooses how many candidates m to admit.

Losslessness: the decision to verify x_j may depend on x_<j and on other requests, never on x_≥j (Appendix A).
`schedule_greedy` (Algorithm 1 with its early stop) and `schedule_lagged` (capacity K fixed from survivals known
before this round's drafts, then the current top-K) satisfy it; an unconstrained argmax of Θ over *current*
survivals does not and is deliberately not offered.

Everything is vectorised (one sort, cumulative sums, table look-ups; no Python loop over the R·γ candidates); the
only host synchronisations are the input checks (`survival` monotone and free of NaN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .padded_scheduler import schedule_padded_greedy, schedule_padded_lagged
from .step_curve import StepCurve, check_survival


def _sorted_path(survival: torch.Tensor, step_curve: StepCurve) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def _admit_top(row_of_rank: torch.Tensor, count: torch.Tensor, rows: int) -> torch.Tensor:
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
    row_of_rank, theta, num_positive = _sorted_path(survival, step_curve)
    steps = torch.arange(1, theta.numel(), device=theta.device)
    stops = (theta[1:] <= theta[:-1]) | (steps > num_positive)
    stops = torch.cat([stops, stops.new_ones(1)]).to(torch.uint8)
    count = torch.argmax(stops)  # first non-improving (or non-positive) candidate = number admitted
    return _admit_top(row_of_rank, count, rows)


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
    _, theta, positive = _sorted_path(capacity_survival, step_curve)
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
    row_of_rank, _, num_positive = _sorted_path(survival, step_curve)
    return _admit_top(row_of_rank, torch.minimum(capacity, num_positive), rows)


def schedule_fixed(
    survival: torch.Tensor, step_curve: StepCurve | None = None, length: int | None = None
) -> torch.Tensor:
    """Baseline: the same ℓ_r = `length` for every request (default γ; 1 is the "MTP-1"-like budget).

    survival: `[R, γ]` (only its shape and device are used); returns verify_len `LongTensor[R]`, clipped to [0, γ].
    """
    rows, gamma = survival.shape
    value = gamma if length is None else min(max(int(length), 0), gamma)
    return torch.full((rows,), value, dtype=torch.long, device=survival.device)


def schedule_threshold(
    survival: torch.Tensor, step_curve: StepCurve | None = None, threshold: float = 0.5
) -> torch.Tensor:
    """Baseline: static confidence threshold, ℓ_r = #leading positions with a_{r,j} ≥ threshold (and a_{r,j} > 0).

    survival: `[R, γ]`; returns verify_len `LongTensor[R]`. Per request, ignores load (step_curve unused).
    """
    survival = check_survival(survival)
    keep = (survival >= threshold) & (survival > 0)
    return keep.to(torch.long).cumprod(dim=-1).sum(dim=-1)


def expected_throughput(survival: torch.Tensor, verify_len: torch.Tensor, step_curve: StepCurve) -> torch.Tensor:
    """Objective Θ = τ·SPS(B), τ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}), B = Σ_r (1 + ℓ_r). Returns a float64 scalar tensor.

    survival: `[R, γ]`; verify_len: `[R]`.
    """
    positions = torch.arange(1, survival.shape[1] + 1, device=survival.device)
    admitted = positions[None, :] <= verify_len[:, None]
    tau = (1.0 + (survival.to(torch.float64) * admitted).sum(dim=-1)).sum()
    batch_tokens = (1 + verify_len.to(torch.long)).sum()
    return tau * step_curve.steps_per_second_at(batch_tokens)


@dataclass(frozen=True)
class SchedulerPolicy:
    """A named policy with a uniform call: `policy(survival, step_curve, capacity_survival=..., **options)`.

    `needs_step_curve`: raise when called without one; `uses_capacity_survival`: forward `capacity_survival`
    (ignored otherwise). `options` are the policy's own keywords (`length` for fixed, `threshold` for threshold).
    """

    name: str
    fn: Callable[..., torch.Tensor]
    needs_step_curve: bool
    uses_capacity_survival: bool = False

    def __call__(
        self,
        survival: torch.Tensor,
        step_curve: StepCurve | None = None,
        *,
        capacity_survival: torch.Tensor | None = None,
        **options: Any,
    ) -> torch.Tensor:
        if self.needs_step_curve and step_curve is None:
            raise ValueError(f"Scheduler policy {self.name!r} needs a step_curve (SPS(B)); profile one first.")
        if self.uses_capacity_survival:
            options["capacity_survival"] = capacity_survival
        return self.fn(survival, step_curve, **options)


SCHEDULER_POLICIES: dict[str, SchedulerPolicy] = {
    "greedy": SchedulerPolicy("greedy", schedule_greedy, needs_step_curve=True),
    "lagged": SchedulerPolicy("lagged", schedule_lagged, needs_step_curve=True, uses_capacity_survival=True),
    "fixed": SchedulerPolicy("fixed", schedule_fixed, needs_step_curve=False),
    "threshold": SchedulerPolicy("threshold", schedule_threshold, needs_step_curve=False),
    "greedy_padded": SchedulerPolicy("greedy_padded", schedule_padded_greedy, needs_step_curve=True),
    "lagged_padded": SchedulerPolicy(
        "lagged_padded", schedule_padded_lagged, needs_step_curve=True, uses_capacity_survival=True
    ),
}


def get_policy(name: str | SchedulerPolicy) -> SchedulerPolicy:
    """Look a policy up by name ("greedy", "lagged", "fixed", "threshold"; case-insensitive)."""
    if isinstance(name, SchedulerPolicy):
        return name
    key = str(name).strip().lower()
    if key not in SCHEDULER_POLICIES:
        raise ValueError(f"Unknown scheduler policy {name!r}; choose one of {sorted(SCHEDULER_POLICIES)}.")
    return SCHEDULER_POLICIES[key]
