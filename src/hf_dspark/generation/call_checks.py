"""Up-front refusals (and one repair) for DSpark `generate` calls whose inputs the loop cannot serve exactly.

Each check runs before any forward pass, profiling or cache work, and names the input and the fix:

- `inputs_embeds` (a soft prompt, alone or beside `input_ids`): the loop prefills from token ids;
- `dola_layers`: DoLa decoding is a different decoding method (plain `generate` routes it elsewhere);
- settings that make transformers draft with something else than the assistant (`assistant_early_exit`,
  `prompt_lookup_num_tokens`, `use_mtp`, `speculation_type`) or verify against a mixture
  (`assistant_ensemble_weight`), which a DSpark drafter would silently ignore;
- transformers' assisted-decoding knobs (`num_assistant_tokens`, `num_assistant_tokens_schedule`,
  `assistant_confidence_threshold`) when the caller sets them: DSpark's verification policies decide how many
  drafts to verify, so the knobs would be ignored; the message names the DSpark option that does the same;
- RoPE scalings whose frequencies depend on the longest position of a forward (`dynamic` NTK, `longrope`), when
  the call can reach their threshold: a verification forward carries draft slots past the committed tokens, so
  it would cross the threshold at other steps than plain decoding and change every logit from there;
- an offloaded, quantized, paged or unknown `cache_implementation`, a flash- or flex-attention target: fast paths
  the loop cannot use, refused rather than silently replaced (`"static"`, its aliases and `compile_config` take
  the static path, `"dynamic"` and `"hybrid"` the dynamic one);
- a target moved to another dtype or device after the drafter was bound: the drafter is re-bound (it follows the
  target, as binding made it do), instead of failing deep inside the loop on a dtype mismatch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from transformers import GenerationConfig
from transformers.utils import logging

from ..target.static_cache import STATIC_PATH_CACHES

logger = logging.get_logger(__name__)

# RoPE types whose frequencies are recomputed from the largest position id of each forward.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def check_prompt_inputs(model_kwargs: Mapping) -> None:
    """Refuse `inputs_embeds` (with or without `input_ids`) before any work."""
    if model_kwargs.get("inputs_embeds") is None:
        return
    alongside = " alongside input_ids" if model_kwargs.get("input_ids") is not None else ""
    raise ValueError(
        f"DSpark does not support inputs_embeds{alongside} (a soft prompt): its prefill, drafter and logits "
        "processors read the prompt as token ids, so the embeddings would be ignored. Pass the prompt as input_ids "
        "only, or generate without the DSpark assistant (drop assistant_model) for soft prompts."
    )


# Settings with which transformers' `generate` drafts with something else than the given `assistant_model`, or
# verifies against another distribution than the target's: a DSpark drafter would silently ignore them.
OTHER_DRAFTING = {
    "assistant_early_exit": "drafts with the target's own first layers (self-speculative early exit) instead of the "
    "assistant_model. Drop assistant_early_exit to draft with DSpark, or drop assistant_model "
    "for early-exit drafting.",
    "prompt_lookup_num_tokens": "drafts by prompt lookup instead of with the assistant_model. Drop it to draft with "
    "DSpark; for prompt lookup in DSpark's batched loop pass assistant_model="
    "hf_dspark.proposers.prompt_lookup_for(target, γ).",
    "use_mtp": "drafts with the target's own multi-token prediction heads instead of the assistant_model. Drop "
    "use_mtp to draft with DSpark.",
    "speculation_type": "selects transformers' own candidate generator for that kind of drafter, while a DSpark "
    "drafter runs DSpark's loop. Drop speculation_type.",
    "assistant_ensemble_weight": "verifies drafts against the mixture w·p_target + (1 − w)·q_draft (lossy), while "
    "DSpark verifies against the target's distribution only, so it would be ignored. "
    "Drop assistant_ensemble_weight (lossless), or generate with a transformers "
    "assistant.",
}


def check_other_drafting(settings: Mapping) -> None:
    """Refuse the `OTHER_DRAFTING` settings set in `settings` (name -> the value generate would use)."""
    for name, why in OTHER_DRAFTING.items():
        value = settings.get(name)
        if value is not None and value is not False:
            raise ValueError(f"{name}={value!r} is not supported with a DSpark drafter: transformers' generate {why}")


# transformers' knobs for how much its assistant drafts per round. A DSpark drafter proposes γ = block_size drafts
# and its verification policy (`dspark_policy`) chooses how many to verify, so these would be silently ignored.
# Each message is formatted with the drafter's block size (`gamma`).
ASSISTANT_KNOBS = {
    "num_assistant_tokens": "sets how many tokens transformers' assistant drafts per round; a DSpark drafter "
    "proposes γ = {gamma} and its verification policy chooses how many to verify. For a fixed length pass "
    "dspark_policy='fixed' (dspark_verify_len=N, 0..{gamma}; default γ), or keep the default 'auto' policy.",
    "num_assistant_tokens_schedule": "adapts transformers' assistant draft length between rounds; DSpark's "
    "policies choose the verification length of each row every round instead: drop it and keep the default "
    "dspark_policy='auto', or pass dspark_policy='fixed' for a constant γ = {gamma}.",
    "assistant_confidence_threshold": "stops transformers' assistant drafting where its confidence falls below "
    "it; with DSpark pass dspark_policy='threshold' (prefix survival) or 'slot_threshold' (each slot) with "
    "dspark_threshold=<value in [0, 1]> instead.",
}


@functools.cache
def _transformers_defaults() -> dict:
    """The values transformers' `generate` fills in for settings left unset by the caller and the model."""
    defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
    return dict(defaults()) if callable(defaults) else {}


