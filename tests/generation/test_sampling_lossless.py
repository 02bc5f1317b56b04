"""Speculative sampling follows the target distribution exactly: exact enumeration vs DSpark samples."""

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import hf_dspark.generation.round as round_module
from hf_dspark.eval.lossless import chi_square_pvalue, exact_joint, sample_codes
from hf_dspark.ops.verification import VerificationResult
from tests.helpers import make_drafter, make_target

VOCAB, NEW_TOKENS, SAMPLES = 8, 4, 24_000
SETTINGS = {
    "plain": dict(),
    "temperature+top_k": dict(temperature=0.7, top_k=5),
    "top_p": dict(top_p=0.8),
    "min_p": dict(temperature=1.3, min_p=0.1),
}


def _warpers(settings) -> LogitsProcessorList:
    out = LogitsProcessorList()
    if "temperature" in settings:
        out.append(TemperatureLogitsWarper(settings["temperature"]))
    if "top_k" in settings:
        out.append(TopKLogitsWarper(settings["top_k"]))
    if "top_p" in settings:
        out.append(TopPLogitsWarper(settings["top_p"]))
    if "min_p" in settings:
        out.append(MinPLogitsWarper(settings["min_p"]))
    return out


@pytest.fixture(scope="module")
def setup():
    target = make_target("llama", seed=4, vocab_size=VOCAB, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.no_grad():  # sharpen the tiny random target a little so the warpers have something to cut
        target.lm_head.weight.mul_(6.0)
    drafter = make_drafter(target, seed=5, block_size=3, markov_rank=4)
    prompt = torch.tensor([[3, 5, 1, 6, 2]])
    return target, drafter, prompt


def _exact_joint(target, prompt, settings) -> torch.Tensor:
    return exact_joint(target, prompt, NEW_TOKENS, _warpers(settings))


def _sample_codes(target, drafter, prompt, settings, seed) -> torch.Tensor:
    return sample_codes(target, prompt, NEW_TOKENS, SAMPLES, seed, assistant_model=drafter,
                        **{"top_k": 0, **settings})


@pytest.mark.parametrize("name", list(SETTINGS))
def test_dspark_sampling_matches_target_distribution(setup, name):
    target, drafter, prompt = setup
    joint = _exact_joint(target, prompt, SETTINGS[name])
    codes = _sample_codes(target, drafter, prompt, SETTINGS[name], seed=1)
    stats = drafter.last_generation_stats
    assert 0.05 < stats.acceptance_rate < 0.95, "the test needs both accepted and rejected drafts"
    assert chi_square_pvalue(codes, joint) > 1e-4


def test_a_wrong_acceptance_rule_is_detected(setup, monkeypatch):
    """Power check: accepting every draft (a lossy rule) fails the same test."""
    target, drafter, prompt = setup

    def accept_all(draft_ids, draft_probs, target_probs, verify_len, generator=None):
        bonus = torch.multinomial(target_probs[torch.arange(len(verify_len)), verify_len], 1).squeeze(1)
        return VerificationResult(verify_len.clone(), bonus)

    monkeypatch.setattr(round_module, "verify_sampling", accept_all)
    joint = _exact_joint(target, prompt, SETTINGS["plain"])
    codes = _sample_codes(target, drafter, prompt, SETTINGS["plain"], seed=2)
    assert chi_square_pvalue(codes, joint) < 1e-6


def test_auto_policy_sampling_matches_target_distribution(setup, name="top_p"):
    """With the cost-aware policy some rows draft and others decode plainly in the same rounds; still exact."""
    from hf_dspark.profiling.step_curve import StepCurve

    target, drafter, prompt = setup
    rows = [1, 10, 100, 1000, 4000, 8000]
    per_row = 1.0 / 16_000  # drafting all 4000 rows costs a quarter of a (flat, 1 s) verification forward
    settings = {**SETTINGS[name], "dspark_policy": "auto", "dspark_step_curve": StepCurve([1, 40_000], [1.0, 1.0]),
                "dspark_draft_curve": StepCurve(rows, [1.0 / (per_row * r) for r in rows])}
    joint = _exact_joint(target, prompt, SETTINGS[name])
    codes = _sample_codes(target, drafter, prompt, settings, seed=3)
    drafted = drafter.last_generation_stats.drafted_rows
    assert any(0 < d < 4000 for d in drafted), drafted  # a subset of the rows drafted
    assert chi_square_pvalue(codes, joint) > 1e-4
