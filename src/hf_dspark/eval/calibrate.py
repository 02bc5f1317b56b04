"""`hf-dspark calibrate`: fit the confidence head's STS temperatures on held-out rollouts (docs/scheduling.md §8).

For each decoding mode (greedy, sampling) the drafter generates on held-out prompts through the DSpark loop with
every position verified (`dspark_policy="fixed"`, ℓ = γ) and `dspark_record_confidence=True`, which yields per
round and row the raw confidence logits z `[γ]` and the realised prefix survival (position k survived iff k <
accepted drafts). `fit_sts` then fits T_1..T_γ per mode; the temperatures go into the drafter config
(`calibration_temperatures` for sampling, `calibration_temperatures_greedy` for greedy) with the measured
conditional acceptance per position (`heldout_acceptance`, the "auto" policy's prior), a `calibration.json`
sidecar holds the `CalibrationReport` of each mode, and `reliability_<mode>.png` shows the survival before (T = 1)
and after STS. Use prompts the drafter was not trained on and that the speed benchmarks do not measure.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig
from transformers.utils import logging

from ..io_utils import write_json_atomic, write_text_atomic
from ..ops.calibration import (
    CalibrationReport,
    cumulative_survival,
    evaluate_calibration,
    fit_sts,
    reliability_diagram,
)
from ..provenance import result_provenance
from .prompts import chat_input_ids, load_prompt_set

logger = logging.get_logger(__name__)

MODES = ("greedy", "sampling")
SIDECAR = "calibration.json"


@dataclass
class CalibrationRun:
    """Args:
    prompt_files: held-out JSONL prompt sets (the first user turn of each item is used).
    limit / skip: prompts per set after skipping the first `skip`.
    modes: "greedy", "sampling" or "both".
    max_new_tokens: tokens generated per prompt; batch_size: prompts per generate call.
    temperature: sampling temperature of the sampled rollouts (no top-k / top-p).
    out: folder the calibrated drafter, the sidecar and the PNGs are written to.
    n_bins: ECE bins; seed: torch seed for the sampled rollouts; progress: show a progress bar.
    overwrite: let `out` replace another drafter it holds (its weights differ from the calibrated drafter's).
    """

    prompt_files: list[str] = field(default_factory=list)
    limit: int = 32
    skip: int = 0
    modes: str = "both"
    max_new_tokens: int = 128
    batch_size: int = 8
    temperature: float = 1.0
    out: str | None = None
    n_bins: int = 15
    seed: int = 0
    progress: bool = True
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not self.prompt_files:
            raise ValueError("give at least one held-out prompt file (e.g. data/eval/mt-bench.jsonl)")
        if self.modes not in (*MODES, "both"):
            raise ValueError(f"modes must be 'greedy', 'sampling' or 'both', got {self.modes!r}")
        if min(self.limit, self.max_new_tokens, self.batch_size) < 1 or self.skip < 0 or self.temperature <= 0:
            raise ValueError("limit, max_new_tokens and batch_size must be >= 1, skip >= 0, temperature > 0")
        if self.out is None:
            raise ValueError("set out: the folder the calibrated drafter is written to")

    @property
    def mode_list(self) -> list[str]:
        return list(MODES) if self.modes == "both" else [self.modes]


def encode_prompts(tokenizer, run: CalibrationRun) -> list[torch.Tensor]:
    """1-D prompt ids: the chat template when the tokenizer has one, else the plain encoded first turn."""
    prompts = []
    for path in run.prompt_files:
        items = load_prompt_set(path)[run.skip : run.skip + run.limit]
        for item in items:
            if getattr(tokenizer, "chat_template", None):
                prompts.append(chat_input_ids(tokenizer, item["turns"][:1])[0])
            else:
                prompts.append(torch.tensor(tokenizer(item["turns"][0])["input_ids"], dtype=torch.long))
    if not prompts:
        raise ValueError(f"no prompts left in {run.prompt_files} after skip={run.skip}, limit={run.limit}")
    return prompts


def left_pad(prompts: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D prompts into left-padded `[B, L]` ids and attention mask."""
    width = max(p.numel() for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - prompt.numel() :] = prompt
        mask[row, width - prompt.numel() :] = 1
    return ids, mask


def rollout_config(target, mode: str, run: CalibrationRun) -> GenerationConfig:
    """Generation settings of the rollouts: every position verified, raw confidence logits recorded."""
    defaults = target.generation_config
    pad = defaults.pad_token_id if defaults.pad_token_id is not None else defaults.eos_token_id
    sampling = dict(do_sample=True, temperature=run.temperature, top_k=0, top_p=1.0) if mode == "sampling" else \
        dict(do_sample=False)
    return GenerationConfig(
        max_new_tokens=run.max_new_tokens, eos_token_id=defaults.eos_token_id,
        pad_token_id=pad, bos_token_id=defaults.bos_token_id, dspark_policy="fixed", dspark_verify_len=None,
        dspark_record_confidence=True, **sampling,
    )


def collect_rollouts(target, drafter, prompts: list[torch.Tensor], mode: str,
                     run: CalibrationRun) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate on `prompts` in `mode`; return (confidence_logits `[N, γ]`, survived `[N, γ]`) over all rounds."""
    config = rollout_config(target, mode, run)
    pad = int(config.pad_token_id) if config.pad_token_id is not None else 0
    device = next(target.parameters()).device
    torch.manual_seed(run.seed)
    logits, survived = [], []
    starts = range(0, len(prompts), run.batch_size)
    for start in tqdm(starts, desc=f"{mode} rollouts", disable=not run.progress):
        ids, mask = left_pad(prompts[start : start + run.batch_size], pad)
        target.generate(ids.to(device), attention_mask=mask.to(device), assistant_model=drafter,
                        generation_config=config)
        pair = drafter.last_generation_stats.calibration_pairs()
        logits.append(pair[0])
        survived.append(pair[1])
    logits_all, survived_all = torch.cat(logits), torch.cat(survived)
    if logits_all.shape[0] == 0:
        raise ValueError("no fully verified rounds were recorded; raise max_new_tokens or give more prompts")
    return logits_all, survived_all


def set_calibration(config, mode: str, report: CalibrationReport) -> None:
    """Store one mode's fit in a `DSparkConfig`: STS temperatures (sampling -> calibration_temperatures, greedy ->
    *_greedy) and the measured conditional acceptance (`heldout_acceptance[mode]`, the "auto" policy's prior)."""
    name = "calibration_temperatures_greedy" if mode == "greedy" else "calibration_temperatures"
    setattr(config, name, [float(t) for t in report.temperatures])
    config.heldout_acceptance = {**(config.heldout_acceptance or {}), mode: list(report.acceptance)}


def calibrate_mode(logits: torch.Tensor, survived: torch.Tensor, mode: str, run: CalibrationRun,
                   out: Path) -> CalibrationReport:
    """Fit STS on one mode's pairs, write `reliability_<mode>.png`, return the report."""
    temperatures = fit_sts(logits, survived, n_bins=run.n_bins)
    report = evaluate_calibration(logits, survived, temperatures, n_bins=run.n_bins, mode=mode)
    reliability_diagram(cumulative_survival(logits), cumulative_survival(logits, temperatures), survived,
                        out / f"reliability_{mode}.png", title=f"Confidence calibration ({mode}, STS)",
                        n_bins=run.n_bins)
    return report


def write_sidecar(path: Path, run: CalibrationRun, reports: dict[str, CalibrationReport],
                  previous: Path | None = None) -> None:
    """Write `calibration.json` (merging the reports of modes not re-run from the existing sidecar `previous`,
    default `path`)."""
    previous = path if previous is None else previous
    payload = {"format_version": 1, "reports": {}}
    if previous.is_file():
        try:
            payload["reports"] = json.loads(previous.read_text(encoding="utf-8")).get("reports", {})
        except (OSError, ValueError):
            logger.warning(f"Overwriting unreadable {previous}")
    payload["reports"].update({mode: report.to_dict() for mode, report in reports.items()})
    payload["settings"] = {
        "prompt_files": list(run.prompt_files), "limit": run.limit, "skip": run.skip,
        "max_new_tokens": run.max_new_tokens, "temperature": run.temperature, "n_bins": run.n_bins,
    }
    payload["provenance"] = result_provenance()
    write_json_atomic(path, payload)


WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json")


def _weights_digest(folder: Path) -> str | None:
    """sha256 over a drafter folder's weight files (names and bytes), or None when it holds none."""
    files = sorted(p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern) if p.is_file())
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def check_calibration_out(out: Path, same_folder: bool, source: str | os.PathLike | None = None,
                          overwrite: bool = False) -> None:
    """Refuse an `out` folder whose contents calibrate would destroy: anything but an hf-dspark drafter, or
    (without `overwrite`) a drafter other than the one calibrated (`source`: its weight files differ)."""
    if same_folder or not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a folder for the calibrated drafter.")
    config_file = out / "config.json"
    model_type = None
    if config_file.is_file():
        try:
            model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
        except (ValueError, AttributeError):
            model_type = "unreadable"
    if any(out.iterdir()) and model_type != "dspark":
        raise ValueError(
            f"--out {out} is not empty and holds no hf-dspark drafter (config.json model_type={model_type!r}); "
            "calibrate would overwrite its config.json and weights. Choose a new folder."
        )
    held = _weights_digest(out)
    source_folder = Path(source) if source is not None else None
    same_weights = source_folder is not None and source_folder.is_dir() and held == _weights_digest(source_folder)
    if model_type == "dspark" and held is not None and not same_weights and not overwrite:
        raise ValueError(
            f"--out {out} holds another trained drafter (its weights differ from {source}); calibrate would replace "
            "it. Choose a new folder, or pass --overwrite to replace it."
        )


