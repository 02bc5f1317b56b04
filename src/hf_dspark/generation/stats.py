"""Statistics of one DSpark `generate` call, reachable afterwards as `drafter.last_generation_stats`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DSparkGenerationStats:
    """Per-round, per-row record of a DSpark generation.

    Attributes:
        batch_size: rows in the call.
        block_size: γ drafted per row per round.
        policy: name of the verification-length policy.
        rounds: verification rounds run (target forwards after the prefill).
        verify_lens: per round, ℓ_r of every row active in that round (a dict row -> ℓ_r).
        accepted_lengths: per round, tokens committed by each active row (accepted drafts + the correction or
            bonus token: the paper's τ for that row and round), as a dict row -> τ.
        batch_tokens: per round, B = Σ_r (1 + ℓ_r), the tokens of that round's verification forward.
        draft_tokens_verified / draft_tokens_accepted: totals over all rows and rounds.
        prefill_tokens: tokens processed by the prefill forward.
        compactions: how often the target cache was compacted.
        draft_seconds / verify_seconds: wall time spent drafting (incl. scheduling) and verifying.
    """

    batch_size: int
    block_size: int
    policy: str
    rounds: int = 0
    verify_lens: list[dict[int, int]] = field(default_factory=list)
    accepted_lengths: list[dict[int, int]] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)
    draft_tokens_verified: int = 0
    draft_tokens_accepted: int = 0
    prefill_tokens: int = 0
    compactions: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    def record_round(self, rows: list[int], verify_len: list[int], accepted_drafts: list[int],
                     committed: list[int]) -> None:
        self.rounds += 1
        self.verify_lens.append(dict(zip(rows, verify_len)))
        self.accepted_lengths.append(dict(zip(rows, committed)))
        self.batch_tokens.append(sum(1 + v for v in verify_len))
        self.draft_tokens_verified += sum(verify_len)
        self.draft_tokens_accepted += sum(accepted_drafts)

    @property
    def mean_accepted_length(self) -> float:
        """τ: mean tokens committed per row per round, bonus token included."""
        values = [v for rnd in self.accepted_lengths for v in rnd.values()]
        return sum(values) / len(values) if values else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / verified draft tokens."""
        return self.draft_tokens_accepted / self.draft_tokens_verified if self.draft_tokens_verified else 0.0

    @property
    def mean_verify_len(self) -> float:
        values = [v for rnd in self.verify_lens for v in rnd.values()]
        return sum(values) / len(values) if values else 0.0

    def per_row_accepted_lengths(self, row: int) -> list[int]:
        return [rnd[row] for rnd in self.accepted_lengths if row in rnd]

    def summary(self) -> dict[str, float]:
        return {
            "rounds": self.rounds,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_verify_len": round(self.mean_verify_len, 4),
            "draft_tokens_verified": self.draft_tokens_verified,
            "draft_tokens_accepted": self.draft_tokens_accepted,
        }
