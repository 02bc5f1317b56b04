"""Loading drafters from folders in any supported layout, detected from `config.json`.

- native: `model_type: "dspark"` (hf-dspark `save_pretrained`), loaded by transformers' `from_pretrained`;
- deepspec: the DeepSpec / serving-engine layout (`architectures: ["<Family>DSparkModel"]`), see `deepspec.py`;
- dflash: a z-lab DFlash drafter (`DFlashDraftModel`, `dflash_config`), see `dflash.py`;
- speculators: a vllm-project/speculators DSpark folder (`speculators_model_type: "dspark"`), see `speculators.py`.

The block layout of a foreign folder comes from its layout flag in any spelling (interop/layout_flags.py), else from
its format; conflicting or missing layout information is refused unless `assume_layout` ("anchor-first" or
"dflash") says which.

Weights are read from safetensors only; the tensors are checked against the config before anything is loaded, and
every error names the file and the mismatch. The engine layout's copies of the target's embedding and LM head are
checked against the bound target and dropped (the drafter always uses the target's own).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import logging

from ..model.binding import check_target_model
from ..model.draft_vocab import t2d_from_token_ids, token_ids_from_d2t
from .deepspec import config_from_deepspec, is_deepspec
from .dflash import UNSUPPORTED_ARCHITECTURES, config_from_dflash, is_dflash
from .layout_flags import check_assume_layout
from .layouts import load_json_object
from .sources import check_finite_weights, resolve_model_source
from .speculators import config_from_speculators, is_speculators
from .weights import SHARED_WEIGHTS, check_tensor_names, expected_shapes, read_tensors, tensor_shapes, weight_files

logger = logging.get_logger(__name__)

LAYOUTS = ("native", "deepspec", "dflash", "speculators")
# Fields of a native config.json that change what a drafter computes without changing any tensor shape: a missing
# one would silently take the class default (e.g. γ = 7), so loading refuses instead.
NATIVE_REQUIRED_FIELDS = ("block_size", "target_layer_ids", "num_target_layers", "head_type", "hidden_act")


def read_config_json(path: str | Path) -> tuple[dict[str, Any], Path]:
    """(config dict, config file) of a drafter folder; `ValueError` naming the file when missing or invalid."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{config_file} does not exist: a drafter folder needs a config.json.")
    return load_json_object(config_file), config_file


def detect_layout(path: str | Path) -> str:
    """`"native"`, `"deepspec"`, `"dflash"` or `"speculators"` for a drafter folder; `ValueError` naming the file for
    anything else."""
    raw, config_file = read_config_json(path)
    if raw.get("model_type") == "dspark":
        return "native"
    if is_speculators(raw):
        return "speculators"
    if is_deepspec(raw):
        return "deepspec"
    archs = raw.get("architectures") or []
    if is_dflash(raw) or any(a in UNSUPPORTED_ARCHITECTURES for a in archs):
        return "dflash"  # config_from_dflash refuses the unsupported variants with the reason
    raise ValueError(
        f"{config_file} describes model_type={raw.get('model_type')!r} with architectures={archs}; this is not a "
        "known drafter layout. Expected model_type 'dspark' (hf-dspark), architectures ['<Family>DSparkModel'] "
        "with block_size and target_layer_ids (DeepSpec / serving engines / SpecForge), a z-lab DFlashDraftModel "
        "with dflash_config, or a speculators config (speculators_model_type 'dspark')."
    )


def _resolve_dtype(kwargs: dict[str, Any], target: nn.Module | None, fallback: torch.dtype) -> torch.dtype:
    dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
    if isinstance(dtype, str):
        dtype = None if dtype == "auto" else getattr(torch, dtype)
    if dtype is None and target is not None:
        dtype = target.get_input_embeddings().weight.dtype
    return dtype or fallback


def check_shared_weights(shared: dict[str, torch.Tensor], target: nn.Module, folder: Path,
                         draft_ids: torch.Tensor | None = None) -> None:
    """Compare the engine layout's embedding / LM-head copies with the bound target's (shape: error; values: warn).
    An LM head pruned to the draft vocabulary (`[V_draft, d]`) is compared with the target's rows `draft_ids`."""
    references = {
        "embed_tokens.weight": target.get_input_embeddings(),
        "lm_head.weight": target.get_output_embeddings(),
    }
    for name, saved in shared.items():
        module = references[name]
        if module is None:
            continue
        reference = module.weight.detach()
        if name == "lm_head.weight" and draft_ids is not None and saved.shape[0] == draft_ids.numel():
            reference = reference[draft_ids.to(reference.device)]
        if tuple(saved.shape) != tuple(reference.shape):
            raise ValueError(
                f"{name} in {folder} has shape {list(saved.shape)} but the bound target's has "
                f"{list(reference.shape)}: this drafter was exported for a different target."
            )
        diff = (saved.float() - reference.to("cpu").float()).abs().max().item()
        tolerance = 1e-2 if saved.dtype in (torch.float16, torch.bfloat16) else 1e-4
        if diff > tolerance * max(1.0, reference.abs().max().item()):
            logger.warning(
                f"{name} in {folder} differs from the bound target's (max |diff| {diff:.3g}): the drafter was "
                "exported with another target checkpoint; it drafts with this target's weights."
            )


@contextmanager
def naming(config_file: Path) -> Iterator[None]:
    """Prefix a config `ValueError` (e.g. an unknown `hidden_act`) with the file it came from, unless it names it."""
    try:
        yield
    except ValueError as err:
        if str(config_file) in str(err):
            raise
        raise ValueError(f"{config_file}: {err}") from err


