"""DSparkEngine: continuous batching keeps every request's greedy output identical to plain generate."""

import pytest
import torch

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.eval.serve import ServeConfig, run_serve_benchmark
from hf_dspark.generation import oracle_for
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling.verification_policy import VerificationPolicy
from hf_dspark.serving.engine import DSparkEngine
from tests.helpers import make_drafter, make_target, ragged_prompts

NEW = 24


@pytest.fixture(scope="module")
def setup():
    target = make_target("llama", seed=11, eos_token_id=None)
    ids, mask = ragged_prompts(7, seed=3)
    prompts = [ids[r][mask[r].bool()] for r in range(len(ids))]
    references = [target.generate(p[None], do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)[0]
                  for p in prompts]
    return target, prompts, references


def _curve(kind: str) -> StepCurve:
    points = [1, 2, 4, 8, 16, 32, 64]
    if kind == "flat":
        return StepCurve(points, [10.0] * len(points))
    return StepCurve(points, [10.0 / b**2 for b in points])


def _policies(gamma):
    return {
        "none": "none",
        "fixed": VerificationPolicy("fixed", block_size=gamma),
        "fixed1": VerificationPolicy("fixed", block_size=gamma, verify_len=1),
        "threshold": VerificationPolicy("threshold", block_size=gamma, threshold=0.3),
        "lagged_flat": VerificationPolicy("lagged", block_size=gamma, step_curve=_curve("flat")),
        "greedy_steep": VerificationPolicy("greedy", block_size=gamma, step_curve=_curve("steep")),
    }


def _serve(engine, prompts, late_from=4, late_after=2):
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:late_from]]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
        if steps == late_after:
            rids += [engine.add_request(p, max_new_tokens=NEW) for p in prompts[late_from:]]
    return rids


@pytest.mark.parametrize("name", list(_policies(4)))
@pytest.mark.parametrize("kind", ["learned", "oracle"])
def test_engine_greedy_matches_plain_generate(setup, name, kind):
    target, prompts, references = setup
    if kind == "learned":
        drafter = make_drafter(target)
    else:
        drafter = oracle_for(target, 4, references[0][None], torch.ones(1, 1))
        drafter.reference = list(references)
    engine = DSparkEngine(target, drafter, policy=_policies(4)[name], max_running=3)
    rids = _serve(engine, prompts)
    for rid, (prompt, ref) in zip(rids, zip(prompts, references)):
        assert engine.result(rid).generated == ref[prompt.numel() :].tolist(), (name, rid)
    lens = [v for rec in engine.records for v in rec.verify_lens]
    if name == "none" or name == "greedy_steep":
        assert max(lens) == 0
    if name == "lagged_flat" and kind == "oracle":
        assert sum(lens) / len(lens) > 2.0
    if kind == "oracle" and name == "fixed":
        assert max(rec.running for rec in engine.records) == 3  # the batch was full while requests waited


def test_engine_sampling_and_cancel(setup):
    target, prompts, _ = setup
    torch.manual_seed(0)
    engine = DSparkEngine(target, make_drafter(target), policy=VerificationPolicy("fixed", block_size=4),
                          do_sample=True, temperature=0.8, top_p=0.9)
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:3]]
    engine.step()
    engine.cancel(rids[1])
    while engine.has_work():
        engine.step()
    cancelled = engine.result(rids[1])
    assert cancelled.finished and cancelled.cancelled and len(cancelled.generated) < NEW
    assert all(len(engine.result(r).generated) == NEW for r in (rids[0], rids[2]))


def test_engine_rejects_bad_input(setup):
    target, _, _ = setup
    with pytest.raises(ValueError, match="needs a drafter"):
        DSparkEngine(target, None, policy=VerificationPolicy("fixed", block_size=4))
    engine = DSparkEngine(target)
    with pytest.raises(ValueError, match="at least one prompt token"):
        engine.add_request([], max_new_tokens=4)


@pytest.mark.parametrize("name", ["fixed", "auto"])
def test_engine_takes_policy_names_as_generate_does(setup, name):
    target, prompts, references = setup
    drafter = make_drafter(target)
    engine = DSparkEngine(target, drafter, policy=name, max_running=3)
    assert isinstance(engine.policy, VerificationPolicy) and engine.policy.name == name
    if name == "auto":
        assert engine.policy.greedy and engine.policy.step_curve is not None
    rids = _serve(engine, prompts)
    for rid, (prompt, ref) in zip(rids, zip(prompts, references)):
        assert engine.result(rid).generated == ref[prompt.numel() :].tolist(), (name, rid)
    with pytest.raises(ValueError, match="policy must be 'none', one of"):
        DSparkEngine(target, drafter, policy="fastest")


@pytest.mark.parametrize("policy", ["none", "fixed"])
def test_engine_request_finished_by_its_first_token_gets_no_more(setup, policy):
    target, prompts, references = setup
    first = int(references[0][prompts[0].numel()])
    for kwargs, new in ((dict(), 1), (dict(eos_token_id=first), 4)):
        engine = DSparkEngine(target, make_drafter(target), policy=policy, **kwargs)
        early = engine.add_request(prompts[0], max_new_tokens=new)
        other = engine.add_request(prompts[1], max_new_tokens=3)
        while engine.has_work():
            engine.step()
        assert engine.result(early).generated == [first], kwargs  # nothing after max_new_tokens or EOS
        assert len(engine.result(other).generated) == 3


