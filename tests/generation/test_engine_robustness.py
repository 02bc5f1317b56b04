"""DSparkEngine under faults, threads and long runs: nothing lost, nothing wrong, nothing kept forever."""

import threading

import pytest
import torch

from hf_dspark.generation import packed_linear
from hf_dspark.generation.engine import DSparkEngine
from hf_dspark.generation.policy import VerificationPolicy
from tests.helpers import make_drafter, make_target, ragged_prompts

NEW = 20


@pytest.fixture(scope="module")
def setup():
    target = make_target("llama", seed=11, eos_token_id=None)
    ids, mask = ragged_prompts(6, seed=3)
    prompts = [ids[r][mask[r].bool()] for r in range(len(ids))]
    references = [target.generate(p[None], do_sample=False, max_new_tokens=NEW)[0, p.numel():].tolist()
                  for p in prompts]
    return target, prompts, references


def _engine(target, **kwargs):
    return DSparkEngine(target, make_drafter(target), policy=VerificationPolicy("fixed", block_size=4),
                        max_running=3, **kwargs)


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
    with pytest.raises(RuntimeError, match="boom"):
        engine.step()
    monkeypatch.undo()
    _drain(engine)
    for rid, reference in zip(rids, references):
        request = engine.result(rid)
        assert request.error is None and request.generated == reference, rid


def test_a_request_whose_round_fails_twice_finishes_with_the_error_and_the_rest_go_on(setup, monkeypatch):
    target, prompts, references = setup
    engine = _engine(target)
    first = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:3]]
    engine.step()
    real = engine.kernel.step

    def broken(*args, **kwargs):
        raise RuntimeError("broken round")

    monkeypatch.setattr(engine.kernel, "step", broken)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="broken round"):
            engine.step()
    monkeypatch.setattr(engine.kernel, "step", real)
    later = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[3:]]
    _drain(engine)
    for rid in first:
        request = engine.result(rid)
        assert request.finished and isinstance(request.error, RuntimeError) and "broken round" in str(request.error)
    for rid, reference in zip(later, references[3:]):
        assert engine.result(rid).generated == reference


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
    assert engine.result(rids[1]).finished and engine.result(rids[1]).cancelled
    assert engine.result(rids[1]).generated == references[1][: len(engine.result(rids[1]).generated)]
    for rid, reference in zip([rids[0], rids[2], *added], [references[0], references[2], *references[3:]]):
        assert engine.result(rid).generated == reference, rid


def test_take_finished_releases_requests_and_records_are_bounded(setup):
    target, prompts, references = setup
    engine = _engine(target, max_records=5)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts]
    taken = []
    while engine.has_work():
        engine.step()
        taken += engine.take_finished()
    assert sorted(r.request_id for r in taken) == rids and not engine.requests
    assert [r.generated for r in sorted(taken, key=lambda r: r.request_id)] == references
    assert len(engine.records) == 5
    with pytest.raises(KeyError, match="take_finished forgets"):
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
    reference = target.generate(prompts[0][None], do_sample=False, max_new_tokens=NEW)[0, prompts[0].numel():]
    rid = engine.add_request(prompts[0], max_new_tokens=NEW)
    _drain(engine)
    assert engine.result(rid).generated == reference.tolist()
