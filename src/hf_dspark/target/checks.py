"""Up-front refusals for targets whose state, not the call, keeps DSpark from matching plain `generate`.

Run before the drafter is bound and before any forward, profiling run or cache work; each names what was found
and the fix:

- dynamically quantized linear layers (`torch.ao.quantization.quantize_dynamic`): each forward quantizes its
  input with that forward's own range, so a verification forward over several tokens and rows computes other
  logits than plain decoding's one-token steps (greedy output changes), and a quantized LM head has no weight
  tensor for the drafter to share;
- targets quantized by quanto, torchao, bitsandbytes, GPTQ, AWQ, HQQ or any transformers quantizer (found by
  `model.hf_quantizer`, `config.quantization_config`, or a layer or weight whose class comes from one of those
  packages, read by name: nothing is imported; a GGUF checkpoint that transformers dequantized to float weights on
  load is accepted): their kernels take other paths for one-token decoding steps than
  for multi-token verification blocks, and some scale activations over the whole forward, so DSpark cannot
  promise plain `generate`'s output (`quantization_found`);
- an input embedding or LM head whose weight is not held on a device (`meta`, as accelerate's `cpu_offload` /
  `disk_offload` leave them): the drafter reads those weights directly, outside the offloading hooks;
- attention kernels that take no per-row 4D mask (flash attention, flex attention: `check_attention_implementation`);
- a length-dependent RoPE scaling ("dynamic", "longrope") whose threshold a call's forwards can cross
  (`rope_reach_refusal`: the caller says how far its forwards reach);
- a target left in training mode with dropout active: its forwards are random, so neither plain `generate`
  nor DSpark's verification is reproducible, and they draw different masks;
- a `prepare_inputs_for_generation` replaced on the instance (PEFT prompt learning: prompt / prefix / P-tuning
  prepend virtual tokens there): the loop prefills from `input_ids` and never calls it;
- PEFT per-row adapters (`generate(..., adapter_names=[...])`, aLoRA `alora_offsets`): PEFT hooks a list with
  one entry per original batch row into every LoRA layer, while DSpark's forwards carry only the active rows;

Targets that are supported as they are: PEFT adapters (unmerged, merged, switched, disabled), accelerate device
maps with the embedding and LM head on a device (other layers may be offloaded), gradient checkpointing, bf16,
and a `torch.compile`d forward (run without packed weights, `packed_linear.unpackable_reason`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import torch

# RoPE types whose frequencies are recomputed from the largest position id of each forward.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
# Keywords PEFT binds into forward pre-hooks, one entry per batch row, for the length of a `generate` call.
PER_ROW_HOOK_KEYWORDS = ("adapter_names", "alora_offsets")
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout")


def dynamically_quantized_layer(model: torch.nn.Module) -> tuple[str, str] | None:
    """(module name, class name) of the first layer from `torch.ao.nn.quantized` (dynamic or static), or None."""
    for name, module in model.named_modules():
        if type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized")):
            return name, type(module).__name__
    return None


# Packages (by the module path of a layer's or weight's class) whose layers compute quantized, and their names.
QUANTIZATION_PACKAGES = {
    "optimum.quanto": "quanto",
    "quanto": "quanto",
    "torchao": "torchao",
    "bitsandbytes": "bitsandbytes",
    "auto_gptq": "GPTQ",
    "gptqmodel": "GPTQ",
    "exllamav2": "GPTQ",
    "awq": "AWQ",
    "hqq": "HQQ",
    "compressed_tensors": "compressed-tensors",
    "transformers.integrations.gguf": "GGUF",
}
# transformers quantizers that may dequantize every weight on load (GGUF without its kernels, or with
# `dequantize=True`): such a model is refused only when a quantized layer or a non-float weight remains.
DEQUANTIZING_METHODS = ("gguf",)
# transformers' `quant_method` values under the library names used above (others are named as they are).
QUANT_METHOD_NAMES = {
    "bitsandbytes": "bitsandbytes",
    "gptq": "GPTQ",
    "awq": "AWQ",
    "quanto": "quanto",
    "hqq": "HQQ",
    "torchao": "torchao",
}


def _package_library(cls: type) -> str | None:
    """The quantization library `cls` comes from (`QUANTIZATION_PACKAGES`, AWQ kernels of GPTQModel as AWQ)."""
    module = getattr(cls, "__module__", "") or ""
    for package, library in QUANTIZATION_PACKAGES.items():
        if module == package or module.startswith(package + "."):
            return "AWQ" if library == "GPTQ" and "awq" in (module + cls.__name__).lower() else library
    return None


def _quant_method(config) -> str | None:
    """`quant_method` of a quantization config (an object or the dict a checkpoint's config.json holds)."""
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
    return str(method) if method is not None else None


def quantization_found(model: torch.nn.Module) -> tuple[str, str] | None:
    """(library, where it was found) for a target quantized by a library (module docstring), or None.

    Reads `model.hf_quantizer` (set by `from_pretrained(..., quantization_config=...)`), `config.quantization_config`
    (a quantized checkpoint's config) and the class names of every layer and weight; imports none of the libraries.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        method = _quant_method(getattr(quantizer, "quantization_config", None)) or type(quantizer).__name__
        if method not in DEQUANTIZING_METHODS:
            return QUANT_METHOD_NAMES.get(method, method), f"model.hf_quantizer (quant_method={method!r})"
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    if quantizer is None and config is not None:
        method = _quant_method(config) or "unknown"
        if method not in DEQUANTIZING_METHODS:
            return QUANT_METHOD_NAMES.get(method, method), f"config.quantization_config (quant_method={method!r})"
    return _quantized_layer(model)


def _quantized_layer(model: torch.nn.Module) -> tuple[str, str] | None:
    """(library, where) for the first layer or weight of a quantization library's class, or a weight that is not a
    floating-point tensor (packed quantized blocks), or None."""
    for name, module in model.named_modules():
        library = _package_library(type(module))
        if library is not None:
            return library, f"layer {name!r} is a {type(module).__name__}"
        for pname, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            library = _package_library(type(tensor))
            if library is not None:
                return library, f"{name}.{pname} is a {type(tensor).__name__}"
            if isinstance(tensor, torch.nn.Parameter) and not (tensor.is_floating_point() or tensor.is_complex()):
                return "an unknown library", f"{name}.{pname} holds {tensor.dtype} values, not floating-point weights"
    return None


def offloaded_shared_weight(model: torch.nn.Module) -> str | None:
    """Which of the weights the drafter shares (input embedding, LM head) is not a tensor on a device, or None."""
    for label, module in (
        ("input embedding", model.get_input_embeddings()),
        ("LM head", model.get_output_embeddings()),
    ):
        weight = getattr(module, "weight", None)
        if module is not None and (not isinstance(weight, torch.Tensor) or weight.device.type == "meta"):
            where = "on the meta device" if isinstance(weight, torch.Tensor) else "not a weight tensor"
            return f"the target's {label} weight is {where}"
    return None


def active_dropout(model: torch.nn.Module) -> str | None:
    """The dropout a target in training mode applies (a Dropout module or a config rate above 0), or None."""
    if not model.training:
        return None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.training and module.p > 0:
            return f"{name} (p={module.p})"
    config = model.config.get_text_config(decoder=True)
    for field in DROPOUT_FIELDS:
        rate = getattr(config, field, None)
        if isinstance(rate, (int, float)) and rate > 0:
            return f"config.{field}={rate}"
    return None


def per_row_adapter_hook(model: torch.nn.Module) -> str | None:
    """The PEFT per-row keyword (`adapter_names`, `alora_offsets`) hooked into `model`'s layers, or None."""
    for module in model.modules():
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, partial):
                found = next((key for key in PER_ROW_HOOK_KEYWORDS if key in hook.keywords), None)
                if found is not None:
                    return found
    return None


