"""DSparkEngine with `tree_budget`: requests verify draft trees (fixed budget, or sized by `auto`) and every
request's greedy output stays identical to plain generate, with requests joining mid-flight."""

import pytest
import torch

from hf_dspark.generation.round import RoundKernel
from hf_dspark.generation.tree_round import TreeRoundKernel
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.proposers import hybrid_for
from hf_dspark.scheduling.verification_policy import VerificationPolicy
from hf_dspark.serving.engine import DSparkEngine
from tests.helpers import make_drafter, make_target, ragged_prompts

NEW = 20
FLAT = StepCurve([1, 4096], [1.0, 1.0])
CHEAP = StepCurve([1, 4096], [1000.0, 1000.0])


@pytest.fixture(scope="module")
def setup():
    target = make_target("llama", seed=11, eos_token_id=None)
    ids, mask = ragged_prompts(5, seed=3, min_len=8, max_len=16)
    ids[:, -4:] = ids[:, -8:-4]  # something for a lookup to copy
    prompts = [ids[r][mask[r].bool()] for r in range(len(ids))]
    references = [target.generate(p[None], do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)[0]
                  for p in prompts]
    return target, prompts, references


def _policy(name: str) -> VerificationPolicy:
    if name == "auto":
        return VerificationPolicy("auto", block_size=4, step_curve=FLAT, draft_curve=CHEAP, measured_costs=False)
    return VerificationPolicy("fixed", block_size=4)


def _serve(engine, prompts):
    rids = [engine.add_request(p, max_new_tokens=NEW) for p in prompts[:3]]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
        if steps == 2:
            rids += [engine.add_request(p, max_new_tokens=NEW) for p in prompts[3:]]
    return rids


@pytest.mark.parametrize("policy", ["fixed", "auto"])
@pytest.mark.parametrize("kind", ["dspark", "hybrid"])
def test_engine_trees_greedy_match_plain_generate(setup, policy, kind):
    target, prompts, references = setup
    drafter = make_drafter(target, block_size=4)
    if kind == "hybrid":
        drafter = hybrid_for(drafter, "prompt-lookup")
    engine = DSparkEngine(target, drafter, policy=_policy(policy), max_running=3, tree_budget=8)
    assert type(engine.kernel) is TreeRoundKernel
    rids = _serve(engine, prompts)
    for rid, (prompt, ref) in zip(rids, zip(prompts, references)):
        assert engine.result(rid).generated == ref[prompt.numel() :].tolist(), (policy, kind, rid)
    assert any(rec.drafted for rec in engine.records)


def test_engine_tree_budget_is_checked(setup):
    target = setup[0]
    drafter = make_drafter(target, block_size=4)
    for bad in (1, 2.5, True):
        with pytest.raises(ValueError, match="tree_budget"):
            DSparkEngine(target, drafter, policy=_policy("fixed"), tree_budget=bad)
    assert type(DSparkEngine(target, drafter, policy=_policy("fixed")).kernel) is RoundKernel
    assert type(DSparkEngine(target, None, tree_budget=8).kernel) is RoundKernel  # plain decoding: nothing to draft


def test_engine_tree_sampling_runs(setup):
    target, prompts, _ = setup
    torch.manual_seed(0)
    engine = DSparkEngine(target, make_drafter(target, block_size=4), policy=_policy("fixed"), do_sample=True,
                          top_k=0, max_running=2, tree_budget=6)
    rids = _serve(engine, prompts)
    assert all(len(engine.result(rid).generated) == NEW for rid in rids)
