"""Per-row token histories, stopping, and the checks run before a DSpark generate call."""

from __future__ import annotations

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..binding import validate_target_shape
from .call_checks import check_call
from .drafting import is_draft_model
from .target_checks import check_target
from .transfer import upload


def validate_call(model, drafter, generation_config) -> None:
    """Raise a clear error for every setting the DSpark loop does not support."""
    if not is_draft_model(drafter):
        raise TypeError(
            f"the DSpark loop needs a DSpark drafter as assistant (a DSparkDrafter, or an object with config."
            f"block_size, init_cache, extend_context and propose), got {type(drafter).__name__}"
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("DSpark speculative decoding supports decoder-only targets, not encoder-decoder models.")
    if (generation_config.num_beams or 1) > 1:
        raise ValueError("DSpark does not support beam search: set num_beams=1 (greedy or sampling).")
    if (generation_config.num_return_sequences or 1) > 1:
        raise ValueError(
            "DSpark generates one sequence per prompt: set num_return_sequences=1 and repeat the prompt in the "
            "batch instead (batches of any size are supported)."
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError(
            "output_attentions / output_hidden_states are not available with DSpark (the target runs on "
            "ragged verification blocks); use output_scores or output_logits."
        )
    bind_drafter(model, drafter)
    check_call(model, drafter, generation_config)  # soft prompts, DoLa, length-dependent RoPE, a moved target


def bind_drafter(model, drafter) -> None:
    """Check that `drafter` fits `model` and bind it when unbound (shared by `generate` and `DSparkEngine`).

    A drafter bound to another model instance is refused, never rebound: binding moves it to the new model's
    embedding, LM head, device and dtype, so the other model's `generate` calls would be refused and an engine
    already serving it would draft with the wrong model's weights (or fail on a device/dtype mismatch).
    """
    check_target(model)  # quantized, offloaded or dropout-active targets, before any work
    if not hasattr(drafter, "bind_target"):  # a model-free drafter (oracle, prompt lookup): nothing to bind
        validate_target_shape(drafter.config, model)
        return
    if drafter.is_bound and not drafter.bound_to(model):
        raise ValueError(
            "This drafter is bound to a different target model instance; using it here would take it from that "
            "model (an engine serving it would then draft with this model's weights). Bind it to the model you "
            "generate with: drafter.bind_target(model), or load a second drafter for this model."
        )
    validate_target_shape(drafter.config, model)
    if not drafter.is_bound:
        drafter.bind_target(model)


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


class RowState:
    """Token histories of the original batch rows (left padding included, as plain generate keeps them)."""

    def __init__(self, input_ids: torch.Tensor, stopping_criteria, generation_config) -> None:
        self.histories = [row.clone() for row in input_ids]
        self.prompt_width = input_ids.shape[1]
        self.stopping_criteria = stopping_criteria
        self.finished = [False] * input_ids.shape[0]
        self.max_length = generation_config.max_length
        pad = getattr(generation_config, "_pad_token_tensor", None)
        self.pad_token_id = int(pad.reshape(-1)[0]) if pad is not None else 0
        self.keep_scores = bool(generation_config.return_dict_in_generate and generation_config.output_scores)
        self.keep_logits = bool(generation_config.return_dict_in_generate and generation_config.output_logits)
        self.scores: list[list[torch.Tensor]] = [[] for _ in self.histories]
        self.logits: list[list[torch.Tensor]] = [[] for _ in self.histories]
        self.host_rules = host_stopping_rules(stopping_criteria)
        self._pending: dict[int, list[int]] = {}  # tokens committed on the host, not yet in `histories`

    def history(self, row: int) -> torch.Tensor:
        self.flush_uploads()
        return self.histories[row]

    def _length(self, row: int) -> int:
        return int(self.histories[row].shape[0]) + len(self._pending.get(row, ()))

    def remaining(self, row: int) -> int:
        return self.max_length - self._length(row)

    def flush_uploads(self) -> None:
        """Append the tokens committed on the host since the last flush to the histories: one upload for all rows."""
        if not self._pending:
            return
        rows = sorted(self._pending)
        width = max(len(self._pending[r]) for r in rows)
        padded = [self._pending[r] + [0] * (width - len(self._pending[r])) for r in rows]
        uploaded = upload(padded, self.histories[0].device, self.histories[0].dtype)  # pinned, non-blocking
        for i, row in enumerate(rows):
            count = len(self._pending[row])
            self.histories[row] = torch.cat([self.histories[row], uploaded[i, :count]])
        self._pending = {}

    def commit(self, row: int, tokens: list[int], scores: torch.Tensor, raw_logits: torch.Tensor) -> int:
        """Append tokens one at a time through the stopping criteria; returns how many were kept."""
        if self.host_rules is not None:
            return self._commit_on_host(row, tokens, scores, raw_logits)
        history = self.histories[row]
        for i, token in enumerate(tokens):
            history = torch.cat([history, history.new_tensor([token])])
            if self.keep_scores:  # a copy: a view would keep the round's whole [A, T, V] alive
                self.scores[row].append(scores[i].clone())
            if self.keep_logits:
                self.logits[row].append(raw_logits[i].clone())
            if self._stops(row, history, scores[i : i + 1]):
                self.finished[row] = True
                self.histories[row] = history
                return i + 1
        self.histories[row] = history
        return len(tokens)

    def _stops(self, row: int, history: torch.Tensor, scores: torch.Tensor) -> bool:
        """The stopping criteria's verdict for `row`: called on a batch-shaped input (the row's history at every
        batch position, so a criterion with per-row state reads row `row`'s) and read at position `row`."""
        batch = len(self.histories)
        done = self.stopping_criteria(history[None, :].expand(batch, -1), scores.expand(batch, -1))
        done = done.reshape(-1)
        return bool(done[row] if done.numel() == batch else done.any())

    def _commit_on_host(self, row: int, tokens: list[int], scores: torch.Tensor, raw_logits: torch.Tensor) -> int:
        """`commit` when the stopping criteria are only max-length and EOS: checked on host ints, one upload."""
        max_length, eos = self.host_rules
        length, kept = self._length(row), len(tokens)
        for i, token in enumerate(tokens):
            length += 1
            if token in eos or (max_length is not None and length >= max_length):
                kept, self.finished[row] = i + 1, True
                break
        self._pending.setdefault(row, []).extend(tokens[:kept])
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
        width = max(h.shape[0] for h in self.histories)
        dtype = torch.promote_types(self.histories[0].dtype, torch.long)
        out = self.histories[0].new_full((len(self.histories), width), self.pad_token_id, dtype=dtype)
        for r, history in enumerate(self.histories):
            out[r, : history.shape[0]] = history
        return out

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