def replaced_input_preparation(model: torch.nn.Module) -> object | None:
    """The object whose method replaced `model.prepare_inputs_for_generation` on the instance, or None (no
    override, or the class's own method bound again, as PEFT restores it after a call)."""
    override = vars(model).get("prepare_inputs_for_generation")
    if override is None:
        return None
    own = getattr(type(model), "prepare_inputs_for_generation", None)
    if getattr(override, "__func__", None) is own and getattr(override, "__self__", None) is model:
        return None
    return getattr(override, "__self__", override)


def check_target(model: torch.nn.Module) -> None:
    """Refuse a target DSpark cannot verify exactly as it is (module docstring); returns None when it can."""
    quantized = dynamically_quantized_layer(model)
    if quantized is not None:
        name, cls = quantized
        raise ValueError(
            f"DSpark cannot verify drafts exactly on this target: layer {name!r} is a {cls} (torch.ao quantization). "
            "Dynamic quantization scales each forward's input by that forward's own range, so verifying several "
            "tokens at once computes other logits than plain decoding's one-token steps and changes the output. "
            "Generate with the unquantized target, or without the DSpark assistant."
        )
    found = quantization_found(model)
    if found is not None:
        library, where = found
        raise ValueError(
            f"DSpark cannot verify drafts exactly on this target: it is quantized with {library} ({where}). Quantized "
            "kernels take other paths for one-token decoding steps than for multi-token verification blocks, and "
            "some scale activations over the whole forward, so DSpark's verification would not reproduce plain "
            "generate's output. Generate with the unquantized target: call target.dequantize() where the quantizer "
            "supports it, or load the checkpoint without quantization_config (torch_dtype=torch.bfloat16 or "
            "torch.float32); or generate without the DSpark assistant."
        )
    offloaded = offloaded_shared_weight(model)
    if offloaded is not None:
        raise ValueError(
            f"DSpark cannot draft for this target: {offloaded} (offloaded by accelerate, e.g. cpu_offload or "
            "disk_offload), and the drafter reads the target's embedding and LM head weights directly. Keep them on "
            "a device: load with a device_map that puts 'model.embed_tokens' and 'lm_head' on 'cpu' or a GPU (the "
            "decoder layers may stay offloaded)."
        )
    preparer = replaced_input_preparation(model)
    if preparer is not None:
        raise ValueError(
            f"The target's prepare_inputs_for_generation is replaced by {type(preparer).__name__}'s (PEFT prompt "
            "learning: prompt, prefix or P-tuning adds its virtual tokens there), which the DSpark loop never calls: "
            "it prefills from input_ids, so the virtual tokens would be ignored. Use a LoRA-style adapter, or "
            "generate without the DSpark assistant."
        )
    per_row = per_row_adapter_hook(model)
    if per_row is not None:
        raise ValueError(
            f"PEFT's per-row {per_row} are not supported with the DSpark assistant: PEFT applies one entry per row "
            "of the original batch to every forward, while DSpark's verification forwards carry only the rows still "
            "generating. Generate each adapter's rows in their own call (peft_model.set_adapter(name)), or drop "
            "assistant_model for mixed-adapter batches."
        )
    dropout = active_dropout(model)
    if dropout is not None:
        raise ValueError(
            f"The target is in training mode with dropout active ({dropout}): its forwards are random, so DSpark's "
            "verification cannot reproduce plain generate. Call target.eval() before generating."
        )


