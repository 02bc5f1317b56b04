"""The `cache` field of a DSpark `generate(..., return_dict_in_generate=True)` output.

The loop's own target cache cannot be returned: it keeps rejected drafts as masked holes, rows leave it when they
finish, and its slots sit at other columns than the returned sequences' tokens. Plain `generate` returns a cache
holding, for every row, the K/V of every column of `sequences` but the last (left padding, prompt, generated
tokens, and the pad tokens it fed to rows that had finished), built as `DynamicCache(config=...)` builds it. One
target forward over `sequences[:, :-1]`, with plain's attention mask (the prompt's, then ones) and positions,
rebuilds that cache, so a later call continues from it exactly as from plain's.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache


def continuation_mask(prompt_mask: torch.Tensor | None, sequences: torch.Tensor) -> torch.Tensor:
    """`[B, L]` attention mask plain `generate` ends with: the prompt's `[B, P]` mask (ones if None), then ones for
    every generated column, finished rows included (plain keeps feeding them pad tokens)."""
    batch, width = sequences.shape
    if prompt_mask is None:
        return torch.ones(batch, width, dtype=torch.long, device=sequences.device)
    tail = prompt_mask.new_ones(batch, width - prompt_mask.shape[1])
    return torch.cat([prompt_mask, tail], dim=1)


def rebuild_output_cache(model, sequences: torch.Tensor, prompt_mask: torch.Tensor | None) -> DynamicCache:
    """The cache plain `generate` would return for `sequences` `[B, L]`: K/V of columns 0..L-2, one forward."""
    mask = continuation_mask(prompt_mask, sequences)[:, :-1]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate's prepare_inputs does
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    model(
        input_ids=sequences[:, :-1],
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return cache
