"""oneDNN-packed linear weights for verification: same values, scoped routing, lossless generate, clear refusals."""

import threading

import pytest
import torch
import torch.nn.functional as F

from hf_dspark.generation import oracle_for
from hf_dspark.target import packed_linear
from hf_dspark.target.packed_linear import PackedLinears, linear_packs_for, packed_linears, unpackable_reason
from tests.helpers import make_drafter, make_target, ragged_prompts

pytestmark = pytest.mark.skipif(not packed_linear.onednn_linear_available(), reason="no oneDNN in this PyTorch")


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 8, bias=False))


@pytest.mark.parametrize("shape", [(2, 16), (3, 5, 16), (1, 7, 16), (256, 16)])
def test_packed_products_match_pytorch_to_rounding(shape):
    model = _mlp()
    packs = PackedLinears.build(model)
    x = torch.randn(*shape)
    with torch.no_grad():
        reference = model(x)
        with packed_linears(packs):
            packed = model(x)
    assert packed.shape == reference.shape
    torch.testing.assert_close(packed, reference, rtol=1e-5, atol=1e-5)


def test_only_routed_calls_leave_pytorch_and_the_modules_are_restored(monkeypatch):
    model = _mlp()
    packs = PackedLinears.build(model, min_rows=2, max_rows=8)
    calls = []
    original = packed_linear.onednn_linear

    def spy(x, packed, bias):
        calls.append(tuple(x.shape))
        return original(x, packed, bias)

    monkeypatch.setattr(packed_linear, "onednn_linear", spy)
    with torch.no_grad():
        for rows, routed in ((1, False), (2, True), (8, True), (9, False)):
            calls.clear()
            x = torch.randn(rows, 16)
            with packed_linears(packs):
                assert "forward" in vars(model[0])
                out = model(x)
            assert "forward" not in vars(model[0])
            assert calls == ([(rows, 16), (rows, 48)] if routed else []), rows
            if not routed:  # unrouted calls run PyTorch's own kernel: bit-identical
                assert torch.equal(out, model(x))


def test_gradients_and_changed_weights_fall_back_to_pytorch():
    model = _mlp()
    packs = PackedLinears.build(model)
    x = torch.randn(4, 16, requires_grad=True)
    with packed_linears(packs):
        out = model(x)
    out.sum().backward()  # the packed op has no backward: a gradient-needing call keeps PyTorch's
    assert x.grad is not None
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # in place: the packed copy is outdated
        assert packs.stale()
        with packed_linears(packs):
            changed = model[0](x)
        assert torch.equal(changed, model[0](x))  # the outdated copy is not used: PyTorch's kernel runs


def test_nested_and_concurrent_blocks_share_one_swap():
    model = _mlp()
    packs = PackedLinears.build(model)
    entered, release = threading.Event(), threading.Event()

    def worker():
        with packed_linears(packs):
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=worker)
    thread.start()
    entered.wait(5)
    with packed_linears(packs), packed_linears(packs):
        assert packs.active == 3
    assert "forward" in vars(model[0])  # the worker's block still runs
    release.set()
    thread.join()
    assert packs.active == 0 and "forward" not in vars(model[0])


def test_linear_packs_for_caches_rebuilds_and_respects_the_setting(monkeypatch):
    model = _mlp()
    assert linear_packs_for(model, False) is None
    packs = linear_packs_for(model)
    assert packs is not None and linear_packs_for(model) is packs and linear_packs_for(model, True) is packs
    with torch.no_grad():
        model[2].weight.add_(1.0)
    assert packs.stale()
    rebuilt = linear_packs_for(model)
    assert rebuilt is packs and not packs.stale()  # repacked in place: engines holding it see the new copies


def test_auto_packs_only_what_fits_in_memory(monkeypatch):
    monkeypatch.setattr(packed_linear, "available_memory_bytes", lambda: PackedLinears.nbytes_for(_mlp()))
    assert linear_packs_for(_mlp()) is None  # the copies would take all of it
    monkeypatch.setattr(packed_linear, "available_memory_bytes", lambda: None)
    assert linear_packs_for(_mlp()) is None  # unknown: not packed unless asked
    assert linear_packs_for(_mlp(), True) is not None


