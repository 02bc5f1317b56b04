"""What the round kernel does with a drafter (`proposers.base.DraftModel`): the layers it taps, extending its
context, and the draft-side logits processing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..proposers.base import DraftModel
from .processors import RowProcessors


def feature_layers(drafter: DraftModel) -> list[int]:
    """`output_hidden_states` indices the drafter reads (layer i's output is hidden_states[i + 1]); none for a
    drafter whose `reads_features` is False (model-free drafters: the target then returns no hidden states)."""
    if not drafter.reads_features:
        return []
    return [i + 1 for i in (getattr(drafter.config, "target_layer_ids", None) or [])]


def extend_drafter_context(drafter: DraftModel, cache: Any, features: torch.Tensor | None, valid: torch.Tensor,
                           counts: Sequence[int] | None, takes_counts: bool) -> None:
    """`drafter.extend_context`, with the host `counts` when the drafter takes them (`accepts_host_counts`)."""
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
