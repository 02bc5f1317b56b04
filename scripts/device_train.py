"""Train the default recipe on a CUDA device and evaluate: the shipped DSpark drafter, converted to q/k norms (which
serving engines require), fine-tuned on each data arm concurrently, then τ of the init and of every arm.

    python scripts/device_train.py --out runs/device_train          # embedded target, shipped drafter, both arms
    python scripts/device_train.py --target-gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf --minutes 3.5 --out OUT
    python scripts/device_train.py --device cpu --minutes 0.3 --eval-limit 2 --out /tmp/dry   # the CPU dry run

1. The target is dequantised from its GGUF once (fp32) and saved as safetensors in a work folder that every worker
   loads from. The init drafter is converted to `use_qk_norm=True` (`drafter_init.convert_drafter`), its new norm
   weights fitted to reproduce the init's attention projections on 8 training sequences (`fit_qk_norms`).
2. One process per arm trains from that converted init at the same time on the one device: configs/recipe.yaml
   except a GPU batch (`--batch`, default 16 sequences on CUDA, 8× the recipe's 2), a bf16 target with bf16
   autocast on CUDA (fp32 master weights), no checkpoints, and the step count from the measured speed: the arms
   start their clocks together once all have loaded their data, `TimeBudgetCallback` times the warmup steps, every
   arm plans the steps that fit in `--minutes`, and all arms take the smallest plan, so the A/B has equal steps and
   batch; the cosine schedule ends at that step. A hard stop at `--minutes` (or earlier, when half the grace time
   would not remain for saving and evaluating) catches a slowdown.
3. Each trained drafter is saved in bf16 with `save_pretrained(max_shard_size="15MB")` into `--out/<arm>/`
   (config.json, safetensors shards under 16 MiB, the index), then evaluated in its process; the init (as shipped)
   and the converted init are evaluated by two more processes: `hf-dspark eval`'s `accepted_length.evaluate` on
   `--eval-sets` (first `--eval-limit` prompts), γ = the drafter's block size, fixed ℓ, 128 new tokens, an fp32
   target, at each of `--temperatures`.
4. `--out/results.json`: command, git commit, versions, device, per arm (steps, batch, speed, loss curve summary, τ
   per set and temperature, macro), the q/k fit, errors. A time guard ends every worker by `--minutes` +
   `--grace-minutes` after the start and writes results.json with what finished; it is also rewritten as results
   arrive.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ARMS = ["sampled=data/train_regenerated/*.jsonl", "greedy=data/train_regenerated/greedy/*.jsonl"]
DEFAULT_SETS = [f"data/eval/{name}.jsonl" for name in ("gsm8k", "humaneval", "mt-bench")]
OUT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")
MAX_FILE_BYTES = 16 * 2**20
MAX_FILES_PER_FOLDER = 8


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


worker = sys.modules.get("device_train_worker") or _sibling("device_train_worker")


def log(message: str) -> None:
    worker.log("main", message)


def _repo_path(pattern: str) -> str:
    """`pattern` as given when it matches from the working directory, else relative to the repository."""
    return pattern if glob.glob(pattern) or Path(pattern).is_absolute() else str(REPO / pattern)


def parse_arm(spec: str) -> tuple[str, list[str]]:
    name, sep, pattern = spec.partition("=")
    files = sorted(glob.glob(_repo_path(pattern))) if sep else []
    if not name or not name.isidentifier() or not files:
        raise argparse.ArgumentTypeError(
            f"--arms takes NAME=GLOB matching JSONL files (NAME a plain word), got {spec!r}"
        )
    return name, files


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    add = parser.add_argument
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--target-gguf", default=None, help="target GGUF file (default: the embedded SmolLM2 one)")
    source.add_argument("--target", default=None, help="target as a transformers folder instead of a GGUF file")
    add(
        "--init",
        default=str(REPO / "src/hf_dspark/resources/drafters/smollm2-135m-instruct-dspark"),
        help="drafter every arm starts from (default: the shipped DSpark drafter)",
    )
    add(
        "--arms",
        nargs="+",
        type=parse_arm,
        default=None,
        help="NAME=GLOB of training JSONL (default: sampled, greedy)",
    )
    add("--minutes", type=float, default=3.5, help="training wall budget per arm (default 3.5)")
    add("--grace-minutes", type=float, default=3.0, help="the whole run ends by --minutes + this (default 3)")
    add("--eval-limit", type=int, default=40, help="prompts per eval set (default 40)")
    add("--eval-sets", nargs="+", default=DEFAULT_SETS, help="eval prompt sets (default gsm8k humaneval mt-bench)")
    add("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="eval temperatures (default 0 1)")
    add("--max-new-tokens", type=int, default=128, help="tokens generated per eval turn (default 128)")
    add(
        "--batch", type=int, default=None, help="sequences per training step (default 16 on CUDA, the recipe's on cpu)"
    )
    add("--learning-rate", type=float, default=None, help="peak learning rate (default: the recipe's)")
    add("--recipe", default=str(REPO / "configs/recipe.yaml"), help="training recipe (default configs/recipe.yaml)")
    add("--device", default=None, help="cuda or cpu (default: cuda when available)")
    add("--work-dir", default=None, help="scratch folder for the converted target and runs (default: a temp dir)")
    add("--commit", default=None, help="commit to record when the checkout has no git metadata")
    add("--out", required=True, help="output folder (absent or empty): results.json and one folder per arm")
    args = parser.parse_args(argv)
    args.arms = dict(args.arms or [parse_arm(spec) for spec in DEFAULT_ARMS])
    if args.minutes <= 0 or args.grace_minutes <= 0 or args.eval_limit < 1 or args.max_new_tokens < 1:
        parser.error("--minutes, --grace-minutes, --eval-limit and --max-new-tokens must be positive")
    if len(args.arms) != len(set(args.arms)) or {"init", "init_qk"} & set(args.arms):
        parser.error("arm names must be unique and not 'init' / 'init_qk'")
    args.eval_sets = [_repo_path(path) for path in args.eval_sets]
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        parser.error(f"--out {out} must be a new or empty folder")
    return args


def environment(args: argparse.Namespace) -> dict:
    from hf_dspark.provenance import result_provenance

    record = result_provenance(["python", "scripts/device_train.py", *sys.argv[1:]], device=args.device, cwd=REPO)
    if record["git_commit"] is None and args.commit:
        record["git_commit"], record["dirty"] = args.commit, None
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    record.update(device=args.device, device_name=name, cuda=torch.version.cuda)
    return record


def prepare(args: argparse.Namespace, work: Path, results: dict) -> None:
    """Target as safetensors in `work/target`, the converted init in `work/init_qk`."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.training.data import build_dataset, load_conversations
    from hf_dspark.training.drafter_init import convert_drafter, fit_qk_norms, target_batch_runner

    target, tokenizer = worker.load_target_source(args.target_gguf, args.target)
    worker.save_plain_target(target, tokenizer, work / "target")
    log(f"target saved as safetensors ({sum(p.numel() for p in target.parameters()) / 1e6:.0f} M parameters)")
    target.to(args.device)
    source = DSparkDrafter.from_pretrained(args.init, target=target)
    if source.config.use_qk_norm:
        source.save_pretrained(work / "init_qk")
        results["init"]["qk_norm"] = "already present"
        return
    converted, added = convert_drafter(source, target, use_qk_norm=True)
    first_arm = next(iter(args.arms.values()))
    examples = build_dataset(load_conversations(first_arm)[:64], tokenizer, max_length=1024).examples[:8]
    fit = fit_qk_norms(source, converted, target_batch_runner(target, examples))
    converted.save_pretrained(work / "init_qk")
    results["init"].update(qk_norm="fitted", new_parameters=len(added), qk_fit=fit)
    log(f"init converted to q/k norms: {len(added)} new weights, fit {json.dumps(fit)}")


