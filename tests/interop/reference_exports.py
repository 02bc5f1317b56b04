"""Reference reading of an engine export: from the folder's config.json and safetensors alone (no hf_dspark code),
the greedy proposals and confidence logits an engine computes, through the forward of reference.py.

How each config format is read (docs/checkpoints.md, "Engine exports"):

- DSpark format (`*DSparkModel`, vLLM / SGLang / DeepSpec / TensorRT-LLM): flat fields over a copy of the target's
  config. `block_size` = γ, anchor-first (vLLM runs the 1 + N block only when `dspark_bonus_anchor` is set; the
  other engines read no layout flag). `target_layer_ids` are decoder-layer ids (tap t reads hidden_states[t + 1],
  −1 the embedding output). `markov_rank` 0 builds no sequential head, else `markov_head_type` vanilla | rnn;
  `confidence_head_with_markov` defaults to false.
- DFlash architecture (`DFlashDraftModel`): `block_size` = γ + 1 (slot 0 drafts nothing), taps and mask token in
  `dflash_config`, backbone tensors only (the target's embedding and LM head).
- speculators (`DSparkSpeculator`): the layer fields in `transformer_layer_config`, `aux_hidden_state_layer_ids`
  are hidden_states indices, `block_size` counts slots (γ + 1 when `sample_from_anchor` is false),
  `confidence_head_with_markov` defaults to true, the embedding comes from the verifier.

A draft vocabulary is `lm_head.weight [V_draft, d]` (and `markov_w2 [V_draft, r]`) with `d2t [V_draft]` offsets:
the argmax is taken over draft ids and mapped to target id = draft id + d2t[draft id] before it is proposed and
fed back (W1 `[V, r]` is indexed by target ids). speculators also ships `t2d [V]`, the membership mask, which must
mark exactly the mapped ids.

The shipped `embed_tokens` / `lm_head` are used where present, the target's otherwise. TensorRT-LLM (and vLLM
optionally) take the target's even when copies are shipped; the exports ship copies of the target's rows, so both
readings compute the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.interop.reference import reference_greedy_drafts

VOCAB_MAPS = ("d2t", "t2d")


@dataclass(frozen=True)
class ExportSpec:
    """What an engine reads from an exported config."""

    layers: dict  # the draft layers' fields (hidden size, heads, head_dim, layers, eps, RoPE)
    hidden_indices: tuple[int, ...]  # target hidden_states indices concatenated into fc's input
    first_slot: int  # 0 anchor-first, 1 for the 1 + N block
    gamma: int
    mask_token_id: int
    head: str | None  # "vanilla", "rnn" or None
    confidence: bool
    confidence_with_markov: bool


def _dspark_spec(raw: dict) -> ExportSpec:
    nested = raw.get("dflash_config") or {}
    dflash = raw["architectures"][0] == "DFlashDraftModel"
    first = 1 if dflash or raw.get("dspark_bonus_anchor") else 0
    taps = nested["target_layer_ids"] if dflash else raw["target_layer_ids"]
    rank = 0 if dflash else int(raw.get("markov_rank") or 0)
    return ExportSpec(
        layers=raw,
        hidden_indices=tuple(t + 1 for t in taps),
        first_slot=first,
        gamma=raw["block_size"] - first,
        mask_token_id=nested["mask_token_id"] if dflash else raw["mask_token_id"],
        head=raw.get("markov_head_type", "vanilla") if rank else None,
        confidence=not dflash and bool(raw.get("enable_confidence_head")),
        confidence_with_markov=bool(raw.get("confidence_head_with_markov", False)),
    )


def _speculators_spec(raw: dict) -> ExportSpec:
    first = 0 if raw.get("sample_from_anchor", True) else 1
    rank = int(raw.get("markov_rank") or 0)
    return ExportSpec(
        layers=raw["transformer_layer_config"],
        hidden_indices=tuple(raw["aux_hidden_state_layer_ids"]),
        first_slot=first,
        gamma=raw["block_size"] - first,
        mask_token_id=raw["mask_token_id"],
        head=raw.get("markov_head_type", "vanilla") if rank else None,
        confidence=bool(raw.get("enable_confidence_head")),
        confidence_with_markov=bool(raw.get("confidence_head_with_markov", True)),
    )


def read_export(folder: Path) -> tuple[ExportSpec, dict[str, torch.Tensor]]:
    """The folder's spec (whichever config format) and its raw tensors in float32 (d2t / t2d kept as stored)."""
    raw = json.loads((folder / "config.json").read_text())
    spec = _speculators_spec(raw) if raw.get("speculators_model_type") else _dspark_spec(raw)
    stored = load_file(folder / "model.safetensors")
    return spec, {name: t if name in VOCAB_MAPS else t.float() for name, t in stored.items()}


def draft_to_target(weights: dict[str, torch.Tensor], vocab_size: int) -> torch.Tensor | None:
    """Target id of every draft id (`[V_draft]`, from d2t), or None without a draft vocabulary. Checks the pruned
    LM head's rows against it and, where shipped, that t2d marks exactly those ids."""
    if "d2t" not in weights:
        return None
    d2t = weights["d2t"]
    assert d2t.dtype == torch.int64 and weights["lm_head.weight"].shape[0] == d2t.numel()
    ids = torch.arange(d2t.numel()) + d2t
    assert bool((ids[1:] > ids[:-1]).all()) and int(ids[0]) >= 0 and int(ids[-1]) < vocab_size
    if "t2d" in weights:
        member = torch.zeros(vocab_size, dtype=torch.bool)
        member[ids] = True
        assert torch.equal(weights["t2d"], member)
    return ids


def hidden_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, indices) -> torch.Tensor:
    """The target's hidden_states at `indices`, concatenated: `[B, L, n·d]`."""
    with torch.no_grad():
        states = target(input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
    return torch.cat([states[i] for i in indices], dim=-1)


def reference_export_proposals(
    folder: Path, target, input_ids: torch.Tensor, attention_mask: torch.Tensor, spec: ExportSpec | None = None
):
    """Greedy drafts `[R, γ]` (target ids), probabilities `[R, γ, V]` and confidence logits `[R, γ]` (None without
    a confidence head) for left-padded prompts whose last token is the anchor. The target supplies only its hidden
    states, and the embedding / LM head where the folder ships none. `spec` overrides what the config says (to show
    that a misread changes the result)."""
    read, weights = read_export(folder)
    spec = spec or read
    vocab = target.config.vocab_size
    embed = weights.get("embed_tokens.weight", target.get_input_embeddings().weight.detach().float())
    lm_head = weights.get("lm_head.weight", target.get_output_embeddings().weight.detach().float())
    to_target = draft_to_target(weights, vocab)
    if not spec.confidence:
        weights = {k: v for k, v in weights.items() if not k.startswith("confidence_head.")}
    feats = hidden_features(target, input_ids, attention_mask, spec.hidden_indices)
    drafts, probs, confs = [], [], []
    for r in range(input_ids.shape[0]):
        n = int(attention_mask[r].sum())
        out = reference_greedy_drafts(
            weights,
            spec.layers,
            feats[r, -n:-1],
            int(input_ids[r, -1]),
            spec.mask_token_id,
            spec.gamma,
            spec.first_slot,
            embed,
            lm_head,
            head=spec.head,
            conf_with_markov=spec.confidence_with_markov,
            to_target=to_target,
        )
        drafts.append(out[0])
        probs.append(out[1])
        confs.append(out[2])
    conf = torch.stack(confs) if spec.confidence else None
    return torch.stack(drafts), torch.stack(probs), conf
