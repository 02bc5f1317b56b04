"""DSparkEngine under faults, threads and long runs: nothing lost, nothing wrong, nothing kept forever."""

import threading

import pytest
import torch

from hf_dspark.scheduling.verification_policy import VerificationPolicy
from hf_dspark.serving.engine import DSparkEngine
from hf_dspark.target import packed_linear
from tests.helpers import make_drafter, make_target
from tests.serving.references import engine_requests_and_references

NEW = 20


@pytest.fixture(scope="module")
def setup():
    return engine_requests_and_references(NEW)


def _engine(target, **kwargs):
    return DSparkEngine(
        target, make_drafter(target), policy=VerificationPolicy("fixed", block_size=4), max_running=3, **kwargs
    )


def _drain(engine):
    while engine.has_work():
        engine.step()


def test_add_request_copies_the_prompt(setup):
    target, prompts, references = setup
    engine = _engine(target)
    buffer = prompts[0].clone()
    rid = engine.add_request(buffer, max_new_tokens=NEW)
    buffer.copy_(prompts[1][: buffer.numel()] if prompts[1].numel() >= buffer.numel() else buffer.flip(0))
    _drain(engine)
    assert engine.result(rid).generated == references[0]


@pytest.mark.parametrize("where", ["commit", "verification_forward"])
def test_a_round_that_raises_is_undone_and_every_request_still_matches_plain_generate(setup, where, monkeypatch):
    target, prompts, references = setup
    engine = _engine(target)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts]
    engine.step()
    engine.step()
    calls = {"n": 0}
    if where == "commit":
        real = engine._commit

        def flaky(rid, tokens):
            calls["n"] += 1
            if calls["n"] == 2:  # the second row of the round: the first one's tokens are already kept
                raise RuntimeError("boom")
            return real(rid, tokens)

        monkeypatch.setattr(engine, "_commit", flaky)
    else:
        real = engine.kernel.step

        def flaky(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return real(*args, **kwargs)

        monkeypatch.setattr(engine.kernel, "step", flaky)
    engine.step()  # the round is undone, each of its requests retried alone: nothing propagates
    monkeypatch.undo()
    assert calls["n"] >= 2
    _drain(engine)
    for rid, reference in zip(rids, references):
        request = engine.result(rid)
        assert request.error is None and request.failures == 0 and request.generated == reference, rid


def test_cancel_and_add_request_from_other_threads_during_steps(setup):
    target, prompts, references = setup
    engine = _engine(target)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:3]]
    stop, errors, added, cancelled = threading.Event(), [], [], []

    def serve():
        try:
            while not stop.is_set() or engine.has_work():
                engine.step()
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)

    worker = threading.Thread(target=serve)
    worker.start()
    for p in prompts[3:]:
        added.append(engine.add_request(p, max_new_tokens=NEW))
    while not engine.result(rids[1]).generated:
        pass
    engine.cancel(rids[1])
    cancelled.append(rids[1])
    stop.set()
    worker.join(60)
    assert not worker.is_alive() and not errors
    done = {r.request_id: r for r in engine.take_finished()}
    assert done[rids[1]].finished and done[rids[1]].cancelled
    assert done[rids[1]].generated == references[1][: len(done[rids[1]].generated)]
    for rid, reference in zip([rids[0], rids[2], *added], [references[0], references[2], *references[3:]]):
        assert done[rid].generated == reference, rid


def test_take_finished_releases_requests_and_records_are_bounded(setup):
    target, prompts, references = setup
    engine = _engine(target, max_records=5)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts]
    taken = []
    while engine.has_work():
        engine.step()
        taken += engine.take_finished()
    assert sorted(r.request_id for r in taken) == rids and not engine.requests and not engine.finished
    assert [r.generated for r in sorted(taken, key=lambda r: r.request_id)] == references
    assert len(engine.records) == 5
    with pytest.raises(KeyError, match=r"released once result\(\) or take_finished\(\)"):
        engine.result(rids[0])
    with pytest.raises(ValueError, match="max_records"):
        _engine(target, max_records=-1)


def test_a_target_moved_after_the_engine_was_built_is_a_clear_error(setup):
    target = make_target("llama", seed=12, eos_token_id=None)
    engine = _engine(target)
    engine.add_request(setup[1][0], max_new_tokens=4)
    target.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"moved from torch.float32 .* to torch.bfloat16.*build a new DSparkEngine"):
        engine.step()


