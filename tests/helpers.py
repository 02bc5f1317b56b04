"""Helpers: tiny in-process random targets (Llama-like and Qwen3-like) and drafters for them."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from hf_dspark import DSparkConfig, DSparkDrafter

torch.set_num_threads(1)


def tiny_llama_config(**overrides) -> LlamaConfig:
    fields = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=96, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    fields = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=96, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    fields.update(overrides)
    return Qwen3Config(**fields)


def make_target(kind: str = "llama", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(tiny_llama_config(**overrides))
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(tiny_qwen3_config(**overrides))
    else:
        raise ValueError(kind)
    return model.eval()


def make_drafter(target, seed: int = 1, **overrides) -> DSparkDrafter:
    torch.manual_seed(seed)
    fields = dict(block_size=4, markov_rank=8, target_layer_ids=[0, 2])
    fields.update(overrides)
    drafter = DSparkDrafter(DSparkConfig.from_target(target.config, **fields)).eval()
    return drafter.bind_target(target)


def tapped_features(target, input_ids, layer_ids, attention_mask=None) -> torch.Tensor:
    """Concatenated outputs of the tapped decoder layers, `[B, L, n·d]`."""
    with torch.no_grad():
        out = target(input_ids, attention_mask=attention_mask, output_hidden_states=[i + 1 for i in layer_ids])
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def char_tokenizer(vocab_size: int = 96):
    """A character-level fast tokenizer over ids 3..vocab_size-1 (0 pad, 1 bos, 2 eos), for stop_strings tests."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(33, 33 + vocab_size - 3)]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {ch: i + 3 for i, ch in enumerate(chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def ragged_prompts(batch: int, vocab: int = 96, seed: int = 0, min_len: int = 3, max_len: int = 12):
    """Left-padded random prompts of different lengths: (input_ids, attention_mask)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (batch,), generator=gen)
    width = int(lengths.max())
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for r, n in enumerate(lengths.tolist()):
        ids[r, width - n :] = torch.randint(3, vocab, (n,), generator=gen)
        mask[r, width - n :] = 1
    return ids, mask


def holed_oracle(target, block_size: int, reference: torch.Tensor, mask: torch.Tensor):
    """An oracle drafter whose even rows draft `reference` (plain greedy output) and whose odd rows draft a wrong
    first token: in a batch of two or more, every round leaves holes in the target cache (an odd row's rejected
    slots sit below an even row's kept ones), which only compaction removes."""
    from hf_dspark.generation import oracle_for

    oracle = oracle_for(target, block_size, reference, mask)
    vocab = target.config.vocab_size
    oracle.reference = [ref if row % 2 == 0 else (ref + 1) % vocab for row, ref in enumerate(oracle.reference)]
    return oracle
