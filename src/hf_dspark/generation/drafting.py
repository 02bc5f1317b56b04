"""The drafter protocol the round kernel talks to, and a context cache for model-free drafters.

A drafter is anything with a `config` (`block_size` γ, `vocab_size`, `target_layer_ids`) and three methods:

- `init_cache(batch_size)`: an empty per-row context cache (it must offer `select_rows(index)` and a static
  `concat(caches)`, like `DSparkDraftCache`);
- `extend_context(cache, features, valid)`: append the committed tokens' tapped target features `[R, n, ·]`
  (`valid` `[R, n]` marks real entries; `features` is None when the drafter taps no layer). A drafter whose
  `extend_context` also takes `counts` (each row's valid entries as host ints) gets them from the round kernel,
  which knows them from its one download per round, and need not read `valid` back from the device;
- `propose(anchor_ids, cache, *, do_sample, logits_processor, row_ids, histories)` -> a `DSparkProposal`.

`DSparkDrafter` satisfies it; so do the oracle and prompt-lookup drafters of `hf_dspark.eval`, which are plain
classes. Optional: `bind_target(target)` / `bound_to(target)` / `is_bound` (checked by `generate`), and
`draft_curve`, a `StepCurve` of proposals per second against rows (model-free drafters: None, cost ≈ 0), and
`row_draft_costs(cache, histories)` -> `[R]` each row's share of that curve's per-row cost this round (called before
the policy plans; a hybrid's lookup rows pay ≈ 0; it may read only the committed context and earlier rounds), and
`row_acceptance(cache)` -> per row its own forecast of the conditional acceptance of this round's drafts (`[γ]` host
floats) or None (called after `row_draft_costs`; the same rule on what it may read): `"auto"` plans those rows with
it instead of the acceptance verification has shown it (a lookup proposal is scored every round, verified or not).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from .processors import RowProcessors


@runtime_checkable
class DraftModel(Protocol):
    """What the round kernel needs from a drafter (see the module docstring). Optional: `reads_features` (default
    True; False: `extend_context` gets None instead of tapped target features)."""

    config: Any

    def init_cache(self, batch_size: int) -> Any: ...

    def extend_context(self, cache: Any, target_hidden: torch.Tensor | None, valid: torch.Tensor) -> None: ...

    def propose(self, anchor_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Any: ...


def is_draft_model(obj: Any) -> bool:
    """True when `obj` follows the `DraftModel` protocol (a DSpark drafter, the oracle, prompt lookup...)."""
    return isinstance(obj, DraftModel) and hasattr(getattr(obj, "config", None), "block_size")


def feature_layers(drafter: DraftModel) -> list[int]:
    """`output_hidden_states` indices the drafter reads (layer i's output is hidden_states[i + 1]); none for a
    drafter whose `reads_features` is False (model-free drafters: the target then returns no hidden states)."""
    if not getattr(drafter, "reads_features", True):
        return []
    return [i + 1 for i in (getattr(drafter.config, "target_layer_ids", None) or [])]


def takes_host_counts(drafter: DraftModel) -> bool:
    """Whether `drafter.extend_context` accepts `counts` (host ints per row; see the module docstring)."""
    try:
        return "counts" in inspect.signature(drafter.extend_context).parameters
    except (TypeError, ValueError):
        return False


def extend_drafter_context(drafter: DraftModel, cache: Any, features: torch.Tensor | None, valid: torch.Tensor,
                           counts: Sequence[int] | None, takes_counts: bool) -> None:
    """`drafter.extend_context`, with the host `counts` when the drafter takes them (`takes_host_counts`)."""
    if takes_counts and counts is not None:
        drafter.extend_context(cache, features, valid, counts=list(counts))
    else:
        drafter.extend_context(cache, features, valid)


@dataclass
class DraftProcessing:
    """The `logits_processor(k, drafts_so_far, logits)` that gives drafts the target's processing on the same
    prefix: row i's history `histories[i]` followed by its drafts so far.

    `reads_token_ids` is False when every processor is a history-free warper (temperature, top-k/p, ...): their
    output depends on the scores' values alone, not on which token a column is, so a drafter may apply them to its
    draft-vocabulary logits instead of the target vocabulary's.
    """

    processors: RowProcessors
    rows: Sequence[int]
    histories: Sequence[torch.Tensor]

    @property
    def reads_token_ids(self) -> bool:
        return not self.processors.history_free

    def __call__(self, k: int, drafts_so_far: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        prefixes = self.histories
        if self.reads_token_ids:
            prefixes = [torch.cat([h, d]) for h, d in zip(self.histories, drafts_so_far)]
        return self.processors.apply(self.rows, prefixes, logits)


def draft_logits_processor(
    processors: RowProcessors, rows: Sequence[int], histories: Sequence[torch.Tensor]
) -> DraftProcessing | None:
    """The drafts' `DraftProcessing` for these rows (None when there is nothing to apply)."""
    return None if processors.is_empty else DraftProcessing(processors, rows, histories)


@dataclass
class ContextLengths:
    """The context cache of a model-free drafter: only each row's committed-token count `[R]`, on the host."""

    lengths: torch.Tensor

    @classmethod
    def empty(cls, batch_size: int, device: torch.device | str = "cpu") -> ContextLengths:
        return cls(torch.zeros(batch_size, dtype=torch.long, device="cpu"))

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    def advance(self, counts: torch.Tensor | Sequence[int]) -> None:
        if not isinstance(counts, torch.Tensor):
            counts = torch.tensor(list(counts), dtype=torch.long)
        self.lengths = self.lengths + counts.to("cpu")

    def select_rows(self, rows: torch.Tensor) -> ContextLengths:
        """Rows `rows` (best a host index; a device one is read back once)."""
        return ContextLengths(self.lengths.index_select(0, rows.to("cpu")))

    @staticmethod
    def concat(caches: list[ContextLengths]) -> ContextLengths:
        return ContextLengths(torch.cat([c.lengths for c in caches]))


class ModelFreeDrafter:
    """Base of drafters without a network (oracle, prompt lookup): a `DSparkConfig`-like `config`, a
    `ContextLengths` cache that only counts committed tokens, no cost curve (`draft_curve = None`) and no target
    features (`reads_features = False`: the target's forwards skip the hidden states).

    Subclasses implement `propose`. `generate(assistant_model=drafter)` works once the target is DSpark-enabled
    (`hf_dspark.enable(target)`).
    """

    draft_curve = None
    reads_features = False

    def __init__(self, config: Any) -> None:
        self.config = config

    def init_cache(self, batch_size: int, capacity: int | None = None) -> ContextLengths:
        return ContextLengths.empty(batch_size)

    def extend_context(self, cache: ContextLengths, target_hidden: torch.Tensor | None, valid: torch.Tensor,
                       counts: Sequence[int] | None = None) -> None:
        """Count the committed tokens: `counts` host ints per row when the caller knows them, else `valid`'s."""
        host = valid.sum(dim=1).to("cpu") if counts is None else torch.tensor(list(counts), dtype=torch.long)
        cache.advance(host)

    @property
    def last_generation_stats(self):
        """Statistics of the last DSpark `generate` call with this drafter (None before the first)."""
        from .stats import last_generation_stats

        return last_generation_stats(self)

    def one_hot(self, drafts: torch.Tensor, wanted: bool) -> torch.Tensor | None:
        """One-hot draft distributions `[R, γ, V]` when `wanted` (sampling), else None (a scatter: no range check
        that would read the drafts back)."""
        if not wanted:
            return None
        probs = torch.zeros(*drafts.shape, self.config.vocab_size, dtype=torch.float32, device=drafts.device)
        return probs.scatter_(-1, drafts[..., None], 1.0)
