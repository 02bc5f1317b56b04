"""The report of `benchmarks/loop_overhead.py`: per-case medians and IQRs, paired ratios, markdown tables."""

from __future__ import annotations

import statistics


def _quartiles(values: list[float]) -> dict:
    """Median and interquartile range (0 for one value)."""
    if len(values) < 2:
        return {"median": values[0], "iqr": 0.0}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "iqr": q3 - q1}


def ratio_pairs(batches: list[int]) -> list[tuple[str, str, str]]:
    """(label, numerator case, denominator case) of every reported ratio."""
    pairs = []
    if 1 in batches:
        pairs += [
            ("fixed / stock (batch 1)", "fixed@1", "stock@1"),
            ("auto / stock (batch 1)", "auto@1", "stock@1"),
            ("auto no-draft round / plain step (batch 1)", "auto-nodraft@1", "plain@1"),
        ]
    for b in batches:
        pairs += [(f"{p} / plain step (batch {b})", f"{p}@{b}", f"plain@{b}") for p in ("fixed", "auto")]
    return pairs


def summarize(raw: dict, batches: list[int]) -> tuple[list[dict], list[dict]]:
    """(rows: one per case with ms per round, median and IQR over repeats; ratios: per-repeat paired ratios)."""
    rows = []
    for key, entry in raw.items():
        runs = [r for r in entry["runs"] if r["rounds"]]
        row = {"key": key, "case": entry["case"], "batch": entry["batch"], "repeats": len(runs),
               "identical_to_plain": entry["identical"], "error": entry["error"]}  # fmt: skip
        if runs:
            row["rounds"] = statistics.median(r["rounds"] for r in runs)
            row["forwards"] = statistics.median(r["forwards"] for r in runs)
            for field in ("overhead", "forward", "drafter"):
                stats = _quartiles([1e3 * r[f"{field}_s"] for r in runs])
                row[f"{field}_ms"], row[f"{field}_ms_iqr"] = stats["median"], stats["iqr"]
            row["overhead_ms_all"] = [1e3 * r["overhead_s"] for r in entry["runs"] if r["rounds"]]
        rows.append(row)
    ratios = []
    for label, top, bottom in ratio_pairs(batches):
        a, b = raw.get(top), raw.get(bottom)
        if a is None or b is None:
            continue
        paired = [
            x["overhead_s"] / y["overhead_s"] for x, y in zip(a["runs"], b["runs"]) if x["rounds"] and y["rounds"]
        ]
        if paired:
            ratios.append({"ratio": label, "numerator": top, "denominator": bottom, **_quartiles(paired)})
    return rows, ratios


def markdown(rows: list[dict], ratios: list[dict]) -> str:
    lines = [
        "| case | batch | rounds | forward ms | drafter ms | loop overhead ms (median ± IQR) | greedy = plain |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "overhead_ms" not in r:
            lines.append(f"| {r['case']} | {r['batch']} | – | – | – | {r['error'] or 'no round counted'} | – |")
            continue
        lines.append(
            f"| {r['case']} | {r['batch']} | {r['rounds']:.0f} | {r['forward_ms']:.3f} | "
            f"{r['drafter_ms']:.3f} | {r['overhead_ms']:.3f} ± {r['overhead_ms_iqr']:.3f} | "
            f"{'yes' if r['identical_to_plain'] else 'NO'} |"
        )
    lines += ["", "| ratio of loop overheads (paired per repeat) | median | IQR |", "| --- | ---: | ---: |"]
    lines += [f"| {r['ratio']} | {r['median']:.2f} | {r['iqr']:.2f} |" for r in ratios]
    return "\n".join(lines)


def before_after(before: dict, after: dict) -> str:
    """Per case ms before and after, then each run's own paired ratios side by side (those compare across runs on a
    busy machine; the ms do only on a quiet one)."""
    old = {r["key"]: r for r in before["cases"]}
    lines = ["| case | batch | before ms | after ms | after / before |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in after["cases"]:
        b = old.get(r["key"], {})
        if "overhead_ms" in r and "overhead_ms" in b:
            lines.append(
                f"| {r['case']} | {r['batch']} | {b['overhead_ms']:.3f} | {r['overhead_ms']:.3f} | "
                f"{r['overhead_ms'] / b['overhead_ms']:.2f} |"
            )
    old_ratios = {r["ratio"]: r for r in before.get("ratios", [])}
    lines += ["", "| ratio | before | after |", "| --- | ---: | ---: |"]
    for r in after["ratios"]:
        b = old_ratios.get(r["ratio"])
        lines.append(f"| {r['ratio']} | {'–' if b is None else format(b['median'], '.2f')} | {r['median']:.2f} |")
    return "\n".join(lines)
