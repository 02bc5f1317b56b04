"""Accepted length τ of draft chains against draft trees, per dev set, greedy (T = 0) and sampled (T = 1).

The shipped DSpark drafter (or `--kind hybrid`: with the lookup continuation joined as a branch) on the embedded
SmolLM2-135M-Instruct target, CPU, torch pinned to `--threads` threads (default 1). Every prompt runs once per
configuration at batch 1: the chain (`dspark_policy="fixed"`, γ drafts a round: γ + 1 nodes verified a row) and a
tree of each `--budgets` node count (`dspark_tree_budget`). τ is the mean of tokens committed per round (the bonus
token included, `DSparkGenerationStats.mean_accepted_length`); each tree's gain is the median over prompts of the
paired ratio τ_tree / τ_chain (sampled runs share their seed per prompt), beside the mean drafts verified per row
and round (`nodes_<config>`: a chain's ℓ, a tree's nodes beyond the anchor, `DSparkGenerationStats.tree_nodes`).
The plot shows τ against the nodes verified per row and round.

    python benchmarks/tree_tau.py --prompts 2 --budgets 8 16 --max-new-tokens 32     # a smoke run
    python benchmarks/tree_tau.py                                                    # the record

Writes benchmarks/results/<processor kind>/tree_tau.json (+ .png), with the provenance record.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from hf_dspark import load_default_drafter, load_default_target
from hf_dspark.eval.prompts import chat_input_ids, load_prompt_set
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.provenance import processor_kind, result_provenance

ROOT = Path(__file__).resolve().parents[1]
SETS = ["gsm8k", "humaneval", "mt-bench"]


def run_tau(target, drafter, input_ids: torch.Tensor, temperature: float, budget: int | None, max_new_tokens: int,
            seed: int) -> tuple[float, float]:
    """(τ, mean drafts verified per row and round) of one generate call: a chain (budget None) or a tree of
    `budget` nodes."""
    kwargs = dict(max_new_tokens=max_new_tokens, assistant_model=drafter, dspark_policy="fixed", do_sample=False)
    if temperature:
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    if budget is not None:
        kwargs["dspark_tree_budget"] = budget
    torch.manual_seed(seed)
    with torch.no_grad():
        target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    stats = drafter.last_generation_stats
    nodes = stats.mean_tree_nodes if stats.tree_nodes else stats.mean_verify_len
    return float(stats.mean_accepted_length), float(nodes)


def measure(target, tokenizer, drafter, args) -> dict:
    """({temperature: {set: {"chain": [τ per prompt], "<budget>": [...]}}}, the same of the drafts verified per row
    and round)."""
    configs: list[int | None] = [None, *args.budgets]
    out: dict = {}
    verified: dict = {}
    for temperature in args.temperatures:
        per_set = out.setdefault(str(temperature), {})
        for name in args.sets:
            items = load_prompt_set(name)[: args.prompts]
            taus = per_set.setdefault(name, {"chain" if b is None else str(b): [] for b in configs})
            nodes = verified.setdefault(str(temperature), {}).setdefault(name, {key: [] for key in taus})
            for index, item in enumerate(items):
                ids = chat_input_ids(tokenizer, item["turns"][:1])
                for budget in configs:  # interleaved: machine noise and drift hit every configuration alike
                    tau, drafts = run_tau(target, drafter, ids, temperature, budget, args.max_new_tokens,
                                          args.seed + index)
                    taus["chain" if budget is None else str(budget)].append(tau)
                    nodes["chain" if budget is None else str(budget)].append(drafts)
                latest = ", ".join(f"{key}={values[-1]:.2f}" for key, values in taus.items())
                print(f"T={temperature} {name} prompt {index}: {latest}", flush=True)
    return out, verified


def summarise(taus: dict, budgets: list[int], verified: dict | None = None) -> dict:
    """Per temperature and set: mean τ of each configuration, the median paired ratio tree / chain and the mean
    drafts verified per row and round (`nodes_<config>`, when `verified` is given)."""
    summary: dict = {}
    for temperature, per_set in taus.items():
        for name, runs in per_set.items():
            row = {key: round(statistics.fmean(values), 3) for key, values in runs.items()}
            for budget in budgets:
                ratios = [t / c for t, c in zip(runs[str(budget)], runs["chain"]) if c > 0]
                row[f"median_ratio_{budget}"] = round(statistics.median(ratios), 3) if ratios else None
            if verified is not None:
                for key, values in verified[temperature][name].items():
                    row[f"nodes_{key}"] = round(statistics.fmean(values), 2)
            summary.setdefault(temperature, {})[name] = row
    return summary


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = list(result["summary"])
    fig, axes = plt.subplots(1, len(temperatures), figsize=(4.6 * len(temperatures), 3.6), squeeze=False)
    chain_nodes = result["gamma"] + 1
    for ax, temperature in zip(axes[0], temperatures):
        for name, row in result["summary"][temperature].items():
            nodes = [chain_nodes] + result["budgets"]
            taus = [row["chain"]] + [row[str(b)] for b in result["budgets"]]
            line = ax.plot(nodes[1:], taus[1:], marker="o", label=f"{name} tree")[0]
            ax.scatter([nodes[0]], [taus[0]], marker="s", color=line.get_color(), label=f"{name} chain")
        ax.set(xlabel="nodes verified per row and round", ylabel="τ (tokens per round)", title=f"T = {temperature}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=SETS, help="prompt sets (shipped names or JSONL files)")
    parser.add_argument("--prompts", type=int, default=20, help="first prompts of each set")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32], help="tree node budgets (≥ 2)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="0: greedy")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--kind", choices=["dspark", "hybrid"], default="dspark", help="the shipped drafter's kind")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (pinned)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of prompt 0 (prompt i: seed + i)")
    parser.add_argument("--out", default=None, help=("JSON report path, PNG beside it "
                        "(default: benchmarks/results/<processor kind>/tree_tau.json)"))
    args = parser.parse_args()
    if any(b < 2 for b in args.budgets):
        parser.error(f"--budgets must be ≥ 2 nodes each (the anchor and a draft), got {args.budgets}")
    torch.set_num_threads(args.threads)
    out = Path(args.out or ROOT / "benchmarks" / "results" / processor_kind() / "tree_tau.json")
    target, tokenizer = load_default_target(dtype=torch.float32)
    drafter = load_default_drafter(target, kind=args.kind)
    taus, verified = measure(target, tokenizer, drafter, args)
    result = {
        "threads": args.threads, "kind": args.kind, "gamma": drafter.config.block_size, "budgets": args.budgets,
        "prompts_per_set": args.prompts, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
        "summary": summarise(taus, args.budgets, verified), "tau": taus, "nodes_verified": verified,
        "provenance": result_provenance(),
    }
    write_json_atomic(out, result)
    plot(result, out.with_suffix(".png"))
    for temperature, per_set in result["summary"].items():
        for name, row in per_set.items():
            print(f"T={temperature} {name}: " + ", ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
