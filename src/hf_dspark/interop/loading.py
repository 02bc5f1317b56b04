"""Loading drafters from folders, with the checkpoint layout detected from `config.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedModel


def detect_layout(path: str | Path) -> str:
    """Return `"native"` for an hf-dspark folder; raise `ValueError` naming the file for anything else."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{config_file} does not exist: a drafter folder needs a config.json.")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_file} is not valid JSON ({err}).") from err
    if config.get("model_type") == "dspark":
        return "native"
    raise ValueError(
        f"{config_file} describes model_type={config.get('model_type')!r} with architectures="
        f"{config.get('architectures')}; this is not a known drafter layout (expected model_type 'dspark')."
    )


def load_drafter(cls: type, path: Any, *args: Any, target: nn.Module | None = None, **kwargs: Any):
    """`DSparkDrafter.from_pretrained` body: load safetensors weights only, then bind `target` if given."""
    local = Path(str(path))
    if local.is_dir():
        detect_layout(local)
    kwargs.setdefault("use_safetensors", True)
    if target is not None:
        kwargs.setdefault("dtype", target.get_input_embeddings().weight.dtype)
    drafter = PreTrainedModel.from_pretrained.__func__(cls, path, *args, **kwargs)
    if target is not None:
        drafter.bind_target(target)
    return drafter
