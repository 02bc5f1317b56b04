"""The hybrid drafter's lagged per-source scores and what they mean for scheduling: pure functions on host values.

A source's score is an exponential moving average of its agreement, the leading tokens of a proposal that the
target went on to commit; `choose_source` picks each row's source by it. `resolved_agreement` tells when that count
is final. The lookup's resolved agreements also fill per-position decayed counts (`observe_agreement`), from which
`forecast_conditional` gives the conditional acceptance the scheduler plans a lookup row with. All of them read
only committed tokens and earlier rounds, never this round's drafts (the hybrid stays lossless).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..scheduling.acceptance import row_observed_positions

DSPARK, LOOKUP = 0, 1
LOOKUP_PRIOR = 0.5  # a lookup row's conditional acceptance per position before any proposal of it is resolved
LOOKUP_PRIOR_WEIGHT = 2.0  # pseudo-observations of that prior per position
LOOKUP_DECAY = 0.8  # each new observation of a position multiplies its older counts by this


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


def observe_agreement(
    successes: list[float], trials: list[float], agreement: int, decay: float = LOOKUP_DECAY
) -> tuple[list[float], list[float]]:
    """One resolved proposal of γ drafts whose first `agreement` (m) the target committed, in a row's decayed
    per-position counts `[γ]` (host floats): position j (1-based) is observed iff j ≤ min(m + 1, γ), accepted iff
    j ≤ m (`scheduling.acceptance.row_observed_positions` of a verified round with ℓ = γ); an observed position's
    older counts are multiplied by `decay`. Returns the new (successes, trials)."""
    seen, kept = row_observed_positions(len(trials), agreement, len(trials))
    successes = [c * decay + float(k) if s else c for c, s, k in zip(successes, seen, kept)]
    trials = [c * decay + 1.0 if s else c for c, s in zip(trials, seen)]
    return successes, trials


def forecast_conditional(
    successes: list[float], trials: list[float], prior: float = LOOKUP_PRIOR, weight: float = LOOKUP_PRIOR_WEIGHT
) -> list[float]:
    """q̂_j = (successes_j + w·prior) / (trials_j + w) `[γ]`: the conditional acceptance of a row's next lookup
    drafts at each position, from its decayed counts (`observe_agreement`) and `weight` pseudo-observations of
    `prior`. Its running product is the forecast prefix survival the scheduler plans the row with."""
    return [(s + weight * prior) / (t + weight) for s, t in zip(successes, trials)]


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
