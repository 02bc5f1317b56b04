"""Reading vllm-project/speculators DSpark folders (`speculators_model_type: "dspark"`, `DSparkSpeculator`).

The config nests the draft layers' HF config in `transformer_layer_config` and records `draft_vocab_size`,
`block_size` (slots: γ anchor-first, γ + 1 with `sample_from_anchor: false`), `aux_hidden_state_layer_ids` (HF
`hidden_states` indices, i.e. decoder-layer ids + 1), `mask_token_id`, `sample_from_anchor` (default true for
DSpark), `markov_rank`, `markov_head_type`, `enable_confidence_head` and `confidence_head_with_markov`. The tensors
use this package's names, with `lm_head [V_draft, d]`, `d2t` and `t2d` for a draft vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model.configuration_dspark import DSparkConfig
from ..model.heads import head_from_export
from .layout_flags import check_assume_layout
from .layouts import check_full_attention, read_calibration, shape_fields

SPECULATOR_TYPE = "dspark"


def is_speculators(raw: dict[str, Any]) -> bool:
    """Whether a config.json dict is a speculators DSpark config."""
    return raw.get("speculators_model_type") == SPECULATOR_TYPE


def _head(raw: dict[str, Any], config_file: Path) -> dict[str, Any]:
    rank = int(raw.get("markov_rank", 256) or 0)
    head = head_from_export(raw.get("markov_head_type", "vanilla"), rank, str(config_file))
    return {"head_type": head.name, "markov_rank": rank if head.module is not None else 1}


def config_from_speculators(
    raw: dict[str, Any], config_file: Path, use_qk_norm: bool, num_target_layers: int | None = None,
    assume_layout: str | None = None,
) -> DSparkConfig:
    """A `DSparkConfig` from a speculators DSpark `config.json` dict; `num_target_layers` comes from the folder's
    `transformer_layer_config.num_target_layers` (written by hf-dspark) or from the bound target."""
    layers = raw.get("transformer_layer_config")
    if not isinstance(layers, dict):
        raise ValueError(f"{config_file} has no transformer_layer_config (the draft layers' config).")
    layers = dict(layers)
    layers["num_target_layers"] = layers.get("num_target_layers") or num_target_layers
    if layers["num_target_layers"] is None:
        raise ValueError(f"{config_file} does not record the target's layer count; load it with target=... so it "
                         "can be taken from the target.")
    check_full_attention(layers, config_file)
    assumed = check_assume_layout(assume_layout)
    sample_from_anchor = bool(raw.get("sample_from_anchor", True)) if assumed is None else assumed
    slots = int(raw["block_size"])
    gamma = slots if sample_from_anchor else slots - 1
    aux = raw.get("aux_hidden_state_layer_ids")
    if not aux or gamma < 1 or raw.get("mask_token_id") is None:
        raise ValueError(f"{config_file} needs aux_hidden_state_layer_ids, mask_token_id and a block_size that "
                         f"drafts at least one token (got {aux!r}, {raw.get('mask_token_id')!r}, {slots}).")
    return DSparkConfig(
        block_size=gamma,
        target_layer_ids=[int(i) - 1 for i in aux],
        mask_token_id=int(raw["mask_token_id"]),
        use_confidence_head=bool(raw.get("enable_confidence_head", True)),
        confidence_with_markov=bool(raw.get("confidence_head_with_markov", True)),
        sample_from_anchor=sample_from_anchor,
        source_layout="speculators",
        draft_vocab_size=raw.get("draft_vocab_size"),
        **_head(raw, config_file),
        **read_calibration(config_file.parent, gamma),
        **shape_fields(layers, config_file, use_qk_norm),
    )
