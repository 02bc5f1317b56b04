"""Route `target.generate(assistant_model=<DSparkDrafter>)` to the DSpark loop without forking transformers.

`enable(target)` gives that one instance a cached subclass (same class name, so saved configs and reprs are
unchanged) overriding hooks `generate` looks up on the instance; `drafter.bind_target(target)` calls it and
`disable(target)` restores the original class. The checks do not live in a `generate` override: in
`target.generate(..., assistant_model=DSparkDrafter(cfg).bind_target(target))` Python looks `generate` up before
the argument binds (and enables), so only the hooks `generate` reaches on `self` afterwards can act, and they act
the same whether the drafter was bound before the call or inside it:

- `_prepare_generation_config`: the call's `dspark_*` keywords are set on transformers' per-call copy of the
  generation config (it would reject them as unused model kwargs), round observers travel by reference;
- `_validate_generation_mode` (after the config is merged, before the decoding method is acted on): the call's
  checks, `call_checks.check_call`, once, for a DSpark drafter;
- `_prepare_model_inputs`: a prompt with no tokens is refused (for every call: transformers would fail on it with a
  bare IndexError before the loop's own prompt check, `call_checks.check_prompt`);
- `_assisted_decoding`: the call's options parsed once (`DSparkGenerationOptions`) and the DSpark loop run
  (`loop.dspark_decoding`, which checks the prompt once, `call_checks.check_prompt`), or transformers' stock loop
  for every other assistant.

For users who want no patching, `dspark_generate` is a `custom_generate` callable:
`target.generate(**inputs, custom_generate=dspark_generate, drafter=drafter)` (transformers then drops
`assistant_model` and `streamer`; pass `dspark_streamer=` instead); it runs the same checks once.

`generation_config.dspark_stock_loop=True` instead runs transformers' own batch-1 `_assisted_decoding` with a
`DSparkCandidateGenerator` as its candidate generator (fixed ℓ = γ; no scheduler), for comparison.
"""

from __future__ import annotations

import copy
import functools

import torch

from ..proposers.base import DraftModel, is_draft_model
from ..target.output_cache import CallCache, returned_cache
from .call_checks import check_cache_implementation, check_call, check_prompt_ids
from .candidate_generator import DSparkCandidateGenerator
from .loop import dspark_decoding
from .options import OBSERVERS, DSparkGenerationOptions, configured_option


def _without_observers(model, generation_config):
    """(config to hand to transformers, the observers it held or None).

    transformers deep-copies the generation config, which would give the loop copies of the caller's observers
    (and fail on observers holding a lock or a file): the config travels as a shallow copy without them, and the
    caller's own objects are put back on transformers' copy. Observers on the model's `generation_config` are
    refused: transformers merges that config into every call's by copying it.
    """
    if configured_option(model.generation_config, OBSERVERS) is not None:
        raise ValueError(
            "dspark_observers on the model's generation_config would reach the loop as deep copies; "
            "pass them per call: generate(..., dspark_observers=[...])."
        )
    observers = configured_option(generation_config, OBSERVERS) if generation_config is not None else None
    if observers is None:
        return generation_config, None
    shallow = copy.copy(generation_config)
    vars(shallow).pop(OBSERVERS, None)
    return shallow, observers


def _call_cache(model, model_kwargs, generation_config) -> CallCache | None:
    """The call's cache object, taken before the loop runs, to be left as plain `generate` leaves it
    (`output_cache.CallCache`): the caller's `generate(..., cache=c)` always; the one `generate` built for the call
    (a fresh `DynamicCache` where it built none) only when the output returns it (`return_dict_in_generate`); None
    with `use_cache=False`."""
    if generation_config.use_cache is False:
        return None
    cache = model_kwargs.get("cache")
    if getattr(cache, "_is_user_defined", False) or generation_config.return_dict_in_generate:
        return returned_cache(model, cache)
    return None


def _fill_call_cache(model, output, call_cache: CallCache | None, input_ids, model_kwargs):
    """`output` (the sequences, or plain's output class) once the call's cache object is filled
    (`CallCache.fill`: as plain `generate` leaves it, so a later call can continue from it); a dict output returns
    that object, as plain's does. `input_ids` / `model_kwargs`: the prompt and the inputs `generate` prepared."""
    if call_cache is None:
        return output
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    cache = call_cache.fill(model, sequences, input_ids.shape[1], model_kwargs.get("attention_mask"),
                            model_kwargs.get("position_ids"))
    if not isinstance(output, torch.Tensor):
        output.cache = cache
    return output


