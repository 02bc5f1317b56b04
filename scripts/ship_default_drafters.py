"""Ship a trained drafter as one of the embedded defaults (bf16 weights + model card) and refresh its card.

    # 1. export a training checkpoint (fp32) to the package's resources folder in bf16
    python scripts/ship_default_drafters.py export --variant dspark \
        --checkpoint runs/smollm2-135m-instruct-dspark/checkpoint-700
    # 2. calibrate in place (writes the STS temperatures into config.json + calibration.json)
    hf-dspark calibrate --drafter src/hf_dspark/resources/drafters/smollm2-135m-instruct-dspark \
        --prompts data/calibration/heldout_train_prompts.jsonl --mode both --limit 48
    # 3. after `hf-dspark eval`, write the model card with the measured τ
    python scripts/ship_default_drafters.py card --variant dspark \
        --checkpoint runs/smollm2-135m-instruct-dspark/checkpoint-700 \
        --eval benchmarks/results/eval_t0.json benchmarks/results/eval_t1.json --wall-hours 1.8

The card states the data, the training budget (steps, sequences, reply tokens, wall-clock), τ per eval set at each
temperature found in the given eval reports, the calibration result and the exact reproduction commands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_dspark.defaults import DEFAULT_TARGET_NAME, default_drafter_dir
from hf_dspark.interop.hub import add_remote_code, write_model_card
from hf_dspark.modeling_dspark import DSparkDrafter

TRAIN_DATA = "data/train_regenerated/smollm2_135m_instruct.jsonl"
HEAD_FLAGS = {"dspark": "--head_type markov", "dflash": "--head_type none --confidence_with_markov false"}
# held-out loss/τ during training (no effect on the weights: anchors are seeded per example); the baseline ran
# without it after its first 100 steps to fit the session's time budget
EVAL_FLAGS = {"dspark": "--eval_strategy steps --eval_steps 250 --per_device_eval_batch_size 4",
              "dflash": "--eval_strategy no"}
TITLES = {"dspark": "DSpark drafter for SmolLM2-135M-Instruct (the hf-dspark default)",
          "dflash": "DFlash-style baseline drafter for SmolLM2-135M-Instruct (hf-dspark)"}


def reproduce_block(variant: str, steps: int) -> str:
    """The exact commands that produced the shipped folder (training, export, calibration, eval)."""
    out = f"runs/smollm2-135m-instruct-{variant}"
    folder = f"src/hf_dspark/resources/drafters/smollm2-135m-instruct-{variant}"
    sets = "data/eval/gsm8k.jsonl data/eval/humaneval.jsonl data/eval/mt-bench.jsonl"
    return f"""```bash
# training (1 CPU thread, online target features; stopped after step {steps} of the 1,500-step cosine schedule)
OMP_NUM_THREADS=1 python -m hf_dspark.training --data data/train_regenerated --output_dir {out} \\
  --resume_from_checkpoint auto --num_hidden_layers 2 --block_size 7 --markov_rank 64 --mask_token_id 16 \\
  {HEAD_FLAGS[variant]} --max_steps 1500 --stop_after_steps {steps} --per_device_train_batch_size 4 \\
  --anchors_per_sequence 16 \\
  --learning_rate 6e-4 --lr_scheduler_type cosine --warmup_steps 50 --weight_decay 0.0 --validation_fraction 0.05 \\
  {EVAL_FLAGS[variant]} --save_strategy steps --save_steps 100 \\
  --save_total_limit 3 --logging_steps 10 --seed 0 --num_threads 1 --use_cpu --report_to none
# bf16 export, calibration on held-out training prompts, card
python scripts/ship_default_drafters.py export --variant {variant} --checkpoint {out}/checkpoint-{steps}
hf-dspark calibrate --drafter {folder} --prompts data/calibration/heldout_train_prompts.jsonl \\
  --mode both --limit 48 --max-new-tokens 96 --batch-size 8 --threads 1
# accepted length (γ = 7, no scheduler), first 40 prompts per set, T = 0 and T = 1
hf-dspark eval --drafters dspark=src/hf_dspark/resources/drafters/smollm2-135m-instruct-dspark \\
  dflash=src/hf_dspark/resources/drafters/smollm2-135m-instruct-dflash --prompt-lookup --sets {sets} \\
  --limit 40 --max-new-tokens 128 --batch-size 8 --threads 1 --temperature 0 --sweep \\
  --out benchmarks/results/eval_t0.json
hf-dspark eval --drafters dspark=... dflash=... --prompt-lookup --sets {sets} --limit 40 --max-new-tokens 128 \\
  --batch-size 8 --threads 1 --temperature 1 --out benchmarks/results/eval_t1.json
```"""


def tau_rows(variant: str, eval_paths: list[str]) -> dict[str, dict[str, float]]:
    """{set: {"T=0": τ, "T=1": τ}} for the drafter named `variant` in each eval report."""
    rows: dict[str, dict[str, float]] = {}
    for path in eval_paths:
        report = json.loads(Path(path).read_text())
        entry = report["table"].get(variant)
        if entry is None:
            raise SystemExit(f"{path} has no drafter named {variant!r} (has {sorted(report['table'])})")
        label = f"T={report['config']['temperature']:g}"
        for set_name, row in entry["sets"].items():
            rows.setdefault(set_name, {})[label] = row["tau"]
        rows.setdefault("macro (math, code, chat)", {})[label] = entry["macro"]
    return rows


def calibration_notes(folder: Path) -> str:
    """One line per mode from the calibration sidecar: mean per-position ECE before and after STS."""
    sidecar = folder / "calibration.json"
    if not sidecar.is_file():
        return "Confidence head not calibrated yet."
    lines = []
    for mode, rep in json.loads(sidecar.read_text())["reports"].items():
        before, after = rep.get("ece_before"), rep.get("ece_after")
        if before and after:
            mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
            lines.append(f"- {mode}: mean per-position ECE {mean(before):.3f} → {mean(after):.3f} after STS "
                         f"(temperatures {', '.join(f'{t:.2f}' for t in rep['temperatures'])})")
    return "Calibration (held-out training prompts, `calibration.json`):\n" + "\n".join(lines)


def budget_text(checkpoint: Path, wall_hours: float | None) -> tuple[str, int]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    args = torch.load(checkpoint / "training_args.bin", weights_only=False)
    steps, epochs = state["global_step"], state["epoch"]
    batch, anchors = args.per_device_train_batch_size, args.anchors_per_sequence
    last = [h for h in state["log_history"] if "tau_est" in h][-1]
    wall = f"{wall_hours:.1f} h wall-clock on 1 CPU thread" if wall_hours else "wall-clock not recorded"
    return (f"{steps} optimizer steps ({epochs:.2f} epochs of 2,090 training sequences ≈ "
            f"{epochs * 410_176 / 1e3:.0f}k reply tokens through the frozen target), batch {batch} sequences × "
            f"{anchors} anchor blocks of γ = 7, lr 6e-4 cosine (1,500-step schedule, stopped at step {steps}); "
            f"{wall}. Training-batch τ estimate at the end: {last['tau_est']:.2f}.", steps)


def cmd_export(args: argparse.Namespace) -> None:
    out = default_drafter_dir(args.variant)
    if (out / "model.safetensors").exists() and not args.force:
        raise SystemExit(f"{out} already holds a drafter; pass --force to replace it (its calibration is lost).")
    drafter = DSparkDrafter.from_pretrained(args.checkpoint, dtype=torch.bfloat16)
    drafter.save_pretrained(out)
    add_remote_code(out)
    print(f"bf16 drafter ({sum(p.numel() for p in drafter.parameters()):,} parameters) written to {out}")


def cmd_card(args: argparse.Namespace) -> None:
    folder = default_drafter_dir(args.variant)
    drafter = DSparkDrafter.from_pretrained(folder)
    budget, steps = budget_text(Path(args.checkpoint), args.wall_hours)
    notes = ("Measured with `hf-dspark eval` on the first 40 prompts of each set (MT-Bench: both turns), γ = ℓ = 7, "
             "no scheduler, 128 new tokens per turn, fp32 target on CPU.\n\n" + calibration_notes(folder))
    usage = f"""```python
import hf_dspark

target, tokenizer = hf_dspark.load_default_target()
drafter = hf_dspark.load_default_drafter(target{', variant="dflash"' if args.variant == "dflash" else ''})
inputs = tokenizer.apply_chat_template([{{"role": "user", "content": "What is 17 * 23?"}}],
                                       add_generation_prompt=True, return_tensors="pt", return_dict=True)
output = target.generate(**inputs, assistant_model=drafter, max_new_tokens=128)
```"""
    write_model_card(drafter, folder, base_model=f"HuggingFaceTB/{DEFAULT_TARGET_NAME}", title=TITLES[args.variant],
                     training_data=f"{TRAIN_DATA} (2,200 prompts from gsm8k train, Code Alpaca, ShareGPT; replies "
                     "regenerated by the target, see data/README.md; 5% held out)", budget=budget,
                     tau_table=tau_rows(args.variant, args.eval), notes=notes,
                     reproduce=reproduce_block(args.variant, steps), usage=usage)
    print(f"wrote {folder / 'README.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("export", "card"):
        p = sub.add_parser(name)
        p.add_argument("--variant", choices=["dspark", "dflash"], required=True)
        p.add_argument("--checkpoint", required=True, help="training checkpoint folder (fp32, with trainer_state)")
        if name == "export":
            p.add_argument("--force", action="store_true")
        else:
            p.add_argument("--eval", nargs="+", required=True, help="hf-dspark eval JSON reports")
            p.add_argument("--wall-hours", type=float, default=None)
    args = parser.parse_args()
    cmd_export(args) if args.command == "export" else cmd_card(args)


if __name__ == "__main__":
    main()
