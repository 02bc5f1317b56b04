"""Where a batch-1 `generate` with DSpark spends its time, against the cost curves the policy reads, beside plain
`generate` on the same prompt (the demo's prompt and target, bf16). Per repeat: tokens, rounds, τ, the histogram of ℓ,
drafter / verification / policy time measured vs the curves' prediction, plain ms per token vs the curve's T(1),
the speedup, and the "auto" policy's learned cost correction.

    python scripts/profile_batch1_rounds.py --threads 2 --policy auto --repeats 2
"""

from __future__ import annotations

import argparse
import time

import torch

from hf_dspark import load_default_target
from hf_dspark.cli.demo import DEMO_PROMPT
from hf_dspark.defaults import load_default_drafter
from hf_dspark.draft_profiling import load_or_profile_draft_curve
from hf_dspark.eval.prompts import chat_input_ids
from hf_dspark.generation.acceptance import memory_for
from hf_dspark.profiling import load_or_profile_step_curve


class Recorder:
    def __init__(self) -> None:
        self.records = []

    def on_round(self, record) -> None:
        self.records.append(record)


def timed(call):
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads, pinned")
    parser.add_argument("--policy", default="auto", help="dspark_policy (auto, fixed, ...)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per generate call")
    parser.add_argument("--repeats", type=int, default=2, help="DSpark + plain pairs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=torch.bfloat16)
    drafter = load_default_drafter(target)
    step, draft = load_or_profile_step_curve(target), load_or_profile_draft_curve(drafter)
    ids = chat_input_ids(tokenizer, [DEMO_PROMPT])
    target.generate(ids, max_new_tokens=8, do_sample=False)  # warm-up, as the demo
    target.generate(ids, assistant_model=drafter, max_new_tokens=8, do_sample=False, dspark_policy=args.policy)
    for repeat in range(args.repeats):
        recorder = Recorder()
        total, out = timed(lambda: target.generate(ids, assistant_model=drafter, max_new_tokens=args.max_new_tokens,
                                                   do_sample=False, dspark_policy=args.policy,
                                                   dspark_observers=[recorder]))  # noqa: B023 (called at once)
        plain_total, plain = timed(lambda: target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False))
        rounds, new, plain_new = recorder.records, out.shape[1] - ids.shape[1], plain.shape[1] - ids.shape[1]
        lengths = [max(r.verify_len) for r in rounds]
        drafting = sum(r.draft_seconds for r in rounds)
        verifying = sum(r.verify_seconds for r in rounds)
        policy = sum(r.policy_seconds for r in rounds)
        predicted_verify = sum(1 / step.steps_per_second_at(1 + n) for n in lengths)
        predicted_draft = sum(1 / draft.steps_per_second_at(1) for r in rounds if r.drafted)
        print(f"repeat {repeat}: {new} tokens, {len(rounds)} rounds, τ {new / len(rounds):.2f}, ℓ histogram "
              f"{[lengths.count(n) for n in range(drafter.config.block_size + 1)]}")
        print(f"  DSpark {1e3 * total:.0f} ms = draft {1e3 * drafting:.0f} (curve {1e3 * predicted_draft:.0f}) + "
              f"verify {1e3 * verifying:.0f} (curve {1e3 * predicted_verify:.0f}) + policy {1e3 * policy:.0f} + "
              f"other {1e3 * (total - drafting - verifying - policy):.0f}")
        curve_ms = 1e3 / step.steps_per_second_at(1)
        print(f"  plain {1e3 * plain_total / plain_new:.1f} ms/token (curve T(1) {curve_ms:.1f}); "
              f"speedup {plain_total / plain_new / (total / new):.2f}")
        print(f"  cost correction {memory_for(drafter, drafter.config.block_size).costs}")


if __name__ == "__main__":
    main()
