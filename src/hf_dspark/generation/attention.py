"""Multi-token verification without copying the KV cache for grouped-query attention.

transformers' SDPA path packs the query heads of one KV group together for a single query token (decoding), but
for several query tokens with a mask it expands keys and values to every query head (`repeat_kv`): a copy of the
whole KV cache per layer per forward, which on CPU costs more than the attention itself once the cache holds a
few hundred tokens (a verification forward of 16 rows × 4 tokens over 237 cached slots, bf16, 1 thread: 4.0 ms
per layer with the copy, 1.6 ms without). DSpark verifies several tokens per row every drafting round, so it runs
its verification forwards with `packed_gqa_sdpa`, which extends the single-token packing to T tokens:

    query `[B, H, T, D]` → `[B, H_kv, n_rep·T, D]` (the n_rep query heads of a group stacked along the queries),
    mask `[B, 1, T, K]` → `[B, 1, n_rep·T, K]` (the same rows for every head of the group),

one `scaled_dot_product_attention` over the unexpanded keys and values, and the output reshaped back. Each output
row is the same softmax-weighted sum as before, computed by the same kernel. Anything else (one query token, no
mask, a per-head mask, position bias, dropout) goes to transformers' own SDPA function unchanged.

`packed_gqa_attention(model)` selects it for the forwards of the calling thread inside the block: while any thread
is inside one, the model's text config names the registered function instead of "sdpa" (and gets its own value back
when the last one exits, exceptions included), and the function packs only for threads inside a block; a plain
forward of the same model in another thread meanwhile runs transformers' SDPA function exactly as without it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..functional import grouped_query_attention

PACKED_SDPA = "dspark_packed_sdpa"
_SCOPE = threading.local()  # .depth: how many packed_gqa_attention blocks the current thread is inside
_LOCK = threading.Lock()
_ACTIVE: dict[int, int] = {}  # id(text config) -> blocks running on it, all threads (configs are unhashable)


def packed_gqa_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, position_bias: torch.Tensor | None = None, **kwargs):
    """transformers attention function: query `[B, H, T, D]`, key / value `[B, H_kv, K, D]`, mask `[B, 1, T, K]`
    (bool or additive) → (output `[B, T, H, D]`, None). Falls back to transformers' SDPA outside its case."""
    groups = getattr(module, "num_key_value_groups", 1)
    steps = query.shape[2]
    packable = (
        groups > 1 and steps > 1 and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1 and position_bias is None and not dropout
        and kwargs.get("softcap") is None and not kwargs.get("output_attentions", False)
    )
    if not packable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, position_bias=position_bias, **kwargs)
    output = grouped_query_attention(query, key, value, attention_mask, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


def scoped_packed_gqa_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, **kwargs):
    """The function registered as `PACKED_SDPA`: `packed_gqa_sdpa` for a thread inside a `packed_gqa_attention`
    block, transformers' SDPA function for any other thread running the same model meanwhile."""
    attend = packed_gqa_sdpa if getattr(_SCOPE, "depth", 0) else sdpa_attention_forward
    return attend(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    """Make `PACKED_SDPA` a known attention (and mask) implementation; idempotent, done on first use."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if PACKED_SDPA not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        ALL_ATTENTION_FUNCTIONS.register(PACKED_SDPA, scoped_packed_gqa_sdpa)
    if PACKED_SDPA not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_SDPA, sdpa_mask)


@contextmanager
def packed_gqa_attention(model) -> Iterator[None]:
    """Run the calling thread's forwards inside with `packed_gqa_sdpa` when `model` is an SDPA grouped-query-
    attention model; otherwise (eager, flash, no GQA) nothing changes. Blocks nest and overlap across threads: the
    config names the packed function from the first entry to the last exit, and only threads inside a block pack."""
    config = model.config.get_text_config(decoder=True)
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    with _LOCK:
        key = id(config)  # the config outlives the block: the model holds it
        ours = _ACTIVE.get(key, 0) > 0  # another block already switched this config
        if not ours and (config._attn_implementation != "sdpa" or not heads or not kv_heads or kv_heads >= heads):
            entered = False
        else:
            if not ours:
                _register()
                config._attn_implementation = PACKED_SDPA
            _ACTIVE[key] = _ACTIVE.get(key, 0) + 1
            entered = True
    if not entered:
        yield
        return
    _SCOPE.depth = getattr(_SCOPE, "depth", 0) + 1
    try:
        yield
    finally:
        _SCOPE.depth -= 1
        with _LOCK:
            _ACTIVE[key] -= 1
            if _ACTIVE[key] == 0:
                del _ACTIVE[key]
                config._attn_implementation = "sdpa"
