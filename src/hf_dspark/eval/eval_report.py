"""The `hf-dspark eval` report: τ table, position-wise acceptance, γ sweep, threshold sweep, calibration.

Everything is computed from the work-file records (`accepted_length.WorkFile`) of the planned keys, so a resumed
run and an uninterrupted one give the same report. `write_report` writes the JSON atomically and the figures.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from transformers.utils import logging

from ..io_utils import write_json_atomic
from ..ops.calibration import evaluate_calibration, fit_sts
from ..provenance import result_provenance
from .acceptance_metrics import (
    DEFAULT_THRESHOLDS,
    macro_mean,
    survival_from_logits,
    survival_labels,
    threshold_sweep,
)
from .metrics import position_metrics, round_metrics

logger = logging.get_logger(__name__)

DOMAINS = {"gsm8k": "math", "math500": "math", "aime25": "math", "humaneval": "code", "mbpp": "code",
           "mt-bench": "chat"}


def domain_of(set_name: str) -> str:
    """math / code / chat for the paper's sets (also under a folder prefix, `a/gsm8k`), "other" for any other set."""
    return DOMAINS.get(set_name.rsplit("/", 1)[-1], "other")


def _records(work, plan, set_name: str, items: list[dict]) -> list[dict]:
    found = (work.get(plan.name, plan.verify_len, set_name, i, t)
             for i, item in enumerate(items) for t in range(len(item["turns"])))
    return [r for r in found if r is not None]


def _rounds(records: list[dict]) -> list[list[int]]:
    return [r for record in records for r in record["rounds"]]


def _set_row(records: list[dict]) -> dict:
    metrics = round_metrics(_rounds(records))  # the `accepted_length` evaluate metric
    return {"tau": metrics["tau"], "tau_without_bonus": metrics["tau_without_bonus"],
            "acceptance_rate": metrics["acceptance_rate"], "rounds": metrics["rounds"], "turns": len(records),
            "new_tokens": sum(r["new_tokens"] for r in records)}


def _tau_table(plans, sets, work) -> dict:
    """{drafter: {verify_len, sets: {set: row}, domains: {domain: macro τ}, macro}} for the given plans."""
    table = {}
    for plan in plans:
        rows = {s: _set_row(_records(work, plan, s, items)) for s, items in sets.items()}
        domains = {}
        for s, row in rows.items():
            domains.setdefault(domain_of(s), []).append(row["tau"])
        domain_tau = {d: macro_mean(v) for d, v in domains.items()}
        table[plan.name] = {"verify_len": plan.verify_len, "sets": rows, "domains": domain_tau,
                            "macro": macro_mean(domain_tau.values())}
    return table


def _by_domain(plan, sets, work) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s, items in sets.items():
        out.setdefault(domain_of(s), []).extend(_records(work, plan, s, items))
    out["all"] = [r for d in list(out) for r in out[d]]
    return out


def _position_acceptance(plan, sets, work) -> dict:
    result = {}
    for domain, records in _by_domain(plan, sets, work).items():
        metrics = position_metrics(_rounds(records), plan.verify_len)  # the `position_acceptance` evaluate metric
        result[domain] = {"p": metrics["conditional_acceptance"], "reached": metrics["reached"]}
    return result


def _confidence_rows(records: list[dict]) -> tuple[list[list[int]], torch.Tensor | None, list[int]]:
    """(rounds, confidence logits `[N, γ]`, prompt index of each round), or logits None if not recorded."""
    if not records or any(r.get("confidence_logits") is None for r in records):
        return [], None, []
    rounds, logits, prompts = [], [], []
    for record in records:
        rounds += record["rounds"]
        logits += record["confidence_logits"]
        prompts += [record["prompt"]] * len(record["rounds"])
    return rounds, (torch.tensor(logits, dtype=torch.float64) if logits else None), prompts


def stored_temperatures(drafter, greedy: bool) -> list[float] | None:
    """The drafter's STS temperatures for this decoding mode, or None when it stores none (all 1.0)."""
    config = drafter.config
    if greedy and getattr(config, "calibration_temperatures_greedy", None):
        return list(config.calibration_temperatures_greedy)
    temps = list(getattr(config, "calibration_temperatures", None) or [])
    return temps if temps and any(abs(t - 1.0) > 1e-9 for t in temps) else None


def _threshold_section(plan, sets, work, temperatures) -> dict | None:
    result = {}
    for domain, records in _by_domain(plan, sets, work).items():
        rounds, logits, _ = _confidence_rows(records)
        if logits is None:
            return None
        result[domain] = threshold_sweep(rounds, survival_from_logits(logits, temperatures), DEFAULT_THRESHOLDS)
    return result