@pytest.mark.skipif(not packed_linear.onednn_linear_available(), reason="no oneDNN in this PyTorch")
def test_weights_changed_after_the_engine_was_built_are_repacked(setup):
    target = make_target("llama", seed=13, eos_token_id=None)
    _, prompts, _ = setup
    engine = _engine(target, packed_weights=True)
    gen = torch.Generator().manual_seed(0)
    for layer in target.model.layers:  # through .data: moves no version counter
        layer.mlp.down_proj.weight.data.copy_(torch.randn(layer.mlp.down_proj.weight.shape, generator=gen) * 0.3)
    reference = target.generate(prompts[0][None], do_sample=False, max_new_tokens=NEW)[0, prompts[0].numel() :]
    rid = engine.add_request(prompts[0], max_new_tokens=NEW)
    _drain(engine)
    assert engine.result(rid).generated == reference.tolist()


def test_cancel_and_take_finished_from_another_thread_inside_a_round(setup, monkeypatch):
    target, prompts, references = setup
    engine = _engine(target)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts]
    engine.step()
    real, calls, taken = engine.kernel.step, {"n": 0}, []

    def interrupted(*args, **kwargs):  # another thread cancels and takes results while this round runs
        calls["n"] += 1
        if calls["n"] == 1:
            other = threading.Thread(target=lambda: (engine.cancel(rids[1]), taken.extend(engine.take_finished())))
            other.start()
            other.join(5)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.kernel, "step", interrupted)
    engine.step()
    assert taken == [] and rids[1] not in engine.running  # it was in the round: left the batch when it ended
    while engine.has_work():
        engine.step()
        taken += engine.take_finished()
    results = {r.request_id: r for r in taken}
    assert sorted(results) == rids and results[rids[1]].cancelled
    assert results[rids[1]].generated == references[1][: len(results[rids[1]].generated)]
    for rid, reference in zip(rids, references):
        if rid != rids[1]:
            assert results[rid].generated == reference, rid


def test_take_finished_during_a_failed_rounds_rollback_takes_only_final_requests(setup, monkeypatch):
    target, prompts, references = setup
    engine = _engine(target)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:3]]
    engine.step()
    real_commit, real_forget, calls, taken, waiting = engine._commit, engine.policy.forget, {"n": 0}, [], []

    def flaky(rid, tokens):  # the round's second row raises once
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_commit(rid, tokens)

    def forget(rows):  # inside the rollback: another thread asks for finished requests
        other = threading.Thread(target=lambda: taken.extend(engine.take_finished()))
        other.start()
        other.join(0.5)
        waiting.append(other)
        return real_forget(rows)

    monkeypatch.setattr(engine, "_commit", flaky)
    monkeypatch.setattr(engine.policy, "forget", forget)
    engine.step()
    monkeypatch.undo()
    waiting[0].join(5)
    _drain(engine)
    done = {r.request_id: r for r in [*taken, *engine.take_finished()]}
    assert sorted(done) == rids  # each collected once: nothing taken mid-rollback came back
    assert [done[rid].generated for rid in rids] == references[:3]


def _dynamic_rope_target():
    return make_target(
        "llama",
        seed=1,
        eos_token_id=None,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "dynamic", "factor": 8.0, "rope_theta": 100.0},
    )


@pytest.mark.parametrize("policy", ["fixed", "none"])
def test_requests_that_could_cross_a_dynamic_rope_threshold_are_refused(policy):
    target = _dynamic_rope_target()
    drafter = make_drafter(target) if policy != "none" else None
    engine = DSparkEngine(
        target,
        drafter,
        max_running=3,
        policy=VerificationPolicy(policy, block_size=4) if drafter is not None else "none",
    )
    prompt = torch.arange(3, 9)
    gamma = 4 if drafter is not None else 0
    with pytest.raises(ValueError, match=rf"'dynamic' RoPE scaling.*passes 16.*at most {16 - gamma} tokens"):
        engine.add_request(prompt, max_new_tokens=16 - gamma - 5)
    assert not engine.requests
    rid = engine.add_request(prompt, max_new_tokens=16 - gamma - 6)  # reaches exactly the threshold
    _drain(engine)
    reference = target.generate(prompt[None], do_sample=False, max_new_tokens=16 - gamma - 6)[0, 6:]
    assert engine.result(rid).generated == reference.tolist()


@pytest.mark.parametrize("attention", ["flex_attention", "flash_attention_2"])
def test_flash_and_flex_attention_targets_are_refused_when_the_engine_is_built(attention):
    target = make_target("llama", seed=3)
    drafter = make_drafter(target)
    target.config._attn_implementation = attention  # only the name is read
    with pytest.raises(ValueError, match=rf"{attention}.*attn_implementation='sdpa'"):
        DSparkEngine(target, drafter, policy=VerificationPolicy("fixed", block_size=4))
