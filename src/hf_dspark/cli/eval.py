"""`hf-dspark eval`: the command-line front of `accepted_length.run_eval`."""

from __future__ import annotations

import argparse
import time

from .bench import RESULTS_HELP, default_out
from .loaders import (
    DEVICE_HELP,
    DRAFTER_SPEC_HELP,
    DTYPE_CHOICES,
    device_name,
    load_drafter_spec,
    load_target,
    positive_int,
)
from .prompt_sets import add_sets_arguments, resolve_sets
from .validation import check_drafter_spec

# The paper's six sets but AIME 2025, which is not shipped (resources/prompts/PROVENANCE.md): pass it as a file.
PAPER_SETS = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench"]


def parse_drafter_spec(spec: str) -> tuple[str, str]:
    """`NAME=SPEC` -> (name, spec); SPEC as `loaders.load_drafter_spec` takes it (`DRAFTER_SPEC_HELP`)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--drafters takes NAME=PATH, got {spec!r}")
    return name, path


def check_drafter_names(args: argparse.Namespace) -> None:
    """Refuse a NAME given twice (the second would silently replace the first) or the name --prompt-lookup uses."""
    from ..eval.accepted_length import PROMPT_LOOKUP

    names = [name for name, _ in args.drafters]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        args.parser.error(f"--drafters names must be unique; {', '.join(map(repr, repeated))} is given more than once")
    if PROMPT_LOOKUP in names:
        args.parser.error(
            f"--drafters name {PROMPT_LOOKUP!r} is reserved for --prompt-lookup; use that flag (it also "
            "sweeps γ) or rename that drafter"
        )


def check_no_reference_needed(parser: argparse.ArgumentParser, option: str, spec: str) -> None:
    """Refuse a proposer that drafts from reference continuations (the oracle): `eval` has none to give it."""
    from ..proposers import split_proposer_spec

    found = split_proposer_spec(spec)
    if found is not None and found[0].needs_reference:
        parser.error(
            f"{option}{spec}: the {found[0].name!r} proposer drafts from reference continuations, which eval does "
            "not compute; measure it with `hf-dspark bench speed` or `bench serve --oracle`"
        )


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from ..eval.accepted_length import EvalConfig, run_eval
    from ..eval.eval_report import format_table

    args.out = args.out or default_out("eval", args.device)
    check_drafter_names(args)
    args.sets = resolve_sets(args)
    for name, path in args.drafters:
        check_drafter_spec(args.parser, f"--drafters {name}=", path)
        check_no_reference_needed(args.parser, f"--drafters {name}=", path)
    config = EvalConfig(
        sets=args.sets,
        temperature=args.temperature,
        block_size=args.block_size,
        sweep_gammas=args.sweep,
        prompt_lookup=args.prompt_lookup,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        threads=args.threads,
        out=args.out,
        work_file=args.work_file,
        resume=not args.restart,
        overwrite=args.overwrite,
    )
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    target, tokenizer = load_target(args.target, args.dtype, device=args.device)
    drafters = {name: load_drafter_spec(target, path) for name, path in args.drafters}
    for name, drafter in drafters.items():
        print(f"{name}: {drafter.eval_source} (γ = {drafter.config.block_size}, head {drafter.config.head_type})")
    report = run_eval(config, target, tokenizer, drafters)
    mode = "greedy (T=0)" if config.greedy else f"sampling (T={config.temperature:g}, top-k/top-p off)"
    print(f"\naccepted length τ (tokens per round, bonus included), {mode}, fixed ℓ:")
    print(format_table(report))
    for name, gammas in report["length_sweep"]["skipped"].items():
        print(f"γ sweep: {name} proposes fewer than γ = {gammas} positions; skipped there")
    print(f"\nwrote {args.out} and {len(report['figures'])} figures in {time.perf_counter() - start:.0f} s")
    return 0


def add_eval_command(sub) -> None:
    """Register `eval` on the top-level subparsers."""
    from ..proposers import proposers_help

    ev = sub.add_parser("eval", help="offline accepted length τ per set and drafter, with its figures")
    ev.add_argument(
        "--drafters",
        nargs="*",
        type=parse_drafter_spec,
        default=[],
        metavar="NAME=SPEC",
        help=f"drafters side by side; SPEC: {DRAFTER_SPEC_HELP} (registered: {proposers_help()})",
    )
    ev.add_argument("--prompt-lookup", action="store_true", help="add prompt lookup as a drafter")
    add_sets_arguments(ev, PAPER_SETS, "played turn by turn; default: the paper's sets but AIME 2025 (not shipped)")
    ev.add_argument("--temperature", type=float, default=1.0, help="1.0 samples (top-k/p off); 0 is greedy")
    ev.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="ℓ = γ for the main table (default: each drafter's own block size)",
    )
    ev.add_argument("--sweep", type=int, nargs="*", default=[4, 8, 12, 16], help="γ of the proposal-length sweep")
    ev.add_argument("--limit", type=positive_int, default=None, help="prompts per set, >= 1 (default: all)")
    ev.add_argument("--max-new-tokens", type=int, default=256, help="tokens per turn")
    ev.add_argument("--batch-size", type=int, default=4, help="prompts per generate call")
    ev.add_argument("--seed", type=int, default=0, help="base seed of the sampling runs")
    ev.add_argument("--threads", type=int, default=2, help="torch threads, pinned")
    ev.add_argument("--target", default=None, help="causal LM path (default: the embedded SmolLM2 target)")
    ev.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES, help="dtype the target is loaded in")
    ev.add_argument("--device", type=device_name, default="auto", help=DEVICE_HELP)
    ev.add_argument(
        "--out",
        default=None,
        help=f"JSON report, figures <stem>_*.png beside it (default: {RESULTS_HELP.format(name='eval')})",
    )
    ev.add_argument(
        "--work-file",
        default=None,
        help="resumable record of every finished prompt (default: <stem>-<digest>.work.jsonl under "
        "eval/ in the user cache, $HF_DSPARK_CACHE or ~/.cache/hf_dspark)",
    )
    ev.add_argument("--restart", action="store_true", help="discard the work file instead of resuming")
    ev.add_argument("--overwrite", action="store_true", help="replace an existing --out that is not an eval report")
    ev.set_defaults(func=cmd_eval, parser=ev)
