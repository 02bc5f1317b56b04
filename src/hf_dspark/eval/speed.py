"""Batch-1 wall-clock benchmark: plain generate, prompt lookup, the DFlash-style baseline, DSpark at fixed γ and
DSpark with the load-aware scheduler (and the oracle ceiling).

Every method runs on the same prompts in one process, interleaved within each repeat so machine noise hits all
of them alike; the report gives median tokens/s per method and the median of per-prompt paired ratios to plain.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..io_utils import check_replaceable, write_json_atomic
from ..provenance import result_provenance
from .oracle import oracle_for
from .prompts import chat_input_ids, check_prompt_files, load_prompt_set

logger = logging.get_logger(__name__)

SPEED_REPORT_KEYS = ("config", "cpu_count", "results", "runs")  # of every speed report (`summarise`), no serve report


@dataclass
class SpeedConfig:
    """Args:
    prompt_files: JSONL prompt sets (first user turn of each item is used).
    num_prompts: prompts per set.
    max_new_tokens: tokens generated per run.
    repeats: timed repeats per (prompt, method) after one warm-up.
    block_sizes: γ values for the oracle ceiling.
    threads: torch threads (pinned for the whole run).
    drafter: path of a trained drafter, or None for the shipped default (skipped when none ships).
    baseline: path of the DFlash-style baseline drafter (method "dflash"), or None for the shipped one.
    scheduler: verification policy of the extra method `dspark_<scheduler>` (needs a confidence head; load-aware
        policies read the target's step curve); None skips it.
    prompt_lookup_tokens: `prompt_lookup_num_tokens` of the prompt-lookup baseline.
    auto: also run the cost-aware policy (`dspark_auto`, and `oracle_g<γ>_auto` beside every oracle).
    untrained: also run an untrained drafter of the trained one's architecture, fixed ℓ = γ and auto
        (`untrained`, `untrained_auto`): the worst case a default policy must survive.
    unpacked: also run the DSpark drafter, fixed ℓ = γ and auto, with `dspark_packed_weights=False`
        (`dspark_unpacked`, `dspark_auto_unpacked`): what verifying on packed weights gives, side by side.
    out: JSON result path (a PNG plot is written beside it). An existing file there must be an earlier speed report
        (it is replaced) unless `overwrite`.
    overwrite: replace an existing `out` that is not an `hf-dspark bench speed` report.
    """

    prompt_files: list[str] = field(default_factory=list)
    num_prompts: int = 3
    max_new_tokens: int = 96
    repeats: int = 3
    block_sizes: list[int] = field(default_factory=lambda: [4, 8, 16])
    threads: int = 1
    drafter: str | None = None
    baseline: str | None = None
    scheduler: str | None = "lagged_padded"
    prompt_lookup_tokens: int = 10
    auto: bool = True
    untrained: bool = False
    unpacked: bool = False
    out: str = "benchmarks/results/speed.json"
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_prompt_files(self.prompt_files)
        if self.num_prompts < 1 or self.repeats < 1 or self.max_new_tokens < 1:
            raise ValueError("num_prompts, repeats and max_new_tokens must be >= 1")
        check_replaceable(self.out, SPEED_REPORT_KEYS, "an hf-dspark bench speed report", self.overwrite)


def timed(fn) -> tuple[float, torch.Tensor]:
    """(wall seconds of `fn()`, its result)."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _generate(target, input_ids, drafter, common, **policy):
    return lambda: target.generate(input_ids, assistant_model=drafter, **policy, **common)


def _methods(target, input_ids, reference, config: SpeedConfig, drafter, baseline=None, step_curve=None,
             untrained=None):
    mask = torch.ones_like(input_ids)
    common = dict(do_sample=False, max_new_tokens=config.max_new_tokens, min_new_tokens=config.max_new_tokens)
    curve = {"dspark_step_curve": step_curve} if step_curve is not None else {}
    methods = {
        "plain": (lambda: target.generate(input_ids, **common), None),
        "prompt_lookup": (
            lambda: target.generate(input_ids, prompt_lookup_num_tokens=config.prompt_lookup_tokens, **common),
            None,
        ),
    }
    if baseline is not None:
        methods["dflash"] = (_generate(target, input_ids, baseline, common, dspark_policy="fixed"), baseline)
    if drafter is not None:
        methods["dspark"] = (_generate(target, input_ids, drafter, common, dspark_policy="fixed"), drafter)
        if config.scheduler and drafter.confidence_head is not None:
            methods[f"dspark_{config.scheduler}"] = (
                _generate(target, input_ids, drafter, common, dspark_policy=config.scheduler, **curve), drafter
            )
        if config.auto:
            methods["dspark_auto"] = (_generate(target, input_ids, drafter, common, dspark_policy="auto", **curve),
                                      drafter)
        if config.unpacked:
            off = dict(dspark_packed_weights=False)
            methods["dspark_unpacked"] = (_generate(target, input_ids, drafter, common, dspark_policy="fixed", **off),
                                          drafter)
            methods["dspark_auto_unpacked"] = (
                _generate(target, input_ids, drafter, common, dspark_policy="auto", **off), drafter)
    if untrained is not None:
        methods["untrained"] = (_generate(target, input_ids, untrained, common, dspark_policy="fixed"), untrained)
        methods["untrained_auto"] = (
            _generate(target, input_ids, untrained, common, dspark_policy="auto", **curve), untrained
        )
    for gamma in config.block_sizes:
        oracle = oracle_for(target, gamma, reference, mask)
        methods[f"oracle_g{gamma}"] = (_generate(target, input_ids, oracle, common, dspark_policy="fixed"), oracle)
        if config.auto:
            methods[f"oracle_g{gamma}_auto"] = (
                _generate(target, input_ids, oracle, common, dspark_policy="auto", **curve), oracle
            )
    return methods


def run_speed_benchmark(config: SpeedConfig, target, tokenizer, drafter=None, baseline=None, step_curve=None) -> dict:
    """Run the benchmark; returns (and writes) the JSON report. `step_curve` overrides the scheduler's curve."""
    torch.set_num_threads(config.threads)
    untrained = None
    if config.untrained and drafter is not None:
        from ..modeling_dspark import DSparkDrafter

        torch.manual_seed(0)
        untrained = DSparkDrafter(drafter.config).eval().bind_target(target)
    rows: list[dict] = []
    for path in config.prompt_files:
        set_name = Path(path).stem
        prompts = load_prompt_set(path)[: config.num_prompts]
        for index, item in enumerate(tqdm(prompts, desc=f"speed {set_name}")):
            input_ids = chat_input_ids(tokenizer, [item["turns"][0]]).to(target.device)
            common = dict(do_sample=False, max_new_tokens=config.max_new_tokens, min_new_tokens=config.max_new_tokens)
            reference = target.generate(input_ids, **common)  # warm-up and the oracle's reference
            methods = _methods(target, input_ids, reference, config, drafter, baseline, step_curve, untrained)
            for fn, _ in methods.values():  # warm-up every method once
                fn()
            for repeat in range(config.repeats):
                for name, (fn, owner) in methods.items():
                    seconds, out = timed(fn)
                    new = out.shape[1] - input_ids.shape[1]
                    stats = owner.last_generation_stats if owner is not None else None
                    rows.append(dict(set=set_name, prompt=index, repeat=repeat, method=name, seconds=seconds,
                                     new_tokens=new, tokens_per_second=new / seconds,
                                     accepted_length=stats.mean_accepted_length if stats else None,
                                     policy_seconds=stats.policy_seconds if stats else None,
                                     skipped_rounds=stats.skipped_rounds if stats else None,
                                     rounds=stats.rounds if stats else None,
                                     identical=bool(torch.equal(out, reference))))
    report = summarise(rows, config)
    _write(report, config.out)
    return report


def _method_order(name: str) -> tuple[int, int, str]:
    order = {"plain": 0, "prompt_lookup": 1, "dflash": 2, "dspark": 3, "untrained": 5, "untrained_auto": 6}
    if name in order:
        return order[name], 0, name
    if name.startswith("dspark_"):
        return 4, 0, name
    gamma = name.split("_g", 1)[1].split("_", 1)[0] if "_g" in name else "0"
    return 7, int(gamma), name


def _policy_summary(runs: list[dict]) -> dict[str, float]:
    """Share of rounds decoded plainly and the policy's decisions as a share of the generation time."""
    rounds = sum(r.get("rounds") or 0 for r in runs)
    if not rounds:
        return {}
    return {"skipped_round_fraction": sum(r["skipped_rounds"] for r in runs) / rounds,
            "policy_share_of_time": sum(r["policy_seconds"] for r in runs) / sum(r["seconds"] for r in runs)}


def summarise(rows: list[dict], config: SpeedConfig) -> dict:
    methods = sorted({r["method"] for r in rows}, key=_method_order)
    sets = sorted({r["set"] for r in rows})
    table: dict[str, dict[str, dict[str, float]]] = {}
    for set_name in sets:
        table[set_name] = {}
        base = {(r["prompt"], r["repeat"]): r["tokens_per_second"] for r in rows
                if r["set"] == set_name and r["method"] == "plain"}
        for method in methods:
            mine = [r for r in rows if r["set"] == set_name and r["method"] == method]
            ratios = [r["tokens_per_second"] / base[(r["prompt"], r["repeat"])] for r in mine]
            taus = [r["accepted_length"] for r in mine if r["accepted_length"] is not None]
            table[set_name][method] = {
                "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in mine),
                "mean_accepted_length": statistics.mean(taus) if taus else None,
                "median_ratio_to_plain": statistics.median(ratios),
                "all_outputs_identical_to_plain": all(r["identical"] for r in mine),
                **_policy_summary(mine),
            }
    return {"config": asdict(config), "torch_threads": config.threads, "cpu_count": os.cpu_count(),
            "results": table, "runs": rows}


def _write(report: dict, out: str) -> None:
    """Write the report (with its provenance record, added in place) and its plot."""
    report.setdefault("provenance", result_provenance())
    path = Path(out)
    write_json_atomic(path, report)
    plot_speed(report, path.with_suffix(".png"))


def plot_speed(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = report["results"]
    sets = list(table)
    methods = list(next(iter(table.values())))
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(methods) * len(sets) / 2, 3.6))
    width = 0.8 / len(sets)
    for i, set_name in enumerate(sets):
        values = [table[set_name][m]["median_ratio_to_plain"] for m in methods]
        ax.bar([x + i * width for x in range(len(methods))], values, width, label=set_name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(sets) - 1) / 2 for x in range(len(methods))], methods, rotation=30, ha="right")
    ax.set_ylabel("speed vs plain generate (median ratio)")
    ax.set_title(f"batch-1 greedy, {report['torch_threads']} thread(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
