"""Batch-1 wall-clock benchmark: plain generate, transformers' prompt lookup (`prompt_lookup_num_tokens`), the
DFlash-style baseline, DSpark at fixed γ, with a scheduler policy and with "auto", the hybrid drafter (DSpark or
prompt lookup chosen per round, `hybrid_for`) at fixed γ and with "auto", and the oracle ceiling.

Every method runs on the same prompts in one process, interleaved with plain within each repeat so machine noise
hits all of them alike; every output is compared with plain greedy's. The report gives median tokens/s per method,
the median of the per-prompt paired ratios to plain with their interquartile range, and a macro ratio over sets.
Methods with "auto" keep one `PolicyMemory` each across the whole run, so they learn across prompts as a server
would.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..generation import oracle_for
from ..io_utils import check_replaceable, write_json_atomic
from ..provenance import processor_kind, result_provenance
from ..scheduling import PolicyMemory
from .prompts import chat_input_ids, check_prompt_files, load_prompt_set

logger = logging.get_logger(__name__)

SPEED_REPORT_KEYS = ("config", "cpu_count", "results", "runs")  # of every speed report (`summarise`), no serve report
# what `methods` may select ("scheduler": dspark_<scheduler>; "oracle": every oracle_g<γ>[_auto]); plain always runs
SPEED_METHOD_CHOICES = (
    "prompt_lookup",
    "lookup",
    "dflash",
    "dspark",
    "scheduler",
    "dspark_auto",
    "hybrid",
    "hybrid_auto",
    "dspark_tree",
    "hybrid_tree",
    "oracle",
)
DEFAULT_SPEED_METHODS = (
    "prompt_lookup",
    "dflash",
    "dspark",
    "scheduler",
    "dspark_auto",
    "hybrid",
    "hybrid_auto",
    "oracle",
)


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
    methods: what runs beside plain (`SPEED_METHOD_CHOICES`): prompt_lookup (transformers'
        `prompt_lookup_num_tokens`), lookup (this package's `PromptLookupProposer` in the DSpark loop, ℓ = γ),
        dflash, dspark (ℓ = γ), scheduler (`dspark_<scheduler>`), dspark_auto, hybrid (the DSpark drafter and
        prompt lookup chosen per row and round, ℓ = γ), hybrid_auto (the hybrid with "auto"), dspark_tree and
        hybrid_tree (draft trees of `tree_budget` nodes a round, `dspark_tree_budget`; with `auto` also
        `*_tree_auto`, "auto" sizing the trees up to it), oracle. Methods that need a drafter are skipped without
        one; `auto`, `untrained` and `unpacked` still add their runs.
    tree_budget: nodes per round (the anchor included) of the tree methods (≥ 2).
    out: JSON result path (default `benchmarks/results/<processor kind>/speed.json`, this CPU's kind; a PNG plot is
        written beside it). An existing file there must be an earlier speed report (it is replaced) unless
        `overwrite`.
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
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_SPEED_METHODS))
    tree_budget: int = 16
    out: str = field(default_factory=lambda: f"benchmarks/results/{processor_kind()}/speed.json")
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_prompt_files(self.prompt_files)
        if self.num_prompts < 1 or self.repeats < 1 or self.max_new_tokens < 1:
            raise ValueError("num_prompts, repeats and max_new_tokens must be >= 1")
        unknown = [m for m in self.methods if m not in SPEED_METHOD_CHOICES]
        if unknown:
            raise ValueError(f"unknown speed methods {unknown}; choose from {list(SPEED_METHOD_CHOICES)}")
        if type(self.tree_budget) is not int or self.tree_budget < 2:
            raise ValueError(f"tree_budget must be an int >= 2 (nodes a round, the anchor included), got "
                             f"{self.tree_budget!r}")
        check_replaceable(self.out, SPEED_REPORT_KEYS, "an hf-dspark bench speed report", self.overwrite)


def timed(fn) -> tuple[float, torch.Tensor]:
    """(wall seconds of `fn()`, its result)."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


@dataclass
class SpeedDrafters:
    """The drafters of one run: the DSpark drafter, the DFlash-style baseline, an untrained drafter, the hybrid of
    the DSpark drafter with prompt lookup and this package's prompt-lookup proposer (each None when not run)."""

    drafter: Any = None
    baseline: Any = None
    untrained: Any = None
    hybrid: Any = None
    lookup: Any = None


