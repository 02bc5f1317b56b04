"""Realised acceptance per request, from earlier rounds only: the lagged estimates the "auto" policy plans with.

Per request r and draft position j the tracker keeps decayed counts of the conditional acceptance
q_{r,j} = P(x_j accepted | x_<j accepted): a round that verified ℓ drafts and accepted m observes positions
1..min(m + 1, ℓ) (accepted for j ≤ m, rejected at m + 1); later positions are censored and keep their counts.
The estimated prefix survival is â_{r,j} = ∏_{i≤j} q̂_{r,i} with q̂ = (succ + w·q_pool) / (trials + w), where the
pooled q_pool over all requests (and over earlier `generate` calls with the same drafter, `AcceptanceMemory`)
is the prior of a request that has not been observed yet.

The pool itself starts from a prior: the drafter's held-out acceptance (`DSparkConfig.heldout_acceptance`, measured
by `hf-dspark calibrate`) held as `INFORMED_PRIOR_WEIGHT` pseudo-trials per position, or, for a drafter never
calibrated, q = 0.5 held as one pseudo-trial, each position's estimate shrinking towards the one before it.
A request that does not draft in a round forgets part of its own evidence (`idle_decay`), so its estimate drifts
back to the pool: a few unlucky rejections cannot switch drafting off for the rest of a request whose drafter pays
on average, while a request that stays bad is re-tried only every several rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .cost_correction import AcceptanceCorrection, CostCorrection


@dataclass
class AcceptanceMemory:
    """Pooled decayed counts `[γ]` over every observed row (the prior of new requests), the probe schedule and the
    measured round costs (`CostCorrection`) and how far its drafting rounds' forecasts ran above what was accepted
    (`AcceptanceCorrection`), kept across calls through a caller-owned
    `hf_dspark.scheduling.PolicyMemory`.

    The probe schedule: `probe_interval`, rounds between probes within the probe budget; `futile_probes`, probes in a
    row after which drafting still did not pay (each doubles the wait for the next); `probe_verdict_due`, a probe
    ran and the next plan has not yet said whether it found drafts that pay.
    """

    successes: torch.Tensor
    trials: torch.Tensor
    rounds_since_probe: int = 0
    probe_interval: int = 0
    futile_probes: int = 0
    probe_verdict_due: bool = False
    costs: CostCorrection = field(default_factory=CostCorrection)
    acceptance: AcceptanceCorrection = field(default_factory=AcceptanceCorrection)

    @classmethod
    def empty(cls, block_size: int) -> AcceptanceMemory:
        return cls(torch.zeros(block_size, dtype=torch.float64), torch.zeros(block_size, dtype=torch.float64))

    @property
    def observed(self) -> bool:
        return self.trials.tolist()[0] > 0


INFORMED_PRIOR_WEIGHT = 8.0  # pseudo-trials of a measured held-out acceptance in the pool
PRIOR_CLIP = 0.02  # prior rates are clipped to [PRIOR_CLIP, 1 − PRIOR_CLIP]


def heldout_acceptance(drafter: Any, greedy: bool) -> list[float] | None:
    """The drafter's held-out conditional acceptance for this decoding mode (`DSparkConfig.acceptance_prior`), or
    None for drafters without one (never calibrated, or model-free)."""
    prior = getattr(getattr(drafter, "config", None), "acceptance_prior", None)
    return prior(greedy) if callable(prior) else None


def observed_positions(
    verify_len: torch.Tensor, accepted: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(observed, accepted) bool `[R, γ]`: position j (1-based j = index + 1) is observed iff j ≤ min(m + 1, ℓ)."""
    seen, kept = _observed_positions(host_array(verify_len, np.int64), host_array(accepted, np.int64), block_size)
    return torch.from_numpy(seen), torch.from_numpy(kept)


def _observed_positions(verify_len: np.ndarray, accepted: np.ndarray, block_size: int) -> tuple[np.ndarray, ...]:
    """`observed_positions` on host arrays."""
    positions = np.arange(1, block_size + 1)[None, :]
    seen = positions <= np.minimum(accepted + 1, verify_len)[:, None]
    return seen, positions <= accepted[:, None]


