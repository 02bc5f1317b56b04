"""The hybrid drafter: per row and per round, the DSpark drafter or a lookup proposer, chosen losslessly.

Before anything is drafted, each row's source is chosen from what is already committed: the lookup proposer's
match (a function of the committed context) and lagged, per-row, per-source agreement — how many leading tokens
of each source's earlier proposals the target went on to commit (an exponential moving average; the lookup's is
scored every round, counterfactually, since its proposal is a function of the context; DSpark's only in rounds it
drafted). `choose_sources` never sees this round's sampled drafts or confidences, so the round's proposal
distribution q is fixed by the past and speculative sampling stays exact (tests/test_hybrid_appendix_a.py shows
a rule that looks at this round's DSpark drafts is biased). Only the rows that chose DSpark run the drafter's
forward, and the drafter's context update waits until it drafts: a round where every row copies costs
≈ nothing, and `row_draft_costs` tells the "auto" policy so before it plans.

Host and device: the rows' histories come down once per round for both sources (`lookup.read_histories`, host
mirrors), the lookup rows' drafts go up in one non-blocking copy, row selections take host indices, and with the
loop's host `counts` (`extend_context(..., counts=)`) a DSpark proposal is scored by the drafts the target
accepted, without reading its drafts back.

One source per row per round (not both) in chain rounds: verifying both needs a tree of two branches in the target
forward, which tree rounds do (`dspark_tree_budget`: `propose_tree` joins the lookup continuation to the DSpark
tree); in chain rounds the lagged choice gets most of the gain at the cost of one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..model.binding import STOCK_LOOP_READS, stock_loop_error
from ..model.modeling_outputs import DSparkProposal
from ..model.tree_proposal import propose_tree
from ..ops.tree import TreeProposal, merge_branch
from ..transfer import upload
from .base import DraftModel
from .lookup import (
    PromptLookupProposer,
    RowMatchState,
    SuffixProposer,
    _host_index,
    _LookupBase,
    draft_rows,
    read_histories,
)
from .scoring import (
    DSPARK,
    LOOKUP,
    LOOKUP_PRIOR,
    choose_source,
    forecast_conditional,
    observe_agreement,
    resolved_agreement,
)


@dataclass
class HybridRowState:
    """A row's lagged per-source scores, its lookup's decayed per-position counts (`lookup_counts`: successes and
    trials `[γ]`, `scoring.observe_agreement`), what each source proposed last (with the history length then: host
    ints for the lookup, the DSpark drafts `[γ]` on the device, read only when no host counts score them) and this
    round's choice once made (`planned`: history length, source, the lookup's continuation)."""

    match: RowMatchState
    scores: list[float] = field(default_factory=lambda: [0.0, 0.0])
    lookup_counts: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    pending: list[tuple[int, int, Any]] = field(default_factory=list)  # (source, history length, drafts)
    planned: tuple[int, int, list[int]] | None = None


@dataclass
class HybridCache:
    """The DSpark drafter's cache, each row's `HybridRowState` (shared by reference across `select_rows`) and the
    context updates queued for the DSpark drafter (`queued`: (features, valid, host counts or None) in order),
    which reach it only when it drafts (`flush`): rounds in which every row copies skip its context update too."""

    inner: Any
    states: list[HybridRowState]
    drafter: Any = field(default=None, repr=False)
    queued: list[tuple[torch.Tensor | None, torch.Tensor, list[int] | None]] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.states)

    def queued_slots(self) -> int:
        return sum(int(v.shape[1]) for _, v, _ in self.queued)

    def flush(self) -> None:
        """Give the queued context updates to the DSpark drafter in one `extend_context` call (with the summed
        host counts when every update had them: the drafter then reads nothing back)."""
        if not self.queued:
            return
        features = [f for f, _, _ in self.queued]
        merged = None if any(f is None for f in features) else torch.cat(features, dim=1)
        valid = torch.cat([v for _, v, _ in self.queued], dim=1)
        counts = [c for _, _, c in self.queued]
        self.queued = []
        if any(c is None for c in counts):
            self.drafter.extend_context(self.inner, merged, valid)
        else:
            self.drafter.extend_context(self.inner, merged, valid, counts=[sum(row) for row in zip(*counts)])

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> HybridCache:
        """Rows `rows` (host indices: a list or a host tensor; a device tensor is read back once)."""
        self.flush()  # the rows' copy and this cache then share the DSpark context
        picked = _host_index(rows)
        inner = self.inner.select_rows(torch.tensor(picked, dtype=torch.long))
        return HybridCache(inner, [self.states[i] for i in picked], self.drafter)

    @staticmethod
    def concat(caches: list[HybridCache]) -> HybridCache:
        for cache in caches:
            cache.flush()
        inner = type(caches[0].inner).concat([c.inner for c in caches])
        return HybridCache(inner, [s for c in caches for s in c.states], caches[0].drafter)


@dataclass
class HybridRound:
    """One `propose` call of the hybrid: its rows (anchors `[R]`, cache, ids, histories), each row's source (host
    ints `[R]`) and the lookup's drafts (host ints `[R][γ]`), and how the DSpark rows are drafted (sampling,
    processors, generator)."""

    anchor_ids: torch.Tensor
    cache: HybridCache
    sources: list[int]
    lookup_drafts: list[list[int]]
    histories: list[torch.Tensor]
    row_ids: list[Any] | None = None
    do_sample: bool = False
    want_probs: bool = False
    logits_processor: Any = None
    generator: Any = None

    def dspark_rows(self) -> list[int]:
        """Indices `[S]` (host ints) of the rows that chose DSpark."""
        return [a for a, source in enumerate(self.sources) if source == DSPARK]

    def processor_for(self, index: list[int]):
        """The drafts' logits processing restricted to the rows `index` (a `DraftProcessing` is per row)."""
        proc = self.logits_processor
        if proc is None or not hasattr(proc, "rows"):
            return proc
        rows = None if self.row_ids is None else [self.row_ids[i] for i in index]
        return type(proc)(proc.processors, rows, [self.histories[i] for i in index])


