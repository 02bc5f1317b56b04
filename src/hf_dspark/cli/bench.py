"""`hf-dspark bench speed` (batch-1 tokens/s per method) and `hf-dspark bench serve` (serving load)."""

from __future__ import annotations

import argparse
import random

from ..eval.speed import DEFAULT_SPEED_METHODS, SPEED_METHOD_CHOICES
from .loaders import (
    DRAFTER_SPEC_HELP,
    add_runtime_arguments,
    load_baseline,
    load_drafter,
    load_drafter_spec,
    load_target,
    positive_float,
    positive_int,
    probability,
)
from .prompt_sets import add_sets_arguments, resolve_sets
from .validation import check_drafter_path, check_drafter_spec, check_output_parent

SPEED_SETS = ["gsm8k", "mt-bench"]
SERVE_SETS = ["gsm8k", "humaneval", "mt-bench"]


RESULTS_HELP = "benchmarks/results/<processor kind>/{name}.json, the kind of --device's processor"


def default_out(name: str, device: str) -> str:
    """`benchmarks/results/<processor kind>/<name>.json`: where a result measured on `device` ("auto" resolved) is
    filed, under the kind `hf_dspark.provenance.processor_kind` names (the folders of every other result)."""
    from ..provenance import processor_kind
    from .loaders import resolve_device

    return f"benchmarks/results/{processor_kind(resolve_device(device))}/{name}.json"


