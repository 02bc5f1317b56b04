"""LoRA-adapt a trained DSpark drafter to a new prompt domain with peft, then save, reload and merge the adapter.

By default everything is tiny and random (runs in seconds, no data needed): a 4-layer Llama target, a drafter
trained briefly on "domain A" token sequences, then adapted with LoRA on "domain B".

With --real it uses the embedded SmolLM2-135M-Instruct target, a trained drafter (--drafter, default: the shipped
one) and regenerated conversations of the new domain (--data, e.g. a prepare-data output folder):

    python examples/lora_adapt.py --real --data runs/code_regenerated --output_dir runs/lora_code --steps 200
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.defaults import DEFAULT_DRAFTER_DIR
from hf_dspark.model.configuration_dspark import DSparkConfig
from hf_dspark.training.data import DSparkDataset, build_dataset, load_conversations
from hf_dspark.training.lora import LoraAdaptConfig, apply_lora, load_lora_drafter
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments


def tiny_setup() -> tuple[torch.nn.Module, DSparkDrafter, DSparkDataset, DSparkDataset]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256,
    )).eval()
    config = DSparkConfig.from_target(target.config, block_size=4, target_layer_ids=[0, 1], markov_rank=8)
    drafter = DSparkDrafter(config).bind_target(target)

    def domain(low: int, high: int, seed: int) -> DSparkDataset:
        rng = random.Random(seed)
        records = [{"input_ids": [rng.randrange(low, high) for _ in range(40)], "loss_mask": [0] * 8 + [1] * 32}
                   for _ in range(32)]
        return build_dataset(records)

    return target, drafter, domain(1, 64, 0), domain(64, 128, 1)


def real_setup(drafter_path: str | None, data: str, max_examples: int):
    from hf_dspark.defaults import load_default_drafter, load_default_target

    target, tokenizer = load_default_target(torch.float32)
    drafter = load_default_drafter(target, drafter_path, kind="dspark")  # the DSparkDrafter to fine-tune
    dataset = build_dataset(load_conversations([data])[:max_examples], tokenizer)
    return target, drafter, None, dataset


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    if args.real:
        if not args.data:
            raise SystemExit("--real needs --data (regenerated conversations of the new domain).")
        target, drafter, base_data, new_data = real_setup(args.drafter, args.data, args.max_examples)
    else:
        target, drafter, base_data, new_data = tiny_setup()
    common = {"use_cpu": not torch.cuda.is_available(), "report_to": "none", "save_strategy": "no",
              "logging_steps": max(1, args.steps // 5), "anchors_per_sequence": 8}
    if base_data is not None:  # tiny mode: give the base drafter some training first, and save it
        base_args = DSparkTrainingArguments(output_dir=str(out / "base"), max_steps=args.steps, learning_rate=3e-3,
                                            per_device_train_batch_size=8, **common)
        DSparkTrainer(model=drafter, args=base_args, target=target, train_dataset=base_data).train()
        drafter.save_pretrained(out / "base_drafter")
    base_path = out / "base_drafter" if base_data is not None else (args.drafter or DEFAULT_DRAFTER_DIR)
    model = apply_lora(drafter, LoraAdaptConfig(r=args.rank, alpha=2 * args.rank))
    lora_args = DSparkTrainingArguments(output_dir=str(out), max_steps=args.steps, learning_rate=args.lr,
                                        per_device_train_batch_size=args.batch_size, **common)
    trainer = DSparkTrainer(model=model, args=lora_args, target=target, train_dataset=new_data)
    trainer.train()
    trainer.save_model(str(out / "adapter"))
    print(f"adapter saved to {out / 'adapter'}")
    base = DSparkDrafter.from_pretrained(base_path, target=target)  # get_peft_model changed `drafter` in place
    merged = load_lora_drafter(base, out / "adapter", merge=True)
    merged.save_pretrained(out / "merged")
    print(f"merged drafter (plain DSpark checkpoint) saved to {out / 'merged'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", action="store_true", help="use the embedded SmolLM2 target and a trained drafter")
    parser.add_argument("--drafter", default=None, help="trained drafter folder (default: the shipped one)")
    parser.add_argument("--data", default=None, help="regenerated new-domain JSONL file/folder (--real)")
    parser.add_argument("--output_dir", default="runs/lora_adapt")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_examples", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
