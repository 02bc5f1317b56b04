"""LoRA adaptation of a trained drafter to a new prompt domain through `peft`.

The drafter's attention (q/k/v/o) and MLP (gate/up/down) linears get low-rank adapters; everything else (the
context projection, norms, Markov and confidence heads) stays frozen. Train the returned `PeftModel` with
`DSparkTrainer` exactly like a drafter; `save_model` then writes only the adapter. Serve either the adapter on top
of the base drafter (`load_lora_drafter`) or a merged plain drafter (`merge=True`, loadable by serving engines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import nn
from transformers.utils import logging

from ..model.heads import HEAD_MODULE

logger = logging.get_logger(__name__)

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraAdaptConfig:
    """LoRA settings for a drafter.

    Args:
        r: adapter rank.
        alpha: LoRA scaling numerator (the update is scaled by alpha / r).
        dropout: dropout on the adapter input.
        target_modules: names of the drafter linears to adapt (default: attention q/k/v/o and MLP gate/up/down).
            Add `"fc"` to also adapt the context projection.
        train_heads: also train the Markov / confidence heads in full (they are small); off by default so that
            only adapter weights change.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    train_heads: bool = False

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha <= 0:
            raise ValueError(f"LoRA needs r >= 1 and alpha > 0, got r={self.r}, alpha={self.alpha}.")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}.")
        if not self.target_modules:
            raise ValueError(f"target_modules is empty; use e.g. {list(DEFAULT_LORA_TARGETS)}.")


def apply_lora(drafter: nn.Module, config: LoraAdaptConfig | None = None):
    """Wrap a (bound, trained) drafter in a `peft.PeftModel` whose only trainable weights are the adapters."""
    from peft import LoraConfig, get_peft_model

    config = config or LoraAdaptConfig()
    names = {name.rsplit(".", 1)[-1] for name, module in drafter.named_modules() if isinstance(module, nn.Linear)}
    missing = sorted(set(config.target_modules) - names)
    if missing:
        raise ValueError(f"target_modules {missing} are not linear layers of this drafter (it has {sorted(names)}).")
    lora = LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        modules_to_save=[HEAD_MODULE, "confidence_head"] if config.train_heads else None,
        bias="none",
    )
    model = get_peft_model(drafter, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info(f"LoRA: training {trainable:,} of {total:,} drafter parameters")
    return model


def load_lora_drafter(base_drafter: nn.Module, adapter_path: str | Path, merge: bool = False):
    """The base drafter with a saved adapter: a `PeftModel`, or with `merge=True` a plain drafter (weights merged)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base_drafter, str(adapter_path))
    return model.merge_and_unload() if merge else model
