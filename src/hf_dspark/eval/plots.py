"""Figures of the `hf-dspark eval` report (PNG, one per figure, next to the JSON).

- `<stem>_accepted_length.png`: τ per set and drafter (the table as bars).
- `<stem>_position_acceptance.png`: P(position k accepted | positions < k accepted) per domain (paper Fig. 2).
- `<stem>_length_sweep.png`: τ vs proposal length γ per domain (Fig. 4).
- `<stem>_threshold_sweep.png`: acceptance rate among verified tokens vs verified tokens per round (Fig. 5).
- `<stem>_calibration.png`: per-position ECE and ROC-AUC before/after STS; `<stem>_reliability_<drafter>.png`:
  the reliability diagram (Fig. 6).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..ops.calibration import reliability_diagram


def _figure(panels: int, width: float = 4.2, height: float = 3.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(0.6 + width * panels, height))
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def _domains(report: dict) -> list[str]:
    return sorted({v["domain"] for v in report["sets"].values()})


def _integer_x(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend(ax, size: int = 8) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")


def _save(fig, path: Path, title: str) -> str:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def plot_accepted_length(report: dict, path: Path) -> str:
    """Grouped bars: τ per set (and per-domain macro average) for each drafter."""
    columns = list(report["sets"]) + [f"{d} avg" for d in _domains(report)]
    drafters = list(report["table"])
    fig, (ax,) = _figure(1, width=max(4.0, 0.55 * len(columns) * max(1, len(drafters))))
    width = 0.8 / max(1, len(drafters))
    for i, name in enumerate(drafters):
        row = report["table"][name]
        values = [row["sets"][s]["tau"] for s in report["sets"]] + [row["domains"].get(d) for d in _domains(report)]
        ax.bar([x + i * width for x in range(len(columns))], [v or 0.0 for v in values], width,
               label=f"{name} (ℓ={row['verify_len']})")
    ax.set_xticks([x + width * (len(drafters) - 1) / 2 for x in range(len(columns))], columns, rotation=30,
                  ha="right")
    ax.set_ylabel("accepted length τ (tokens / round)")
    ax.legend(fontsize=8)
    return _save(fig, path, "Offline accepted length (fixed ℓ, bonus token included)")


def plot_position_acceptance(report: dict, path: Path) -> str:
    """Fig. 2: conditional acceptance per draft position, one panel per domain, one line per drafter."""
    domains = _domains(report)
    fig, axes = _figure(len(domains))
    for ax, domain in zip(axes, domains):
        for name, per_domain in report["position_acceptance"].items():
            probs = per_domain.get(domain, {}).get("p") or []
            points = [(k + 1, p) for k, p in enumerate(probs) if p is not None]
            if points:
                ax.plot(*zip(*points), "o-", label=name, markersize=3)
        longest = max([len(v.get(domain, {}).get("p") or []) for v in report["position_acceptance"].values()],
                      default=1)
        ax.set(title=domain, xlabel="draft position k", ylabel="P(k accepted | < k accepted)", ylim=(0, 1.02),
               xlim=(0.5, longest + 0.5))
        _integer_x(ax)
        _legend(ax)
    return _save(fig, path, "Position-wise conditional acceptance")


def plot_length_sweep(report: dict, path: Path) -> str:
    """Fig. 4: τ (macro over the domain's sets) vs proposal length γ."""
    domains, sweep = _domains(report), report["length_sweep"]
    fig, axes = _figure(len(domains))
    for ax, domain in zip(axes, domains):
        for name, by_gamma in sweep["results"].items():
            points = sorted((int(g), v["domains"].get(domain)) for g, v in by_gamma.items())
            points = [(g, t) for g, t in points if t is not None]
            if points:
                ax.plot(*zip(*points), "o-", label=name, markersize=3)
        ax.set(title=domain, xlabel="proposal length γ (ℓ = γ)", ylabel="accepted length τ")
        _integer_x(ax)
        _legend(ax)
    skipped = "; ".join(f"{n} skips γ={g}" for n, g in sweep["skipped"].items())
    return _save(fig, path, "Proposal-length sweep" + (f" ({skipped})" if skipped else ""))


def plot_threshold_sweep(report: dict, path: Path) -> str:
    """Fig. 5: acceptance rate among verified drafts vs mean verified drafts per round, as the threshold moves."""
    domains = _domains(report)
    fig, axes = _figure(len(domains))
    for ax, domain in zip(axes, domains):
        for name, per_domain in report["threshold_sweep"].items():
            points = [(p["mean_verified"], p["acceptance_rate"]) for p in per_domain.get(domain, [])
                      if isinstance(p, dict) and p.get("acceptance_rate") is not None]
            if points:
                ax.plot(*zip(*points), "o-", label=name, markersize=3)
        ax.set(title=domain, xlabel="verified draft tokens per round", ylabel="acceptance rate", ylim=(0, 1.02))
        _legend(ax)
    return _save(fig, path, "Static confidence threshold (offline replay)")


def plot_calibration(report: dict, path: Path) -> str:
    """Per-position ECE (left) and ROC-AUC (right) of the prefix survival, before (dashed) and after STS."""
    fig, (ece_ax, auc_ax) = _figure(2)
    longest = max([len(c["ece_before"]) for c in report["calibration"].values() if "ece_before" in c], default=1)
    for name, cal in report["calibration"].items():
        if "ece_before" not in cal:
            continue
        ks = range(1, len(cal["ece_before"]) + 1)
        for ax, key in ((ece_ax, "ece"), (auc_ax, "auc")):
            line = ax.plot(ks, [v if v is not None else float("nan") for v in cal[f"{key}_after"]], "o-",
                           label=f"{name} after STS", markersize=3)
            ax.plot(ks, [v if v is not None else float("nan") for v in cal[f"{key}_before"]], "x--",
                    color=line[0].get_color(), label=f"{name} before", markersize=3)
    ece_ax.set(xlabel="draft position k", ylabel="ECE of survival")
    auc_ax.set(xlabel="draft position k", ylabel="ROC-AUC", ylim=(0, 1.02))
    for ax in (ece_ax, auc_ax):
        ax.set_xlim(0.5, longest + 0.5)
        _integer_x(ax)
        _legend(ax, 7)
    return _save(fig, path, "Confidence calibration per position")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def write_figures(report: dict, json_path: Path, reliability: dict) -> dict[str, str]:
    """Write every figure beside `json_path`; `reliability` maps drafter -> (before, after, labels) tensors."""
    stem = json_path.with_suffix("")
    figures = {
        "accepted_length": plot_accepted_length(report, Path(f"{stem}_accepted_length.png")),
        "position_acceptance": plot_position_acceptance(report, Path(f"{stem}_position_acceptance.png")),
        "threshold_sweep": plot_threshold_sweep(report, Path(f"{stem}_threshold_sweep.png")),
        "calibration": plot_calibration(report, Path(f"{stem}_calibration.png")),
    }
    if report["length_sweep"]["results"]:  # `--sweep` with no γ: no empty figure
        figures["length_sweep"] = plot_length_sweep(report, Path(f"{stem}_length_sweep.png"))
    for name, (before, after, labels) in reliability.items():
        path = Path(f"{stem}_reliability_{_slug(name)}.png")
        mode = report["calibration"][name].get("mode")
        reliability_diagram(before, after, labels, path, title=f"{name}: prefix survival, {mode} decoding")
        figures[f"reliability_{name}"] = str(path)
    return figures
