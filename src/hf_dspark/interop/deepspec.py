"""The DeepSpec / serving-engine checkpoint layout, in and out (docs/checkpoints.md).

`config.json` keeps the target's `model_type` and shape fields (with the drafter's `num_hidden_layers`),
`architectures: ["<Family>DSparkModel"]` and the flat DSpark fields `block_size`, `mask_token_id`,
`target_layer_ids` (decoder-layer indices = HF `hidden_states` index − 1), `num_target_layers`, `markov_rank`,
`markov_head_type` (`vanilla` | `rnn`; absent, or `markov_rank` 0, for no head), `enable_confidence_head`,
`confidence_head_with_markov` and `sample_from_anchor`. The weights carry no `model.` prefix and include copies
of the target's `embed_tokens.weight` and `lm_head.weight`, which engines may load instead of sharing the target's.

`block_size` there counts the block's input slots: γ with `sample_from_anchor: true`, γ + 1 (DFlash convention)
with `false`. `DSparkConfig.block_size` is always γ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers.utils import logging

from .. import __version__
from ..configuration_dspark import DSparkConfig
from .layouts import (
    CALIBRATION_FILE,
    STEP_CURVE_FILE,
    calibration_payload,
    check_full_attention,
    nested,
    read_calibration,
    shape_fields,
)

logger = logging.get_logger(__name__)

HEAD_FROM_DEEPSPEC = {"vanilla": "markov", "rnn": "rnn"}
HEAD_TO_DEEPSPEC = {"markov": "vanilla", "rnn": "rnn"}
DEEPSPEC_NUM_ANCHORS = 512  # training-only field DeepSpec's model classes require (its configs use 512)
_FAMILY_NAMES = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama", "mistral": "Mistral", "gemma4": "Gemma4"}


def is_deepspec(raw: dict[str, Any]) -> bool:
    """Whether a config.json dict is in the DeepSpec / serving-engine DSpark layout."""
    archs = raw.get("architectures") or []
    named = any(a.endswith("DSparkModel") or a == "DSparkDraftModel" for a in archs)
    return named and raw.get("block_size") is not None and nested(raw, "target_layer_ids") is not None


def family_architecture(model_type: str | None) -> str:
    """`<Family>DSparkModel` for a target `model_type` (qwen3 -> Qwen3DSparkModel, qwen3_moe -> Qwen3Moe...)."""
    model_type = model_type or "llama"
    family = _FAMILY_NAMES.get(model_type) or "".join(part[:1].upper() + part[1:] for part in model_type.split("_"))
    return f"{family}DSparkModel"


def _head_fields(raw: dict[str, Any], config_file: Path) -> dict[str, Any]:
    rank = int(raw.get("markov_rank") or 0)
    kind = raw.get("markov_head_type")
    if rank == 0 or kind in (None, "", "none"):
        return {"head_type": "none", "markov_rank": max(rank, 1)}
    if kind not in HEAD_FROM_DEEPSPEC:
        raise ValueError(
            f"{config_file} has markov_head_type={kind!r}; hf-dspark implements {sorted(HEAD_FROM_DEEPSPEC)}."
        )
    return {"head_type": HEAD_FROM_DEEPSPEC[kind], "markov_rank": rank}


def config_from_deepspec(
    raw: dict[str, Any], config_file: Path, use_qk_norm: bool, has_mask_embedding: bool
) -> DSparkConfig:
    """A `DSparkConfig` from a DeepSpec-layout `config.json` dict (`use_qk_norm`, mask from the weights)."""
    check_full_attention(raw, config_file)
    sample_from_anchor = raw.get("sample_from_anchor")
    if sample_from_anchor is None:
        logger.warning(
            f"{config_file} does not record sample_from_anchor; assuming true (the DeepSpec DSpark default: slot k "
            "drafts the token after it). Re-export with hf-dspark to record it."
        )
        sample_from_anchor = True
    slots = int(raw["block_size"])
    gamma = slots if sample_from_anchor else slots - 1
    if gamma < 1:
        raise ValueError(f"{config_file}: block_size {slots} with sample_from_anchor=false drafts nothing.")
    mask_token_id = nested(raw, "mask_token_id")
    if mask_token_id is None and not has_mask_embedding:
        raise ValueError(f"{config_file} has no mask_token_id and its weights hold no mask_embedding.")
    head = _head_fields(raw, config_file)
    calibration = read_calibration(config_file.parent, gamma) or {
        "calibration_temperatures": raw.get("calibration_temperatures"),
        "calibration_temperatures_greedy": raw.get("calibration_temperatures_greedy"),
    }
    return DSparkConfig(
        block_size=gamma,
        target_layer_ids=[int(i) for i in nested(raw, "target_layer_ids")],
        mask_token_id=None if mask_token_id is None else int(mask_token_id),
        use_confidence_head=bool(raw.get("enable_confidence_head", False)),
        confidence_with_markov=bool(raw.get("confidence_head_with_markov", False)),
        sample_from_anchor=bool(sample_from_anchor),
        source_layout="deepspec",
        draft_vocab_size=raw.get("draft_vocab_size"),
        **head,
        **calibration,
        **shape_fields(raw, config_file, use_qk_norm),
    )


def deepspec_config_dict(config: DSparkConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The engine-layout `config.json` for a drafter config (always with `sample_from_anchor`)."""
    rope = dict(config.rope_parameters)
    raw: dict[str, Any] = {
        "architectures": [family_architecture(config.target_model_type)],
        "model_type": config.target_model_type or "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "rope_theta": rope.get("rope_theta"),
        "max_position_embeddings": config.max_position_embeddings,
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "vocab_size": config.vocab_size,
        "num_hidden_layers": config.num_hidden_layers,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "tie_word_embeddings": False,
        "dtype": str(dtype).removeprefix("torch."),
        "num_target_layers": config.num_target_layers,
        "target_layer_ids": list(config.target_layer_ids),
        "block_size": config.num_block_slots,
        "mask_token_id": config.mask_token_id,
        "sample_from_anchor": config.sample_from_anchor,
        "markov_rank": 0 if config.head_type == "none" else config.markov_rank,
        "enable_confidence_head": config.use_confidence_head,
        "num_anchors": DEEPSPEC_NUM_ANCHORS,
        "calibration_temperatures": list(config.calibration_temperatures),
        "calibration_temperatures_greedy": list(config.temperatures_for(greedy=True)),
        "hf_dspark_version": __version__,
    }
    if config.head_type != "none":
        raw["markov_head_type"] = HEAD_TO_DEEPSPEC[config.head_type]
    if config.draft_vocab_size is not None:  # weights carry d2t [V_draft], t2d [V] and markov_w2 [V_draft, r]
        raw["draft_vocab_size"] = config.draft_vocab_size
    if config.use_confidence_head:
        raw["confidence_head_with_markov"] = config.confidence_with_markov
    return raw


