"""τ against training compute: held-out (validation-split) τ estimate and position-1 acceptance at each evaluation of
one or more training runs, against CPU-hours, all drafters on one plot.

Compute per run: the `cpu_hours` the trainer logs (process CPU time, all threads, cumulative across resumes); for runs
logged before that field existed, wall-clock seconds read from the run's tqdm log × the run's thread count.
`--start-hours` adds compute spent before the run (a warm start from a drafter trained for that long).

    python scripts/plot_training_compute.py --run dspark=runs/dspark:runs/dspark.log \\
        --run dflash=runs/dflash:runs/dflash.log --start-hours 1.7 --out benchmarks/results/training_compute.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from hf_dspark.io_utils import write_json_atomic

TQDM = re.compile(r"\|\s*(\d+)/\d+ \[(?:(\d+):)?(\d+):(\d+)<")


def log_history(run_dir: Path) -> list[dict]:
    """The newest trainer_state.json's log history (the run folder's own, else its newest checkpoint's)."""
    states = [run_dir / "trainer_state.json", *sorted(run_dir.glob("checkpoint-*/trainer_state.json"),
                                                     key=lambda p: int(p.parent.name.split("-")[-1]))]
    states = [p for p in states if p.is_file()]
    if not states:
        raise FileNotFoundError(f"no trainer_state.json in {run_dir} or its checkpoints")
    newest = max(states, key=lambda p: json.loads(p.read_text())["global_step"])
    return json.loads(newest.read_text())["log_history"]


def wall_seconds_by_step(log_file: Path) -> dict[int, float]:
    """step -> elapsed seconds, from tqdm progress lines (`| 45/400 [19:42<...`)."""
    seconds = {}
    for match in TQDM.finditer(log_file.read_text(errors="replace").replace("\r", "\n")):
        step, hours, minutes, secs = match.groups()
        seconds[int(step)] = 3600 * int(hours or 0) + 60 * int(minutes) + int(secs)
    return seconds


def curve(history: list[dict], wall: dict[int, float], threads: int, start_hours: float) -> list[dict]:
    points = []
    for entry in history:
        if "eval_tau_est" not in entry:
            continue
        step = int(entry["step"])
        if "cpu_hours" in entry:
            hours = float(entry["cpu_hours"])
        else:
            known = [s for s in wall if s <= step]
            if not known:
                continue
            hours = wall[max(known)] * threads / 3600.0
        points.append({"step": step, "cpu_hours": round(start_hours + hours, 4), "tau": entry["eval_tau_est"],
                       "acc_rate_k1": entry.get("eval_acc_rate_k1")})
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True,
                        help="NAME=RUN_DIR[:TQDM_LOG], repeatable (the log is needed for runs without cpu_hours).")
    parser.add_argument("--threads", type=int, default=1, help="Threads per run (for the wall-clock fallback).")
    parser.add_argument("--start-hours", type=float, default=0.0, help="Compute before the run (warm start).")
    parser.add_argument("--baseline", action="append", default=[],
                        help="NAME=HOURS:TAU, a point measured before (e.g. the warm-start drafters), repeatable.")
    parser.add_argument("--out", default="benchmarks/results/training_compute.json", help="JSON (PNG beside it).")
    args = parser.parse_args()
    report = {"threads": args.threads, "start_hours": args.start_hours, "runs": {}, "points_before": {}}
    for spec in args.run:
        name, _, rest = spec.partition("=")
        run_dir, _, log = rest.partition(":")
        wall = wall_seconds_by_step(Path(log)) if log else {}
        report["runs"][name] = curve(log_history(Path(run_dir)), wall, args.threads, args.start_hours)
    for spec in args.baseline:
        name, _, rest = spec.partition("=")
        hours, _, tau = rest.partition(":")
        report["points_before"][name] = {"cpu_hours": float(hours), "tau": float(tau)}
    write_json_atomic(Path(args.out), report, indent=1)
    plot(report, Path(args.out).with_suffix(".png"))
    print(json.dumps(report["runs"], indent=1))


def plot(report: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.5, 3.8))
    FigureCanvasAgg(fig)
    tau_ax, acc_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, points in report["runs"].items():
        hours = [p["cpu_hours"] for p in points]
        line = tau_ax.plot(hours, [p["tau"] for p in points], "o-", label=name)[0]
        acc_ax.plot(hours, [p["acc_rate_k1"] for p in points], "o-", color=line.get_color(), label=name)
    for name, point in report["points_before"].items():
        tau_ax.plot([point["cpu_hours"]], [point["tau"]], "k*", markersize=9)
        tau_ax.annotate(name, (point["cpu_hours"], point["tau"]), fontsize=7, xytext=(4, -10),
                        textcoords="offset points")
    tau_ax.set_xlabel("training compute (CPU-hours)")
    tau_ax.set_ylabel("held-out τ estimate (γ = 7, T = 1)")
    acc_ax.set_xlabel("training compute (CPU-hours)")
    acc_ax.set_ylabel("held-out position-1 acceptance (T = 1)")
    for ax in (tau_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Held-out τ vs training compute (validation split, Σ min(p_draft, p_target))", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
