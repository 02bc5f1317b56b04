"""Every up-front check of a DSpark call, in one module, run exactly once per call on every entry.

Two functions, each run once per call, before any forward pass, profiling run or cache work; every refusal names
the input and the fix:

- `check_call(model, drafter, generation_config)`: what the call asks for (decoding method, transformers'
  assisted-decoding settings the drafter would ignore, sampling and EOS settings, cache and attention
  implementations), the target (`hf_dspark.target.checks`) and the drafter (bound here when unbound; refused when
  bound to another target; re-bound when the target moved). Run by `generate` from the DSpark-enabled class's
  `_validate_generation_mode`, which transformers' `generate` looks up on the instance after merging the call's
  generation config and before it acts on the decoding method, so it runs alike when the drafter was bound
  before the call and when `bind_target` ran while the call's arguments were evaluated (`generate` itself was
  looked up on the original class then); by `dspark_generate` (`custom_generate`) at its start; by `DSparkEngine`
  in its constructor (drafter None: plain decoding).
- `check_prompt(model, drafter, input_ids, model_kwargs, generation_config)`: the prompt as the loop receives it
  (no soft prompt, at least one token, left padding) and how far its forwards reach (length-dependent RoPE); run
  at the start of the loop (`loop.dspark_decoding`), where transformers has prepared the inputs and the final
  `max_length`.

Refused: beam search and the other decoding methods plain `generate` would switch to while dropping the assistant;
`num_return_sequences > 1`; `output_attentions` / `output_hidden_states`; `dola_layers`; settings that make
transformers draft with something else than the assistant (`OTHER_DRAFTING`) and its assisted-decoding knobs
(`ASSISTANT_KNOBS`), set on the call or on the drafter's own `generation_config`; an `eos_token_id` that is not token
ids; out-of-range sampling settings; an offloaded, quantized, paged or unknown `cache_implementation`; flash or flex
attention; `inputs_embeds`; an empty prompt; right padding; a call that can cross a length-dependent RoPE threshold.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.utils import logging

from ..model.binding import bind_drafter, follow_target_moves
from ..proposers.base import DraftModel, is_draft_model
from ..target.checks import check_attention_implementation, check_target, rope_reach_refusal, rope_threshold
from ..target.ragged_cache import attention_layout
from ..target.static_cache import STATIC_PATH_CACHES

logger = logging.get_logger(__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _setting(config: Any, name: str) -> Any:
    """`config.name`, None where the settings object has no such field (the engine passes only its own)."""
    return getattr(config, name, None)


# ------------------------------------------------------------------ the decoding method and outputs
def check_decoding_method(config: Any) -> None:
    """Refuse settings that select another decoding method than greedy / sampling (transformers would then drop
    the assistant and decode without it) or outputs the ragged verification cannot give."""
    beams = _setting(config, "num_beams") or 1
    if beams > 1:
        raise ValueError(
            f"DSpark does not support beam search (num_beams={beams}; transformers' generate would drop the "
            "assistant and run plain beam search): set num_beams=1 (greedy or sampling), or drop assistant_model "
            "for beam search."
        )
    if _setting(config, "constraints") is not None or _setting(config, "force_words_ids") is not None:
        raise ValueError(
            "constraints / force_words_ids ask for constrained beam search, which DSpark does not support: drop "
            "them, or generate without the DSpark assistant."
        )
    alpha, top_k = _setting(config, "penalty_alpha"), _setting(config, "top_k")
    if not _setting(config, "do_sample") and alpha is not None and alpha > 0 and top_k is not None and top_k > 1:
        raise ValueError(
            f"penalty_alpha={alpha!r} with top_k={top_k!r} asks for contrastive search, which DSpark does not "
            "implement (transformers would drop the assistant): drop penalty_alpha, or generate without the "
            "DSpark assistant."
        )
    if (_setting(config, "num_return_sequences") or 1) > 1:
        raise ValueError(
            "DSpark generates one sequence per prompt: set num_return_sequences=1 and repeat the prompt in the "
            "batch instead (batches of any size are supported)."
        )
    if _setting(config, "output_attentions") or _setting(config, "output_hidden_states"):
        raise ValueError(
            "output_attentions / output_hidden_states are not available with DSpark (the target runs on "
            "ragged verification blocks); use output_scores or output_logits."
        )
    if _setting(config, "dola_layers") is not None:
        raise ValueError(
            f"dola_layers={config.dola_layers!r} asks for DoLa decoding, which DSpark speculative decoding does not "
            "implement (the verification would ignore it): drop dola_layers, or generate without the DSpark "
            "assistant."
        )


# ------------------------------------------------------------------ sampling and EOS
def check_sampling_settings(do_sample: bool, temperature: Any, top_k: Any, top_p: Any) -> None:
    """Refuse sampling settings that are out of range or of the wrong type (None: unset).

    transformers only checks some when it builds its warpers, and skips `top_p > 1` silently; this names each.
    """
    if temperature is not None and (not _is_number(temperature) or not 0.0 <= float(temperature) < math.inf):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}.")
    if do_sample and temperature is not None and float(temperature) == 0.0:
        raise ValueError("temperature=0 cannot be sampled from: set do_sample=False for greedy decoding, or a "
                         "temperature > 0.")
    if top_p is not None and (not _is_number(top_p) or not 0.0 < float(top_p) <= 1.0):
        raise ValueError(f"top_p must be a number in (0, 1] (the probability mass kept; 1 keeps every token), got "
                         f"{top_p!r}.")
    if top_k is not None and (not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or top_k < 0):
        raise ValueError(f"top_k must be an integer >= 0 (0 or None: no top-k filtering), got {top_k!r}.")


def eos_token_ids(value: Any) -> list[int]:
    """`eos_token_id` as a list of token ids: an int, a list/tuple of ints or an integer tensor (None: no EOS).

    Anything else (a token string, a negative id, a float...) is a `ValueError` naming it, instead of an EOS that
    never matches.
    """
    if value is None:
        return []
    if isinstance(value, torch.Tensor) and not (value.dtype.is_floating_point or value.dtype.is_complex
                                                or value.dtype == torch.bool):
        value = value.reshape(-1).tolist()
    ids = list(value) if isinstance(value, (list, tuple)) else [value]
    bad = [i for i in ids if not isinstance(i, numbers.Integral) or isinstance(i, bool) or i < 0]
    if bad:
        raise ValueError(
            f"eos_token_id must be a token id (an int >= 0) or a list of them, got {value!r}; for a token string "
            "use tokenizer.convert_tokens_to_ids(token)."
        )
    return [int(i) for i in ids]


def check_decoding_settings(config: Any) -> None:
    """A call's `eos_token_id` (token ids) and its temperature / top-k / top-p (out-of-range values are refused
    whether or not the call samples; temperature 0 only when it samples)."""
    eos_token_ids(_setting(config, "eos_token_id"))
    check_sampling_settings(bool(_setting(config, "do_sample")), _setting(config, "temperature"),
                            _setting(config, "top_k"), _setting(config, "top_p"))


# Settings with which transformers' `generate` drafts with something else than the given `assistant_model`, or
# verifies against another distribution than the target's: a DSpark drafter would silently ignore them.
OTHER_DRAFTING = {
    "assistant_early_exit": "drafts with the target's own first layers (self-speculative early exit) instead of the "
    "assistant_model. Drop assistant_early_exit to draft with DSpark, or drop assistant_model "
    "for early-exit drafting.",
    "prompt_lookup_num_tokens": "drafts by prompt lookup instead of with the assistant_model. Drop it to draft with "
    "DSpark; for prompt lookup in DSpark's batched loop pass assistant_model="
    "hf_dspark.generation.prompt_lookup_for(target, γ).",
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


def explicit_assistant_knobs(generation_config: Any, model_config: Any, drafter: Any = None) -> dict[str, Any]:
    """The `ASSISTANT_KNOBS` the caller set, as `{where + name: value}`: on the call (the merged per-call
    `generation_config`, keyword arguments included) where the value differs from both transformers' default and
    the target's own `generation_config` (`model_config`, whose values are not the caller's doing), and on the
    drafter's own `generation_config` (`assistant_model.generation_config.<name>`, where transformers reads them,
    as its own tests set them) where it differs from transformers' default."""
    found = {}
    own = vars(drafter).get("generation_config") if drafter is not None and hasattr(drafter, "__dict__") else None
    for name in ASSISTANT_KNOBS:
        default = _transformers_defaults().get(name)
        value = _setting(generation_config, name)
        if value is not None and value != default and value != _setting(model_config, name):
            found[name] = value
        value = _setting(own, name)
        if value is not None and value != default:
            found[f"assistant_model.generation_config.{name}"] = value
    return found


