"""Independent reference for the interop tests: raw-tensor folders in the DeepSpec and z-lab DFlash layouts and a
plain re-implementation of one block's forward for one row (no hf_dspark modules involved).

The reference follows the public z-lab DFlash / DeepSpec model code: context = RMSNorm(fc(cat(taps))); per layer,
queries from the normed block, keys/values = [k_proj(context) ‖ k_proj(normed block)] with per-head q/k RMSNorm and
RoPE at absolute positions, attention over everything (no mask), then the MLP; final RMSNorm and the target's LM
head give U. DSpark's sequential head adds B_k (vanilla Markov: W2 · W1[x_prev]; RNN: a gated recurrent state, Eq. 6)
and is sampled left to right. reference_exports.py reads engine exports (any config format, draft vocabularies) into
this forward.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

EPS = 1e-6


def layer_tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the backbone (fc, norms, layers) for a layout config dict."""
    d, h, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ff = cfg["intermediate_size"]
    taps = len(cfg.get("target_layer_ids") or cfg["dflash_config"]["target_layer_ids"])
    shapes = {"fc.weight": (d, taps * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
            p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
            p + "mlp.down_proj.weight": (d, ff),
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
        }
    return shapes


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Norm weights near 1, everything else small Gaussian noise (fan-in scaled)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)
        if "norm" in name:
            out[name] = 1.0 + 0.1 * noise
        elif name.endswith("bias"):
            out[name] = 0.1 * noise
        else:
            out[name] = noise / max(1, shape[-1]) ** 0.5
    return out


def target_shape_fields(target) -> dict:
    c = target.config
    return {
        "hidden_size": c.hidden_size, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.hidden_size // c.num_attention_heads,
        "intermediate_size": c.intermediate_size, "rms_norm_eps": EPS, "hidden_act": "silu",
        "max_position_embeddings": 512, "attention_bias": False, "vocab_size": c.vocab_size,
        "num_target_layers": c.num_hidden_layers, "rope_theta": 10000.0, "tie_word_embeddings": False,
    }


def write_folder(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


def dflash_folder(folder: Path, target, taps=(0, 2), block_size=5, layers=2, mask_token_id=95, seed=7) -> Path:
    """A z-lab DFlash folder (DFlashDraftModel): no embedding, LM head or extra heads."""
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": layers,
        "block_size": block_size, "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(taps)},
        "layer_types": ["full_attention"] * layers, "dtype": "float32", **target_shape_fields(target),
    }
    return write_folder(folder, config, random_tensors(layer_tensor_shapes(config), seed))


def deepspec_folder(folder: Path, target, *, taps=(0, 2), block_size=4, layers=2, rank=8, sample_from_anchor=True,
                    confidence=True, mask_token_id=95, seed=11) -> Path:
    """A DeepSpec-layout folder (Qwen3DSparkModel) with a vanilla Markov head and embedding / LM-head copies."""
    config = {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "num_hidden_layers": layers,
        "layer_types": ["full_attention"] * layers, "block_size": block_size, "mask_token_id": mask_token_id,
        "target_layer_ids": list(taps), "markov_rank": rank, "markov_head_type": "vanilla",
        "enable_confidence_head": confidence, "confidence_head_with_markov": True, "num_anchors": 512,
        "sample_from_anchor": sample_from_anchor, "dtype": "float32", **target_shape_fields(target),
    }
    v, d = target.config.vocab_size, target.config.hidden_size
    shapes = layer_tensor_shapes(config)
    shapes |= {"markov_head.markov_w1.weight": (v, rank), "markov_head.markov_w2.weight": (v, rank)}
    if confidence:
        shapes |= {"confidence_head.proj.weight": (1, d + rank), "confidence_head.proj.bias": (1,)}
    tensors = random_tensors(shapes, seed)
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    tensors["lm_head.weight"] = target.get_output_embeddings().weight.detach().clone()
    return write_folder(folder, config, tensors)


