"""`export_deepspec`: write a drafter in the DeepSpec / serving-engine layout, with sidecars and launch notes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

from ..io_utils import current_umask
from ..scheduler import StepCurve
from .engines import engine_warnings, readme_snippet
from .layouts import STEP_CURVE_FILE
from .sources import check_finite_weights

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


def check_export_folder(
    out_dir: str | Path, overwrite: bool = False, keep: tuple[str | Path | None, ...] = ()
) -> Path:
    """Refuse an output folder that holds anything unless `overwrite` (which replaces the whole folder), and never
    one that is, or contains, an input in `keep` (the drafter or target being read). Returns the folder."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file; pass a folder for the exported drafter.")
    for source in keep:
        if source is not None and str(source) not in ("", ".") and Path(source).exists():
            source = Path(source).resolve()
            if source == out.resolve() or out.resolve() in source.parents:
                raise FileExistsError(f"{out} holds the input {source}; export to another folder.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        found = sorted(p.name for p in out.iterdir())
        raise FileExistsError(
            f"{out} is not empty ({', '.join(found[:5])}{', ...' if len(found) > 5 else ''}); choose an empty or new "
            "folder, or pass overwrite=True (`--overwrite`) to replace the whole folder."
        )
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0  # another user's live process / not a pid
    return True


def _remove_leftovers(out: Path, max_age: float = 86400.0) -> None:
    """Remove what an export to `out` killed mid-way (SIGKILL, power loss) left beside it: unfinished staging
    folders `.<name>.tmp-<pid>-*`, and a replaced earlier export `.<name>.old-<pid>-*` once `out` is back in
    place. Only folders whose process is gone (or that are older than `max_age` seconds) are touched, so a
    concurrent export's folders stay."""
    now = time.time()
    for kind in ("tmp", "old"):
        if kind == "old" and not out.is_dir():
            continue  # the old folder may be the only copy of an export whose swap was interrupted
        for path in out.parent.glob(f".{out.name}.{kind}-*"):
            pid = path.name.removeprefix(f".{out.name}.{kind}-").split("-")[0]
            stale = not pid.isdigit() or not _pid_alive(int(pid)) or now - path.stat().st_mtime > max_age
            if path.is_dir() and stale:
                shutil.rmtree(path, ignore_errors=True)
                logger.warning(f"Removed {path}, left over from an interrupted export to {out}.")


def _swap_in(staged: Path, out: Path) -> None:
    """Move the finished `staged` folder to `out`, replacing `out` (renames only; the old folder goes last)."""
    if not out.exists():
        staged.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
    old.rmdir()
    out.rename(old)
    staged.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def export_deepspec(
    drafter,
    out_dir: str | Path,
    step_curve: StepCurve | dict | str | Path | None = None,
    target_name: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `drafter` (bound to its target) in the DeepSpec / serving-engine layout under `out_dir`.

    Writes `config.json` (the target's `model_type` and shape fields, `architectures: ["<Family>DSparkModel"]`,
    the flat DSpark fields, always `sample_from_anchor`), `model.safetensors` (drafter tensors plus copies of the
    target's `embed_tokens.weight` / `lm_head.weight`), `calibration.json` (STS temperatures, sampling and greedy),
    `step_curve.json` when a curve is given or sits beside the drafter's folder, and `README.md` with vLLM, SGLang
    and TensorRT-LLM launch settings. Settings an engine cannot serve are logged as warnings and listed in the
    README. `out_dir` must be empty or new unless `overwrite`, which replaces the whole folder. Everything is written
    to a temporary folder beside it first and renamed into place, so an interrupted export leaves no half folder
    (and what a killed one left beside it is removed by the next export to the same folder).
    Returns the folder.
    """
    from .deepspec import write_deepspec_folder

    out = check_export_folder(out_dir, overwrite, keep=(getattr(drafter, "name_or_path", None),))
    drafter._require_bound()
    check_finite_weights(drafter, f"export to {out}")
    curve = _step_curve_payload(drafter, step_curve)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    staged.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the export is an ordinary folder
    try:
        written = write_deepspec_folder(drafter, staged, curve, source_folder=out)
        name = target_name or drafter._bound.name_or_path or "TARGET"
        (staged / README_FILE).write_text(readme_snippet(drafter.config, out_name=str(out), target=name))
        _swap_in(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
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
    overwrite: bool = False,
) -> Path:
    """CLI body: check the output folder, load the target (the embedded default when `target_path` is None) and the
    drafter, then export."""
    from ..modeling_dspark import DSparkDrafter

    check_export_folder(out_dir, overwrite, keep=(drafter_path, target_path))
    torch_dtype = getattr(torch, dtype)
    if target_path is None:
        from ..defaults import load_default_target

        target, _ = load_default_target(dtype=torch_dtype)
    else:
        from transformers import AutoModelForCausalLM

        from .sources import resolve_model_source

        hub = resolve_model_source(target_path, what="target")
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch_dtype, **hub).eval()
    drafter = DSparkDrafter.from_pretrained(drafter_path, target=target)
    return export_deepspec(drafter, out_dir, step_curve=step_curve, target_name=target_path, overwrite=overwrite)


def exported_summary(out_dir: str | Path) -> dict[str, Any]:
    """The key fields of an exported `config.json` (for the CLI's report)."""
    raw = json.loads((Path(out_dir) / "config.json").read_text())
    keys = ("architectures", "model_type", "block_size", "sample_from_anchor", "markov_head_type", "markov_rank")
    return {k: raw.get(k) for k in keys}


__all__ = ["check_export_folder", "export_deepspec", "export_from_paths", "exported_summary"]
