"""Where a DSpark round's time goes inside `generate`, next to a plain decode step, on the embedded default.

For the first prompt of `--set`, it runs DSpark with a fixed verification length (`--verify-len`) and times every
round with a round observer (`RoundRecord.draft_seconds`: the drafter's context update and proposal;
`verify_seconds`: the target forward, verification and commit), then plain `generate` on the same prompt, with and
without `min_new_tokens` (which sends every draft and verified position through the logits processors over the
full vocabulary). Medians over rounds, then over `--repeats` runs in which the settings and the DSpark / plain runs
alternate, threads pinned. Example (the README's numbers):

    python scripts/bench_round_costs.py --threads 2 --out benchmarks/results/round_costs_avx2_t2.json

The report also gives what the target's step curve (the one the policy prices rounds with) says a plain step and a
verification of ℓ + 1 tokens cost (`curve_ms`), to compare with the one-row costs measured in the loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from hf_dspark.defaults import load_default_drafter, load_default_target
from hf_dspark.hardware import processor_signature
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.profiling import load_or_profile_step_curve


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", default="data/eval/humaneval.jsonl", help="JSONL prompt set (its first prompt)")
    parser.add_argument("--verify-len", type=int, default=4, help="fixed ℓ of the DSpark runs (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per run (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating DSpark / plain runs per setting")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, pinned (default 2)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="target dtype")
    parser.add_argument("--out", type=Path, required=True, help="JSON report; refused if it exists unless --force")
    parser.add_argument("--force", action="store_true", help="overwrite --out")
    return parser.parse_args(argv)


def _one_pair(target, drafter, inputs, args, fixed_length: bool) -> tuple[float, float, float]:
    """One DSpark run (median drafter / verification seconds over its rounds), then plain generate (per token)."""
    records = []
    observer = SimpleNamespace(on_round=records.append)
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    if fixed_length:
        common["min_new_tokens"] = args.max_new_tokens
    target.generate(**inputs, assistant_model=drafter, dspark_policy="fixed", dspark_verify_len=args.verify_len,
                    dspark_observers=[observer], **common)
    draft = statistics.median(r.draft_seconds for r in records)
    verify = statistics.median(r.verify_seconds for r in records)
    start = time.perf_counter()
    out = target.generate(**inputs, **common)
    plain = (time.perf_counter() - start) / (out.shape[1] - inputs["input_ids"].shape[1])
    return draft, verify, plain


def _summary(triples: list[tuple[float, float, float]]) -> dict:
    ms = {name: round(1e3 * statistics.median(t[i] for t in triples), 1)
          for i, name in enumerate(("drafter_ms", "verify_ms", "plain_step_ms"))}
    ms["round_over_plain_step"] = round((ms["drafter_ms"] + ms["verify_ms"]) / ms["plain_step_ms"], 2)
    return ms


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"{args.out} exists; pass --force to overwrite it.", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=getattr(torch, args.dtype))
    drafter = load_default_drafter(target)
    curve = load_or_profile_step_curve(target)  # what the policy prices a round with (as generate packs)
    with open(args.set, encoding="utf-8") as handle:
        item = json.loads(handle.readline())
    messages = [{"role": "user", "content": item["turns"][0]}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    report = {"set": args.set, "verify_len": args.verify_len, "threads": args.threads,
              "processor": processor_signature(torch.device("cpu")), "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "dtype": args.dtype,
              # the step curve spreads B tokens over up to 8 rows; a batch-1 round verifies ℓ + 1 tokens in one row
              "curve_ms": {"plain_step": round(1e3 / float(curve.steps_per_second_at(1)), 1),
                           "verify": round(1e3 / float(curve.steps_per_second_at(args.verify_len + 1)), 1)}}
    settings = {"with_min_new_tokens": True, "without_processors": False}
    runs = {name: [] for name in settings}
    for _ in range(args.repeats):  # the settings alternate too, so that the machine's drift hits both alike
        for name, fixed_length in settings.items():
            runs[name].append(_one_pair(target, drafter, inputs, args, fixed_length))
    report.update({name: _summary(triples) for name, triples in runs.items()})
    write_json_atomic(args.out, report)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
