"""Ship a trained drafter as one of the embedded defaults (bf16 weights + model card) and refresh its card.

    # 1. export a training checkpoint (fp32) to the package's resources folder in bf16
    python scripts/ship_default_drafters.py export --variant dspark \
        --checkpoint runs/dspark/checkpoint-400
    # 2. calibrate in place (writes the STS temperatures into config.json + calibration.json)
    hf-dspark calibrate --drafter src/hf_dspark/resources/drafters/smollm2-135m-instruct-dspark \
        --prompts data/calibration/heldout_train_prompts.jsonl --mode both --limit 48
    # 3. measure τ (ONLY=eval benchmarks/measure_readme.sh), then write the model card
    python scripts/ship_default_drafters.py card --variant dspark --checkpoint runs/dspark/checkpoint-400 \
        --eval benchmarks/results/KIND/eval_t0.json benchmarks/results/KIND/eval_t1.json --cpu-hours 2.5
    # after a new measurement of τ: rewrite only the cards' τ tables (no checkpoint needed)
    python scripts/ship_default_drafters.py tau --variant dspark \
        --eval benchmarks/results/KIND/eval_t0.json benchmarks/results/KIND/eval_t1.json

KIND is the processor kind (`python -c "from hf_dspark.provenance import processor_kind; print(processor_kind())"`).
The card states the data, the training budget (steps, sequences, compute), τ per eval set at each temperature found
in the given eval reports with the files and commit they come from, the calibration result and the exact
reproduction commands.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.defaults import DEFAULT_TARGET_NAME, default_drafter_dir
from hf_dspark.interop.hub import add_remote_code, write_model_card

TRAIN_DATA = "data/train_regenerated/ (smollm2_135m_instruct.jsonl + smollm2_135m_instruct_more.jsonl)"
HEAD_FLAGS = {"dspark": "--head_type markov", "dflash": "--head_type none --confidence_with_markov false"}
# Earlier stages of the shipped drafters, oldest first (the last stage is described from its checkpoint).
EARLIER_STAGES = [
    "v1: 700 steps × 4 sequences × 16 anchor blocks on the first 2,200 prompts (fp32)",
    "v2: warm start from v1, 400 steps × 2 sequences with dense anchors (every reply position anchors a block), "
    "bf16 autocast, an 8,192-token draft vocabulary, lr 3e-4 cosine",
    "v3: warm start from v2, 1,200 steps × 2 sequences, the v2 recipe at peak lr 5e-4 cosine, data order seed 1",
    "v4: warm start from the fp32 v3 checkpoint, 1,200 steps × 2 sequences, the same recipe at peak lr 5e-4 "
    "cosine, data order seed 2",
    "v5: warm start from the fp32 v4 checkpoint, 1,200 steps × 2 sequences, the same recipe at peak lr 5e-4 "
    "cosine, data order seed 3",
    "v6: warm start from v5, 300 steps × 2 sequences, the same recipe in fp32 (no bf16 autocast), peak lr 2e-4 "
    "cosine, data order seed 4",
]
TITLES = {
    "dspark": "DSpark drafter for SmolLM2-135M-Instruct (the hf-dspark default)",
    "dflash": "DFlash-style baseline drafter for SmolLM2-135M-Instruct (hf-dspark)",
}


def reproduce_block(variant: str, args, limit: int, init: str | None = None) -> str:
    """The exact commands that produced the shipped folder (training, export, calibration, eval).

    `args`: the checkpoint's `TrainingArguments` (steps, LR, seeds of the last warm-started stage).
    """
    out = f"runs/{variant}"
    folder = f"src/hf_dspark/resources/drafters/smollm2-135m-instruct-{variant}"
    steps, lr, seed = args.max_steps, f"{args.learning_rate:g}", args.seed
    init = init or folder
    before = ", as it was before this stage" if init == folder else ""
    dtype = "bf16" if args.bf16 else "fp32"
    dtype_flags = "--target_dtype bfloat16 --bf16 True" if args.bf16 else "--target_dtype float32"
    kd = getattr(args, "alpha_kd", 0.0)
    kd_flag = f" --alpha_kd {kd:g}" if kd else ""
    batch, warmup = args.per_device_train_batch_size, args.warmup_steps
    return f"""```bash
# the last stage: warm start from the stage before ({init}{before}; every stage: CHANGELOG.md),
# 1 CPU thread, online {dtype} target features, dense anchors,
# 8,192-token draft vocabulary, {steps} cosine steps at peak lr {lr}; the validation split stays the one of seed 0
OMP_NUM_THREADS=1 python -m hf_dspark.training --data data/train_regenerated --output_dir {out} \\
  --resume_from_checkpoint auto --init_drafter {init} {dtype_flags} --use_cpu True \\
  --draft_vocab_size 8192 --anchors_per_sequence 512 --per_device_train_batch_size {batch} \\
  --max_steps {steps} --learning_rate {lr} --lr_scheduler_type cosine --warmup_steps {warmup:g} \\
  --weight_decay 0.0 --validation_fraction 0.004 --eval_strategy steps --eval_steps {args.eval_steps} \\
  --per_device_eval_batch_size 4 --save_strategy steps --save_steps {args.save_steps} --save_total_limit 3 \\
  --logging_steps 5 --train_sampling_strategy group_by_length --num_threads 1 --report_to none --seed {seed} \\
  --validation_seed 0{kd_flag}
# bf16 export, calibration on held-out training prompts, card
python scripts/ship_default_drafters.py export --variant {variant} --checkpoint {out}/checkpoint-{steps} --force
hf-dspark calibrate --drafter {folder} --prompts data/calibration/heldout_train_prompts.jsonl \\
  --mode both --limit 48 --max-new-tokens 96 --batch-size 8 --threads 1
# accepted length (γ = 7, no scheduler), first {limit} prompts per set, T = 0 and T = 1, into
# benchmarks/results/<processor kind>/eval_t0.json and eval_t1.json (each file records its exact command)
ONLY=eval THREADS=1 benchmarks/measure_readme.sh
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


def eval_note(eval_paths: list[str]) -> str:
    """How τ was measured, and the result files and commits it comes from."""
    reports = [json.loads(Path(path).read_text()) for path in eval_paths]
    limits = {report["config"]["limit"] for report in reports}
    if len(limits) != 1 or None in limits:
        raise SystemExit(f"the eval reports must share one --limit (they have {sorted(map(str, limits))})")
    sources = ", ".join(
        f"`{Path(path).as_posix()}` (commit `{(report.get('provenance') or {}).get('git_commit', 'unknown')[:10]}`)"
        for path, report in zip(eval_paths, reports)
    )
    return (
        f"Measured with `hf-dspark eval` on the first {limits.pop()} prompts of each set (MT-Bench: both turns), "
        f"γ = ℓ = 7, no scheduler, 128 new tokens per turn, fp32 target on CPU: {sources}."
    )


def tau_markdown(variant: str, eval_paths: list[str]) -> str:
    """The card's τ table (as the card template writes it) for the drafter named `variant`."""
    rows = tau_rows(variant, eval_paths)
    columns = list(dict.fromkeys(column for row in rows.values() for column in row))
    lines = ["| eval set | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in columns) + " |" for name, row in rows.items()]
    return "\n".join(lines)


TAU_SECTION = re.compile(r"(## Accepted length τ\n\n[^\n]*\n\n)(.*?)(\n\nCalibration |\n\n## )", re.S)


def replace_tau_section(card: str, variant: str, eval_paths: list[str]) -> str:
    """`card` with its τ table and measurement note rewritten from the eval reports."""
    match = TAU_SECTION.search(card)
    if match is None:
        raise SystemExit("the model card has no '## Accepted length τ' section; write it with the card command")
    body = tau_markdown(variant, eval_paths) + "\n\n" + eval_note(eval_paths)
    return card[: match.start(2)] + body + card[match.end(2) :]


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
            lines.append(
                f"- {mode}: mean per-position ECE {mean(before):.3f} → {mean(after):.3f} after STS "
                f"(temperatures {', '.join(f'{t:.2f}' for t in rep['temperatures'])})"
            )
            if rep.get("acceptance"):
                lines.append(
                    f"  - conditional acceptance per position, the `auto` policy's starting estimate: "
                    f"{', '.join(f'{q:.2f}' for q in rep['acceptance'])}"
                )
    return "Calibration (held-out training prompts, `calibration.json`):\n" + "\n".join(lines)


def budget_text(checkpoint: Path, cpu_hours: float | None, stage: str) -> tuple[str, object]:
    """The training history in one paragraph, and the last stage's `TrainingArguments`."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    args = torch.load(checkpoint / "training_args.bin", weights_only=False)
    steps, epochs = state["global_step"], state["epoch"]
    batch = args.per_device_train_batch_size
    last = [h for h in state["log_history"] if "tau_est" in h][-1]
    held_out = [h for h in state["log_history"] if "eval_tau_est" in h]
    compute = f"{cpu_hours:.1f} CPU-hours in all stages" if cpu_hours else "compute not recorded"
    earlier = [text for text in EARLIER_STAGES if int(text.split(":")[0][1:]) < int(stage[1:])]
    previous = earlier[-1].split(":")[0] if earlier else "scratch"
    recipe = "the same recipe" + ("" if args.bf16 else " in fp32 (no bf16 autocast)")
    kd = getattr(args, "alpha_kd", 0.0)
    if kd:
        recipe += f" plus the distillation term KL(p_target ‖ p_draft) at α_kd = {kd:g}"
    text = (
        ". ".join(earlier) + (". " if earlier else "") + f"{stage} (this stage): warm start from {previous}, "
        f"{steps} steps × {batch} "
        f"sequences, {recipe}, peak lr {args.learning_rate:g} cosine, data order seed {args.seed} "
        f"({epochs:.3f} epochs of 9,000 sequences); {compute}. Training-batch τ estimate (T = 1) at the end: "
        f"{last['tau_est']:.2f}"
    )
    if held_out:
        text += f"; held-out (validation split) τ estimate: {held_out[-1]['eval_tau_est']:.3f}"
    return text + ".", args


def device_train_stage(
    variant: str, results_path: Path, arm: str, stage: str, cpu_hours: float | None
) -> tuple[str, str]:
    """The training history and the reproduction commands of a stage trained by `scripts/device_train.py`.

    `results_path`: its results.json; `arm`: the data arm shipped (its folder is what `export --checkpoint` read).
    """
    results = json.loads(results_path.read_text())
    record = results["arms"].get(arm)
    if record is None or not record.get("weights"):
        raise SystemExit(f"{results_path} has no trained arm {arm!r} (arms: {sorted(results['arms'])})")
    steps, batch, lr = record["steps"], record["batch"], record["learning_rate"]
    where = results["provenance"]
    device = "a CUDA device" if where.get("cuda") else f"the CPU ({where['processor']}, 1 thread per arm)"
    others = ", ".join(name for name in results["arms"] if name != arm) or "none"
    earlier = [text for text in EARLIER_STAGES if int(text.split(":")[0][1:]) < int(stage[1:])]
    previous = earlier[-1].split(":")[0] if earlier else "scratch"
    loss = record.get("loss", {})
    compute = f"{cpu_hours:.1f} CPU-hours in all stages" if cpu_hours else "compute not recorded"
    text = (
        ". ".join(earlier) + (". " if earlier else "") + f"{stage} (this stage): {previous} converted to per-head q/k "
        "RMSNorms (what vLLM's and speculators' draft layers run; each norm weight fitted by least squares to "
        f"{previous}'s query and key projections), then {steps} steps × {batch} sequences on the {arm} replies "
        f"({', '.join(results['data'][arm])}), the same recipe at peak lr {lr:g} cosine, fp32 on {device}, in a "
        f"{results['settings']['minutes']:g}-minute budget beside the other data arms ({others}); {compute}. "
        f"Training loss: {loss.get('first')} at the start, {loss.get('mean_last_tenth')} over the last tenth of the "
        f"steps. The A/B of the arms (τ on the first {results['settings']['eval_limit']} prompts per set) is "
        f"`benchmarks/results/<processor kind>/{results_path.name}`"
    )
    folder = f"src/hf_dspark/resources/drafters/smollm2-135m-instruct-{variant}"
    reproduce = f"""```bash
