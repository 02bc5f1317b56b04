"""The prefill forward of a DSpark `generate` call, with or without a cache that already holds a prefix.

Plain `generate(input_ids, cache=prefix_cache)` feeds only the tokens the cache does not hold yet (a cached system
prompt). DSpark does the same for the target, so the target sees exactly what plain `generate` shows it. The
drafter also needs the tapped target features of the cached prefix (its context, Eqs. 2-3); a cache holds keys and
values only, so one extra target forward over the prefix recomputes them. When the given cache has layers that
ragged verification cannot use (sliding-window layers that dropped old entries, static layers), that forward also
rebuilds the prefix's keys and values into a fresh cache of full layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from ..target.ragged_cache import RaggedTargetCache, attention_layout, new_target_cache
from ..target.static_cache import StaticPlan, StaticTargetCache


@dataclass
class PrefillOutput:
    """logits: `[B, V]` float32 at the last prompt position; features: `[B, L, n_taps·d]` tapped hidden states of
    every prompt token (None without taps); valid: `[B, L]` real (non-padding) prompt tokens; target: the ragged
    target cache."""

    logits: torch.Tensor
    features: torch.Tensor | None
    valid: torch.Tensor
    target: RaggedTargetCache | StaticTargetCache


def _usable(cache) -> bool:
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _positions(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """What `generate` computes when the caller gives no position_ids: cumsum of the mask − 1 (pads at 0)."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device)[None, :].expand(input_ids.shape[0], -1)
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def _taps(out, tap_indices: list[int]) -> torch.Tensor | None:
    return torch.cat([out.hidden_states[i] for i in tap_indices], dim=-1) if tap_indices else None


def prefill_target(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   position_ids: torch.Tensor | None, cache, tap_indices: list[int],
                   static: StaticPlan | None = None) -> PrefillOutput:
    """Run the target over the prompt (the part `cache` does not hold yet) and build the ragged target cache.

    input_ids / attention_mask / position_ids: `[B, L]` as `generate` prepared them (mask and positions may be
    None); cache: the caller's cache or None; tap_indices: hidden-state indices to return (may be empty);
    static: the static path's plan (`static_cache.static_plan`): the prefilled cache is copied into preallocated
    buffers.
    Raises `ValueError` when the cache already holds every prompt token, or when there are no input_ids.
    """
    layout = attention_layout(model)
    length = input_ids.shape[1]
    if length == 0:
        raise ValueError(
            "DSpark needs the prompt as input_ids (the drafter and the logits processors read token ids); "
            "generate(inputs_embeds=...) without input_ids is not supported: pass input_ids instead."
        )
    cached = int(cache.get_seq_length()) if cache is not None else 0
    if cached >= length:
        raise ValueError(
            f"The cache passed to generate already holds {cached} tokens, but input_ids has {length}: pass the "
            "cached prefix followed by at least one new token (input_ids must start with the cached tokens)."
        )
    positions = position_ids if position_ids is not None else _positions(attention_mask, input_ids)
    prefix_features = None
    if cached:
        rebuilt = None if _usable(cache) else new_target_cache(model)
        prefix = model(
            input_ids=input_ids[:, :cached],
            attention_mask=attention_mask[:, :cached] if attention_mask is not None else None,
            position_ids=positions[:, :cached], cache=rebuilt, use_cache=rebuilt is not None,
            output_hidden_states=tap_indices or None, logits_to_keep=1,
        )
        prefix_features = _taps(prefix, tap_indices)
        cache = cache if rebuilt is None else prefix.cache
    elif cache is None or not _usable(cache):
        cache = new_target_cache(model)
    out = model(
        input_ids=input_ids[:, cached:], attention_mask=attention_mask, position_ids=positions[:, cached:],
        cache=cache, use_cache=True, output_hidden_states=tap_indices or None, logits_to_keep=1,
    )
    features = _taps(out, tap_indices)
    if prefix_features is not None:
        features = torch.cat([prefix_features, features], dim=1)
    valid = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    target = RaggedTargetCache(out.cache, valid, valid.sum(dim=1), layout=layout, positions=positions)
    if static is not None:
        target = StaticTargetCache(target, static)
    return PrefillOutput(out.logits[:, -1].float(), features, valid, target)
