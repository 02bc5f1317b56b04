"""What logits processing costs a drafting round: one `propose` call of the shipped drafter (γ = 7, 256 cached
context tokens) at batch 1 and 8, greedy without processors, sampling with warpers, and greedy under
`min_new_tokens`, each next to the way it was done before, side by side in one process:

- sampling (temperature 0.7, top-p 0.9): warpers over the 8,192-token draft vocabulary vs over the full target
  vocabulary (the drafter's logits scattered there, −inf outside the subset), as before;
- `min_new_tokens`: DSpark's `EosFloor` vs transformers' `MinNewTokensLengthLogitsProcessor` (an EOS mask rebuilt
  with `torch.isin` over the vocabulary on every call), both over the target vocabulary, since they address EOS by id.

Arms alternate call by call; medians of `--repeats` calls, threads pinned. Example:

    python scripts/bench_draft_processing.py --threads 2 --out benchmarks/results/draft_processing_avx2_t2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from hf_dspark.defaults import load_default_drafter, load_default_target
from hf_dspark.generation.drafting import draft_logits_processor
from hf_dspark.generation.processors import RowProcessors
from hf_dspark.hardware import processor_signature
from hf_dspark.io_utils import write_json_atomic


class TransformersMinNewTokens(MinNewTokensLengthLogitsProcessor):
    """transformers' processor as it is: DSpark replaces only the exact class, so a subclass keeps its code."""


class OnTargetVocab:
    """The same processing, declared as reading token ids: the drafter then applies it over the target vocabulary."""

    reads_token_ids = True

    def __init__(self, processing) -> None:
        self.processing = processing

    def __call__(self, k, drafts_so_far, logits):
        return self.processing(k, drafts_so_far, logits)


def _arms(rows: int, eos: int, prompt_length: int) -> dict:
    """name -> (do_sample, logits_processor) for `rows` requests."""
    histories = [torch.zeros(prompt_length, dtype=torch.long)] * rows
    row_ids = list(range(rows))

    def processing(processors):
        return draft_logits_processor(RowProcessors(LogitsProcessorList(processors), rows), row_ids, histories)

    warpers = processing([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])
    floor = dict(prompt_length_to_skip=prompt_length - 8, min_new_tokens=64, eos_token_id=eos)
    return {
        "greedy": (False, None),
        "sampling_warpers_draft_vocab": (True, warpers),
        "sampling_warpers_target_vocab": (True, OnTargetVocab(warpers)),
        "greedy_min_new_tokens_eos_floor": (False, processing([MinNewTokensLengthLogitsProcessor(**floor)])),
        "greedy_min_new_tokens_transformers": (False, processing([TransformersMinNewTokens(**floor)])),
    }


def measure(drafter, rows: int, repeats: int, eos: int, context: int = 256) -> dict:
    """Median milliseconds of one `propose` per arm, arms alternating call by call."""
    cache = drafter.init_cache(rows)
    width = drafter.config.hidden_size * len(drafter.config.target_layer_ids)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(rows, context, width, generator=generator).to(drafter.dtype)
    drafter.extend_context(cache, features, torch.ones(rows, context, dtype=torch.bool))
    anchors = torch.randint(0, 1000, (rows,), generator=generator)
    arms = _arms(rows, eos, context)
    times = {name: [] for name in arms}
    for step in range(repeats + 1):
        for name, (do_sample, processing) in arms.items():
            start = time.perf_counter()
            drafter.propose(anchors, cache, do_sample=do_sample, logits_processor=processing, generator=generator)
            if step:  # the first call of each arm warms up
                times[name].append(time.perf_counter() - start)
    return {name: round(1e3 * statistics.median(values), 2) for name, values in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="rows per propose call (default 1 8)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per arm and batch (default 20)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, pinned (default 2)")
    parser.add_argument("--out", type=Path, required=True, help="JSON report; refused if it exists unless --force")
    parser.add_argument("--force", action="store_true", help="overwrite --out")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"{args.out} exists; pass --force to overwrite it.", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target()
    drafter = load_default_drafter(target)
    report = {"threads": args.threads, "processor": processor_signature(torch.device("cpu")),
              "gamma": drafter.config.block_size, "draft_vocab_size": drafter.config.draft_vocab_size,
              "vocab_size": drafter.config.vocab_size, "repeats": args.repeats, "context_tokens": 256,
              "propose_ms": {f"batch{rows}": measure(drafter, rows, args.repeats, tokenizer.eos_token_id)
                             for rows in args.batches}}
    write_json_atomic(args.out, report)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
