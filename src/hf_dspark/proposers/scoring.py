"""The hybrid drafter's lagged per-source scores and what they mean for scheduling: pure functions on host values.

A source's score is an exponential moving average of its agreement, the leading tokens of a proposal that the
target went on to commit. `resolved_agreement` tells when that count is final; `lookup_conditional` turns a mean
agreement into the per-position conditional acceptance the scheduler plans with; `choose_sources` picks each row's
source. All read only committed tokens and earlier rounds, never this round's drafts (the hybrid stays lossless).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

DSPARK, LOOKUP = 0, 1
CONDITIONAL_RANGE = (1e-3, 0.99)  # the lookup rows' conditional acceptance is kept inside this interval
_GRID_POINTS = 4097


def agreement(proposed: Sequence[int], committed: Sequence[int]) -> int:
    """How many leading tokens of `proposed` equal the tokens committed after them (the lagged score)."""
    count = 0
    for p, c in zip(proposed, committed):
        if p != c:
            break
        count += 1
    return count


def resolved_agreement(proposed: Sequence[int], committed: Sequence[int]) -> int | None:
    """`agreement` once the committed tokens decide it: after a mismatch, or once every proposed token has a
    committed one after it. None while all the tokens committed so far agree and fewer than `len(proposed)` are
    committed: the count may still grow. (Scoring such a proposal early would cap a source's score at the tokens
    committed per round, so a source verified with ℓ = 0, one token per round, could never score above 1.)"""
    count = agreement(proposed, committed)
    if count == len(committed) and count < len(proposed):
        return None
    return count


@lru_cache(maxsize=16)
def _agreement_grid(block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(q `[G]` on [0, 1], Σ_{j=1}^{γ} q^j `[G]`, increasing in q), the table `lookup_conditional` inverts."""
    rate = np.linspace(0.0, 1.0, _GRID_POINTS)
    powers = rate[:, None] ** np.arange(1, block_size + 1)[None, :]
    return rate, powers.sum(axis=1)


def lookup_conditional(mean_agreement: Sequence[float], block_size: int) -> list[float]:
    """Per row, the conditional acceptance q that a constant-rate model gives the mean agreement s:
    Σ_{j=1}^{γ} q^j = s (the expected accepted drafts of γ when each is accepted with probability q once the
    ones before it were), clipped to `CONDITIONAL_RANGE`.

    mean_agreement `[R]` (lagged mean agreements in 0..γ, host floats) -> `[R]` host floats. The prefix survival
    of a row's drafts is then q^j, whose sum over the γ drafts is its score (a flat q = s / γ would make it far
    smaller: s = 3 of 7 gives 0.75 instead of 3).
    """
    rate, expected = _agreement_grid(int(block_size))
    low, high = CONDITIONAL_RANGE
    solved = np.interp(np.asarray(mean_agreement, dtype=np.float64), expected, rate)
    return np.clip(solved, low, high).tolist()


def choose_source(
    match_length: int, lookup_score: float, dspark_score: float, min_match: int = 1, margin: float = 0.0
) -> int:
    """One row's source of this round's drafts: LOOKUP where the lookup matched (n-gram length ≥ `min_match`) and
    its lagged score beats DSpark's by more than `margin`, else DSPARK. Its inputs are all functions of the
    committed context and earlier rounds: never this round's drafts."""
    return LOOKUP if match_length >= min_match and lookup_score > dspark_score + margin else DSPARK


def choose_sources(
    match_lengths: torch.Tensor,
    lookup_score: torch.Tensor,
    dspark_score: torch.Tensor,
    min_match: int = 1,
    margin: float = 0.0,
) -> torch.Tensor:
    """`choose_source` of every row: match_lengths `[R]` (0: no match), lookup_score / dspark_score `[R]` lagged mean
    agreements -> `[R]` sources (a LongTensor on the host)."""
    rows = zip(match_lengths.tolist(), lookup_score.tolist(), dspark_score.tolist())
    return torch.tensor([choose_source(m, lk, ds, min_match, margin) for m, lk, ds in rows], dtype=torch.long)