def _run_dspark(model, input_ids, logits_processor, stopping_criteria, generation_config, streamer, drafter,
                model_kwargs, options: DSparkGenerationOptions):
    """`dspark_decoding` with the call's parsed `options`, then the call's cache object filled as plain `generate`
    fills it."""
    call_cache = _call_cache(model, model_kwargs, generation_config)
    output = dspark_decoding(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        streamer=streamer,
        assistant_model=drafter,
        options=options,
        **model_kwargs,
    )
    return _fill_call_cache(model, output, call_cache, input_ids, model_kwargs)


@functools.cache
def _dspark_subclass(cls: type) -> type:
    """The DSpark-enabled subclass of the model class `cls`, built once per class (one class object per `cls`, so
    instances enabled apart share it and `type(a) is type(b)` holds as before `enable`)."""

    def generate(self, *args, assistant_model=None, **kwargs):
        # `cache_implementation="paged"` as a keyword switches the call to continuous batching before any hook below
        # runs (where transformers refuses every assistant): name DSpark's way there instead. Only for a drafter
        # bound before the call: bound inside it, transformers' own refusal stands.
        if is_draft_model(assistant_model) and kwargs.get("cache_implementation") == "paged":
            check_cache_implementation("paged")
        return cls.generate(self, *args, assistant_model=assistant_model, **kwargs)

    def _prepare_generation_config(self, generation_config, **kwargs):
        # `generate(..., dspark_policy="lagged")`: transformers only copies kwargs naming known GenerationConfig
        # fields and would reject the rest as unused model kwargs, so `dspark_*` options are set on the copy here;
        # they are parsed (and checked) once, where DSpark takes the call over (`_assisted_decoding`).
        options = {key: kwargs.pop(key) for key in [k for k in kwargs if k.startswith("dspark_")]}
        generation_config, observers = _without_observers(self, generation_config)
        if observers is not None:
            options.setdefault(OBSERVERS, observers)  # a generate() argument wins over the config's
        config, model_kwargs = cls._prepare_generation_config(self, generation_config, **kwargs)
        for key, value in options.items():
            setattr(config, key, value)
        return config, model_kwargs

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        assistant = generation_mode_kwargs.get("assistant_model")
        if is_draft_model(assistant):  # before transformers acts on the mode (beam search would drop the assistant)
            check_call(self, assistant, generation_config)
        return cls._validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs)

    def _prepare_model_inputs(self, inputs=None, bos_token_id=None, model_kwargs=None):
        # a prompt with no tokens: transformers' generate would fail on it a few lines on, plain decoding included,
        # with a bare IndexError (before any DSpark hook sees the prompt), so it is refused here for every call
        inputs_tensor, input_name, model_kwargs = cls._prepare_model_inputs(self, inputs, bos_token_id, model_kwargs)
        if input_name == "input_ids":
            check_prompt_ids(inputs_tensor)
        return inputs_tensor, input_name, model_kwargs

    def _assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config,
                           synced_gpus=False, streamer=None, inputs_tensor=None, assistant_model=None,
                           assistant_tokenizer=None, tokenizer=None, **model_kwargs):
        options = DSparkGenerationOptions.from_generation_config(generation_config) if is_draft_model(
            assistant_model) else None  # parsed once per call
        if options is not None and not options.dspark_stock_loop:
            return _run_dspark(self, input_ids, logits_processor, stopping_criteria, generation_config, streamer,
                               assistant_model, model_kwargs, options)
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

    return type(
        cls.__name__,
        (cls,),
        {
            "generate": generate,
            "_prepare_generation_config": _prepare_generation_config,
            "_validate_generation_mode": _validate_generation_mode,
            "_prepare_model_inputs": _prepare_model_inputs,
            "_assisted_decoding": _assisted_decoding,
            "_get_candidate_generator": _get_candidate_generator,
            "_dspark_base_class": cls,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        },
    )


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

    Runs the call's checks once (`call_checks.check_call`; transformers merged the keyword arguments into
    `generation_config` by now) and parses its options once. Round observers travel as an argument
    (`dspark_observers=[...]`): transformers has deep-copied the generation config by now, so observers set on it
    would be copies, and are refused.
    """
    if drafter is None:
        raise ValueError(
            "dspark_generate needs the drafter: generate(..., custom_generate=dspark_generate, drafter=drafter)"
        )
    if configured_option(generation_config, OBSERVERS) is not None:
        raise ValueError(
            "with custom_generate=dspark_generate, transformers deep-copies the generation config, so "
            "its dspark_observers would be copies: pass generate(..., dspark_observers=[...]) instead."
        )
    check_call(model, drafter, generation_config)
    observers = {} if dspark_observers is None else {OBSERVERS: dspark_observers}
    options = DSparkGenerationOptions.from_generation_config(generation_config, **observers)
    return _run_dspark(model, input_ids, logits_processor, stopping_criteria, generation_config, dspark_streamer,
                       drafter, model_kwargs, options)
