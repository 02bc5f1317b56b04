"""Verification-length scheduling (DESIGN.md section 4; paper Algorithm 1 and §5.2).

Every policy maps `survival` a_{r,j} = ∏_{i≤j} c_{r,i} (`[R, γ]`, non-increasing along j) to `verify_len` ℓ_r
(`LongTensor[R]`, 0 ≤ ℓ_r ≤ γ). The load-aware policies maximise Θ = τ·SPS(B), with τ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j})
and B = Σ_r (1 + ℓ_r), by walking the global candidate list sorted by a_{r,j} descending (ties: lower position j
first, then lower request index r; candidates with a = 0 are never admitted). Because a_{r,j} is non-increasing in
j, every prefix of that list is prefix-closed per request and is the best τ for its size (the review's Lemmas 1-2),
so a policy only chooses how many candidates m to admit.

Losslessness: the decision to verify x_j may depend on x_<j and on other requests, never on x_≥j (Appendix A).
`schedule_greedy` (Algorithm 1 with its early stop) and `schedule_lagged` (capacity K fixed from survivals known
before this round's drafts, then the current top-K) satisfy it; an unconstrained argmax of Θ over *current*
survivals does not and is deliberately not offered.

Everything is vectorised (one sort, cumulative sums, table look-ups; no Python loop over the R·γ candidates); the
only host synchronisations are the input checks (`survival` monotone and free of NaN).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers.utils import logging

from .io_utils import write_json_atomic

logger = logging.get_logger(__name__)

_STEP_CURVE_FORMAT = 1


@dataclass
class StepCurve:
    """SPS(B): profiled target verification forwards per second at `batch_tokens` B (DESIGN.md `step_curve`).

    batch_tokens: strictly ascending positive ints; steps_per_second: positive floats, one per point. Between points
    SPS is interpolated linearly; below the first point it is clamped to the first value; beyond the last point it is
    extrapolated conservatively as SPS(B) = SPS(B_max)·B_max / B (constant token throughput, never better).
    The metadata fields (model, device, dtype, threads, created) are optional and only describe the measurement.
    """

    batch_tokens: list[int]
    steps_per_second: list[float]
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    created: str | None = None
    _tables: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        tokens, sps = list(self.batch_tokens), list(self.steps_per_second)
        if not tokens:
            raise ValueError("StepCurve needs at least one (batch_tokens, steps_per_second) point.")
        if len(tokens) != len(sps):
            raise ValueError(
                f"batch_tokens has {len(tokens)} points but steps_per_second has {len(sps)}; they must match."
            )
        if any(int(b) != b or b < 1 for b in tokens):
            raise ValueError(f"batch_tokens must be positive integers, got {tokens}.")
        if any(b1 <= b0 for b0, b1 in itertools.pairwise(tokens)):
            raise ValueError(f"batch_tokens must be strictly ascending, got {tokens}.")
        if any(not math.isfinite(s) or s <= 0 for s in sps):
            raise ValueError(f"steps_per_second must be finite and > 0, got {sps}.")
        self.batch_tokens = [int(b) for b in tokens]
        self.steps_per_second = [float(s) for s in sps]
        if self.threads is not None:
            self.threads = int(self.threads)

    def _table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, tuple(self.batch_tokens), tuple(self.steps_per_second))
        if key not in self._tables:
            self._tables.clear()
            self._tables[key] = (
                torch.tensor(self.batch_tokens, dtype=torch.float64, device=device),
                torch.tensor(self.steps_per_second, dtype=torch.float64, device=device),
            )
        return self._tables[key]

    def steps_per_second_at(self, batch_tokens: int | torch.Tensor) -> float | torch.Tensor:
        """SPS(B) for an int (returns float) or an integer tensor of any shape (returns float64 tensor)."""
        if not isinstance(batch_tokens, torch.Tensor):
            return float(self.steps_per_second_at(torch.tensor([int(batch_tokens)]))[0])
        xs, ys = self._table(batch_tokens.device)
        b = batch_tokens.to(torch.float64)
        if xs.numel() == 1:
            inside = ys[0].expand_as(b)
        else:
            hi = torch.searchsorted(xs, b.contiguous(), right=True).clamp(1, xs.numel() - 1)
            x0, x1, y0, y1 = xs[hi - 1], xs[hi], ys[hi - 1], ys[hi]
            weight = ((b - x0) / (x1 - x0)).clamp(0.0, 1.0)
            inside = torch.lerp(y0, y1, weight)  # exact at the measured points
        beyond = ys[-1] * xs[-1] / b.clamp_min(1.0)
        return torch.where(b > xs[-1], beyond, inside)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the points, the metadata and a format version."""
        payload = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return {"format_version": _STEP_CURVE_FORMAT, **payload}

    def save(self, path: str | os.PathLike) -> None:
        """Write the curve as JSON (atomically: temp file + os.replace)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> StepCurve:
        known = {"batch_tokens", "steps_per_second", "model", "device", "dtype", "threads", "created"}
        unknown = set(payload) - known - {"format_version"}
        if unknown:
            logger.warning(f"Ignoring unknown step-curve fields: {sorted(unknown)}")
        if "batch_tokens" not in payload or "steps_per_second" not in payload:
            raise ValueError("A step curve needs 'batch_tokens' and 'steps_per_second'.")
        return cls(**{k: v for k, v in payload.items() if k in known})

    @classmethod
    def load(cls, path: str | os.PathLike) -> StepCurve:
        """Read a curve written by `save`."""
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    def plot(self, path: str | os.PathLike, title: str | None = None) -> None:
        """Write a PNG of SPS(B) and of the token throughput B·SPS(B) (matplotlib Agg canvas, no pyplot)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6.4, 4.0))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        ax.plot(self.batch_tokens, self.steps_per_second, "o-", color="tab:blue", label="SPS(B)")
        ax.set_xlabel("batch tokens B")
        ax.set_ylabel("verification forwards / s", color="tab:blue")
        ax.set_xscale("log", base=2)
        twin = ax.twinx()
        tokens_per_s = [b * s for b, s in zip(self.batch_tokens, self.steps_per_second)]
        twin.plot(self.batch_tokens, tokens_per_s, "s--", color="tab:orange", label="B·SPS(B)")
        twin.set_ylabel("batch tokens / s", color="tab:orange")
        meta = ", ".join(str(v) for v in (self.model, self.device, self.dtype) if v)
        threads = f", {self.threads} threads" if self.threads else ""
        ax.set_title(title or f"Step curve{': ' + meta if meta else ''}{threads}", fontsize=9)
        fig.tight_layout()
        fig.savefig(os.fspath(path), dpi=120)


