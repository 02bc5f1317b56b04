"""Held-out τ estimate of a drafter folder on a training run's validation split (same data, split and settings as
`hf-dspark train`), e.g. to put a warm-start drafter on the same axis as the run's evaluations.

    python scripts/eval_validation_split.py --drafter src/hf_dspark/resources/drafters/smollm2-135m-instruct-dspark \\
        --data data/train_regenerated --validation-fraction 0.004 --out runs/val_dspark.json

Prints and writes the evaluation metrics (`eval_tau_est`, `eval_acc_rate_k*`, losses) of `DSparkTrainer.evaluate`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.io_utils import write_json_atomic
from hf_dspark.training.data import DSparkDataset
from hf_dspark.training.train import DSparkTrainConfig, load_training_target, validation_examples
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True, help="trained drafter folder")
    parser.add_argument("--data", nargs="+", default=["data/train_regenerated"], help="the run's --data")
    parser.add_argument("--validation-fraction", type=float, default=0.004, help="the run's --validation_fraction")
    parser.add_argument("--seed", type=int, default=0, help="the run's --seed (the anchors' seed)")
    parser.add_argument("--validation-seed", type=int, default=0,
                        help="the run's --validation_seed, which fixes the split (default 0, as in training; "
                        "pass the run's --seed if it trained with --validation_seed None)")
    parser.add_argument("--target-dtype", default="bfloat16", choices=["float32", "bfloat16"], help="target dtype")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per evaluation batch")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--out", required=True, help="JSON path for the metrics")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = DSparkTrainConfig(data=args.data, target_dtype=args.target_dtype,
                               validation_fraction=args.validation_fraction)
    target, tokenizer = load_training_target(config)
    split_seed = args.seed if args.validation_seed is None else args.validation_seed
    validation = validation_examples(config, tokenizer, split_seed)
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target).float()
    with tempfile.TemporaryDirectory() as scratch:
        training_args = DSparkTrainingArguments(
            output_dir=scratch, use_cpu=not torch.cuda.is_available(), bf16=args.target_dtype == "bfloat16",
            report_to="none", per_device_eval_batch_size=args.batch_size, anchors_per_sequence=512, seed=args.seed,
        )
        trainer = DSparkTrainer(model=drafter, args=training_args, target=target, pad_token_id=tokenizer.pad_token_id,
                                eval_dataset=DSparkDataset(validation))
        metrics = trainer.evaluate()
    write_json_atomic(Path(args.out), metrics, indent=1)
    print(metrics)


if __name__ == "__main__":
    main()
