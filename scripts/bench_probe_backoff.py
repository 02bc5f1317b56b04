"""The "auto" policy's probe back-off, with and without, on demo-sized batch-1 calls (the embedded default target).

Copies of a shipped drafter (each with its own acceptance memory across calls) serve the same prompt in turn, one
per arm, each call followed by plain `generate` for its ratio:
- `backoff`: the policy as shipped (each probe after which drafting still does not pay doubles the wait);
- `no_backoff`: the earlier rule, probes at the budgeted interval only (emulated by replacing
  `CostAwarePlanner.probe_wait`);
- `never`: a planner that never drafts nor probes (emulated by replacing `CostAwarePlanner.plan`): what a DSpark run
  costs over plain `generate` when every round decodes plainly (tapped hidden states, queued context, decisions);
- `relax_slow` / `no_relax`: a skipped request's own evidence fades back towards the pool more slowly
  (`AcceptanceTracker.idle_decay` 0.95 instead of 0.85) or not at all (1.0: only probes re-try it).
Prints per pair and writes medians, probe and drafted-round counts; every DSpark output is checked against plain
greedy `generate` (fp32: identical).

    python scripts/bench_probe_backoff.py --variant dspark --pairs 8 --threads 2 \
        --out benchmarks/results/probe_backoff_avx2.json
    python scripts/bench_probe_backoff.py --arms never --pairs 8 --threads 1
    python scripts/bench_probe_backoff.py --arms backoff relax_slow no_relax --set data/eval/mt-bench.jsonl \
        --prompt-index 1 --pairs 4 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_dspark import load_default_target
from hf_dspark.defaults import load_default_drafter
from hf_dspark.eval.prompts import chat_input_ids, load_prompt_set
from hf_dspark.generation import policy as policy_module
from hf_dspark.generation.cost_policy import CostAwarePlanner, DraftPlan
from hf_dspark.hardware import processor_signature
from hf_dspark.io_utils import write_json_atomic

ARMS = ("backoff", "no_backoff", "never", "relax_slow", "no_relax")
IDLE_DECAY = {"relax_slow": 0.95, "no_relax": 1.0}  # the shipped tracker's is 0.85
PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
          "clips did Natalia sell altogether in April and May?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=["dspark", "dflash"], default="dspark", help="which shipped drafter")
    parser.add_argument("--pairs", type=int, default=8, help="calls per arm (each followed by plain generate)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per call (the demo's default)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads, pinned (the demo's default)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["backoff", "no_backoff"],
                        help="policy variants, served in turn (see above)")
    parser.add_argument("--set", default=None, help="JSONL prompt set to take the prompt from (default: the demo's)")
    parser.add_argument("--prompt-index", type=int, default=0, help="which prompt of --set (its first turn)")
    parser.add_argument("--out", default=None, help="JSON report path (optional)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    arm = {"name": args.arms[0]}
    shipped_wait, shipped_plan = CostAwarePlanner.probe_wait, CostAwarePlanner.plan

    def probe_wait(planner: CostAwarePlanner, memory) -> int:
        if arm["name"] == "no_backoff":
            return max(memory.probe_interval, planner.min_interval)
        return shipped_wait(planner, memory)

    def plan(planner: CostAwarePlanner, rows, cap) -> DraftPlan:
        if arm["name"] == "never":
            return DraftPlan(rows=torch.zeros(0, dtype=torch.long), length=0)
        return shipped_plan(planner, rows, cap)

    shipped_tracker = policy_module.AcceptanceTracker

    def tracker(*tracker_args, **tracker_kwargs):
        if arm["name"] in IDLE_DECAY:
            tracker_kwargs["idle_decay"] = IDLE_DECAY[arm["name"]]
        return shipped_tracker(*tracker_args, **tracker_kwargs)

    CostAwarePlanner.probe_wait, CostAwarePlanner.plan = probe_wait, plan
    policy_module.AcceptanceTracker = tracker
    target, tokenizer = load_default_target(dtype=torch.float32)
    drafters = {name: load_default_drafter(target, variant=args.variant) for name in args.arms}
    prompt = PROMPT if args.set is None else load_prompt_set(args.set)[args.prompt_index]["turns"][0]
    input_ids = chat_input_ids(tokenizer, [prompt])
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    target.generate(input_ids, max_new_tokens=4)  # warm-up, and each drafter's first (cold) probe
    for name, drafter in drafters.items():
        arm["name"] = name
        target.generate(input_ids, assistant_model=drafter, max_new_tokens=4)
    ratios = {name: [] for name in drafters}
    counts = {name: {"probes": 0, "drafted_rounds": 0, "rounds": 0, "tokens": 0} for name in drafters}
    for pair in range(args.pairs):
        for name, drafter in drafters.items():
            arm["name"] = name
            start = time.perf_counter()
            output = target.generate(input_ids, assistant_model=drafter, **kwargs)
            dspark = time.perf_counter() - start
            start = time.perf_counter()
            plain = target.generate(input_ids, **kwargs)
            ratios[name].append((time.perf_counter() - start) / dspark)
            if not torch.equal(output, plain):
                raise SystemExit(f"{name}: DSpark output differs from plain greedy generate (fp32 must be identical)")
            stats = drafter.last_generation_stats
            counts[name]["probes"] += stats.probes
            counts[name]["drafted_rounds"] += stats.rounds - stats.skipped_rounds
            counts[name]["rounds"] += stats.rounds
            counts[name]["tokens"] += output.shape[1] - input_ids.shape[1]
        print(f"pair {pair + 1}: speedup " + ", ".join(f"{n} {r[-1]:.3f}" for n, r in ratios.items()), flush=True)
    report = {"variant": args.variant, "set": args.set, "prompt_index": args.prompt_index, "threads": args.threads,
              "processor": processor_signature("cpu"),
              "max_new_tokens": args.max_new_tokens, "pairs": args.pairs,
              "median_speedup": {n: round(statistics.median(r), 3) for n, r in ratios.items()},
              "speedups": {n: [round(x, 3) for x in r] for n, r in ratios.items()}, "counts": counts}
    print(json.dumps({k: report[k] for k in ("median_speedup", "counts")}))
    if args.out:
        write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
