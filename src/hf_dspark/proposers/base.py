"""The drafter base class the DSpark round talks to (`DraftModel`), and a context cache for model-free drafters.

A drafter subclasses `DraftModel` and has a `config` (`block_size` γ, `vocab_size`, `target_layer_ids`) and three
methods:

- `init_cache(batch_size)`: an empty per-row context cache (it must offer `select_rows(index)` and a static
  `concat(caches)`, like `DSparkDraftCache`);
- `extend_context(cache, features, valid, counts=None)`: append the committed tokens' tapped target features
  `[R, n, ·]` (`valid` `[R, n]` marks real entries; `features` is None when the drafter taps no layer); `counts`:
  each row's valid entries as host ints, which the round kernel knows from its one download per round, so the
  drafter need not read `valid` back from the device;
- `propose(anchor_ids, cache, *, do_sample, logits_processor, row_ids, histories)` -> a `DSparkProposal`.

Its optional capabilities are declared on the class, never probed: `reads_features` (False: `extend_context` gets
None and the target returns no hidden states), `accepts_host_counts` (False: `extend_context` is called without
`counts`), `draft_curve` (a `StepCurve` of proposals per second against rows; None for a model-free drafter, whose
cost ≈ 0), and the two forecasts the "auto" policy reads before it plans, whose defaults say "nothing of its own":
`row_draft_costs(cache, histories)` -> `[R]` each row's share of that curve's per-row cost this round (a hybrid's
lookup rows pay ≈ 0) and `row_acceptance(cache)` -> per row its own forecast of the conditional acceptance of this
round's drafts (`[γ]` host floats) or None. Both may read only the committed context and earlier rounds.

When a `generate` call ends, the loop hands the call's `DSparkGenerationStats` to `record_generation`; the drafter
keeps it as `last_generation_stats` (the same object is the `dspark_stats` of a `return_dict_in_generate` output).

`hf_dspark.DSparkDrafter` subclasses it next to its network (`hf_dspark.model.modeling_dspark.DSparkModel`); so do
the model-free drafters (`ModelFreeDrafter`: the oracle, prompt lookup, suffix matching) and the hybrid drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


class DraftModel:
    """Base of every drafter the DSpark loop runs (see the module docstring): the three methods to implement and
    the optional capabilities, declared as class attributes with their defaults.

    Attributes:
        reads_features: the drafter reads the target's tapped hidden states (`config.target_layer_ids`).
        accepts_host_counts: `extend_context` takes `counts=` (host ints per row).
        draft_curve: the drafter's cost curve (`StepCurve`), or None to look it up by its weights
            (`hf_dspark.profiling.draft_steps.load_or_profile_draft_curve`; a drafter without weights costs ≈ 0).
    """

    reads_features: ClassVar[bool] = True
    accepts_host_counts: ClassVar[bool] = True
    draft_curve: Any = None
    config: Any

    def init_cache(self, batch_size: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement init_cache(batch_size).")

    def extend_context(self, cache: Any, target_hidden: torch.Tensor | None, valid: torch.Tensor,
                       counts: Sequence[int] | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement extend_context(cache, features, valid).")

    def propose(self, anchor_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement propose(anchor_ids, cache, ...).")

    def row_draft_costs(self, cache: Any, histories: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """`[R]` each row's share of the drafter's per-row cost this round; None: one share each."""
        return None

    def row_acceptance(self, cache: Any) -> list[list[float] | None] | None:
        """Per row, the drafter's own forecast of this round's conditional acceptance (`[γ]`), or None."""
        return None

    def record_generation(self, stats: Any) -> None:
        """Keep the statistics of the `generate` call that just ended (`last_generation_stats`)."""
        vars(self)["_last_generation_stats"] = stats

    @property
    def last_generation_stats(self) -> Any:
        """`DSparkGenerationStats` of the last DSpark `generate` call with this drafter (None before the first)."""
        return vars(self).get("_last_generation_stats")


def is_draft_model(obj: Any) -> bool:
    """True when `obj` is a `DraftModel` with a γ (a DSpark drafter, the oracle, prompt lookup, a hybrid...)."""
    return isinstance(obj, DraftModel) and hasattr(getattr(obj, "config", None), "block_size")


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


class ModelFreeDrafter(DraftModel):
    """Base of drafters without a network (oracle, prompt lookup): a `DSparkConfig`-like `config`, a
    `ContextLengths` cache that only counts committed tokens, no cost curve (`draft_curve = None`) and no target
    features (`reads_features = False`: the target's forwards skip the hidden states).

    Subclasses implement `propose`. `generate(assistant_model=drafter)` works once the target is DSpark-enabled
    (`hf_dspark.enable(target)`; the `*_for(target, ...)` helpers of `hf_dspark.generation` build and enable at once).
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

    def one_hot(self, drafts: torch.Tensor, wanted: bool) -> torch.Tensor | None:
        """One-hot draft distributions `[R, γ, V]` when `wanted` (sampling), else None (a scatter: no range check
        that would read the drafts back)."""
        if not wanted:
            return None
        probs = torch.zeros(*drafts.shape, self.config.vocab_size, dtype=torch.float32, device=drafts.device)
        return probs.scatter_(-1, drafts[..., None], 1.0)
