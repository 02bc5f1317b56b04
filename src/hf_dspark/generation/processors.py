"""Apply generate's logits processors to ragged rows, on the exact prefix each distribution conditions on.

Plain `generate` calls the processor list once per step on the whole batch. Here rows advance by different
numbers of tokens per round and each round needs processed distributions at several positions per row, so:

- history-free processors (temperature, top-k, top-p, min-p, typical, epsilon, eta) are applied to any stack of
  rows at once, since their output depends on the scores alone;
- every other processor (repetition penalty, n-gram blocking, min-length, ...) is applied row by row, with a
  per-row copy of the processor list whose batch-shaped tensors are sliced to that row, and the row's full
  history (its original left padding included) as `input_ids`: exactly what plain batched generate feeds it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

HISTORY_FREE = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)


def _slice_row(processor, batch_size: int, row: int):
    """Copy of `processor` with every tensor attribute of leading size `batch_size` cut to `[row:row+1]`."""
    clone = copy.deepcopy(processor)
    if batch_size == 1:
        return clone
    for name, value in vars(clone).items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == batch_size:
            setattr(clone, name, value[row : row + 1].clone())
    return clone


class RowProcessors:
    """Per-row logits processing for R rows (indices into the original batch)."""

    def __init__(self, processors: LogitsProcessorList | None, batch_size: int) -> None:
        processors = processors if processors is not None else LogitsProcessorList()
        self.history_free = all(isinstance(p, HISTORY_FREE) for p in processors)
        self.shared = LogitsProcessorList(processors)
        self.per_row: list[LogitsProcessorList] | None = None
        if not self.history_free:
            self.per_row = [
                LogitsProcessorList(_slice_row(p, batch_size, r) for p in processors) for r in range(batch_size)
            ]

    @property
    def is_empty(self) -> bool:
        return len(self.shared) == 0

    def apply(self, rows: Sequence[int], prefixes: Sequence[torch.Tensor], scores: torch.Tensor) -> torch.Tensor:
        """Process `scores` `[N, V]`; entry i belongs to original row `rows[i]` with history `prefixes[i]` `[L_i]`."""
        if self.is_empty:
            return scores
        if self.history_free:
            # History-free warpers ignore input_ids beyond their batch size: give them a stand-in.
            stand_in = scores.new_zeros(scores.shape[0], 1, dtype=torch.long)
            return self.shared(stand_in, scores)
        out = torch.empty_like(scores)
        for i, (row, prefix) in enumerate(zip(rows, prefixes)):
            out[i : i + 1] = self.per_row[row](prefix[None, :], scores[i : i + 1])
        return out

    def apply_positions(
        self, rows: Sequence[int], histories: Sequence[torch.Tensor], drafts: torch.Tensor, scores: torch.Tensor,
        counts: torch.Tensor,
    ) -> torch.Tensor:
        """Process target scores `[A, T, V]` at positions j < counts[a] of each active row a.

        Position j of row a conditions on histories[a] followed by drafts[a, :j]. Positions past counts[a] are
        left as they are (never read).
        """
        if self.is_empty:
            return scores
        if self.history_free:
            valid = torch.arange(scores.shape[1], device=scores.device)[None, :] < counts[:, None]
            flat = self.apply([], [], scores[valid])
            out = scores.clone()
            out[valid] = flat
            return out
        out = scores.clone()
        for a, row in enumerate(rows):
            for j in range(int(counts[a])):
                prefix = torch.cat([histories[a], drafts[a, :j]])
                out[a, j : j + 1] = self.per_row[row](prefix[None, :], scores[a, j : j + 1])
        return out
