"""The worker processes of `scripts/device_train.py`: `python scripts/device_train_worker.py SPEC.json`.

`kind: train` fine-tunes one arm under a `TimeBudgetCallback` whose step count all arms agree on (the smallest plan,
through `plan-<arm>.json` files in the work folder), saves the drafter in bf16 shards of at most 15 MB and
evaluates it; `kind: eval` evaluates one drafter folder. Each worker records its progress in
`status-<name>.json` (phase, steps, loss curve summary, τ per temperature and set, error), which the main process
reads into results.json.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import torch

READY_WAIT_S = 180.0  # arms start their clocks together once all have loaded (loading times differ)
PLAN_WAIT_S = 30.0
SHARD = "15MB"
DRAFTER_SHAPE_KEYS = (
    "block_size",
    "num_hidden_layers",
    "head_type",
    "markov_rank",
    "mask_token_id",
    "draft_vocab_size",
)  # an init's config fixes these


def log(name: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {name:>8}: {message}", flush=True)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, payload: dict) -> None:
    partial = Path(f"{path}.partial")
    partial.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(partial, path)


def load_target_source(gguf: str | None, folder: str | None):
    """(fp32 target, tokenizer) from a GGUF file, a transformers folder, or the embedded default target."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if folder is None and gguf is None:
        from hf_dspark.defaults import load_default_target

        return load_default_target(torch.float32)
    if folder is not None:
        kwargs, source = {}, folder
    else:
        kwargs, source = {"gguf_file": Path(gguf).name}, str(Path(gguf).resolve().parent)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    target = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return target, tokenizer


def save_plain_target(target, tokenizer, folder: Path) -> None:
    """`target` as a plain safetensors checkpoint (a GGUF-loaded model is marked quantized and refuses to save)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(target.state_dict(), assign=True)
    plain.generation_config = target.generation_config
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


class Status:
    """This worker's record, rewritten atomically at every change."""

    def __init__(self, spec: dict) -> None:
        self.name, self.path = spec["name"], Path(spec["work"]) / f"status-{spec['name']}.json"
        self.record: dict = {"phase": "starting", "drafter": spec["drafter"], "tau": {}}

    def update(self, **fields) -> None:
        self.record.update(fields)
        write_json(self.path, self.record)


def evaluate_drafter(spec: dict, drafter_dir: str, status: Status) -> None:
    """τ of the drafter in `drafter_dir` with an fp32 target, one temperature at a time while time allows."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.eval.accepted_length import EvalConfig, evaluate

    status.update(phase="evaluating")
    target, tokenizer = load_target_source(None, spec["target"])
    target.to(spec["device"])
    drafter = DSparkDrafter.from_pretrained(drafter_dir, target=target)
    ev, work, last = spec["eval"], Path(spec["work"]), 0.0
    for temperature in ev["temperatures"]:
        key = f"T={temperature:g}"
        if time.time() + last > spec["deadline"] - 10:
            status.update(**{f"skipped_{key}": "time guard"})
            continue
        started = time.time()
        config = EvalConfig(
            sets=ev["sets"],
            temperature=temperature,
            block_size=None,
            sweep_gammas=[],
            limit=ev["limit"],
            max_new_tokens=ev["max_new_tokens"],
            batch_size=min(ev["limit"], 40),
            seed=0,
            threads=2 if spec["device"].startswith("cuda") else 1,
            out=str(work / f"eval-{status.name}-{key}.json"),
            work_file=str(work / f"eval-{status.name}-{key}.work.jsonl"),
            resume=False,
        )
        report, _ = evaluate(config, target, tokenizer, {status.name: drafter})
        row = report["table"][status.name]
        tau = {name: values["tau"] for name, values in row["sets"].items()}
        status.record["tau"][key] = {**tau, "macro": row["macro"], "gamma": row["verify_len"]}
        last = time.time() - started
        status.update(eval_seconds=round(status.record.get("eval_seconds", 0) + last, 1))
        log(status.name, f"τ at {key}: {json.dumps(status.record['tau'][key])} ({last:.0f} s)")
    status.update(phase="done")


def barrier(spec: dict, tag: str, payload: dict, wait_s: float) -> list[dict]:
    """Publish `payload` as `<tag>-<arm>.json` and wait (up to `wait_s`) for every peer's; returns those present.
    A peer that failed is not waited for."""
    work = Path(spec["work"])
    write_json(work / f"{tag}-{spec['name']}.json", payload)
    until = time.time() + wait_s
    while True:
        found = [read_json(work / f"{tag}-{peer}.json") for peer in spec["peers"]]
        phases = [(read_json(work / f"status-{peer}.json") or {}).get("phase") for peer in spec["peers"]]
        if time.time() >= until or all(f is not None or p == "failed" for f, p in zip(found, phases)):
            return [f for f in found if f is not None]
        time.sleep(0.2)


def agree_with_peers(spec: dict, status: Status):
    """The `agree` of every arm's budget: publish this arm's plan, wait for the others', take the smallest."""

    def agree(own: int) -> int:
        steps = min([own] + [plan["steps"] for plan in barrier(spec, "plan", {"steps": own}, PLAN_WAIT_S)])
        log(status.name, f"planned {own} steps, agreed {steps} with {spec['peers']}")
        return steps

    return agree