def tree_budget(text: str) -> int:
    """argparse type of --tree-budget: an int >= 2 (the anchor and at least one draft)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"a tree needs >= 2 nodes (the anchor and a draft), got {text!r}")
    return value


def _dtype(args: argparse.Namespace) -> str:
    from ..hardware import resolve_dtype

    return resolve_dtype(args.dtype, args.device)


def cmd_bench_speed(args: argparse.Namespace) -> int:
    import torch

    from ..eval.speed import SpeedConfig, run_speed_benchmark

    args.out = args.out or default_out("speed", args.device)
    args.sets = resolve_sets(args)
    check_drafter_path(args.parser, "--drafter", args.drafter)
    check_drafter_path(args.parser, "--baseline", args.baseline)
    check_output_parent(args.parser, "--out", args.out)
    from ..scheduling import NO_SPECULATION, available_policies, canonical_policy_name

    scheduler = canonical_policy_name(args.scheduler)
    if scheduler not in (*available_policies(), NO_SPECULATION):
        choices = [*available_policies(), NO_SPECULATION]
        args.parser.error(f"--scheduler {args.scheduler!r} is not a dspark_policy; choose one of {choices}")
    scheduler = None if scheduler == NO_SPECULATION else scheduler
    try:
        config = SpeedConfig(
            prompt_files=args.sets,
            num_prompts=args.prompts,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            block_sizes=args.block_sizes,
            threads=args.threads,
            drafter=args.drafter,
            baseline=args.baseline,
            scheduler=scheduler,
            out=args.out,
            overwrite=args.overwrite,
            unpacked=args.unpacked,
            methods=args.methods,
            tree_budget=args.tree_budget,
        )
    except ValueError as error:
        args.parser.error(str(error))
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(None, _dtype(args), device=args.device)
    drafter = baseline = None
    if not args.no_drafter:
        drafter, what = load_drafter(target, args.drafter, max(args.block_sizes, default=7))
        print(f"dspark method uses {what}")
        baseline, what = load_baseline(target, args.baseline)
        print(f"dflash method uses {what}")
    report = run_speed_benchmark(config, target, tokenizer, drafter, baseline)
    _print_speed(report)
    print(f"\nwrote {args.out} and {args.out.rsplit('.', 1)[0]}.png")
    return 0


def _print_speed(report: dict) -> None:
    """Per set and method: median tokens/s, median paired ratio to plain [interquartile range], τ, identity."""
    for set_name, methods in report["results"].items():
        print(f"\n{set_name} (median tokens/s, median ratio to plain [IQR], τ):")
        for name, row in methods.items():
            tau = "" if row["mean_accepted_length"] is None else f"  τ={row['mean_accepted_length']:.2f}"
            low, high = row.get("ratio_interquartile_range", (row["median_ratio_to_plain"],) * 2)
            same = "" if row["all_outputs_identical_to_plain"] else "  OUTPUT DIFFERS FROM PLAIN"
            nodes = f"  nodes={row['mean_tree_nodes']:.1f}" if "mean_tree_nodes" in row else ""
            print(
                f"  {name:20s} {row['median_tokens_per_second']:7.2f}  x{row['median_ratio_to_plain']:.2f} "
                f"[{low:.2f}, {high:.2f}]{tau}{nodes}{same}"
            )
    if report.get("macro"):
        print("\nmacro (mean over sets of the median ratios to plain):")
        for name, row in report["macro"].items():
            print(f"  {name:20s} x{row['mean_of_median_ratios_to_plain']:.2f}")


def _serve_user_turns(parser: argparse.ArgumentParser, sets: list[str], per_set: int) -> list[str]:
    """First user turn of the first `per_set` prompts of each set (read before the target is loaded)."""
    from ..eval.prompts import load_prompt_set

    turns = []
    for path in sets:
        try:
            items = load_prompt_set(path)[:per_set]
        except ValueError as error:
            parser.error(f"--sets: {error}")
        turns.extend(item["turns"][0] for item in items)
    return turns


def cmd_bench_serve(args: argparse.Namespace) -> int:
    import torch

    from ..eval.prompts import chat_input_ids
    from ..eval.serve import ServeConfig, run_serve_benchmark
    from ..proposers import build_proposer, get_proposer

    args.out = args.out or default_out("serve", args.device)
    args.sets = resolve_sets(args)
    check_drafter_spec(args.parser, "--drafter", args.drafter)
    check_output_parent(args.parser, "--out", args.out)
    if args.hybrid and args.oracle:
        args.parser.error(
            "--hybrid and --oracle exclude each other: the hybrid drafts with a DSpark drafter "
            "(--drafter or the shipped one); drop one of them"
        )
    try:
        config = ServeConfig(
            concurrency=args.concurrency,
            policies=args.policies,
            requests_per_level=args.requests,
            max_new_tokens=args.max_new_tokens,
            arrival_rate=args.arrival_rate,
            threshold=args.threshold,
            threads=args.threads,
            repeats=args.repeats,
            out=args.out,
            overwrite=args.overwrite,
            tree_budget=args.tree_budget,
        )
    except ValueError as error:
        args.parser.error(str(error))
    user_turns = _serve_user_turns(args.parser, args.sets, args.prompts_per_set)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(None, _dtype(args), device=args.device)
    prompts = [chat_input_ids(tokenizer, [turn])[0] for turn in user_turns]
    random.Random(0).shuffle(prompts)  # mix the domains; request i serves prompts[i % n]
    if args.oracle:
        total = max(args.requests, *args.concurrency)
        references = [
            target.generate(
                p[None].to(target.device),
                do_sample=False,
                max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.max_new_tokens,
            )[0]
            for p in prompts
        ]
        drafter = build_proposer(target, f"oracle:{args.block_size}", load_drafter_spec)
        drafter.reference = [references[i % len(references)] for i in range(total)]
        label = f"oracle drafter (γ={args.block_size})"
    elif args.drafter is not None:
        drafter, label = load_drafter_spec(target, args.drafter), f"drafter {args.drafter}"
    else:
        drafter, label = load_drafter(target, None, args.block_size)
    if args.hybrid:
        drafter, label = get_proposer("hybrid").factory(drafter), f"the hybrid of {label} and prompt lookup"
    print(f"serving with {label}")
    report = run_serve_benchmark(config, target, prompts, drafter, drafter_label=label)  # curves looked up there
    print(f"{'policy':10s} {'C':>3s} {'agg tok/s':>10s} {'user tok/s':>10s} {'mean ℓ':>7s}")
    for row in report["results"]:
        print(
            f"{row['policy']:10s} {row['concurrency']:3d} {row['aggregate_tokens_per_second']:10.2f} "
            f"{row['per_user_tokens_per_second']:10.2f} {row['mean_verify_len']:7.2f}"
            + (f"  tree nodes {row['mean_tree_nodes']:.2f}" if "mean_tree_nodes" in row else "")
        )
    print()
    print("\n".join(ratio_table(report["ratios_to_plain"])))
    print(auto_verdict(report["ratios_to_plain"]))
    stem = args.out.rsplit(".", 1)[0]
    print(f"wrote {args.out}, {stem}_frontier.png, {stem}_budget.png")
    return 0


# The project's goal for the "auto" policy: at least this fraction of plain batched decoding's throughput at every C.
AUTO_GOAL = 0.95


def _by_load(ratios: dict) -> dict[int, float]:
    """A policy's ratios keyed by C as ints (a report read back from JSON has string keys)."""
    return {int(c): float(r) for c, r in ratios.items()}


