"""The DSpark round, written once for `generate` (`loop.DSparkLoop`) and the serving engine (`engine.DSparkEngine`).

One round for the running rows: plan (which rows draft; the "auto" policy may choose none) → propose → choose
ℓ_r → one ragged target forward → verify → commit (the caller's per-row callback: stopping criteria, EOS,
budgets, streaming) → extend the drafter's context with the committed tokens' tapped target features. Rounds
that do not draft only queue their features (`RoundBatch.pending`); the queue reaches the drafter in one
`extend_context` call before its next proposal (or once `max_pending` slots wait), so a run of plain-decoding
rounds pays one drafter context update instead of one per round, and the drafter sees the same context (up to
floating-point rounding: one batched projection instead of several).
Observers (`RoundObserver.on_round`) receive a `RoundRecord` per round; nothing is written onto the drafter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..verification import VerificationResult, verify_greedy, verify_sampling
from .cost_policy import DraftPlan
from .drafting import draft_logits_processor, feature_layers
from .packed_linear import PackedLinears
from .policy import ScheduleRecord, VerificationPolicy
from .processors import RowProcessors
from .target_cache import RaggedTargetCache

# (active index a, tokens to commit, processed scores [n, V], raw logits [n, V]) -> how many were kept
CommitFn = Callable[[int, list[int], torch.Tensor, torch.Tensor], int]


@dataclass
class RoundRecord:
    """What one round did. Lists are per active row, in `rows` order.

    rows: the caller's row ids (batch index in `generate`, request id in the engine); verify_len: ℓ_r; accepted:
    drafts verification accepted; committed: tokens actually kept (EOS / budgets may cut); drafted: rows that ran
    the drafter (0: a plain-decoding round); probe: the round refreshed the "auto" policy's estimates;
    schedule: the policy's τ̂ / Θ̂; confidence_logits: `[A, γ]` raw confidence logits (logit(c_k) for drafters
    that give only calibrated c_k; NaN for rows that did not draft) or None; *_seconds: wall time of the
    policy's decisions, the drafter (with its queued context update), and the target forward with verification
    and commit.
    """

    rows: list[Any]
    verify_len: list[int]
    accepted: list[int]
    committed: list[int]
    drafted: int
    probe: bool = False
    schedule: ScheduleRecord = field(default_factory=ScheduleRecord)
    confidence_logits: torch.Tensor | None = None
    policy_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0


class RoundObserver(Protocol):
    def on_round(self, record: RoundRecord) -> None: ...


@dataclass
class RoundBatch:
    """The running rows' state between rounds: ids, anchors `[A]`, the ragged target cache and the draft cache.

    pending: context updates not yet given to the drafter, in order: (features `[A, n, ·]` or None, valid `[A, n]`).
    """

    rows: list[Any]
    anchor: torch.Tensor
    target_cache: RaggedTargetCache
    draft_cache: Any | None = None
    pending: list[tuple[torch.Tensor | None, torch.Tensor]] = field(default_factory=list)

    def keep(self, keep: Sequence[int]) -> None:
        """Keep the active positions `keep` (finished rows leave)."""
        index = torch.tensor(list(keep), dtype=torch.long, device=self.anchor.device)
        self.rows = [self.rows[a] for a in keep]
        self.anchor = self.anchor.index_select(0, index)
        self.target_cache.select_rows(index)
        if self.draft_cache is not None:
            self.draft_cache = self.draft_cache.select_rows(index)
        self.pending = [(None if f is None else f.index_select(0, index), v.index_select(0, index))
                        for f, v in self.pending]

    def extend(self, other: RoundBatch) -> None:
        """Append the rows of `other` (newly admitted requests); queued updates get invalid slots for them."""
        if other.pending:
            raise ValueError("a batch with queued context updates cannot join another; flush it first.")
        self.rows += other.rows
        self.anchor = torch.cat([self.anchor, other.anchor])
        self.target_cache.add_rows(other.target_cache)
        if self.draft_cache is not None:
            self.draft_cache = type(self.draft_cache).concat([self.draft_cache, other.draft_cache])
        added = len(other.rows)
        self.pending = [(None if f is None else torch.cat([f, f.new_zeros(added, *f.shape[1:])]),
                         torch.cat([v, v.new_zeros(added, v.shape[1])])) for f, v in self.pending]

    def pending_slots(self) -> int:
        return sum(int(v.shape[1]) for _, v in self.pending)

    def flush(self, drafter) -> None:
        """Give the queued context updates to `drafter` in one `extend_context` call (padding is skipped)."""
        if not self.pending:
            return
        features = [f for f, _ in self.pending]
        merged = None if any(f is None for f in features) else torch.cat(features, dim=1)
        drafter.extend_context(self.draft_cache, merged, torch.cat([v for _, v in self.pending], dim=1))
        self.pending = []


def _scatter(values: torch.Tensor, index: torch.Tensor | None, rows: int, fill: float | int = 0) -> torch.Tensor:
    """Rows of `values` placed at `index` of a `[rows, ...]` tensor filled with `fill` (index None: as is)."""
    if index is None:
        return values
    out = values.new_full((rows, *values.shape[1:]), fill)
    return out.index_copy(0, index.to(values.device), values)


class RoundKernel:
    """Runs rounds for one target, drafter (None: plain decoding) and policy.

    Args:
        target: the target causal LM.
        drafter: a `DraftModel` (`hf_dspark.generation.drafting`), or None to decode plainly every round.
        policy: the `VerificationPolicy` (ignored without a drafter).
        processors: the logits processing both the drafts and the target's scores get (`RowProcessors`).
        do_sample: speculative sampling instead of greedy verification.
        observers: called with every round's `RoundRecord`.
        max_pending: slots of queued context updates (plain rounds) after which they reach the drafter anyway.
        packs: the target's packed linear weights for the verification forwards (`packed_linear`), or None.
    """

    def __init__(self, target, drafter, policy: VerificationPolicy | None, processors: RowProcessors,
                 do_sample: bool, observers: Sequence[RoundObserver] = (), max_pending: int = 64,
                 packs: PackedLinears | None = None) -> None:
        self.target, self.drafter, self.policy = target, drafter, policy
        self.packs = packs
        self.processors, self.do_sample = processors, do_sample
        self.observers = list(observers)
        self.max_pending = max_pending
        self.taps = feature_layers(drafter) if drafter is not None else []

    def start(self, rows: list[Any], anchor: torch.Tensor, target_cache: RaggedTargetCache,
              features: torch.Tensor | None, valid: torch.Tensor) -> RoundBatch:
        """A batch after prefill: the drafter's context gets the prompt's features (`valid` `[R, L]`)."""
        draft_cache = None
        if self.drafter is not None:
            draft_cache = self.drafter.init_cache(len(rows))
            self.drafter.extend_context(draft_cache, features, valid)
        return RoundBatch(list(rows), anchor, target_cache, draft_cache)

    # ------------------------------------------------------------------ one round
    def step(self, batch: RoundBatch, histories: Sequence[torch.Tensor], cap: torch.Tensor,
             commit: CommitFn) -> RoundRecord:
        """One round for every row of `batch`; cap `[A]`: the most drafts row a may verify (budget − 1)."""
        start = time.perf_counter()
        if self.drafter is None:
            plan = DraftPlan(rows=cap[:0].long())
        else:  # a drafter whose rows cost differently (a hybrid's lookup rows) says so before the plan
            row_costs = getattr(self.drafter, "row_draft_costs", None)
            shares = None if row_costs is None else row_costs(batch.draft_cache, histories)
            plan = self.policy.plan(batch.rows, cap, shares)
        planned = time.perf_counter()
        drafts, draft_probs, verify_len, record = self._draft(batch, histories, cap, plan)
        drafted = time.perf_counter()
        record.policy_seconds += planned - start
        steps = 1 + int(verify_len.max()) if verify_len.numel() else 1
        drafts = drafts[:, : steps - 1]
        inputs = torch.cat([batch.anchor[:, None], drafts], dim=1)
        input_valid = torch.arange(steps, device=inputs.device)[None, :] <= verify_len[:, None]
        out = batch.target_cache.forward(self.target, inputs, input_valid, self.taps, packs=self.packs)
        scores = self.processors.apply_positions(batch.rows, histories, drafts, out.logits, verify_len + 1)
        result = self._verify(drafts, draft_probs, scores, verify_len, steps)
        accepted = result.num_accepted
        # one device-to-host transfer: ℓ, accepted counts, next tokens and drafts of every row
        host = torch.cat([verify_len[:, None], accepted[:, None], result.next_token[:, None], drafts], dim=1).tolist()
        for a, (_, m, next_token, *row_drafts) in enumerate(host):
            tokens = [*row_drafts[:m], next_token]
            record.committed.append(commit(a, tokens, scores[a, : m + 1], out.logits[a, : m + 1]))
        kept_slots = 1 + accepted
        batch.target_cache.commit_last(steps, kept_slots)
        if self.drafter is not None:  # every round, drafted or not: the context stays complete
            valid = torch.arange(steps, device=inputs.device)[None, :] < kept_slots[:, None]
            batch.pending.append((out.features, valid))
            if record.drafted or batch.pending_slots() >= self.max_pending:
                batch.flush(self.drafter)
            # the host copies: the policy's bookkeeping lives on the host
            self.policy.observe(batch.rows, torch.tensor([row[0] for row in host]),
                                torch.tensor([row[1] for row in host]))
        batch.anchor = result.next_token
        record.verify_len, record.accepted = [row[0] for row in host], [row[1] for row in host]
        finished = time.perf_counter()
        record.verify_seconds = finished - drafted
        if self.drafter is not None:
            self.policy.observe_round(record)  # the cost correction: policy time too
            record.policy_seconds += time.perf_counter() - finished
        for observer in self.observers:
            observer.on_round(record)
        return record

    def _draft(self, batch: RoundBatch, histories, cap: torch.Tensor, plan: DraftPlan):
        """Propose for the planned rows and choose ℓ: (drafts `[A, γ']`, draft_probs or None, verify_len `[A]`,
        a record with the policy's share of the time)."""
        rows, device = len(batch.rows), batch.anchor.device
        verify_len = torch.zeros(rows, dtype=torch.long, device=device)
        record = RoundRecord(list(batch.rows), [], [], [], drafted=0, probe=plan.probe)
        if not plan.drafts:
            return batch.anchor.new_zeros(rows, 0), None, verify_len, record
        proposed_at = time.perf_counter()  # the queued context update counts as drafting time
        batch.flush(self.drafter)
        index = plan.rows if plan.rows is not None and plan.rows.numel() < rows else None
        sub_rows = batch.rows if index is None else [batch.rows[i] for i in index.tolist()]
        sub_hist = list(histories) if index is None else [histories[i] for i in index.tolist()]
        cache = batch.draft_cache if index is None else batch.draft_cache.select_rows(index.to(device))
        anchor = batch.anchor if index is None else batch.anchor.index_select(0, index.to(device))
        proposal = self.drafter.propose(
            anchor, cache, do_sample=self.do_sample, row_ids=sub_rows, histories=sub_hist,
            logits_processor=draft_logits_processor(self.processors, sub_rows, sub_hist),
        )
        chosen_at = time.perf_counter()
        sub_cap = cap if index is None else cap.index_select(0, index.to(cap.device))
        sub_len = self.policy(proposal, sub_cap)
        record.policy_seconds = time.perf_counter() - chosen_at
        record.draft_seconds = chosen_at - proposed_at
        record.drafted = len(sub_rows)
        record.schedule = self.policy.last_schedule
        logits = proposal.confidence_logits
        if logits is None and proposal.confidence is not None:  # drafters that only give calibrated c_k
            logits = torch.logit(proposal.confidence.float().clamp(1e-6, 1 - 1e-6))
        if logits is not None:
            record.confidence_logits = _scatter(logits, index, rows, float("nan"))
        drafts = _scatter(proposal.draft_ids, index, rows)
        probs = None
        if self.do_sample:
            probs = _scatter(proposal.draft_probs[:, : int(sub_len.max())], index, rows)
        return drafts, probs, _scatter(sub_len, index, rows), record

    def _verify(self, drafts, draft_probs, scores, verify_len, steps) -> VerificationResult:
        if self.do_sample:
            probs = draft_probs[:, : steps - 1] if draft_probs is not None else scores[:, :0]
            return verify_sampling(drafts, probs, torch.softmax(scores, dim=-1), verify_len)
        return verify_greedy(drafts, scores.argmax(dim=-1), verify_len)
