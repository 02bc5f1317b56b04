"""The `generate(..., return_dict_in_generate=True)` output of a DSpark call, field by field as plain `generate`'s,
and the cache object the call leaves behind.

`cache`: plain `generate` returns (and leaves, in a cache the caller passed) the one cache object of the call:
the caller's `generate(..., cache=c)`, or the one `generate` built for it (`DynamicCache(config=...)`, or a
`StaticCache` sized to `max_length - 1` for `cache_implementation="static"`), holding for every row the K/V of every
column of `sequences` but the last (left padding, prompt, generated tokens, and the pad tokens fed to rows that had
finished). The loop's own verification cache cannot be that object: it keeps rejected drafts as masked holes, rows
leave it when they finish, and its slots sit at other columns than the returned sequences' tokens. `CallCache`
takes the call's cache object before the loop runs and fills it afterwards with the positions it did not hold, in
plain's two stages (the prompt's in one forward, as plain's prefill, then the generated ones in one more; plain's
attention mask, the prompt's then ones, and positions), so it has plain's class, layer types and shapes, its
prompt slots are plain's bit for bit, and a later call continues from it exactly as from plain's.

`scores` / `logits` of a row at the steps after it finished: plain `generate` keeps feeding such a row pad tokens
and reports the target's logits on them (and the processed scores). DSpark runs only unfinished rows; one forward
over the sequences gives those logits at the last positions, and the row's processors turn them into plain's
scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.generation.utils import GenerateDecoderOnlyOutput


def continuation_mask(prompt_mask: torch.Tensor | None, sequences: torch.Tensor) -> torch.Tensor:
    """`[B, L]` attention mask plain `generate` ends with: the prompt's `[B, P]` mask (ones if None), then ones for
    every generated column, finished rows included (plain keeps feeding them pad tokens)."""
    batch, width = sequences.shape
    if prompt_mask is None:
        return torch.ones(batch, width, dtype=torch.long, device=sequences.device)
    tail = prompt_mask.new_ones(batch, width - prompt_mask.shape[1])
    return torch.cat([prompt_mask, tail], dim=1)


def continuation_inputs(
    prompt_mask: torch.Tensor | None, sequences: torch.Tensor, prompt_positions: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention mask, position ids), each `[B, L-1]`, of `sequences[:, :-1]` as plain decoding fed
    them: the prompt's `[B, P]` positions (`prompt_positions`, as `generate` prepared them; when None, its rule
    pos_t = Σ_{s≤t} mask_s − 1 with pads at 0), then each generated token one past the last."""
    mask = continuation_mask(prompt_mask, sequences)[:, :-1]
    if prompt_positions is None:
        return sequences[:, :-1], mask, (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    steps = torch.arange(1, mask.shape[1] - prompt_positions.shape[1] + 1, device=prompt_positions.device)
    positions = torch.cat([prompt_positions, prompt_positions[:, -1:] + steps[None, :]], dim=1)
    return sequences[:, :-1], mask, positions


def last_logits(model, sequences: torch.Tensor, prompt_mask: torch.Tensor | None, tail: int) -> torch.Tensor:
    """fp32 target logits `[B, tail, V]` at the last `tail` positions of `sequences[:, :-1]` `[B, L-1]`, from one
    forward without a cache."""
    input_ids, mask, positions = continuation_inputs(prompt_mask, sequences)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False,
                logits_to_keep=tail)
    return out.logits.float()


