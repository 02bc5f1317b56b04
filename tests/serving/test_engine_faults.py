"""DSparkEngine with faults injected into the real tiny target: the faulty request finishes with its error, the
others keep their plain-`generate` tokens; cancels racing steps; finished requests released, memory flat."""

import contextlib
import gc
import threading

import pytest
import torch

from hf_dspark.scheduling.verification_policy import VerificationPolicy
from hf_dspark.serving.engine import DSparkEngine
from hf_dspark.serving.requests import EngineRequest
from tests.helpers import make_drafter
from tests.serving.references import engine_requests_and_references

NEW = 16


class TokenFault:
    """A forward pre-hook on the target's embedding that raises when `token_id` is among the input ids."""

    def __init__(self, target, token_id: int) -> None:
        self.token_id, self.raised = token_id, 0
        self.handle = target.get_input_embeddings().register_forward_pre_hook(self)

    def __call__(self, module, args):
        if bool((args[0] == self.token_id).any()):
            self.raised += 1
            raise RuntimeError(f"injected fault on token {self.token_id}")

    def remove(self) -> None:
        self.handle.remove()


@pytest.fixture(scope="module")
def setup():
    return engine_requests_and_references(NEW)


def _engine(target, policy="fixed", max_running=4, **kwargs):
    if policy == "none":
        return DSparkEngine(target, None, policy="none", max_running=max_running, **kwargs)
    return DSparkEngine(
        target, make_drafter(target), policy=VerificationPolicy(policy, block_size=4), max_running=max_running,
        **kwargs,
    )


def _drain(engine) -> dict[int, EngineRequest]:
    done = {}
    while engine.has_work():
        engine.step()  # a fault never propagates
        done.update((r.request_id, r) for r in engine.take_finished())
    return done


def _unseen_token(target, policy, prompts) -> int:
    """A token id the target never reads (prompt, committed or drafted) while the engine serves `prompts`."""
    seen = set()
    embedding = target.get_input_embeddings()
    handle = embedding.register_forward_pre_hook(lambda _, args: seen.update(args[0].flatten().tolist()))
    engine = _engine(target, policy)
    for p in prompts:
        engine.add_request(p, max_new_tokens=NEW)
    try:
        _drain(engine)
    finally:
        handle.remove()
    return next(t for t in range(3, 96) if t not in seen)


@pytest.mark.parametrize("policy", ["fixed", "none"])
def test_a_prompt_whose_prefill_raises_finishes_with_the_error_and_the_others_match_generate(setup, policy):
    target, prompts, references = setup
    bad = _unseen_token(target, policy, prompts)
    faulty = torch.cat([prompts[0], torch.tensor([bad])])
    engine = _engine(target, policy)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:2]]
    bad_rid = engine.add_request(faulty, max_new_tokens=NEW)  # admitted with the others: one prefill forward
    rids += [engine.add_request(p, max_new_tokens=NEW) for p in prompts[2:]]
    fault = TokenFault(target, bad)
    try:
        done = _drain(engine)
    finally:
        fault.remove()
    failed = done.pop(bad_rid)
    assert failed.finished and failed.generated == [] and failed.failures == 2  # retried once, alone
    assert isinstance(failed.error, RuntimeError) and failed.error.__traceback__ is None
    assert failed.error_message == f"prefill raised RuntimeError: injected fault on token {bad}"
    assert fault.raised == 2  # the batched prefill and the one retry
    assert [done[r].generated for r in rids] == references and all(done[r].error is None for r in rids)
    assert not engine.requests and not engine.finished and not engine.has_work()


def _round_fault_token(references, row: int) -> int:
    """A token of row `row`'s output (after its first) that no other row's output holds."""
    others = {t for r, ref in enumerate(references) if r != row for t in ref}
    return next(t for t in references[row][1:] if t not in others)


@pytest.mark.parametrize("policy", ["fixed", "none"])
def test_a_request_whose_round_raises_finishes_with_its_tokens_so_far_and_the_others_go_on(setup, policy):
    target, prompts, references = setup
    row = 3
    bad = _round_fault_token(references, row)
    engine = _engine(target, policy)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts]
    fault = TokenFault(target, bad)
    try:
        done = _drain(engine)
    finally:
        fault.remove()
    failed = done[rids[row]]
    assert failed.error is not None and failed.failures == 2
    assert failed.error_message.startswith(("round raised RuntimeError", "prefill raised RuntimeError"))
    assert failed.generated == references[row][: len(failed.generated)]  # what it kept: plain generate's
    assert len(failed.generated) <= references[row].index(bad) + 1  # it failed when the target read `bad`
    for r, (rid, reference) in enumerate(zip(rids, references)):
        if r != row:
            assert done[rid].error is None and done[rid].generated == reference, r


