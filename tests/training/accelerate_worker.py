"""Worker for test_accelerate.py, run by `accelerate launch` in each process (not collected by pytest).

argv: <target_dir> <data.jsonl> <output_dir>. Trains a few steps through `train()` with gloo DDP on CPU, then
every rank writes its drafter weights to <output_dir>/rank<r>.safetensors for the test to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from hf_dspark.training.train import DSparkTrainConfig, train
from hf_dspark.training.trainer import DSparkTrainingArguments


def main(target_dir: str, data: str, output_dir: str) -> None:
    torch.set_num_threads(1)
    config = DSparkTrainConfig(data=[data], target=target_dir, block_size=4, target_layer_ids=[0, 1], markov_rank=8,
                               validation_fraction=0.0, num_threads=1)
    args = DSparkTrainingArguments(
        output_dir=output_dir, max_steps=3, per_device_train_batch_size=2, learning_rate=3e-3, logging_steps=1,
        save_strategy="no", use_cpu=True, ddp_backend="gloo", report_to="none", disable_tqdm=True,
        anchors_per_sequence=4, seed=0,
    )
    trainer = train(config, args)
    rank, world = trainer.args.process_index, trainer.args.world_size
    drafter = trainer.accelerator.unwrap_model(trainer.model)
    state = {k: v.detach().contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(Path(output_dir) / f"rank{rank}.safetensors"), metadata={"world_size": str(world)})


if __name__ == "__main__":
    main(*sys.argv[1:4])
