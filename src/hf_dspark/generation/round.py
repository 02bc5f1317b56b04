"""The DSpark round, written once for `generate` (`loop.DSparkLoop`) and the serving engine (`engine.DSparkEngine`).

One round for the running rows: plan (which rows draft; the "auto" policy may choose none) → propose → choose
ℓ_r → one ragged target forward → verify → commit (the caller's callback for all rows: stopping criteria, EOS,
budgets, streaming) → extend the drafter's context with the committed tokens' tapped target features. Rounds
that do not draft only queue their features (`RoundBatch.pending`); the queue reaches the drafter in one
`extend_context` call before its next proposal (or once `max_pending` slots wait), so a run of plain-decoding
rounds pays one drafter context update instead of one per round, and the drafter sees the same context (up to
floating-point rounding: one batched projection instead of several).
Observers (`RoundObserver.on_round`) receive a `RoundRecord` per round (both in `hf_dspark.scheduling.records`, so
the policies read rounds without importing the loop); nothing is written onto the drafter.

Host and device: budgets, ℓ_r, keep lists and histories' bookkeeping are host ints. What the host needs from the
device (accepted counts, next tokens, drafts) comes down in one packed copy per round (`transfer.download`);
host decisions go up without blocking (`transfer.upload`). A policy whose ℓ depends on this round's confidences
reads them once before the target forward (its shape depends on max ℓ); `fixed` and `auto` need no such read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ops.functional import greedy_token_ids
from ..ops.verification import VerificationResult, verify_greedy, verify_sampling
from ..scheduling.records import DraftPlan, RoundObserver, RoundRecord
from ..scheduling.verification_policy import VerificationPolicy
from ..target.packed_linear import PackedLinears
from ..target.ragged_cache import RaggedTargetCache
from ..transfer import download, upload
from .drafting import draft_logits_processor, extend_drafter_context, feature_layers
from .processors import RowProcessors

# (tokens to commit per active row, processed scores [A, T, V], raw logits [A, T, V]: row a's tokens were chosen at
# its first len(tokens[a]) positions) -> how many each row kept
CommitFn = Callable[[list[list[int]], torch.Tensor, torch.Tensor], list[int]]


@dataclass
class RoundBatch:
    """The running rows' state between rounds: ids, anchors `[A]`, the ragged target cache and the draft cache.

    pending: context updates not yet given to the drafter, in order: (features `[A, n, ·]` or None, valid `[A, n]`,
    each row's valid count as host ints); `queue` appends one and counts its slots.
    """

    rows: list[Any]
    anchor: torch.Tensor
    target_cache: RaggedTargetCache
    draft_cache: Any | None = None
    pending: list[tuple[torch.Tensor | None, torch.Tensor, list[int]]] = field(default_factory=list)
    _queued_slots: int = field(default=0, repr=False)

    def keep(self, keep: Sequence[int]) -> None:
        """Keep the active positions `keep` (finished rows leave): one upload of the host index."""
        keep = list(keep)
        host_index = torch.tensor(keep, dtype=torch.long)
        index = upload(keep, self.anchor.device)
        self.rows = [self.rows[a] for a in keep]
        self.anchor = self.anchor.index_select(0, index)
        self.target_cache.select_rows(index, keep)
        if self.draft_cache is not None:
            self.draft_cache = self.draft_cache.select_rows(host_index)
        self.pending = [(None if f is None else f.index_select(0, index.to(f.device)), v.index_select(0, index),
                         [c[a] for a in keep]) for f, v, c in self.pending]

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
                         torch.cat([v, v.new_zeros(added, v.shape[1])]), c + [0] * added) for f, v, c in self.pending]

    def queue(self, features: torch.Tensor | None, valid: torch.Tensor, counts: list[int]) -> None:
        """Queue one round's context update for the drafter (`flush` gives it the queue)."""
        self.pending.append((features, valid, counts))
        self._queued_slots += int(valid.shape[1])

    def pending_slots(self) -> int:
        """Slots of the queued context updates."""
        return self._queued_slots if self.pending else 0

    def flush(self, drafter, takes_counts: bool | None = None) -> None:
        """Give the queued context updates to `drafter` in one `extend_context` call (padding is skipped), with
        the host counts when it takes them (`DraftModel.accepts_host_counts`)."""
        if not self.pending:
            return
        if takes_counts is None:
            takes_counts = drafter.accepts_host_counts
        if len(self.pending) == 1:
            merged, valid, counts = self.pending[0]
        else:
            features = [f for f, _, _ in self.pending]
            merged = None if any(f is None for f in features) else torch.cat(features, dim=1)
            counts = [sum(row) for row in zip(*(c for _, _, c in self.pending))]
            valid = torch.cat([v for _, v, _ in self.pending], dim=1)
        extend_drafter_context(drafter, self.draft_cache, merged, valid, counts, takes_counts)
        self.pending, self._queued_slots = [], 0


def _scatter(values: torch.Tensor, index: torch.Tensor | None, rows: int, fill: float | int = 0) -> torch.Tensor:
    """Rows of `values` placed at `index` (on `values`' device) of a `[rows, ...]` tensor filled with `fill`
    (index None: as is)."""
    if index is None:
        return values
    out = values.new_full((rows, *values.shape[1:]), fill)
    return out.index_copy(0, index, values)


def _host_scatter(values: Sequence[int], index: Sequence[int] | None, rows: int) -> list[int]:
    """`_scatter` of host ints (fill 0)."""
    if index is None:
        return list(values)
    out = [0] * rows
    for i, value in zip(index, values):
        out[i] = int(value)
    return out


class _Picked(Sequence):
    """`[items[i] for i in index]`, each item read only when asked for (histories may be built on access)."""

    def __init__(self, items: Sequence, index: Sequence[int]) -> None:
        self.items, self.index = items, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.items[self.index[i]]


def _host_ints(values: Sequence[int] | torch.Tensor) -> list[int]:
    """Budgets as host ints (a device tensor is read once: pass host ints)."""
    return [int(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]


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
        self.takes_counts = drafter is not None and drafter.accepts_host_counts
        self.wants_confidence = any(getattr(o, "wants_confidence_logits", True) for o in self.observers)

    def start(self, rows: list[Any], anchor: torch.Tensor, target_cache: RaggedTargetCache,
              features: torch.Tensor | None, valid: torch.Tensor) -> RoundBatch:
        """A batch after prefill: the drafter's context gets the prompt's features (`valid` `[R, L]`)."""
        draft_cache = None
        if self.drafter is not None:
            draft_cache = self.drafter.init_cache(len(rows))
            self.drafter.extend_context(draft_cache, features, valid)
        return RoundBatch(list(rows), anchor, target_cache, draft_cache)

    # ------------------------------------------------------------------ one round
    def step(self, batch: RoundBatch, histories: Sequence[torch.Tensor], cap: Sequence[int] | torch.Tensor,
             commit: CommitFn) -> RoundRecord:
        """One round for every row of `batch`; cap `[A]` host ints: the most drafts row a may verify (budget − 1)."""
        start = time.perf_counter()
        cap = _host_ints(cap)
        if self.drafter is None:
            plan = DraftPlan(rows=torch.zeros(0, dtype=torch.long))
        else:  # a drafter whose rows cost differently (a hybrid's lookup rows) says so before the plan
            shares = self.drafter.row_draft_costs(batch.draft_cache, histories)  # None: every row costs alike
            acceptance = self.drafter.row_acceptance(batch.draft_cache)  # None: no forecast of its own
            plan = self.policy.plan(batch.rows, cap, shares, acceptance)
        planned = time.perf_counter()
        drafts, draft_probs, host_len, record = self._draft(batch, histories, cap, plan)
        drafted = time.perf_counter()
        record.policy_seconds += planned - start
        if max(host_len, default=0) == 0:  # nothing to verify: a plain decoding step
            out, accepted_host, next_token, valid = self._plain_round(batch, histories, commit, record)
        else:
            out, accepted_host, next_token, valid = self._verify_round(batch, histories, commit, record, drafts,
                                                                       draft_probs, host_len)
        if self.drafter is not None:  # every round, drafted or not: the context stays complete
            batch.queue(out.features, valid, [1 + m for m in accepted_host])
            if record.drafted or batch.pending_slots() >= self.max_pending:
                batch.flush(self.drafter, self.takes_counts)
            self.policy.observe(batch.rows, host_len, accepted_host)
            if record.drafted:
                record.schedule = self.policy.schedule()  # τ̂ pending: computed when read
        batch.anchor = next_token
        record.verify_len, record.accepted = host_len, accepted_host
        finished = time.perf_counter()
        record.verify_seconds = finished - drafted
        if self.drafter is not None:
            self.policy.observe_round(record)  # the cost correction: policy time too
            record.policy_seconds += time.perf_counter() - finished
        for observer in self.observers:
            observer.on_round(record)
        return record

    def _plain_round(self, batch: RoundBatch, histories, commit: CommitFn, record: RoundRecord):
        """A round without drafts: the anchors alone through the target, the next tokens picked from the processed
        scores as plain decoding picks them (what verifying zero drafts gives), one download, every slot kept.
        Returns (the forward's output, accepted drafts `[0] * A`, next tokens `[A]`, kept slots `[A, 1]`)."""
        rows, inputs = len(batch.rows), batch.anchor[:, None]
        valid = torch.ones(rows, 1, dtype=torch.bool, device=inputs.device)
        out = batch.target_cache.forward(self.target, inputs, valid, self.taps, packs=self.packs,
                                         host_input_counts=[1] * rows)
        scores = out.logits
        if not self.processors.is_empty:
            counts = torch.ones(rows, dtype=torch.long, device=inputs.device)
            scores = self.processors.apply_positions(batch.rows, histories, inputs[:, :0], scores, counts)
        last = scores[:, 0]
        if self.do_sample:  # `verify_sampling` without drafts: a draw from the target's distribution
            next_token = torch.multinomial(torch.softmax(last, dim=-1), 1).squeeze(1)
        else:
            next_token = greedy_token_ids(last)
        record.committed = list(commit([[token] for token in download(next_token)], scores, out.logits))
        batch.target_cache.commit_every(1, marked=True)
        return out, [0] * rows, next_token, valid

    def _verify_round(self, batch: RoundBatch, histories, commit: CommitFn, record: RoundRecord, drafts, draft_probs,
                      host_len: list[int]):
        """A round that verifies drafts: one ragged target forward, verification, one download, commit. Returns
        (the forward's output, accepted drafts per row, next tokens `[A]`, kept slots `[A, T]`)."""
        steps = 1 + max(host_len, default=0)
        drafts = drafts[:, : steps - 1]
        device = batch.anchor.device
        uniform = min(host_len, default=0) == steps - 1  # every row verifies all its drafts: no per-row budget to mask
        unmasked = uniform and not self.do_sample  # greedy verification then needs no ℓ tensor
        verify_len = None if unmasked and self.processors.is_empty else upload(host_len, device)
        inputs = torch.cat([batch.anchor[:, None], drafts], dim=1)
        if uniform:
            input_valid = torch.ones(inputs.shape, dtype=torch.bool, device=device)
        else:
            input_valid = torch.arange(steps, device=device)[None, :] <= verify_len[:, None]
        out = batch.target_cache.forward(self.target, inputs, input_valid, self.taps, packs=self.packs,
                                         host_input_counts=[1 + n for n in host_len])
        scores = out.logits
        if not self.processors.is_empty:
            scores = self.processors.apply_positions(batch.rows, histories, drafts, scores, verify_len + 1)
        result = self._verify(drafts, draft_probs, scores, None if unmasked else verify_len, steps)
        accepted_host, tokens = self._download(result.num_accepted, result.next_token, drafts)
        record.committed = list(commit(tokens, scores, out.logits))
        if min(accepted_host, default=0) == steps - 1:  # every row kept every slot (so its ℓ was the longest)
            batch.target_cache.commit_every(steps, marked=True)  # its inputs were all valid: so are the slots
            valid = input_valid
        else:
            valid = batch.target_cache.commit_last(steps, 1 + result.num_accepted, [1 + m for m in accepted_host])
        return out, accepted_host, result.next_token, valid

    @staticmethod
    def _download(accepted, next_token, drafts):
        """The round's one device-to-host copy of accepted counts, next tokens and drafts `[A, ℓ_max]`; returns
        (accepted counts, each row's tokens to commit: its accepted drafts and the next token)."""
        rows, width = drafts.shape
        flat = download(torch.cat([accepted, next_token, drafts.reshape(-1)]))
        accepted_host, start = flat[:rows], 2 * rows
        # where each row's drafts start in `flat` (no drafts: nowhere to read, every row accepted none)
        offsets = range(start, start + rows * width, width) if width else [start] * rows
        tokens = [[*flat[o : o + m], token] for o, m, token in zip(offsets, accepted_host, flat[rows:start])]
        return accepted_host, tokens

    def _draft(self, batch: RoundBatch, histories, cap: list[int], plan: DraftPlan):
        """Propose for the planned rows and choose ℓ: (drafts `[A, γ']` or None, draft_probs or None, ℓ `[A]` host
        ints, a record with the policy's share of the time)."""
        rows, device = len(batch.rows), batch.anchor.device
        record = RoundRecord(list(batch.rows), [], [], [], drafted=0, probe=plan.probe)
        if not plan.drafts:  # no drafts (None): the round is a plain step
            return None, None, [0] * rows, record
        proposed_at = time.perf_counter()  # the queued context update counts as drafting time
        batch.flush(self.drafter, self.takes_counts)
        host_index = plan.rows.tolist() if plan.rows is not None and plan.rows.numel() < rows else None
        index = None if host_index is None else upload(host_index, device)
        sub_rows = batch.rows if index is None else [batch.rows[i] for i in host_index]
        sub_hist = histories if index is None else _Picked(histories, host_index)
        cache = batch.draft_cache if index is None else batch.draft_cache.select_rows(
            torch.tensor(host_index, dtype=torch.long))
        anchor = batch.anchor if index is None else batch.anchor.index_select(0, index)
        proposal = self.drafter.propose(
            anchor, cache, do_sample=self.do_sample, row_ids=sub_rows, histories=sub_hist,
            logits_processor=draft_logits_processor(self.processors, sub_rows, sub_hist),
        )
        chosen_at = time.perf_counter()
        sub_cap = cap if index is None else [cap[i] for i in host_index]
        sub_len = self.policy.choose(proposal, sub_cap)
        record.policy_seconds = time.perf_counter() - chosen_at
        record.draft_seconds = chosen_at - proposed_at
        record.drafted = len(sub_rows)
        logits = proposal.confidence_logits if self.wants_confidence else None
        if logits is None and proposal.confidence is not None and self.wants_confidence:  # calibrated c_k only
            logits = torch.logit(proposal.confidence.float().clamp(1e-6, 1 - 1e-6))
        if logits is not None:
            record.confidence_logits = _scatter(logits, index, rows, float("nan"))
        drafts = _scatter(proposal.draft_ids, index, rows)
        probs = None
        if self.do_sample:
            probs = _scatter(proposal.draft_probs[:, : max(sub_len, default=0)], index, rows)
        return drafts, probs, _host_scatter(sub_len, host_index, rows), record

    def _verify(self, drafts, draft_probs, scores, verify_len, steps) -> VerificationResult:
        if self.do_sample:
            probs = draft_probs[:, : steps - 1] if draft_probs is not None else scores[:, :0]
            return verify_sampling(drafts, probs, torch.softmax(scores, dim=-1), verify_len)
        return verify_greedy(drafts, greedy_token_ids(scores), verify_len)