def deepspec_tensors(drafter) -> dict[str, torch.Tensor]:
    """The drafter's tensors plus copies of the bound target's embedding and LM head (engine weight names)."""
    bound = drafter._require_bound()
    dtype = drafter.fc.weight.dtype
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in drafter.state_dict().items()}
    # Separate copies: tied targets share one tensor, which safetensors refuses to write twice.
    tensors["embed_tokens.weight"] = bound.embed_tokens.weight.detach().to("cpu", dtype).clone().contiguous()
    tensors["lm_head.weight"] = bound.lm_head.weight.detach().to("cpu", dtype).clone().contiguous()
    return tensors


def write_deepspec_folder(
    drafter, out_dir: Path, step_curve: dict[str, Any] | None, source_folder: Path | None = None
) -> list[str]:
    """Write config.json, model.safetensors and the sidecars; returns the file names written.

    `source_folder` is the final destination when `out_dir` is a staging folder (its own old calibration sidecar is
    not carried over)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = drafter.fc.weight.dtype
    raw = deepspec_config_dict(drafter.config, dtype)
    (out_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    save_file(deepspec_tensors(drafter), out_dir / "model.safetensors", metadata={"format": "pt"})
    name = str(getattr(drafter, "name_or_path", "") or "")
    source = Path(name) if name and Path(name).is_dir() else None
    if source is not None and source.resolve() in {out_dir.resolve(), (source_folder or out_dir).resolve()}:
        source = None
    payload = calibration_payload(drafter.config, source)
    (out_dir / CALIBRATION_FILE).write_text(json.dumps(payload, indent=2) + "\n")
    written = ["config.json", "model.safetensors", CALIBRATION_FILE]
    if step_curve is not None:
        (out_dir / STEP_CURVE_FILE).write_text(json.dumps(step_curve, indent=2) + "\n")
        written.append(STEP_CURVE_FILE)
    return written