def test_a_fault_that_hits_every_request_fails_each_once_retried_and_the_engine_stays_usable(setup, monkeypatch):
    target, prompts, references = setup
    engine = _engine(target)
    first = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:3]]
    engine.step()
    calls = {"n": 0}

    def broken(*args, **kwargs):
        calls["n"] += 1
        raise RuntimeError("broken round")

    monkeypatch.setattr(engine.kernel, "step", broken)
    engine.step()  # does not raise
    monkeypatch.undo()
    assert calls["n"] == 1 + 3  # the batched round, then each request once alone
    failed = engine.take_finished()
    assert [r.request_id for r in failed] == first
    assert all(r.error_message == "round raised RuntimeError: broken round" for r in failed)
    assert all(r.generated == references[i][: len(r.generated)] for i, r in enumerate(failed))
    later = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[3:]]
    done = _drain(engine)
    assert [done[r].generated for r in later] == references[3:]


def test_cancel_racing_faulty_steps_from_another_thread(setup):
    target, prompts, references = setup
    bad = _round_fault_token(references, 3)
    engine = _engine(target)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts]
    fault = TokenFault(target, bad)
    done, errors, started = {}, [], threading.Event()

    def serve():
        try:
            while engine.has_work():
                engine.step()
                started.set()
                done.update((r.request_id, r) for r in engine.take_finished())
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)

    worker = threading.Thread(target=serve)
    worker.start()
    started.wait(30)
    for rid in (rids[1], rids[3], rids[4]):  # a running one, the faulty one, one that may still wait
        with contextlib.suppress(KeyError):  # already finished and collected by the serving thread
            engine.cancel(rid)
    worker.join(120)
    fault.remove()
    done.update((r.request_id, r) for r in engine.take_finished())
    assert not worker.is_alive() and not errors
    assert sorted(done) == rids and not engine.requests
    for r, rid in enumerate(rids):
        request = done[rid]
        assert request.finished and request.generated == references[r][: len(request.generated)], r
        if r in (0, 2, 5):
            assert request.error is None and request.generated == references[r], r
        if request.cancelled:
            assert request.error is None


def test_result_releases_a_finished_request_and_the_uncollected_ones_are_bounded(setup):
    target, prompts, references = setup
    engine = _engine(target, policy="none", max_finished=2)
    rids = [engine.add_request(p, max_new_tokens=3) for p in prompts]
    assert engine.result(rids[0]).finished is False  # not finished: kept
    while engine.has_work():
        engine.step()
    assert len(engine.finished) == 2 and engine.finished.dropped == 4  # the oldest went first
    with pytest.raises(KeyError, match=r"released once result\(\).*max_finished=2"):
        engine.result(rids[0])
    last = engine.result(rids[-1])
    assert last.generated == references[-1][:3]
    with pytest.raises(KeyError, match="unknown request id"):
        engine.result(rids[-1])  # returned once, then released
    assert [r.request_id for r in engine.take_finished()] == [rids[-2]] and not engine.finished
    with pytest.raises(ValueError, match="max_finished"):
        _engine(target, policy="none", max_finished=-1)


def _retained(engine) -> dict[str, int]:
    gc.collect()
    return {
        "requests": len(engine.requests),
        "finished": len(engine.finished),
        "records": len(engine.records),
        "released": len(engine._released),
        # type(), not isinstance(): some gc-tracked proxies warn when their __class__ is read
        "live EngineRequest": sum(type(o) is EngineRequest for o in gc.get_objects()),
        "tensors": sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects()),
    }


def test_ten_thousand_requests_keep_the_engine_flat(setup):
    target, prompts, _ = setup
    engine = _engine(target, max_running=200, max_finished=256, max_records=32)
    counts = []
    for wave in range(50):  # 50 waves of 200 requests: 10,000 in all
        rids = [engine.add_request(prompts[i % len(prompts)], max_new_tokens=2) for i in range(200)]
        collect = rids[::2]  # half are collected by result(), half never (the oldest beyond 256 are dropped)
        while engine.has_work():
            engine.step()
        assert all(len(engine.result(rid).generated) == 2 for rid in collect)  # then released
        if wave in (9, 49):
            counts.append(_retained(engine))
    assert counts[0]["requests"] == counts[1]["requests"] == 0
    assert counts[0]["finished"] == counts[1]["finished"] <= 256 and engine.finished.dropped > 4000
    assert counts[1]["records"] == 32 and counts[1]["released"] == 0
    assert counts[1]["live EngineRequest"] == counts[0]["live EngineRequest"] <= 256 + 1
    assert counts[1]["tensors"] <= counts[0]["tensors"] + 16, counts
    assert engine._next_id == 10_000