def calibration_section(rounds, logits, prompts, block_size: int, stored: list[float] | None, greedy: bool):
    """(JSON dict, reliability arrays or None): per-position ECE/AUC before and after STS.

    Uses the stored temperatures when there are any; otherwise fits STS on the rounds of even-numbered prompts
    and evaluates on the odd ones (alternate rounds when one side is empty). Only complete rounds count.
    """
    mode = "greedy" if greedy else "sampling"
    complete, survived = survival_labels(rounds, block_size)
    logits = logits[:, :block_size]
    index = torch.nonzero(complete).reshape(-1)
    if index.numel() < 2:
        return {"skipped": "fewer than 2 complete rounds (ℓ = γ, not ended by EOS)"}, None
    if stored is not None:
        fit_rows, eval_rows, temps, source = index, index, stored[:block_size], "stored in the drafter config"
    else:
        even = torch.tensor([prompts[i] % 2 == 0 for i in index.tolist()])
        fit_rows, eval_rows = index[even], index[~even]
        source = "fitted with STS on even-numbered prompts, evaluated on odd-numbered ones"
        if fit_rows.numel() == 0 or eval_rows.numel() == 0:
            fit_rows, eval_rows = index[0::2], index[1::2]
            source = "fitted with STS on alternate rounds, evaluated on the others"
        temps = fit_sts(logits[fit_rows], survived[fit_rows])
    report = evaluate_calibration(logits[eval_rows], survived[eval_rows], temps, mode=mode)
    payload = {"temperatures_source": source, "fit_rounds": int(fit_rows.numel()), **report.to_dict()}
    arrays = (survival_from_logits(logits[eval_rows]), survival_from_logits(logits[eval_rows], temps),
              survived[eval_rows])
    return payload, arrays


def _sweep_section(plans, sets, work, skipped, gammas) -> dict:
    results: dict[str, dict] = {}
    for plan in plans:
        if plan.verify_len in gammas:
            row = _tau_table([plan], sets, work)[plan.name]
            results.setdefault(plan.name, {})[str(plan.verify_len)] = {
                "sets": {s: v["tau"] for s, v in row["sets"].items()}, "domains": row["domains"],
                "macro": row["macro"]}
    return {"gammas": list(gammas), "results": results, "skipped": skipped}


def build_report(config, plans, skipped, sets, work, wall_seconds: float = 0.0, arrays: dict | None = None) -> dict:
    """The JSON report (README.md, "Offline accepted length", lists every field).

    `arrays`, when given, receives per drafter the (survival before STS, after STS, realised survival) tensors of
    the calibration rounds, for the reliability diagrams.
    """
    main = [p for p in plans if p.role == "main"]
    report = {
        "sets": {s: {"domain": domain_of(s), "prompts": len(items)} for s, items in sets.items()},
        "drafters": {},
        "table": _tau_table(main, sets, work),
        "position_acceptance": {},
        "length_sweep": _sweep_section(plans, sets, work, skipped, config.sweep_gammas),
        "threshold_sweep": {},
        "calibration": {},
        "wall_seconds": wall_seconds,
    }
    for plan in main:
        drafter = plan.drafter
        stored = stored_temperatures(drafter, config.greedy)
        report["drafters"][plan.name] = {
            "block_size": drafter.config.block_size, "verify_len": plan.verify_len,
            "head_type": drafter.config.head_type, "kind": type(drafter).__name__,
            "stored_temperatures": stored, "path": getattr(drafter, "eval_source", None)}
        report["position_acceptance"][plan.name] = _position_acceptance(plan, sets, work)
        sweep = _threshold_section(plan, sets, work, stored)
        report["threshold_sweep"][plan.name] = sweep or {"skipped": "no confidence head"}
        all_records = _by_domain(plan, sets, work)["all"]
        rounds, logits, prompts = _confidence_rows(all_records)
        if logits is None:
            report["calibration"][plan.name] = {"skipped": "no confidence head"}
            continue
        payload, data = calibration_section(rounds, logits, prompts, plan.verify_len, stored, config.greedy)
        report["calibration"][plan.name] = payload
        if arrays is not None and data is not None:
            arrays[plan.name] = data
    return report


def _clean(value):
    """NaN/inf -> None, recursively (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_report(report: dict, out: str | os.PathLike, arrays: dict | None = None) -> dict:
    """Write the figures (`<stem>_*.png`) and the JSON report (atomically) at `out`; returns the cleaned report."""
    from .plots import write_figures

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = _clean(report)
    report.setdefault("provenance", result_provenance())
    report["figures"] = write_figures(report, path, arrays or {})
    write_json_atomic(path, report, allow_nan=False, ensure_ascii=False)
    return report


def format_table(report: dict) -> str:
    """Plain-text τ table: one row per drafter, one column per set, then the domain macro averages."""
    sets = list(report["sets"])
    domains = sorted({v["domain"] for v in report["sets"].values()})
    header = ["drafter", "ℓ", *sets, *(f"{d} avg" for d in domains), "macro"]
    lines = [header]
    for name, row in report["table"].items():
        cells = [row["sets"][s]["tau"] for s in sets] + [row["domains"].get(d) for d in domains] + [row["macro"]]
        lines.append([name, str(row["verify_len"]), *("-" if v is None else f"{v:.2f}" for v in cells)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
                     for line in lines)
