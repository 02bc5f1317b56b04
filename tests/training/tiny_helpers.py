"""Tiny models, tokenizer and data for the training tests (target: hidden 64, 4 layers, vocabulary 128)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark import DSparkDrafter
from hf_dspark.model.configuration_dspark import DSparkConfig


def tiny_target_config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256,
    )


def make_tiny_target(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_target_config()).eval()


def make_tiny_drafter(target, seed: int = 1, **overrides) -> DSparkDrafter:
    torch.manual_seed(seed)
    kwargs = {"block_size": 4, "target_layer_ids": [0, 1], "markov_rank": 8, **overrides}
    drafter = DSparkDrafter(DSparkConfig.from_target(target.config, **kwargs))
    return drafter.bind_target(target)


def tokenized_records(count: int = 12, seed: int = 0) -> list[dict]:
    """Pre-tokenised conversations: a 'prompt' (no loss) then a 'reply' (loss) of random tokens."""
    rng = random.Random(seed)
    records = []
    for index in range(count):
        prompt, reply = rng.randint(3, 10), rng.randint(6, 30)
        ids = [rng.randrange(1, 128) for _ in range(prompt + reply)]
        records.append({"id": f"tiny:{index}", "input_ids": ids, "loss_mask": [0] * prompt + [1] * reply})
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def make_byte_tokenizer():
    """A fast byte-level ChatML tokenizer (259 ids: 3 specials + 256 bytes), built in-process (no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.chat_template = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    return tokenizer