def speed_drafters(config: SpeedConfig, target, drafter=None, baseline=None) -> SpeedDrafters:
    """The `SpeedDrafters` that `config` asks for, built around `drafter` (bound to `target`)."""
    from ..generation import prompt_lookup_for
    from ..proposers import hybrid_for

    untrained = hybrid = None
    if config.untrained and drafter is not None:
        from ..drafter import DSparkDrafter

        torch.manual_seed(0)
        untrained = DSparkDrafter(drafter.config).eval().bind_target(target)
    if drafter is not None and {"hybrid", "hybrid_auto", "hybrid_tree"} & set(config.methods):
        hybrid = hybrid_for(drafter, "prompt-lookup")
    lookup = None
    if "lookup" in config.methods:
        lookup = prompt_lookup_for(target, drafter.config.block_size if drafter is not None else 7)
    return SpeedDrafters(drafter, baseline, untrained, hybrid, lookup)


def selected(name: str, config: SpeedConfig) -> bool:
    """Whether method `name` runs under `config.methods` (plain always; untrained / unpacked follow their flags)."""
    if name == "plain" or name.startswith("untrained") or name.endswith("_unpacked"):
        return True
    if name.startswith("oracle_g"):
        return "oracle" in config.methods
    if name.endswith("_tree_auto"):
        return name.removesuffix("_auto") in config.methods
    if config.scheduler and name == f"dspark_{config.scheduler}" and name != "dspark_auto":
        return "scheduler" in config.methods
    return name in config.methods


class _MethodBuilder:
    """`generate` closures of one prompt: (fn, drafter or None) per method; "auto" ones share `memories[name]`."""

    def __init__(self, target, input_ids, config: SpeedConfig, memories: dict, step_curve=None) -> None:
        self.target, self.input_ids, self.memories = target, input_ids, memories
        self.common = dict(do_sample=False, max_new_tokens=config.max_new_tokens, min_new_tokens=config.max_new_tokens)
        self.curve = {"dspark_step_curve": step_curve} if step_curve is not None else {}

    def run(self, drafter, **options):
        return lambda: self.target.generate(self.input_ids, assistant_model=drafter, **options, **self.common), drafter

    def fixed(self, drafter, **options):
        return self.run(drafter, dspark_policy="fixed", **options)

    def policy(self, drafter, policy: str):
        return self.run(drafter, dspark_policy=policy, **self.curve)

    def auto(self, name: str, drafter, **options):
        memory = self.memories.setdefault(name, PolicyMemory())
        return self.run(drafter, dspark_policy="auto", dspark_policy_memory=memory, **self.curve, **options)

    def plain(self, **options):
        return lambda: self.target.generate(self.input_ids, **options, **self.common), None

    def tree(self, drafter, budget: int, auto: str | None = None):
        """A draft-tree method (fixed policy, or "auto" sharing `memories[auto]`). min_new_tokens = max_new_tokens
        bans EOS at every position; said as `suppress_tokens` (the same scores), which, unlike the length floor,
        is the same on every branch, so trees can run."""
        eos = self.target.generation_config.eos_token_id
        common = {**self.common, "dspark_tree_budget": budget}
        if eos is not None:
            common.update(min_new_tokens=None, suppress_tokens=[eos] if isinstance(eos, int) else list(eos))
        policy = dict(dspark_policy="fixed")
        if auto is not None:
            memory = self.memories.setdefault(auto, PolicyMemory())
            policy = dict(dspark_policy="auto", dspark_policy_memory=memory, **self.curve)
        return lambda: self.target.generate(self.input_ids, assistant_model=drafter, **policy, **common), drafter


