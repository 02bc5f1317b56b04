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
`packed_gqa_config(model)` holds the switched config across many blocks (the decoding loop's rounds), so that each
forward's block costs a thread-local count instead of two trips through transformers' validated config setter.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..ops.functional import grouped_query_attention

PACKED_SDPA = "dspark_packed_sdpa"


class _Scope(threading.local):
    """Per thread: how many `packed_gqa_attention` blocks it is inside (a class default: a thread that never entered
    one reads 0 without a failed attribute look-up)."""

    depth = 0


_SCOPE = _Scope()
_LOCK = threading.Lock()
_ACTIVE: dict[int, int] = {}  # id(text config) -> blocks running on it, all threads (configs are unhashable)
_TEXT_CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (its config, that text config)


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
    attend = packed_gqa_sdpa if _SCOPE.depth else sdpa_attention_forward
    return attend(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    """Make `PACKED_SDPA` a known attention (and mask) implementation; idempotent, done on first use."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if PACKED_SDPA not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        ALL_ATTENTION_FUNCTIONS.register(PACKED_SDPA, scoped_packed_gqa_sdpa)
    if PACKED_SDPA not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_SDPA, sdpa_mask)


def _text_config(model):
    """`model`'s text config (`get_text_config(decoder=True)`), looked up once per model and config object: the
    look-up walks the config's sub-configs through transformers' validated attribute access, several µs a call."""
    outer = model.config
    cached = _TEXT_CONFIGS.get(model)
    if cached is None or cached[0] is not outer:
        cached = (outer, outer.get_text_config(decoder=True))
        _TEXT_CONFIGS[model] = cached
    return cached[1]


def _acquire(config) -> bool:
    """Switch `config` to `PACKED_SDPA` for one more block (the first switches it); False, and nothing changed, when
    it is not an SDPA grouped-query-attention config that no block switched yet."""
    key = id(config)  # the config outlives the block: the model holds it
    with _LOCK:
        if _ACTIVE.get(key, 0) == 0:  # no block switched this config yet
            heads = getattr(config, "num_attention_heads", None)
            kv_heads = getattr(config, "num_key_value_heads", None)
            if config._attn_implementation != "sdpa" or not heads or not kv_heads or kv_heads >= heads:
                return False
            _register()
            config._attn_implementation = PACKED_SDPA
        _ACTIVE[key] = _ACTIVE.get(key, 0) + 1
        return True


def _release(config) -> None:
    """One block on `config` ends; the last gives it back "sdpa"."""
    key = id(config)
    with _LOCK:
        _ACTIVE[key] -= 1
        if _ACTIVE[key] == 0:
            del _ACTIVE[key]
            config._attn_implementation = "sdpa"


@contextmanager
def packed_gqa_config(model) -> Iterator[None]:
    """Keep `model`'s config naming the packed function for the whole block, without packing anything: forwards
    pack only inside `packed_gqa_attention` blocks, and every other forward runs transformers' SDPA function as
    before. A loop that runs many verification forwards holds it around them, so that each forward's own block
    only counts the thread's depth (switching the config goes through transformers' validated setter, tens of µs
    a switch)."""
    config = _text_config(model)
    held = _acquire(config)
    try:
        yield
    finally:
        if held:
            _release(config)


@contextmanager
def packed_gqa_attention(model) -> Iterator[None]:
    """Run the calling thread's forwards inside with `packed_gqa_sdpa` when `model` is an SDPA grouped-query-
    attention model; otherwise (eager, flash, no GQA) nothing changes. Blocks nest and overlap across threads: the
    config names the packed function from the first entry to the last exit, and only threads inside a block pack."""
    config = _text_config(model)
    if not _acquire(config):
        yield
        return
    _SCOPE.depth += 1
    try:
        yield
    finally:
        _SCOPE.depth -= 1
        _release(config)
