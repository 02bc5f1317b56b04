"""Device check: DSpark on randomly initialised targets of real shape, on whatever device is at hand.

    python scripts/device_check.py                      # CUDA if present: Llama-3.2-1B and -3.1-8B shapes, bf16
    python scripts/device_check.py --tiny               # tiny shapes (automatic on a CPU): the CI dry run
    python scripts/device_check.py --out device_check.json

1. Greedy equality (first shape, fp32): `generate(assistant_model=drafter)` against plain greedy `generate` at
   `--equality-batches` (ragged, left-padded prompts), with the oracle drafter (every draft right) and an untrained
   DSpark drafter (drafts mostly wrong). A divergence is reported with the target's logit margin between the two
   tokens in the plain run: near zero is a floating-point tie, large is a bug (exit status 1 above `--tie-margin`).
2. SPS(B) of each shape (`hf_dspark.profiling.target_steps.profile_step_curve`),
   also handed to `auto` as its step curve.
3. The speed A/B (`scripts/device_ab.py`): plain eager, plain static cache + compile, transformers' batch-1
   assisted loop fed the same drafts, hf-dspark with the oracle, a noisy oracle (τ ≈ 3.5) under fixed and auto, an
   untrained drafter, and hf-dspark asked for static cache + compile; at `--batches`; per run tokens/s, ms per round
   split verify / draft, sync points per round, GPU-busy fraction (CUDA), greedy identity vs plain. A row whose
   static cache or compiling hf-dspark declines says "refused" with the reason.

A time guard (`--time-limit`, default 8.5 minutes) skips what would run past it and lists it under "skipped".
Random weights make greedy text meaningless but exercise every kernel at the real shapes; the oracle's proposals
come from plain `generate`, so its speed is the loop's ceiling on this device.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.generation import oracle_for
from hf_dspark.profiling.target_steps import profile_step_curve


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ab = sys.modules.get("device_ab") or _sibling("device_ab")
AB_SHAPES, METHODS = ab.AB_SHAPES, ab.METHODS
GPU_SHAPES = ["llama-3.2-1b", "llama-3.1-8b"]
STEP_CURVE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
TINY_STEP_CURVE_TOKENS = [1, 4, 16, 64]


@dataclass
class Prompts:
    """Left-padded prompts `[B, L]` and their attention mask."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def first(self, batch: int) -> Prompts:
        ids, mask = self.input_ids[:batch], self.attention_mask[:batch]
        keep = int(mask.any(dim=0).nonzero().min())  # drop columns that are padding in every kept row
        return Prompts(ids[:, keep:], mask[:, keep:])


def build_target(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised Llama-family target built directly on `device` in `dtype` (no CPU or fp32 copy)."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**AB_SHAPES[shape]))
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = model.config.pad_token_id
    return model.eval()


def ragged_prompts(batch: int, vocab: int, device: torch.device, seed: int = 0, lengths=(12, 48)) -> Prompts:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=gen).tolist()
    width = max(sizes)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, n in enumerate(sizes):
        ids[row, width - n :] = torch.randint(3, min(vocab, 32000), (n,), generator=gen)
        mask[row, width - n :] = 1
    return Prompts(ids.to(device), mask.to(device))


def plain_greedy(target, prompts: Prompts, new_tokens: int, scores: bool = False):
    return target.generate(
        prompts.input_ids,
        attention_mask=prompts.attention_mask,
        do_sample=False,
        max_new_tokens=new_tokens,
        return_dict_in_generate=scores,
        output_logits=scores,
    )


def untrained_drafter(target, block_size: int, seed: int = 1) -> DSparkDrafter:
    torch.manual_seed(seed)
    config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=1, markov_rank=64)
    with torch.device(target.device):
        drafter = DSparkDrafter(config)
    return drafter.to(target.dtype).eval().bind_target(target)


def first_divergence(reference, output: torch.Tensor, prompt_width: int) -> dict | None:
    """None when identical; else the first differing (row, step) and the plain run's logit margin there."""
    if output.shape == reference.sequences.shape and torch.equal(output, reference.sequences):
        return None
    width = min(output.shape[1], reference.sequences.shape[1])
    differs = output[:, :width] != reference.sequences[:, :width]
    rows_steps = differs.nonzero()
    if rows_steps.numel() == 0:
        return {"row": None, "step": width - prompt_width, "margin": None, "note": "different lengths"}
    step_of = rows_steps[:, 1]
    row, column = (int(v) for v in rows_steps[int(step_of.argmin())])
    step = column - prompt_width
    logits = reference.logits[step][row].float()
    plain_token, dspark_token = int(reference.sequences[row, column]), int(output[row, column])
    return {
        "row": row,
        "step": step,
        "plain_token": plain_token,
        "dspark_token": dspark_token,
        "margin": float(logits[plain_token] - logits[dspark_token]),
    }


