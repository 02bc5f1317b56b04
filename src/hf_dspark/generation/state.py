"""Per-row token histories and stopping of a DSpark generate call."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..transfer import upload

HISTORY_GROWTH = 64  # token slots per row reserved past the prompt (the buffer doubles when full)


def host_stopping_rules(stopping_criteria) -> tuple[int | None, frozenset[int]] | None:
    """(max length, EOS ids) when every criterion is transformers' exact `MaxLengthCriteria` or
    `EosTokenCriteria` (both then checked on host ints, no device read per token); None otherwise."""
    max_length, eos = None, set()
    for criterion in stopping_criteria or []:
        if type(criterion) is MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif type(criterion) is EosTokenCriteria:
            eos.update(int(i) for i in criterion.eos_token_id.reshape(-1).tolist())
        else:
            return None
    return max_length, frozenset(eos)


class RowHistories(Sequence):
    """The histories of `rows` (ids into a `RowState`) as they stand when this is built; each is taken from the
    buffer only when read, so a round whose drafter and processors read none costs nothing per row."""

    def __init__(self, state: RowState, rows: Sequence[int]) -> None:
        self.state, self.rows = state, rows
        self.lengths = [state.lengths[row] for row in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.state.view(self.rows[index], self.lengths[index])


class RowState:
    """Token histories of the original batch rows (left padding included, as plain generate keeps them).

    The histories live in one `[B, capacity]` buffer (`tokens`, pad-filled past each row's length, grown by doubling)
    with each row's length as host ints (`lengths`); `history(row)` is a view of the committed part. Tokens committed
    on the host reach the buffer in one upload and one scatter (`flush_uploads`) when something reads it (a history,
    the sequences, the per-token stopping path): once per round when a drafter or processor reads histories, once
    per call when nothing does.
    """

    def __init__(self, input_ids: torch.Tensor, stopping_criteria, generation_config) -> None:
        batch, width = input_ids.shape
        self.prompt_width = width
        self.stopping_criteria = stopping_criteria
        self.finished = [False] * batch
        self.max_length = generation_config.max_length
        pad = getattr(generation_config, "_pad_token_tensor", None)
        self.pad_token_id = int(pad.reshape(-1)[0]) if pad is not None else 0
        self.keep_scores = bool(generation_config.return_dict_in_generate and generation_config.output_scores)
        self.keep_logits = bool(generation_config.return_dict_in_generate and generation_config.output_logits)
        self.scores: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self.logits: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self.host_rules = host_stopping_rules(stopping_criteria)
        self.lengths = [width] * batch  # host ints: each row's tokens, those not yet in `tokens` included
        self.tokens = input_ids.new_full((batch, width + HISTORY_GROWTH), self.pad_token_id)
        self.tokens[:, :width] = input_ids
        self._pending: tuple[list[int], list[int], list[int]] = ([], [], [])  # (row, position, token), not uploaded

    @property
    def histories(self) -> list[torch.Tensor]:
        """Every row's history (views of the buffer)."""
        self.flush_uploads()
        return [self.tokens[row, :length] for row, length in enumerate(self.lengths)]

    def history(self, row: int) -> torch.Tensor:
        return self.view(row, self.lengths[row])

    def view(self, row: int, length: int) -> torch.Tensor:
        """The first `length` tokens of `row` (at most its length): a buffer view that later commits leave as is."""
        self.flush_uploads()
        return self.tokens[row, :length]

    def _length(self, row: int) -> int:
        return self.lengths[row]

    def remaining(self, row: int) -> int:
        return self.max_length - self.lengths[row]

    def _reserve(self, width: int) -> None:
        """Grow the buffer (doubling) to hold `width` tokens per row."""
        capacity = self.tokens.shape[1]
        if width <= capacity:
            return
        grown = self.tokens.new_full((self.tokens.shape[0], max(width, 2 * capacity)), self.pad_token_id)
        grown[:, :capacity] = self.tokens
        self.tokens = grown  # views handed out before keep the old buffer, whose committed part never changes

    def flush_uploads(self) -> None:
        """Write the tokens committed on the host since the last flush into the buffer: one upload for all rows."""
        rows, positions, tokens = self._pending
        if not rows:
            return
        self._reserve(max(positions) + 1)
        index = upload([rows, positions, tokens], self.tokens.device)  # pinned, non-blocking
        self.tokens[index[0], index[1]] = index[2].to(self.tokens.dtype)
        self._pending = ([], [], [])

    def commit_rows(self, rows: list[int], tokens: list[list[int]], scores: torch.Tensor,
                    raw_logits: torch.Tensor) -> list[int]:
        """`commit` for several rows: row `rows[a]` gets `tokens[a]`, chosen from `scores[a]` / `raw_logits[a]`
        (`[A, T, V]`, sliced only when kept or read by a stopping criterion); returns how many each kept."""
        if self.host_rules is None or self.keep_scores or self.keep_logits:
            return [self.commit(row, row_tokens, scores[a, : len(row_tokens)], raw_logits[a, : len(row_tokens)])
                    for a, (row, row_tokens) in enumerate(zip(rows, tokens))]
        return self._commit_rows_on_host(rows, tokens)

    def _commit_rows_on_host(self, rows: list[int], tokens: list[list[int]]) -> list[int]:
        """`_commit_on_host` for several rows that keep no scores: one loop, no call per row unless one stops."""
        max_length, eos = self.host_rules
        limit = math.inf if max_length is None else max_length
        lengths = self.lengths
        pending_rows, positions, pending_tokens = self._pending
        counts = []
        for row, row_tokens in zip(rows, tokens):
            length, kept = lengths[row], len(row_tokens)
            if length + kept >= limit or not eos.isdisjoint(row_tokens):
                kept = self._kept_until_stop(row, row_tokens)
            pending_rows.extend([row] * kept)
            positions.extend(range(length, length + kept))
            pending_tokens.extend(row_tokens[:kept])
            lengths[row] = length + kept
            counts.append(kept)
        return counts

    def _kept_until_stop(self, row: int, tokens: list[int]) -> int:
        """How many of `tokens` row `row` keeps under the host rules (up to and including the one that stops it,
        which finishes the row)."""
        max_length, eos = self.host_rules
        length = self.lengths[row]
        for i, token in enumerate(tokens):
            length += 1
            if token in eos or (max_length is not None and length >= max_length):
                self.finished[row] = True
                return i + 1
        return len(tokens)

    def commit(self, row: int, tokens: list[int], scores: torch.Tensor, raw_logits: torch.Tensor) -> int:
        """Append tokens one at a time through the stopping criteria; returns how many were kept."""
        if self.host_rules is not None:
            return self._commit_on_host(row, tokens, scores, raw_logits)
        self.flush_uploads()
        length = self.lengths[row]
        for i, token in enumerate(tokens):
            self._reserve(length + 1)
            self.tokens[row, length] = token
            length = self.lengths[row] = length + 1
            if self.keep_scores:  # a copy: a view would keep the round's whole [A, T, V] alive
                self.scores[row].append(scores[i].clone())
            if self.keep_logits:
                self.logits[row].append(raw_logits[i].clone())
            if self._stops(row, self.tokens[row, :length], scores[i : i + 1]):
                self.finished[row] = True
                return i + 1
        return len(tokens)

    def _stops(self, row: int, history: torch.Tensor, scores: torch.Tensor) -> bool:
        """The stopping criteria's verdict for `row`: called on a batch-shaped input (the row's history at every
        batch position, so a criterion with per-row state reads row `row`'s) and read at position `row`."""
        batch = len(self.lengths)
        done = self.stopping_criteria(history[None, :].expand(batch, -1), scores.expand(batch, -1))
        done = done.reshape(-1)
        return bool(done[row] if done.numel() == batch else done.any())

    def _commit_on_host(self, row: int, tokens: list[int], scores: torch.Tensor, raw_logits: torch.Tensor) -> int:
        """`commit` when the stopping criteria are only max-length and EOS: checked on host ints, one upload."""
        max_length, eos = self.host_rules
        length, kept = self.lengths[row], len(tokens)
        if not eos.isdisjoint(tokens) or (max_length is not None and length + kept >= max_length):
            kept = self._kept_until_stop(row, tokens)
        pending_rows, positions, pending_tokens = self._pending
        pending_rows.extend([row] * kept)
        positions.extend(range(length, length + kept))
        pending_tokens.extend(tokens[:kept])
        self.lengths[row] = length + kept
        if self.keep_scores:  # one copy of the kept positions: views would keep the round's whole [A, T, V] alive
            self.scores[row].extend(scores[:kept].clone().unbind(0))
        if self.keep_logits:
            self.logits[row].extend(raw_logits[:kept].clone().unbind(0))
        return kept

    def sequences(self) -> torch.Tensor:
        """`[B, prompt + longest generation]`, finished rows padded with the pad token, as plain generate does.

        The dtype is plain generate's too: it appends int64 token ids to the prompt, so a prompt of a narrower
        integer dtype (int32 `input_ids`) comes back promoted to int64.
        """
        self.flush_uploads()
        dtype = torch.promote_types(self.tokens.dtype, torch.long)
        return self.tokens[:, : max(self.lengths)].to(dtype, copy=True)

    def step_scores(self, kind: str) -> tuple[torch.Tensor, ...]:
        """The kept per-step entries of one kind, stacked per generated step as plain `generate` returns them.

        kind: `"scores"` (the processed scores each committed token was chosen from, `self.scores`) or `"logits"`
        (the target's raw logits at that position, `self.logits`); kept only when `return_dict_in_generate` and
        `output_scores` / `output_logits` are set. Returns T tensors, T the most tokens any row generated; step t is
        `[B, V]` (B the original batch rows, every one holding at least its prefill token; V the target's
        vocabulary; dtype and device of the kept entries): row r's entry for its t-th generated token. A row that
        stopped before step t holds a placeholder, a one-hot pad distribution (0 at the pad id, -inf elsewhere),
        which `output_cache.fill_finished_steps` replaces with plain `generate`'s entry (the target's logits on the
        pad tokens fed after the stop, processed for scores).
        """
        per_row = self.scores if kind == "scores" else self.logits
        steps = max(len(s) for s in per_row)
        vocab = next(s[0].shape[-1] for s in per_row if s)
        filler = torch.full((vocab,), -float("inf"))
        filler[self.pad_token_id] = 0.0
        return tuple(
            torch.stack([s[t] if t < len(s) else filler.to(s[0]) for s in per_row if s]) for t in range(steps)
        )
