"""`hf-dspark profile` (the SPS(B) step curve) and `hf-dspark calibrate` (STS temperatures); docs/scheduling.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from .loaders import add_runtime_arguments, load_drafter_spec, load_target, positive_int
from .prompt_sets import add_sets_arguments, resolve_sets
from .validation import check_drafter_path, check_drafter_spec, check_output_parent


def cmd_profile(args: argparse.Namespace) -> int:
    from ..profiling.draft_steps import DEFAULT_DRAFT_ROWS, draft_curve_path, profile_draft_curve
    from ..profiling.target_steps import DEFAULT_BATCH_TOKENS, profile_step_curve, step_curve_key, step_curve_path
    from ..target.packed_linear import PACKED_WEIGHTS_CHOICES, linear_packs_for

    check_drafter_spec(args.parser, "--drafter", args.drafter)
    _check_profile_outputs(args)
    target, _ = load_target(args.target, args.dtype, tokenizer=False, device=args.device)
    timing = dict(repeats=args.repeats, warmup=args.warmup, threads=args.threads, statistic=args.statistic)
    if args.drafter is None:
        try:
            packs = linear_packs_for(target, PACKED_WEIGHTS_CHOICES[args.packed_weights])
        except ValueError as error:
            args.parser.error(f"--packed-weights on: {error}")
        curve = profile_step_curve(target, batch_tokens=args.batch_tokens or DEFAULT_BATCH_TOKENS, rows=args.rows,
                                   cache_length=args.cache_length, packs=packs, **timing)
        out = args.out or str(step_curve_path(*step_curve_key(target, curve.threads, packs)))
        unit = "B", "steps/s"
    else:
        drafter = load_drafter_spec(target, args.drafter)
        curve = profile_draft_curve(drafter, rows=args.batch_tokens or DEFAULT_DRAFT_ROWS,
                                    context=args.cache_length, **timing)
        out = args.out or str(draft_curve_path(curve.model, curve.device, curve.dtype, curve.threads))
        unit = "R", "proposals/s"
    curve.save(out)
    for x, per_second in zip(curve.batch_tokens, curve.steps_per_second):
        print(f"  {unit[0]}={x:4d}  {1e3 / per_second:8.1f} ms  {per_second:7.2f} {unit[1]}  {x * per_second:8.1f} "
              f"{'tokens' if unit[0] == 'B' else 'rows'}/s")
    print(f"wrote {out}")
    if args.plot:
        curve.plot(args.plot, drafter=args.drafter is not None)
        print(f"wrote {args.plot if Path(args.plot).suffix else args.plot + '.png'}")
    return 0


def _check_profile_outputs(args: argparse.Namespace) -> None:
    """--out and --plot are checked before the target loads: folders exist, neither is a folder, and --out replaces
    only a curve saved earlier unless --overwrite is given."""
    from ..io_utils import check_replaceable

    for option, path in (("--out", args.out), ("--plot", args.plot)):
        if path:
            check_output_parent(args.parser, option, path)
    if args.out:
        try:
            check_replaceable(args.out, ("batch_tokens", "steps_per_second"), "a curve saved by hf-dspark profile",
                              args.overwrite)
        except ValueError as error:
            args.parser.error(str(error))


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from ..drafter import DSparkDrafter
    from ..eval.calibrate import CalibrationRun, check_calibration_out, is_same_folder, run_calibration

    args.prompts = resolve_sets(args)
    check_drafter_path(args.parser, "--drafter", args.drafter)
    out = Path(args.out or args.drafter)
    check_calibration_out(out, is_same_folder(args.drafter, out), args.drafter, args.overwrite)  # before any load
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, args.dtype, device=args.device)
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target)
    run = CalibrationRun(prompt_files=args.prompts, limit=args.limit, skip=args.skip, modes=args.mode,
                         max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                         temperature=args.temperature, out=args.out or args.drafter, overwrite=args.overwrite)
    reports = run_calibration(run, target, tokenizer, drafter)
    for mode, report in reports.items():
        print(f"{mode}: {report.n_samples} rounds; T = {[round(t, 3) for t in report.temperatures]}")
        print(f"  ECE before {[round(e, 4) for e in report.ece_before]}")
        print(f"  ECE after  {[round(e, 4) for e in report.ece_after]}")
        print(f"  acceptance {[round(q, 3) for q in report.acceptance]} (conditional, per position)")
    print(f"wrote the temperatures, the held-out acceptance, calibration.json and reliability_*.png to {run.out}")
    return 0


def add_profile_command(sub) -> None:
    """Register `profile` on the top-level subparsers."""
    profile = sub.add_parser("profile", help="measure SPS(B), the step curve the load-aware scheduler uses",
                             description="Time one verification forward of the target per batch-token count B and "
                             "save the step curve SPS(B) that the load-aware scheduler reads; with --drafter, time "
                             "the drafter's round (context update, then propose) per row count R instead (the cost "
                             "curve the auto policy reads).")
    profile.add_argument("--target", default=None, help="causal LM path (default: the embedded SmolLM2 target)")
    profile.add_argument("--drafter", default=None,
                         help="profile this drafter's cost curve instead: a drafter folder (any layout) or "
                         "untrained[:γ]; drafters of one architecture share the curve (saved per architecture)")
    add_runtime_arguments(profile, threads=1, auto_dtype=False)
    profile.add_argument("--out", default=None, help="JSON path (default: the user cache that generate reads)")
    profile.add_argument("--plot", default=None, help="also write a PNG plot here (matplotlib adds .png to a name "
                         "without an extension)")
    profile.add_argument("--overwrite", action="store_true",
                         help="let --out replace an existing file that is not a curve saved by hf-dspark profile")
    profile.add_argument("--batch-tokens", type=positive_int, nargs="+", default=None,
                         help="B values (default: 1-8, 12 ... 128); with --drafter, row counts R (default: 1-4, 6, "
                         "8 ... 64)")
    profile.add_argument("--rows", type=positive_int, default=8, help="B tokens are spread over min(B, rows) rows")
    profile.add_argument("--cache-length", type=positive_int, default=200,
                         help="tokens already cached per row (the target's KV cache, or the drafter's context)")
    profile.add_argument("--repeats", type=positive_int, default=5, help="timed sweeps over all B (median per B)")
    profile.add_argument("--warmup", type=int, default=1, help="untimed sweeps before the timed ones")
    profile.add_argument("--statistic", choices=["median", "min"], default="median",
                         help="per-B summary of the timed forwards (min: uncontended cost on a shared machine)")
    profile.add_argument("--packed-weights", choices=["auto", "on", "off"], default="auto",
                         help="time verification on oneDNN-packed linear weights, as generate's "
                         "dspark_packed_weights does (auto: packed for float32 CPU targets when the copies fit in "
                         "memory; the curve is saved under the dtype '<dtype>-onednn')")
    profile.set_defaults(func=cmd_profile, parser=profile)


def add_calibrate_command(sub) -> None:
    """Register `calibrate` on the top-level subparsers."""
    calibrate = sub.add_parser("calibrate", help="fit STS temperatures of a drafter's confidence head",
                               description="Roll out held-out prompts with DSpark, then fit the sequential "
                               "temperature scaling (STS) of the drafter's confidence head per position and store "
                               "the measured acceptance per position (the 'auto' policy's starting estimate).")
    calibrate.add_argument("--drafter", required=True, help="trained drafter folder (updated in place by default)")
    add_sets_arguments(calibrate, ["calibration-gsm8k"], "held-out prompts (first user turn)", option="--prompts")
    calibrate.add_argument("--limit", type=positive_int, default=32, help="prompts per set")
    calibrate.add_argument("--skip", type=int, default=0, help="skip the first N prompts of each set")
    calibrate.add_argument("--mode", choices=["greedy", "sampling", "both"], default="both",
                           help="decoding mode(s) of the rollouts; each gets its own temperatures")
    calibrate.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens per rollout")
    calibrate.add_argument("--batch-size", type=positive_int, default=8, help="prompts per generate call")
    calibrate.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the rollouts")
    calibrate.add_argument("--target", default=None, help="causal LM path (default: the embedded SmolLM2 target)")
    add_runtime_arguments(calibrate, threads=1, auto_dtype=False)
    calibrate.add_argument("--out", default=None, help="save the calibrated drafter here instead of in place")
    calibrate.add_argument("--overwrite", action="store_true",
                           help="let --out replace another trained drafter it holds (refused by default)")
    calibrate.set_defaults(func=cmd_calibrate, parser=calibrate)