class HybridDrafter(DraftModel):
    """A `DraftModel` combining a DSpark drafter and a lookup proposer (`PromptLookupProposer` or `SuffixProposer`).

    Args:
        drafter: the `DSparkDrafter` (its config, target binding and cost curve are the hybrid's).
        proposer: the model-free proposer; its block size must equal the drafter's.
        decay: weight of the newest observation in the lagged scores (exponential moving average).
        prior: (DSpark, lookup) scores before any observation, in accepted tokens.
        margin: how much better (in lagged accepted tokens) the lookup must be to be chosen.
        min_match: the shortest n-gram match the lookup may be chosen with.
        max_queued: context slots queued for the DSpark drafter before they reach it without a DSpark proposal.
        draft_curve: the DSpark drafter's cost curve (`StepCurve`); None: looked up (or profiled once) when "auto"
            first asks for it.

    `source_counts` holds how many (DSpark, lookup) row-proposals the last calls made. `row_draft_costs` tells the
    "auto" policy, before it plans, that a lookup row costs nothing of the DSpark drafter's cost curve.
    """

    reads_features = True

    def __init__(
        self,
        drafter,
        proposer: _LookupBase,
        decay: float = 0.5,
        prior: tuple[float, float] = (1.0, 1.5),
        margin: float = 0.0,
        min_match: int = 1,
        max_queued: int = 64,
        draft_curve=None,
    ) -> None:
        if proposer.config.block_size != drafter.config.block_size:
            raise ValueError(
                f"the proposer drafts {proposer.config.block_size} tokens and the drafter "
                f"{drafter.config.block_size}: build the proposer with the drafter's block size."
            )
        self.drafter, self.proposer = drafter, proposer
        self.decay, self.prior, self.margin, self.min_match = decay, prior, margin, min_match
        self.max_queued = max_queued
        self.source_counts = [0, 0]
        self._draft_curve = draft_curve

    # -- the drafter protocol, delegated ------------------------------------------------------------
    @property
    def config(self):
        return self.drafter.config

    @property
    def draft_curve(self):
        """The DSpark drafter's cost curve (what its rows cost; lookup rows are free, `row_draft_costs`): looked up
        or profiled once, as `generate` does for the drafter alone, unless `draft_curve=` was given."""
        if self._draft_curve is None:
            from ..profiling.draft_steps import load_or_profile_draft_curve

            self._draft_curve = load_or_profile_draft_curve(self.drafter)
        return self._draft_curve

    def parameters(self, recurse: bool = True):
        """The DSpark drafter's parameters (the proposer has none)."""
        return self.drafter.parameters(recurse)

    def state_dict(self):
        """The DSpark drafter's weights (the hybrid's identity in result files)."""
        return self.drafter.state_dict()

    def bind_target(self, target) -> None:
        self.drafter.bind_target(target)

    def bound_to(self, target) -> bool:
        return self.drafter.bound_to(target)

    @property
    def is_bound(self) -> bool:
        return self.drafter.is_bound

    def __getattr__(self, name: str) -> Any:
        # only for attributes a hybrid lacks: transformers' own assisted loop reads its assistant's `device` (then
        # `generation_config`, `generate`), which happens only on a target DSpark is not enabled on
        if name in STOCK_LOOP_READS and "drafter" in vars(self):
            raise stock_loop_error(self.drafter)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def init_cache(self, batch_size: int, capacity: int = 64) -> HybridCache:
        matches = self.proposer.init_cache(batch_size).states
        empty = [0.0] * self.config.block_size
        states = [HybridRowState(m, list(self.prior), (list(empty), list(empty))) for m in matches]
        return HybridCache(self.drafter.init_cache(batch_size, capacity), states, self.drafter)

    def extend_context(
        self,
        cache: HybridCache,
        target_hidden: torch.Tensor | None,
        valid: torch.Tensor,
        counts: Sequence[int] | None = None,
    ) -> None:
        """Queue the update for the DSpark drafter (it reaches it before its next proposal, or once full).

        counts: each row's committed tokens as host ints (the loop gives them): a row's pending DSpark proposal is
        then scored by the drafts the target accepted (`count - 1`), with no read of its drafts; without them it is
        scored against the history at the next plan (one read of its drafts)."""
        if counts is not None:
            counts = [int(c) for c in counts]
            for state, count in zip(cache.states, counts):
                self._score_accepted(state, count - 1)
        cache.queued.append((target_hidden, valid, counts))
        if cache.queued_slots() >= self.max_queued:
            cache.flush()

    # -- the per-row source, chosen before drafting ---------------------------------------------------
    def _fold(self, state: HybridRowState, source: int, got: float) -> None:
        state.scores[source] = (1 - self.decay) * state.scores[source] + self.decay * got

    def _score_accepted(self, state: HybridRowState, accepted: int) -> None:
        """Fold a pending DSpark proposal's accepted drafts (from the host counts) into its lagged score."""
        if any(source == DSPARK for source, _, _ in state.pending):
            self._fold(state, DSPARK, min(max(accepted, 0), self.config.block_size))
            state.pending = [entry for entry in state.pending if entry[0] != DSPARK]

    def _score(self, state: HybridRowState, history: list[int]) -> None:
        """Fold the agreement of every pending proposal that the history now resolves (`resolved_agreement`: a
        mismatch, or all its tokens committed) into the lagged scores; the others wait for later tokens."""
        waiting = []
        for source, start, drafts in state.pending:
            proposed = drafts.tolist() if isinstance(drafts, torch.Tensor) else drafts  # no host counts came
            got = resolved_agreement(proposed, history[start:])
            if got is None:
                waiting.append((source, start, proposed))
                continue
            self._fold(state, source, got)
            if source == LOOKUP:
                state.lookup_counts = observe_agreement(*state.lookup_counts, got)
        state.pending = waiting

    def _plan_row(self, state: HybridRowState, history: list[int]) -> tuple[int, int, list[int]]:
        """This round's (history length, source, lookup continuation) of one row (`history`: its host mirror),
        chosen once per round."""
        length = len(history)
        if state.planned is not None and state.planned[0] == length:
            return state.planned
        self._score(state, history)
        follow, matched = self.proposer.match(state.match, history)
        source = choose_source(matched, state.scores[LOOKUP], state.scores[DSPARK], self.min_match, self.margin)
        if follow:  # scored counterfactually, every round it matches, whether or not it drafts or is verified
            state.pending.append((LOOKUP, length, draft_rows([history[-1]], [follow], self.config.block_size)[0]))
        state.planned = (length, source, follow)
        return state.planned

    def _plan(self, cache: HybridCache, histories: list[torch.Tensor]) -> tuple[list[list[int]], list[tuple]]:
        """(the rows' host histories, each row's `_plan_row`), after one `read_histories` of all rows."""
        mirrors = read_histories([state.match for state in cache.states], histories)
        return mirrors, [self._plan_row(state, tokens) for state, tokens in zip(cache.states, mirrors)]

    def row_draft_costs(self, cache: HybridCache, histories: list[torch.Tensor]) -> torch.Tensor:
        """`[R]` each row's share of the DSpark drafter's per-row cost this round: 1 for DSpark rows, 0 for
        lookup rows (the choice is made here, from the committed context and lagged scores, and kept for
        `propose`). "auto" also keeps its acceptance estimate per (request, share), so per source."""
        _, planned = self._plan(cache, histories)
        return torch.tensor([1.0 if source == DSPARK else 0.0 for _, source, _ in planned], dtype=torch.float64)

    def row_acceptance(self, cache: HybridCache) -> list[list[float] | None]:
        """Per row, after `row_draft_costs` chose its source: for a lookup row, the conditional acceptance of its
        drafts per position forecast from its resolved proposals (`scoring.forecast_conditional`), which the "auto"
        policy plans with instead of what verification has shown it (the lookup is scored every round it matches,
        verified or not); None for a DSpark row (its acceptance is learnt from verification)."""
        return [forecast_conditional(*s.lookup_counts) if s.planned is not None and s.planned[1] == LOOKUP else None
                for s in cache.states]

    @torch.no_grad()
    def propose(
        self,
        anchor_ids: torch.Tensor,
        cache: HybridCache,
        *,
        do_sample: bool = False,
        logits_processor=None,
        generator=None,
        return_probs: bool | None = None,
        row_ids=None,
        histories: list[torch.Tensor] | None = None,
    ) -> DSparkProposal:
        if histories is None:
            raise ValueError("HybridDrafter needs the rows' histories (the DSpark loop passes them)")
        mirrors, planned = self._plan(cache, histories)
        sources = [source for _, source, _ in planned]
        lookup_drafts = draft_rows([t[-1] for t in mirrors], [f for _, _, f in planned], self.config.block_size)
        want_probs = bool(return_probs if return_probs is not None else do_sample)
        call = HybridRound(
            anchor_ids, cache, sources, lookup_drafts, list(histories), row_ids, do_sample, want_probs,
            logits_processor, generator,
        )  # fmt: skip
        proposal = self._combine(call)
        for a, (state, (length, source, _)) in enumerate(zip(cache.states, planned)):
            if source == DSPARK:
                state.pending.append((DSPARK, length, proposal.draft_ids[a]))
            state.planned = None
        dspark_rows = sources.count(DSPARK)
        self.source_counts[DSPARK] += dspark_rows
        self.source_counts[LOOKUP] += len(planned) - dspark_rows
        return proposal

    @torch.no_grad()
    def propose_tree(self, anchor_ids: torch.Tensor, cache: HybridCache, budget: int, *, do_sample: bool = False,
                     logits_processor=None, sibling_cap: int = 4, histories=None) -> TreeProposal:
        """Tree rounds (`dspark_tree_budget`): the DSpark drafter's tree of budget − γ nodes with each row's lookup
        continuation joined as one more branch (`ops.tree.merge_branch`: a prefix the two share is one node), at
        most max(budget, γ + 1) node slots. Both sources are verified, so no row chooses one; the lookup is still
        scored every round it matches (its lagged scores serve chain rounds and `row_acceptance`), and its branch's
        nodes carry the running product of that forecast as their score (what a policy sizing trees keeps them by)."""
        if histories is None:
            raise ValueError("HybridDrafter needs the rows' histories (the DSpark loop passes them)")
        mirrors, planned = self._plan(cache, histories)
        gamma, device = self.config.block_size, anchor_ids.device
        cache.flush()
        inner = propose_tree(self.drafter, anchor_ids, cache.inner, max(1, budget - gamma), do_sample=do_sample,
                             logits_processor=logits_processor, sibling_cap=sibling_cap)
        follows = [follow[:gamma] for _, _, follow in planned]
        branch = upload(draft_rows([t[-1] for t in mirrors], follows, gamma), device, anchor_ids.dtype)
        # the lookup rows' chain drafts (`draft_rows`: the continuation, its last token repeated to γ)
        tree, branch_nodes = merge_branch(inner.tree, branch, upload([gamma if f else 0 for f in follows], device))
        # the branch's nodes are scored with the row's lookup forecast (its running product: P(reached, accepted))
        survival = upload([_running_product(forecast_conditional(*state.lookup_counts), gamma)
                           for state in cache.states], device, torch.float32)
        for state in cache.states:
            state.planned = None
        self.source_counts[DSPARK] += len(planned)
        self.source_counts[LOOKUP] += sum(1 for f in follows if f)
        pad = (0, tree.num_nodes - inner.tree.num_nodes)
        score = torch.nn.functional.pad(inner.score, pad).scatter_reduce(
            1, branch_nodes.clamp_min(0), torch.where(branch_nodes >= 0, survival.to(inner.score.dtype), 0.0), "amax")
        return TreeProposal(tree, score, torch.nn.functional.pad(inner.acceptance, pad))

    def _lookup_proposal(self, call: HybridRound) -> DSparkProposal:
        """Every row's lookup proposal: one-hot drafts (one non-blocking upload), confidences from the row's
        resolved lookup proposals (`scoring.forecast_conditional`, what `row_acceptance` tells "auto"; DSpark rows
        are overwritten by `_combine`)."""
        device = call.anchor_ids.device
        drafts = upload(call.lookup_drafts, device, call.anchor_ids.dtype)
        token_probs = torch.ones(drafts.shape, dtype=torch.float32, device=device)
        probs = self.proposer.one_hot(drafts, call.want_probs)
        confidence = None
        if self._has_confidence():
            rates = [forecast_conditional(*state.lookup_counts) for state in call.cache.states]
            confidence = upload(rates, device, torch.float32)
        return DSparkProposal(drafts, probs, token_probs, confidence)

    def _combine(self, call: HybridRound) -> DSparkProposal:
        """Run the DSpark drafter on the rows that chose it and merge with the lookup rows' one-hot proposals."""
        out = self._lookup_proposal(call)
        picked = call.dspark_rows()
        if not picked:
            return out
        call.cache.flush()
        dev_index = upload(picked, call.anchor_ids.device)
        inner = self.drafter.propose(
            call.anchor_ids.index_select(0, dev_index),
            call.cache.inner.select_rows(torch.tensor(picked, dtype=torch.long)),
            do_sample=call.do_sample,
            logits_processor=call.processor_for(picked),
            generator=call.generator,
            return_probs=call.want_probs,
            row_ids=None if call.row_ids is None else [call.row_ids[i] for i in picked],
            histories=[call.histories[i] for i in picked],
        )
        out.draft_ids[dev_index] = inner.draft_ids
        out.draft_token_probs[dev_index] = inner.draft_token_probs.float()
        if out.draft_probs is not None:
            out.draft_probs[dev_index] = inner.draft_probs.to(out.draft_probs.dtype)
        if inner.confidence is None or out.confidence is None:
            return DSparkProposal(out.draft_ids, out.draft_probs, out.draft_token_probs, None)
        out.confidence[dev_index] = inner.confidence.float()
        return out

    def _has_confidence(self) -> bool:
        return bool(getattr(self.config, "use_confidence_head", False))


def hybrid_for(drafter, kind: str = "prompt-lookup", **kwargs) -> HybridDrafter:
    """A hybrid of `drafter` (bound to its target) and a lookup proposer of `kind` ("prompt-lookup" / "suffix")."""
    if kind not in ("prompt-lookup", "suffix"):
        raise ValueError(f"kind must be 'prompt-lookup' or 'suffix', got {kind!r}")
    cls = PromptLookupProposer if kind == "prompt-lookup" else SuffixProposer
    proposer = cls(drafter.config)  # it reads only block_size and vocab_size
    return HybridDrafter(drafter, proposer, **kwargs)


def _running_product(rates: list[float], length: int) -> list[float]:
    """∏_{i≤j} rates_i for j = 1..length (missing rates: the lookup prior)."""
    out, survival = [], 1.0
    for rate in (list(rates) + [LOOKUP_PRIOR] * length)[:length]:
        survival *= rate
        out.append(survival)
    return out