def ratio_table(ratios_to_plain: dict[str, dict]) -> list[str]:
    """Lines of a table of each policy's aggregate tokens/s over plain's (`none`) at each load C; `-` where a
    policy has no ratio at that C. `ratios_to_plain`: policy -> {C: ratio}, as `bench serve`'s report holds it."""
    rows = {policy: _by_load(ratios) for policy, ratios in ratios_to_plain.items()}
    loads = sorted({c for by_load in rows.values() for c in by_load})
    if not loads:
        return ["ratio to plain: not measured (needs the 'none' policy beside the others)"]
    lines = ["ratio to plain (aggregate tokens/s over 'none', median over passes):"]
    lines.append(f"{'policy':14s}" + "".join(f"{f'C={c}':>8s}" for c in loads))
    for policy, by_load in rows.items():
        cells = "".join(f"{by_load[c]:8.2f}" if c in by_load else f"{'-':>8s}" for c in loads)
        lines.append(f"{policy:14s}{cells}")
    return lines


def auto_verdict(ratios_to_plain: dict[str, dict], goal: float = AUTO_GOAL) -> str:
    """Whether `auto` reaches `goal`× plain's aggregate tokens/s at every measured C, naming the loads it misses."""
    by_load = _by_load(ratios_to_plain.get("auto", {}))
    if not by_load:
        return f"auto >= {goal:.2f}x plain at every C: not measured (needs the policies 'none' and 'auto')"
    misses = [f"{ratio:.3f}x at C={c}" for c, ratio in sorted(by_load.items()) if ratio < goal]
    if misses:
        return f"auto >= {goal:.2f}x plain at every C: no ({', '.join(misses)})"
    lowest = min(by_load, key=by_load.get)
    return f"auto >= {goal:.2f}x plain at every C: yes (lowest {by_load[lowest]:.3f}x at C={lowest})"


def _add_speed_command(bench) -> None:
    speed = bench.add_parser(
        "speed",
        help="batch-1 tokens/s: plain, prompt lookup, baseline, DSpark, the hybrid, oracle",
        description="Batch-1 tokens/s of plain decoding, transformers' prompt lookup, the DFlash-style baseline, "
        "DSpark at ℓ = γ, with a scheduler policy and with auto, the hybrid drafter (DSpark or prompt lookup per "
        "row and round) at ℓ = γ and with auto, and the oracle drafter, on the embedded default target; every "
        "method timed interleaved with plain, its output checked against plain greedy's.",
    )
    add_sets_arguments(speed, SPEED_SETS, "the first user turn of the first --prompts items of each")
    speed.add_argument("--prompts", type=positive_int, default=3, help="prompts per set")
    speed.add_argument("--max-new-tokens", type=positive_int, default=96, help="tokens generated per prompt")
    speed.add_argument("--repeats", type=positive_int, default=3, help="timed runs per prompt and method (median)")
    speed.add_argument(
        "--block-sizes",
        type=positive_int,
        nargs="*",
        default=[4, 8, 16],
        help="γ of the oracle ceiling runs (none: skip the oracle)",
    )
    add_runtime_arguments(speed, threads=1)
    speed.add_argument("--drafter", default=None, help="DSpark drafter folder (default: the shipped one)")
    speed.add_argument("--baseline", default=None, help="DFlash-style baseline folder (default: the shipped one)")
    speed.add_argument(
        "--scheduler",
        default="lagged_padded",
        help="policy of the extra dspark_<policy> run (a dspark_policy value; 'none' skips it)",
    )
    speed.add_argument(
        "--methods",
        nargs="+",
        choices=SPEED_METHOD_CHOICES,
        default=list(DEFAULT_SPEED_METHODS),
        metavar="METHOD",
        help="what runs beside plain generate, each timed interleaved with it: prompt_lookup "
        "(transformers' prompt_lookup_num_tokens), lookup (this package's prompt lookup in the DSpark "
        "loop), dflash, dspark (ℓ = γ), scheduler (dspark_<--scheduler>), dspark_auto, hybrid (DSpark "
        "or prompt lookup per row and round, ℓ = γ), hybrid_auto, dspark_tree / hybrid_tree (draft trees of "
        "--tree-budget nodes; with auto also *_tree_auto, auto sizing them), oracle (default: "
        f"{' '.join(DEFAULT_SPEED_METHODS)})",
    )
    speed.add_argument(
        "--tree-budget",
        type=tree_budget,
        default=16,
        help="nodes a round (the anchor included, >= 2) of the dspark_tree / hybrid_tree methods",
    )
    speed.add_argument("--no-drafter", action="store_true", help="only plain, prompt lookup and the oracle")
    speed.add_argument(
        "--unpacked",
        action="store_true",
        help="also run DSpark (fixed and auto) with dspark_packed_weights=False, to see what verifying "
        "on packed weights gives (float32 CPU targets)",
    )
    speed.add_argument(
        "--out", default=None, help=f"JSON report, a PNG beside it (default: {RESULTS_HELP.format(name='speed')})"
    )
    speed.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out that is not a bench speed report (an earlier speed report is "
        "replaced without it)",
    )
    speed.set_defaults(func=cmd_bench_speed, parser=speed)