def training_setup(spec: dict):
    import yaml
    from transformers import HfArgumentParser

    from hf_dspark.training.train import DSparkTrainConfig, DSparkTrainingArguments

    with open(spec["recipe"], encoding="utf-8") as handle:
        recipe = {k: v for k, v in yaml.safe_load(handle).items() if k not in DRAFTER_SHAPE_KEYS}
    cuda = spec["device"].startswith("cuda")
    recipe.update(
        data=spec["data"],
        target=spec["target"],
        init_drafter=spec["drafter"],
        use_qk_norm=True,
        target_dtype="bfloat16" if cuda else "float32",
        bf16=cuda,
        use_cpu=not cuda,
        output_dir=str(Path(spec["work"]) / f"run-{spec['name']}"),
        overwrite_output_dir=True,
        max_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,  # every step's loss: the loss curve exists however few steps the budget allows
        report_to="none",
        dataloader_num_workers=2 if cuda else 0,
        num_threads=None if cuda else 1,
    )
    if spec["batch"]:
        recipe["per_device_train_batch_size"] = spec["batch"]
    if spec["learning_rate"]:
        recipe["learning_rate"] = spec["learning_rate"]
    return HfArgumentParser((DSparkTrainConfig, DSparkTrainingArguments)).parse_dict(recipe)


def loss_summary(history: list[dict]) -> dict:
    losses = [(e["step"], round(e["loss"], 4)) for e in history if "loss" in e and "step" in e]
    evals = [(e["step"], round(e["eval_loss"], 4)) for e in history if "eval_loss" in e]
    if not losses:
        return {"evals": evals}
    stride = max(1, len(losses) // 20)
    tail = [v for _, v in losses[-max(1, len(losses) // 10) :]]
    return {
        "first": losses[0][1],
        "last": losses[-1][1],
        "min": min(v for _, v in losses),
        "mean_last_tenth": round(sum(tail) / len(tail), 4),
        "curve": losses[::stride],
        "evals": evals,
    }


def save_shards(drafter, folder: Path, staging: Path) -> list[str]:
    """bf16 safetensors shards of at most 15 MB, their index and config.json in `folder` (nothing else)."""
    drafter.to(torch.bfloat16).save_pretrained(staging, max_shard_size=SHARD)
    folder.mkdir(parents=True, exist_ok=True)
    kept = [
        f
        for f in sorted(staging.iterdir())
        if f.name in ("config.json", "model.safetensors.index.json") or f.suffix == ".safetensors"
    ]
    for file in kept:
        shutil.copy2(file, folder / file.name)
    return [f.name for f in kept]


def train_arm(spec: dict, status: Status) -> None:
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from hf_dspark.training.time_budget import TimeBudgetCallback
    from hf_dspark.training.train import train

    config, args = training_setup(spec)

    class Budget(TimeBudgetCallback):
        def on_train_begin(self, a, state, control, **kwargs):
            status.update(phase="ready")
            barrier(spec, "ready", {}, max(0.0, min(READY_WAIT_S, spec["train_until"] - time.time())))
            self.seconds = max(1.0, min(self.seconds, spec["train_until"] - time.time()))
            self.summary["budget_seconds"] = round(self.seconds, 1)
            log(
                status.name,
                f"training: batch {a.per_device_train_batch_size}, lr {a.learning_rate}, {self.seconds:.0f} s budget",
            )
            status.update(phase="training")
            return super().on_train_begin(a, state, control, **kwargs)

    budget = Budget(60.0 * spec["minutes"], agree=agree_with_peers(spec, status))

    class Progress(TrainerCallback):
        shown = 0.0

        def on_log(self, a, state, control, logs=None, **kwargs):
            if logs and ("eval_loss" in logs or time.time() - self.shown > 10):
                self.shown = time.time()
                keys = ("loss", "eval_loss", "tau_est", "eval_tau_est", "learning_rate")
                shown = " ".join(f"{k} {logs[k]:.4g}" for k in keys if k in logs)
                log(status.name, f"step {state.global_step}/{budget.summary['planned_steps'] or '?'} {shown}")

    PrinterCallback.on_log = lambda *args, **kwargs: None  # every log dict, every 5 steps: Progress prints less
    status.update(phase="loading", batch=args.per_device_train_batch_size, learning_rate=args.learning_rate)
    trainer = train(config, args, callbacks=[budget, Progress()])
    status.update(phase="saving", **budget.summary, loss=loss_summary(trainer.state.log_history))
    files = save_shards(trainer.model, Path(spec["out"]), Path(spec["work"]) / f"save-{spec['name']}")
    status.update(weights=files)
    log(status.name, f"trained {trainer.state.global_step} steps ({budget.summary.get('stopped_by')}); saved {files}")
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    evaluate_drafter(spec, spec["out"], status)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    status = Status(spec)
    status.update(phase="starting")
    try:
        if spec["kind"] == "train":
            train_arm(spec, status)
        else:
            evaluate_drafter(spec, spec["drafter"], status)
    except Exception as error:
        status.update(
            phase="failed", error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc()[-3000:]
        )
        log(status.name, f"failed: {error!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
