"""`export_drafter`: write a drafter in the layout one engine loads (vLLM, SGLang, speculators, DeepSpec), with the
sidecars and a launch README; refused, before anything is written, when the engine cannot serve it as it computes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers.utils import logging

from ..io_utils import current_umask
from ..profiling.step_curve import StepCurve
from .contracts import ENGINE_CONTRACTS, EngineContract, get_contract, refusals
from .engines import readme
from .layouts import CALIBRATION_FILE, STEP_CURVE_FILE, calibration_payload
from .writers import dtype_name, engine_config, engine_tensors

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
    found = sorted(p.name for p in _entries(out)) if out.is_dir() else []
    if found and not overwrite:
        raise FileExistsError(
            f"{out} is not empty ({', '.join(found[:5])}{', ...' if len(found) > 5 else ''}); choose an empty or new "
            "folder, or pass overwrite=True (`--overwrite`) to replace the whole folder."
        )
    why = _unrenamable(out) if found else None
    if why:
        raise FileExistsError(
            f"{out} {why}, and overwrite replaces a folder by renaming it, which cannot be done to this one; empty it "
            "first (an empty folder is filled in place) or export into another folder."
        )
    return out


def _unrenamable(out: Path) -> str | None:
    """Why `out` cannot be renamed away (the current folder, one holding it, a mount point), or None."""
    place, cwd = out.resolve(), Path.cwd().resolve()
    if place == cwd or place in cwd.parents:
        return "is the current folder" if place == cwd else "holds the current folder"
    return "is a mount point" if os.path.ismount(place) else None


STAGING_PREFIX = ".hf-dspark-export.tmp-"  # staging folder inside an empty output folder that is filled in place


def _stale(path: Path, pid: str, max_age: float) -> bool:
    return not pid.isdigit() or not _pid_alive(int(pid)) or time.time() - path.stat().st_mtime > max_age


def _entries(folder: Path, max_age: float = 86400.0) -> list[Path]:
    """What `folder` holds, less the staging folders interrupted exports left in it."""
    return [p for p in folder.iterdir() if not (p.name.startswith(STAGING_PREFIX) and p.is_dir() and _stale(
        p, p.name.removeprefix(STAGING_PREFIX).split("-")[0], max_age))]


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
    found = []
    for kind in ("tmp", "old"):
        if kind == "old" and not out.is_dir():
            continue  # the old folder may be the only copy of an export whose swap was interrupted
        prefix = f".{out.name}.{kind}-"
        found += [(p, p.name.removeprefix(prefix).split("-")[0]) for p in out.parent.glob(f"{prefix}*")]
    if out.is_dir():  # an empty folder filled in place stages inside itself
        found += [(p, p.name.removeprefix(STAGING_PREFIX).split("-")[0]) for p in out.glob(f"{STAGING_PREFIX}*")]
    for path, pid in found:
        if path.is_dir() and _stale(path, pid, max_age):
            shutil.rmtree(path, ignore_errors=True)
            logger.warning(f"Removed {path}, left over from an interrupted export to {out}.")


def _swap_in(staged: Path, out: Path, fill: bool = False) -> None:
    """Move the finished `staged` folder to `out`, replacing `out` (renames only; the old folder goes last); with
    `fill`, move its files into the empty folder `out` (the current folder or a mount point cannot be renamed)."""
    if fill:
        for entry in staged.iterdir():
            entry.rename(out / entry.name)
        staged.rmdir()
        return
    if not out.exists():
        staged.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
    old.rmdir()
    out.rename(old)
    staged.rename(out)
    shutil.rmtree(old, ignore_errors=True)


DEFAULT_EXPORT_DTYPE = torch.bfloat16  # what the engines serve in; fp32 exports are twice the size


def _export_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return DEFAULT_EXPORT_DTYPE
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype (bfloat16, float16, float32), got {dtype!r}.")
    return resolved


def check_servable(drafter, engine: str | EngineContract) -> None:
    """Raise `ValueError` listing every reason `engine` cannot serve `drafter` as it computes, with the fixes."""
    contract = get_contract(engine)
    found = refusals(drafter.config, contract)
    if found:
        name = getattr(drafter, "name_or_path", "") or "this drafter"
        raise ValueError(f"{contract.title} cannot serve {name} as it drafts here, so it is not exported:\n"
                         + "\n".join(f"- {refusal}" for refusal in found))


def _finite(tensors: dict[str, torch.Tensor], dtype: torch.dtype, out: Path) -> None:
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"export to {out}: tensor {name} holds NaN/Inf in {dtype_name(dtype)} (its values overflow that "
                "dtype, or the checkpoint is corrupt); export in bfloat16 or float32, or re-train."
            )


def _write_folder(drafter, contract: EngineContract, folder: Path, dtype: torch.dtype, curve: dict[str, Any] | None,
                  out: Path, verifier: tuple[str, list[str]]) -> list[str]:
    """Write config.json, model.safetensors and the sidecars into `folder` (the staging copy of `out`)."""
    tensors = engine_tensors(drafter, contract, dtype)
    _finite(tensors, dtype, out)
    raw = engine_config(drafter.config, contract, dtype, verifier_name=verifier[0], verifier_architectures=verifier[1])
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    name = str(getattr(drafter, "name_or_path", "") or "")
    source = Path(name) if name and Path(name).is_dir() and Path(name).resolve() != out.resolve() else None
    payload = calibration_payload(drafter.config, source)
    (folder / CALIBRATION_FILE).write_text(json.dumps(payload, indent=2) + "\n")
    written = ["config.json", "model.safetensors", CALIBRATION_FILE]
    if curve is not None:
        (folder / STEP_CURVE_FILE).write_text(json.dumps(curve, indent=2) + "\n")
        written.append(STEP_CURVE_FILE)
    return written


def export_drafter(
    drafter,
    out_dir: str | Path,
    engine: str | EngineContract = "vllm",
    dtype: torch.dtype | str | None = None,
    step_curve: StepCurve | dict | str | Path | None = None,
    target_name: str | None = None,
    target_architectures: list[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `drafter` (bound to its target) in the layout `engine` loads, under `out_dir`.

    `engine` is a registered contract name (`vllm`, `sglang`, `speculators`, `deepspec`; interop/contracts.py).
    The folder holds `config.json` (the engine's architecture and fields, the block layout in every spelling that
    engine family reads), `model.safetensors` (floating-point tensors in `dtype`, bfloat16 by default; `lm_head`
    pruned to the draft vocabulary plus `d2t` where the engine takes them), `calibration.json`, `step_curve.json`
    when a curve is given or sits beside the drafter's folder, and `README.md` (γ as a launch requirement, launch
    lines, what the engine does instead of reading the sidecars). Anchor + γ masks drafters are written under a
    DFlash architecture, never a `*DSparkModel` one. A drafter the engine cannot serve as it computes is refused
    with the engine, the reason and the fix before anything is written. `out_dir` must be empty or new unless
    `overwrite` (which replaces the whole folder); the folder is staged beside it and renamed into place, so an
    interrupted export leaves nothing half-written (an existing empty folder, such as the current one, is staged in
    and filled in place). Returns the folder.
    """
    contract = get_contract(engine)
    dtype = _export_dtype(dtype)
    out = check_export_folder(out_dir, overwrite, keep=(getattr(drafter, "name_or_path", None),))
    drafter._require_bound()
    check_servable(drafter, contract)
    curve = _step_curve_payload(drafter, step_curve)
    place = Path(os.path.abspath(out))  # "." and ".." get a name: staging and renames need one
    place.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(place)
    fill = place.is_dir() and not _entries(place)
    where = (place, STAGING_PREFIX) if fill else (place.parent, f".{place.name}.tmp-")
    staged = Path(tempfile.mkdtemp(prefix=f"{where[1]}{os.getpid()}-", dir=where[0]))
    staged.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the export is an ordinary folder
    name = target_name or drafter._bound.name_or_path or "TARGET"
    try:
        written = _write_folder(drafter, contract, staged, dtype, curve, out, (name, target_architectures or []))
        text = readme(drafter.config, contract, out_name=str(out), target=name, dtype=dtype_name(dtype))
        (staged / README_FILE).write_text(text)
        _swap_in(staged, place, fill)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    logger.info(f"Exported the drafter for {contract.title} to {out}: {', '.join([*written, README_FILE])}.")
    return out


