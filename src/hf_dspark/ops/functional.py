"""Pure tensor helpers for the DSpark equations (docs/method.md, sections 3-6).

Every function is side-effect free and works on batched tensors; the docstring opens with the equation it
implements and the shapes it takes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def semi_autoregressive_logits(base_logits: torch.Tensor, transition_bias: torch.Tensor | None) -> torch.Tensor:
    """Eq. (4): logits of p_draft_k = U_k + B_k(x_0, x_<k).

    base_logits: `[..., V]`; transition_bias: `[..., V]` or `None` (head type `none`). Returns `[..., V]`.
    """
    if transition_bias is None:
        return base_logits
    return base_logits + transition_bias.to(base_logits.dtype)


def markov_transition_bias(prev_embedding: torch.Tensor, markov_w2: torch.Tensor) -> torch.Tensor:
    """Eq. (5): B(x_{k-1}, ·) = W2ᵀ W1[x_{k-1}].

    prev_embedding: `[..., r]` rows W1[x_{k-1}]; markov_w2: `[V, r]`. Returns `[..., V]`.
    """
    return prev_embedding @ markov_w2.t()


def rnn_head_step(
    state: torch.Tensor, prev_embedding: torch.Tensor, hidden: torch.Tensor, joint_weight: torch.Tensor,
    joint_bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (6): one gated recurrent update of the RNN head.

    z_k = [s_{k-1}; W1[x_{k-1}]; h_k]; s_k = σ(W_g z) ⊙ s_{k-1} + (1 − σ(W_g z)) ⊙ tanh(W_c z);
    the bias input is tanh(W_o z) (the caller projects it with W2ᵀ).
    state, prev_embedding: `[..., r]`; hidden: `[..., d]`; joint_weight: `[3r, 2r + d]`.
    Returns (s_k `[..., r]`, tanh(W_o z) `[..., r]`).
    """
    z = torch.cat([state, prev_embedding.to(state.dtype), hidden.to(state.dtype)], dim=-1)
    gate, candidate, output = F.linear(z, joint_weight, joint_bias).chunk(3, dim=-1)
    gate = torch.sigmoid(gate)
    new_state = gate * state + (1.0 - gate) * torch.tanh(candidate)
    return new_state, torch.tanh(output)


def confidence_logit(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Eq. (7) before the sigmoid: wᵀ[h_k; W1[x_{k-1}]] + b.

    features: `[..., d(+r)]`; weight: `[1, d(+r)]`. Returns `[...]`.
    """
    return F.linear(features, weight, bias).squeeze(-1)


def calibrated_confidence(logit: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
    """Eq. (7) with STS: c_k = σ(z_k / T_k).

    logit: `[..., γ]`; temperature: scalar or `[γ]` (broadcast over the last dimension). Returns `[..., γ]`.
    """
    return torch.sigmoid(logit / temperature)


def acceptance_rate(p_draft: torch.Tensor, p_target: torch.Tensor) -> torch.Tensor:
    """Eq. (8): c*_k = 1 − ½‖p_draft_k − p_target_k‖₁ = Σ_v min(p_draft, p_target).

    p_draft, p_target: `[..., V]` probability vectors. Returns `[...]` in [0, 1].
    """
    return (1.0 - 0.5 * (p_draft - p_target).abs().sum(dim=-1)).clamp(0.0, 1.0)


def prefix_survival(confidence: torch.Tensor) -> torch.Tensor:
    """a_{r,j} = ∏_{i≤j} c_{r,i} (Algorithm 1, step 1).

    confidence: `[R, γ]` in [0, 1]. Returns `[R, γ]`, non-increasing along the last dimension.
    """
    return torch.cumprod(confidence.clamp(0.0, 1.0), dim=-1)


def position_weights(
    block_size: int, device: torch.device | None = None, dtype=torch.float32, decay: float | None = None
) -> torch.Tensor:
    """Loss weights w_k = exp(−(k−1)/c) for k = 1..γ (Eqs. 11-13), with the decay constant c = γ by default
    (`decay` sets another c; DeepSpec's recipes use c = 4 for every block size). Returns `[γ]`."""
    constant = float(block_size if decay is None else decay)
    if not constant > 0:
        raise ValueError(f"the position-decay constant must be > 0, got {decay!r}.")
    k = torch.arange(block_size, device=device, dtype=dtype)
    return torch.exp(-k / constant)


def expected_accepted_length(survival: torch.Tensor, verify_len: torch.Tensor) -> torch.Tensor:
    """τ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}) (docs/scheduling.md, section 1).

    survival: `[R, γ]`; verify_len: `[R]` with 0 ≤ ℓ_r ≤ γ. Returns a scalar tensor.
    """
    positions = torch.arange(1, survival.shape[-1] + 1, device=survival.device)
    admitted = positions[None, :] <= verify_len[:, None]
    return (1.0 + (survival * admitted).sum(dim=-1)).sum()


def residual_distribution(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p_target − p_draft)): the distribution sampled at the first rejection.

    p_target, p_draft: `[..., V]`. Returns `[..., V]`. Where the residual is all zero (p_draft == p_target, a
    rejection that happens with probability 0) it falls back to p_target.
    """
    residual = (p_target - p_draft).clamp_min(0.0)
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(1e-30), p_target)


def grouped_query_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                            scale: float | None = None) -> torch.Tensor:
    """Eq. (3)'s attention (and the target's verification attention) for grouped-query heads, reading each key/value
    head once instead of repeating it to every query head.

    queries `[B, H, T, D]`; keys, values `[B, H_kv, K, D]`; mask `[B or 1, 1, T or 1, K]` (bool or additive, shared
    by all heads). The H / H_kv query heads of a group are stacked along the queries (`[B, H_kv, groups·T, D]`, the
    mask repeated to match); each output row is the same kernel's result as with repeated keys. Returns `[B, H, T, D]`.
    """
    batch, heads, steps, dim = queries.shape
    groups = heads // keys.shape[1]
    if groups == 1:
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    packed = queries.reshape(batch, heads // groups, groups * steps, dim)
    mask = mask.expand(batch, 1, steps, mask.shape[-1]).repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, steps, values.shape[-1])


ARGMAX_MAX_ELEMENTS = 4096  # up to this many scores `argmax` is the faster kernel; above it, `max`


def greedy_token_ids(scores: torch.Tensor) -> torch.Tensor:
    """The greedy choice argmax_v scores[..., v]: `[..., V]` -> `[...]` long.

    `max(dim).indices` and `argmax` pick the same index (the first maximum, NaN included), but on CPU `max` runs
    2-3× faster at vocabulary sizes (one thread, `[8, 8, 49152]`: 1.6 ms against 5.1 ms), while `argmax` is
    faster on a few thousand scores; the kernel is chosen by size, the result is the same.
    """
    if scores.numel() <= ARGMAX_MAX_ELEMENTS:
        return scores.argmax(dim=-1)
    return scores.max(dim=-1).indices
