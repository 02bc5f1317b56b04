"""Where a serving round's time goes under the "auto" policy, against the cost curves the policy reads.

Serves 2·C requests through `DSparkEngine` with the shipped drafter and "auto" at each C, records every round
(`RoundRecord`: drafting rows, ℓ, draft / verify / policy seconds), and prints the mean of drafted and plain-decoding
rounds beside the step curve's T_verify(B) and the draft curve's T_draft(R) at the observed sizes.

    python scripts/profile_round_phases.py --concurrency 4 16 --max-new-tokens 32 --threads 1
"""

from __future__ import annotations

import argparse
import statistics

import torch

from hf_dspark import load_default_target
from hf_dspark.defaults import load_default_drafter
from hf_dspark.draft_profiling import load_or_profile_draft_curve
from hf_dspark.eval.prompts import chat_input_ids, load_prompt_set
from hf_dspark.eval.serve import make_policy
from hf_dspark.generation.engine import DSparkEngine
from hf_dspark.hardware import resolve_dtype
from hf_dspark.profiling import load_or_profile_step_curve

SETS = ["data/eval/gsm8k.jsonl", "data/eval/humaneval.jsonl", "data/eval/mt-bench.jsonl"]


class Recorder:
    def __init__(self) -> None:
        self.records = []

    def on_round(self, record) -> None:
        self.records.append(record)


def _mean(records, value) -> float:
    return statistics.mean(value(r) for r in records) if records else float("nan")


def _ms(curve, size: float) -> float:
    return 1e3 / float(curve.steps_per_second_at(torch.tensor([max(1, round(size))]))[0])


def profile_level(target, drafter, prompts, concurrency: int, max_new_tokens: int, step, draft) -> None:
    policy = make_policy("auto", drafter.config.block_size, step, 0.5, draft, memory_key=drafter)
    engine = DSparkEngine(target, drafter, policy=policy, max_running=concurrency)
    recorder = Recorder()
    engine.kernel.observers.append(recorder)
    for i in range(2 * concurrency):
        engine.add_request(prompts[i % len(prompts)], max_new_tokens=max_new_tokens)
    while engine.has_work():
        engine.step()
    drafted = [r for r in recorder.records if r.drafted]
    plain = [r for r in recorder.records if not r.drafted]
    for name, records in (("drafted", drafted), ("plain", plain)):
        rows, longest = _mean(records, lambda r: len(r.rows)), _mean(records, lambda r: max(r.verify_len))
        print(f"C={concurrency} {name} rounds: {len(records)}, rows {rows:.1f}, drafting rows "
              f"{_mean(records, lambda r: r.drafted):.1f}, max ℓ {longest:.2f}; draft "
              f"{1e3 * _mean(records, lambda r: r.draft_seconds):.1f} ms, verify "
              f"{1e3 * _mean(records, lambda r: r.verify_seconds):.1f} ms, policy "
              f"{1e3 * _mean(records, lambda r: r.policy_seconds):.2f} ms; tokens per row "
              f"{_mean(records, lambda r: sum(r.committed) / len(r.rows)):.2f}")
        if records and name == "drafted":
            print(f"  curves: T_draft({_mean(records, lambda r: r.drafted):.0f} rows) = "
                  f"{_ms(draft, _mean(records, lambda r: r.drafted)):.1f} ms, T_verify({rows * (1 + longest):.0f}) = "
                  f"{_ms(step, rows * (1 + longest)):.1f} ms")
        elif records:
            print(f"  curves: T_verify({rows:.0f}) = {_ms(step, rows):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16], help="running requests C per level")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--prompts-per-set", type=int, default=3, help="first prompts of gsm8k, humaneval, mt-bench")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--dtype", default="auto", help="target dtype (auto: bf16 where native, else fp32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=resolve_dtype(args.dtype, "cpu"))
    drafter = load_default_drafter(target)
    step = load_or_profile_step_curve(target, threads=args.threads)
    draft = load_or_profile_draft_curve(drafter, threads=args.threads)
    prompts = [chat_input_ids(tokenizer, [item["turns"][0]])[0]
               for path in SETS for item in load_prompt_set(path)[: args.prompts_per_set]]
    for concurrency in args.concurrency:
        profile_level(target, drafter, prompts, concurrency, args.max_new_tokens, step, draft)


if __name__ == "__main__":
    main()
