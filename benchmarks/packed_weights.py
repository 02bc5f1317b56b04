"""Benchmark: the target's verification forward with and without oneDNN-packed linear weights, side by side.

For each B (tokens verified in one forward, laid out over up to `--rows` rows like the loop's ragged batches) it
profiles SPS(B) unpacked and packed in alternation, `--pairs` times, and reports the median over pairs of the
ratio t_packed / t_unpacked, with both medians in ms. Threads are pinned (`--threads`). Writes a JSON report and a
plot (default: `benchmarks/results/<processor kind>/packed_weights.json`). Example:

    python benchmarks/packed_weights.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from hf_dspark.defaults import load_default_target
from hf_dspark.hardware import processor_signature
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.profiling.target_steps import pinned_threads, profile_step_curve
from hf_dspark.provenance import processor_kind, with_provenance
from hf_dspark.target.packed_linear import PackedLinears


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16, 32, 64],
                        help="B values: tokens per verification forward (default: 1 2 3 4 6 8 16 32 64).")
    parser.add_argument("--rows", type=int, default=1,
                        help="the most rows the B tokens are spread over (1: one request, the batch-1 case).")
    parser.add_argument("--pairs", type=int, default=5, help="alternating (unpacked, packed) profiles (default 5).")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed sweeps per profile; each profile keeps the fastest forward per B (default 3).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, pinned for the run (default 1).")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON report path (a .png plot is written beside it; default: benchmarks/results/"
                             "<processor kind>/packed_weights.json); refused if it exists unless --force.")
    parser.add_argument("--force", action="store_true", help="overwrite --out and its plot.")
    return parser.parse_args(argv)


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report["points"]
    tokens = [p["batch_tokens"] for p in points]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(tokens, [p["unpacked_ms"] for p in points], "o-", label="PyTorch (MKL) linear")
    ax.plot(tokens, [p["packed_ms"] for p in points], "s-", label="oneDNN-packed linear")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens verified in one forward (B)")
    ax.set_ylabel("forward time (ms, median of pairs)")
    ax.set_title(f"{report['model']} verification forward, {report['threads']} thread(s)\n{report['processor']}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out = args.out or Path("benchmarks") / "results" / processor_kind() / "packed_weights.json"
    plot_path = args.out.with_suffix(".png")
    for path in (args.out, plot_path):
        if path.exists() and not args.force:
            print(f"{path} exists; pass --force to overwrite it.", file=sys.stderr)
            return 2
    target, _ = load_default_target()
    packs = PackedLinears.build(target)
    unpacked: dict[int, list[float]] = {b: [] for b in args.batch_tokens}
    packed: dict[int, list[float]] = {b: [] for b in args.batch_tokens}
    kwargs = dict(batch_tokens=args.batch_tokens, rows=args.rows, repeats=args.repeats, statistic="min",
                  progress=False)
    with pinned_threads(args.threads), torch.inference_mode():
        for pair in range(args.pairs):
            for which, store in ((None, unpacked), (packs, packed)) if pair % 2 == 0 else \
                    ((packs, packed), (None, unpacked)):
                curve = profile_step_curve(target, packs=which, **kwargs)
                for b, sps in zip(curve.batch_tokens, curve.steps_per_second):
                    store[b].append(1e3 / sps)
            print(f"pair {pair + 1}/{args.pairs} done", file=sys.stderr, flush=True)
    points = []
    for b in args.batch_tokens:
        ratios = [p / u for p, u in zip(packed[b], unpacked[b])]
        points.append({"batch_tokens": b, "unpacked_ms": statistics.median(unpacked[b]),
                       "packed_ms": statistics.median(packed[b]), "packed_over_unpacked": statistics.median(ratios),
                       "unpacked_ms_all": unpacked[b], "packed_ms_all": packed[b]})
    report = {"model": "SmolLM2-135M-Instruct", "dtype": "float32", "threads": args.threads, "rows": args.rows,
              "pairs": args.pairs, "repeats": args.repeats, "processor": processor_signature(torch.device("cpu")),
              "packed_mib": PackedLinears.nbytes_for(target) / 2**20, "points": points}
    write_json_atomic(args.out, with_provenance(report))
    _plot(report, plot_path)
    one = points[0]["unpacked_ms"] if points[0]["batch_tokens"] == 1 else None
    print(f"{'B':>4} {'unpacked ms':>12} {'packed ms':>10} {'packed/unpacked':>16}" + ("  (÷ one-token step)"
                                                                                      if one else ""))
    for p in points:
        extra = f"  {p['unpacked_ms'] / one:.2f} → {p['packed_ms'] / one:.2f}" if one else ""
        print(f"{p['batch_tokens']:>4} {p['unpacked_ms']:>12.1f} {p['packed_ms']:>10.1f} "
              f"{p['packed_over_unpacked']:>16.2f}{extra}")
    print(f"wrote {args.out} and {plot_path} (packed copies: {report['packed_mib']:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
