"""Plain decoding vs the "auto" policy in `DSparkEngine`, pass by pass, with where each run's time went.

For a drafter (shipped or an untrained one of its shape) and a load C, serves the same requests with `policy="none"`
and with "auto", alternately for `--passes` passes, and prints per run: total seconds, rounds, drafted rounds, the
summed time of plain rounds' verification, of drafted rounds' drafting and verification, and of the policy's
decisions (from `RoundRecord`). This is the check behind the README's per-round reruns of `bench serve` cells:
it separates what drafting costs from the machine's noise between passes.

    python scripts/serve_round_records.py --drafter untrained --concurrency 1 --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch
from profile_round_phases import SETS, Recorder  # the sibling script's prompt sets and round recorder

from hf_dspark import load_default_target
from hf_dspark.defaults import load_default_drafter
from hf_dspark.draft_profiling import load_or_profile_draft_curve
from hf_dspark.eval.prompts import chat_input_ids, load_prompt_set
from hf_dspark.eval.serve import make_policy
from hf_dspark.generation.engine import DSparkEngine
from hf_dspark.hardware import resolve_dtype
from hf_dspark.modeling_dspark import DSparkDrafter
from hf_dspark.profiling import load_or_profile_step_curve


def serve(target, drafter, policy, prompts, args) -> tuple[float, list]:
    """(wall seconds, round records) of `--requests` requests at `--concurrency`."""
    engine = DSparkEngine(target, drafter, policy=policy, max_running=args.concurrency)
    recorder = Recorder()
    engine.kernel.observers.append(recorder)
    for i in range(args.requests):
        engine.add_request(prompts[i % len(prompts)], max_new_tokens=args.max_new_tokens)
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
    return time.perf_counter() - start, recorder.records


def report(name: str, seconds: float, records: list) -> str:
    drafted = [r for r in records if r.drafted]
    plain = [r for r in records if not r.drafted]
    ms = lambda rows, field: 1e3 * sum(getattr(r, field) for r in rows)  # noqa: E731
    plain_ms = ms(plain, "verify_seconds")
    return (f"{name:>5}: {seconds:6.2f} s, {len(records)} rounds, {len(drafted)} drafted; plain rounds' verification "
            f"{plain_ms:.0f} ms ({plain_ms / max(len(plain), 1):.1f} per round); "
            f"drafted rounds: drafting {ms(drafted, 'draft_seconds'):.0f} ms, verification "
            f"{ms(drafted, 'verify_seconds'):.0f} ms; decisions {ms(records, 'policy_seconds'):.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", choices=["shipped", "untrained"], default="shipped",
                        help="the shipped DSpark drafter, or an untrained one of its shape (seed 0)")
    parser.add_argument("--concurrency", type=int, default=1, help="running requests C")
    parser.add_argument("--requests", type=int, default=8, help="requests per run")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--passes", type=int, default=2, help="plain / auto pairs, run alternately")
    parser.add_argument("--prompts-per-set", type=int, default=3, help="first prompts of gsm8k, humaneval, mt-bench")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--dtype", default="auto", help="target dtype (auto: bf16 where native, else fp32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=getattr(torch, resolve_dtype(args.dtype, "cpu")))
    drafter = load_default_drafter(target)
    if args.drafter == "untrained":
        torch.manual_seed(0)
        drafter = DSparkDrafter(drafter.config).eval().bind_target(target)
    step = load_or_profile_step_curve(target, threads=args.threads)
    draft = load_or_profile_draft_curve(drafter, threads=args.threads)
    prompts = [chat_input_ids(tokenizer, [item["turns"][0]])[0]
               for path in SETS for item in load_prompt_set(path)[: args.prompts_per_set]]
    print(f"{args.drafter} drafter, C = {args.concurrency}, {args.threads} thread(s), {target.dtype}")
    for index in range(args.passes):
        policy = make_policy("auto", drafter.config.block_size, step, 0.5, draft, memory_key=drafter)
        plain_seconds, plain_records = serve(target, None, "none", prompts, args)
        auto_seconds, auto_records = serve(target, drafter, policy, prompts, args)
        print(f"pass {index + 1}: auto / plain time {auto_seconds / plain_seconds:.3f}")
        print("  " + report("plain", plain_seconds, plain_records))
        print("  " + report("auto", auto_seconds, auto_records))


if __name__ == "__main__":
    main()
