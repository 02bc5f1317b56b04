"""The "auto" policy's decision before drafting: which rows draft and how many drafts they verify, or none.

Per round, from the realised acceptances of earlier rounds only (`AcceptanceTracker`), the target's step curve
SPS(B) and the drafter's cost curve (proposals per second against rows R), `draft_or_decode` maximises
Θ = E[committed tokens] / (T_verify(R·(1 + L)) + T_draft(k)) over the padded layout's real B, including k = 0:
decode plainly, without the drafter's forward. Since nothing of the current round is read, the choice is a
function of the past like a fixed ℓ, and verification stays exact (Appendix A's argument, with the stopping
rule measurable with respect to earlier rounds).

Skipping observes nothing new: a skipped request's own estimate only drifts back to the pool
(`AcceptanceTracker.idle_decay`), and the pool stays put, so a *probe* drafts the skipped rows now and then, at the
L that would pay if the drafts were good (q = `optimistic`), but no longer than the L at which the round costs
`probe_cost_cap` plain rounds (at high load a full-length probe of every row costs several). Its interval is sized
so probes cost at most `probe_budget` of the rounds' time (interval = probe's extra seconds / (budget · one plain
round)), clamped to [`min_interval`, `max_interval`], and lengthened after each probe if the probe measured dearer
than planned (`_respace_probes`). A probe after which drafting still does not pay is *futile*: each futile probe in
a row doubles the wait for the next one (up to `max_interval`), so a drafter that keeps failing costs ever less,
and the first plan that drafts again resets it (like a serving engine's back-off from speculation). A drafter never
observed before probes in its first round.

The curves are corrected by what earlier rounds measured (`cost_correction.CostCorrection`, fed by
`observe_round`): plain rounds' predicted cost × f_plain, drafting rounds' × f_drafting; and the expected gains by
how the drafting rounds' forecasts fared (`cost_correction.AcceptanceCorrection`, fed by `observe_acceptance`):
× f_acc ≤ 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .acceptance import AcceptanceMemory, AcceptanceTracker, host_array
from .padded import host_draft_or_decode, padded_verify_seconds
from .records import DraftPlan, RoundRecord

_NO_ROWS = torch.zeros(0, dtype=torch.long)  # a plan without drafting rows (read only)


def _priced_rows(chosen: np.ndarray, shares: np.ndarray | None) -> int | None:
    """⌈Σ shares⌉ over the chosen rows (`draft_or_decode`'s priced count), None without shares."""
    return None if shares is None else math.ceil(float(shares[chosen].sum()) - 1e-9)


def seconds_per_call(curve, counts: torch.Tensor) -> torch.Tensor:
    """1 / SPS at each count (float64), or zeros without a curve."""
    if curve is None:
        return torch.zeros(counts.shape, dtype=torch.float64)
    return 1.0 / curve.steps_per_second_at(counts.clamp_min(1)).to(torch.float64)


@dataclass
class CostAwarePlanner:
    """Plans each round for policy "auto" (see the module docstring).

    Args:
        tracker: per-request realised acceptance (its memory also holds the probe schedule across calls).
        step_curve: SPS(B) of the target's verification forward.
        draft_curve: proposals per second of the drafter at R rows (None: drafting costs nothing).
        probe_budget: fraction of time probes may cost.
        min_interval / max_interval: bounds of the rounds between probes.
        optimistic: conditional acceptance assumed when choosing a probe's rows and L.
        measured_costs: correct the curves by earlier rounds' wall times (`CostCorrection`); False plans with the
            curves as given (e.g. synthetic curves that are not this machine's seconds).
        probe_cost_cap: a probe verifies at most the L at which its round (every row drafting) costs this many
            plain rounds (at least L = 1): at high load a full-length probe of every row costs several plain steps.
    """

    tracker: AcceptanceTracker
    step_curve: Any
    draft_curve: Any = None
    probe_budget: float = 0.02
    min_interval: int = 8
    max_interval: int = 512
    optimistic: float = 0.95
    measured_costs: bool = True
    probe_cost_cap: float = 2.0
    _draft_table: torch.Tensor | None = field(default=None, repr=False)
    _verify_tables: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    # (key, decision, the rows' conditional estimates `[R, γ]` it was computed from or None)
    _last: tuple[Any, tuple[np.ndarray, int], np.ndarray | None] | None = field(default=None, repr=False)
    _priced: int | None = field(default=None, repr=False)
    _plain_floor: tuple[Any, float] | None = field(default=None, repr=False)  # (evidence key, cost ratio)
    _host_tables: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _forecast: np.ndarray | None = field(default=None, repr=False)  # a drafting plan's estimates `[R, γ]`

    def verify_seconds(self, rows: int) -> torch.Tensor:
        """T_verify(rows·(1 + L)) for L = 0..γ (cached per row count)."""
        if rows not in self._verify_tables:
            self._verify_tables[rows] = padded_verify_seconds(self.step_curve, rows, self.tracker.block_size)
        return self._verify_tables[rows]

    def draft_seconds(self, rows: int) -> torch.Tensor:
        """T_draft(k) for k = 0..rows, `[rows + 1]` (k = 0 costs nothing; a table grown on demand)."""
        if self._draft_table is None or self._draft_table.numel() <= rows:
            size = max(rows + 1, 2 * (self._draft_table.numel() if self._draft_table is not None else 32))
            self._draft_table = seconds_per_call(self.draft_curve, torch.arange(size))
            self._draft_table[0] = 0.0
        return self._draft_table[: rows + 1]

    def corrected_costs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(T_verify(rows·(1 + L)) `[γ + 1]`, T_draft(k) `[rows + 1]`) scaled by the measured corrections: column
        L = 0 (plain decoding) by f_plain, drafting rounds (L ≥ 1 and the drafter) by f_drafting."""
        verify, draft = self._host_costs(rows)
        return torch.from_numpy(verify), torch.from_numpy(draft)

    def _tables(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The uncorrected (T_verify `[γ + 1]`, T_draft `[rows + 1]`) as float64 host arrays, cached per row count
        (read-only to callers)."""
        tables = self._host_tables.get(rows)
        if tables is None:
            tables = (host_array(self.verify_seconds(rows), np.float64).copy(),
                      host_array(self.draft_seconds(rows), np.float64).copy())
            self._host_tables[rows] = tables
        return tables

    def _host_costs(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """`corrected_costs` as float64 host arrays (the uncorrected ones are cached host copies of the tables, one
        pair per row count: read-only to callers)."""
        verify, draft = self._tables(rows)
        if not self.measured_costs:
            return verify, draft
        costs = self.tracker.memory.costs
        verify = verify.copy()
        verify[0] *= costs.plain
        verify[1:] *= costs.drafting
        return verify, draft * costs.drafting

    def observe_round(self, record: RoundRecord) -> None:
        """Feed one finished round's wall time (drafter + verification) to the cost correction."""
        rows = len(record.rows)
        if rows == 0 or not self.measured_costs:
            return
        longest = max(record.verify_len, default=0)
        verify, draft = self._tables(rows)
        predicted = float(verify[min(longest, self.tracker.block_size)])
        if record.drafted:
            priced = record.drafted if self._priced is None else self._priced
            predicted += float(draft[priced])
        measured = record.verify_seconds + record.draft_seconds
        costs = self.tracker.memory.costs
        costs.observe(bool(record.drafted), measured, predicted)
        if record.probe and record.drafted and costs.drafting_rounds > costs.cold_rounds:
            self._respace_probes(rows, measured)

    def _respace_probes(self, rows: int, measured: float) -> None:
        """After a probe: push the next one back until probes cost ≤ `probe_budget` of the time at this probe's
        *measured* cost. The curves price the proposal, not the drafter's update over the context queued while it
        was skipped (up to 64 slots of committed tokens), which a probe pays too; so a planned interval can be
        too short, never lengthened here beyond `max_interval`. (The cold first drafting round is not used.)"""
        plain = float(self._host_costs(rows)[0][0])
        wanted = math.ceil((measured - plain) / max(self.probe_budget * plain, 1e-12))
        memory = self.tracker.memory
        memory.probe_interval = int(min(max(wanted, memory.probe_interval), self.max_interval))

    def plan(
        self, rows: list[Any], cap: Sequence[int] | torch.Tensor, draft_costs: torch.Tensor | None = None,
        acceptance: Sequence[Sequence[float] | None] | None = None,
    ) -> DraftPlan:
        """The decision for the active `rows` (ids) with `cap` `[R]` most drafts each may verify (host ints; a
        device tensor is read once); `draft_costs` `[R]`: each row's share of the draft curve's per-row cost (None:
        1 each; see `draft_or_decode`); `acceptance` `[R]`: the drafter's own conditional acceptance forecast `[γ]`
        of a row, or None where the lagged estimate stands (`DraftModel.row_acceptance`)."""
        count, gamma = len(rows), self.tracker.block_size
        # clipped in Python, one array built: right after a target forward every numpy call is several µs
        capped = cap.tolist() if isinstance(cap, torch.Tensor) else list(cap)
        if capped and min(capped) >= gamma:  # every row may verify all γ (no budget near its end)
            capped = [gamma] * count
        else:
            capped = [min(max(int(c), 0), gamma) for c in capped]
        cap = np.array(capped, dtype=np.int64)
        shares = None if draft_costs is None else np.minimum(np.maximum(host_array(draft_costs, np.float64), 0.0), 1.0)
        if acceptance is not None and any(rates is not None for rates in acceptance):
            chosen, length = self._decide_forecast(rows, cap, shares, acceptance)
        else:
            chosen, length = self._decide(rows, cap, shares)
        self._priced, self._forecast = None, None
        memory = self.tracker.memory
        room = any(capped)  # some row may still draft
        if length > 0 or (memory.probe_verdict_due and room):
            # The last probe's verdict (not while no row may draft at all), or any evidence that drafts pay.
            memory.futile_probes = 0 if length > 0 else memory.futile_probes + 1
            memory.probe_verdict_due = False
        if length > 0:
            memory.rounds_since_probe = 0
            drafting = np.flatnonzero(chosen)
            estimates = self._last[2]  # the decision's own: a drafting plan was computed afresh or cached with them
            self._forecast = estimates  # what `observe_acceptance` holds the round to
            forecast = torch.from_numpy(estimates[drafting])
            self._priced = _priced_rows(chosen, shares)
            return DraftPlan(
                rows=torch.from_numpy(drafting), length=length, batch_rows=count, forecast=forecast,
                priced_rows=self._priced,
            )
        memory.rounds_since_probe += 1
        due = not memory.observed or memory.rounds_since_probe >= self.probe_wait(memory)
        if not due or not room:
            return DraftPlan(rows=_NO_ROWS, length=0)
        costs = self._host_costs(count)
        hopeful = np.cumprod(np.full((count, gamma), self.optimistic), axis=-1)
        reach = self._probe_reach(costs, count)  # the probe's cost cap: L ≤ reach
        chosen, length = host_draft_or_decode(self._expected(hopeful, cap)[:, : reach + 1], costs[0][: reach + 1],
                                              costs[1], shares)
        if length == 0:  # drafting would not pay even with good drafts: no probe needed
            return DraftPlan(rows=_NO_ROWS, length=0)
        memory.rounds_since_probe, memory.probe_verdict_due = 0, True
        self._priced = _priced_rows(chosen, shares)
        priced = int(chosen.sum()) if self._priced is None else self._priced
        memory.probe_interval = self._interval(costs, priced, length)
        return DraftPlan(
            rows=torch.from_numpy(np.flatnonzero(chosen)), length=length, probe=True, batch_rows=count,
            priced_rows=self._priced,
        )

    def observe_acceptance(self, verify_len: Sequence[int], accepted: Sequence[int]) -> None:
        """After a planned drafting round (not a probe), every active row's verified ℓ_r and accepted drafts (host
        ints): the drafts its plan's estimates forecast, Σ_r Σ_{j≤ℓ_r} â_{r,j}, against those accepted, to the
        memory's `AcceptanceCorrection`."""
        estimates, self._forecast = self._forecast, None
        if estimates is None or len(verify_len) != len(estimates):
            return
        if len(estimates) == 1:  # one row: Python floats
            survival, forecast = 1.0, 0.0
            for q in estimates[0].tolist()[: int(verify_len[0])]:
                survival *= q
                forecast += survival
        else:  # E_r(γ) with cap ℓ_r is 1 + Σ_{j≤ℓ_r} â_{r,j}
            verified = np.asarray(verify_len, dtype=np.int64)
            forecast = float((self._expected(np.cumprod(estimates, axis=-1), verified)[:, -1] - 1.0).sum())
        self.tracker.memory.acceptance.observe(forecast, float(sum(accepted)))

    def _probe_reach(self, costs: tuple[np.ndarray, np.ndarray], rows: int) -> int:
        """The longest L a probe may verify: T_verify(rows·(1 + L)) + T_draft(rows) ≤ `probe_cost_cap` · T_verify(rows)
        on the corrected `costs` (at least 1)."""
        verify, draft = costs
        limit = self.probe_cost_cap * float(verify[0]) - float(draft[rows])
        return max((length for length in range(1, len(verify)) if float(verify[length]) <= limit), default=1)

    def probe_wait(self, memory: AcceptanceMemory) -> int:
        """Plain rounds before the next probe: the budgeted interval, doubled per futile probe in a row, at most
        `max_interval` (never below `min_interval`, nor 1)."""
        base = max(memory.probe_interval, self.min_interval, 1)
        return int(min(base * 2 ** min(memory.futile_probes, 30), max(self.max_interval, self.min_interval)))

    def _decide(self, rows: list[Any], cap: np.ndarray, shares=None) -> tuple[np.ndarray, int]:
        """`draft_or_decode` on the lagged estimates, reused while rows, caps and estimates are unchanged (in a
        run of plain-decoding rounds only the skipped requests' drift back to the pool changes them, and only
        until their own evidence has faded). A plain decision also stands, without recomputing it, through idle
        decays that cannot overturn it: while the cost ratio stays at or above `_plain_floor_ratio`'s bound."""
        tracker, memory = self.tracker, self.tracker.memory
        trials = tuple(memory.trials.tolist())  # the pooled counts (another call sharing the memory may move them)
        evidence = (tuple(rows), cap.tobytes(), tracker.version - tracker.relaxations, trials)
        evidence += (None if shares is None else shares.tobytes(), memory.acceptance.key())
        key = (*evidence, tracker.version, memory.costs.key())
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        floor, estimates = self._plain_floor, None
        if floor is not None and floor[0] == evidence and self._cost_ratio() >= floor[1]:
            decision = (np.zeros(len(rows), dtype=bool), 0)  # what recomputing gives (`_plain_floor_ratio`)
        elif len(rows) == 1:
            conditional = tracker.conditional_one(rows[0])
            share = None if shares is None else float(shares[0])
            decision = self._decide_one(rows[0], int(cap[0]), share, conditional)
            estimates = np.array([conditional], dtype=np.float64)  # bit for bit `host_conditional(rows)`
        else:
            estimates = tracker.host_conditional(rows)
            survival = np.cumprod(estimates, axis=-1) * memory.acceptance.factor  # `host_survival(rows)`, shrunk
            decision = host_draft_or_decode(self._expected(survival, cap), *self._host_costs(len(rows)), shares)
        self._last = (key, decision, estimates)
        if decision[1] == 0 and shares is None and (floor is None or floor[0] != evidence):
            self._plain_floor = (evidence, self._plain_floor_ratio(rows, cap))
        return decision

    def _decide_forecast(
        self, rows: list[Any], cap: np.ndarray, shares: np.ndarray | None, acceptance: Sequence
    ) -> tuple[np.ndarray, int]:
        """`_decide` where the drafter forecasts some rows' acceptance itself: those rows' conditional estimates are
        its forecasts, the others' the lagged ones. Decided afresh every round (forecasts move every round)."""
        estimates = self.tracker.host_conditional(rows)
        for row, rates in enumerate(acceptance):
            if rates is not None:
                estimates[row] = np.clip(np.asarray(rates, dtype=np.float64), 0.0, 1.0)
        survival = np.cumprod(estimates, axis=-1) * self.tracker.memory.acceptance.factor
        decision = host_draft_or_decode(self._expected(survival, cap), *self._host_costs(len(rows)), shares)
        self._last = (None, decision, estimates)  # the key None matches no later round
        return decision

    def _cost_ratio(self) -> float:
        """f_drafting / f_plain, the correction's factor on drafting rounds' cost against plain rounds' (1 without
        measured costs)."""
        costs = self.tracker.memory.costs
        return costs.drafting / costs.plain if self.measured_costs else 1.0

    def _plain_floor_ratio(self, rows: list[Any], cap: np.ndarray) -> float:
        """The cost ratio (`_cost_ratio`) from which on plain decoding wins for `rows` at every estimate idle decays
        alone can reach (`AcceptanceTracker.idle_ceiling`). Θ(k, L) ≤ Θ(0, 0) ⟺ (R + Σ_{top-k} gains(L)) ·
        T_v(0) / (R · (T_v(L) + T_d(k))) ≤ f_drafting / f_plain on the uncorrected curves, and every Θ(k, L)
        grows with the estimates: the bound is the largest left side at the ceiling, raised by a relative 1e-9
        that covers the rounding of either evaluation (shares: not bounded here)."""
        count = len(rows)
        survival = np.cumprod(self.tracker.idle_ceiling(rows), axis=-1) * self.tracker.memory.acceptance.factor
        extra = self._expected(survival, cap)[:, 1:] - 1.0  # [R, γ]
        gained = count + np.cumsum(-np.sort(-extra, axis=0), axis=0)  # [k, L]: the top-k rows' gains
        verify = host_array(self.verify_seconds(count), np.float64)
        draft = host_array(self.draft_seconds(count), np.float64)[1:, None]
        return float((gained * verify[0] / (count * (verify[None, 1:] + draft))).max()) * (1.0 + 1e-9)

    def _decide_one(
        self, row: Any, cap: int, share: float | None, conditional: list[float] | None = None
    ) -> tuple[np.ndarray, int]:
        """`_decide`'s `draft_or_decode` for a single row, on Python floats: the same IEEE operations in the same
        order as the array path (a batch-1 round then pays no per-call array overhead). conditional: the row's
        `conditional_one`, when the caller has it."""
        if conditional is None:
            conditional = self.tracker.conditional_one(row)
        verify, draft = self.verify_seconds(1).tolist(), float(self.draft_seconds(1)[1])
        if self.measured_costs:
            costs = self.tracker.memory.costs
            plain, drafting = costs.plain, costs.drafting
            verify = [verify[0] * plain] + [seconds * drafting for seconds in verify[1:]]
            draft *= drafting
        if share is not None:  # T_draft(⌈share⌉): nothing when the row is free
            priced = min(max(math.ceil(share - 1e-9), 0), 1)
            draft = draft if priced > 0 else 0.0
        survival, gains, best, best_length = 1.0, 0.0, None, 0
        factor = self.tracker.memory.acceptance.factor
        for length, q in enumerate(conditional, start=1):
            survival *= q
            gains += survival * factor * (1.0 if length <= cap else 0.0)
            theta = (1 + max((1.0 + gains) - 1.0, 0.0)) / (verify[length] + draft)
            if best is None or theta > best:  # the first of equal maxima, as argmax
                best, best_length = theta, length
        if best is None or best <= 1 / verify[0]:
            return np.zeros(1, dtype=bool), 0
        return np.ones(1, dtype=bool), best_length

    @staticmethod
    def _expected(survival: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """E_r(L) = 1 + Σ_{j≤min(L, cap_r)} â_{r,j}, `[R, γ + 1]` (host arrays)."""
        rows, gamma = survival.shape
        allowed = np.arange(1, gamma + 1)[None, :] <= cap[:, None]
        gains = np.cumsum(survival * allowed, axis=-1)
        return np.concatenate([np.ones((rows, 1)), 1.0 + gains], axis=1)

    def _interval(self, costs: tuple[torch.Tensor, torch.Tensor], drafting: int, length: int) -> int:
        """Rounds until the next probe so that probes cost ≤ probe_budget of the time (corrected `costs`)."""
        verify, draft = costs
        plain, probe = float(verify[0]), float(verify[length])
        extra = probe - plain + float(draft[drafting])
        wanted = math.ceil(extra / max(self.probe_budget * plain, 1e-12))
        return int(min(max(wanted, self.min_interval), self.max_interval))
