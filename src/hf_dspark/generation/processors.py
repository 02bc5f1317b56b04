"""Apply generate's logits processors to ragged rows, on the exact prefix each distribution conditions on.

Plain `generate` calls the processor list once per step on the whole batch. Here rows advance by different
numbers of tokens per round and each round needs processed distributions at several positions per row, so:

- history-free processors (temperature, top-k, top-p, min-p, typical, epsilon, eta, `suppress_tokens`) are applied
  to any stack of rows at once, since their output depends on the scores alone;
- every other processor (repetition penalty, n-gram blocking, min-length, ...) is applied row by row, with a
  per-row copy of the processor list whose per-row tensors (`batch_attributes`; token-id lists are shared by every
  row, whatever their length) are sliced to that row, and the row's full history (its original left padding
  included) as `input_ids`: exactly what plain batched generate feeds it.
  `PrefixConstrainedLogitsProcessor`'s function is called with the row's real batch index.

Row by row is faithful only for processors whose output for a row depends on that row's `input_ids` and scores
alone and that keep no state between calls (the loop also calls them at draft positions that may be rejected).
The transformers processors with that property are listed in `ROW_LOCAL`; any other processor is refused before
generation starts, unless it declares `dspark_row_local = True` (class or instance attribute).

A round calls the processors at every draft and verified position (≈ 2γ calls where plain decoding makes one per
token), so a processor's fixed cost per call weighs more here. transformers' minimum-length processors rebuild their
EOS mask with `torch.isin` over the whole vocabulary on every call; `EosFloor` replaces them with the same values
computed by index (`cheaper_equivalent`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from transformers.generation import logits_process as lp
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    PrefixConstrainedLogitsProcessor,
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
    lp.SuppressTokensLogitsProcessor,  # the same tokens at every position
)

# Output for a row depends on that row's input_ids and scores only, no state across calls (audited transformers 5).
ROW_LOCAL = HISTORY_FREE + tuple(
    getattr(lp, name) for name in (
        "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "RepetitionPenaltyLogitsProcessor",
        "EncoderRepetitionPenaltyLogitsProcessor",
        "TopHLogitsWarper", "NoRepeatNGramLogitsProcessor", "SequenceBiasLogitsProcessor",
        "NoBadWordsLogitsProcessor", "PrefixConstrainedLogitsProcessor", "ForcedBOSTokenLogitsProcessor",
        "ForcedEOSTokenLogitsProcessor", "InfNanRemoveLogitsProcessor", "ExponentialDecayLengthPenalty",
        "LogitNormalization", "SuppressTokensAtBeginLogitsProcessor", "SuppressTokensLogitsProcessor",
        "WatermarkLogitsProcessor",
    ) if hasattr(lp, name)
)


# transformers processors that are not row-local, with the generate option that adds them
_GENERATE_OPTIONS = {
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config (SynthID)",
}


def check_row_local(processors: LogitsProcessorList) -> None:
    """Refuse processors that row-by-row application cannot reproduce (state, batch-wide coupling, unknown)."""
    for processor in processors:
        if isinstance(processor, ROW_LOCAL) or getattr(processor, "dspark_row_local", False) is True:
            continue
        name = type(processor).__name__
        why = (
            f"DSpark cannot apply the logits processor {name} faithfully: it applies processors row by row, on "
            "ragged prefixes and at draft positions that may be rejected, so a processor must compute each row "
            "from that row's input_ids and scores alone and keep no state between calls."
        )
        if type(processor).__module__.startswith("transformers."):
            option = _GENERATE_OPTIONS.get(name)
            fix = "generate without the DSpark assistant."
            if option:
                fix = f"generate adds it for `{option}`: drop that option or {fix}"
            raise ValueError(f"{why} {fix[0].upper()}{fix[1:]}")
        raise ValueError(
            f"{why} If {name} does, set `dspark_row_local = True` on it; otherwise generate without the DSpark "
            "assistant."
        )


class EosFloor:
    """Forbid EOS while a sequence is shorter than a floor: `MinLengthLogitsProcessor` (floor on the whole length)
    and `MinNewTokensLengthLogitsProcessor` (floor on the length past `skip` prompt tokens), value for value.

    Args:
        eos_token_id: `[E]` EOS ids; ids outside the vocabulary are ignored, as `torch.isin` ignores them.
        min_length: while `input_ids.shape[-1] - skip < min_length`, the EOS scores become −inf.
        skip: tokens of `input_ids` not counted (the prompt, for `min_new_tokens`).
    """

    dspark_row_local = True

    def __init__(self, eos_token_id: torch.Tensor, min_length: int, skip: int = 0) -> None:
        self.eos_token_id, self.min_length, self.skip = eos_token_id.reshape(-1), min_length, skip
        self._columns: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _eos_columns(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        key = (vocab_size, device)
        if key not in self._columns:
            eos = self.eos_token_id.to(device=device, dtype=torch.long)
            self._columns[key] = eos[(eos >= 0) & (eos < vocab_size)].unique()
        return self._columns[key]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] - self.skip >= self.min_length:
            return scores.clone()
        return scores.index_fill(-1, self._eos_columns(scores.shape[-1], scores.device), -math.inf)


def cheaper_equivalent(processor):
    """`processor`, or a faster processor giving identical scores (`EosFloor` for transformers' exact
    minimum-length classes; subclasses are kept, since they may change the rule)."""
    if type(processor) is lp.MinLengthLogitsProcessor:
        return EosFloor(processor.eos_token_id, processor.min_length)
    if type(processor) is lp.MinNewTokensLengthLogitsProcessor:
        return EosFloor(processor.eos_token_id, processor.min_new_tokens, processor.prompt_length_to_skip)
    return processor


class _RowBatchId:
    """`prefix_allowed_tokens_fn` seen through a batch-size-1 view of row `row`: passes the real batch index."""

    def __init__(self, function, row: int) -> None:
        self.function, self.row = function, row

    def __call__(self, batch_id: int, input_ids: torch.Tensor):
        return self.function(self.row + batch_id, input_ids)


def _slice_row(processor, batch_size: int, row: int):
    """Copy of `processor` for row `row` alone: its per-row tensor attributes (`batch_attributes`) cut to
    `[row:row+1]`, and `prefix_allowed_tokens_fn` given the row's real batch index."""
    clone = copy.deepcopy(processor)
    if isinstance(clone, PrefixConstrainedLogitsProcessor):  # the user's function itself, not a deep copy
        clone._prefix_allowed_tokens_fn = _RowBatchId(processor._prefix_allowed_tokens_fn, row)
    if batch_size == 1:
        return clone
    for name in batch_attributes(processor):
        value = getattr(clone, name, None)
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == batch_size:
            setattr(clone, name, value[row : row + 1].clone())
    return clone


# transformers processors' attributes that hold one entry per batch row (everything else is shared by all rows,
# e.g. token-id lists such as `suppress_tokens` or EOS ids, whatever their length)
_BATCH_ATTRIBUTES = {
    "RepetitionPenaltyLogitsProcessor": ("prompt_ignore_length",),
    "EncoderRepetitionPenaltyLogitsProcessor": ("encoder_input_ids",),
}


def batch_attributes(processor) -> tuple[str, ...]:
    """Names of `processor`'s per-row tensor attributes, cut to one row for each row's copy: transformers' known
    ones, or what a processor declares in `dspark_batch_attributes` (none by default)."""
    declared = getattr(processor, "dspark_batch_attributes", None)
    if declared is not None:
        return tuple(declared)
    if type(processor).__module__.startswith("transformers."):
        return _BATCH_ATTRIBUTES.get(type(processor).__name__, ())
    return ()


class RowProcessors:
    """Per-row logits processing for R rows (indices into the original batch)."""

    def __init__(self, processors: LogitsProcessorList | None, batch_size: int) -> None:
        processors = processors if processors is not None else LogitsProcessorList()
        check_row_local(processors)
        processors = LogitsProcessorList(cheaper_equivalent(p) for p in processors)
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