def spawn(spec: dict, work: Path) -> subprocess.Popen:
    path = work / f"spec-{spec['name']}.json"
    path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TQDM_DISABLE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.Popen([sys.executable, str(Path(worker.__file__)), str(path)], env=env)


def specs(args: argparse.Namespace, work: Path, deadline: float) -> tuple[list[dict], list[dict]]:
    common = dict(
        target=str(work / "target"),
        work=str(work),
        device=args.device,
        deadline=deadline,
        eval=dict(
            sets=args.eval_sets,
            limit=args.eval_limit,
            temperatures=args.temperatures,
            max_new_tokens=args.max_new_tokens,
        ),
    )
    batch = args.batch or (16 if args.device.startswith("cuda") else None)
    train_until = deadline - 30.0 * args.grace_minutes  # half the grace is left for saving and evaluating
    arms = [
        dict(
            common,
            kind="train",
            name=name,
            data=files,
            drafter=str(work / "init_qk"),
            train_until=train_until,
            out=str(Path(args.out) / name),
            peers=sorted(args.arms),
            minutes=args.minutes,
            recipe=args.recipe,
            batch=batch,
            learning_rate=args.learning_rate,
        )
        for name, files in args.arms.items()
    ]
    evals = [
        dict(common, kind="eval", name="init", drafter=args.init),
        dict(common, kind="eval", name="init_qk", drafter=str(work / "init_qk")),
    ]
    return arms, evals