# ----------------------------------------------------------------------------------------------- reference forward
def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_theta(cfg: dict) -> float:
    """RoPE base of a layer config: `rope_theta`, else `rope_parameters.rope_theta`, else 10000."""
    return float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """x `[T, heads, hd]` rotated at `positions` `[T]` (rotate-half convention of HF Llama/Qwen)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float) / hd)
    freqs = positions[:, None].float() * inv
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]
    rotated = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], dim=-1)
    return x * emb.cos() + rotated * emb.sin()


def reference_block(w: dict[str, torch.Tensor], cfg: dict, context: torch.Tensor, block: torch.Tensor,
                    embed: torch.Tensor) -> torch.Tensor:
    """Normed drafter outputs `[S, d]` for one row: `context` `[C, n·d]` tapped features at positions 0..C-1,
    `block` `[S]` token ids at positions C..C+S-1."""
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = float(cfg.get("rms_norm_eps", EPS)), rope_theta(cfg)

    def rms(x, weight):
        return _rms(x, weight, eps)

    ctx = rms(context @ w["fc.weight"].T, w["hidden_norm.weight"])
    h = embed[block]
    n_ctx, n_blk = ctx.shape[0], h.shape[0]
    ctx_pos, blk_pos = torch.arange(n_ctx), torch.arange(n_ctx, n_ctx + n_blk)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(n_blk, heads, hd)
        q = _rope(rms(q, w[p + "self_attn.q_norm.weight"]), blk_pos, theta)

        def keys(src, pos, p=p):
            k = (src @ w[p + "self_attn.k_proj.weight"].T).view(src.shape[0], kv, hd)
            return _rope(rms(k, w[p + "self_attn.k_norm.weight"]), pos, theta)

        k = torch.cat([keys(ctx, ctx_pos), keys(x, blk_pos)])
        v = torch.cat([ctx, x]) @ w[p + "self_attn.v_proj.weight"].T
        v = v.view(-1, kv, hd)
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / hd**0.5
        att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n_blk, heads * hd)
        h = h + att @ w[p + "self_attn.o_proj.weight"].T
        y = rms(h, w[p + "post_attention_layernorm.weight"])
        gated = F.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)
        h = h + gated @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["norm.weight"])


def sequential_bias(w: dict[str, torch.Tensor], head: str | None, state: torch.Tensor | None, prev: int,
                    hidden: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """One position of the sequential head: (new state, B_k `[V_draft]` or None, W1[x_{k-1}] or None).

    vanilla, Eq. (5): B_k = W2 · W1[x_{k-1}]. rnn, Eq. (6): z = [s_{k-1}; W1[x_{k-1}]; h_k] goes through the packed
    projection (gate, candidate, output rows, each r long); s_k = σ(g) ⊙ s_{k-1} + (1 − σ(g)) ⊙ tanh(c) and
    B_k = W2 · tanh(o), with s_0 = 0. W1 is indexed by the previous token's target id."""
    if head is None or "markov_head.markov_w1.weight" not in w:
        return state, None, None
    w1, w2 = w["markov_head.markov_w1.weight"], w["markov_head.markov_w2.weight"]
    embedded = w1[prev]
    if head == "vanilla":
        return state, w2 @ embedded, embedded
    if head != "rnn":
        raise ValueError(f"no reference for the {head!r} head")
    rank = w1.shape[1]
    state = torch.zeros(rank) if state is None else state
    z = torch.cat([state, embedded, hidden])
    packed = w["markov_head.joint_proj.weight"] @ z + w["markov_head.joint_proj.bias"]
    gate, candidate, output = packed[:rank].sigmoid(), packed[rank : 2 * rank], packed[2 * rank :]
    state = gate * state + (1.0 - gate) * candidate.tanh()
    return state, w2 @ output.tanh(), embedded


def reference_greedy_drafts(w, cfg, context, anchor, mask_token_id, gamma, first_slot, embed, lm_head, *,
                            head="vanilla", conf_with_markov=True, to_target=None):
    """Greedy drafts (target ids) `[γ]`, their probabilities `[γ, V]` and confidence logits `[γ]` (None without a
    confidence head) for one row.

    `lm_head` `[V_draft, d]` (and W2 `[V_draft, r]`) score draft ids; `to_target` `[V_draft]` maps a draft id to its
    target id (None: the full vocabulary, draft id = target id). Probabilities are 0 outside the draft vocabulary.
    The confidence logit is wᵀ[h_k; W1[x_{k-1}]] + b (Eq. 7; `conf_with_markov=False` drops the W1 term)."""
    block = torch.tensor([anchor] + [mask_token_id] * (gamma + first_slot - 1))
    hidden = reference_block(w, cfg, context, block, embed)[first_slot : first_slot + gamma]
    base = hidden @ lm_head.T
    to_target = torch.arange(lm_head.shape[0]) if to_target is None else to_target
    drafts, probs, conf, prev, state = [], [], [], anchor, None
    for k in range(gamma):
        state, bias, embedded = sequential_bias(w, head, state, prev, hidden[k])
        logits = base[k] if bias is None else base[k] + bias
        if "confidence_head.proj.weight" in w:
            feats = torch.cat([hidden[k], embedded]) if conf_with_markov else hidden[k]
            conf.append(feats @ w["confidence_head.proj.weight"][0] + w["confidence_head.proj.bias"][0])
        full = torch.zeros(embed.shape[0])
        full[to_target] = logits.softmax(-1)
        probs.append(full)
        prev = int(to_target[logits.argmax()])
        drafts.append(prev)
    return torch.tensor(drafts), torch.stack(probs), (torch.stack(conf) if conf else None)


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's raw tensors (float32)."""
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(folder / "model.safetensors").items()}