@contextmanager
def staging_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out` (same file system) that `publish` moves into `out`; removed afterwards,
    so a failed write (a full disk) leaves `out` as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.calibrate-", dir=out.parent))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def publish(stage: Path, out: Path) -> None:
    """Move every file of `stage` into `out` by rename (no new data is written, so no partial files), weights
    first and config.json last; weight files of a replaced drafter that the new one does not have are removed
    once the new ones are in place (an old shard index would otherwise win at load time)."""
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(stage.iterdir(), key=lambda p: (p.name == "config.json", p.name))
    new_weights = {p.name for pattern in WEIGHT_PATTERNS for p in stage.glob(pattern)}
    for path in files:
        os.replace(path, out / path.name)
    if new_weights:
        for pattern in WEIGHT_PATTERNS:
            for old in out.glob(pattern):
                if old.name not in new_weights:
                    old.unlink()


def _save_in_place(drafter, out: Path, stage: Path) -> None:
    """Write only the temperatures next to the drafter's unchanged weights: config.json (into `stage`, keeping the
    stored weights' dtype) for a native folder; for a DeepSpec / DFlash folder the `calibration.json` sidecar,
    which their loaders read, carries them and config.json is left as it is."""
    from ..interop.loading import detect_layout

    if detect_layout(out) != "native":
        return
    # binding cast the drafter to the target's dtype, which must not leak into the saved config
    config = copy.deepcopy(drafter.config)
    stored_dtype = json.loads((out / "config.json").read_text(encoding="utf-8")).get("dtype")
    if isinstance(stored_dtype, str) and hasattr(torch, stored_dtype):
        config.dtype = getattr(torch, stored_dtype)
    write_text_atomic(stage / "config.json", config.to_json_string(use_diff=True))


def run_calibration(run: CalibrationRun, target, tokenizer, drafter) -> dict[str, CalibrationReport]:
    """Collect rollouts, fit STS per mode, and save drafter config (+ weights), sidecar and PNGs to `run.out`.

    Everything is written into a staging folder first and moved into `run.out` by rename once complete, so a
    failure (a full disk) leaves `run.out` as it was."""
    if drafter.confidence_head is None:
        raise ValueError("this drafter has no confidence head (use_confidence_head=False): nothing to calibrate")
    out = Path(run.out)
    source = str(getattr(drafter, "name_or_path", "") or "")
    same_folder = is_same_folder(source, out)
    check_calibration_out(out, same_folder, source or None, run.overwrite)
    prompts = encode_prompts(tokenizer, run)
    reports = {}
    with staging_folder(out) as stage:
        for mode in run.mode_list:
            logits, survived = collect_rollouts(target, drafter, prompts, mode, run)
            reports[mode] = calibrate_mode(logits, survived, mode, run, stage)
            set_calibration(drafter.config, mode, reports[mode])
            logger.info(f"{mode}: {logits.shape[0]} rounds, T = {reports[mode].temperatures}")
        if same_folder:
            _save_in_place(drafter, out, stage)
        else:
            drafter.save_pretrained(stage)
        write_sidecar(stage / SIDECAR, run, reports, previous=out / SIDECAR)
        publish(stage, out)
    return reports


def is_same_folder(source: str | os.PathLike | None, out: Path) -> bool:
    """Whether `out` is the drafter folder `source` itself (calibration in place: only config and sidecar)."""
    return bool(source) and Path(source).resolve() == out.resolve() and any(out.glob("*.safetensors"))
