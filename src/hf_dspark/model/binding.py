"""Checks that a drafter and a target fit together (vocabulary, hidden size, decoder-only)."""

from __future__ import annotations

import numbers

from torch import nn

from .configuration_dspark import DSparkConfig


def check_target_model(target: object) -> None:
    """Raise `TypeError` naming what was passed unless `target` is a loaded model (an `nn.Module` with a config and
    input embeddings), e.g. a model id string or a config passed where the model itself is needed."""
    if isinstance(target, nn.Module) and getattr(target, "config", None) is not None and callable(
        getattr(target, "get_input_embeddings", None)
    ):
        return
    shown = f"the {type(target).__name__} {target!r}" if isinstance(target, (str, bytes, numbers.Number)) else (
        f"a {type(target).__name__}")
    hint = (f"AutoModelForCausalLM.from_pretrained({target!r})" if isinstance(target, str)
            else "AutoModelForCausalLM.from_pretrained(...)")
    raise TypeError(
        f"target must be the loaded target model (a transformers causal LM), got {shown}; load it first, e.g. "
        f"target = {hint}, and pass that model."
    )


def _text_config(target: nn.Module):
    check_target_model(target)
    config = target.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def validate_target_shape(config: DSparkConfig, target: nn.Module) -> None:
    """Raise `ValueError` saying what does not match between a drafter config and a target model."""
    text = _text_config(target)
    if getattr(text, "is_encoder_decoder", False) or getattr(target.config, "is_encoder_decoder", False):
        raise ValueError("DSpark supports decoder-only targets; this target is an encoder-decoder model.")
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    if embed is None or lm_head is None:
        raise ValueError(f"{type(target).__name__} exposes no input embedding or LM head; is it a causal LM?")
    problems = []
    if embed.weight.shape[0] != config.vocab_size:
        problems.append(
            f"vocabulary: the drafter was built for {config.vocab_size} tokens, the target's embedding has "
            f"{embed.weight.shape[0]} rows"
        )
    if lm_head.weight.shape[0] != config.vocab_size:
        problems.append(
            f"vocabulary: the target's LM head has {lm_head.weight.shape[0]} rows, the drafter expects "
            f"{config.vocab_size}"
        )
    if embed.weight.shape[1] != config.hidden_size:
        problems.append(
            f"hidden size: the drafter has {config.hidden_size}, the target {embed.weight.shape[1]}"
        )
    layers = getattr(text, "num_hidden_layers", None)
    if layers is not None and layers != config.num_target_layers:
        problems.append(f"depth: the drafter taps a {config.num_target_layers}-layer target, this one has {layers}")
    if problems:
        raise ValueError(
            "This drafter does not fit the target (" + "; ".join(problems) + "). Use the drafter trained for this "
            "target, or build a new one with DSparkConfig.from_target(target.config)."
        )


def unbound_assistant_error(drafter) -> AttributeError:
    """The error for `target.generate(assistant_model=drafter)` on a target DSpark is not enabled on.

    transformers' stock assisted loop then reads `assistant_model.generation_config`, which a drafter lacks.
    """
    if getattr(drafter, "is_bound", False):
        cause = (
            "the drafter is bound to another target model instance, so this target runs transformers' own "
            "assisted loop. Bind it to the model you generate with: drafter.bind_target(target)"
        )
    else:
        cause = (
            "the drafter is not bound to a target (it was loaded or built without `target=`), so the target runs "
            "transformers' own assisted loop. Call drafter.bind_target(target) first, or load it with "
            "DSparkDrafter.from_pretrained(path, target=target)"
        )
    return AttributeError(
        f"A DSparkDrafter has no generation_config of its own: {cause}; then call "
        "target.generate(..., assistant_model=drafter)."
    )