def row_observed_positions(verify_len: int, accepted: int, block_size: int) -> tuple[list[bool], list[bool]]:
    """`observed_positions` of one row on host ints: (observed, accepted) `[γ]` as Python bools."""
    reach = min(accepted + 1, verify_len)
    positions = range(1, block_size + 1)
    return [j <= reach for j in positions], [j <= accepted for j in positions]


def host_array(values: Any, dtype) -> np.ndarray:
    """`values` (a tensor, anywhere, or a sequence) as a host numpy array of `dtype` (a CPU tensor is not copied
    when it has the dtype already)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


@dataclass
class AcceptanceTracker:
    """Per-request conditional acceptance counts; `survival(rows)` gives the lagged â `[R, γ]`.

    Args:
        block_size: γ.
        memory: pooled counts shared with later calls (updated in place).
        decay: each new observation of a position multiplies the old counts by this (a window of ≈ 1/(1 − decay)).
        prior_weight: pseudo-trials w of the pooled prior in each request's estimate.
        prior: the pool's prior: one q for every position (each position then shrinks towards the estimate of the
            one before it), or γ conditional rates, e.g. the drafter's held-out acceptance.
        pool_prior_weight: pseudo-trials of `prior` in the pool.
        pool_decay: per-round decay of the pooled counts.
        idle_decay: a request's counts are multiplied by this in each round it does not draft.
    """

    block_size: int
    memory: AcceptanceMemory
    decay: float = 0.8
    prior_weight: float = 2.0
    prior: float | list[float] = 0.5
    pool_prior_weight: float = 1.0
    pool_decay: float = 0.95
    idle_decay: float = 0.85
    _slots: dict[Any, int] = field(default_factory=dict, repr=False)
    _free_slots: list[int] = field(default_factory=list, repr=False)  # cleared by `forget`, given to new rows
    _counts: np.ndarray | None = field(default=None, repr=False)  # [slots + 1, 2, γ]: successes, trials (host)
    version: int = field(default=0, repr=False)  # bumped whenever an estimate changes (cached decisions key on it)
    relaxations: int = field(default=0, repr=False)  # the bumps of `version` that were idle decays (`_relax`)
    _pool_version: int = field(default=0, repr=False)  # bumped when the pooled counts change
    _pooled: tuple[int, np.ndarray] | None = field(default=None, repr=False)
    _centres: list[float] = field(default_factory=list, repr=False)  # γ prior rates, clipped (informed prior)
    _evidence: dict[int, float] = field(default_factory=dict, repr=False)  # slot -> its largest trial count
    _last_slots: tuple[list[Any], np.ndarray] | None = field(default=None, repr=False)  # rows -> their slots

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0 or not 0.0 <= self.idle_decay <= 1.0:
            raise ValueError("AcceptanceTracker needs 0 <= decay < 1 and 0 <= idle_decay <= 1.")
        if self.prior_weight <= 0 or self.pool_prior_weight <= 0:
            raise ValueError("AcceptanceTracker needs prior_weight > 0 and pool_prior_weight > 0.")
        rates = [self.prior] if isinstance(self.prior, (int, float)) else list(self.prior)
        if len(rates) not in (1, self.block_size) or any(not 0.0 <= q <= 1.0 for q in rates):
            raise ValueError(
                f"AcceptanceTracker prior must be one q or {self.block_size} rates in [0, 1], got {self.prior}."
            )
        # a prior rate of exactly 0 would never let the position be verified, hence never corrected
        self._centres = [min(max(float(q), PRIOR_CLIP), 1.0 - PRIOR_CLIP) for q in rates]
        self._counts = np.zeros((1, 2, self.block_size))  # slot 0: never observed

    def observed(self, row: Any) -> bool:
        return row in self._slots

    def pooled(self) -> torch.Tensor:
        """q_pool `[γ]`: the pooled conditional acceptance. With one prior q, each position's prior is the estimate
        of the position before it (`prior` for the first): a position never reached (censored after fully accepted
        prefixes) inherits its predecessor's rate, so good drafts earn long ℓ quickly. With γ prior rates, each
        position shrinks towards its own rate (clipped to [`PRIOR_CLIP`, 1 − `PRIOR_CLIP`])."""
        return torch.from_numpy(self._host_pooled().copy())

    def _host_pooled(self) -> np.ndarray:
        """`pooled` as a host array, recomputed only when the pooled counts changed."""
        if self._pooled is not None and self._pooled[0] == self._pool_version:
            return self._pooled[1]
        chained = len(self._centres) == 1
        weight, previous, rates = self.pool_prior_weight, self._centres[0], []
        for j, (succ, trials) in enumerate(zip(self.memory.successes.tolist(), self.memory.trials.tolist())):
            centre = previous if chained else self._centres[j]
            previous = (succ + weight * centre) / (trials + weight)
            rates.append(previous)
        self._pooled = (self._pool_version, np.array(rates, dtype=np.float64))
        return self._pooled[1]

    def _slot_index(self, rows: list[Any], create: bool) -> np.ndarray:
        """Each row's slot in `_counts` (0: never observed; `create` gives new rows one). The last answer is kept
        for the same rows until a slot is added or cleared (a round plans and observes the same rows: one look-up
        per row, not two). The array is read-only to callers."""
        cached = self._last_slots
        if cached is not None and cached[0] == rows and (not create or cached[1].all()):
            return cached[1]
        slots = self._slots
        if create:
            for row in rows:
                if row not in slots:  # slots 1..len(slots) + len(free) are taken or free: never a live row's
                    slots[row] = self._free_slots.pop() if self._free_slots else len(slots) + 1
            needed = len(slots) + 1
            if needed > self._counts.shape[0]:
                grown = np.zeros((max(needed, 2 * self._counts.shape[0]), 2, self.block_size))
                grown[: self._counts.shape[0]] = self._counts
                self._counts = grown
        index = np.array([slots.get(row, 0) for row in rows], dtype=np.int64)
        self._last_slots = (list(rows), index)
        return index

    def host_conditional(self, rows: list[Any]) -> np.ndarray:
        """`conditional` as a host float64 array (what the planner computes with: numpy's per-call cost is a
        fraction of torch's on arrays this small)."""
        counts = self._counts[self._slot_index(rows, create=False)]
        return (counts[:, 0] + self.prior_weight * self._host_pooled()) / (counts[:, 1] + self.prior_weight)

    def idle_ceiling(self, rows: list[Any]) -> np.ndarray:
        """An upper bound `[R, γ]` on every value `host_conditional(rows)` can take from now on through idle decays
        alone (no observation, no `forget`). A decay scales a row's successes s and trials t alike, and
        q̂ = (s·x + w·q_pool) / (t·x + w) is monotone in the scale x (the sign of its derivative is that of
        s − t·q_pool), so as x shrinks q̂ moves from its current value towards q_pool and never beyond either:
        the bound is the larger of the two, raised by a relative 1e-9 that covers the rounding of decayed counts."""
        return np.maximum(self.host_conditional(rows), self._host_pooled()) * (1.0 + 1e-9)

    def conditional_one(self, row: Any) -> list[float]:
        """`host_conditional([row])[0]` as Python floats, computed in the same order."""
        successes, trials = self._counts[self._slots.get(row, 0)].tolist()
        weight = self.prior_weight
        return [(s + weight * p) / (t + weight) for s, t, p in zip(successes, trials, self._host_pooled().tolist())]

    def conditional(self, rows: list[Any]) -> torch.Tensor:
        """q̂ `[R, γ]` (float64, CPU): each row's conditional acceptance from its own counts and the pooled prior."""
        return torch.from_numpy(self.host_conditional(rows))

    def host_survival(self, rows: list[Any]) -> np.ndarray:
        """`survival` as a host float64 array."""
        return np.cumprod(self.host_conditional(rows), axis=-1)

    def survival(self, rows: list[Any]) -> torch.Tensor:
        """â `[R, γ]` (float64, CPU) for `rows`: the running product of `conditional`."""
        return torch.from_numpy(self.host_survival(rows))

    def observe(self, rows: list[Any], verify_len: torch.Tensor, accepted: torch.Tensor) -> None:
        """Record one round: row i verified `verify_len[i]` drafts and kept `accepted[i]`; rows with ℓ = 0 observe
        nothing and forget part of their evidence (`idle_decay`). `verify_len` / `accepted`: `[R]` tensors or host
        ints."""
        lengths = verify_len.tolist() if isinstance(verify_len, torch.Tensor) else list(verify_len)
        idle = [row for row, length in zip(rows, lengths) if length == 0] if 0 in lengths else []
        self._relax(idle)
        if len(idle) == len(rows):
            return  # a plain-decoding round observes nothing
        if len(rows) == 1:
            self._observe_one(rows[0], lengths[0], int(host_array(accepted, np.int64)[0]))
            return
        verify_len, accepted = np.array(lengths, dtype=np.int64), host_array(accepted, np.int64)
        if idle:  # only the drafting rows observe anything (the others' positions are all unobserved)
            drafted = np.flatnonzero(verify_len > 0)
            rows, verify_len, accepted = [rows[i] for i in drafted.tolist()], verify_len[drafted], accepted[drafted]
        self.version += 1
        self._pool_version += 1
        seen, kept = _observed_positions(verify_len, accepted, self.block_size)
        seen_f, kept_f = seen.astype(np.float64), kept.astype(np.float64)
        slots = self._slot_index(rows, create=True)
        decay = np.where(seen, self.decay, 1.0)
        counts = self._counts[slots] * decay[:, None, :] + np.stack([kept_f, seen_f], axis=1)
        self._counts[slots] = counts
        self._evidence.update(zip(slots.tolist(), counts[:, 1].max(axis=-1).tolist()))
        pool = np.where(seen.any(axis=0), self.pool_decay, 1.0)
        memory = self.memory
        memory.successes = torch.from_numpy(host_array(memory.successes, np.float64) * pool + kept_f.sum(axis=0))
        memory.trials = torch.from_numpy(host_array(memory.trials, np.float64) * pool + seen_f.sum(axis=0))

    def _observe_one(self, row: Any, length: int, accepted: int) -> None:
        """`observe` of a single drafting row on Python floats: the same IEEE operations in the same order as the
        array path, without its per-call overhead."""
        self.version += 1
        self._pool_version += 1
        slot = int(self._slot_index([row], create=True)[0])
        seen, kept = row_observed_positions(length, accepted, self.block_size)
        kept = [float(k) for k in kept]
        successes, trials = self._counts[slot].tolist()
        successes = [c * (self.decay if s else 1.0) + k for c, s, k in zip(successes, seen, kept)]
        trials = [c * (self.decay if s else 1.0) + float(s) for c, s in zip(trials, seen)]
        self._counts[slot] = (successes, trials)
        self._evidence[slot] = max(trials)
        memory, pool = self.memory, [self.pool_decay if s else 1.0 for s in seen]
        pooled = host_array(memory.successes, np.float64).tolist()
        memory.successes = torch.tensor([c * d + k for c, d, k in zip(pooled, pool, kept)], dtype=torch.float64)
        pooled = host_array(memory.trials, np.float64).tolist()
        memory.trials = torch.tensor([c * d + float(s) for c, d, s in zip(pooled, pool, seen)], dtype=torch.float64)

    def _relax(self, idle: list[Any]) -> None:
        """Multiply the counts of observed rows that did not draft by `idle_decay` (their estimates drift back to
        the pool). Rows never observed have no counts, and rows whose evidence is already forgotten (every trial
        count ≤ 1e-3, tracked on the host in `_evidence`) are left alone; a change bumps `version` (cached decisions
        expire)."""
        if self.idle_decay == 1.0 or not idle:
            return
        evidence, slots = self._evidence, self._slots
        live = [slots[row] for row in idle if evidence.get(slots.get(row, 0), 0.0) > 1e-3]
        if not live:
            return
        if len(live) == 1:  # one row (batch 1): a view, the same products without a gather and a scatter
            self._counts[live[0]] *= self.idle_decay
        else:
            self._counts[np.array(live, dtype=np.int64)] *= self.idle_decay
        for slot in live:  # max(c · d) = max(c) · d exactly: the mirror stays exact
            evidence[slot] *= self.idle_decay
        self.version += 1
        self.relaxations += 1

    def forget(self, rows: list[Any]) -> None:
        """Rows that left: their slots are cleared and given to the next new rows (memory stays bounded by the rows
        in flight)."""
        self._last_slots = None
        for row in rows:
            slot = self._slots.pop(row, None)
            if slot is not None:
                self._counts[slot] = 0.0
                self._evidence.pop(slot, None)
                self._free_slots.append(slot)
                self.version += 1
