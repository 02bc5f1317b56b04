"""Loaders and argument types shared by every `hf-dspark` subcommand.

Every command that needs a target calls `load_target`; every command that needs a drafter calls `load_drafter`
(trained folder, shipped default, or an untrained fallback) or `load_drafter_spec` (`eval`'s `untrained[:γ]`).
Argument types here fail inside argparse, so a bad value is reported before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DTYPE_CHOICES = ["float32", "bfloat16", "float16"]
DEVICE_HELP = "torch device of the target: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ..."


def resolve_device(name: str = "auto") -> str:
    """`auto` -> "cuda" when a CUDA device is available, else "cpu"; any other name is returned as given."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def device_name(text: str) -> str:
    """argparse type: `auto` or a device torch understands (checked before any model is loaded)."""
    if text == "auto":
        return text
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} ({error})") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index is not None and device.index >= count):
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s); use cpu or auto")
    return text


def load_target(path: str | None, dtype_name: str = "float32", tokenizer: bool = True, device: str = "auto"):
    """(model, tokenizer or None): a local/Hub causal LM at `path`, or the embedded default target when None."""
    import torch

    dtype, device = getattr(torch, dtype_name), resolve_device(device)
    if path is None:
        from ..defaults import load_default_target

        return load_default_target(dtype=dtype, device=device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..hardware import warn_if_slow_dtype
    from ..interop.sources import resolve_model_source

    warn_if_slow_dtype(dtype_name, str(device))
    hub = resolve_model_source(path, what="target")  # a missing folder / offline name fails here, named
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **hub).to(device).eval()
    return model, AutoTokenizer.from_pretrained(path, **hub) if tokenizer else None


def untrained_drafter(target, block_size: int):
    """A randomly initialised 2-layer DSpark drafter bound to `target` (smoke runs; ~1 token per round)."""
    from ..drafter import DSparkDrafter
    from ..model.configuration_dspark import DSparkConfig

    config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=2, markov_rank=64)
    return DSparkDrafter(config).bind_target(target)


def load_drafter(target, path: str | None, block_size: int = 7):
    """(drafter, description): the trained drafter at `path`, the shipped DSpark drafter alone (not the default
    hybrid: the benchmarks build their hybrid around it), or (saying so) an untrained one."""
    from ..drafter import DSparkDrafter, load_default_drafter

    if path is not None:
        return DSparkDrafter.from_pretrained(path, target=target), f"drafter {path}"
    try:
        return load_default_drafter(target, kind="dspark"), "the shipped default DSpark drafter"
    except FileNotFoundError:
        drafter = untrained_drafter(target, block_size)
        return drafter, "an UNTRAINED drafter (no shipped default in this installation): expect ~1 token per round"


def load_baseline(target, path: str | None):
    """(drafter or None, description): the DFlash-style baseline at `path` or the shipped one, if any."""
    from ..drafter import DSparkDrafter, load_default_drafter

    if path is not None:
        return DSparkDrafter.from_pretrained(path, target=target), f"drafter {path}"
    try:
        return load_default_drafter(target, variant="dflash", kind="dspark"), "the shipped DFlash-style baseline"
    except FileNotFoundError:
        return None, "nothing (no baseline ships in this installation; the method is skipped)"


DRAFTER_SPEC_HELP = (
    "a drafter folder or Hub id, `untrained[:γ]` (a random DSpark drafter, for smoke runs), or a registered "
    "proposer: `NAME[:γ]` (model-free) or `NAME:DRAFTER` (built around a DSpark drafter spec); "
    "hf_dspark.proposers.available_proposers() lists them"
)


def load_drafter_spec(target, spec: str):
    """The drafter `spec` names, bound to `target`: a registered proposer (`NAME[:γ]` / `NAME:DRAFTER`,
    `hf_dspark.proposers.build_proposer`), `untrained[:γ]` (a random DSpark drafter) or a trained drafter (native,
    serving-engine or DFlash layout). Its `eval_source` is `spec`."""
    from ..drafter import DSparkDrafter
    from ..generation import enable
    from ..proposers import build_proposer, split_proposer_spec

    if split_proposer_spec(spec) is not None:
        drafter = build_proposer(target, spec, lambda inner: load_drafter_spec(target, inner))
        enable(target)
        drafter.eval_source = spec
        return drafter
    if spec == "untrained" or spec.startswith("untrained:"):
        drafter = untrained_drafter(target, int(spec.partition(":")[2] or 7))
    else:
        drafter = DSparkDrafter.from_pretrained(spec, target=target)
    drafter.eval_source = spec
    return drafter.eval()


def add_runtime_arguments(
    parser: argparse.ArgumentParser,
    threads: int,
    auto_dtype: bool = True,
    dtype_help: str | None = None,
    dtype_default: str = "auto",
) -> None:
    """`--threads`, `--device` and `--dtype` of a command that loads the target (one definition for all of them).

    auto_dtype: offer `--dtype auto` (bf16 where it is native); dtype_default / dtype_help: its default and help text
    when a command defaults to another dtype (the demo: float32, where greedy output is bit-identical)."""
    parser.add_argument("--threads", type=positive_int, default=threads, help="torch CPU threads, pinned")
    parser.add_argument("--device", type=device_name, default="auto", help=DEVICE_HELP)
    if auto_dtype:
        parser.add_argument(
            "--dtype",
            default=dtype_default,
            choices=["auto", *DTYPE_CHOICES],
            help=dtype_help or "target dtype (auto: bfloat16 where the CPU/GPU computes it natively, else float32)",
        )
    else:
        parser.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES, help="dtype the target is loaded in")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def probability(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value}")
    return value


def existing_file(text: str) -> str:
    """argparse type: a path to an existing file."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


def json_object_file(text: str) -> dict[str, Any]:
    """argparse type: a file holding one JSON object, parsed; errors name the file, line and column."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(
            f"{text} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except UnicodeDecodeError as error:
        raise argparse.ArgumentTypeError(f"{text} is not UTF-8 text ({error.reason})") from None
    if not isinstance(payload, dict):
        raise argparse.ArgumentTypeError(f"{text} must hold a JSON object, got a {type(payload).__name__}")
    return payload


def step_curve_file(text: str) -> dict[str, Any]:
    """argparse type: a step-curve JSON file (`hf-dspark profile` output), parsed and checked; returns the dict."""
    from ..profiling.step_curve import StepCurve

    payload = json_object_file(text)
    try:
        StepCurve.from_dict(payload)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(f"{text} is not a step curve: {error}") from None
    return payload
