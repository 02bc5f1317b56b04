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
- `draft_or_decode`: the cost-aware round (policy "auto"). Θ counts the drafter too,
  Θ(k, L) = E[committed tokens] / (T_verify(R·(1 + L)) + T_draft(k)), and may choose k = 0 rows, L = 0: decode
  plainly without the drafter's forward. Its inputs are realised acceptances of earlier rounds (lagged).
- `batch1_outlook`: what drafting can give one request on this machine, from the curves and an acceptance
  estimate (the demo's explanation of what `auto` chose).
- `sunk_cost_stop`: once drafted, Algorithm 1's causal early stop on this round's survivals with the drafter's
  cost already paid, looking ahead with earlier rounds' acceptance so that a jagged curve does not stop it early.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence

import numpy as np
import torch

from ..profiling.step_curve import StepCurve, check_survival
from .acceptance import host_array
from .base import BasePolicy


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


def padded_verify_seconds(step_curve: StepCurve, rows: int, gamma: int) -> torch.Tensor:
    """T_verify(R·(1 + L)) = 1 / SPS for L = 0..γ, `[γ + 1]` float64 (one table per R; callers may cache it)."""
    lengths = torch.arange(gamma + 1)
    return 1.0 / step_curve.steps_per_second_at(rows * (1 + lengths)).to(torch.float64)


def draft_or_decode(
    expected_tokens: torch.Tensor,
    verify_seconds: torch.Tensor,
    draft_seconds: torch.Tensor | None = None,
    row_costs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Cost-aware padded round: which rows draft, and the uniform L they verify, or plain decoding (L = 0).

    Maximises Θ(k, L) = (R + Σ_{top-k rows} (E_r(L) − 1)) / (T_verify(R·(1 + L)) + T_draft(k)) over k = 1..R rows
    and L = 1..γ, against plain decoding Θ(0, 0) = R / T_verify(R) (ties go to plain decoding).

    expected_tokens: `[R, γ + 1]` E_r(L) = 1 + Σ_{j≤L} â_{r,j}, tokens row r is expected to commit when verifying L
    drafts (column 0 is 1); verify_seconds: `[γ + 1]` T_verify(R·(1 + L)) (`padded_verify_seconds`);
    draft_seconds: `[R + 1]` T_draft(k), seconds of one proposal for k rows (index 0 is ignored; None: drafting
    is free); row_costs: `[R]` the share of one curve row each row's proposal pays (a hybrid drafter's lookup rows
    ≈ 0; None: 1 each): the top-k rows then cost T_draft(⌈Σ shares⌉), and equal gains rank cheaper rows first.
    Returns (drafting: bool `[R]`, L). Every input must come from earlier rounds (lagged estimates) or the
    committed context, never from this round's drafts: the decision is then lossless like a fixed ℓ.
    """
    host = [None if values is None else host_array(values, np.float64)
            for values in (expected_tokens, verify_seconds, draft_seconds, row_costs)]
    chosen, length = host_draft_or_decode(*host)
    return torch.from_numpy(chosen), length


def host_draft_or_decode(
    expected_tokens: np.ndarray,
    verify_seconds: np.ndarray,
    draft_seconds: np.ndarray | None = None,
    row_costs: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """`draft_or_decode` on float64 host arrays (what the "auto" planner calls every round: numpy's per-call cost
    is a fraction of torch's on arrays this small); returns (drafting: bool `[R]` array, L)."""
    rows, width = expected_tokens.shape
    gamma = width - 1
    chosen = np.zeros(rows, dtype=bool)
    if rows == 0 or gamma == 0:
        return chosen, 0
    extra = np.maximum(expected_tokens[:, 1:] - 1.0, 0.0)  # [R, γ]
    if rows == 1:  # nothing to rank
        order = np.zeros((1, gamma), dtype=np.int64)
    elif row_costs is None:  # descending and stable: equal gains keep the row order
        order = np.argsort(-extra, axis=0, kind="stable")
    else:  # cheaper rows first among equal gains
        cheap_first = np.argsort(row_costs, kind="stable")
        order = cheap_first[np.argsort(-extra[cheap_first], axis=0, kind="stable")]
    ranked = extra if rows == 1 else extra[order, np.arange(gamma)]
    gained = rows + np.cumsum(ranked, axis=0)  # [k = 1..R, L = 1..γ]
    drafting = 0.0
    if draft_seconds is not None and row_costs is None:
        drafting = draft_seconds[1 : rows + 1, None]
    elif draft_seconds is not None:  # T_draft(⌈Σ_{top-k} shares⌉), 0 when no priced row drafts
        priced = np.clip(np.ceil(np.cumsum(row_costs[order], axis=0) - 1e-9), 0, rows).astype(np.int64)
        drafting = np.where(priced > 0, draft_seconds[priced], 0.0)
    theta = gained / (verify_seconds[None, 1:] + drafting)
    best = int(np.argmax(theta))
    if float(theta.flat[best]) <= rows / float(verify_seconds[0]):
        return chosen, 0
    count, length = best // gamma + 1, best % gamma + 1
    chosen[order[:count, length - 1]] = True
    return chosen, length


def batch1_outlook(
    acceptance: Sequence[float], verify_seconds: Sequence[float], draft_seconds: float
) -> tuple[int, float]:
    """Θ(L) / Θ(0) at batch 1, maximised over L = 1..γ: the best a fixed draft length can do against plain decoding.

    Θ(L) = (1 + Σ_{j≤L} Π_{i≤j} q_i) / (T_verify(1 + L) + T_draft(1)) and Θ(0) = 1 / T_verify(1), with q `[γ]` the
    conditional acceptance per position (e.g. the drafter's held-out acceptance), verify_seconds `[γ + 1]` the
    padded costs T_verify(1 + L) for L = 0..γ (`padded_verify_seconds(curve, 1, γ)`) and draft_seconds one proposal
    for one row. Returns (L, ratio); a ratio below 1 means drafting cannot pay for one request here.
    """
    if len(verify_seconds) != len(acceptance) + 1 or not acceptance:
        raise ValueError(
            f"need γ >= 1 acceptance rates and γ + 1 verification costs, got {len(acceptance)} and "
            f"{len(verify_seconds)}."
        )
    survival = list(itertools.accumulate((min(max(float(q), 0.0), 1.0) for q in acceptance), operator.mul))
    tokens = list(itertools.accumulate(survival, initial=1.0))  # E(L) for L = 0..γ
    plain = 1.0 / float(verify_seconds[0])
    ratios = [tokens[L] / (float(verify_seconds[L]) + draft_seconds) / plain for L in range(1, len(tokens))]
    best = max(range(len(ratios)), key=ratios.__getitem__)
    return best + 1, ratios[best]


def sunk_cost_stop(
    survival: torch.Tensor,
    rows: int,
    verify_seconds: torch.Tensor,
    draft_seconds: float,
    max_length: int,
    forecast: torch.Tensor | None = None,
) -> int:
    """Causal early stop on this round's survivals once the drafter has run (its cost is sunk), with look-ahead.

    Θ(L) = (rows + Σ_s Σ_{j≤L} a_{s,j}) / (draft_seconds + T_verify(rows·(1 + L))). At each L (from 0) the rule
    knows a_{·,≤L+1} and forecasts later positions as a_{s,j} ≈ a_{s,L+1} · Π_{L+1<i≤j} q_{s,i}; it goes on to
    L + 1 while some L' > L is forecast to beat Θ(L), up to `max_length`. Deciding on L + 1 reads a_{·,L+1} (a
    function of drafts x_{≤L}) and `forecast` (earlier rounds only), so the rule is a stopping rule: lossless.
    Looking ahead matters on a jagged curve (fp32 CPU: T_verify(4) ≫ T_verify(3), then flat), where stopping at the
    first L whose successor does not improve Θ keeps good drafts short.

    survival: `[S, γ]` current prefix survivals of the S drafting rows in a batch of `rows` rows; verify_seconds:
    `[γ + 1]` T_verify(rows·(1 + L)); forecast: `[S, γ]` conditional acceptance q_{s,j} expected from earlier
    rounds (None: 1, the optimistic bound a_{s,j} ≤ a_{s,L+1}). Returns L.
    """
    gamma = min(int(max_length), survival.shape[1])
    if gamma <= 0 or survival.shape[0] == 0:
        return 0
    # Plain Python on lists: S ≤ a few dozen rows and γ ≤ 16 make tensor ops slower here than the arithmetic.
    # clipped in the inputs' dtype, then read once (float32 values are exact as Python floats: no float64 cast)
    known = survival[:, :gamma].clamp_min(0.0).tolist()  # a_{s,j}, j = 1..γ
    rates = None if forecast is None else forecast[:, :gamma].clamp(0.0, 1.0).tolist()
    cost = [draft_seconds + float(seconds) for seconds in verify_seconds[: gamma + 1].tolist()]
    banked = float(rows)  # rows + Σ_s Σ_{j≤L} a_{s,j}: Θ(L)'s numerator
    for length in range(gamma):
        column = [row[length] for row in known]  # a_{·,L+1}, known now
        gained = math.fsum(column)  # correctly rounded: the same L on every Python (3.12's sum() compensates)
        tokens = banked + gained
        best = tokens / cost[length + 1]
        for later in range(length + 1, gamma):  # forecast a_{s,j} = a_{s,L+1} · Π_{L+1<i≤j} q_{s,i}
            if rates is not None:
                column = [value * rate[later] for value, rate in zip(column, rates)]
            tokens += math.fsum(column)
            best = max(best, tokens / cost[later + 1])
        if best <= banked / cost[length]:
            return length
        banked += gained
    return gamma


class PaddedGreedyPolicy(BasePolicy):
    """`"greedy_padded"`: one uniform L with Algorithm 1's early stop under the padded cost R·(1 + L)."""

    needs_step_curve = True
    needs_confidence = True
    rule = staticmethod(schedule_padded_greedy)

    def lengths(self, survival, rows, device):
        return schedule_padded_greedy(survival, self.settings.step_curve)


class PaddedLaggedPolicy(BasePolicy):
    """`"lagged_padded"`: L = argmax Θ(L) over last round's survivals (first round: `greedy_padded`)."""

    needs_step_curve = True
    needs_confidence = True
    uses_capacity_survival = True
    rule = staticmethod(schedule_padded_lagged)

    def __init__(self, settings, options=None):
        super().__init__(settings, options)
        self._previous: torch.Tensor | None = None

    def lengths(self, survival, rows, device):
        previous, self._previous = self._previous, survival
        return schedule_padded_lagged(survival, self.settings.step_curve, previous)
