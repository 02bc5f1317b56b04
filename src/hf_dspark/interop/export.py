"""`export_deepspec`: write a drafter in the DeepSpec / serving-engine layout, with sidecars and launch notes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

from ..scheduler import StepCurve
from .engines import engine_warnings, readme_snippet
from .layouts import STEP_CURVE_FILE

logger = logging.get_logger(__name__)

README_FILE = "README.md"


def _step_curve_payload(drafter, step_curve: StepCurve | dict | str | Path | None) -> dict[str, Any] | None:
    """The step curve to ship: the one given, else `step_curve.json` beside the drafter's own folder, else None."""
    if step_curve is None:
        name = str(getattr(drafter, "name_or_path", "") or "")
        source = Path(name) / STEP_CURVE_FILE if name else None
        if source is None or not source.is_file():
            return None
        step_curve = source
    if isinstance(step_curve, str | Path):
        step_curve = StepCurve.load(step_curve)
    elif isinstance(step_curve, dict):
        step_curve = StepCurve.from_dict(step_curve)
    if not isinstance(step_curve, StepCurve):
        raise TypeError(f"step_curve must be a StepCurve, a dict or a JSON path, got {type(step_curve).__name__}.")
    return step_curve.to_dict()


def export_deepspec(
    drafter,
    out_dir: str | Path,
    step_curve: StepCurve | dict | str | Path | None = None,
    target_name: str | None = None,
) -> Path:
    """Write `drafter` (bound to its target) in the DeepSpec / serving-engine layout under `out_dir`.

    Writes `config.json` (the target's `model_type` and shape fields, `architectures: ["<Family>DSparkModel"]`,
    the flat DSpark fields, always `sample_from_anchor`), `model.safetensors` (drafter tensors plus copies of the
    target's `embed_tokens.weight` / `lm_head.weight`), `calibration.json` (STS temperatures, sampling and greedy),
    `step_curve.json` when a curve is given or sits beside the drafter's folder, and `README.md` with vLLM, SGLang
    and TensorRT-LLM launch settings. Settings an engine cannot serve are logged as warnings and listed in the
    README. Returns the folder.
    """
    from .deepspec import write_deepspec_folder

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / "config.json").is_file():
        raise FileExistsError(f"{out} exists and is not an exported drafter folder; choose an empty folder.")
    drafter._require_bound()
    written = write_deepspec_folder(drafter, out, _step_curve_payload(drafter, step_curve))
    name = target_name or drafter._bound.name_or_path or "TARGET"
    (out / README_FILE).write_text(readme_snippet(drafter.config, out_name=str(out), target=name))
    for warning in engine_warnings(drafter.config):
        logger.warning(f"DeepSpec export to {out}: {warning}")
    logger.info(f"Exported the drafter to {out}: {', '.join([*written, README_FILE])}.")
    return out


def export_from_paths(
    drafter_path: str,
    out_dir: str,
    target_path: str | None = None,
    step_curve: str | None = None,
    dtype: str = "float32",
) -> Path:
    """CLI body: load the target (the embedded default when `target_path` is None) and the drafter, then export."""
    from ..modeling_dspark import DSparkDrafter

    torch_dtype = getattr(torch, dtype)
    if target_path is None:
        from ..defaults import load_default_target

        target, _ = load_default_target(dtype=torch_dtype)
    else:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch_dtype).eval()
    drafter = DSparkDrafter.from_pretrained(drafter_path, target=target)
    return export_deepspec(drafter, out_dir, step_curve=step_curve, target_name=target_path)


def exported_summary(out_dir: str | Path) -> dict[str, Any]:
    """The key fields of an exported `config.json` (for the CLI's report)."""
    raw = json.loads((Path(out_dir) / "config.json").read_text())
    keys = ("architectures", "model_type", "block_size", "sample_from_anchor", "markov_head_type", "markov_rank")
    return {k: raw.get(k) for k in keys}


__all__ = ["export_deepspec", "export_from_paths", "exported_summary"]