def test_unpackable_models_are_refused_with_the_reason():
    half = _mlp().to(torch.bfloat16)
    assert "float32" in unpackable_reason(half)
    assert linear_packs_for(half) is None
    with pytest.raises(ValueError, match=r"float32 weights.*dspark_packed_weights=False"):
        linear_packs_for(half, True)
    with pytest.raises(ValueError, match=r"no nn\.Linear"):
        PackedLinears.build(torch.nn.Sequential(torch.nn.GELU()))
    with pytest.raises(ValueError, match="min_rows"):
        PackedLinears(min_rows=3, max_rows=2)


def test_quantized_or_patched_layers_are_left_alone():
    class Adapter(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), Adapter(16, 16), torch.nn.Linear(16, 16))
    model[2].forward = lambda x: F.linear(x, model[2].weight, model[2].bias)  # e.g. an offloading hook
    packs = PackedLinears.build(model)
    assert packs.modules == [model[0]] and len(packs.packed) == 1


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("drafter_kind", ["learned", "oracle"])
def test_greedy_generate_with_packed_weights_matches_plain_generate(batch, drafter_kind):
    target = make_target("llama", seed=11)
    ids, mask = ragged_prompts(batch, seed=batch + 20)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    drafter = make_drafter(target) if drafter_kind == "learned" else oracle_for(target, 4, reference, mask)
    for setting in (True, False):
        output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30,
                                 assistant_model=drafter, dspark_packed_weights=setting)
        assert torch.equal(output, reference)
        assert drafter.last_generation_stats.packed_weights is setting


def test_generate_installs_the_packed_forwards_once_for_all_its_rounds():
    """Between two verification forwards (the drafter's turn) the packed forwards stay on the layers, and the call
    leaves every layer with its own forward."""
    target = make_target("llama", seed=11)
    ids, mask = ragged_prompts(2, seed=21)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    drafter = oracle_for(target, 4, reference, mask)
    layers = [m for m in target.modules() if type(m) is torch.nn.Linear]
    installed, propose = [], drafter.propose

    def spy(*args, **kwargs):
        installed.append(all("forward" in vars(m) for m in layers))
        return propose(*args, **kwargs)

    drafter.propose = spy
    output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                             dspark_packed_weights=True)
    assert torch.equal(output, reference)
    assert len(installed) > 1 and all(installed)
    assert not any("forward" in vars(m) for m in layers)


def test_generate_refuses_a_bad_setting_before_any_work():
    target = make_target("llama", seed=11)
    ids, mask = ragged_prompts(1, seed=2)
    with pytest.raises(ValueError, match="dspark_packed_weights must be True or False"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=make_drafter(target),
                        dspark_packed_weights="yes")
    half = make_target("llama", seed=11).to(torch.bfloat16)
    with pytest.raises(ValueError, match="float32 weights"):
        half.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=make_drafter(half),
                      dspark_packed_weights=True)


def _mutate(target, how: str) -> None:
    """Change the target's weights the ways users do after a first call (none moves a version counter the same way)."""
    layer = target.model.layers[1].mlp.down_proj
    gen = torch.Generator().manual_seed(5)
    new = torch.randn(layer.weight.shape, generator=gen) * 0.2
    if how == "data_copy":
        layer.weight.data.copy_(new)
    elif how == "new_parameter":
        layer.weight = torch.nn.Parameter(new)
    elif how == "load_state_dict_assign":
        state = {k: v.clone() for k, v in target.state_dict().items()}
        state["model.layers.1.mlp.down_proj.weight"] = new
        target.load_state_dict(state, assign=True)
    elif how == "adapter_merge":  # a PEFT-style merge: weight.data += B @ A
        lora_b, lora_a = torch.randn(layer.weight.shape[0], 4, generator=gen), torch.randn(4, layer.weight.shape[1],
                                                                                              generator=gen)
        layer.weight.data += lora_b @ lora_a * 0.1
    elif how == "data_assign":
        layer.weight.data = new
    else:
        raise ValueError(how)


@pytest.mark.parametrize("how", ["data_copy", "new_parameter", "load_state_dict_assign", "adapter_merge",
                                 "data_assign"])
