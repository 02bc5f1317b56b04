"""The hybrid drafter: per row and per round, the DSpark drafter or a lookup proposer, chosen losslessly.

Before anything is drafted, each row's source is chosen from what is already committed: the lookup proposer's
match (a function of the committed context) and lagged, per-row, per-source agreement — how many leading tokens
of each source's earlier proposals the target went on to commit (an exponential moving average; the lookup's is
scored every round, counterfactually, since its proposal is a function of the context; DSpark's only in rounds it
drafted). `choose_sources` never sees this round's sampled drafts or confidences, so the round's proposal
distribution q is fixed by the past and speculative sampling stays exact (tests/test_hybrid_appendix_a.py shows
a rule that looks at this round's DSpark drafts is biased). Only the rows that chose DSpark run the drafter's
forward: a round where every row copies costs ≈ nothing.

One source per row per round (not both): verifying both would need a tree of two branches in the target forward,
which the ragged verification does not do; the lagged choice gets most of the gain at the cost of one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..generation.stats import last_generation_stats
from ..modeling_outputs import DSparkProposal
from .lookup import PromptLookupProposer, RowMatchState, SuffixProposer, _LookupBase, drafts_from_matches

DSPARK, LOOKUP = 0, 1


def agreement(proposed: list[int], committed: list[int]) -> int:
    """How many leading tokens of `proposed` equal the tokens committed after them (the lagged score)."""
    count = 0
    for p, c in zip(proposed, committed):
        if p != c:
            break
        count += 1
    return count


def choose_sources(
    match_lengths: torch.Tensor,
    lookup_score: torch.Tensor,
    dspark_score: torch.Tensor,
    min_match: int = 1,
    margin: float = 0.0,
) -> torch.Tensor:
    """Per row, the source of this round's drafts: LOOKUP where the lookup matched (n-gram length ≥ `min_match`)
    and its lagged score beats DSpark's by more than `margin`, else DSPARK.

    match_lengths `[R]` (0: no match), lookup_score / dspark_score `[R]` lagged mean agreements -> `[R]` sources.
    Its inputs are all functions of the committed context and earlier rounds: never this round's drafts.
    """
    use_lookup = (match_lengths >= min_match) & (lookup_score > dspark_score + margin)
    return torch.where(use_lookup, LOOKUP, DSPARK)


@dataclass
class HybridRowState:
    """A row's lagged per-source scores and what each source proposed last (with the history length then)."""

    match: RowMatchState
    scores: list[float] = field(default_factory=lambda: [0.0, 0.0])
    pending: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (source, history length, drafts)


@dataclass
class HybridCache:
    """The DSpark drafter's cache and each row's `HybridRowState` (shared by reference across `select_rows`)."""

    inner: Any
    states: list[HybridRowState]

    @property
    def batch_size(self) -> int:
        return len(self.states)

    def select_rows(self, rows: torch.Tensor) -> HybridCache:
        return HybridCache(self.inner.select_rows(rows), [self.states[i] for i in rows.tolist()])

    @staticmethod
    def concat(caches: list[HybridCache]) -> HybridCache:
        inner = type(caches[0].inner).concat([c.inner for c in caches])
        return HybridCache(inner, [s for c in caches for s in c.states])


