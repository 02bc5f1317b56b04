"""The `generate(..., return_dict_in_generate=True)` output of a DSpark call, field by field as plain `generate`'s.

`cache`: the loop's own target cache cannot be returned: it keeps rejected drafts as masked holes, rows leave it
when they finish, and its slots sit at other columns than the returned sequences' tokens. Plain `generate` returns
a cache holding, for every row, the K/V of every column of `sequences` but the last (left padding, prompt,
generated tokens, and the pad tokens it fed to rows that had finished), built as `DynamicCache(config=...)` builds
it. One target forward over `sequences[:, :-1]`, with plain's attention mask (the prompt's, then ones) and
positions, rebuilds that cache, so a later call continues from it exactly as from plain's.

`scores` / `logits` of a row at the steps after it finished: plain `generate` keeps feeding such a row pad tokens
and reports the target's logits on them (and the processed scores). DSpark runs only unfinished rows; the same
forward gives those logits at the last positions, and the row's processors turn them into plain's scores.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput


def continuation_mask(prompt_mask: torch.Tensor | None, sequences: torch.Tensor) -> torch.Tensor:
    """`[B, L]` attention mask plain `generate` ends with: the prompt's `[B, P]` mask (ones if None), then ones for
    every generated column, finished rows included (plain keeps feeding them pad tokens)."""
    batch, width = sequences.shape
    if prompt_mask is None:
        return torch.ones(batch, width, dtype=torch.long, device=sequences.device)
    tail = prompt_mask.new_ones(batch, width - prompt_mask.shape[1])
    return torch.cat([prompt_mask, tail], dim=1)


def rebuild_forward(
    model, sequences: torch.Tensor, prompt_mask: torch.Tensor | None, keep_cache: bool, tail: int
) -> tuple[DynamicCache | None, torch.Tensor]:
    """One forward over `sequences[:, :-1]` `[B, L-1]` as plain decoding saw them: (the cache plain `generate`
    would return, or None; fp32 logits of the last `max(tail, 1)` positions `[B, max(tail, 1), V]`)."""
    mask = continuation_mask(prompt_mask, sequences)[:, :-1]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate's prepare_inputs does
    cache = DynamicCache(config=model.config.get_text_config(decoder=True)) if keep_cache else None
    out = model(
        input_ids=sequences[:, :-1],
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=keep_cache,
        logits_to_keep=max(tail, 1),
    )
    return cache, out.logits.float()


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
    """`GenerateDecoderOnlyOutput` as plain `generate` fills it; `rows` is the loop's `RowState`, `processors`
    its `RowProcessors`. The one extra forward runs when a cache is returned or a row finished early."""
    generated = [history.shape[0] - rows.prompt_width for history in rows.histories]
    keep_cache = config.use_cache is not False
    want = bool(config.output_scores or config.output_logits)
    tail = max(generated) - min(generated) if want else 0
    cache, tail_logits = (
        rebuild_forward(model, sequences, prompt_mask, keep_cache, tail) if keep_cache or tail else (None, None)
    )
    scores = rows.step_scores("scores") if config.output_scores else None
    logits = rows.step_scores("logits") if config.output_logits else None
    if tail and scores is not None:
        scores = fill_finished_steps(scores, generated, tail_logits, sequences, rows.prompt_width, processors.apply)
    if tail and logits is not None:
        logits = fill_finished_steps(logits, generated, tail_logits, sequences, rows.prompt_width)
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, cache=cache)