def _methods(build: _MethodBuilder, reference, config: SpeedConfig, drafters: SpeedDrafters) -> dict:
    """Every method of one prompt that `config` selects, in run order: name -> (fn, drafter or None)."""
    methods = {
        "plain": build.plain(),
        "prompt_lookup": build.plain(prompt_lookup_num_tokens=config.prompt_lookup_tokens),
    }
    if drafters.lookup is not None:
        methods["lookup"] = build.fixed(drafters.lookup)
    if drafters.baseline is not None:
        methods["dflash"] = build.fixed(drafters.baseline)
    drafter = drafters.drafter
    if drafter is not None:
        methods["dspark"] = build.fixed(drafter)
        if config.scheduler and drafter.confidence_head is not None:
            methods[f"dspark_{config.scheduler}"] = build.policy(drafter, config.scheduler)
        if config.auto:
            methods["dspark_auto"] = build.auto("dspark_auto", drafter)
        if config.unpacked:
            methods["dspark_unpacked"] = build.fixed(drafter, dspark_packed_weights=False)
            methods["dspark_auto_unpacked"] = build.auto("dspark_auto_unpacked", drafter, dspark_packed_weights=False)
    if drafters.hybrid is not None:
        methods["hybrid"] = build.fixed(drafters.hybrid)
        methods["hybrid_auto"] = build.auto("hybrid_auto", drafters.hybrid)
    trees = {"dspark": drafter, "hybrid": drafters.hybrid}
    for kind, owner in trees.items():  # draft trees: a fixed node budget, and "auto" sizing them up to it
        if owner is not None and f"{kind}_tree" in config.methods:
            methods[f"{kind}_tree"] = build.tree(owner, config.tree_budget)
            if config.auto:
                methods[f"{kind}_tree_auto"] = build.tree(owner, config.tree_budget, f"{kind}_tree_auto")
    if drafters.untrained is not None:
        methods["untrained"] = build.fixed(drafters.untrained)
        methods["untrained_auto"] = build.auto("untrained_auto", drafters.untrained)
    if "oracle" in config.methods:
        mask = torch.ones_like(build.input_ids)
        for gamma in config.block_sizes:
            oracle = oracle_for(build.target, gamma, reference, mask)
            methods[f"oracle_g{gamma}"] = build.fixed(oracle)
            if config.auto:
                methods[f"oracle_g{gamma}_auto"] = build.auto(f"oracle_g{gamma}_auto", oracle)
    return {name: method for name, method in methods.items() if selected(name, config)}


def _timed_row(fn, owner, input_ids, reference) -> dict:
    """One timed run: seconds, tokens/s, the drafter's statistics and whether the output equals plain greedy's."""
    counts = list(getattr(owner, "source_counts", ()) or ())
    seconds, out = timed(fn)
    new = out.shape[1] - input_ids.shape[1]
    stats = owner.last_generation_stats if owner is not None else None
    row = dict(
        seconds=seconds,
        new_tokens=new,
        tokens_per_second=new / seconds,
        accepted_length=stats.mean_accepted_length if stats else None,
        policy_seconds=stats.policy_seconds if stats else None,
        skipped_rounds=stats.skipped_rounds if stats else None,
        rounds=stats.rounds if stats else None,
        identical=bool(torch.equal(out, reference)),
    )
    if stats is not None and stats.tree_nodes:  # tree methods: drafts verified per round (τ's price)
        row["mean_tree_nodes"] = stats.mean_tree_nodes
    if counts:  # the hybrid: the share of its row-proposals that came from prompt lookup
        dspark, lookup = (after - before for after, before in zip(owner.source_counts, counts))
        row["lookup_share"] = lookup / max(dspark + lookup, 1)
    return row


def run_speed_benchmark(config: SpeedConfig, target, tokenizer, drafter=None, baseline=None, step_curve=None) -> dict:
    """Run the benchmark; returns (and writes) the JSON report. `step_curve` overrides the scheduler's curve."""
    torch.set_num_threads(config.threads)
    drafters = speed_drafters(config, target, drafter, baseline)
    memories: dict[str, PolicyMemory] = {}  # one per "auto" method, shared across every prompt and set
    rows: list[dict] = []
    for path in config.prompt_files:
        set_name = Path(path).stem
        prompts = load_prompt_set(path)[: config.num_prompts]
        for index, item in enumerate(tqdm(prompts, desc=f"speed {set_name}")):
            input_ids = chat_input_ids(tokenizer, [item["turns"][0]]).to(target.device)
            build = _MethodBuilder(target, input_ids, config, memories, step_curve)
            reference = build.plain()[0]()  # warm-up and the oracle's reference
            methods = _methods(build, reference, config, drafters)
            for fn, _ in methods.values():  # warm-up every method once
                fn()
            for repeat in range(config.repeats):
                for name, (fn, owner) in methods.items():
                    rows.append(
                        dict(
                            set=set_name,
                            prompt=index,
                            repeat=repeat,
                            method=name,
                            **_timed_row(fn, owner, input_ids, reference),
                        )
                    )
    report = summarise(rows, config)
    _write(report, config.out)
    return report