def _add_serve_command(bench) -> None:
    serve = bench.add_parser(
        "serve",
        help="serving load: continuous batching per verification policy",
        description="Continuous-batching serving benchmark on the embedded default target: aggregate and per-user "
        "tokens/s per verification policy and load level.",
    )
    add_sets_arguments(serve, SERVE_SETS, "the first user turn of the first --prompts-per-set items of each")
    serve.add_argument("--prompts-per-set", type=positive_int, default=8, help="prompts taken from each set")
    serve.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=[1, 2, 4, 8, 16, 32],
        help="client counts C (closed loop) to measure",
    )
    serve.add_argument(
        "--policies",
        nargs="+",
        default=["none", "fixed1", "fixed", "threshold", "lagged_padded", "auto"],
        help="none (plain batched decoding) | fixed1 (ℓ = 1) | fixed (ℓ = γ) | threshold | "
        "lagged_padded (lagged-capacity rule on the profiled step curve; 'scheduler' is its "
        "deprecated name) | auto (cost-aware default: "
        "decodes plainly when drafting does not pay)",
    )
    serve.add_argument("--requests", type=positive_int, default=16, help="finished requests per (policy, C)")
    serve.add_argument("--max-new-tokens", type=positive_int, default=48, help="tokens per request")
    serve.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="interleaved passes over the policies at each C, each serving --requests requests per policy; a "
        "result is the median over passes and its ratio to plain the median of the per-pass ratios",
    )
    serve.add_argument(
        "--arrival-rate",
        type=positive_float,
        default=None,
        help="Poisson arrivals per second instead of closed-loop clients",
    )
    serve.add_argument(
        "--threshold", type=probability, default=None, help="threshold of the threshold policy (default: its own)"
    )
    serve.add_argument("--block-size", type=positive_int, default=7, help="γ of the oracle drafter")
    serve.add_argument(
        "--drafter", default=None, help=f"the drafter: {DRAFTER_SPEC_HELP} (default: the shipped DSpark drafter)"
    )
    serve.add_argument("--oracle", action="store_true", help="serve with the oracle drafter (ceiling)")
    serve.add_argument(
        "--hybrid",
        action="store_true",
        help="serve with the hybrid drafter: per request and round, the DSpark drafter (--drafter or "
        "the shipped one) or prompt lookup over the request's context, chosen from lagged acceptance "
        "(lossless); auto prices lookup rounds as free",
    )
    serve.add_argument(
        "--tree-budget",
        type=tree_budget,
        default=None,
        help="draft trees of at most this many nodes a round (the anchor included, >= 2) for every drafting "
        "policy: auto sizes them by cost, the others verify them whole (default: chains)",
    )
    add_runtime_arguments(serve, threads=2)
    serve.add_argument(
        "--out", default=None, help=f"JSON report, PNGs beside it (default: {RESULTS_HELP.format(name='serve')})"
    )
    serve.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out that is not a bench serve report (an earlier serve report is "
        "replaced without it)",
    )
    serve.set_defaults(func=cmd_bench_serve, parser=serve)


def add_bench_command(sub) -> None:
    """Register `bench speed` and `bench serve` on the top-level subparsers."""
    bench = sub.add_parser(
        "bench",
        help="benchmarks: batch-1 speed and serving load",
        description="Benchmarks on the embedded default target.",
    )
    commands = bench.add_subparsers(dest="bench", required=True, metavar="{speed,serve}")
    _add_speed_command(commands)
    _add_serve_command(commands)