# the last stage: q/k-norm conversion and fine-tuning per data arm, then τ of each (results.json)
{results["command"]}
python scripts/ship_default_drafters.py export --variant {variant} --force \\
  --checkpoint {results["settings"]["out"]}/{arm}
hf-dspark calibrate --drafter {folder} --prompts data/calibration/heldout_train_prompts.jsonl \\
  --mode both --limit 48 --max-new-tokens 96 --batch-size 8 --threads 1
# accepted length (γ = 7, no scheduler), first 40 prompts per set, T = 0 and T = 1, into
# benchmarks/results/<processor kind>/eval_t0.json and eval_t1.json (each file records its exact command)
ONLY=eval THREADS=1 benchmarks/measure_readme.sh
```"""
    return text + ".", reproduce


def stage_name(value: str) -> str:
    """argparse type of --stage: 'v' and a positive number."""
    if not (value.startswith("v") and value[1:].isdigit() and int(value[1:]) > 0):
        raise argparse.ArgumentTypeError(f"--stage must be 'v' and a number, e.g. v4; got {value!r}")
    return value


def cmd_export(args: argparse.Namespace) -> None:
    out = default_drafter_dir(args.variant)
    if (out / "model.safetensors").exists() and not args.force:
        raise SystemExit(f"{out} already holds a drafter; pass --force to replace it (its calibration is lost).")
    drafter = DSparkDrafter.from_pretrained(args.checkpoint, dtype=torch.bfloat16)
    drafter.save_pretrained(out)
    add_remote_code(out)
    print(f"bf16 drafter ({sum(p.numel() for p in drafter.parameters()):,} parameters) written to {out}")


MODEL_CARDS = Path(__file__).resolve().parents[1] / "model_cards"


def publish_card(variant: str) -> Path:
    """Copy the shipped drafter's card to model_cards/<drafter folder>.md (the published cards, kept identical)."""
    card = default_drafter_dir(variant) / "README.md"
    copy = MODEL_CARDS / f"{card.parent.name}.md"
    copy.write_bytes(card.read_bytes())
    return copy


def cmd_card(args: argparse.Namespace) -> None:
    folder = default_drafter_dir(args.variant)
    drafter = DSparkDrafter.from_pretrained(folder)
    limit = json.loads(Path(args.eval[0]).read_text())["config"]["limit"]
    if args.device_train:
        budget, reproduce = device_train_stage(
            args.variant, Path(args.device_train), args.arm, args.stage, args.cpu_hours
        )
    else:
        budget, train_args = budget_text(Path(args.checkpoint), args.cpu_hours, args.stage)
        reproduce = reproduce_block(args.variant, train_args, limit, args.init)
    notes = eval_note(args.eval) + "\n\n" + calibration_notes(folder)
    usage = f"""```python
