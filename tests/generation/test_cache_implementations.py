"""Every `cache_implementation` transformers knows is honoured as plain `generate` honours it, or refused before any
work with the reason and the fix."""

import pytest
import torch
from transformers.generation import configuration_utils

from hf_dspark.generation import call_checks, loop
from hf_dspark.target.static_cache import RaggedStaticLayer
from tests.helpers import make_drafter, make_target, ragged_prompts

HONOURED = ("dynamic", "static", "hybrid", "sliding_window", "hybrid_chunked")
REFUSED = {
    "offloaded": r"offloaded.*moves.*CPU.*Drop cache_implementation",
    "offloaded_static": r"offloaded_static.*moves.*CPU.*cache_implementation='static'",
    "offloaded_hybrid": r"offloaded_hybrid.*moves.*CPU.*cache_implementation='static'",
    "offloaded_hybrid_chunked": r"offloaded_hybrid_chunked.*moves.*CPU",
    "quantized": r"quantized.*quantizes the keys and values.*Drop cache_implementation",
    "paged": r"paged.*continuous batching.*DSparkEngine",
}


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the call builds its policy (where curves are profiled) before it is refused."""
    def refuse(*args, **kwargs):
        raise AssertionError("work started before the call was refused")

    monkeypatch.setattr(loop, "policy_from_options", refuse)
    return refuse


def test_every_name_transformers_knows_is_decided():
    known = set(getattr(configuration_utils, "ALL_CACHE_IMPLEMENTATIONS", ())) | {"paged"}
    assert known <= set(HONOURED) | set(REFUSED)
    for name in known:
        assert (call_checks.cache_implementation_refusal(name) is None) == (name in HONOURED), name
    assert "not one DSpark knows" in call_checks.cache_implementation_refusal("some_future_cache")


def _static_forwards(target):
    seen = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache")
        if cache is not None and cache.layers and isinstance(cache.layers[0], RaggedStaticLayer):
            seen.append(tuple(kwargs["input_ids"].shape))

    return seen, target.model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("name", HONOURED)
def test_honoured_cache_implementations_match_plain_generate(name):
    target = make_target("llama", seed=3)
    ids, mask = ragged_prompts(2, seed=5)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=16, cache_implementation=name)
    reference = target.generate(ids, **options)
    seen, handle = _static_forwards(target)
    try:
        output = target.generate(ids, assistant_model=make_drafter(target), **options)
    finally:
        handle.remove()
    assert torch.equal(output, reference)
    # transformers builds a StaticCache for "sliding_window" and "hybrid_chunked" (and unsets "hybrid")
    assert bool(seen) == (name in ("static", "sliding_window", "hybrid_chunked"))


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("where", ["call", "model_config"])
def test_other_cache_implementations_are_refused_before_any_work(no_work, monkeypatch, name, where):
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    monkeypatch.setattr(target, "forward", no_work)
    ids, mask = ragged_prompts(2, seed=5)
    kwargs = dict(attention_mask=mask, max_new_tokens=4, assistant_model=drafter)
    if where == "call":
        kwargs["cache_implementation"] = name
    else:
        target.generation_config.cache_implementation = name
    with pytest.raises(ValueError, match=REFUSED[name]):
        target.generate(ids, **kwargs)
