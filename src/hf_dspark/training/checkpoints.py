"""Training output folders: complete checkpoints only, atomic checkpoint writes, no silent overwrite of a finished run.

- `last_complete_checkpoint`: the newest `checkpoint-N` whose trainer state, weights and optimizer files are all
  readable (`resume_from_checkpoint="auto"` skips a checkpoint cut short by a kill, naming what is wrong with it);
- `publish_checkpoint`: `DSparkTrainer` writes each checkpoint into `<output_dir>/.checkpoint-staging/` and renames it
  into place once complete, so `checkpoint-N` never exists half-written;
- `check_output_dir`: refuses to train into a folder that already holds a trained model or checkpoints unless the
  run resumes from them or `overwrite_output_dir` is set;
- `save_final_model`: the trained drafter goes to a staging folder first, then each file is renamed into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from pathlib import Path

from safetensors import SafetensorError, safe_open
from transformers.utils import logging

logger = logging.get_logger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
STAGING_DIR = ".checkpoint-staging"
FINAL_STAGING_DIR = ".final-staging"
TRAINER_STATE = "trainer_state.json"
# torch.save writes zip archives: a file cut short loses its central directory, which zipfile detects cheaply.
TORCH_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth")
FINISHED_MODEL_FILES = ("config.json", "model.safetensors", "adapter_model.safetensors", "adapter_config.json")


def checkpoints_in(output_dir: str | Path) -> list[Path]:
    """The `checkpoint-N` folders of `output_dir`, newest (highest N) first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT_PATTERN.match(p.name).group(1)), reverse=True)


def _weights_problem(folder: Path) -> str | None:
    for index in folder.glob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
            return f"{index.name} is unreadable ({err!r})"
        missing = sorted(name for name in shards if not (folder / name).is_file())
        if missing:
            return f"{index.name} lists missing shard(s) {missing}"
    weights = sorted(folder.glob("*.safetensors"))
    for file in weights:
        try:
            with safe_open(file, framework="pt") as handle:
                handle.keys()
        except SafetensorError as err:
            return f"{file.name} is unreadable ({err})"
    sharded = any(folder.glob("pytorch_model_fsdp*")) or any(folder.glob("global_step*"))  # FSDP / DeepSpeed
    if not weights and not sharded and not any(folder.glob("pytorch_model*.bin")):
        return "it holds no model weights"
    return None


def checkpoint_problem(folder: str | Path) -> str | None:
    """What makes `folder` an incomplete checkpoint (missing or unreadable trainer state, weights, optimizer or RNG
    files), or None when it is complete."""
    folder = Path(folder)
    state = folder / TRAINER_STATE
    if not state.is_file():
        return f"{TRAINER_STATE} is missing (the save was interrupted before it finished)"
    try:
        if not isinstance(json.loads(state.read_text(encoding="utf-8")), dict):
            return f"{TRAINER_STATE} is not a JSON object"
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{TRAINER_STATE} is unreadable ({err})"
    problem = _weights_problem(folder)
    if problem:
        return problem
    for file in [folder / name for name in TORCH_FILES] + sorted(folder.glob("rng_state_*.pth")):
        if file.is_file() and not zipfile.is_zipfile(file):
            return f"{file.name} is truncated or corrupt"
    return None


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete `checkpoint-N` of `output_dir` (incomplete ones are skipped with a warning), or None."""
    for folder in checkpoints_in(output_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder)
        logger.warning(f"skipping the incomplete checkpoint {folder}: {problem}")
    return None


def check_output_dir(output_dir: str | Path, overwrite: bool, resuming: bool, resume_requested: bool = False) -> None:
    """Refuse to train into a folder holding a trained model or checkpoints, unless `resuming` (from one of them) or
    `overwrite` (whose earlier checkpoints are then removed, so a later resume cannot pick up the old run's).
    `resume_requested`: a resume was asked for but found no complete checkpoint (the message says so)."""
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"output_dir {folder} is a file; pass a folder.")
    finished = [name for name in FINISHED_MODEL_FILES if (folder / name).is_file()]
    checkpoints = checkpoints_in(folder)
    if resuming or not (finished or checkpoints):
        return
    if not overwrite:
        held = finished + [p.name for p in checkpoints[:3]] + (["..."] if len(checkpoints) > 3 else [])
        fix = ("none of its checkpoints is complete (see the warnings above); pass --overwrite_output_dir to start "
               "over" if resume_requested else "pass --resume_from_checkpoint auto to continue it, "
               "--overwrite_output_dir to replace it")
        raise FileExistsError(
            f"output_dir {folder} already holds a training run ({', '.join(held)}); training would overwrite it: "
            f"{fix}, or choose another --output_dir."
        )
    for checkpoint in checkpoints:
        shutil.rmtree(checkpoint)
    logger.warning(f"overwrite_output_dir: removed {len(checkpoints)} earlier checkpoint(s) from {folder}")


def staging_dir(output_dir: str | Path) -> Path:
    """The folder `DSparkTrainer` writes a checkpoint into before `publish_checkpoint` renames it into place."""
    return Path(output_dir) / STAGING_DIR


def publish_checkpoint(output_dir: str | Path, checkpoint_name: str) -> Path:
    """Rename `<output_dir>/.checkpoint-staging/<checkpoint_name>` to `<output_dir>/<checkpoint_name>`, replacing a
    leftover folder of that name (a partial save of an earlier run); returns the final folder."""
    staged = staging_dir(output_dir) / checkpoint_name
    final = Path(output_dir) / checkpoint_name
    if final.exists():
        stale = staging_dir(output_dir) / f"{checkpoint_name}.replaced"
        shutil.rmtree(stale, ignore_errors=True)
        final.rename(stale)
        staged.rename(final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        staged.rename(final)
    shutil.rmtree(staging_dir(output_dir), ignore_errors=True)
    return final


def save_final_model(trainer, output_dir: str | Path) -> None:
    """`trainer.save_model(output_dir)`, written to `<output_dir>/.final-staging/` and then renamed file by file, so
    a kill mid-save never leaves a truncated `model.safetensors` or `config.json` in `output_dir`."""
    staging = Path(output_dir) / FINAL_STAGING_DIR
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        for file in sorted(staging.iterdir()):
            os.replace(file, Path(output_dir) / file.name)
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()



# Settings a resumed run must share with its checkpoint: they change what the weights mean without changing any
# tensor shape, so a mismatch would train on silently while the saved config claims the new values.
RESUME_FIXED_FIELDS = (
    "block_size", "target_layer_ids", "num_target_layers", "head_type", "markov_rank", "use_confidence_head",
    "confidence_with_markov", "sample_from_anchor", "num_hidden_layers", "hidden_size",
    "draft_vocab_size", "vocab_size",
)


def check_resume_config(checkpoint: str | Path, config) -> None:
    """Refuse to resume `checkpoint` with a drafter `config` whose architecture settings differ from the ones the
    checkpoint was trained with (its `config.json`), naming each field and both values."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        return  # adapter-only checkpoints carry no drafter config; their shapes are checked on load
    saved = json.loads(path.read_text())
    current = config.to_dict()
    changed = [
        f"{name}: checkpoint {saved[name]!r}, now {current.get(name)!r}"
        for name in RESUME_FIXED_FIELDS
        if name in saved and saved[name] != current.get(name)
    ]
    if changed:
        raise ValueError(
            f"cannot resume from {checkpoint}: it was trained with other drafter settings ({'; '.join(changed)}). "
            "Resume with the checkpoint's settings, or start a new run in another --output_dir (or pass "
            "--overwrite_output_dir without --resume_from_checkpoint)."
        )
