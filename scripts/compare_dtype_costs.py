"""fp32 vs bf16 side by side: the target's verification forward at B tokens and the shipped drafter's round (context
update with the last round's committed tokens, then `propose`; `draft_profiling.time_draft_round`) at R rows,
interleaved in every sweep (so load on a shared machine hits both dtypes alike), median ms per point, and
the batch-1 ratios that decide whether speculation pays (8-token verification / 1-token step, break-even τ).

    python scripts/compare_dtype_costs.py --threads 1 --sweeps 4 --out benchmarks/results/dtype_costs.json
    python scripts/compare_dtype_costs.py --ship-from benchmarks/results/dtype_costs.json [--overwrite] \
        [--overwrite-step-curves]

`--ship-from` turns a report into the curves shipped in `src/hf_dspark/resources/step_curves/<processor>/` (the
processor kind that measured the report): the drafter's cost curve per dtype and the target's SPS(B) for the dtypes
without a fully profiled shipped curve (`hf-dspark profile` measures more points; on a machine shared with other
jobs its costs come out inflated and jumbled, and the interleaved idle-machine medians here are the better
estimate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from datetime import datetime, timezone

import torch

from hf_dspark import load_default_drafter, load_default_target
from hf_dspark.draft_profiling import (
    DRAFT_COMMITTED,
    DRAFT_PROFILER_VERSION,
    _context_cache,
    _context_features,
    time_draft_round,
)
from hf_dspark.hardware import processor_signature
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.profiling import (
    _prefill,
    _select_rows,
    _time_forward,
    _verification_inputs,
    default_taps,
)

BATCH_TOKENS = (1, 2, 3, 4, 8, 16, 32, 64)
DEFAULT_TARGET = "SmolLM2-135M-Instruct"
ROWS = (1, 2, 4, 8, 16, 32)


def _monotone(steps_per_second: list[float]) -> list[float]:
    """Costs made non-decreasing in B (running minimum of steps per second): with a few sweeps, a larger batch
    measured cheaper than a smaller one is noise, and shipping it would make drafting look free."""
    out, best = [], float("inf")
    for value in steps_per_second:
        best = min(best, value)
        out.append(best)
    return out


def ship(report_path: str, overwrite: bool, overwrite_step_curves: bool = False) -> None:
    """Write the report's medians as shipped `StepCurve`s (target SPS(B) unless one ships; drafter per dtype)."""
    from hf_dspark.draft_profiling import DEFAULT_DRAFT_ROWS, DRAFT_PROFILER_VERSION, draft_curve_path
    from hf_dspark.profiling import PROFILER_VERSION, shipped_step_curve_path
    from hf_dspark.step_curve import StepCurve

    with open(report_path, encoding="utf-8") as handle:
        report = json.load(handle)
    ms, threads = report["median_ms"], int(report["threads"])
    architecture = report.get("drafter_architecture", "dspark-2L-576d-markov64-g7-v49152")
    processor = report.get("processor")  # curves are filed under the processor kind that measured them
    if processor is None:
        raise SystemExit(f"{report_path} does not say which kind of processor measured it (older report); "
                         "measure again to ship its curves")
    for dtype in ("float32", "bfloat16"):
        points = {"verify": {}, "propose": {}}
        for key, value in ms.items():
            name, kind, x = key.split(" ")[0], key.split(" ")[1], int(key.rsplit("=", 1)[1])
            if name == dtype:
                points[kind][x] = 1e3 / value
        meta = dict(device="cpu", dtype=dtype, threads=threads, created=report["created"], processor=processor)
        step_path = shipped_step_curve_path(DEFAULT_TARGET, "cpu", dtype, threads, processor=processor)
        if not step_path.exists() or overwrite_step_curves:
            xs = sorted(points["verify"])
            StepCurve(xs, _monotone([points["verify"][x] for x in xs]), model=DEFAULT_TARGET,
                      profiler=PROFILER_VERSION, **meta).save(step_path)
        draft_path = draft_curve_path(architecture, "cpu", dtype, threads, shipped=True, processor=processor)
        if draft_path.exists() and not overwrite:
            raise SystemExit(f"{draft_path} exists; pass --overwrite to replace it")
        xs = sorted(points["propose"])
        assert max(xs) <= max(DEFAULT_DRAFT_ROWS)
        if report.get("draft_profiler") != DRAFT_PROFILER_VERSION:
            raise SystemExit(f"{report_path} timed the drafter's propose alone (an older report); measure again to "
                             "ship its draft curves")
        StepCurve(xs, _monotone([points["propose"][x] for x in xs]), model=architecture,
                  profiler=DRAFT_PROFILER_VERSION, **meta).save(draft_path)
        print(f"wrote {draft_path} (and {step_path} unless it shipped already)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--sweeps", type=int, default=4, help="timed sweeps (one untimed first)")
    parser.add_argument("--out", default="benchmarks/results/dtype_costs.json", help="JSON report path")
    parser.add_argument("--ship-from", default=None, help="write shipped curves from this report and stop")
    parser.add_argument("--overwrite", action="store_true", help="replace shipped drafter curves")
    parser.add_argument("--overwrite-step-curves", action="store_true",
                        help="also replace shipped target SPS(B) curves (kept by default)")
    args = parser.parse_args()
    if args.ship_from:
        ship(args.ship_from, args.overwrite, args.overwrite_step_curves)
        return
    torch.set_num_threads(args.threads)
    models = {}
    for name in ("float32", "bfloat16"):
        target, _ = load_default_target(dtype=getattr(torch, name))
        models[name] = (target, load_default_drafter(target))
    taps = default_taps(int(models["float32"][0].config.num_hidden_layers))
    samples: dict[str, list[float]] = {}
    with torch.inference_mode():
        caches = {k: _prefill(t, 8, 200, 0) for k, (t, _) in models.items()}
        inputs = {k: {b: _verification_inputs(t, b, 200, 8, 0) for b in BATCH_TOKENS} for k, (t, _) in models.items()}
        room = DRAFT_COMMITTED * (args.sweeps + 1)
        contexts = {(k, r): _context_cache(d, r, 200, 0, room) for k, (_, d) in models.items() for r in ROWS}
        committed = {(k, r): _context_features(d, r, DRAFT_COMMITTED, 1) for k, (_, d) in models.items() for r in ROWS}
        for sweep in range(args.sweeps + 1):
            for k, (target, drafter) in models.items():
                for b in BATCH_TOKENS:
                    cache = _select_rows(target, caches[k], inputs[k][b]["input_ids"].shape[0])
                    elapsed = _time_forward(target, cache, inputs[k][b], taps)
                    if sweep:
                        samples.setdefault(f"{k} verify B={b}", []).append(elapsed)
                for r in ROWS:
                    anchors = torch.randint(100, 1000, (r,))
                    elapsed = time_draft_round(drafter, contexts[(k, r)], anchors, committed[(k, r)])
                    if sweep:
                        samples.setdefault(f"{k} propose R={r}", []).append(elapsed)
    ms = {key: round(1e3 * statistics.median(v), 1) for key, v in samples.items()}
    gamma = models["float32"][1].config.block_size
    ratios = {}
    for k in models:
        step, verify = ms[f"{k} verify B=1"], ms[f"{k} verify B=8"]
        ratios[k] = {"verify8_over_step1": round(verify / step, 2),
                     "break_even_tau_batch1": round((verify + ms[f"{k} propose R=1"]) / step, 2)}
    from hf_dspark.draft_profiling import drafter_architecture

    report = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "threads": args.threads,
              "processor": processor_signature("cpu"),
              "drafter_architecture": drafter_architecture(models["float32"][1]),
              "draft_profiler": DRAFT_PROFILER_VERSION,
              "sweeps": args.sweeps, "gamma": gamma, "load_average_at_end": os.getloadavg(), "median_ms": ms,
              "batch1": ratios}
    write_json_atomic(args.out, report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