def _method_order(name: str) -> tuple[int, int, str]:
    order = {
        "plain": 0,
        "prompt_lookup": 1,
        "lookup": 2,
        "dflash": 3,
        "dspark": 4,
        "hybrid": 6,
        "hybrid_auto": 7,
        "dspark_tree": 7,
        "dspark_tree_auto": 7,
        "hybrid_tree": 7,
        "hybrid_tree_auto": 7,
        "untrained": 8,
        "untrained_auto": 9,
    }
    if name in order:
        return order[name], 0, name
    if name.startswith("dspark_"):
        return 5, 0, name
    gamma = name.split("_g", 1)[1].split("_", 1)[0] if "_g" in name else "0"
    return 10, int(gamma), name


def _policy_summary(runs: list[dict]) -> dict[str, float]:
    """Share of rounds decoded plainly and the policy's decisions as a share of the generation time."""
    rounds = sum(r.get("rounds") or 0 for r in runs)
    if not rounds:
        return {}
    return {
        "skipped_round_fraction": sum(r["skipped_rounds"] for r in runs) / rounds,
        "policy_share_of_time": sum(r["policy_seconds"] for r in runs) / sum(r["seconds"] for r in runs),
    }


def ratio_spread(ratios: list[float]) -> dict:
    """The median of paired ratios with its spread: interquartile range [q1, q3], min, max and the pair count."""
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {
        "median_ratio_to_plain": statistics.median(ratios),
        "ratio_interquartile_range": [q1, q3],
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "pairs": len(ratios),
    }


def _method_summary(mine: list[dict], base: dict) -> dict:
    """One (set, method) cell: median tokens/s, τ, paired ratios to plain with spread, identity, policy shares."""
    ratios = [r["tokens_per_second"] / base[(r["prompt"], r["repeat"])] for r in mine]
    taus = [r["accepted_length"] for r in mine if r["accepted_length"] is not None]
    shares = [r["lookup_share"] for r in mine if "lookup_share" in r]
    nodes = [r["mean_tree_nodes"] for r in mine if "mean_tree_nodes" in r]
    cell = {
        "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in mine),
        "mean_accepted_length": statistics.mean(taus) if taus else None,
        **ratio_spread(ratios),
        "all_outputs_identical_to_plain": all(r["identical"] for r in mine),
        **_policy_summary(mine),
    }
    if shares:
        cell["lookup_share"] = statistics.mean(shares)
    if nodes:
        cell["mean_tree_nodes"] = statistics.mean(nodes)
    return cell


def summarise(rows: list[dict], config: SpeedConfig) -> dict:
    """The report: per set and method a `_method_summary` cell, and per method the macro (mean over sets) of the
    median paired ratios to plain, with whether every set's outputs were identical."""
    methods = sorted({r["method"] for r in rows}, key=_method_order)
    sets = sorted({r["set"] for r in rows})
    table: dict[str, dict[str, dict]] = {}
    for set_name in sets:
        base = {
            (r["prompt"], r["repeat"]): r["tokens_per_second"]
            for r in rows
            if r["set"] == set_name and r["method"] == "plain"
        }
        table[set_name] = {
            method: _method_summary([r for r in rows if r["set"] == set_name and r["method"] == method], base)
            for method in methods
        }
    macro = {
        method: {
            "mean_of_median_ratios_to_plain": statistics.mean(table[s][method]["median_ratio_to_plain"] for s in sets),
            "all_outputs_identical_to_plain": all(table[s][method]["all_outputs_identical_to_plain"] for s in sets),
        }
        for method in methods
        if all(method in table[s] for s in sets)
    }
    return {
        "config": asdict(config),
        "torch_threads": config.threads,
        "cpu_count": os.cpu_count(),
        "results": table,
        "macro": macro,
        "runs": rows,
    }


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