def explicit_assistant_knobs(kwargs: Mapping, passed_config, model_config) -> dict:
    """The `ASSISTANT_KNOBS` the caller set: as a keyword argument (not None), or on a passed `GenerationConfig`
    (or the per-call config transformers merged) whose value differs from both transformers' default and the
    target's own `generation_config` (`model_config`), whose values are not the caller's doing."""
    found = {}
    for name in ASSISTANT_KNOBS:
        if kwargs.get(name) is not None:
            found[name] = kwargs[name]
            continue
        value = getattr(passed_config, name, None) if passed_config is not None else None
        default = _transformers_defaults().get(name)
        if value is not None and value != default and value != getattr(model_config, name, None):
            found[name] = value
    return found


def check_assistant_knobs(explicit: Mapping, block_size: int) -> None:
    """Refuse the `ASSISTANT_KNOBS` in `explicit` (name -> the value the caller set), naming the DSpark option."""
    for name, why in ASSISTANT_KNOBS.items():
        if name in explicit:
            raise ValueError(
                f"{name}={explicit[name]!r} is not supported with a DSpark drafter (it would be ignored): it "
                f"{why.format(gamma=block_size)}"
            )


def check_decoding_method(generation_config) -> None:
    """Refuse generation settings that select another decoding method than greedy / sampling."""
    if getattr(generation_config, "dola_layers", None) is not None:
        raise ValueError(
            f"dola_layers={generation_config.dola_layers!r} asks for DoLa decoding, which DSpark speculative "
            "decoding does not implement (the verification would ignore it): drop dola_layers, or generate without "
            "the DSpark assistant."
        )


# Cache implementations DSpark honours as plain `generate` does: the default dynamic cache; the names transformers
# builds a StaticCache for (`static_cache.STATIC_PATH_CACHES`: "static" and its deprecated aliases), verified on the
# static path; "hybrid", which transformers unsets (dynamic). Every other name is refused (`cache_implementation_
# refusal`).
HONOURED_CACHES = ("dynamic", "hybrid", *STATIC_PATH_CACHES)
CACHE_FIX = (
    "Drop cache_implementation (the default dynamic cache) or pass cache_implementation='static' (the "
    "static-shape verification path)."
)


def cache_implementation_refusal(implementation: str | None) -> str | None:
    """Why DSpark cannot honour `cache_implementation=implementation` (with the fix), or None when it can."""
    if implementation is None or implementation in HONOURED_CACHES:
        return None
    name = f"cache_implementation={implementation!r}"
    if "offloaded" in implementation:
        return (
            f"{name} moves each layer's keys and values to the CPU between forwards (offloading), which DSpark's "
            f"ragged verification cache does not implement: its per-row buffers stay on the target's device. "
            f"{CACHE_FIX}"
        )
    if implementation == "quantized":
        return (
            f"{name} quantizes the keys and values plain generate attends to, while DSpark's verification cache "
            "holds them at the target's precision, so the output would not be plain generate's. Drop "
            "cache_implementation (the default dynamic cache), or generate without the DSpark assistant."
        )
    if implementation == "paged":
        return (
            f"{name} switches generate to continuous batching (generate_batch), which takes no assistant model. "
            "For continuous batching with DSpark use hf_dspark.serving.engine.DSparkEngine; or drop "
            "cache_implementation."
        )
    return (
        f"{name} is not one DSpark knows (it honours {', '.join(map(repr, HONOURED_CACHES))}), so it cannot tell "
        f"whether its verification would match plain generate. {CACHE_FIX}"
    )


def check_cache_implementation(implementation: str | None) -> None:
    """Refuse a cache implementation DSpark cannot honour (`cache_implementation_refusal`)."""
    reason = cache_implementation_refusal(implementation)
    if reason is not None:
        raise ValueError(reason)


def check_fast_paths(model, generation_config) -> None:
    """Refuse the fast paths the loop cannot honour, instead of silently running without them: offloaded, quantized,
    paged or unknown caches (`cache_implementation_refusal`) and the attention kernels of
    `check_attention_implementation`. `cache_implementation="static"`, its aliases and `compile_config` take the
    static path (`static_cache`)."""
    check_cache_implementation(getattr(generation_config, "cache_implementation", None))
    check_attention_implementation(model)


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


def check_rope_scaling(model, max_length: int | None, block_size: int) -> None:
    """Refuse a call that can cross a length-dependent RoPE threshold (`rope_threshold`).

    A verification forward holds up to γ = `block_size` slots past a row's committed tokens, so positions can
    reach `max_length + block_size` (conservatively).
    """
    if max_length is None:
        return
    found = rope_threshold(model.config.get_text_config(decoder=True))
    limit = found[1] - block_size if found is not None else 0
    reason = rope_reach_refusal(
        model,
        int(max_length) + int(block_size),
        f"This call (max_length {max_length} plus γ = {block_size} draft slots)",
        f"Keep prompt + max_new_tokens at most {limit} tokens, or generate without the DSpark assistant for longer "
        "sequences.",
    )
    if reason is not None:
        raise ValueError(reason)


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


def check_call(model, drafter, generation_config) -> None:
    """Every check above that needs the bound pair and the prepared generation config."""
    check_decoding_method(generation_config)
    check_other_drafting({name: getattr(generation_config, name, None) for name in OTHER_DRAFTING})
    check_fast_paths(model, generation_config)
    check_rope_scaling(model, generation_config.max_length, drafter.config.block_size)
    follow_target_moves(model, drafter)