def check_out_tree(out: Path) -> list[str]:
    """Problems with what comes back: a file of 16 MiB or more, over 8 entries in a folder, folders 3 deep."""
    problems = []
    for folder, dirs, files in os.walk(out):
        depth = len(Path(folder).relative_to(out).parts)
        if len(dirs) + len(files) > MAX_FILES_PER_FOLDER:
            problems.append(f"{folder}: {len(dirs) + len(files)} entries")
        if depth >= 2 and dirs:
            problems.append(f"{folder}: folders nested deeper than 2")
        problems += [
            f"{folder}/{f}: {os.path.getsize(Path(folder) / f)} bytes"
            for f in files
            if os.path.getsize(Path(folder) / f) >= MAX_FILE_BYTES
        ]
    return problems


def collect(results: dict, work: Path, names: list[str]) -> None:
    """Every worker's status file into results: arms under "arms", the init's evaluations under "init_eval"."""
    for name in names:
        status = worker.read_json(work / f"status-{name}.json")
        if status is not None:
            results["init_eval" if name in ("init", "init_qk") else "arms"][name] = status
            results["tau"][name] = status.get("tau", {})


def supervise(
    procs: dict[str, subprocess.Popen], later: list[dict], work: Path, deadline: float, results: dict, out: Path
) -> None:
    """Wait for the workers; start `later` once every arm has trained; stop everything at the deadline."""
    last_write = 0.0
    while time.time() < deadline - 8:
        statuses = {n: (worker.read_json(work / f"status-{n}.json") or {}) for n in procs}
        trained = all(
            s.get("phase") in ("evaluating", "done", "failed") or procs[n].poll() is not None
            for n, s in statuses.items()
            if not n.startswith("init")
        )
        if later and trained:
            for spec in later:
                procs[spec["name"]] = spawn(spec, work)
            log(f"arms trained; evaluating {[s['name'] for s in later]}")
            later = []
        if not later and all(p.poll() is not None for p in procs.values()):
            break
        if time.time() - last_write > 10:
            collect(results, work, list(procs))
            worker.write_json(out / "results.json", results)
            last_write = time.time()
        time.sleep(1.0)
    for name, proc in procs.items():
        if proc.poll() is None:
            results["errors"].append(f"{name}: stopped by the time guard")
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
    for name in later:
        results["errors"].append(f"{name['name']}: not started before the time guard")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")  # loading and eval progress bars would bury the log
    start = time.time()
    deadline = start + 60.0 * (args.minutes + args.grace_minutes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="device_train-"))
    work.mkdir(parents=True, exist_ok=True)
    results = {
        "command": shlex.join(["python", "scripts/device_train.py", *(argv if argv is not None else sys.argv[1:])]),
        "provenance": environment(args),
        "settings": {k: v for k, v in vars(args).items() if k != "arms"},
        "data": args.arms,
        "init": {"path": args.init},
        "init_eval": {},
        "arms": {},
        "tau": {},
        "errors": [],
    }
    log(f"device {results['provenance']['device_name']}, arms {list(args.arms)}, work folder {work}")
    procs: dict[str, subprocess.Popen] = {}
    try:
        prepare(args, work, results)
        arms, evals = specs(args, work, deadline)
        procs = {spec["name"]: spawn(spec, work) for spec in arms}
        log(f"training {list(procs)} for {args.minutes} min each")
        supervise(procs, evals, work, deadline, results, out)
    except Exception as error:  # the guard's promise: results.json whatever happens
        results["errors"].append(f"main: {type(error).__name__}: {error}")
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        log(f"failed: {error!r}")
    collect(results, work, [*procs, "init", "init_qk"])
    results["out_problems"] = check_out_tree(out)
    results["wall_seconds"] = round(time.time() - start, 1)
    results["complete"] = not results["errors"] and not results["out_problems"]
    worker.write_json(out / "results.json", results)
    log(f"τ: {json.dumps(results['tau'])}")
    log(
        f"wrote {out / 'results.json'} ({'complete' if results['complete'] else 'INCOMPLETE'}) after "
        f"{results['wall_seconds']} s"
    )
    return 0 if results["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