def check_assistant_knobs(explicit: Mapping[str, Any], block_size: int) -> None:
    """Refuse the `ASSISTANT_KNOBS` in `explicit` (`explicit_assistant_knobs`), naming the DSpark option."""
    for where, value in explicit.items():
        name = where.rpartition(".")[2]
        reset = (f" (set it back to {_transformers_defaults().get(name)!r} or drop the assignment)"
                 if where != name else "")
        raise ValueError(
            f"{where}={value!r} is not supported with a DSpark drafter (it would be ignored){reset}: it "
            f"{ASSISTANT_KNOBS[name].format(gamma=block_size)}"
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


# ------------------------------------------------------------------ the prompt
def check_prompt_inputs(model_kwargs: Mapping) -> None:
    """Refuse `inputs_embeds` (with or without `input_ids`)."""
    if model_kwargs.get("inputs_embeds") is None:
        return
    alongside = " alongside input_ids" if model_kwargs.get("input_ids") is not None else ""
    raise ValueError(
        f"DSpark does not support inputs_embeds{alongside} (a soft prompt): its prefill, drafter and logits "
        "processors read the prompt as token ids, so the embeddings would be ignored. Pass the prompt as input_ids "
        "only, or generate without the DSpark assistant (drop assistant_model) for soft prompts."
    )


def check_prompt_ids(input_ids: Any) -> None:
    """Refuse a prompt tensor with no tokens (`[B, 0]`): DSpark continues each row from its last prompt token."""
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() >= 1 and input_ids.shape[-1] == 0:
        raise ValueError(
            f"input_ids has no tokens (shape {list(input_ids.shape)}): a prompt needs at least one token per row "
            "(DSpark continues each row from its last one); pass at least the BOS token (tokenizer.bos_token_id)."
        )


def check_left_padded(attention_mask: torch.Tensor | None) -> None:
    """Refuse right padding (a 0 after a 1 in a row of `attention_mask` `[B, L]`; one read, once per call).

    Decoder-only generation continues each row from its last position; with right padding the new tokens would
    follow the pad tokens, and plain `generate` only warns and returns a continuation of the padding.
    """
    if attention_mask is None or attention_mask.dim() != 2:
        return
    seen = attention_mask.bool().long().cummax(dim=1).values.bool()
    holes = seen & ~attention_mask.bool()
    if bool(holes.any()):
        rows = holes.any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"attention_mask has padding after real tokens in row(s) {rows} (right padding). DSpark continues "
            "each row from its last real token and needs left-padded batches: set `tokenizer.padding_side = "
            '"left"` before tokenizing.'
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


def check_call(model: torch.nn.Module, drafter: DraftModel | None, generation_config: Any) -> None:
    """Every check of a call that needs no prompt (module docstring), in this order: the drafter's type, the
    decoding method, other drafting settings and assistant knobs, sampling / EOS settings, the cache and attention
    implementations, the target, then the drafter's fit (bound here when unbound, re-bound when the target moved).

    generation_config: the call's merged `GenerationConfig` (or any object with those fields: a missing one counts
    as unset). drafter: the call's `DraftModel`, or None for plain decoding (`DSparkEngine(policy="none")`).
    """
    if drafter is not None and not is_draft_model(drafter):
        raise TypeError(
            f"the DSpark loop needs a DSpark drafter as assistant (a DSparkDrafter or another "
            f"hf_dspark.generation.drafting.DraftModel), got {type(drafter).__name__}."
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("DSpark speculative decoding supports decoder-only targets, not encoder-decoder models.")
    check_decoding_method(generation_config)
    check_other_drafting({name: _setting(generation_config, name) for name in OTHER_DRAFTING})
    if drafter is not None:
        knobs = explicit_assistant_knobs(generation_config, model.generation_config, drafter)
        check_assistant_knobs(knobs, drafter.config.block_size)
    check_decoding_settings(generation_config)
    check_cache_implementation(_setting(generation_config, "cache_implementation"))
    check_attention_implementation(model)
    check_target(model)  # quantized, offloaded, dropout-active or PEFT prompt-learning targets
    attention_layout(model)  # attention layers the ragged verification cache cannot mask, with the reason
    if drafter is not None:
        bind_drafter(model, drafter)
        follow_target_moves(model, drafter)


def check_prompt(model: torch.nn.Module, drafter: DraftModel, input_ids: torch.Tensor, model_kwargs: Mapping,
                 generation_config: Any) -> None:
    """The prompt as the loop receives it (module docstring): no `inputs_embeds`, at least one token per row, left
    padding, and a `max_length` (final by now) whose forwards cannot cross a length-dependent RoPE threshold."""
    check_prompt_inputs(model_kwargs)
    check_prompt_ids(input_ids)
    check_left_padded(model_kwargs.get("attention_mask"))
    check_rope_scaling(model, generation_config.max_length, drafter.config.block_size)
