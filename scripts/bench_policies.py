"""Compare verification-length policies (fixed ℓ = γ, greedy, lagged, their padded-cost variants and the default
cost-aware "auto", which may also decline to draft) on the default target, greedy decoding.

Drafters: the oracle (the target's own greedy continuation, confidence 0.99: every draft accepted) and an untrained
DSpark drafter (random drafts, confidence head at init ≈ 0.5: almost nothing accepted, so a load-aware policy
should cut ℓ). Batch 1 runs each prompt alone; batch 8 runs the prompts as one left-padded batch. Every output is
checked bit-identical to plain greedy generate. Methods are interleaved within each repeat so load bursts on the
shared machine hit all alike; the report gives the median tokens/s per method. torch threads are pinned
(--threads, default 1) and the load-aware policies use the step curve of that thread count (shipped or cached).

    python scripts/bench_policies.py --threads 1 --gamma 7 --max-new-tokens 48 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import GenerationConfig

from hf_dspark import DSparkConfig, DSparkDrafter, load_default_target
from hf_dspark.eval.calibrate import left_pad
from hf_dspark.eval.oracle import oracle_for
from hf_dspark.eval.prompts import chat_input_ids, load_prompt_set
from hf_dspark.profiling import load_or_profile_step_curve

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {name: {"dspark_policy": name}
            for name in ("fixed", "greedy", "lagged", "greedy_padded", "lagged_padded", "auto")}


def batches(tokenizer, args) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """{"batch1": [(ids, mask)] one per prompt, "batch8": [(ids, mask)] one left-padded batch}."""
    items = load_prompt_set(args.prompts)
    prompts = [chat_input_ids(tokenizer, item["turns"][:1])[0] for item in items[: max(args.batch, args.single)]]
    pad = int(tokenizer.pad_token_id)
    return {"batch1": [left_pad([p], pad) for p in prompts[: args.single]],
            f"batch{args.batch}": [left_pad(prompts[: args.batch], pad)]}


def run_once(target, ids, mask, drafter, config) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, generation_config=config)
    return time.perf_counter() - start, out


def bench_setting(target, pairs, untrained, args) -> dict:
    """Median tokens/s of plain and of every (drafter, policy) on `pairs` (each a generate call)."""
    base = dict(do_sample=False, max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                pad_token_id=target.generation_config.pad_token_id or 0)
    plain_config = GenerationConfig(**base)
    references = [target.generate(ids, attention_mask=mask, generation_config=plain_config) for ids, mask in pairs]
    drafters = {"oracle": [oracle_for(target, args.gamma, ref, mask) for ref, (_, mask) in zip(references, pairs)],
                "untrained": [untrained] * len(pairs)}
    methods = {"plain": (None, plain_config)}
    for name, drafter_list in drafters.items():
        for policy, extra in POLICIES.items():
            methods[f"{name}/{policy}"] = (drafter_list, GenerationConfig(**base, **extra))
    seconds = {m: [] for m in methods}
    stats = {}
    tokens = sum(args.max_new_tokens * ids.shape[0] for ids, _ in pairs)
    for repeat in range(args.repeats + 1):  # repeat 0 is the warm-up
        for method, (drafter_list, config) in methods.items():
            total = 0.0
            for index, (ids, mask) in enumerate(pairs):
                drafter = drafter_list[index] if drafter_list else None
                elapsed, out = run_once(target, ids, mask, drafter, config)
                assert torch.equal(out, references[index]), f"{method} changed the greedy output"
                total += elapsed
                if drafter is not None:
                    s = drafter.last_generation_stats
                    stats.setdefault(method, []).append(
                        {"tau": s.mean_accepted_length, "mean_verify_len": s.mean_verify_len,
                         "mean_batch_tokens": s.mean_batch_tokens, "rounds": s.rounds})
            if repeat:
                seconds[method].append(total)
        print(f"  repeat {repeat}: " + ", ".join(f"{m} {tokens / s[-1]:.1f}" for m, s in seconds.items() if s))
    report = {}
    for method, values in seconds.items():
        row = {"tokens_per_second": tokens / statistics.median(values), "seconds": values}
        if method in stats:
            last = stats[method][-len(pairs):]
            row.update({k: statistics.mean(r[k] for r in last) for k in last[0]})
        report[method] = row
    return report


def _relative(path: str) -> str:
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned (picks the step curve too)")
    parser.add_argument("--gamma", type=int, default=7, help="draft block size γ (fixed ℓ = γ)")
    parser.add_argument("--max-new-tokens", type=int, default=48,
                        help="tokens generated per prompt (exactly that many)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats per method, after one warm-up (median)")
    parser.add_argument("--single", type=int, default=2, help="prompts run one at a time (batch 1)")
    parser.add_argument("--batch", type=int, default=8, help="prompts run as one left-padded batch")
    parser.add_argument("--prompts", default=str(ROOT / "data" / "eval" / "gsm8k.jsonl"),
                        help="JSONL prompt set (first user turn of each item)")
    parser.add_argument("--output", type=Path,
                        default=ROOT / "benchmarks" / "results" / "step_curve_policy_comparison.json",
                        help="JSON report path")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=torch.float32)
    curve = load_or_profile_step_curve(target)
    torch.manual_seed(0)
    config = DSparkConfig.from_target(target.config, block_size=args.gamma, num_hidden_layers=2, markov_rank=64)
    untrained = DSparkDrafter(config).bind_target(target).eval()
    results = {}
    with torch.no_grad():
        for setting, pairs in batches(tokenizer, args).items():
            print(f"{setting}:")
            results[setting] = bench_setting(target, pairs, untrained, args)
    payload = {"torch_threads": torch.get_num_threads(), "gamma": args.gamma, "max_new_tokens": args.max_new_tokens,
               "repeats": args.repeats, "prompts": _relative(args.prompts), "step_curve": curve.to_dict(),
               "machine": platform.processor() or platform.machine(),
               "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "results": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=2) + "\n")
    for setting, methods in results.items():
        print(f"\n{setting} (median tokens/s, τ, mean ℓ, mean B):")
        for name, row in methods.items():
            extra = "" if "tau" not in row else \
                f"  τ={row['tau']:.2f}  ℓ={row['mean_verify_len']:.2f}  B={row['mean_batch_tokens']:.1f}"
            print(f"  {name:18s} {row['tokens_per_second']:7.2f}{extra}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