def _bind(drafter, target: nn.Module, config_file: Path):
    try:
        return drafter.bind_target(target)
    except ValueError as err:
        raise ValueError(f"{config_file}: {err}") from err


def _foreign_config(raw, config_file: Path, layout: str, found, target: nn.Module | None, assume_layout):
    use_qk_norm = "layers.0.self_attn.q_norm.weight" in found
    with naming(config_file):
        if layout == "dflash":
            return config_from_dflash(raw, config_file, use_qk_norm, assume_layout)
        if layout == "speculators":
            layers = None if target is None else target.config.get_text_config().num_hidden_layers
            return config_from_speculators(raw, config_file, use_qk_norm, layers, assume_layout)
        return config_from_deepspec(raw, config_file, use_qk_norm, "mask_embedding" in found, assume_layout)


def _vocab_buffers(tensors: dict[str, torch.Tensor], config) -> None:
    """Engines that take only `d2t` (vLLM) get the `t2d` membership mask rebuilt from it (same draft vocabulary)."""
    if config.draft_vocab_size is not None and "d2t" in tensors and "t2d" not in tensors:
        tensors["t2d"] = t2d_from_token_ids(token_ids_from_d2t(tensors["d2t"].long()), config.vocab_size)


def _load_foreign(cls: type, folder: Path, layout: str, target: nn.Module | None, kwargs: dict[str, Any]):
    """Build a drafter from a DeepSpec, SpecForge, DFlash or speculators folder (config translated, tensors checked,
    then assigned)."""
    raw, config_file = read_config_json(folder)
    found = tensor_shapes(folder)
    config = _foreign_config(raw, config_file, layout, found, target, kwargs.pop("assume_layout", None))
    if config.draft_vocab_size is not None and "d2t" in found and "t2d" not in found:
        found["t2d"] = ((config.vocab_size,), found["d2t"][1])  # rebuilt from d2t below
    dropped = set(SHARED_WEIGHTS)
    if config.mask_token_id is not None and "mask_embedding" in found:
        dropped.add("mask_embedding")  # unused placeholder some exporters write next to a vocabulary mask row
    check_tensor_names({k: v for k, v in found.items() if k not in dropped}, expected_shapes(cls, config), config_file)
    tensors = read_tensors(folder)
    _vocab_buffers(tensors, config)
    shared = {name: tensors.pop(name) for name in SHARED_WEIGHTS if name in tensors}
    for name in dropped - set(SHARED_WEIGHTS):
        tensors.pop(name, None)
    dtype = _resolve_dtype(kwargs, target, tensors["fc.weight"].dtype)
    if kwargs:
        logger.warning(f"Ignoring from_pretrained arguments {sorted(kwargs)} for the {layout} layout of {folder}.")
    config._name_or_path = str(folder)
    with torch.device("meta"):
        drafter = cls(config)
    drafter.load_state_dict(tensors, strict=True, assign=True)
    drafter = drafter.to(dtype).eval()
    drafter.name_or_path = str(folder)
    if target is not None:
        check_shared_weights(shared, target, folder, drafter.draft_token_ids())
        _bind(drafter, target, config_file)
    return drafter


def _check_native(cls: type, folder: Path) -> None:
    """Check a native folder's tensors against its config before transformers loads it (no silent random init)."""
    from ..model.configuration_dspark import DSparkConfig

    raw, config_file = read_config_json(folder)
    missing = [name for name in NATIVE_REQUIRED_FIELDS if name not in raw]
    if missing:
        raise ValueError(
            f"{config_file} lacks the field(s) {missing}; a saved drafter records them (they do not show in the "
            "weights, so a default would silently change the drafter). Restore them, e.g. block_size = γ used "
            "in training."
        )
    weight_files(folder)  # refuses pickle-only folders with a clear message
    with naming(config_file):
        config = DSparkConfig.from_pretrained(folder)
    check_tensor_names(tensor_shapes(folder), expected_shapes(cls, config), config_file, ignore=())


def load_drafter(cls: type, path: Any, *args: Any, target: nn.Module | None = None, **kwargs: Any):
    """`DSparkDrafter.from_pretrained` body: detect the layout, load safetensors weights only, bind `target`."""
    if target is not None:
        check_target_model(target)  # before anything is read: a model id or a config is not the model
    assume_layout = kwargs.pop("assume_layout", None)
    check_assume_layout(assume_layout)
    local = Path(str(path)).expanduser()
    if local.is_dir():
        layout = detect_layout(local)
        if layout != "native":
            if args:
                raise TypeError(f"positional model arguments {args} are not supported for the {layout} layout.")
            drafter = _load_foreign(cls, local, layout, target, {**kwargs, "assume_layout": assume_layout})
            check_finite_weights(drafter, local)
            return drafter
        _check_native(cls, local)
        path = local
    elif not kwargs.get("local_files_only"):
        kwargs.update(resolve_model_source(str(path), what="drafter"))
    kwargs.setdefault("use_safetensors", True)
    if target is not None:
        kwargs.setdefault("dtype", target.get_input_embeddings().weight.dtype)
    drafter = PreTrainedModel.from_pretrained.__func__(cls, path, *args, **kwargs)
    check_finite_weights(drafter, path)
    if target is not None:
        _bind(drafter, target, local / "config.json")
    return drafter