def test_changed_weights_after_a_first_call_are_repacked(how):
    target = make_target("llama", seed=11)
    ids, mask = ragged_prompts(3, seed=23)
    drafter = make_drafter(target)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=24)
    target.generate(ids, assistant_model=drafter, dspark_packed_weights=True, **options)  # packs the weights
    packs = linear_packs_for(target, True)
    _mutate(target, how)
    assert packs.stale()
    reference = target.generate(ids, **options)
    output = target.generate(ids, assistant_model=drafter, dspark_packed_weights=True, **options)
    assert torch.equal(output, reference)
    assert not packs.stale() and linear_packs_for(target, True) is packs  # repacked in place, once


def test_one_entry_changed_in_place_where_no_entry_is_watched_is_repacked(monkeypatch):
    """An in-place change of one weight entry (through a view of the Parameter) that no watched entry covers moves
    the Parameter's version counter: the next call repacks and matches plain generate. The watched entries alone
    would have missed it."""
    target = make_target("llama", seed=11)
    ids, mask = ragged_prompts(3, seed=23)
    drafter = make_drafter(target)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=24)
    before = target.generate(ids, **options)
    target.generate(ids, assistant_model=drafter, dspark_packed_weights=True, **options)  # packs the weights
    packs = linear_packs_for(target, True)
    weight = target.model.layers[1].mlp.down_proj.weight
    watched = set(packs.packed[id(weight)].probe.tolist())
    flat = next(i for i in range(weight.numel()) if i not in watched)
    with torch.no_grad():
        weight.view(-1)[flat] += 3.0
    assert packs.stale()
    with monkeypatch.context() as patch:  # the version / storage check off: the watched entries do not see it
        patch.setattr(packed_linear.PackedWeight, "moved", lambda entry: False)
        assert not packs.stale()
    reference = target.generate(ids, **options)
    assert not torch.equal(reference, before)  # the entry matters to the output
    output = target.generate(ids, assistant_model=drafter, dspark_packed_weights=True, **options)
    assert torch.equal(output, reference)
    assert not packs.stale()


