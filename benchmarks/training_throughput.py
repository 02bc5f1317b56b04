"""Training throughput: supervised draft positions per second, the sparse-anchor fp32 baseline vs each speed-up.

Every variant trains the same drafter configuration (2 layers, γ = 7, Markov rank 64, mask token 16) on the same
examples of the regenerated data through the real `DSparkTrainer.compute_loss` (online target features, Eq. 14,
backward, AdamW step). Variants run interleaved, one step each per round, so they share the machine's state; the
reported figure is the median over rounds of (positions/s of the variant) / (positions/s of `baseline`).

    OMP_NUM_THREADS=2 python benchmarks/training_throughput.py --threads 2 --rounds 2 --examples 16 \\
        --draft-vocab-sizes 8192

Variants (name: target dtype / autocast, anchors per sequence, attention, draft vocabulary; batch 4 for all):
    baseline                fp32 / none, 16 anchors, dense attention, full vocabulary
    dense                   fp32 / none, all anchors, dense attention, full vocabulary
    dense_sparse            fp32 / none, all anchors, block-sparse attention, full vocabulary
    dense_sparse_bf16       bf16 / bf16, all anchors, block-sparse attention, full vocabulary
    dense_sparse_bf16_dv{K} as dense_sparse_bf16 with a K-token draft vocabulary
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hf_dspark.defaults import load_default_target
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.ops.losses import IGNORE_INDEX
from hf_dspark.provenance import processor_kind, with_provenance
from hf_dspark.training.collator import DSparkCollator
from hf_dspark.training.data import build_dataset, load_conversations
from hf_dspark.training.drafter_init import build_training_drafter, draft_vocab_from_examples, end_of_turn_ids
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments

DRAFTER = {"num_hidden_layers": 2, "block_size": 7, "markov_rank": 64, "mask_token_id": 16}


def variants(vocab_sizes: list[int]) -> dict[str, dict]:
    out = {
        "baseline": {"bf16": False, "anchors": 16, "draft_vocab": None, "sparse": False},
        "dense": {"bf16": False, "anchors": 512, "draft_vocab": None, "sparse": False},
        "dense_sparse": {"bf16": False, "anchors": 512, "draft_vocab": None, "sparse": True},
        "dense_sparse_bf16": {"bf16": True, "anchors": 512, "draft_vocab": None, "sparse": True},
    }
    for size in vocab_sizes:
        out[f"dense_sparse_bf16_dv{size // 1024}k"] = {"bf16": True, "anchors": 512, "draft_vocab": size,
                                                      "sparse": True}
    return out


def make_trainer(spec: dict, target, examples, tokenizer, workdir: str) -> DSparkTrainer:
    vocab = None
    if spec["draft_vocab"]:
        vocab, _ = draft_vocab_from_examples(examples, spec["draft_vocab"], target.config.vocab_size,
                                             end_of_turn_ids(tokenizer))
    drafter = build_training_drafter(target, DRAFTER, draft_vocab=vocab)
    args = DSparkTrainingArguments(output_dir=workdir, use_cpu=True, report_to="none", learning_rate=6e-4,
                                   anchors_per_sequence=spec["anchors"], weight_decay=0.0,
                                   block_sparse_attention=spec["sparse"])
    trainer = DSparkTrainer(model=drafter, args=args, target=target, pad_token_id=tokenizer.pad_token_id)
    trainer.create_optimizer()
    return trainer


def timed_step(trainer: DSparkTrainer, batch: dict, bf16: bool) -> tuple[float, int]:
    """One optimisation step (features, loss, backward, AdamW); returns (seconds, supervised positions)."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, int(batch["labels"].ne(IGNORE_INDEX).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=["data/train_regenerated"], help="Regenerated JSONL files/dirs.")
    parser.add_argument("--examples", type=int, default=48, help="Conversations used (also for the vocabulary).")
    parser.add_argument("--batch-size", type=int, default=4, help="Sequences per step (every variant).")
    parser.add_argument("--rounds", type=int, default=3, help="Timed rounds (each variant one step per round).")
    parser.add_argument("--draft-vocab-sizes", type=int, nargs="*", default=[8192], help="Draft vocabularies to try.")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (pinned).")
    parser.add_argument("--out", default=None, help=("Result JSON path "
                        "(default: benchmarks/results/<processor kind>/bench_training.json)."))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target32, tokenizer = load_default_target(torch.float32)
    target16 = copy.deepcopy(target32).to(torch.bfloat16)
    records = load_conversations(args.data)[: args.examples]
    examples = build_dataset(records, tokenizer).examples
    specs = variants(args.draft_vocab_sizes)
    results: dict[str, list[float]] = {name: [] for name in specs}
    with tempfile.TemporaryDirectory() as workdir:
        trainers = {n: make_trainer(s, target16 if s["bf16"] else target32, examples, tokenizer, workdir)
                    for n, s in specs.items()}
        for round_index in range(args.rounds + 1):  # round 0 warms up
            chunk = [examples[(round_index * args.batch_size + i) % len(examples)] for i in range(args.batch_size)]
            for name, spec in specs.items():
                batch = DSparkCollator(7, spec["anchors"], tokenizer.pad_token_id, seed=0)(chunk)
                seconds, positions = timed_step(trainers[name], batch, spec["bf16"])
                if round_index:
                    results[name].append(positions / seconds)
                print(f"round {round_index} {name}: {positions} positions in {seconds:.2f} s", flush=True)
    report = {
        "threads": args.threads, "batch_size": args.batch_size, "rounds": args.rounds, "drafter": DRAFTER,
        "variants": {
            name: {**specs[name], "positions_per_s_median": statistics.median(values),
                   "speedup_vs_baseline_median": statistics.median(v / o for v, o in zip(values, results["baseline"]))}
            for name, values in results.items()
        },
    }
    args.out = args.out or f"benchmarks/results/{processor_kind()}/bench_training.json"
    write_json_atomic(Path(args.out), with_provenance(report), indent=1)
    print(json.dumps(report["variants"], indent=1))


if __name__ == "__main__":
    main()