class HybridDrafter:
    """A `DraftModel` combining a DSpark drafter and a lookup proposer (`PromptLookupProposer` or `SuffixProposer`).

    Args:
        drafter: the `DSparkDrafter` (its config, target binding and cost curve are the hybrid's).
        proposer: the model-free proposer; its block size must equal the drafter's.
        decay: weight of the newest observation in the lagged scores (exponential moving average).
        prior: (DSpark, lookup) scores before any observation, in accepted tokens.
        margin: how much better (in lagged accepted tokens) the lookup must be to be chosen.

    `source_counts` holds how many (DSpark, lookup) row-proposals the last calls made.
    """

    reads_features = True

    def __init__(
        self,
        drafter,
        proposer: _LookupBase,
        decay: float = 0.5,
        prior: tuple[float, float] = (1.0, 1.5),
        margin: float = 0.0,
    ) -> None:
        if proposer.config.block_size != drafter.config.block_size:
            raise ValueError(
                f"the proposer drafts {proposer.config.block_size} tokens and the drafter "
                f"{drafter.config.block_size}: build the proposer with the drafter's block size."
            )
        self.drafter, self.proposer = drafter, proposer
        self.decay, self.prior, self.margin = decay, prior, margin
        self.source_counts = [0, 0]

    # -- the drafter protocol, delegated ------------------------------------------------------------
    @property
    def config(self):
        return self.drafter.config

    @property
    def draft_curve(self):
        return getattr(self.drafter, "draft_curve", None)

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

    @property
    def last_generation_stats(self):
        return last_generation_stats(self)

    def init_cache(self, batch_size: int, capacity: int = 64) -> HybridCache:
        matches = self.proposer.init_cache(batch_size).states
        states = [HybridRowState(m, list(self.prior)) for m in matches]
        return HybridCache(self.drafter.init_cache(batch_size, capacity), states)

    def extend_context(self, cache: HybridCache, target_hidden: torch.Tensor | None, valid: torch.Tensor) -> None:
        self.drafter.extend_context(cache.inner, target_hidden, valid)

    # -- lagged scores ---------------------------------------------------------------------------------
    def _score(self, state: HybridRowState, history: list[int]) -> None:
        """Fold the agreement of every pending proposal that the history now resolves into the lagged scores."""
        for source, start, drafts in state.pending:
            got = agreement(drafts, history[start:])
            state.scores[source] = (1 - self.decay) * state.scores[source] + self.decay * got
        state.pending = []

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
        lists = [h.tolist() for h in histories]
        for state, history in zip(cache.states, lists):
            self._score(state, history)
        found = [self.proposer.match(s.match, h) for s, h in zip(cache.states, histories)]
        sources = choose_sources(
            torch.tensor([n for _, n in found]),
            torch.tensor([s.scores[LOOKUP] for s in cache.states]),
            torch.tensor([s.scores[DSPARK] for s in cache.states]),
            margin=self.margin,
        )
        gamma = self.config.block_size
        lookup_drafts = drafts_from_matches(anchor_ids, [f for f, _ in found], gamma)
        proposal = self._combine(
            anchor_ids,
            cache,
            sources,
            lookup_drafts,
            do_sample,
            logits_processor,
            generator,
            return_probs,
            row_ids,
            histories,
        )
        for a, (state, history) in enumerate(zip(cache.states, lists)):
            state.pending.append((LOOKUP, len(history), lookup_drafts[a].tolist()))  # scored counterfactually
            if sources[a] == DSPARK:
                state.pending.append((DSPARK, len(history), proposal.draft_ids[a].tolist()))
        dspark_rows = int((sources == DSPARK).sum())
        self.source_counts[DSPARK] += dspark_rows
        self.source_counts[LOOKUP] += len(lists) - dspark_rows
        return proposal

    def _combine(
        self,
        anchor_ids,
        cache,
        sources,
        lookup_drafts,
        do_sample,
        logits_processor,
        generator,
        return_probs,
        row_ids,
        histories,
    ) -> DSparkProposal:
        """Run the DSpark drafter on the rows that chose it and merge with the lookup rows' one-hot proposals."""
        want_probs = bool(return_probs if return_probs is not None else do_sample)
        vocab = self.config.vocab_size
        drafts = lookup_drafts.clone()
        token_probs = torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
        probs = torch.nn.functional.one_hot(drafts, vocab).float() if want_probs else None
        lookup_conf = torch.tensor([min(s.scores[LOOKUP] / self.config.block_size, 0.99) for s in cache.states])
        confidence = lookup_conf[:, None].expand(drafts.shape).clone().to(drafts.device).clamp_min(1e-3)
        index = torch.nonzero(sources == DSPARK).flatten()
        if index.numel() == 0:
            return DSparkProposal(drafts, probs, token_probs, confidence if self._has_confidence() else None)
        dev_index = index.to(anchor_ids.device)
        sub_rows = None if row_ids is None else [row_ids[i] for i in index.tolist()]
        sub_hist = [histories[i] for i in index.tolist()]
        sub_proc = logits_processor
        if logits_processor is not None and hasattr(logits_processor, "rows"):
            sub_proc = type(logits_processor)(logits_processor.processors, sub_rows, sub_hist)
        inner = self.drafter.propose(
            anchor_ids.index_select(0, dev_index),
            cache.inner.select_rows(dev_index),
            do_sample=do_sample,
            logits_processor=sub_proc,
            generator=generator,
            return_probs=want_probs,
            row_ids=sub_rows,
            histories=sub_hist,
        )
        drafts[dev_index] = inner.draft_ids
        token_probs[dev_index] = inner.draft_token_probs.float()
        if probs is not None:
            probs[dev_index] = inner.draft_probs.to(probs.dtype)
        if inner.confidence is None:
            return DSparkProposal(drafts, probs, token_probs, None)
        confidence[dev_index] = inner.confidence.float()
        return DSparkProposal(drafts, probs, token_probs, confidence)

    def _has_confidence(self) -> bool:
        return bool(getattr(self.config, "use_confidence_head", False))


def hybrid_for(drafter, kind: str = "prompt-lookup", **kwargs) -> HybridDrafter:
    """A hybrid of `drafter` (bound to its target) and a lookup proposer of `kind` ("prompt-lookup" / "suffix")."""
    if kind not in ("prompt-lookup", "suffix"):
        raise ValueError(f"kind must be 'prompt-lookup' or 'suffix', got {kind!r}")
    cls = PromptLookupProposer if kind == "prompt-lookup" else SuffixProposer
    proposer = cls(drafter.config)  # it reads only block_size and vocab_size
    return HybridDrafter(drafter, proposer, **kwargs)
