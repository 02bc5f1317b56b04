"""Print the README's result tables (markdown) from the committed benchmark JSONs.

    python scripts/results_tables.py            # τ table (T = 0 and T = 1), speed table, serve table

Reads benchmarks/results/eval_t0.json, eval_t1.json, speed_trained.json and serve_dspark.json when present.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: header cells, then one list of cells per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def tau_table() -> str:
    reports = {label: _load(f"eval_{label}.json") for label in ("t0", "t1")}
    reports = {label: r for label, r in reports.items() if r is not None}
    if not reports:
        return ""
    first = next(iter(reports.values()))
    sets = list(first["sets"])
    drafters = list(dict.fromkeys(d for r in reports.values() for d in r["table"]))
    rows = []
    for drafter in drafters:
        for label, report in reports.items():
            row = report["table"].get(drafter)
            if row is not None:
                taus = [f"{row['sets'][s]['tau']:.2f}" for s in sets]
                rows.append([drafter, label[1:], *taus, f"{row['macro']:.2f}"])
    return _markdown(["drafter", "T", *sets, "macro"], rows)


def speed_table() -> str:
    report = _load("speed_trained.json")
    if report is None:
        return ""
    sets = list(report["results"])
    methods = list(next(iter(report["results"].values())))
    rows = []
    for method in methods:
        cells = [method]
        for s in sets:
            row = report["results"][s][method]
            tau = "" if row["mean_accepted_length"] is None else f", τ {row['mean_accepted_length']:.2f}"
            cells.append(f"{row['median_tokens_per_second']:.1f} (×{row['median_ratio_to_plain']:.2f}{tau})")
        rows.append(cells)
    return _markdown(["method", *(f"{s} tok/s (×plain, τ)" for s in sets)], rows)


def serve_table() -> str:
    report = _load("serve_dspark.json")
    if report is None:
        return ""
    policies = list(dict.fromkeys(r["policy"] for r in report["results"]))
    levels = sorted({r["concurrency"] for r in report["results"]})
    rows = {(r["policy"], r["concurrency"]): r for r in report["results"]}
    table = []
    for policy in policies:
        cells = [policy]
        for c in levels:
            r = rows.get((policy, c))
            cells.append("" if r is None else f"{r['aggregate_tokens_per_second']:.1f} / "
                         f"{r['per_user_tokens_per_second']:.1f} / ℓ {r['mean_verify_len']:.1f}")
        table.append(cells)
    return "aggregate tok/s / per-user tok/s / mean ℓ\n\n" + _markdown(["policy", *(f"C={c}" for c in levels)], table)


def main() -> None:
    for title, table in (("τ", tau_table()), ("speed", speed_table()), ("serve", serve_table())):
        if table:
            print(f"## {title}\n\n{table}\n")


if __name__ == "__main__":
    main()