def verified_in_place(cache: Cache) -> bool:
    """Whether the DSpark loop verifies in `cache` itself: every layer a `DynamicLayer` (`prefill.prefill_target`
    takes such a cache as its ragged target cache and leaves any other untouched)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


@dataclass(frozen=True)
class CallCache:
    """The cache object a DSpark call leaves behind (module docstring), as it was before the loop ran.

    Args:
        cache: the call's cache object: the caller's, or the one `generate` built for the call.
        cached: positions it held before the call (`cache.get_seq_length()`; a sliding-window layer keeps fewer).
        prefix: copies of its keys and values `([B, H, cached, D], [B, H, cached, D])` per layer when the loop
            verifies in it (`verified_in_place`), given back before it is filled; None when the loop leaves it
            untouched (sliding-window and static layers), so it is only extended.
    """

    cache: Cache
    cached: int
    prefix: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None

    @classmethod
    def before_call(cls, cache: Cache) -> CallCache:
        """Take `cache` before the loop runs (one host read of its length)."""
        cached = int(cache.get_seq_length())
        if not verified_in_place(cache):
            return cls(cache, cached, None)
        if not cached:
            return cls(cache, 0, ())
        return cls(cache, cached, tuple((layer.keys.clone(), layer.values.clone()) for layer in cache.layers))

    def fill(
        self,
        model,
        sequences: torch.Tensor,
        prompt_width: int,
        prompt_mask: torch.Tensor | None = None,
        prompt_positions: torch.Tensor | None = None,
    ) -> Cache:
        """Leave the cache as plain `generate` leaves it after returning `sequences` `[B, L]` (`prompt_mask` /
        `prompt_positions`: the call's `[B, P]` attention mask and position ids, or None; P = prompt_width): the
        positions it held, then the K/V of `sequences[:, cached:-1]` in plain's two stages, the prompt's positions
        in one forward (as plain's prefill, so even the left padding's slots, which no query reads, are plain's),
        then the generated ones in one more. Returns the cache."""
        cache, cached = self.cache, self.cached
        if self.prefix is not None:
            cache.reset()
            for index, (keys, values) in enumerate(self.prefix):
                cache.update(keys, values, index)
        if prompt_positions is not None:  # without a mask, generate's are `[1, cached + P]`
            prompt_positions = prompt_positions[:, :prompt_width].expand(sequences.shape[0], -1)
        input_ids, mask, positions = continuation_inputs(prompt_mask, sequences, prompt_positions)
        prompt_end = max(cached, prompt_width)
        with torch.no_grad():
            for start, end in ((cached, prompt_end), (prompt_end, input_ids.shape[1])):
                if start < end:
                    model(input_ids=input_ids[:, start:end], attention_mask=mask[:, :end],
                          position_ids=positions[:, start:end], cache=cache, use_cache=True, logits_to_keep=1)
        return cache


def returned_cache(model, cache: Cache | None) -> CallCache:
    """The `CallCache` of a call whose cache object is `cache`, or of a fresh `DynamicCache(config=...)` (what
    `generate` builds) when the call has none."""
    if cache is None:
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    return CallCache.before_call(cache)


def fill_finished_steps(
    steps: tuple[torch.Tensor, ...],
    generated: list[int],
    tail_logits: torch.Tensor,
    sequences: torch.Tensor,
    prompt_width: int,
    process: Callable | None = None,
):
    """Per step s `[B, V]`: rows that had finished (generated[r] <= s) get plain's entry, the target's logits on
    the pad tokens fed after their stop (`tail_logits` `[B, K, V]`, the last K steps), processed by
    `process(rows, prefixes, logits)` for scores."""
    out = []
    for step, values in enumerate(steps):
        rows = [r for r, count in enumerate(generated) if count <= step]
        if not rows:
            out.append(values)
            continue
        filled = tail_logits[rows, step - len(steps) + tail_logits.shape[1]]
        if process is not None:
            filled = process(rows, [sequences[r, : prompt_width + step] for r in rows], filled)
        values = values.clone()
        values[rows] = filled.to(values.dtype)
        out.append(values)
    return tuple(out)


def dict_output(
    model, config, rows, processors, sequences: torch.Tensor, prompt_mask: torch.Tensor | None
) -> GenerateDecoderOnlyOutput:
    """`GenerateDecoderOnlyOutput` as plain `generate` fills it, but for `cache` (None here: the call's cache
    object is filled after the loop, `CallCache.fill`); `rows` is the loop's `RowState`, `processors` its
    `RowProcessors`. One extra forward runs when a row finished early and scores or logits are returned."""
    generated = [history.shape[0] - rows.prompt_width for history in rows.histories]
    want = bool(config.output_scores or config.output_logits)
    tail = max(generated) - min(generated) if want else 0
    finished = last_logits(model, sequences, prompt_mask, tail) if tail else None
    scores = rows.step_scores("scores") if config.output_scores else None
    logits = rows.step_scores("logits") if config.output_logits else None
    if tail and scores is not None:
        scores = fill_finished_steps(scores, generated, finished, sequences, rows.prompt_width, processors.apply)
    if tail and logits is not None:
        logits = fill_finished_steps(logits, generated, finished, sequences, rows.prompt_width)
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits)