import hf_dspark

target, tokenizer = hf_dspark.load_default_target()
drafter = hf_dspark.load_default_drafter(target{', variant="dflash"' if args.variant == "dflash" else ""})
inputs = tokenizer.apply_chat_template([{{"role": "user", "content": "What is 17 * 23?"}}],
                                       add_generation_prompt=True, return_tensors="pt", return_dict=True)
output = target.generate(**inputs, assistant_model=drafter, max_new_tokens=128)
```"""
    write_model_card(
        drafter,
        folder,
        base_model=f"HuggingFaceTB/{DEFAULT_TARGET_NAME}",
        title=TITLES[args.variant],
        training_data=f"{TRAIN_DATA} (9,036 prompts from gsm8k train, Code Alpaca, ShareGPT; replies "
        "regenerated by the target, see data/README.md; 0.4% held out)"
        + (f"; the last stage on the {args.arm} replies to the same prompts" if args.device_train else ""),
        budget=budget,
        tau_table=tau_rows(args.variant, args.eval),
        notes=notes,
        reproduce=reproduce,
        usage=usage,
    )
    publish_card(args.variant)
    print(f"wrote {folder / 'README.md'} and its copy in {MODEL_CARDS}/")


def cmd_tau(args: argparse.Namespace) -> None:
    card = default_drafter_dir(args.variant) / "README.md"
    card.write_text(replace_tau_section(card.read_text(encoding="utf-8"), args.variant, args.eval), encoding="utf-8")
    publish_card(args.variant)
    print(f"rewrote the τ table of {card} and its copy in {MODEL_CARDS}/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("export", "card", "tau"):
        p = sub.add_parser(name)
        p.add_argument("--variant", choices=["dspark", "dflash"], required=True, help="which default drafter")
        if name == "tau":
            p.add_argument("--eval", nargs="+", required=True, help="hf-dspark eval JSON reports")
            continue
        if name == "export":
            p.add_argument(
                "--checkpoint",
                required=True,
                help="drafter folder to ship (a training checkpoint, or an arm folder of scripts/device_train.py)",
            )
            p.add_argument("--force", action="store_true", help="replace the shipped drafter")
        else:
            source = p.add_mutually_exclusive_group(required=True)
            source.add_argument(
                "--checkpoint", help="the stage's training checkpoint folder (fp32, with trainer_state)"
            )
            source.add_argument(
                "--device-train", default=None, help="results.json of a scripts/device_train.py stage (with --arm)"
            )
            p.add_argument("--arm", default=None, help="the data arm of --device-train that was shipped")
            p.add_argument("--eval", nargs="+", required=True, help="hf-dspark eval JSON reports")
            p.add_argument("--cpu-hours", type=float, default=None, help="training compute in all stages")
            p.add_argument(
                "--stage",
                default="v4",
                type=stage_name,
                help="the checkpoint's stage, 'v' and a number (v2, v3, v4, ...)",
            )
            p.add_argument(
                "--init",
                default=None,
                help="what the stage warm-started from, as passed to --init_drafter (default: the shipped folder)",
            )
    args = parser.parse_args()
    if args.command == "card" and bool(args.device_train) != bool(args.arm):
        parser.error("--device-train and --arm go together")
    {"export": cmd_export, "card": cmd_card, "tau": cmd_tau}[args.command](args)


if __name__ == "__main__":
    main()
