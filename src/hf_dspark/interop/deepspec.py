"""Reading DSpark-format checkpoints: DeepSpec / serving-engine folders and SpecForge DSpark folders.

Both keep a copy of the target's config (its `model_type` and shape fields, the drafter's `num_hidden_layers`) and
store the drafter's tensors without a `model.` prefix (`fc`, `hidden_norm`, `norm`, `layers.*`,
`markov_head.markov_w1/w2` (+ `joint_proj` for rnn), `confidence_head.proj`), plus copies of the target's
`embed_tokens` / `lm_head` (checked against the bound target, then dropped). They differ in where the DSpark fields
live and in the block layout when no flag says otherwise:

- DeepSpec (`architectures: ["<Family>DSparkModel"]`, flat fields): anchor-first, `block_size` = γ. DeepSpec writes
  no layout field, so none is needed.
- SpecForge (`architectures: ["DSparkDraftModel"]` with `dflash_config.projector_type: "dspark"` and every DSpark
  field nested in `dflash_config`): anchor + γ masks (its sampler reads slots 1..block_size − 1), `block_size` = γ + 1.
- `DSparkDraftModel` without `projector_type` (also DeepSeek-V4 and other exporters' name) has no fixed layout: a
  layout flag or `assume_layout` must say which.

A declared flag (any spelling, top level or nested; interop/layout_flags.py) wins over these defaults; conflicting
flags are refused. `target_layer_ids` are decoder-layer indices (HF `hidden_states` index − 1; −1 is the embedding
output).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model.configuration_dspark import DSparkConfig
from ..model.heads import head_from_export
from .layout_flags import NESTED, resolve_layout
from .layouts import check_full_attention, nested, read_calibration, shape_fields

SPECFORGE_ARCHITECTURE = "DSparkDraftModel"


def is_deepspec(raw: dict[str, Any]) -> bool:
    """Whether a config.json dict is in a DSpark format (DeepSpec / serving engine, or SpecForge)."""
    archs = raw.get("architectures") or []
    named = any(a.endswith("DSparkModel") or a == SPECFORGE_ARCHITECTURE for a in archs)
    return named and nested(raw, "block_size") is not None and nested(raw, "target_layer_ids") is not None


def is_specforge(raw: dict[str, Any]) -> bool:
    """SpecForge's DSpark format: every DSpark field nested in `dflash_config`, `projector_type: "dspark"`."""
    inner = raw.get(NESTED)
    return isinstance(inner, dict) and inner.get("projector_type") == "dspark"


def format_default_layout(raw: dict[str, Any]) -> tuple[bool | None, str]:
    """(`sample_from_anchor` the format implies when no flag is written, or None; the format's name)."""
    if is_specforge(raw):
        return False, "SpecForge DSpark (DSparkDraftModel, projector_type 'dspark')"
    archs = raw.get("architectures") or []
    if any(a.endswith("DSparkModel") for a in archs) and not isinstance(raw.get(NESTED), dict):
        return True, f"DeepSpec ({archs[0]})"
    return None, f"DSpark checkpoint named {archs}"


def _head_fields(raw: dict[str, Any], config_file: Path) -> dict[str, Any]:
    rank = int(nested(raw, "markov_rank") or 0)
    head = head_from_export(nested(raw, "markov_head_type"), rank, str(config_file))
    return {"head_type": head.name, "markov_rank": rank if head.module is not None else max(rank, 1)}


def config_from_deepspec(
    raw: dict[str, Any], config_file: Path, use_qk_norm: bool, has_mask_embedding: bool,
    assume_layout: str | None = None,
) -> DSparkConfig:
    """A `DSparkConfig` from a DeepSpec or SpecForge `config.json` dict (`use_qk_norm`, mask from the weights)."""
    check_full_attention(raw, config_file)
    default, format_name = format_default_layout(raw)
    sample_from_anchor = resolve_layout(raw, config_file, default, format_name, assume_layout)
    slots = int(nested(raw, "block_size"))
    gamma = slots if sample_from_anchor else slots - 1
    if gamma < 1:
        raise ValueError(f"{config_file}: block_size {slots} with the anchor + γ masks block drafts nothing.")
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
        use_confidence_head=bool(nested(raw, "enable_confidence_head", False)),
        confidence_with_markov=bool(nested(raw, "confidence_head_with_markov", False)),
        sample_from_anchor=sample_from_anchor,
        source_layout="deepspec",
        draft_vocab_size=nested(raw, "draft_vocab_size"),
        **head,
        **calibration,
        **shape_fields(raw, config_file, use_qk_norm),
    )
