"""Statistics of one DSpark `generate` call, and the `return_dict_in_generate` output that carries them.

`DSparkGenerationStats` is a round observer (`on_round`). When the call ends, the loop returns them with its output
(`DSparkGenerateOutput.dspark_stats`) and hands them to the drafter (`DraftModel.record_generation`), which keeps
them as `drafter.last_generation_stats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..scheduling.records import RoundRecord, ScheduleRecord, resolve_schedules


@dataclass
class DSparkGenerateOutput(GenerateDecoderOnlyOutput):
    """The output of a DSpark `generate(..., return_dict_in_generate=True)` call: plain `generate`'s fields, field
    by field, and the call's `DSparkGenerationStats` as the attribute `dspark_stats`.

    `dspark_stats` is no dataclass field (a `ModelOutput`'s fields are its keys): the keys, `to_tuple()` and
    integer indexing stay exactly those of plain `generate`'s `GenerateDecoderOnlyOutput`.
    """

    dspark_stats = None  # set per output by `with_stats`; unannotated, so it is no field

    @classmethod
    def with_stats(cls, output: GenerateDecoderOnlyOutput, stats: DSparkGenerationStats) -> DSparkGenerateOutput:
        """`output`'s fields, with `stats` as `dspark_stats`."""
        result = cls(**output)
        result.dspark_stats = stats
        return result


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
        accepted_drafts: per round, drafts each active row got accepted by verification (dict row -> count; may
            exceed what was committed when EOS or `max_new_tokens` cut the row).
        expected_tokens / expected_throughput: per round, the policy's τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}) and
            Θ̂ = τ̂·SPS(B) for what it admitted (None without a confidence head / without a step curve); computed
            from `schedules` (the rounds' `ScheduleRecord`s) when first read, all rounds at once.
        record_confidence: keep `confidence_logits` (set from `generation_config.dspark_record_confidence`).
        confidence_logits: per round, the raw confidence-head logits `[A, γ]` (CPU), rows in the order of that
            round's `verify_lens` keys; empty unless `record_confidence`.
        draft_tokens_verified / draft_tokens_accepted: totals over all rows and rounds.
        prefill_tokens: tokens processed by the prefill forward.
        compactions: how often the target cache was compacted.
        max_cache_width: the widest the target KV cache got (slots, holes included).
        packed_weights: verification ran on oneDNN-packed linear weights (`packed_linear`).
        draft_seconds / verify_seconds: wall time spent drafting (incl. scheduling) and verifying.
        policy_seconds: wall time of the policy's decisions alone (included in draft_seconds).
        drafted_rows: per round, how many rows ran the drafter (0: the round decoded plainly).
        probes: rounds the "auto" policy drafted only to refresh its estimates.
        tree_nodes: per tree round (`dspark_tree_budget`), the drafts each active row verified (its tree's nodes
            beyond the anchor; dict row -> count); `batch_tokens` and `draft_tokens_verified` count those nodes.
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
    max_cache_width: int = 0
    packed_weights: bool = False
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accepted_drafts: list[dict[int, int]] = field(default_factory=list)
    schedules: list[ScheduleRecord] = field(default_factory=list, repr=False)
    record_confidence: bool = False
    confidence_logits: list[torch.Tensor] = field(default_factory=list, repr=False)
    policy_seconds: float = 0.0
    drafted_rows: list[int] = field(default_factory=list)
    probes: int = 0
    tree_nodes: list[dict[int, int]] = field(default_factory=list)

    @property
    def wants_confidence_logits(self) -> bool:
        """Round observer option: the rounds' confidence logits are kept only when recording them."""
        return self.record_confidence

    def on_round(self, record: RoundRecord) -> None:
        """Round observer: file one `RoundRecord`."""
        logits = record.confidence_logits
        if self.record_confidence and logits is None and record.drafted == 0:
            logits = torch.full((len(record.rows), self.block_size), math.nan)  # a plain-decoding round
        self.record_schedule(record.schedule, logits)
        self.record_round(record.rows, record.verify_len, record.accepted, record.committed, record.nodes_verified)
        self.drafted_rows.append(record.drafted)
        self.probes += int(record.probe)
        self.draft_seconds += record.draft_seconds + record.policy_seconds
        self.policy_seconds += record.policy_seconds
        self.verify_seconds += record.verify_seconds

    @property
    def expected_tokens(self) -> list[float | None]:
        resolve_schedules(self.schedules)
        return [schedule.expected_tokens for schedule in self.schedules]

    @property
    def expected_throughput(self) -> list[float | None]:
        resolve_schedules(self.schedules)
        return [schedule.expected_throughput for schedule in self.schedules]

    @property
    def skipped_rounds(self) -> int:
        """Rounds that decoded plainly, without the drafter's forward."""
        return sum(1 for count in self.drafted_rows if count == 0)

    def record_schedule(self, schedule: ScheduleRecord, confidence_logits: torch.Tensor | None = None) -> None:
        """Called once per round, right after the policy: its expectation, and the raw logits if recording."""
        self.schedules.append(schedule)
        if self.record_confidence:
            if confidence_logits is None:
                raise ValueError("dspark_record_confidence=True needs a drafter with a confidence head.")
            self.confidence_logits.append(confidence_logits.detach().float().cpu())

    def record_round(self, rows: list[int], verify_len: list[int], accepted_drafts: list[int],
                     committed: list[int], nodes_verified: list[int] | None = None) -> None:
        """File one round; nodes_verified: a tree round's drafts verified per row (they replace ℓ_r in the counts)."""
        self.rounds += 1
        if nodes_verified is not None:
            self.tree_nodes.append(dict(zip(rows, nodes_verified)))
        self.verify_lens.append(dict(zip(rows, verify_len)))
        self.accepted_lengths.append(dict(zip(rows, committed)))
        self.accepted_drafts.append(dict(zip(rows, accepted_drafts)))
        # host ints: Σ (1 + ℓ_r) = A + Σ ℓ_r exactly, without a generator per row
        verified = sum(verify_len if nodes_verified is None else nodes_verified)
        self.batch_tokens.append(len(verify_len) + verified)
        self.draft_tokens_verified += verified
        self.draft_tokens_accepted += sum(accepted_drafts)

    @staticmethod
    def _mean_over_rows(rounds: list[dict[int, int]]) -> float:
        values = [v for rnd in rounds for v in rnd.values()]
        return sum(values) / len(values) if values else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """τ: mean tokens committed per row per round, bonus token included."""
        return self._mean_over_rows(self.accepted_lengths)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / verified draft tokens."""
        return self.draft_tokens_accepted / self.draft_tokens_verified if self.draft_tokens_verified else 0.0

    @property
    def mean_verify_len(self) -> float:
        return self._mean_over_rows(self.verify_lens)

    @property
    def mean_tree_nodes(self) -> float:
        """Mean drafts verified per row and tree round (0.0 without tree rounds)."""
        return self._mean_over_rows(self.tree_nodes)

    @property
    def mean_batch_tokens(self) -> float:
        """Mean B per verification forward."""
        return sum(self.batch_tokens) / len(self.batch_tokens) if self.batch_tokens else 0.0

    def calibration_pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out pairs for STS from the recorded rounds: (confidence_logits `[N, γ]`, survived `[N, γ]`).

        One sample per (round, row) whose every position was verified (ℓ_r = γ); survived[:, k] = 1 iff k <
        accepted drafts (positions 0-based), the realised prefix survival. Needs `record_confidence`.
        """
        logits, labels = [], []
        positions = torch.arange(self.block_size)
        for round_logits, lens, accepted in zip(self.confidence_logits, self.verify_lens, self.accepted_drafts):
            keep = [(a, row) for a, row in enumerate(lens) if lens[row] == self.block_size]
            if keep:
                counts = torch.tensor([accepted[row] for _, row in keep])
                logits.append(round_logits[[a for a, _ in keep]])
                labels.append((positions[None, :] < counts[:, None]).float())
        if not logits:
            empty = torch.zeros(0, self.block_size)
            return empty, empty.clone()
        return torch.cat(logits), torch.cat(labels)

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
            "mean_batch_tokens": round(self.mean_batch_tokens, 4),
            "skipped_rounds": self.skipped_rounds,
            "probes": self.probes,
        }
