"""Measure the scheduler's per-round overhead (the goal: below 1% of a round at R = 64, γ = 8), and that of the
"auto" policy's decisions (plan before drafting + ℓ after it + the acceptance update, also at most 1% of a round).

Times `schedule_greedy` and `schedule_lagged` (and the two baselines) on random survivals with a step curve shaped
like the default target's, pinned to ONE torch thread so numbers are comparable on a shared machine. The reference
round cost (`--round-ms`) is one verification forward of the default target at B = 1 with a 200-token cache (see the
shipped step curves under src/hf_dspark/resources/step_curves/); a real R = 64 round costs several times more, so the
percentage is an upper bound. Writes benchmarks/results/<processor kind>/scheduler_overhead.json by default.

    python benchmarks/scheduler_overhead.py --rows 64 --block-size 8 --repeats 2000
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from hf_dspark.io_utils import write_json_atomic
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.provenance import processor_kind, with_provenance
from hf_dspark.scheduling import get_policy

ROOT = Path(__file__).resolve().parents[1]


def default_curve() -> StepCurve:
    """SPS(B) from the measured ratios on this CPU: B=1 ≈ 60 ms, 8 ≈ 2×, 32 ≈ 3×, 64 ≈ 4.5× (linear beyond)."""
    ratios = {1: 1.0, 8: 2.0, 32: 3.0, 64: 4.5, 128: 9.0, 256: 18.0, 576: 40.5}
    return StepCurve(list(ratios), [1.0 / (0.060 * r) for r in ratios.values()], model="default-target", threads=1)


def time_policy(name: str, survival: torch.Tensor, curve: StepCurve, capacity: torch.Tensor, repeats: int) -> dict:
    policy = get_policy(name).schedule
    for _ in range(min(50, repeats)):  # warm-up
        policy(survival, curve, capacity_survival=capacity)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy(survival, curve, capacity_survival=capacity)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return {
        "median_ms": 1e3 * statistics.median(samples),
        "p90_ms": 1e3 * samples[int(0.9 * (len(samples) - 1))],
        "min_ms": 1e3 * samples[0],
    }


def time_auto(rows: int, gamma: int, curve: StepCurve, repeats: int, seed: int, draft_ms: float = 30.0) -> dict:
    """One round of the "auto" policy's own work: plan (draft or decode), ℓ from the proposal, observe.

    draft_ms: the drafter's cost per proposal; 0 makes every round draft, a huge cost every round decode plainly.
    """
    from hf_dspark.model.modeling_dspark import DSparkProposal
    from hf_dspark.scheduling.verification_policy import VerificationPolicy

    gen = torch.Generator().manual_seed(seed)
    draft_curve = StepCurve([1, 64], [1e3 / max(draft_ms, 1e-6), 1e3 / max(draft_ms, 1e-6)])
    policy = VerificationPolicy("auto", block_size=gamma, step_curve=curve, draft_curve=draft_curve)
    ids, cap = list(range(rows)), torch.full((rows,), 100)
    confidence = 0.5 + 0.5 * torch.rand(rows, gamma, generator=gen)
    proposal = DSparkProposal(torch.zeros(rows, gamma, dtype=torch.long), None, torch.ones(rows, gamma), confidence)
    samples = []
    for index in range(repeats + 50):
        start = time.perf_counter()
        plan = policy.plan(ids, cap)
        verify_len = policy(proposal, cap) if plan.drafts else torch.zeros(rows, dtype=torch.long)
        policy.observe(ids, verify_len, torch.randint(0, gamma + 1, (rows,), generator=gen).minimum(verify_len))
        if index >= 50:
            samples.append(time.perf_counter() - start)
    samples.sort()
    return {"median_ms": 1e3 * statistics.median(samples), "p90_ms": 1e3 * samples[int(0.9 * (len(samples) - 1))],
            "min_ms": 1e3 * samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64, help="concurrent requests R")
    parser.add_argument("--block-size", type=int, default=8, help="draft positions γ")
    parser.add_argument("--repeats", type=int, default=2000,
                        help="timed calls per policy (auto: a quarter, at least 50)")
    parser.add_argument("--round-ms", type=float, default=60.0, help="reference cost of one verification forward")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random survivals, confidences and acceptances")
    parser.add_argument("--output", type=Path, default=None,
                        help="JSON report path (default: benchmarks/results/<processor kind>/scheduler_overhead.json)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    survival = torch.cumprod(0.5 + 0.5 * torch.rand(args.rows, args.block_size, generator=gen), dim=-1)
    capacity = torch.cumprod(0.5 + 0.5 * torch.rand(args.rows, args.block_size, generator=gen), dim=-1)
    curve = default_curve()
    results = {}
    for name in ("greedy", "lagged", "threshold", "fixed"):
        stats = time_policy(name, survival, curve, capacity, args.repeats)
        stats["percent_of_round"] = 100.0 * stats["median_ms"] / args.round_ms
        results[name] = stats
        print(
            f"{name:>9}: median {stats['median_ms']:.3f} ms (p90 {stats['p90_ms']:.3f} ms) = "
            f"{stats['percent_of_round']:.3f}% of a {args.round_ms:.0f} ms verification forward"
        )
    for rows in (1, args.rows):
        for path, draft_ms in (("drafting", 0.0), ("skipping", 1e6)):
            stats = time_auto(rows, args.block_size, curve, max(args.repeats // 4, 50), args.seed, draft_ms)
            stats["percent_of_round"] = 100.0 * stats["median_ms"] / args.round_ms
            results[f"auto_{path}_R{rows}"] = stats
            print(f"auto {path} R={rows:>3}: median {stats['median_ms']:.3f} ms = {stats['percent_of_round']:.3f}% "
                  f"of a {args.round_ms:.0f} ms verification forward")
    payload = {
        "rows": args.rows,
        "block_size": args.block_size,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "reference_round_ms": args.round_ms,
        "reference_round_source": "one default-target forward, B=1, 200-token cache (shipped step curve: 59 ms)",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "policies": results,
    }
    if args.output is None:
        args.output = ROOT / "benchmarks" / "results" / processor_kind() / "scheduler_overhead.json"
    write_json_atomic(args.output, with_provenance(payload))
    print(f"torch.set_num_threads(1) was used; wrote {args.output}")


if __name__ == "__main__":
    main()
