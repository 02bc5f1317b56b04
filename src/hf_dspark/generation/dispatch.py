"""Route `target.generate(assistant_model=<DSparkDrafter>)` to the DSpark loop without forking transformers.

`generate` looks up `_assisted_decoding` on the target's *class*, so `enable(target)` gives that one instance a
cached subclass (same class name, so saved configs and reprs are unchanged) whose `_assisted_decoding` runs the
DSpark loop when the assistant is a `DSparkDrafter` and transformers' stock loop for every other assistant.
`drafter.bind_target(target)` calls it. `disable(target)` restores the original class.

For users who want no patching, `dspark_generate` is a `custom_generate` callable:
`target.generate(**inputs, custom_generate=dspark_generate, drafter=drafter)` (transformers then drops
`assistant_model` and `streamer`; pass `dspark_streamer=` instead).

`generation_config.dspark_stock_loop=True` instead runs transformers' own batch-1 `_assisted_decoding` with a
`DSparkCandidateGenerator` as its candidate generator (fixed ℓ = γ; no scheduler), for comparison.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch

from ..model.binding import validate_target_shape
from ..target.checks import check_target
from ..target.output_cache import continuation_mask
from ..target.ragged_cache import attention_layout
from .call_checks import (
    OTHER_DRAFTING,
    check_assistant_knobs,
    check_cache_implementation,
    check_other_drafting,
    check_prompt_inputs,
    explicit_assistant_knobs,
)
from .candidate_generator import DSparkCandidateGenerator
from .drafting import DraftModel, is_draft_model
from .loop import dspark_decoding
from .options import (
    DSparkGenerationOptions,
    check_decoding_settings,
    check_left_padded,
    check_prompt_ids,
    generation_config_options,
    validate_dspark_options,
)

_SUBCLASSES: dict[type, type] = {}


def _requested_beams(model, kwargs) -> int:
    if kwargs.get("num_beams") is not None:
        return int(kwargs["num_beams"])
    config = kwargs.get("generation_config") or model.generation_config
    return int(getattr(config, "num_beams", 1) or 1)


def _requested(model, args, kwargs, name: str):
    """The value `generate` will use for generation setting `name`: the keyword argument, else the passed
    `generation_config`'s, else the model's (None when unset everywhere)."""
    if kwargs.get(name) is not None:
        return kwargs[name]
    config = kwargs.get("generation_config", args[1] if len(args) > 1 else None)
    value = getattr(config, name, None) if config is not None else None
    return value if value is not None else getattr(model.generation_config, name, None)


def _check_call_inputs(model, drafter, args, kwargs) -> None:
    """Up-front checks of a DSpark `generate` call's prompt and decoding settings, before transformers prepares
    anything: an empty prompt, an `eos_token_id` that is not token ids, out-of-range sampling settings, settings
    the DSpark drafter would ignore."""
    check_prompt_inputs(kwargs)  # soft prompts: before transformers prepares anything
    check_prompt_ids(args[0] if args else kwargs.get("inputs", kwargs.get("input_ids")))
    check_cache_implementation(_requested(model, args, kwargs, "cache_implementation"))  # before it is built
    check_other_drafting({name: _requested(model, args, kwargs, name) for name in OTHER_DRAFTING})
    passed = kwargs.get("generation_config", args[1] if len(args) > 1 else None)
    knobs = explicit_assistant_knobs(kwargs, passed, model.generation_config)
    check_assistant_knobs(knobs, drafter.config.block_size)
    settings = {
        name: _requested(model, args, kwargs, name)
        for name in ("eos_token_id", "do_sample", "temperature", "top_k", "top_p")
    }
    check_decoding_settings(SimpleNamespace(**settings))


def _options(generation_config) -> DSparkGenerationOptions:
    """The typed `dspark_*` options of `generation_config` (checked; unset ones None)."""
    return DSparkGenerationOptions.from_generation_config(generation_config)


def _holds_observers(generation_config) -> bool:
    """Whether `dspark_observers` is set on `generation_config` (whatever its value: where they would be copies,
    any value is refused before it is checked)."""
    return generation_config_options(generation_config).get("dspark_observers") is not None


def _without_observers(model, generation_config):
    """(config to hand to transformers, the observers it held or None).

    transformers deep-copies the generation config, which would give the loop copies of the caller's observers
    (and fail on observers holding a lock or a file): the config travels as a shallow copy without them, and the
    caller's own objects are put back on transformers' copy. Observers on the model's `generation_config` are
    refused: transformers merges that config into every call's by copying it.
    """
    if _holds_observers(model.generation_config):
        raise ValueError(
            "dspark_observers on the model's generation_config would reach the loop as deep copies; "
            "pass them per call: generate(..., dspark_observers=[...])."
        )
    observers = _options(generation_config).dspark_observers
    if observers is None:
        return generation_config, None
    shallow = copy.copy(generation_config)
    vars(shallow).pop("dspark_observers", None)
    return shallow, observers


def _callers_cache(model_kwargs) -> tuple[object | None, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(the cache object the caller passed, copies of the keys and values it already holds per layer), or
    (None, []) when transformers made the cache. The loop may use and drop rows of the caller's object in place."""
    cache = model_kwargs.get("cache")
    if cache is None or not getattr(cache, "_is_user_defined", False):
        return None, []
    if not cache.get_seq_length():
        return cache, []
    return cache, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def _fill_callers_cache(model, output, generation_config, cache, prefix, prompt_mask):
    """Leave the cache object the caller passed (`generate(..., cache=c)`) as plain `generate` leaves it: the
    prefix it held, then the keys and values of every later position but the last of each returned sequence, so a
    later call can continue from it. `c` is reset, given its prefix back and extended by one target forward over
    the new positions (on top of that prefix, positions from the mask as plain decoding's). Returns `output`, whose
    returned cache is then `c` itself, as plain's is."""
    if cache is None or generation_config.use_cache is False:
        return output
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    cached = prefix[0][0].shape[2] if prefix else 0
    mask = continuation_mask(prompt_mask, sequences)[:, :-1]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate's prepare_inputs does
    cache.reset()
    for index, (keys, values) in enumerate(prefix):
        cache.update(keys, values, index)
    with torch.no_grad():
        model(
            input_ids=sequences[:, cached:-1],
            attention_mask=mask,
            position_ids=positions[:, cached:],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    if not isinstance(output, torch.Tensor):
        output.cache = cache
    return output


def _run_dspark(
    model, input_ids, logits_processor, stopping_criteria, generation_config, streamer, drafter, model_kwargs
):
    """`dspark_decoding`, then the caller's cache object filled as plain `generate` fills it."""
    (cache, prefix), prompt_mask = _callers_cache(model_kwargs), model_kwargs.get("attention_mask")
    output = dspark_decoding(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        streamer=streamer,
        assistant_model=drafter,
        **model_kwargs,
    )
    return _fill_callers_cache(model, output, generation_config, cache, prefix, prompt_mask)


def _dspark_subclass(cls: type) -> type:
    if cls in _SUBCLASSES:
        return _SUBCLASSES[cls]

    def _assisted_decoding(
        self,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus=False,
        streamer=None,
        inputs_tensor=None,
        assistant_model=None,
        assistant_tokenizer=None,
        tokenizer=None,
        **model_kwargs,
    ):
        if is_draft_model(assistant_model) and not _options(generation_config).dspark_stock_loop:
            check_left_padded(model_kwargs.get("attention_mask"))
            return _run_dspark(
                self,
                input_ids,
                logits_processor,
                stopping_criteria,
                generation_config,
                streamer,
                assistant_model,
                model_kwargs,
            )
        return cls._assisted_decoding(
            self,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            inputs_tensor=inputs_tensor,
            assistant_model=assistant_model,
            assistant_tokenizer=assistant_tokenizer,
            tokenizer=tokenizer,
            **model_kwargs,
        )

    def _get_candidate_generator(
        self,
        generation_config,
        input_ids,
        inputs_tensor,
        logits_processor,
        model_kwargs,
        assistant_model=None,
        **kwargs,
    ):
        if is_draft_model(assistant_model):  # only reached with dspark_stock_loop=True
            if input_ids.shape[0] != 1:
                raise ValueError("dspark_stock_loop=True runs transformers' batch-1 loop: pass one prompt")
            return DSparkCandidateGenerator.for_stock_loop(
                assistant_model, logits_processor, bool(generation_config.do_sample)
            )
        return cls._get_candidate_generator(
            self,
            generation_config,
            input_ids,
            inputs_tensor,
            logits_processor,
            model_kwargs,
            assistant_model=assistant_model,
            **kwargs,
        )

    def generate(self, *args, assistant_model=None, **kwargs):
        if is_draft_model(assistant_model):
            if _requested_beams(self, kwargs) > 1:  # transformers would silently drop the assistant
                raise ValueError("DSpark does not support beam search: set num_beams=1 (greedy or sampling).")
            _check_call_inputs(self, assistant_model, args, kwargs)
            check_target(self)  # quantized, offloaded or dropout-active targets
            validate_target_shape(assistant_model.config, self)  # before transformers' tokenizer-pair check
            attention_layout(self)  # refuses attention layers ragged verification cannot mask, with the reason
        return cls.generate(self, *args, assistant_model=assistant_model, **kwargs)

    def _prepare_generation_config(self, generation_config, **kwargs):
        # `generate(..., dspark_policy="lagged")`: transformers only copies kwargs naming known GenerationConfig
        # fields and would reject the rest as unused model kwargs, so `dspark_*` options are set on the copy here.
        options = {key: kwargs.pop(key) for key in [k for k in kwargs if k.startswith("dspark_")]}
        validate_dspark_options(options)
        generation_config, observers = _without_observers(self, generation_config)
        if observers is not None:
            options.setdefault("dspark_observers", observers)  # a generate() argument wins over the config's
        config, model_kwargs = cls._prepare_generation_config(self, generation_config, **kwargs)
        for key, value in options.items():
            setattr(config, key, value)
        validate_dspark_options(generation_config_options(config))  # also options set on a GenerationConfig
        return config, model_kwargs

    sub = type(
        cls.__name__,
        (cls,),
        {
            "_assisted_decoding": _assisted_decoding,
            "generate": generate,
            "_dspark_base_class": cls,
            "_prepare_generation_config": _prepare_generation_config,
            "_get_candidate_generator": _get_candidate_generator,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        },
    )
    _SUBCLASSES[cls] = sub
    return sub


def enable(target) -> None:
    """Make `target.generate(assistant_model=drafter)` run DSpark for DSpark drafters (this instance only)."""
    cls = type(target)
    if getattr(cls, "_dspark_base_class", None) is not None:
        return
    target.__class__ = _dspark_subclass(cls)


def disable(target) -> None:
    """Undo `enable(target)`."""
    base = getattr(type(target), "_dspark_base_class", None)
    if base is not None:
        target.__class__ = base


def is_enabled(target) -> bool:
    return getattr(type(target), "_dspark_base_class", None) is not None


def dspark_generate(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus=False,
    drafter: DraftModel | None = None,
    dspark_streamer=None,
    dspark_observers=None,
    **model_kwargs,
):
    """`custom_generate` entry point: `model.generate(**inputs, custom_generate=dspark_generate, drafter=d)`.

    Round observers travel as an argument (`dspark_observers=[...]`): transformers has deep-copied the generation
    config by now, so observers set on it would be copies, and are refused.
    """
    if drafter is None:
        raise ValueError(
            "dspark_generate needs the drafter: generate(..., custom_generate=dspark_generate, drafter=drafter)"
        )
    if _holds_observers(generation_config):
        raise ValueError(
            "with custom_generate=dspark_generate, transformers deep-copies the generation config, so "
            "its dspark_observers would be copies: pass generate(..., dspark_observers=[...]) instead."
        )
    if dspark_observers is not None:
        validate_dspark_options({"dspark_observers": dspark_observers})
        generation_config.dspark_observers = list(dspark_observers)  # transformers' per-call copy
    validate_dspark_options(generation_config_options(generation_config))
    check_prompt_inputs(model_kwargs)
    check_prompt_ids(input_ids)
    check_other_drafting({name: getattr(generation_config, name, None) for name in OTHER_DRAFTING})
    knobs = explicit_assistant_knobs({}, generation_config, model.generation_config)  # kwargs are merged in by now
    check_assistant_knobs(knobs, drafter.config.block_size)
    check_decoding_settings(generation_config)
    check_left_padded(model_kwargs.get("attention_mask"))
    return _run_dspark(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        dspark_streamer,
        drafter,
        model_kwargs,
    )
