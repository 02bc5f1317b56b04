"""A drafter and its target: do they fit (vocabulary, hidden size, depth, decoder-only), binding one to the other
for a call, and the error transformers' own assisted loop meets when it is handed a DSpark drafter."""

from __future__ import annotations

import numbers

from torch import nn
from transformers.utils import logging

from .configuration_dspark import DSparkConfig

logger = logging.get_logger(__name__)


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


def bind_drafter(model, drafter) -> None:
    """Check that `drafter` fits `model` and bind it when unbound.

    A drafter bound to another model instance is refused, never rebound: binding moves it to the new model's
    embedding, LM head, device and dtype, so the other model's `generate` calls would be refused and an engine
    already serving it would draft with the wrong model's weights (or fail on a device/dtype mismatch).
    """
    if not hasattr(drafter, "bind_target"):  # a model-free drafter (oracle, prompt lookup): nothing to bind
        validate_target_shape(drafter.config, model)
        return
    if drafter.is_bound and not drafter.bound_to(model):
        raise ValueError(
            "This drafter is bound to a different target model instance; using it here would take it from that "
            "model (an engine serving it would then draft with this model's weights). Bind it to the model you "
            "generate with: drafter.bind_target(model), or load a second drafter for this model."
        )
    validate_target_shape(drafter.config, model)
    if not drafter.is_bound:
        drafter.bind_target(model)


def follow_target_moves(model, drafter) -> None:
    """Re-bind a `DSparkDrafter` bound to `model` when the target moved to another dtype or device since binding
    (`model.to(torch.bfloat16)`): binding made the drafter follow the target, so it follows it again."""
    if not hasattr(drafter, "bind_target") or not drafter.bound_to(model):
        return
    weight = model.get_input_embeddings().weight
    own = next(drafter.parameters(), None)
    if own is None or (own.dtype == weight.dtype and own.device == weight.device):
        return
    logger.warning(
        f"The target moved to {weight.dtype} on {weight.device} after the drafter was bound "
        f"({own.dtype} on {own.device}); re-binding the drafter so it follows the target."
    )
    drafter.bind_target(model)


# What transformers' own assisted loop reads of its assistant first (`AssistedCandidateGenerator`): a DSpark drafter
# answers them with `stock_loop_error` where it cannot serve them.
STOCK_LOOP_READS = ("device", "generation_config", "_supports_logits_to_keep", "generate")


def stock_loop_error(drafter) -> AttributeError:
    """The error for a DSpark drafter (or a drafter wrapping one: `drafter`) that transformers' own assisted loop
    is about to use, which happens only on a target DSpark is not enabled on: an unbound drafter (never bound, so
    never enabled on any target) is asked for its `generation_config` (a hybrid drafter for its `device`), a bound
    one for what a transformers assistant has and it lacks (`STOCK_LOOP_READS`)."""
    if getattr(drafter, "is_bound", False):
        cause = (
            "the model generating is not DSpark-enabled, so it ran transformers' own assisted loop. The drafter is "
            "bound to a target model instance: if this is another model, bind the drafter to it "
            "(drafter.bind_target(model)) or load a second drafter for it; if hf_dspark.disable(model) was called "
            "on its own target, call hf_dspark.enable(model) (or drafter.bind_target(model)) again"
        )
    else:
        cause = (
            "the drafter is not bound to a target (it was loaded or built without `target=`), so the target runs "
            "transformers' own assisted loop. Call drafter.bind_target(target) first, or load it with "
            "DSparkDrafter.from_pretrained(path, target=target)"
        )
    return AttributeError(
        f"A DSpark drafter cannot run as a transformers assistant: {cause}; then call "
        "target.generate(..., assistant_model=drafter)."
    )
