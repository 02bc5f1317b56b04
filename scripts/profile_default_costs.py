"""Profile and ship the cost curves of the embedded default: the target's SPS(B) and the shipped drafter's proposals
per second against rows R, in fp32 and bf16 (CPU, torch threads pinned), into this kind of processor's folder of
`src/hf_dspark/resources/step_curves/` (e.g. `x86_64--AVX2/`, where `load_or_profile_step_curve` /
`load_or_profile_draft_curve` look after the user cache), with a JSON summary of the batch-1 ratios and a plot of each
step curve beside it (`<summary stem>_step_curve_<dtype>.png`) under `benchmarks/results/`.

    python scripts/profile_default_costs.py --threads 1 --dtypes float32 bfloat16 --statistic min [--overwrite]
    python scripts/profile_default_costs.py --threads 2 --dtypes float32 --summary benchmarks/results/avx2_t2.json
    python scripts/profile_default_costs.py --variant dflash --skip-step-curve float32 bfloat16 \
        --summary benchmarks/results/cost_curves_dflash.json    # the baseline's curves (head none), step curves kept

The step curve is measured as `generate` verifies: on oneDNN-packed linear weights where it packs them (float32 on
CPU, `--packed-weights auto`), filed under the dtype "float32-onednn".
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path

import torch

from hf_dspark import load_default_drafter, load_default_target
from hf_dspark.hardware import processor_signature
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.profiling.draft_steps import draft_curve_path, drafter_architecture, profile_draft_curve
from hf_dspark.profiling.target_steps import profile_step_curve, shipped_step_curve_path, step_curve_key
from hf_dspark.target.packed_linear import PACKED_WEIGHTS_CHOICES, linear_packs_for

ROOT = Path(__file__).resolve().parents[1]


def _ms(curve, x: int) -> float:
    return 1e3 / float(curve.steps_per_second_at(x))


def nondecreasing_costs(curve):
    """The curve with each point's cost raised to the largest cost at fewer rows: proposing for more rows never
    costs less, and a minimum over a few sweeps can dip at one R by a few percent of noise."""
    costs = itertools.accumulate((1.0 / sps for sps in curve.steps_per_second), max)
    return dataclasses.replace(curve, steps_per_second=[1.0 / cost for cost in costs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads, pinned (part of the shipped curves' names)")
    parser.add_argument("--variant", choices=["dspark", "dflash"], default="dspark",
                        help="which shipped drafter's cost curve to profile (dflash: the baseline, no Markov head)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="dtypes to profile")
    parser.add_argument("--repeats", type=int, default=7, help="timed sweeps per curve, after one untimed sweep")
    parser.add_argument("--statistic", choices=["median", "min"], default="min",
                        help="per point: min estimates the uncontended cost on a shared machine (default)")
    parser.add_argument("--skip-step-curve", nargs="*", default=[], help="dtypes whose shipped SPS(B) is kept")
    parser.add_argument("--overwrite", action="store_true", help="replace shipped curves that exist")
    parser.add_argument("--packed-weights", choices=sorted(PACKED_WEIGHTS_CHOICES), default="auto",
                        help="verify on oneDNN-packed linear weights as generate does (auto: float32 CPU targets)")
    parser.add_argument("--summary", default="benchmarks/results/cost_curves.json",
                        help="JSON summary path, relative to the repository root")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    summary = {"threads": args.threads, "variant": args.variant, "processor": processor_signature("cpu"), "dtypes": {}}
    for name in args.dtypes:
        target, _ = load_default_target(dtype=getattr(torch, name))
        drafter = load_default_drafter(target, variant=args.variant, kind="dspark")
        packs = linear_packs_for(target, PACKED_WEIGHTS_CHOICES[args.packed_weights])
        step_path = shipped_step_curve_path(target.name_or_path, "cpu", step_curve_key(target, args.threads, packs)[2],
                                            args.threads)
        draft_path = draft_curve_path(drafter_architecture(drafter), "cpu", name, args.threads, shipped=True)
        for path in (step_path, draft_path):
            if path.exists() and not args.overwrite and not (path == step_path and name in args.skip_step_curve):
                raise SystemExit(f"{path} exists; pass --overwrite to replace it")
        if name in args.skip_step_curve and step_path.exists():
            from hf_dspark.profiling.step_curve import StepCurve

            step = StepCurve.load(step_path)
        else:
            step = profile_step_curve(target, threads=args.threads, repeats=args.repeats, statistic=args.statistic,
                                      packs=packs)
            step.save(step_path)
        draft = profile_draft_curve(drafter, threads=args.threads, repeats=args.repeats, statistic=args.statistic)
        draft = nondecreasing_costs(draft)
        draft.save(draft_path)
        summary_path = ROOT / args.summary
        step.plot(summary_path.with_name(f"{summary_path.stem}_step_curve_{name}.png"))
        gamma = drafter.config.block_size
        summary["dtypes"][step_curve_key(target, args.threads, packs)[2]] = {
            "verify_ms": {b: round(_ms(step, b), 1) for b in (1, 2, 4, 8, 16, 32, 64, 128)},
            "propose_ms": {r: round(_ms(draft, r), 1) for r in (1, 2, 4, 8, 16, 32, 64)},
            "batch1_round_over_plain_step": round((_ms(step, gamma + 1) + _ms(draft, 1)) / _ms(step, 1), 3),
            "batch1_verify8_over_plain_step": round(_ms(step, gamma + 1) / _ms(step, 1), 3),
            "break_even_tau_batch1": round((_ms(step, gamma + 1) + _ms(draft, 1)) / _ms(step, 1), 3),
            "step_curve": str(step_path.relative_to(ROOT)), "draft_curve": str(draft_path.relative_to(ROOT)),
        }
    write_json_atomic(ROOT / args.summary, summary)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