def check_attention_implementation(model) -> None:
    """Refuse flash-attention kernels (varlen arguments are not passed) and flex attention (no BlockMask is built):
    DSpark's forwards (generate's and `DSparkEngine`'s) pass per-row 4D masks."""
    attention = getattr(model.config, "_attn_implementation", None) or ""
    if "flash" in attention:
        raise ValueError(
            f"attn_implementation={attention!r} is not supported with the DSpark assistant: its verification batches "
            "carry per-row masks (left padding, ragged lengths) that a padding-free flash kernel would unpad in every "
            "layer with host syncs, and DSpark passes no varlen arguments. Load the target with "
            "attn_implementation='sdpa' (or 'eager')."
        )
    if "flex" in attention:
        raise ValueError(
            f"attn_implementation={attention!r} is not supported with the DSpark assistant: its verification forwards "
            "pass 4D boolean masks, not the BlockMask flex attention needs. Load the target with "
            "attn_implementation='sdpa' (or 'eager')."
        )


def _rope_settings(config) -> list[dict]:
    """The RoPE parameter dicts of a text config (one per layer type where the config has several)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, Mapping):
        return []
    if "rope_type" in params or "type" in params:
        return [dict(params)]
    return [dict(value) for value in params.values() if isinstance(value, Mapping)]


def rope_threshold(config) -> tuple[str, int] | None:
    """(rope type, the sequence length past which its frequencies change) for a length-dependent RoPE scaling,
    or None when the target's RoPE does not depend on the forward's length."""
    for params in _rope_settings(config):
        rope_type = params.get("rope_type", params.get("type"))
        if rope_type not in LENGTH_DEPENDENT_ROPE:
            continue
        threshold = config.max_position_embeddings
        if rope_type == "longrope":
            threshold = (
                params.get("original_max_position_embeddings")
                or getattr(config, "original_max_position_embeddings", None)
                or threshold
            )
        return rope_type, int(threshold)
    return None


def runtime_rope_types(model) -> set[str]:
    """The `rope_type` each rotary-embedding module of `model` runs, which a family may derive differently from its
    config: HunYuan runs a "dynamic" scaling with a fixed `alpha` as the length-independent "ntk_alpha"."""
    return {
        module.rope_type
        for module in model.modules()
        if type(module).__name__.endswith("RotaryEmbedding") and isinstance(getattr(module, "rope_type", None), str)
    }


def rope_reach_refusal(model, reach: int, why: str, fix: str) -> str | None:
    """Why forwards reaching `reach` positions cannot match plain decoding on `model` (a length-dependent RoPE
    whose threshold `reach` passes), or None. `why` says how the call reaches that far; `fix` what to do."""
    found = rope_threshold(model.config.get_text_config(decoder=True))
    if found is None or reach <= found[1]:
        return None
    running = runtime_rope_types(model)
    if running and running.isdisjoint(LENGTH_DEPENDENT_ROPE):
        return None
    rope_type, threshold = found
    return (
        f"The target uses {rope_type!r} RoPE scaling, whose frequencies change once a forward's longest position "
        f"passes {threshold}. {why} can reach {reach} positions, and DSpark's forwards would cross the threshold "
        f"at other steps than plain decoding, changing the output. {fix}"
    )
