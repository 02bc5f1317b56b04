"""Model-free proposers as drafters of the DSpark loop: prompt lookup and a suffix proposer.

- `PromptLookupProposer`: n-gram copying from the row's own context (prompt and output so far): the tokens that
  followed the latest earlier occurrence of the longest suffix n-gram (max_ngram down to 1) of the row's history.
- `SuffixProposer`: the same match over the row's context *and every earlier row's* (earlier requests and
  outputs of this proposer: one bounded store per proposer, i.e. per engine or per drafter object), longest match
  first, up to `max_ngram` tokens.

Both are `DraftModel`s (`generate(**inputs, assistant_model=proposer)` once the target is DSpark-enabled; the
`*_for(target, γ)` helpers do that), batched with every row its own match; no weights, no target features, no
cost curve (`draft_curve = None`: "auto" prices their drafting at ≈ 0). Drafts are one-hot proposals, exact for
greedy and valid for speculative sampling; with no match the anchor is repeated (a draft the target usually
rejects). Each row's index is fed only the committed tokens it has not seen, a few per round.

Host and device: each row keeps a host mirror of its history (`RowMatchState.tokens`); a round reads the tokens
committed since, of every row at once, in one device-to-host copy (`read_histories`), and uploads the drafts in one
non-blocking copy; row selections take host indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..model.configuration_dspark import EMBEDDING_TAP, DSparkConfig
from ..model.modeling_outputs import DSparkProposal
from ..transfer import HOST, download, upload
from .base import ModelFreeDrafter
from .ngram import NgramIndex


@dataclass
class RowMatchState:
    """One row's matching state: its own index (prompt lookup) or its sequence id in a shared one, how many of its
    history's tokens the index holds, and the history's host mirror (`tokens`, kept by `read_histories`)."""

    index: NgramIndex | None = None
    seq_id: int = -1
    fed: int = 0
    tokens: list[int] = field(default_factory=list)


def read_histories(states: Sequence[RowMatchState], histories: Sequence[torch.Tensor]) -> list[list[int]]:
    """Bring every row's host mirror up to its history `[L_r]` and return the mirrors: the tokens each row's mirror
    lacks, of all rows together, come down in one copy (none when every mirror is current); lengths are host
    metadata. A history shorter than its mirror (not a continuation) is read again whole."""
    for state, history in zip(states, histories):
        if int(history.shape[0]) < len(state.tokens):
            state.tokens = []
    tails = [(state, history[len(state.tokens) :]) for state, history in zip(states, histories)
             if int(history.shape[0]) > len(state.tokens)]  # fmt: skip
    if tails:
        flat = download(torch.cat([tail.reshape(-1).to(torch.long) for _, tail in tails]))
        start = 0
        for state, tail in tails:
            count = int(tail.shape[0])
            state.tokens.extend(flat[start : start + count])
            start += count
    return [state.tokens for state in states]


def _host_index(rows: torch.Tensor | Sequence[int]) -> list[int]:
    """Row indices as host ints (free for a list or a host tensor; one read for a device tensor)."""
    return rows.tolist() if isinstance(rows, torch.Tensor) else [int(r) for r in rows]


@dataclass
class LookupCache:
    """A model-free proposer's per-row cache: committed-token counts `[R]` and each row's `RowMatchState`
    (shared by reference across `select_rows`, so a sub-batch's updates persist)."""

    lengths: torch.Tensor
    states: list[RowMatchState] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    def advance(self, counts: torch.Tensor) -> None:
        self.lengths = self.lengths + counts.to(HOST)

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> LookupCache:
        """Rows `rows` (host indices: a list or a host tensor; a device tensor is read back once)."""
        picked = _host_index(rows)
        return LookupCache(self.lengths[picked], [self.states[i] for i in picked])

    @staticmethod
    def concat(caches: list[LookupCache]) -> LookupCache:
        return LookupCache(torch.cat([c.lengths for c in caches]), [s for c in caches for s in c.states])


def draft_rows(anchors: Sequence[int], matches: Sequence[list[int]], gamma: int) -> list[list[int]]:
    """Host anchors `[R]` (each row's last committed token) and per-row continuations (≤ γ tokens each) -> host
    drafts `[R][γ]`: the continuation, its last token repeated to γ; the anchor repeated where a row has no match."""
    return [follow + [follow[-1]] * (gamma - len(follow)) if follow else [int(anchor)] * gamma
            for anchor, follow in zip(anchors, matches)]


class _LookupBase(ModelFreeDrafter):
    """Shared machinery: per-row states, incremental feeding, batched one-hot proposals."""

    def __init__(self, config: DSparkConfig, max_ngram: int = 3) -> None:
        super().__init__(config)
        self.max_ngram = max_ngram

    def init_cache(self, batch_size: int, capacity: int | None = None) -> LookupCache:
        return LookupCache(torch.zeros(batch_size, dtype=torch.long), [self._new_state() for _ in range(batch_size)])

    def _new_state(self) -> RowMatchState:
        raise NotImplementedError

    def _index_of(self, state: RowMatchState) -> NgramIndex:
        raise NotImplementedError

    def match(self, state: RowMatchState, tokens: list[int]) -> tuple[list[int], int]:
        """Feed the row's unseen committed tokens (host ints, the whole history), then look up its suffix:
        (continuation ≤ γ, n-gram length)."""
        index = self._index_of(state)
        # The anchor (the last token) is indexed only once its successor is known: feed all but it.
        if len(tokens) - 1 > state.fed:
            state.seq_id = index.extend(state.seq_id, tokens[state.fed : len(tokens) - 1])
            state.fed = len(tokens) - 1
        return index.lookup(tokens, self.config.block_size)

    def matches(self, cache: LookupCache, histories: list[torch.Tensor]) -> tuple[list[list[int]], list[list[int]]]:
        """(each row's host history, its continuation) after one `read_histories`."""
        if histories is None:
            raise ValueError(f"{type(self).__name__} needs the rows' histories (the DSpark loop passes them)")
        mirrors = read_histories(cache.states, histories)
        return mirrors, [self.match(state, tokens)[0] for state, tokens in zip(cache.states, mirrors)]

    @torch.no_grad()
    def propose(
        self,
        anchor_ids: torch.Tensor,
        cache: LookupCache,
        *,
        do_sample: bool = False,
        logits_processor=None,
        generator=None,
        return_probs: bool | None = None,
        row_ids=None,
        histories: list[torch.Tensor] | None = None,
    ) -> DSparkProposal:
        mirrors, found = self.matches(cache, histories)
        rows = draft_rows([tokens[-1] for tokens in mirrors], found, self.config.block_size)
        drafts = upload(rows, anchor_ids.device, anchor_ids.dtype)
        ones = torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
        return DSparkProposal(drafts, self.one_hot(drafts, bool(return_probs or do_sample)), ones, None)


class PromptLookupProposer(_LookupBase):
    """Prompt lookup over each row's own context; `max_ngram` is the longest suffix n-gram matched."""

    def _new_state(self) -> RowMatchState:
        return RowMatchState(index=NgramIndex(self.max_ngram))

    def _index_of(self, state: RowMatchState) -> NgramIndex:
        return state.index


class SuffixProposer(_LookupBase):
    """Longest-suffix matching over each row's context and every earlier row's, in one bounded store.

    Args:
        max_ngram: the longest suffix matched (longer: more precise matches, more index entries per token).
        max_tokens: the store's bound over all rows (oldest rows are evicted first).
    """

    def __init__(self, config: DSparkConfig, max_ngram: int = 8, max_tokens: int = 1 << 18) -> None:
        super().__init__(config, max_ngram)
        self.store = NgramIndex(max_ngram, max_tokens)

    def _new_state(self) -> RowMatchState:
        return RowMatchState(seq_id=self.store.new_sequence())

    def _index_of(self, state: RowMatchState) -> NgramIndex:
        return self.store


def _model_free_config(target, block_size: int) -> DSparkConfig:
    """A config for a model-free drafter of `target`: it taps no layer (`reads_features` is False), so it names the
    embedding output, which every target has, and fits targets of any depth."""
    return DSparkConfig.from_target(
        target.config, block_size=block_size, num_hidden_layers=1, head_type="none", use_confidence_head=False,
        target_layer_ids=[EMBEDDING_TAP],
    )


def prompt_lookup_proposer(target, block_size: int, max_ngram: int = 3) -> PromptLookupProposer:
    """A prompt-lookup proposer shaped for `target` (`hf_dspark.generation.prompt_lookup_for` also enables DSpark
    generate on the target)."""
    return PromptLookupProposer(_model_free_config(target, block_size), max_ngram=max_ngram)


def suffix_proposer(target, block_size: int, max_ngram: int = 8, max_tokens: int = 1 << 18) -> SuffixProposer:
    """A suffix proposer shaped for `target` (`hf_dspark.generation.suffix_proposer_for` also enables DSpark
    generate on the target)."""
    return SuffixProposer(_model_free_config(target, block_size), max_ngram=max_ngram, max_tokens=max_tokens)
