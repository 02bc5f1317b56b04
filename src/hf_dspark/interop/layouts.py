"""Config translation shared by the foreign layouts: target-shape fields, RoPE, attention type, sidecars.

DeepSpec / serving-engine and z-lab DFlash folders both keep a copy of the target's config (its `model_type` and
shape fields) with the drafter's own `num_hidden_layers`; these helpers turn those fields into `DSparkConfig`
arguments and refuse, naming the file, what the drafter layers here do not implement (sliding-window or causal
draft attention).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)

CALIBRATION_FILE = "calibration.json"
STEP_CURVE_FILE = "step_curve.json"
CALIBRATION_FORMAT = 1


def nested(raw: dict[str, Any], name: str, default: Any = None) -> Any:
    """`dflash_config[name]` when present (z-lab's precedence), else the top-level field."""
    inner = raw.get("dflash_config") or {}
    if isinstance(inner, dict) and inner.get(name) is not None:
        return inner[name]
    return raw.get(name, default)


def rope_parameters_from(raw: dict[str, Any]) -> dict[str, Any]:
    """RoPE parameters from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older configs)."""
    if isinstance(raw.get("rope_parameters"), dict):
        rope = dict(raw["rope_parameters"])
    else:
        rope = dict(raw.get("rope_scaling") or {})
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope.setdefault("rope_type", "default")
        rope["rope_theta"] = raw.get("rope_theta", 1e4)
    rope.setdefault("rope_type", "default")
    return rope


def check_full_attention(raw: dict[str, Any], config_file: Path) -> None:
    """Refuse drafters whose attention the layers here would compute differently (sliding window, causal)."""
    types = raw.get("layer_types") or []
    other = sorted({t for t in types if t != "full_attention"})
    if other or raw.get("use_sliding_window") is True:
        raise ValueError(
            f"{config_file} declares draft layers of type {other or ['sliding_attention']} (use_sliding_window="
            f"{raw.get('use_sliding_window')}); hf-dspark drafter layers attend to the full context, so these "
            "weights would compute something else. Only full_attention drafters can be loaded."
        )
    nested = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    for key, value in (("is_causal", raw.get("is_causal")), ("dflash_config.causal", nested.get("causal"))):
        if value is True:
            raise ValueError(f"{config_file} sets {key}=true; hf-dspark blocks attend bidirectionally.")


def shape_fields(raw: dict[str, Any], config_file: Path, use_qk_norm: bool) -> dict[str, Any]:
    """`DSparkConfig` target-shape arguments from a foreign config (`use_qk_norm` comes from the weights)."""
    required = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers",
                "num_target_layers")
    missing = [name for name in required if raw.get(name) is None]
    if missing:
        raise ValueError(f"{config_file} lacks the field(s) {missing} a drafter config needs.")
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    model_type = raw.get("model_type")
    return {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": int(raw.get("num_key_value_heads") or heads),
        "head_dim": int(raw.get("head_dim") or hidden // heads),
        "intermediate_size": int(raw["intermediate_size"]),
        "rms_norm_eps": float(raw.get("rms_norm_eps") or 1e-6),
        "hidden_act": raw.get("hidden_act") or raw.get("hidden_activation") or "silu",
        "rope_parameters": rope_parameters_from(raw),
        "max_position_embeddings": int(raw.get("max_position_embeddings") or 8192),
        "attention_bias": bool(raw.get("attention_bias", False)),
        "use_qk_norm": use_qk_norm,
        "vocab_size": int(raw["vocab_size"]),
        "num_hidden_layers": int(raw["num_hidden_layers"]),
        "num_target_layers": int(raw["num_target_layers"]),
        "embedding_multiplier": 1.0,  # the bound target's embedding module applies any family scale itself
        "target_model_type": model_type,
    }


def load_json_object(file: Path) -> dict[str, Any]:
    """The JSON object in `file`; `ValueError` naming the file when it is not valid JSON or not an object."""
    try:
        payload = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not valid JSON ({err}).") from err
    if not isinstance(payload, dict):
        raise ValueError(f"{file} must hold a JSON object.")
    return payload


def read_calibration(folder: Path, block_size: int) -> dict[str, Any]:
    """STS temperatures (and the held-out acceptance, when measured) from `calibration.json`, or `{}` if absent.

    Reads the exported form (`{"sampling": [...], "greedy": [...], "acceptance": {mode: [...]}}`) and the
    `hf-dspark calibrate` form (`{"reports": {"sampling": {"temperatures": [...], "acceptance": [...]}, ...}}`).
    """
    file = folder / CALIBRATION_FILE
    if not file.is_file():
        return {}
    payload = load_json_object(file)
    reports = payload.get("reports") or {}
    found = {}
    for mode in ("sampling", "greedy"):
        temps = payload.get(mode) or (reports.get(mode) or {}).get("temperatures")
        if temps is not None and len(temps) != block_size:
            raise ValueError(f"{file}: '{mode}' has {len(temps)} temperatures, the drafter drafts {block_size}.")
        found[mode] = None if temps is None else [float(t) for t in temps]
    acceptance = payload.get("acceptance") or {}
    if not isinstance(acceptance, dict):
        raise ValueError(f"{file}: 'acceptance' must map a decoding mode to rates, got {type(acceptance).__name__}.")
    acceptance = dict(acceptance)
    for mode in ("sampling", "greedy"):
        measured = (reports.get(mode) or {}).get("acceptance")
        if measured is not None and mode not in acceptance:
            acceptance[mode] = measured
    for mode, rates in acceptance.items():
        if not isinstance(rates, list) or len(rates) != block_size:
            raise ValueError(f"{file}: the '{mode}' acceptance needs {block_size} rates (one per draft position), "
                             f"got {rates!r}.")
    return {"calibration_temperatures": found["sampling"], "calibration_temperatures_greedy": found["greedy"],
            "heldout_acceptance": acceptance or None}


def calibration_payload(config, source_folder: Path | None = None) -> dict[str, Any]:
    """The exported `calibration.json`: STS temperatures per decoding mode (c_k = σ(z_k / T_k)) and, when measured,
    the held-out conditional acceptance per mode (`acceptance`, the "auto" policy's prior).

    The `reports` / `settings` of an `hf-dspark calibrate` sidecar in `source_folder` are carried over.
    """
    payload: dict[str, Any] = {
        "format_version": CALIBRATION_FORMAT,
        "method": "sequential temperature scaling (STS); c_k = sigmoid(z_k / T_k), survival = prod_{i<=k} c_i",
        "num_draft_positions": config.block_size,
        "sampling": list(config.calibration_temperatures),
        "greedy": list(config.temperatures_for(greedy=True)),
    }
    if config.heldout_acceptance:
        payload["acceptance"] = dict(config.heldout_acceptance)
    source = None if source_folder is None else source_folder / CALIBRATION_FILE
    if source is not None and source.is_file():
        previous = load_json_object(source)
        payload.update({k: previous[k] for k in ("reports", "settings") if k in previous})
    return payload
