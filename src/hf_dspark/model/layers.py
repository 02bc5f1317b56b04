"""Drafter decoder layers: target-shaped attention with context KV injection (Eq. 3), MLP, RMSNorm, RoPE.

The layers mirror a decoder-only target's layer shape (hidden size, heads, KV heads, head_dim, MLP size, q/k
norms) so that any Llama/Qwen/Mistral/Gemma-like target is served without forking its modeling code.
Attention of a block is bidirectional over [context ‖ block]; which context entries each query may see is
given by a boolean mask, so one code path serves proposals (per-row ragged caches) and training (many
anchor blocks per sequence).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..ops.functional import grouped_query_attention
from .configuration_dspark import DSparkConfig


class DSparkRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _inverse_frequencies(config: DSparkConfig) -> tuple[torch.Tensor, float]:
    rope = dict(config.rope_parameters)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        dim = config.head_dim
        base = rope.get("rope_theta", 1e4)
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    shim = SimpleNamespace(**config.to_dict())
    shim.rope_parameters = rope
    shim.standardize_rope_params = lambda: None  # copied from the target's already standardized parameters
    return ROPE_INIT_FUNCTIONS[rope_type](shim, None)


class DSparkRope(nn.Module):
    """RoPE tables computed from the copied target RoPE parameters (no buffers: safe under meta init)."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self._config = config
        self._cache: dict[torch.device, tuple[torch.Tensor, float]] = {}

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids `[B, T]` -> (cos, sin) `[B, T, head_dim]`."""
        device = position_ids.device
        if device not in self._cache:
            inv_freq, scaling = _inverse_frequencies(self._config)
            self._cache[device] = (inv_freq.to(device), scaling)
        inv_freq, scaling = self._cache[device]
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, H, T, hd]`, cos/sin `[B, T, hd]`."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


class DSparkAttention(nn.Module):
    """Eq. (3): K = [W_K H_ctx; W_K H_block], V = [W_V H_ctx; W_V H_block], bidirectional inside the block."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        if config.use_qk_norm:
            self.q_norm = DSparkRMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = DSparkRMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def project_kv(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden `[B, T, d]` -> keys, values `[B, kv_heads, T, hd]` (keys normed and rotated)."""
        keys = self._heads(self.k_proj(hidden), self.num_kv_heads)
        values = self._heads(self.v_proj(hidden), self.num_kv_heads)
        if self.k_norm is not None:
            keys = self.k_norm(keys)
        return apply_rope(keys, cos, sin), values

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_keys: torch.Tensor,
        ctx_values: torch.Tensor,
        attn_mask: torch.Tensor,
        block_slots: int | None = None,
    ) -> torch.Tensor:
        """hidden `[B, Q, d]` block states; ctx_keys/values `[B, kvh, C, hd]`.

        attn_mask: bool `[B, Q, C + Q]` over [context ‖ block], or, with `block_slots` set (many blocks of that many
        slots per row, as in training), bool `[B, N, C]`: the context each block sees (`block_sparse_attention`).
        """
        queries = self._heads(self.q_proj(hidden), self.num_heads)
        if self.q_norm is not None:
            queries = self.q_norm(queries)
        queries = apply_rope(queries, cos, sin)
        block_keys, block_values = self.project_kv(hidden, cos, sin)
        groups = self.num_heads // self.num_kv_heads
        if block_slots is not None:
            ctx_keys, ctx_values = ctx_keys.to(block_keys.dtype), ctx_values.to(block_values.dtype)
            parts = [t.repeat_interleave(groups, dim=1) if groups > 1 else t
                     for t in (ctx_keys, ctx_values, block_keys, block_values)]
            out = block_sparse_attention(queries, *parts, attn_mask, block_slots)
            out = out.transpose(1, 2).reshape(*hidden.shape[:2], self.num_heads * self.head_dim)
            return self.o_proj(out)
        keys = torch.cat([ctx_keys.to(block_keys.dtype), block_keys], dim=2)
        values = torch.cat([ctx_values.to(block_values.dtype), block_values], dim=2)
        out = grouped_attention(queries, keys, values, attn_mask)
        out = out.transpose(1, 2).reshape(*hidden.shape[:2], self.num_heads * self.head_dim)
        return self.o_proj(out)


def grouped_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """The drafter's Eq. (3) attention without repeated keys and values (`functional.grouped_query_attention`).

    queries `[B, H, Q, hd]`; keys, values `[B, H_kv, K, hd]`; mask bool `[B, Q, K]`. Returns `[B, H, Q, hd]`.
    """
    return grouped_query_attention(queries, keys, values, mask[:, None])


def block_sparse_attention(
    queries: torch.Tensor,
    ctx_keys: torch.Tensor,
    ctx_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    ctx_mask: torch.Tensor,
    slots: int,
) -> torch.Tensor:
    """Eq. (3) for many anchor blocks at once: each block attends to its visible context and to its own slots only.

    queries, block_keys, block_values: `[S, H, N·slots, hd]` (keys/values already repeated to H heads);
    ctx_keys, ctx_values: `[S, H, L, hd]`; ctx_mask: bool `[S, N, L]` (context entries block n may see).
    Returns `[S, H, N·slots, hd]`. Equal to one masked attention over [context ‖ all blocks] with a block-diagonal
    mask, at the cost of N·slots × (L + slots) scores instead of N·slots × (L + N·slots).
    """
    seqs, heads, queries_len, head_dim = queries.shape
    blocks, length = ctx_mask.shape[1], ctx_keys.shape[2]
    scale = head_dim**-0.5
    q_blocks = queries.view(seqs, heads, blocks, slots, head_dim)
    scores_ctx = (queries @ ctx_keys.transpose(-1, -2)).view(seqs, heads, blocks, slots, length) * scale
    scores_ctx = scores_ctx.masked_fill(~ctx_mask[:, None, :, None, :], float("-inf"))
    k_blocks = block_keys.view(seqs, heads, blocks, slots, head_dim)
    scores_blk = (q_blocks @ k_blocks.transpose(-1, -2)) * scale
    probs = torch.softmax(torch.cat([scores_ctx, scores_blk], dim=-1).float(), dim=-1).to(queries.dtype)
    probs_ctx = probs[..., :length].reshape(seqs, heads, queries_len, length)
    out = probs_ctx @ ctx_values
    v_blocks = block_values.view(seqs, heads, blocks, slots, head_dim)
    out_blk = probs[..., length:] @ v_blocks
    return out + out_blk.reshape(seqs, heads, queries_len, head_dim)


class DSparkMLP(nn.Module):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DSparkDecoderLayer(nn.Module):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.self_attn = DSparkAttention(config)
        self.mlp = DSparkMLP(config)
        self.input_layernorm = DSparkRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DSparkRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden, cos, sin, ctx_keys, ctx_values, attn_mask, block_slots=None) -> torch.Tensor:
        residual = hidden
        hidden = self.self_attn(self.input_layernorm(hidden), cos, sin, ctx_keys, ctx_values, attn_mask, block_slots)
        hidden = residual + hidden
        return hidden + self.mlp(self.post_attention_layernorm(hidden))