@pytest.mark.parametrize("how", ["data", "numpy"])
def test_writes_pytorch_does_not_track_are_caught_by_the_watched_entries(how):
    """Writes through `param.data` or a NumPy alias move no version counter (the case the watched entries are
    kept for); one that changes a watched entry makes the packs stale."""
    model = _mlp()
    packs = PackedLinears.build(model)
    weight = model[2].weight
    entry = packs.packed[id(weight)]
    index = int(entry.probe[len(entry.probe) // 2])
    if how == "data":
        weight.data.view(-1)[index] += 1.0
    else:
        weight.detach().numpy().reshape(-1)[index] += 1.0
    assert weight._version == entry.version and weight.data_ptr() == entry.data_ptr and not entry.moved()
    assert packs.stale()
    assert packs.refresh(model) and not packs.stale()


def test_an_unchanged_model_is_not_repacked():
    model = _mlp()
    packs = linear_packs_for(model, True)
    entries = dict(packs.packed)
    assert not packs.refresh(model) and packs.packed == entries


def test_other_threads_run_pytorch_while_one_thread_is_inside_the_block(monkeypatch):
    model = _mlp()
    packs = PackedLinears.build(model)
    x = torch.randn(4, 16)
    with torch.no_grad():
        reference = model(x)
    callers = []
    original = packed_linear.onednn_linear

    def spy(inputs, packed, bias):
        callers.append(threading.get_ident())
        return original(inputs, packed, bias)

    monkeypatch.setattr(packed_linear, "onednn_linear", spy)
    entered, release, inside = threading.Event(), threading.Event(), {}

    def verifier():
        with torch.no_grad(), packed_linears(packs):
            inside["out"] = model(x)
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=verifier)
    thread.start()
    assert entered.wait(5)
    try:
        assert "forward" in vars(model[0])  # the swap is in place for the verifying thread
        with torch.no_grad():
            plain = model(x)  # this thread is outside any block
    finally:
        release.set()
        thread.join()
    assert torch.equal(plain, reference)
    assert set(callers) == {thread.ident}


def test_two_threads_on_one_target_dspark_and_plain_forwards_stay_apart(monkeypatch):
    from hf_dspark.target import attention

    target = make_target("llama", seed=11)
    ids, mask = ragged_prompts(3, seed=24)
    drafter = make_drafter(target)
    options = dict(attention_mask=mask, do_sample=False, max_new_tokens=24)
    reference = target.generate(ids, **options)
    with torch.no_grad():
        logits = target(ids, attention_mask=mask).logits
    callers, linear, sdpa = set(), packed_linear.onednn_linear, attention.packed_gqa_sdpa

    def spy(kernel):
        def call(*args, **kwargs):
            callers.add(threading.get_ident())
            return kernel(*args, **kwargs)
        return call

    monkeypatch.setattr(packed_linear, "onednn_linear", spy(linear))
    monkeypatch.setattr(attention, "packed_gqa_sdpa", spy(sdpa))
    done, outputs = threading.Event(), []

    def speculate():
        try:
            for _ in range(4):
                outputs.append(target.generate(ids, assistant_model=drafter, dspark_packed_weights=True, **options))
        finally:
            done.set()

    thread = threading.Thread(target=speculate)
    thread.start()
    plain_runs = 0
    while not done.is_set() or plain_runs == 0:
        with torch.no_grad():
            assert torch.equal(target(ids, attention_mask=mask).logits, logits)
        plain_runs += 1
    thread.join()
    assert len(outputs) == 4 and all(torch.equal(out, reference) for out in outputs)
    assert callers == {thread.ident}  # the packed kernels ran for the verifying thread only


def test_a_plain_forward_beside_dspark_verification_on_one_target_is_bitwise_plain(monkeypatch):
    """Thread 1 runs DSpark `generate` (packed weights and packed attention swapped in); while it is inside a
    verification forward, thread 2 runs a plain forward of the same target: it never enters a packed path and gives
    bit for bit the plain logits, and thread 1's greedy tokens are plain `generate`'s."""
    from hf_dspark.target import attention
    from hf_dspark.target.attention import PACKED_SDPA

    packed_callers: dict[str, set[int]] = {"linear": set(), "attention": set()}
    spied = ((packed_linear, "_packed_linear", "linear"), (attention, "packed_gqa_sdpa", "attention"))
    for owner, name, kind in spied:
        original = getattr(owner, name)

        def spy(*args, _original=original, _kind=kind, **kwargs):
            packed_callers[_kind].add(threading.get_ident())
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)

    target = make_target("llama", seed=11)
    ids, mask = ragged_prompts(3, seed=23)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    drafter = make_drafter(target)
    with torch.no_grad():
        plain_logits = target(input_ids=ids[:, -4:], attention_mask=mask[:, -4:]).logits
    inside, resume, seen, result = threading.Event(), threading.Event(), [], {}

    def pause_inside_verification(module, args, output):  # a hook on the final norm: the forward is under way
        verifying = target.config._attn_implementation == PACKED_SDPA
        if threading.current_thread() is worker and verifying and not inside.is_set():
            inside.set()
            resume.wait(10)

    def run():
        result["output"] = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                                           assistant_model=drafter, dspark_packed_weights=True)

    hook = target.model.norm.register_forward_hook(pause_inside_verification)
    worker = threading.Thread(target=run)
    worker.start()
    try:
        assert inside.wait(30), "the DSpark thread never reached a packed verification forward"
        swapped = "forward" in vars(target.model.layers[0].mlp.down_proj)
        seen.append((target.config._attn_implementation, swapped))
        with torch.no_grad():
            beside = target(input_ids=ids[:, -4:], attention_mask=mask[:, -4:]).logits  # rows the packs would take
    finally:
        resume.set()
        worker.join(60)
        hook.remove()
    assert seen == [(PACKED_SDPA, True)]  # both swaps were live on the shared target during the plain forward
    assert packed_callers == {"linear": {worker.ident}, "attention": {worker.ident}}
    assert torch.equal(beside, plain_logits)
    assert torch.equal(result["output"], reference)
    assert target.config._attn_implementation == "sdpa" and "forward" not in vars(target.model.layers[0].mlp.down_proj)
