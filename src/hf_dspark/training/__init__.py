"""DSpark training: data regeneration, target features, anchor collation, the Trainer subclass, LoRA adaptation.

Names are imported lazily (the Trainer pulls in much of transformers), so `import hf_dspark.training` is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PrepareDataConfig": "regenerate",
    "prepare_data": "regenerate",
    "load_conversations": "data",
    "tokenize_conversation": "data",
    "build_dataset": "data",
    "split_validation": "data",
    "DSparkDataset": "data",
    "TargetFeatures": "features",
    "TargetFeatureProvider": "features",
    "OnlineFeatureProvider": "features",
    "OfflineFeatureProvider": "features",
    "build_feature_cache": "features",
    "target_logits_at": "features",
    "DSparkCollator": "collator",
    "DSparkTrainer": "trainer",
    "DSparkTrainingArguments": "trainer",
    "DSparkTrainConfig": "train",
    "train": "train",
    "parse_train_args": "train",
    "main": "train",
    "LoraAdaptConfig": "lora",
    "apply_lora": "lora",
    "load_lora_drafter": "lora",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