def _check_survival(survival: torch.Tensor) -> torch.Tensor:
    """Validate `[R, γ]` survival and return it with a running minimum along j (a no-op for a cumprod)."""
    if survival.dim() != 2:
        raise ValueError(f"survival must be [R, block_size], got shape {tuple(survival.shape)}.")
    if not survival.is_floating_point():
        survival = survival.to(torch.float32)
    if survival.shape[1] > 1 and bool((survival[:, 1:] > survival[:, :-1] + 1e-6).any()):
        raise ValueError("survival must be non-increasing along positions (a_{r,j} = prod_{i<=j} c_{r,i}).")
    if bool(torch.isnan(survival).any()):
        raise ValueError("survival contains NaN.")
    return survival.cummin(dim=-1).values if survival.shape[1] > 1 else survival


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
    survival = _check_survival(survival)
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
    capacity_survival = _check_survival(capacity_survival)
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
    survival = _check_survival(survival)
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
    survival = _check_survival(survival)
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
}


def _register_padded() -> None:
    from .padded_scheduler import schedule_padded_greedy, schedule_padded_lagged

    SCHEDULER_POLICIES["greedy_padded"] = SchedulerPolicy("greedy_padded", schedule_padded_greedy, True)
    SCHEDULER_POLICIES["lagged_padded"] = SchedulerPolicy(
        "lagged_padded", schedule_padded_lagged, needs_step_curve=True, uses_capacity_survival=True
    )


def get_policy(name: str | SchedulerPolicy) -> SchedulerPolicy:
    """Look a policy up by name ("greedy", "lagged", "fixed", "threshold"; case-insensitive)."""
    if isinstance(name, SchedulerPolicy):
        return name
    key = str(name).strip().lower()
    if key.endswith("_padded") and key not in SCHEDULER_POLICIES:
        _register_padded()
    if key not in SCHEDULER_POLICIES:
        raise ValueError(f"Unknown scheduler policy {name!r}; choose one of {sorted(SCHEDULER_POLICIES)}.")
    return SCHEDULER_POLICIES[key]
