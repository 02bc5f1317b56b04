"""Issue 12's measurements in one process: `bench serve` (policies × C) for the shipped, an untrained and the
oracle drafter, then `bench speed` (batch 1, with the untrained drafter and auto methods), one target load, levels
of one C back to back so that load on a shared machine hits the policies alike (compare ratios within a C).

    python scripts/bench_auto.py --dtype auto --threads 1 --concurrency 1 2 4 8 16 32 --requests 8 \
        --max-new-tokens 32 --out-dir benchmarks/results/auto [--drafter PATH] [--skip-speed]

The oracle is served on its own float32 target load (`--oracle-dtype`): only there is batched greedy text the
batch-1 references it proposes back. Its ratios compare policies on that target (plain included).

Writes <out-dir>/serve_<drafter>.json (+ _frontier.png, _budget.png), <out-dir>/speed.json (+ .png) and
<out-dir>/summary.json (auto / plain and auto / best fixed-ℓ per C, decision overhead).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from hf_dspark import DSparkConfig, DSparkDrafter, load_default_target
from hf_dspark.defaults import default_drafter_dir, load_default_drafter
from hf_dspark.eval.oracle import oracle_for
from hf_dspark.eval.prompts import chat_input_ids, load_prompt_set
from hf_dspark.eval.serve import ServeConfig, run_serve_benchmark
from hf_dspark.eval.speed import SpeedConfig, run_speed_benchmark
from hf_dspark.hardware import resolve_dtype
from hf_dspark.io_utils import write_json_atomic

SETS = ["data/eval/gsm8k.jsonl", "data/eval/humaneval.jsonl", "data/eval/mt-bench.jsonl"]


def _prompts(tokenizer, per_set: int) -> list[torch.Tensor]:
    turns = [item["turns"][0] for path in SETS for item in load_prompt_set(path)[:per_set]]
    prompts = [chat_input_ids(tokenizer, [turn])[0] for turn in turns]
    random.Random(0).shuffle(prompts)
    return prompts


def _drafters(target, args) -> dict:
    """The shipped (or --drafter) and an untrained drafter of its architecture, bound to `target`."""
    trained = DSparkDrafter.from_pretrained(args.drafter, target=target) if args.drafter else \
        load_default_drafter(target)
    torch.manual_seed(0)
    drafters = {"shipped": trained, "untrained": DSparkDrafter(trained.config).eval().bind_target(target)}
    return {name: drafters[name] for name in args.drafters if name in drafters}


def _oracle(target, args, prompts, block_size: int):
    """The oracle: each prompt's batch-1 greedy continuation, proposed back (request i gets prompt i % n).

    Only exact where batched greedy decoding equals batch-1 greedy decoding, i.e. in float32: in bf16 a padded
    batched prefill rounds differently, and a request whose text leaves its reference at the first token never
    accepts a draft (seen at C = 16: 3 of 16 requests), so the closed batch's rounds are set by those stragglers.
    """
    total = max(args.requests, *args.concurrency)
    references = [target.generate(p[None], do_sample=False, max_new_tokens=args.max_new_tokens,
                                  min_new_tokens=args.max_new_tokens)[0] for p in prompts]
    oracle = oracle_for(target, block_size, references[0][None], torch.ones(1, 1))
    oracle.reference = [references[i % len(references)] for i in range(total)]
    return oracle


def _summary(report: dict) -> dict:
    """Per C: auto / plain and auto / best fixed ℓ (medians of per-pass paired ratios), drafted rounds, overhead."""
    out = {}
    ratios = report["ratios_to_plain"]
    by = {(r["policy"], r["concurrency"]): r for r in report["results"]}
    for c in sorted({r["concurrency"] for r in report["results"]}):
        if ("auto", c) not in by or c not in ratios.get("auto", {}):
            continue
        fixed = [ratios[p][c] for p in ("fixed", "fixed1") if c in ratios.get(p, {})]
        auto = by[("auto", c)]
        out[c] = {"auto_over_plain": ratios["auto"][c],
                  "auto_over_best_fixed": round(ratios["auto"][c] / max(fixed), 3) if fixed else None,
                  "auto_drafted_round_fraction": round(auto["drafted_round_fraction"], 3),
                  "auto_policy_share": round(auto["policy_share_of_round_time"], 5)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="auto",
                        help="model dtype: float32, bfloat16 or auto (bfloat16 where the CPU has it natively)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32],
                        help="client counts C to serve")
    parser.add_argument("--policies", nargs="+", default=["none", "fixed1", "fixed", "scheduler", "auto"],
                        help="verification policies: none, fixed1, fixed, threshold, scheduler, auto")
    parser.add_argument("--drafters", nargs="+", default=["shipped", "untrained", "oracle"],
                        help="drafters to serve: shipped (or --drafter), untrained (same architecture), oracle "
                             "(the target's own greedy text)")
    parser.add_argument("--oracle-dtype", choices=["float32", "same"], default="float32",
                        help="dtype of the oracle's serve run (its own target load): float32 (default), where batched "
                             "greedy text equals the batch-1 references, or the same as --dtype")
    parser.add_argument("--requests", type=int, default=8, help="finished requests per policy, C and pass")
    parser.add_argument("--passes", type=int, default=1, help="interleaved passes over the policies per C (medians)")
    parser.add_argument("--max-new-tokens", type=int, default=32,
                        help="tokens per serve request (the speed run generates twice as many)")
    parser.add_argument("--prompts-per-set", type=int, default=4,
                        help="serve prompts taken from each of the gsm8k, humaneval, mt-bench sets")
    parser.add_argument("--drafter", default=None, help="trained drafter folder (default: the shipped one)")
    parser.add_argument("--speed-prompts", type=int, default=1, help="prompts per set in the speed run (batch 1)")
    parser.add_argument("--speed-sets", nargs="+", default=SETS, help="JSONL prompt sets of the speed run")
    parser.add_argument("--speed-repeats", type=int, default=2,
                        help="timed repeats per prompt and method in the speed run, after one warm-up")
    parser.add_argument("--skip-speed", action="store_true", help="serve only: skip the speed run")
    parser.add_argument("--out-dir", default="benchmarks/results/auto",
                        help="folder for serve_<drafter>.json, speed.json, summary.json and plots")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, "cpu")
    target, tokenizer = load_default_target(dtype=getattr(torch, dtype))
    out = Path(args.out_dir)
    prompts = _prompts(tokenizer, args.prompts_per_set)
    summary = {"dtype": dtype, "threads": args.threads, "serve": {}}
    drafters = _drafters(target, args)
    served = [(name, target, dtype, drafter) for name, drafter in drafters.items()]
    if "oracle" in args.drafters:
        oracle_dtype = dtype if args.oracle_dtype == "same" else args.oracle_dtype
        oracle_target = target if oracle_dtype == dtype else load_default_target(getattr(torch, oracle_dtype))[0]
        block_size = DSparkConfig.from_pretrained(args.drafter or default_drafter_dir()).block_size
        served.append(("oracle", oracle_target, oracle_dtype, _oracle(oracle_target, args, prompts, block_size)))
    for name, served_target, served_dtype, drafter in served:
        config = ServeConfig(concurrency=args.concurrency, policies=args.policies, requests_per_level=args.requests,
                             max_new_tokens=args.max_new_tokens, threads=args.threads, repeats=args.passes,
                             out=str(out / f"serve_{name}.json"))
        report = run_serve_benchmark(config, served_target, prompts, drafter,
                                     drafter_label=f"{name} ({served_dtype})")
        summary["serve"][name] = {"dtype": served_dtype, **_summary(report)}
        write_json_atomic(out / "summary.json", summary)
        print(name, json.dumps(summary["serve"][name]))
    if not args.skip_speed:
        speed = SpeedConfig(prompt_files=args.speed_sets, num_prompts=args.speed_prompts,
                            max_new_tokens=args.max_new_tokens * 2, repeats=args.speed_repeats, block_sizes=[7],
                            threads=args.threads, drafter=args.drafter, untrained=True,
                            out=str(out / "speed.json"))
        trained = DSparkDrafter.from_pretrained(args.drafter, target=target) if args.drafter else \
            load_default_drafter(target)
        report = run_speed_benchmark(speed, target, tokenizer, trained)
        summary["speed"] = {s: {m: round(r["median_ratio_to_plain"], 3) for m, r in t.items()}
                            for s, t in report["results"].items()}
        write_json_atomic(out / "summary.json", summary)
        print(json.dumps(summary["speed"]))


if __name__ == "__main__":
    main()