def check_equality(target, prompts: Prompts, batches: list[int], new_tokens: int, block_size: int) -> list[dict]:
    """Greedy DSpark (oracle and untrained drafters) vs plain `generate`, per batch size."""
    results = []
    for batch in batches:
        part = prompts.first(batch)
        reference = plain_greedy(target, part, new_tokens, scores=True)
        drafters = {
            "oracle": oracle_for(target, block_size, reference.sequences, part.attention_mask),
            "untrained": untrained_drafter(target, block_size),
        }
        for name, drafter in drafters.items():
            output = target.generate(
                part.input_ids,
                attention_mask=part.attention_mask,
                assistant_model=drafter,
                do_sample=False,
                max_new_tokens=new_tokens,
                dspark_policy="fixed",
            )  # every round drafts and verifies γ tokens
            stats = drafter.last_generation_stats
            divergence = first_divergence(reference, output, part.input_ids.shape[1])
            results.append(
                {
                    "dtype": str(target.dtype).removeprefix("torch."),
                    "batch": batch,
                    "drafter": name,
                    "identical": divergence is None,
                    "divergence": divergence,
                    "tau": stats.mean_accepted_length,
                    "drafts_verified": stats.draft_tokens_verified,
                }
            )
            verdict = "identical" if divergence is None else f"DIFFERS {divergence}"
            print(
                f"  equality  {results[-1]['dtype']:8s} batch {batch}  {name:9s} {verdict}  "
                f"τ = {stats.mean_accepted_length:.2f}",
                flush=True,
            )
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    add = parser.add_argument
    add("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    add("--tiny", action="store_true", help="tiny shapes, fp32 (the CI dry run; automatic on a cpu)")
    add(
        "--shapes",
        nargs="+",
        choices=sorted(AB_SHAPES),
        default=None,
        help="target shapes (default: llama-3.2-1b llama-3.1-8b on an accelerator, tiny on a cpu or with --tiny)",
    )
    add(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="dtype of the A/B (default: bfloat16 on an accelerator, else float32)",
    )
    add("--new-tokens", type=int, default=64, help="tokens generated per row in every run (default 64)")
    add("--prompt-length", type=int, default=128, help="prompt tokens per row in the A/B (default 128)")
    add("--batches", type=int, nargs="+", default=[1, 8, 32], help="batch sizes of the A/B (default 1 8 32)")
    add("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="A/B methods (default: all)")
    add("--gamma", type=int, default=8, help="block size γ of every drafter (default 8)")
    add("--tau", type=float, default=3.5, help="the noisy oracle's mean tokens per round (default 3.5)")
    add("--repeats", type=int, default=3, help="timed runs per A/B row, median reported (default 3)")
    add(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile in the static-cache rows (default: on an accelerator only)",
    )
    add("--equality-batches", type=int, nargs="*", default=[1, 8], help="batches of the equality check ([]: skip)")
    add(
        "--tie-margin",
        type=float,
        default=1e-3,
        help="fp32 divergences with a plain-run logit margin above this fail the check",
    )
    add("--time-limit", type=float, default=510.0, help="seconds after which nothing new starts (default 510)")
    add("--threads", type=int, default=None, help="torch threads (default: 1 on a cpu, unchanged elsewhere)")
    add("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    for name in ("new_tokens", "prompt_length", "gamma", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if any(b < 1 for b in args.batches + args.equality_batches):
        parser.error("batch sizes must be positive")
    if not 1.0 < args.tau < args.gamma + 1:
        parser.error(f"--tau must lie in (1, γ + 1) = (1, {args.gamma + 1}), got {args.tau}")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    accelerated = args.device.type != "cpu"
    args.tiny = args.tiny or not accelerated
    args.shapes = args.shapes or (["tiny"] if args.tiny else GPU_SHAPES)
    args.dtype = args.dtype or ("bfloat16" if accelerated and not args.tiny else "float32")
    args.compile = accelerated if args.compile is None else args.compile
    args.threads = args.threads or (None if accelerated else 1)
    return args


def environment(args: argparse.Namespace) -> dict:
    name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else args.device.type
    return {
        "device": str(args.device),
        "device_name": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "shapes": args.shapes,
        "dtype": args.dtype,
        "new_tokens": args.new_tokens,
        "prompt_length": args.prompt_length,
        "gamma": args.gamma,
        "tau": args.tau,
        "compile": args.compile,
    }


class Guard:
    """Nothing new starts once the next step's estimated cost would end past the deadline."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.skipped: list[str] = []

    def allows(self, what: str, estimate: float = 0.0) -> bool:
        if time.monotonic() + estimate <= self.deadline:
            return True
        self.skipped.append(what)
        print(f"  skipped   {what} (time limit)", flush=True)
        return False


def ab_prompts(batch: int, length: int, vocab: int, device: torch.device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed + batch)
    ids = torch.randint(3, min(vocab, 32000), (batch, length), generator=gen).to(device)
    return ids, torch.ones_like(ids)


def run_ab(target, shape: str, args, curve, guard: Guard) -> list[dict]:
    """Every (batch, method) row of one shape, under the guard (a method's estimate: its cost at the last batch)."""
    rows, vocab, costs, last = [], target.config.vocab_size, {}, 0.0
    for batch in args.batches:
        if not guard.allows(f"{shape} batch {batch}", last):
            continue
        ids, mask = ab_prompts(batch, args.prompt_length, vocab, args.device)
        with torch.no_grad():
            reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.new_tokens)
        extra = {"auto": {"dspark_step_curve": curve}}
        setting = ab.Setting(target, ids, mask, reference, args.new_tokens, args.gamma, args.tau, args.compile, extra)
        done = []
        for method in args.methods:
            if batch > 1 and method in ab.BATCH_ONE_ONLY:
                continue
            if not guard.allows(f"{shape} batch {batch} {method}", costs.get(method, last)):
                continue
            started = time.monotonic()
            done.append({"shape": shape, **ab.measure_method(method, setting, args.repeats)})
            costs[method] = last = time.monotonic() - started
            print("  " + ab.row_line(done[-1]), flush=True)
        rows += with_ratios(done)
    return rows


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's tokens/s over plain eager (`speedup_vs_plain`), plain static + compile and the stock loop with
    the same drafts (noisy rows against `stock-noisy`, others against `stock-oracle`), where those ran."""
    speed = {r["method"]: r.get("tokens_per_second") for r in rows}
    for row in rows:
        if not row.get("tokens_per_second"):
            continue
        stock = "stock-noisy" if "noisy" in row["method"] else "stock-oracle"
        for key, base in (("plain", "plain"), ("static", "plain-static-compile"), ("stock", stock)):
            if speed.get(base):
                row[f"speedup_vs_{key}"] = row["tokens_per_second"] / speed[base]
    return rows


def check_shape(shape: str, first: bool, args, report: dict, guard: Guard) -> None:
    dtype = getattr(torch, args.dtype)
    equality = first and args.equality_batches
    target = build_target(shape, args.device, torch.float32 if equality else dtype)
    with torch.no_grad():
        if equality and guard.allows(f"{shape} equality"):
            prompts = ragged_prompts(max(args.equality_batches), target.config.vocab_size, args.device)
            report["equality"] += check_equality(
                target, prompts, args.equality_batches, min(args.new_tokens, 32), args.gamma
            )
        target = target.to(dtype)
    curve = None
    if guard.allows(f"{shape} step curve"):
        curve = profile_step_curve(
            target,
            batch_tokens=TINY_STEP_CURVE_TOKENS if args.tiny else STEP_CURVE_TOKENS,
            rows=8,
            cache_length=args.prompt_length,
            repeats=1,
            warmup=1,
            progress=False,
        )
        report["step_curves"][shape] = curve.to_dict()
    report["ab"] += run_ab(target, shape, args, curve, guard)
    del target
    gc.collect()
    if args.device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    guard = Guard(args.time_limit)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {"environment": environment(args), "equality": [], "step_curves": {}, "ab": [], "skipped": []}
    print(f"device check: {report['environment']}", flush=True)
    for index, shape in enumerate(args.shapes):
        if guard.allows(f"{shape} (every check)"):
            check_shape(shape, index == 0, args, report, guard)
    report["skipped"] = guard.skipped
    failures = [
        r
        for r in report["equality"]
        if r["dtype"] == "float32"
        and not r["identical"]
        and (r["divergence"]["margin"] is None or abs(r["divergence"]["margin"]) > args.tie_margin)
    ]
    failures += [
        f"{r['shape']} batch {r['batch']} {r['method']}: {r['error']}"
        for r in report["ab"]
        if "error" in r and "static-compile" not in r["method"]
    ]  # compiling may fail for other reasons
    report["passed"] = not failures
    print("\n" + ab.summary_table(report["ab"]))
    if guard.skipped:
        print(f"\nskipped (time limit): {', '.join(guard.skipped)}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        print(f"wrote {args.out}")
    print("PASSED" if report["passed"] else f"FAILED: {failures}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
