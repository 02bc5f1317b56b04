"""τ against training compute: held-out (validation-split) τ estimate and position-1 acceptance at each evaluation of
one or more training runs, against CPU-hours, all drafters on one plot.

Compute per run: the `cpu_hours` the trainer logs (process CPU time, all threads, cumulative across resumes); for runs
logged before that field existed, process CPU time sampled from /proc while they ran (`--cpu-samples`), else
wall-clock seconds read from the run's tqdm log × the run's thread count.
`--start-hours` adds compute spent before the run (a warm start from a drafter trained for that long).

    python scripts/plot_training_compute.py --run dspark=runs/dspark:runs/dspark.log \\
        --run dflash=runs/dflash:runs/dflash.log --start-hours 1.7 --out benchmarks/results/training_compute.json

A run named "NAME STAGE" (e.g. "dspark v3", warm-started from the run "dspark") is drawn in NAME's colour with its
own marker, so stages of one drafter read as one curve.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import sys
from pathlib import Path

from hf_dspark.io_utils import write_json_atomic

TQDM = re.compile(r"\|\s*(\d+)/(\d+) \[(?:(\d+):)?(\d+):(\d+)<")


def trainer_state(run_dir: Path) -> dict:
    """The newest trainer_state.json (the run folder's own, else its newest checkpoint's)."""
    states = [run_dir / "trainer_state.json", *sorted(run_dir.glob("checkpoint-*/trainer_state.json"),
                                                     key=lambda p: int(p.parent.name.split("-")[-1]))]
    states = [p for p in states if p.is_file()]
    if not states:
        raise FileNotFoundError(f"no trainer_state.json in {run_dir} or its checkpoints")
    newest = max(states, key=lambda p: json.loads(p.read_text())["global_step"])
    return json.loads(newest.read_text())


def wall_seconds_by_step(log_file: Path, max_steps: int) -> dict[int, float]:
    """step -> elapsed seconds, from the training bar's tqdm lines (`| 45/400 [19:42<...`, the bar whose total is
    `max_steps`; tokenising and evaluation bars are skipped)."""
    matches = [m.groups() for m in TQDM.finditer(log_file.read_text(errors="replace").replace("\r", "\n"))]
    return {int(step): 3600 * int(hours or 0) + 60 * int(minutes) + int(secs)
            for step, total, hours, minutes, secs in matches if int(total) == max_steps}


def cpu_seconds_at(samples: list[tuple[float, float]], when: float) -> float:
    """Process CPU seconds at unix time `when`, linear between (time, cpu) samples (sorted, ≥ 2)."""
    for (t0, c0), (t1, c1) in itertools.pairwise(samples):
        if when <= t1:
            return c0 + (c1 - c0) * max(0.0, when - t0) / max(1e-9, t1 - t0)
    return samples[-1][1]


def read_cpu_samples(path: Path, name: str, started: float) -> list[tuple[float, float]]:
    """`unix_time run cpu_seconds` lines of one run (from a sampler of /proc/PID/stat), with (start, 0) first."""
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(started, 0.0), *sorted((float(t), float(c)) for t, run, c in rows if run == name)]


def curve(history: list[dict], wall: dict[int, float], threads: int, start_hours: float,
          cpu: list[tuple[float, float]] | None = None, log_mtime: float | None = None) -> list[dict]:
    """Evaluation points: `cpu_hours` logged by the trainer; else process CPU time sampled while the run went
    (step -> unix time through the tqdm clock, anchored at the log file's last write); else wall × threads."""
    points = []
    last_elapsed = wall[max(wall)] if wall else None
    for entry in history:
        if "eval_tau_est" not in entry:
            continue
        step = int(entry["step"])
        known = [s for s in wall if s <= step]
        if "cpu_hours" in entry:
            hours = float(entry["cpu_hours"])
        elif not known:
            continue
        elif cpu and log_mtime is not None:
            when = log_mtime - (last_elapsed - wall[max(known)])
            hours = cpu_seconds_at(cpu, when) / 3600.0
        else:
            hours = wall[max(known)] * threads / 3600.0
        points.append({"step": step, "cpu_hours": round(start_hours + hours, 4), "tau": entry["eval_tau_est"],
                       "acc_rate_k1": entry.get("eval_acc_rate_k1")})
    return points


def position_table(history: list[dict], eval_report: dict | None, name: str, gamma: int = 7) -> dict:
    """Per-position acceptance three ways, side by side: training batches (mean of the last 5 logs), the validation
    split (last evaluation) and `hf-dspark eval` at T = 1 (P(k accepted | < k accepted), all sets). The first two
    are c*_k with gold previous tokens, the third the realised conditional acceptance: they should agree."""
    train = [e for e in history if "acc_rate_k1" in e and "eval_tau_est" not in e][-5:]
    val = [e for e in history if "eval_acc_rate_k1" in e][-1:]
    row = {
        "train": [round(sum(e[f"acc_rate_k{k}"] for e in train) / max(1, len(train)), 4) for k in range(1, gamma + 1)],
        "validation": [round(val[0][f"eval_acc_rate_k{k}"], 4) for k in range(1, gamma + 1)] if val else None,
        "eval": None,
    }
    if eval_report is not None and name in eval_report.get("position_acceptance", {}):
        row["eval"] = [round(p, 4) for p in eval_report["position_acceptance"][name]["all"]["p"]]
        row["eval_reached"] = eval_report["position_acceptance"][name]["all"]["reached"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True,
                        help="NAME=RUN_DIR[:TQDM_LOG], repeatable (the log is needed for runs without cpu_hours).")
    parser.add_argument("--threads", type=int, default=1, help="Threads per run (for the wall-clock fallback).")
    parser.add_argument("--start-hours", type=float, default=0.0, help="Compute before the run (warm start).")
    parser.add_argument("--start", action="append", default=[],
                        help="NAME=HOURS: compute before that run (overrides --start-hours for it), repeatable")
    parser.add_argument("--baseline", action="append", default=[],
                        help="NAME=HOURS:TAU, a point measured before (e.g. the warm-start drafters), repeatable.")
    parser.add_argument("--cpu-samples", default=None,
                        help="file of `unix_time run cpu_seconds` lines sampled during runs without cpu_hours")
    parser.add_argument("--started", action="append", default=[],
                        help="NAME=UNIX_TIME the run's process started (CPU 0 there), with --cpu-samples")
    parser.add_argument("--eval-report", default=None,
                        help="an `hf-dspark eval` JSON at T = 1: adds its per-position acceptance to the table "
                        "(to the last stage of each drafter, matched by the name before the space)")
    parser.add_argument("--out", default="benchmarks/results/training_compute.json", help="JSON (PNG beside it).")
    args = parser.parse_args()
    eval_report = json.loads(Path(args.eval_report).read_text()) if args.eval_report else None
    report = {"command": "python scripts/plot_training_compute.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
              "threads": args.threads, "start_hours": args.start_hours, "runs": {}, "points_before": {},
              "position_acceptance": {}}
    for spec in args.run:
        name, _, rest = spec.partition("=")
        run_dir, _, log = rest.partition(":")
        state = trainer_state(Path(run_dir))
        wall = wall_seconds_by_step(Path(log), int(state["max_steps"])) if log else {}
        started = dict(item.split("=") for item in args.started)
        cpu = (read_cpu_samples(Path(args.cpu_samples), name, float(started[name]))
               if args.cpu_samples and name in started else None)
        history = state["log_history"]
        mtime = Path(log).stat().st_mtime if log else None
        starts = {key: float(value) for key, value in (item.split("=") for item in args.start)}
        report["runs"][name] = curve(history, wall, args.threads, starts.get(name, args.start_hours), cpu, mtime)
        report["position_acceptance"][name] = position_table(history, eval_report, name.split()[0])
    for name in list(report["position_acceptance"])[:-1]:  # the eval report measured each drafter's last stage
        later = [n for n in list(report["position_acceptance"]) if n.split()[0] == name.split()[0]]
        if later[-1] != name:
            report["position_acceptance"][name].update(eval=None, eval_reached=None)
    for spec in args.baseline:
        name, _, rest = spec.partition("=")
        hours, _, tau = rest.partition(":")
        report["points_before"][name] = {"cpu_hours": float(hours), "tau": float(tau)}
    write_json_atomic(Path(args.out), report, indent=1)
    plot(report, Path(args.out).with_suffix(".png"))
    print(json.dumps({"runs": report["runs"], "position_acceptance": report["position_acceptance"]}, indent=1))


def plot(report: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.5, 3.8))
    FigureCanvasAgg(fig)
    tau_ax, acc_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors: dict[str, str] = {}
    stages: dict[str, int] = {}
    styles = ["o-", "s--", "^-.", "D:", "v-"]
    for name, points in report["runs"].items():
        family = name.split()[0]  # "dspark v3" continues "dspark": same colour, its own marker and line style
        color = colors.setdefault(family, f"C{len(colors)}")
        stages[family] = stages.get(family, -1) + 1
        style = styles[stages[family] % len(styles)]
        hours = [p["cpu_hours"] for p in points]
        tau_ax.plot(hours, [p["tau"] for p in points], style, color=color, label=name)
        acc_ax.plot(hours, [p["acc_rate_k1"] for p in points], style, color=color, label=name)
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
