"""The static-shape verification path (`cache_implementation="static"`, `compile_config`): greedy identity with
plain `generate`, two input shapes only, the preallocated buffers never grow."""

import pytest
import torch

from hf_dspark.generation import oracle_for
from hf_dspark.target.static_cache import RaggedStaticLayer, StaticTargetCache
from tests.helpers import make_drafter, make_target, ragged_prompts


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=11)


def _shapes(target):
    """Record the input shapes of the target forwards that run on the static cache."""
    seen = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache")
        if cache is not None and cache.layers and isinstance(cache.layers[0], RaggedStaticLayer):
            seen.append(tuple(kwargs["input_ids"].shape))

    return seen, target.model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("policy", ["fixed", "auto"])
@pytest.mark.parametrize(("batch", "drafter_kind"), [(1, "oracle"), (1, "learned"), (4, "oracle"), (4, "learned")])
def test_static_path_greedy_matches_plain(target, batch, drafter_kind, policy):
    ids, mask = ragged_prompts(batch, seed=batch + 20)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
    eos = int(free[0, ids.shape[1] + 5])  # row 0 stops early at an EOS, the others run on
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=eos, pad_token_id=0)
    reference = target.generate(ids, **options)
    drafter = oracle_for(target, 4, reference, mask) if drafter_kind == "oracle" else make_drafter(target)
    seen, handle = _shapes(target)
    try:
        output = target.generate(
            ids, assistant_model=drafter, cache_implementation="static", dspark_policy=policy, **options
        )
    finally:
        handle.remove()
    assert torch.equal(reference, output)
    widths = {shape[1] for shape in seen}  # every verification forward: width 1 or γ + 1
    assert widths <= {1, 5} and widths
    stats = drafter.last_generation_stats
    assert stats.rounds > 0 and stats.compactions == 0
    assert stats.max_cache_width == ids.shape[1] + 24 + 4 + 1


def test_static_cache_overwrites_rejected_slots():
    """Per-row offsets: a row keeping k of T slots moves by k; the next forward writes over the rejected ones."""
    from hf_dspark.generation.prefill import prefill_target
    from hf_dspark.target.static_cache import StaticPlan

    model = make_target("llama", seed=2)
    ids, mask = ragged_prompts(2, seed=1)
    with torch.no_grad():
        out = prefill_target(model, ids, mask, None, None, [], static=StaticPlan(ids.shape[1] + 12, 4))
        cache = out.target
        assert isinstance(cache, StaticTargetCache) and cache.width == ids.shape[1] + 12
        tokens = torch.randint(3, 96, (2, 3))
        cache.forward(model, tokens, torch.ones(2, 3, dtype=torch.bool), [])
        cache.commit_last(3, torch.tensor([1, 3]))
        assert cache.offset.tolist() == [ids.shape[1] + 1, ids.shape[1] + 3]
        before = cache.cache.layers[0].keys.clone()
        cache.forward(model, tokens[:, :1], torch.ones(2, 1, dtype=torch.bool), [])
        after = cache.cache.layers[0].keys
        changed = (before != after).any(dim=(1, 3))  # [A, C] slots written
        assert changed[0].nonzero().flatten().tolist() == [ids.shape[1] + 1]
        assert changed[1].nonzero().flatten().tolist() == [ids.shape[1] + 3]


def _inductor_unavailable() -> str | None:
    """Why inductor cannot build a kernel here (no C++ compiler, ...), or None."""
    try:
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: x * 2 + 1, backend="inductor", fullgraph=True)
        if not torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0)):
            return "inductor built a wrong kernel"
    except Exception as error:  # any failure to build means: cannot test here
        return f"inductor cannot build kernels here: {type(error).__name__}: {error}"
    finally:
        torch._dynamo.reset()
    return None


@pytest.mark.slow
def test_compiled_verification_forward_is_greedy_identical():
    """`compile_config` with inductor on CPU: the compiled verification forward (rows rejecting drafts at different
    positions) gives plain greedy's tokens."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    reason = _inductor_unavailable()
    if reason is not None:
        pytest.skip(reason)
    model = make_target("llama", seed=11, eos_token_id=None)
    ids, mask = ragged_prompts(2, seed=23)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    reference = model.generate(ids, **options)
    drafter = make_drafter(model)
    config = CompileConfig(backend="inductor", mode="default", fullgraph=False, dynamic=False)
    torch._dynamo.reset()
    try:
        output = model.generate(ids, assistant_model=drafter, compile_config=config, **options)
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert graphs > 0, "the verification forward was not compiled"
    assert torch.equal(reference, output)
    assert drafter.last_generation_stats.rounds > 0
