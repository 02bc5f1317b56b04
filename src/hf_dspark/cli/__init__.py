"""`hf-dspark`: a thin command line over the library. Run `hf-dspark <command> --help` for each command."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence

DEMO_PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " \
    "How many clips did Natalia sell altogether in April and May?"


def _load_drafter(target, path: str | None, block_size: int):
    """The trained drafter at `path`, the shipped default, or (saying so) an untrained one."""
    from . import DSparkConfig, DSparkDrafter, load_default_drafter

    if path is not None:
        return DSparkDrafter.from_pretrained(path, target=target), f"drafter {path}"
    try:
        return load_default_drafter(target), "the shipped default DSpark drafter"
    except FileNotFoundError:
        config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=2,
                                          markov_rank=64)
        drafter = DSparkDrafter(config).bind_target(target)
        return drafter, "an UNTRAINED drafter (no shipped default in this installation): expect ~1 token per round"


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from . import load_default_target
    from .eval.prompts import chat_input_ids

    torch.set_num_threads(args.threads)
    print(f"Loading the embedded SmolLM2-135M-Instruct target (fp32, {args.threads} thread(s))...", flush=True)
    target, tokenizer = load_default_target(dtype=torch.float32)
    drafter, what = _load_drafter(target, args.drafter, args.block_size)
    print(f"Drafting with {what}.")
    input_ids = chat_input_ids(tokenizer, [args.prompt])
    sampling = dict(do_sample=True, temperature=0.7, top_p=0.9) if args.sample else dict(do_sample=False)
    kwargs = dict(max_new_tokens=args.max_new_tokens, **sampling)
    target.generate(input_ids, max_new_tokens=4, do_sample=False)  # warm-up
    start = time.perf_counter()
    output = target.generate(input_ids, assistant_model=drafter, **kwargs)
    dspark_seconds = time.perf_counter() - start
    new_tokens = output.shape[1] - input_ids.shape[1]
    stats = drafter.last_generation_stats
    print("\n" + tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True).strip() + "\n")
    print(f"DSpark: {new_tokens} tokens in {dspark_seconds:.2f} s = {new_tokens / dspark_seconds:.1f} tokens/s; "
          f"accepted length τ = {stats.mean_accepted_length:.2f} tokens/round over {stats.rounds} rounds "
          f"(γ = {drafter.config.block_size}, {stats.draft_tokens_accepted}/{stats.draft_tokens_verified} drafts "
          "accepted)")
    if args.compare:
        start = time.perf_counter()
        plain = target.generate(input_ids, **kwargs)
        plain_seconds = time.perf_counter() - start
        plain_new = plain.shape[1] - input_ids.shape[1]
        same = "identical output" if torch.equal(plain, output) else "different samples (sampling)"
        print(f"plain generate: {plain_new / plain_seconds:.1f} tokens/s; DSpark speedup "
              f"{(new_tokens / dspark_seconds) / (plain_new / plain_seconds):.2f}x ({same})")
    return 0


def _load_baseline(target, path: str | None):
    """(drafter or None, description): the DFlash-style baseline at `path` or the shipped one, if any."""
    from . import DSparkDrafter, load_default_drafter

    if path is not None:
        return DSparkDrafter.from_pretrained(path, target=target), f"drafter {path}"
    try:
        return load_default_drafter(target, variant="dflash"), "the shipped DFlash-style baseline"
    except FileNotFoundError:
        return None, "nothing (no baseline ships in this installation; the method is skipped)"


def _serve_prompts(tokenizer, sets: list[str], per_set: int):
    from .eval.prompts import chat_input_ids, load_prompt_set

    prompts = []
    for path in sets:
        for item in load_prompt_set(path)[:per_set]:
            prompts.append(chat_input_ids(tokenizer, [item["turns"][0]])[0])
    return prompts


def cmd_bench_serve(args: argparse.Namespace) -> int:
    import torch

    from . import load_default_target
    from .eval.oracle import oracle_for
    from .eval.serve import ServeConfig, run_serve_benchmark

    config = ServeConfig(concurrency=args.concurrency, policies=args.policies, requests_per_level=args.requests,
                         max_new_tokens=args.max_new_tokens, arrival_rate=args.arrival_rate,
                         threshold=args.threshold, threads=args.threads, out=args.out)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=torch.float32)
    prompts = _serve_prompts(tokenizer, args.sets, args.prompts_per_set)
    random.Random(0).shuffle(prompts)  # mix the domains; request i serves prompts[i % n]
    if args.oracle:
        total = max(args.requests, *args.concurrency)
        references = [target.generate(p[None], do_sample=False, max_new_tokens=args.max_new_tokens,
                                      min_new_tokens=args.max_new_tokens)[0] for p in prompts]
        drafter = oracle_for(target, args.block_size, references[0][None], torch.ones(1, 1))
        drafter.reference = [references[i % len(references)] for i in range(total)]
        label = f"oracle drafter (γ={args.block_size})"
    else:
        drafter, label = _load_drafter(target, args.drafter, args.block_size)
    step_curve = None
    if "scheduler" in args.policies:
        from .profiling import load_or_profile_step_curve

        step_curve = load_or_profile_step_curve(target, threads=args.threads)
    print(f"serving with {label}")
    report = run_serve_benchmark(config, target, prompts, drafter, step_curve=step_curve, drafter_label=label)
    print(f"{'policy':10s} {'C':>3s} {'agg tok/s':>10s} {'user tok/s':>10s} {'mean ℓ':>7s}")
    for row in report["results"]:
        print(f"{row['policy']:10s} {row['concurrency']:3d} {row['aggregate_tokens_per_second']:10.2f} "
              f"{row['per_user_tokens_per_second']:10.2f} {row['mean_verify_len']:7.2f}")
    stem = args.out.rsplit(".", 1)[0]
    print(f"wrote {args.out}, {stem}_frontier.png, {stem}_budget.png")
    return 0


def cmd_bench_speed(args: argparse.Namespace) -> int:
    import torch

    from . import load_default_target
    from .eval.speed import SpeedConfig, run_speed_benchmark

    scheduler = None if args.scheduler == "none" else args.scheduler
    config = SpeedConfig(prompt_files=args.sets, num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                         repeats=args.repeats, block_sizes=args.block_sizes, threads=args.threads,
                         drafter=args.drafter, baseline=args.baseline, scheduler=scheduler, out=args.out)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=torch.float32)
    drafter = baseline = None
    if not args.no_drafter:
        drafter, what = _load_drafter(target, args.drafter, max(args.block_sizes, default=7))
        print(f"dspark method uses {what}")
        baseline, what = _load_baseline(target, args.baseline)
        print(f"dflash method uses {what}")
    report = run_speed_benchmark(config, target, tokenizer, drafter, baseline)
    for set_name, methods in report["results"].items():
        print(f"\n{set_name} (median tokens/s, median ratio to plain, τ):")
        for name, row in methods.items():
            tau = "" if row["mean_accepted_length"] is None else f"  τ={row['mean_accepted_length']:.2f}"
            print(f"  {name:16s} {row['median_tokens_per_second']:7.2f}  x{row['median_ratio_to_plain']:.2f}{tau}")
    print(f"\nwrote {args.out} and {args.out.rsplit('.', 1)[0]}.png")
    return 0


def _load_target(path: str | None, dtype_name: str = "float32", tokenizer: bool = True):
    """(model, tokenizer or None): a local/Hub causal LM at `path`, or the embedded default target when None."""
    import torch

    dtype = getattr(torch, dtype_name)
    if path is None:
        from . import load_default_target

        return load_default_target(dtype=dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(path) if tokenizer else None


def cmd_profile(args: argparse.Namespace) -> int:
    from .profiling import DEFAULT_BATCH_TOKENS, profile_step_curve, step_curve_path

    target, _ = _load_target(args.target, args.dtype, tokenizer=False)
    curve = profile_step_curve(target, batch_tokens=args.batch_tokens or DEFAULT_BATCH_TOKENS, rows=args.rows,
                               cache_length=args.cache_length, repeats=args.repeats, warmup=args.warmup,
                               threads=args.threads, statistic=args.statistic)
    out = args.out or str(step_curve_path(curve.model, curve.device, curve.dtype, curve.threads))
    curve.save(out)
    for b, sps in zip(curve.batch_tokens, curve.steps_per_second):
        print(f"  B={b:4d}  {1e3 / sps:8.1f} ms  {sps:7.2f} steps/s  {b * sps:8.1f} tokens/s")
    print(f"wrote {out}")
    if args.plot:
        curve.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    from . import DSparkDrafter
    from .eval.calibrate import CalibrationRun, run_calibration

    torch.set_num_threads(args.threads)
    target, tokenizer = _load_target(args.target, args.dtype)
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target)
    run = CalibrationRun(prompt_files=args.prompts, limit=args.limit, skip=args.skip, modes=args.mode,
                         max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                         temperature=args.temperature, out=args.out or args.drafter)
    reports = run_calibration(run, target, tokenizer, drafter)
    for mode, report in reports.items():
        print(f"{mode}: {report.n_samples} rounds; T = {[round(t, 3) for t in report.temperatures]}")
        print(f"  ECE before {[round(e, 4) for e in report.ece_before]}")
        print(f"  ECE after  {[round(e, 4) for e in report.ece_after]}")
    print(f"wrote the temperatures, calibration.json and reliability_*.png to {run.out}")
    return 0


def _add_scheduling_commands(sub) -> None:
    """`profile` (SPS(B) step curve) and `calibrate` (STS temperatures); see docs/README_scheduling.md."""
    profile = sub.add_parser("profile", help="measure SPS(B), the step curve the load-aware scheduler uses")
    profile.add_argument("--target", default=None, help="causal LM path (default: the embedded SmolLM2 target)")
    profile.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    profile.add_argument("--threads", type=int, default=1, help="torch threads pinned while profiling")
    profile.add_argument("--out", default=None, help="JSON path (default: the user cache that generate reads)")
    profile.add_argument("--plot", default=None, help="also write a PNG plot here")
    profile.add_argument("--batch-tokens", type=int, nargs="+", default=None, help="B values (default: 1-8, 12...128)")
    profile.add_argument("--rows", type=int, default=8, help="B tokens are spread over min(B, rows) rows")
    profile.add_argument("--cache-length", type=int, default=200, help="tokens already cached per row")
    profile.add_argument("--repeats", type=int, default=5, help="timed sweeps over all B (median per B)")
    profile.add_argument("--warmup", type=int, default=1, help="untimed sweeps before the timed ones")
    profile.add_argument("--statistic", choices=["median", "min"], default="median",
                         help="per-B summary of the timed forwards (min: uncontended cost on a shared machine)")
    profile.set_defaults(func=cmd_profile)

    calibrate = sub.add_parser("calibrate", help="fit STS temperatures of a drafter's confidence head")
    calibrate.add_argument("--drafter", required=True, help="trained drafter folder (updated in place by default)")
    calibrate.add_argument("--prompts", nargs="+", required=True, help="held-out JSONL prompt sets")
    calibrate.add_argument("--limit", type=int, default=32, help="prompts per set")
    calibrate.add_argument("--skip", type=int, default=0, help="skip the first N prompts of each set")
    calibrate.add_argument("--mode", choices=["greedy", "sampling", "both"], default="both")
    calibrate.add_argument("--max-new-tokens", type=int, default=128)
    calibrate.add_argument("--batch-size", type=int, default=8)
    calibrate.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the rollouts")
    calibrate.add_argument("--target", default=None, help="causal LM path (default: the embedded SmolLM2 target)")
    calibrate.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    calibrate.add_argument("--threads", type=int, default=1)
    calibrate.add_argument("--out", default=None, help="save the calibrated drafter here instead of in place")
    calibrate.set_defaults(func=cmd_calibrate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-dspark", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="generate an answer with DSpark on the embedded default target")
    demo.add_argument("--prompt", default=DEMO_PROMPT)
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--block-size", type=int, default=7, help="γ of the untrained fallback drafter")
    demo.add_argument("--drafter", default=None, help="path of a trained drafter (default: the shipped one)")
    demo.add_argument("--threads", type=int, default=2)
    demo.add_argument("--sample", action="store_true", help="sample (T=0.7, top-p 0.9) instead of greedy")
    demo.add_argument("--no-compare", dest="compare", action="store_false", help="skip the plain-generate run")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    speed = bench.add_parser(
        "speed", help="batch-1 tokens/s: plain, prompt lookup, baseline, DSpark (fixed / scheduler), oracle"
    )
    speed.add_argument("--sets", nargs="+", default=["data/eval/gsm8k.jsonl", "data/eval/mt-bench.jsonl"])
    speed.add_argument("--prompts", type=int, default=3)
    speed.add_argument("--max-new-tokens", type=int, default=96)
    speed.add_argument("--repeats", type=int, default=3)
    speed.add_argument("--block-sizes", type=int, nargs="*", default=[4, 8, 16],
                       help="γ of the oracle ceiling runs (none: skip the oracle)")
    speed.add_argument("--threads", type=int, default=1)
    speed.add_argument("--drafter", default=None, help="DSpark drafter (default: the shipped one)")
    speed.add_argument("--baseline", default=None, help="DFlash-style baseline (default: the shipped one)")
    speed.add_argument("--scheduler", default="lagged_padded",
                       help="policy of the extra dspark_<policy> run (a dspark_policy value; 'none' skips it)")
    speed.add_argument("--no-drafter", action="store_true", help="only plain, prompt lookup and the oracle")
    speed.add_argument("--out", default="benchmarks/results/speed.json")
    speed.set_defaults(func=cmd_bench_speed)
    serve = bench.add_parser("serve", help="serving load: continuous batching per verification policy")
    serve.add_argument("--sets", nargs="+", default=["data/eval/gsm8k.jsonl", "data/eval/humaneval.jsonl",
                                                      "data/eval/mt-bench.jsonl"])
    serve.add_argument("--prompts-per-set", type=int, default=8)
    serve.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    serve.add_argument("--policies", nargs="+", default=["none", "fixed1", "fixed", "threshold", "scheduler"])
    serve.add_argument("--requests", type=int, default=16, help="finished requests per (policy, C)")
    serve.add_argument("--max-new-tokens", type=int, default=48)
    serve.add_argument("--arrival-rate", type=float, default=None, help="Poisson arrivals/s instead of clients")
    serve.add_argument("--threshold", type=float, default=0.5)
    serve.add_argument("--block-size", type=int, default=7)
    serve.add_argument("--drafter", default=None)
    serve.add_argument("--oracle", action="store_true", help="serve with the oracle drafter (ceiling)")
    serve.add_argument("--threads", type=int, default=2)
    serve.add_argument("--out", default="benchmarks/results/serve.json")
    serve.set_defaults(func=cmd_bench_serve)

    _add_scheduling_commands(sub)

    from .eval.eval_cli import add_eval_command

    add_eval_command(sub)

    from .interop.cli import add_export_command

    add_export_command(sub)

    # Listed for --help; `main` hands their arguments to the library entry points untouched.
    sub.add_parser("prepare-data", help="regenerate training replies with the target (see prepare-data --help)")
    sub.add_parser("train", help="train a drafter with transformers.Trainer (see train --help)")
    return parser


# Commands whose arguments are parsed by the library entry point itself (HfArgumentParser and friends).
DELEGATED = {"prepare-data": ".training.regenerate", "train": ".training.train"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        entry = importlib.import_module(DELEGATED[argv[0]], __package__).main
        return int(entry(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
