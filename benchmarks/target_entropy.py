"""How predictable is the target on its own replies? Per reply token of a training run's validation split (the same
data, split and seed as `hf-dspark train`): the entropy of the target's next-token distribution at T = 1 and its
top-1 probability, i.e. what a drafter is asked to match.

    python benchmarks/target_entropy.py --validation-fraction 0.004
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from hf_dspark.io_utils import write_json_atomic
from hf_dspark.provenance import processor_kind, with_provenance
from hf_dspark.training.train import DSparkTrainConfig, load_training_target, validation_examples


@torch.no_grad()
def reply_token_stats(target, example: dict) -> tuple[list[float], list[float]]:
    """(entropies in nats, top-1 probabilities) of the target's predictions of the example's reply tokens."""
    ids = torch.tensor([example["input_ids"]])
    logits = target(input_ids=ids).logits[0, :-1].float()
    predicted = torch.tensor(example["loss_mask"][1:], dtype=torch.bool)
    log_p = torch.log_softmax(logits[predicted], dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)
    return entropy.tolist(), log_p.max(dim=-1).values.exp().tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=["data/train_regenerated"], help="the run's --data")
    parser.add_argument("--validation-fraction", type=float, default=0.004, help="the run's --validation_fraction")
    parser.add_argument("--validation-seed", type=int, default=0, help="the run's --validation_seed")
    parser.add_argument("--target-dtype", default="bfloat16", choices=["float32", "bfloat16"], help="target dtype")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--out", default=None, help=("JSON path for the statistics "
                        "(default: benchmarks/results/<processor kind>/target_entropy.json)"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = DSparkTrainConfig(data=args.data, target_dtype=args.target_dtype,
                               validation_fraction=args.validation_fraction)
    target, tokenizer = load_training_target(config)
    validation = validation_examples(config, tokenizer, args.validation_seed)
    entropies, top1 = [], []
    for example in validation:
        h, p = reply_token_stats(target, example)
        entropies += h
        top1 += p
    report = {
        "sequences": len(validation), "reply_tokens": len(entropies), "target_dtype": args.target_dtype,
        "mean_entropy_nats": statistics.fmean(entropies), "median_entropy_nats": statistics.median(entropies),
        "mean_top1_probability": statistics.fmean(top1),
        "share_top1_at_least_0.9": sum(p >= 0.9 for p in top1) / len(top1),
        "share_top1_below_0.5": sum(p < 0.5 for p in top1) / len(top1),
    }
    args.out = args.out or f"benchmarks/results/{processor_kind()}/target_entropy.json"
    write_json_atomic(Path(args.out), with_provenance(report), indent=1)
    print(report)


if __name__ == "__main__":
    main()
