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
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig
from transformers.utils import logging

from ..calibration import CalibrationReport, cumulative_survival, evaluate_calibration, fit_sts, reliability_diagram
from ..io_utils import write_json_atomic, write_text_atomic
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


def write_sidecar(path: Path, run: CalibrationRun, reports: dict[str, CalibrationReport]) -> None:
    """Write `calibration.json` (merging the reports of modes not re-run from an existing sidecar)."""
    payload = {"format_version": 1, "reports": {}}
    if path.is_file():
        try:
            payload["reports"] = json.loads(path.read_text(encoding="utf-8")).get("reports", {})
        except (OSError, ValueError):
            logger.warning(f"Overwriting unreadable {path}")
    payload["reports"].update({mode: report.to_dict() for mode, report in reports.items()})
    payload["settings"] = {
        "prompt_files": list(run.prompt_files), "limit": run.limit, "skip": run.skip,
        "max_new_tokens": run.max_new_tokens, "temperature": run.temperature, "n_bins": run.n_bins,
    }
    payload["provenance"] = result_provenance()
    write_json_atomic(path, payload)


def check_calibration_out(out: Path, same_folder: bool) -> None:
    """Refuse an `out` folder that holds something other than an hf-dspark drafter (it would be overwritten)."""
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


def _save_in_place(drafter, out: Path) -> None:
    """Write only the temperatures next to the drafter's unchanged weights: config.json (atomically, keeping the
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
    write_text_atomic(out / "config.json", config.to_json_string(use_diff=True))


def run_calibration(run: CalibrationRun, target, tokenizer, drafter) -> dict[str, CalibrationReport]:
    """Collect rollouts, fit STS per mode, and save drafter config (+ weights), sidecar and PNGs to `run.out`."""
    if drafter.confidence_head is None:
        raise ValueError("this drafter has no confidence head (use_confidence_head=False): nothing to calibrate")
    out = Path(run.out)
    source = str(getattr(drafter, "name_or_path", "") or "")
    same_folder = bool(source) and Path(source).resolve() == out.resolve() and any(out.glob("*.safetensors"))
    check_calibration_out(out, same_folder)
    out.mkdir(parents=True, exist_ok=True)
    prompts = encode_prompts(tokenizer, run)
    reports = {}
    for mode in run.mode_list:
        logits, survived = collect_rollouts(target, drafter, prompts, mode, run)
        reports[mode] = calibrate_mode(logits, survived, mode, run, out)
        set_calibration(drafter.config, mode, reports[mode])
        logger.info(f"{mode}: {logits.shape[0]} rounds, T = {reports[mode].temperatures}")
    if same_folder:
        _save_in_place(drafter, out)
    else:
        drafter.save_pretrained(out)
    write_sidecar(out / SIDECAR, run, reports)
    return reports