def export_deepspec(drafter, out_dir: str | Path, step_curve=None, target_name: str | None = None,
                    overwrite: bool = False, dtype: torch.dtype | str | None = None) -> Path:
    """`export_drafter(..., engine="deepspec")`: DeepSpec's own layout (Qwen3DSparkModel, anchor-first)."""
    return export_drafter(drafter, out_dir, engine="deepspec", dtype=dtype, step_curve=step_curve,
                          target_name=target_name, overwrite=overwrite)


def export_from_paths(
    drafter_path: str,
    out_dir: str,
    engine: str = "vllm",
    target_path: str | None = None,
    step_curve: str | None = None,
    dtype: str = "bfloat16",
    overwrite: bool = False,
    assume_layout: str | None = None,
) -> Path:
    """CLI body: check the output folder, load the target (the embedded default when `target_path` is None) and the
    drafter in float32, then export in `dtype`."""
    from ..model.modeling_dspark import DSparkModel
    from .loading import load_drafter

    check_export_folder(out_dir, overwrite, keep=(drafter_path, target_path))
    get_contract(engine)
    if target_path is None:
        from ..defaults import load_default_target

        target, _ = load_default_target(dtype=torch.float32)
    else:
        from transformers import AutoModelForCausalLM

        from .sources import resolve_model_source

        hub = resolve_model_source(target_path, what="target")
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32, **hub).eval()
    drafter = load_drafter(DSparkModel, drafter_path, target=target, assume_layout=assume_layout)
    return export_drafter(drafter, out_dir, engine=engine, dtype=dtype, step_curve=step_curve,
                          target_name=target_path, target_architectures=list(target.config.architectures or []),
                          overwrite=overwrite)


def exported_summary(out_dir: str | Path) -> dict[str, Any]:
    """The key fields of an exported `config.json` (for the CLI's report)."""
    raw = json.loads((Path(out_dir) / "config.json").read_text())
    keys = ("architectures", "model_type", "block_size", "sample_from_anchor", "draft_vocab_size", "markov_head_type",
            "markov_rank", "dtype")
    return {k: raw.get(k) for k in keys if k in raw}


__all__ = ["ENGINE_CONTRACTS", "check_export_folder", "check_servable", "export_deepspec", "export_drafter",
           "export_from_paths", "exported_summary"]