def test_engine_refuses_bad_requests_and_settings_before_running(setup):
    target, prompts, _ = setup
    drafter = make_drafter(target)
    engine = DSparkEngine(target, drafter, policy="fixed")
    kept = engine.add_request(prompts[0], max_new_tokens=2)
    vocab = target.get_input_embeddings().num_embeddings
    for bad, match in (([[5, 6], [7, 8]], "one prompt"), (torch.tensor([5.5, 6.0]), "integers"),
                       ("hello", "not text"), ([5, vocab], "outside the target's vocabulary"), ([-1, 5], "outside")):
        with pytest.raises(ValueError, match=match):
            engine.add_request(bad, max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.add_request([5, 6], max_new_tokens=2.5)
    assert engine.waiting == [kept]  # a refused request leaves the queue as it was
    assert engine.add_request(torch.tensor([[5, 6, 7]]), max_new_tokens=1) == kept + 1  # [1, L] is one prompt
    with pytest.raises(KeyError, match="unknown request id 999"):
        engine.result(999)
    with pytest.raises(ValueError, match="max_running"):
        DSparkEngine(target, drafter, policy="fixed", max_running=0)
    with pytest.raises(ValueError, match="policy must be"):
        DSparkEngine(target, drafter, policy=None)
    gamma = drafter.config.block_size
    with pytest.raises(ValueError, match=f"block_size={gamma + 1}"):
        DSparkEngine(target, drafter, policy=VerificationPolicy("fixed", block_size=gamma + 1))


def test_serve_benchmark_smoke(setup, tmp_path):
    target, prompts, _ = setup
    config = ServeConfig(concurrency=[1, 3], requests_per_level=3, max_new_tokens=8, threads=1,
                         out=str(tmp_path / "serve.json"))
    report = run_serve_benchmark(config, target, prompts, make_drafter(target), step_curve=_curve("flat"),
                                 draft_curve=_curve("flat"))
    assert {(r["policy"], r["concurrency"]) for r in report["results"]} == {
        (p, c) for p in config.policies for c in (1, 3)}
    assert all(r["aggregate_tokens_per_second"] > 0 for r in report["results"])
    assert (tmp_path / "serve_frontier.png").stat().st_size > 0
    assert (tmp_path / "serve_budget.png").stat().st_size > 0


def test_serve_benchmark_with_an_oracle_accepts_its_drafts(setup, tmp_path):
    """Request i serves prompts[i % n]; an oracle keyed by request id therefore proposes the right tokens."""
    target, prompts, references = setup
    oracle = oracle_for(target, 4, references[0][None], torch.ones(1, 1))
    oracle.reference = [references[i % len(references)] for i in range(8)]
    config = ServeConfig(concurrency=[2], policies=["fixed"], requests_per_level=8, max_new_tokens=NEW, threads=1,
                         out=str(tmp_path / "serve.json"))
    report = run_serve_benchmark(config, target, prompts, oracle)
    assert report["results"][0]["mean_committed_per_round"] > 3.0


def test_engine_refuses_a_drafter_bound_to_another_target(setup):
    """Binding moves a drafter to the new target's embedding, LM head, device and dtype: the engine must not take
    it from the target (and engines) it serves; an unbound drafter is still bound here."""
    target, _, _ = setup
    twin = make_target("llama", seed=11, eos_token_id=None)  # same shapes, another instance
    drafter = make_drafter(twin)
    with pytest.raises(ValueError, match="bound to a different target model instance"):
        DSparkEngine(target, drafter, policy="fixed")
    assert drafter.bound_to(twin)
    DSparkEngine(target, drafter, policy="none")  # plain decoding does not use (or bind) the drafter
    assert drafter.bound_to(twin)
    drafter.bind_target(target)  # an explicit rebind is the caller's choice
    assert DSparkEngine(target, drafter, policy="fixed").drafter is drafter and drafter.bound_to(target)
    unbound = DSparkDrafter(DSparkConfig.from_target(target.config, block_size=4, target_layer_ids=[0, 2]))
    DSparkEngine(target, unbound, policy="fixed")
    assert unbound.bound_to(target)


@pytest.mark.parametrize(("settings", "match"), [
    (dict(do_sample=True, top_p=1.5), r"top_p must be a number in \(0, 1\] .*got 1.5"),
    (dict(do_sample=True, top_p=0.0), r"top_p must be a number in \(0, 1\] .*got 0.0"),
    (dict(do_sample=True, temperature=-0.5), "temperature must be a finite number >= 0, got -0.5"),
    (dict(do_sample=False, temperature=-0.5), "temperature must be a finite number >= 0, got -0.5"),
    (dict(do_sample=True, temperature=0.0), "temperature=0 cannot be sampled from: set do_sample=False"),
    (dict(do_sample=True, top_k=-3), "top_k must be an integer >= 0"),
    (dict(eos_token_id="</s>"), "eos_token_id must be a token id .*got '</s>'; for a token string use"),
    (dict(eos_token_id=2.0), "eos_token_id must be a token id .*got 2.0"),
    (dict(eos_token_id=[2, "x"]), r"eos_token_id must be a token id .*got \[2, 'x'\]"),
])
def test_engine_validates_decoding_settings_as_generate_does(setup, settings, match):
    target, _, _ = setup
    with pytest.raises(ValueError, match=match):
        DSparkEngine(target, make_drafter(target), policy="fixed", **settings)


def test_engine_takes_eos_ids_as_an_int_a_list_or_a_tensor(setup):
    target, _, _ = setup
    for eos in (5, [5, 7], torch.tensor([5, 7])):
        assert DSparkEngine(target, eos_token_id=eos).eos <= {5, 7}
    assert DSparkEngine(target, do_sample=False, temperature=0.0).eos == set()  # greedy: temperature 0 is unused
