"""Pure bookkeeping of offline accepted length: τ, position-wise acceptance, threshold sweep, calibration data.

The `evaluate` metric modules in `eval/metrics/` (`accepted_length`, `position_acceptance`) compute with these.

Every generated row is stored as a list of rounds `[ℓ, m, c]`: ℓ = draft tokens verified, m = drafts accepted,
c = tokens committed (accepted drafts + the correction/bonus token, cut where the row stopped). A round whose
row stopped on an accepted draft (EOS inside the block) has c == m and is *censored*: positions 1..m are known
accepted, later positions unknown. Otherwise c == m + 1. With the scheduler off (ℓ = γ) these counts give:

- τ = Σ c / Σ rounds (the paper's accepted length, bonus token included), and without it Σ min(m, c) / Σ rounds;
- P(position k accepted | positions < k accepted) = #(m ≥ k) / #(m ≥ k − 1) over rounds that verified k;
- a static confidence threshold t offline: ℓ_t = leading positions with survival ≥ t (at most ℓ), and the run
  with ℓ_t would have accepted min(m, ℓ_t) (the same verification randomness decides the shared prefix).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

Round = Sequence[int]  # [verify_len ℓ, accepted drafts m, committed c]

DEFAULT_THRESHOLDS = [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]


def leading_matches(drafts: Sequence[int], committed: Sequence[int]) -> int:
    """How many leading drafts equal the committed tokens at the same place (= accepted drafts m).

    Exact because a rejected draft is never re-emitted at its position: greedy rejects only when the target's
    argmax differs, and the residual norm(max(0, p_target − p_draft)) is zero at a rejected token.
    """
    count = 0
    for draft, token in zip(drafts, committed):
        if int(draft) != int(token):
            break
        count += 1
    return count


def accepted_length(rounds: Iterable[Round]) -> float | None:
    """τ = Σ c / number of rounds (bonus token included); None without rounds."""
    committed = [r[2] for r in rounds]
    return sum(committed) / len(committed) if committed else None


def accepted_length_without_bonus(rounds: Iterable[Round]) -> float | None:
    """τ without the bonus token = Σ min(m, c) / number of rounds (accepted drafts that were committed, per round);
    None without rounds."""
    accepted = [min(r[1], r[2]) for r in rounds]
    return sum(accepted) / len(accepted) if accepted else None


def acceptance_rate(rounds: Iterable[Round]) -> float | None:
    """Accepted drafts / verified drafts; None when nothing was verified."""
    rounds = list(rounds)
    verified = sum(r[0] for r in rounds)
    return sum(min(r[1], r[0]) for r in rounds) / verified if verified else None


def conditional_acceptance(rounds: Iterable[Round], block_size: int) -> tuple[list[float | None], list[int]]:
    """P(position k accepted | positions < k accepted) for k = 1..γ, and how many rounds reached k.

    A round reaches position k when k ≤ ℓ, m ≥ k − 1 and (if censored) k ≤ m. Returns (probabilities with None
    where no round reached k, reach counts).
    """
    reached, accepted = [0] * block_size, [0] * block_size
    for verify_len, m, c in rounds:
        censored = c <= m
        for k in range(1, min(verify_len, block_size) + 1):
            if m < k - 1 or (censored and k > m):
                break
            reached[k - 1] += 1
            accepted[k - 1] += int(m >= k)
    probs = [a / n if n else None for a, n in zip(accepted, reached)]
    return probs, reached


def survival_from_logits(logits: torch.Tensor, temperatures: Sequence[float] | None = None) -> torch.Tensor:
    """a_k = ∏_{i≤k} σ(z_i / T_i) from raw confidence logits `[N, γ]` (T = 1 when `temperatures` is None)."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    temps = torch.ones(logits.shape[-1], dtype=torch.float64) if temperatures is None else torch.tensor(
        list(temperatures)[: logits.shape[-1]], dtype=torch.float64
    )
    return torch.cumprod(torch.sigmoid(logits / temps), dim=-1)


def threshold_sweep(rounds: Sequence[Round], survival: torch.Tensor,
                    thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> list[dict]:
    """Static confidence threshold replayed offline (paper Fig. 5).

    rounds: N rounds `[ℓ, m, c]` recorded at ℓ = γ; survival: `[N, γ]` prefix survival of the same rounds.
    For each t: ℓ_t = leading positions with survival ≥ t (≤ ℓ), accepted_t = min(m, ℓ_t). Returns one dict per
    threshold: threshold, mean_verified (ℓ_t per round), acceptance_rate (Σ accepted_t / Σ ℓ_t), tau
    (mean 1 + accepted_t).
    """
    if len(rounds) != survival.shape[0]:
        raise ValueError(f"{len(rounds)} rounds but survival has {survival.shape[0]} rows")
    if not rounds:
        return []
    table = torch.as_tensor([list(r) for r in rounds], dtype=torch.long)
    verify_len, accepted = table[:, 0], table[:, 1]
    out = []
    for t in thresholds:
        leading = torch.cumprod((survival >= t).to(torch.long), dim=-1).sum(dim=-1)
        ell = torch.minimum(leading, verify_len)
        acc = torch.minimum(accepted, ell)
        total = int(ell.sum())
        out.append({
            "threshold": float(t),
            "mean_verified": float(ell.float().mean()),
            "acceptance_rate": float(acc.sum()) / total if total else None,
            "tau": float((1 + acc).float().mean()),
        })
    return out


def survival_labels(rounds: Sequence[Round], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounds usable for calibration and their realised prefix survival.

    Returns (mask `[N]` of complete rounds: ℓ = γ and not censored, survived `[N, γ]` float: 1 where m ≥ k).
    """
    table = torch.as_tensor([list(r) for r in rounds], dtype=torch.long).reshape(-1, 3)
    complete = (table[:, 0] == block_size) & (table[:, 2] > table[:, 1])
    positions = torch.arange(1, block_size + 1)
    survived = (table[:, 1:2] >= positions[None, :]).to(torch.float64)
    return complete, survived


def macro_mean(values: Iterable[float | None]) -> float | None:
    """Mean of the values that are not None/NaN; None if there are none."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else None
