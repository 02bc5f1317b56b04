"""How a drafter to train is made: fresh or warm-started, its draft vocabulary, optional target-layer init.

* `build_training_drafter`: a fresh drafter shaped after the target (or a warm start from a trained drafter
  folder), bound to the target, with fp32 trainable weights (bf16 compute comes from autocast, not the weights).
* `draft_vocab_from_examples`: the `size` most frequent supervised tokens of the training replies (EOS ids always in),
  with the share of supervised tokens it covers.
* `init_layers_from_target`: copy the target's last decoder layers into the drafter's layers (same shapes and
  parameter names for Llama-like targets) instead of a random init.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from transformers.utils import logging

from ..configuration_dspark import DSparkConfig
from ..draft_vocab import count_tokens, coverage, select_draft_vocab
from ..modeling_dspark import DSparkDrafter

logger = logging.get_logger(__name__)


def draft_vocab_from_examples(
    examples: Iterable[Mapping[str, Any]], size: int, vocab_size: int, always_include: Iterable[int] = ()
) -> tuple[torch.Tensor, float]:
    """(sorted target ids `[size]`, coverage 0..1) from the loss-masked tokens of tokenised training examples."""
    counts = count_tokens((e["input_ids"], e["loss_mask"]) for e in examples)
    ids = select_draft_vocab(counts, size, vocab_size, always_include)
    return ids, coverage(counts, ids)


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids a reply can end with (EOS and the chat template's end-of-turn token when it has one)."""
    if tokenizer is None:
        return []
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id >= 0:
            ids.add(token_id)
    return sorted(ids)


@torch.no_grad()
def init_layers_from_target(drafter: DSparkDrafter, target: nn.Module) -> list[int]:
    """Copy the target's last `num_hidden_layers` decoder layers into the drafter's layers. Returns their indices.

    Only parameters whose names and shapes match are copied (attention projections, q/k norms, MLP, layer norms);
    raises ValueError when the target exposes no `model.layers` or nothing matches.
    """
    layers = getattr(getattr(target, "model", None), "layers", None)
    if layers is None:
        raise ValueError("init from target layers needs a target with `model.layers` (a Llama-like decoder).")
    chosen = list(range(len(layers) - len(drafter.layers), len(layers)))
    copied = 0
    for mine, index in zip(drafter.layers, chosen):
        source = dict(layers[index].named_parameters())
        for name, param in mine.named_parameters():
            if name in source and source[name].shape == param.shape:
                param.copy_(source[name].to(param.dtype))
                copied += 1
    if copied == 0:
        raise ValueError("no drafter layer parameter matches the target's layers by name and shape.")
    return chosen


def build_training_drafter(
    target: nn.Module,
    overrides: Mapping[str, Any],
    init_drafter: str | None = None,
    init_from_target_layers: bool = False,
    draft_vocab: torch.Tensor | None = None,
) -> DSparkDrafter:
    """A drafter ready to train: fresh (`overrides` are `DSparkConfig` fields) or warm-started from `init_drafter`,
    optionally restricted to `draft_vocab` (target ids) and initialised from the target's last layers, bound to
    `target`, with fp32 weights."""
    if init_drafter:
        drafter = DSparkDrafter.from_pretrained(init_drafter, target=target)
    else:
        drafter = DSparkDrafter(DSparkConfig.from_target(target.config, **overrides))
        drafter.bind_target(target)
        if init_from_target_layers:
            logger.warning(f"drafter layers initialised from target layers {init_layers_from_target(drafter, target)}")
    drafter.float()  # master weights in fp32; bf16 compute comes from autocast (--bf16)
    if draft_vocab is not None:
        drafter.restrict_draft_vocab(draft_vocab)
    return drafter


def describe_draft_vocab(ids: Sequence[int] | torch.Tensor, share: float, vocab_size: int) -> dict[str, Any]:
    """The record written next to a trained drafter (`draft_vocab.json`)."""
    return {"draft_vocab_size": len(ids), "vocab_size": vocab_size, "coverage_of_supervised_tokens": round(share, 5)}
