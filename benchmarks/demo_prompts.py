"""Score candidate demo prompts by the accepted length τ of the default drafter, to choose `hf-dspark demo`'s prompts.

Per prompt (the first user turn of the first `--prompts` items of each set), the embedded target in float32
generates `--max-new-tokens` greedy tokens with the default drafter (`load_default_drafter`: the hybrid of the
shipped DSpark drafter and prompt lookup) verifying every draft (ℓ = γ), and the DSpark drafter alone for
comparison. Greedy fp32 τ with a fixed ℓ is deterministic — no wall clock is read — so this runs on a busy machine
and gives the same numbers on any processor whose float32 arithmetic agrees. The report lists every prompt's τ, how
many of the hybrid's rounds copied from the context, and the best prompt of each domain; the demo's prompt is the
best one, its second prompt the best of another domain.

    python benchmarks/demo_prompts.py --prompts 6 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hf_dspark import load_default_drafter, load_default_target
from hf_dspark.eval.prompts import chat_input_ids, load_prompt_set
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.provenance import processor_kind, result_provenance

SETS = {"data/eval/gsm8k.jsonl": "math", "data/eval/humaneval.jsonl": "code", "data/eval/mt-bench.jsonl": "chat"}


def score_prompt(target, drafter, input_ids: torch.Tensor, max_new_tokens: int) -> dict:
    """τ, rounds and new tokens of one greedy generation with `drafter` at ℓ = γ, and for a hybrid drafter the
    share of its row-proposals copied from the context (`lookup_share`)."""
    before = list(getattr(drafter, "source_counts", ()) or ())
    output = target.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        assistant_model=drafter,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        dspark_policy="fixed",
    )
    stats = drafter.last_generation_stats
    row = {
        "tau": stats.mean_accepted_length,
        "rounds": stats.rounds,
        "new_tokens": int(output.shape[1] - input_ids.shape[1]),
    }
    if before:
        dspark, lookup = (after - was for after, was in zip(drafter.source_counts, before))
        row["lookup_share"] = lookup / max(dspark + lookup, 1)
    return row


def best_per_domain(rows: list[dict]) -> dict[str, dict]:
    """The highest-τ prompt of each domain (by the default drafter's τ; ties: the earlier prompt)."""
    best: dict[str, dict] = {}
    for row in rows:
        if row["domain"] not in best or row["default"]["tau"] > best[row["domain"]]["default"]["tau"]:
            best[row["domain"]] = row
    return dict(sorted(best.items(), key=lambda item: -item[1]["default"]["tau"]))


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=list(SETS), help="JSONL prompt sets (first user turn)")
    parser.add_argument("--prompts", type=int, default=6, help="prompts per set (the first ones)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="greedy tokens per prompt (the demo's)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument(
        "--out", default=None, help="JSON report (default: benchmarks/results/<processor kind>/demo_prompts.json)"
    )
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_new_tokens < 1 or args.threads < 1:
        parser.error("--prompts, --max-new-tokens and --threads must be >= 1")
    missing = [path for path in args.sets if not Path(path).is_file()]
    if missing:
        parser.error(f"--sets: no such file(s): {', '.join(missing)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=torch.float32)
    default = load_default_drafter(target)
    alone = load_default_drafter(target, kind="dspark")
    rows = []
    for path in args.sets:
        domain = SETS.get(path, Path(path).stem)
        for index, item in enumerate(load_prompt_set(path)[: args.prompts]):
            prompt = item["turns"][0]
            ids = chat_input_ids(tokenizer, [prompt])
            row = {
                "set": Path(path).stem,
                "domain": domain,
                "index": index,
                "prompt": prompt,
                "default": score_prompt(target, default, ids, args.max_new_tokens),
                "dspark": score_prompt(target, alone, ids, args.max_new_tokens),
            }
            rows.append(row)
            print(
                f"{row['set']:10s} {index:2d}  τ default {row['default']['tau']:.2f} "
                f"(copied {row['default']['lookup_share']:.0%})  DSpark alone {row['dspark']['tau']:.2f}  "
                f"{prompt[:60]!r}",
                flush=True,
            )
    out = Path(args.out or f"benchmarks/results/{processor_kind()}/demo_prompts.json")
    config = {
        "sets": args.sets,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "dtype": "float32",
        "policy": "fixed",
        "do_sample": False,
    }
    report = {
        "config": config,
        "prompts": rows,
        "best_per_domain": best_per_domain(rows),
        "provenance": result_provenance(
            ["python", "benchmarks/demo_prompts.py", *(sys.argv[1:] if argv is None else argv)]
        ),
    }
    write_json_atomic(out, report)
    for domain, row in report["best_per_domain"].items():
        print(f"best {domain}: {row['set']} #{row['index']} τ {row['default']['tau']:.2f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
