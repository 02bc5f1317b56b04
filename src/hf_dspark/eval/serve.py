"""Serving-load benchmark: closed-loop clients (or Poisson arrivals) on `DSparkEngine`, per verification policy.

For each concurrency C and policy, C clients keep one request in flight each until `requests_per_level`
requests have finished (closed loop), or requests arrive at `arrival_rate` per second (Poisson). Reported per
(policy, C): aggregate tokens/s (all generated tokens / wall time), per-user tokens/s (mean over requests of
tokens / (finish − admission)), and the mean verification budget ℓ per request per round (with draft trees,
`tree_budget`, also the mean drafts verified per request per round: a tree's nodes). Plots: the
throughput vs per-user speed frontier (paper Fig. 7) and the mean budget vs load (Fig. 8).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..io_utils import check_replaceable, write_json_atomic
from ..provenance import processor_kind, result_provenance
from ..scheduling import NO_SPECULATION, PolicyMemory, available_policies, canonical_policy_name, get_policy
from ..scheduling.verification_policy import VerificationPolicy
from ..serving.engine import DSparkEngine

POLICY_NAMES = (NO_SPECULATION, "fixed1", "fixed", "threshold", "lagged_padded", "auto")
SERVE_REPORT_KEYS = ("config", "drafter", "block_size", "results")  # of every serve report, older ones included


@dataclass
class ServeConfig:
    """Args:
    concurrency: client counts C to measure.
    policies: subset of none | fixed1 (ℓ = 1, MTP-1-like) | fixed (ℓ = γ) | threshold | lagged_padded (the
        lagged-capacity rule under the padded batch's cost; the old spelling "scheduler" is deprecated) | auto
        (cost-aware: the drafter's cost counted, plain-decoding rounds when drafting does not pay; the default), or
        any other registered policy (`hf_dspark.scheduling.available_policies()`).
    requests_per_level: finished requests per (policy, C) (at least C).
    max_new_tokens: tokens per request.
    arrival_rate: requests/s for Poisson arrivals instead of closed-loop clients (None = closed loop).
    threshold: survival threshold of the `threshold` policy (None: the policy's default).
    threads: torch threads (pinned).
    repeats: interleaved passes over the policies at each C (each pass serves `requests_per_level` requests per
        policy); a (policy, C) result is the median over passes and its ratio to plain the median of the per-pass
        ratios, which a shared machine's load drifts disturb less than one long pass.
    seed: prompt order and arrivals.
    out: JSON path (default `benchmarks/results/<processor kind>/serve.json`, this CPU's kind; PNGs beside it). An
        existing file there must be an earlier serve report (it is replaced) unless `overwrite`.
    overwrite: replace an existing `out` that is not an `hf-dspark bench serve` report.
    tree_budget: every drafting policy verifies draft trees of at most this many nodes a round (the engine's
        `tree_budget`; "auto" sizes them by cost up to it, the others verify it whole), or None for chains.
    """

    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    policies: list[str] = field(default_factory=lambda: list(POLICY_NAMES))
    requests_per_level: int = 16
    max_new_tokens: int = 48
    arrival_rate: float | None = None
    threshold: float | None = None
    threads: int = 2
    repeats: int = 1
    seed: int = 0
    out: str = field(default_factory=lambda: f"benchmarks/results/{processor_kind()}/serve.json")
    overwrite: bool = False
    tree_budget: int | None = None

    def __post_init__(self) -> None:
        self.policies = [p if p in ("fixed1",) else canonical_policy_name(p) for p in self.policies]
        choices = (NO_SPECULATION, "fixed1", *available_policies())
        unknown = [p for p in self.policies if p not in choices]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {list(choices)}")
        if any(c < 1 for c in self.concurrency) or self.requests_per_level < 1 or self.repeats < 1:
            raise ValueError("concurrency levels, requests_per_level and repeats must be >= 1")
        if self.tree_budget is not None and (type(self.tree_budget) is not int or self.tree_budget < 2):
            raise ValueError(f"tree_budget must be None (chains) or an int >= 2, got {self.tree_budget!r}")
        check_replaceable(self.out, SERVE_REPORT_KEYS, "an hf-dspark bench serve report", self.overwrite)


def make_policy(
    name: str,
    block_size: int,
    step_curve,
    threshold: float | None,
    draft_curve=None,
    memory_key=None,
    greedy: bool = True,
    acceptance_prior: list[float] | None = None,
    memory: PolicyMemory | None = None,
) -> VerificationPolicy | str:
    """The engine policy for a benchmark name: a registered policy, or `fixed1` (`fixed` at ℓ = 1). A policy that
    learns (`auto`) keeps its pooled acceptance in `memory` (one per benchmark run), so load levels after the first
    start from what earlier levels observed, like a long-running server; None starts every level from nothing. It
    starts from the held-out acceptance of `memory_key` (the drafter) for the decoding mode (`greedy`) unless
    `acceptance_prior` gives other rates."""
    if name == NO_SPECULATION:
        return NO_SPECULATION
    return VerificationPolicy(
        _policy_of(name),
        block_size=block_size,
        verify_len=1 if name == "fixed1" else None,
        threshold=threshold,
        step_curve=step_curve,
        draft_curve=draft_curve,
        memory_key=memory_key,
        greedy=greedy,
        acceptance_prior=acceptance_prior,
        memory=memory,
    )


def run_level(
    engine: DSparkEngine,
    prompts: list[torch.Tensor],
    concurrency: int,
    total: int,
    max_new_tokens: int,
    arrival_rate: float | None,
    rng: random.Random,
) -> dict:
    """Serve `total` requests at one load level; returns its metrics."""
    start = time.perf_counter()
    issued, next_arrival = 0, start
    rids: list[int] = []

    def issue() -> None:
        nonlocal issued
        rids.append(engine.add_request(prompts[issued % len(prompts)], max_new_tokens=max_new_tokens))
        issued += 1

    finished = {}  # collected with take_finished: the engine releases what it returns
    while len(finished) < total:
        now = time.perf_counter()
        if arrival_rate is None:
            in_flight = issued - len(finished)
            while in_flight < concurrency and issued < total:
                issue()
                in_flight += 1
        else:
            while next_arrival <= now and issued < total:
                issue()
                next_arrival += rng.expovariate(arrival_rate)
        if engine.has_work():
            engine.step()
        elif issued < total:
            time.sleep(max(0.0, min(next_arrival - time.perf_counter(), 0.05)))
        finished.update((request.request_id, request) for request in engine.take_finished())
    wall = time.perf_counter() - start
    done = [finished[r] for r in rids]
    tokens = sum(len(r.generated) for r in done)
    per_user = [len(r.generated) / max(r.finished_at - r.admitted, 1e-9) for r in done]
    budgets = [v for rec in engine.records for v in rec.verify_lens]
    policy_seconds = sum(rec.policy_seconds for rec in engine.records)
    nodes = [v for rec in engine.records if rec.nodes_verified is not None for v in rec.nodes_verified]
    trees = {"mean_tree_nodes": statistics.mean(nodes)} if nodes else {}
    return {
        "aggregate_tokens_per_second": tokens / wall,
        "per_user_tokens_per_second": statistics.mean(per_user),
        "mean_verify_len": statistics.mean(budgets) if budgets else 0.0,
        "mean_running": statistics.mean(rec.running for rec in engine.records) if engine.records else 0.0,
        "tokens": tokens,
        "seconds": wall,
        "rounds": len(engine.records),
        "mean_committed_per_round": statistics.mean(c for rec in engine.records for c in rec.committed),
        "drafted_round_fraction": sum(rec.drafted > 0 for rec in engine.records) / max(len(engine.records), 1),
        "policy_seconds_per_round": policy_seconds / max(len(engine.records), 1),
        "policy_share_of_round_time": policy_seconds / max(sum(rec.seconds for rec in engine.records), 1e-12),
        **trees,
    }


def _policy_of(name: str) -> str:
    """The registered policy behind a benchmark name (`fixed1` is `fixed` at ℓ = 1)."""
    return "fixed" if name == "fixed1" else name


def _curves(config: ServeConfig, target, drafter, step_curve, draft_curve):
    """The target's SPS(B) and the drafter's cost curve, looked up (or profiled once) when a policy needs them."""
    from ..profiling.draft_steps import load_or_profile_draft_curve
    from ..profiling.target_steps import load_or_profile_step_curve

    classes = [get_policy(_policy_of(name)) for name in config.policies if name != NO_SPECULATION]
    if step_curve is None and any(cls.needs_step_curve for cls in classes):
        step_curve = load_or_profile_step_curve(target, threads=config.threads)
    if draft_curve is None and any(cls.needs_draft_curve for cls in classes):
        draft_curve = load_or_profile_draft_curve(drafter, threads=config.threads)
    return step_curve, draft_curve


def run_serve_benchmark(
    config: ServeConfig,
    target,
    prompts: list[torch.Tensor],
    drafter,
    step_curve=None,
    drafter_label: str = "drafter",
    draft_curve=None,
) -> dict:
    """Serve `prompts` (token-id tensors, issued in the given order and cycled; request i gets prompt i % n, which
    keeps request ids aligned with per-prompt data such as an oracle drafter's references) per policy and load.

    Levels run load by load, every policy at one C back to back, so that load on a shared machine hits the
    policies of one C alike (compare policies within a C). Curves not given are looked up as `generate` does.
    """
    torch.set_num_threads(config.threads)
    step_curve, draft_curve = _curves(config, target, drafter, step_curve, draft_curve)
    rng = random.Random(config.seed)
    memory = PolicyMemory()  # "auto" learns across the levels of this run, as a long-running server would
    runs = []
    levels = [(r, p, c) for c in config.concurrency for r in range(config.repeats) for p in config.policies]
    for repeat, policy_name, concurrency in tqdm(levels, desc="serve levels"):
        policy = make_policy(
            policy_name,
            drafter.config.block_size,
            step_curve,
            config.threshold,
            draft_curve,
            memory_key=drafter,
            memory=memory,
        )
        engine = DSparkEngine(
            target,
            None if policy == "none" else drafter,
            policy=policy,
            max_running=max(config.concurrency),
            tree_budget=None if policy == "none" else config.tree_budget,
        )
        total = max(config.requests_per_level, concurrency)
        metrics = run_level(engine, prompts, concurrency, total, config.max_new_tokens, config.arrival_rate, rng)
        runs.append({"policy": policy_name, "concurrency": concurrency, "repeat": repeat, **metrics})
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    report = {
        "config": asdict(config),
        "drafter": drafter_label,
        "block_size": drafter.config.block_size,
        "torch_threads": config.threads,
        "dtype": dtype,
        "results": median_results(runs),
        "ratios_to_plain": ratios_to_plain(runs),
        "runs": runs,
    }
    _write(report, Path(config.out))
    return report


def median_results(runs: list[dict]) -> list[dict]:
    """One row per (policy, C): the median of every numeric metric over the passes."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["policy"], run["concurrency"]), []).append(run)
    rows = []
    for (policy, concurrency), group in groups.items():
        metrics = {
            k: statistics.median(r[k] for r in group)
            for k, v in group[0].items()
            if isinstance(v, (int, float)) and k not in ("concurrency", "repeat")
        }
        rows.append({"policy": policy, "concurrency": concurrency, "passes": len(group), **metrics})
    return rows


def ratios_to_plain(runs: list[dict]) -> dict[str, dict[int, float]]:
    """Aggregate tokens/s of every policy over `none` (plain batched decoding) at the same C and pass, measured
    back to back; the median over passes."""
    plain = {
        (r["concurrency"], r.get("repeat", 0)): r["aggregate_tokens_per_second"] for r in runs if r["policy"] == "none"
    }
    paired: dict[str, dict[int, list[float]]] = {}
    for r in runs:
        key = (r["concurrency"], r.get("repeat", 0))
        if r["policy"] != "none" and key in plain:
            ratio = r["aggregate_tokens_per_second"] / plain[key]
            paired.setdefault(r["policy"], {}).setdefault(r["concurrency"], []).append(ratio)
    return {p: {c: round(statistics.median(v), 3) for c, v in by_c.items()} for p, by_c in paired.items()}


def _write(report: dict, path: Path) -> None:
    """Write the report (with its provenance record, added in place) and its plots."""
    report.setdefault("provenance", result_provenance())
    write_json_atomic(path, report)
    plot_serve(report, path)


def plot_serve(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[dict]] = {}
    for row in report["results"]:
        by_policy.setdefault(row["policy"], []).append(row)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, rows in by_policy.items():
        rows = sorted(rows, key=lambda r: r["concurrency"])
        ax.plot(
            [r["per_user_tokens_per_second"] for r in rows],
            [r["aggregate_tokens_per_second"] for r in rows],
            marker="o",
            label=name,
        )
        for r in rows:
            ax.annotate(
                str(r["concurrency"]), (r["per_user_tokens_per_second"], r["aggregate_tokens_per_second"]), fontsize=6
            )
    ax.set_xlabel("per-user tokens/s")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title(f"throughput vs per-user speed\n{report['drafter']}; point labels = C", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path.with_name(path.stem + "_frontier.png"), dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name, rows in by_policy.items():
        rows = sorted(rows, key=lambda r: r["concurrency"])
        ax.plot([r["concurrency"] for r in rows], [r["mean_verify_len"] for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests C")
    ax.set_ylabel("mean drafts verified per request per round")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path.with_name(path.stem + "_budget.png"), dpi=120)
    plt.close(fig)
