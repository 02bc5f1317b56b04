"""Verification-length scheduling inside generate: lossless with every policy, budgets visible in the stats."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.generation import oracle_for
from hf_dspark.generation.policy import policy_from_config
from hf_dspark.profiling import target_steps as profiling
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.target.packed_linear import linear_packs_for
from tests.helpers import make_drafter, make_target, ragged_prompts

GAMMA = 4
MAX_NEW = 24
STEEP = StepCurve([1, 2, 4, 8, 16, 32, 64], [1.0 / b**2 for b in (1, 2, 4, 8, 16, 32, 64)])  # ℓ = 0 always pays
FLAT = StepCurve([1, 64], [1.0, 1.0])  # verification is free up to 64 tokens: admit every candidate


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=5)


def _generate(target, drafter, ids, mask, **dspark):
    config = GenerationConfig(do_sample=False, max_new_tokens=MAX_NEW, **dspark)
    return target.generate(ids, attention_mask=mask, assistant_model=drafter, generation_config=config)


def _plain(target, ids, mask):
    return target.generate(ids, attention_mask=mask, generation_config=GenerationConfig(do_sample=False,
                                                                                        max_new_tokens=MAX_NEW))


def _caps(stats) -> list[dict[int, int]]:
    """Per round, the cap min(γ, remaining − 1) each active row had (max_new_tokens minus what it committed)."""
    committed = dict.fromkeys(range(stats.batch_size), 1)  # the prefill commits one token per row
    caps = []
    for lens, accepted in zip(stats.verify_lens, stats.accepted_lengths):
        caps.append({row: min(GAMMA, MAX_NEW - committed[row] - 1) for row in lens})
        for row, count in accepted.items():
            committed[row] += count
    return caps


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    ("policy", "extra", "expect"),
    [
        ("greedy", {"dspark_step_curve": STEEP}, "none"),
        ("lagged", {"dspark_step_curve": STEEP}, "none"),
        ("threshold", {"dspark_threshold": 1.0}, "none"),
        ("greedy", {"dspark_step_curve": FLAT}, "all"),
        ("lagged", {"dspark_step_curve": FLAT}, "all"),
        ("threshold", {"dspark_threshold": 0.0}, "all"),
    ],
)
def test_scheduled_greedy_is_lossless(target, batch, policy, extra, expect):
    ids, mask = ragged_prompts(batch, seed=batch + 10)
    drafter = make_drafter(target, block_size=GAMMA)
    output = _generate(target, drafter, ids, mask, dspark_policy=policy, **extra)
    assert torch.equal(output, _plain(target, ids, mask))
    stats = drafter.last_generation_stats
    assert stats.policy == policy and stats.rounds > 0
    for lens, caps in zip(stats.verify_lens, _caps(stats)):
        assert lens == ({row: 0 for row in lens} if expect == "none" else caps)
    assert stats.batch_tokens == [sum(1 + v for v in lens.values()) for lens in stats.verify_lens]
    assert len(stats.expected_tokens) == stats.rounds and all(t >= len(lens) for t, lens in
                                                             zip(stats.expected_tokens, stats.verify_lens))
    has_curve = policy != "threshold"
    assert all((theta is not None) == has_curve for theta in stats.expected_throughput)


def test_oracle_with_scheduler_admits_confident_drafts(target):
    ids, mask = ragged_prompts(2, seed=4)
    reference = _plain(target, ids, mask)
    oracle = oracle_for(target, GAMMA, reference, mask)  # confidence 0.99 everywhere
    curve = StepCurve([1, 4, 8, 16], [10.0, 9.5, 9.0, 8.0])
    output = _generate(target, oracle, ids, mask, dspark_policy="greedy", dspark_step_curve=curve)
    assert torch.equal(output, reference)
    stats = oracle.last_generation_stats
    assert stats.verify_lens == _caps(stats)  # every candidate admitted, up to the token budget
    assert stats.mean_accepted_length > 3.0


def test_dspark_options_as_plain_generate_kwargs(target):
    """`generate(..., dspark_policy=...)` works like setting the option on the GenerationConfig."""
    ids, mask = ragged_prompts(2, seed=6)
    reference = _plain(target, ids, mask)
    oracle = oracle_for(target, GAMMA, reference, mask)
    output = target.generate(ids, attention_mask=mask, assistant_model=oracle, do_sample=False, max_new_tokens=MAX_NEW,
                             dspark_policy="fixed", dspark_verify_len=2)
    assert torch.equal(output, reference)
    stats = oracle.last_generation_stats
    assert stats.policy == "fixed" and all(v <= 2 for lens in stats.verify_lens for v in lens.values())
    assert stats.mean_accepted_length > 2.0


def test_missing_step_curve_is_looked_up_and_cached(target, tmp_path, monkeypatch):
    monkeypatch.setenv(profiling.CACHE_ENV, str(tmp_path))
    ids, mask = ragged_prompts(2, seed=8)
    drafter = make_drafter(target, block_size=GAMMA)
    output = _generate(target, drafter, ids, mask, dspark_policy="lagged")
    assert torch.equal(output, _plain(target, ids, mask))
    key = profiling.step_curve_key(target, packs=linear_packs_for(target))  # packed by default on a float32 CPU
    assert key[2] == "float32-onednn" and profiling.step_curve_path(*key).is_file()
    monkeypatch.setattr(profiling, "profile_step_curve", lambda *a, **k: pytest.fail("profiled twice"))
    policy = policy_from_config(GenerationConfig(dspark_policy="greedy"), GAMMA, target=target)
    assert policy.step_curve == StepCurve.load(profiling.step_curve_path(*key))


def test_load_aware_policy_needs_confidence_head(target):
    ids, mask = ragged_prompts(1, seed=2)
    drafter = make_drafter(target, block_size=GAMMA, use_confidence_head=False)
    with pytest.raises(ValueError, match="no confidence head"):
        _generate(target, drafter, ids, mask, dspark_policy="greedy", dspark_step_curve=FLAT)


def test_recorded_confidence_gives_calibration_pairs(target):
    ids, mask = ragged_prompts(3, seed=6)
    drafter = make_drafter(target, block_size=GAMMA)
    _generate(target, drafter, ids, mask, dspark_record_confidence=True)
    stats = drafter.last_generation_stats
    assert len(stats.confidence_logits) == stats.rounds
    logits, survived = stats.calibration_pairs()
    full = sum(v == GAMMA for lens in stats.verify_lens for v in lens.values())
    assert logits.shape == survived.shape == (full, GAMMA)
    assert bool((survived[:, 1:] <= survived[:, :-1]).all())  # prefix-closed
    accepted = [stats.accepted_drafts[i][row] for i, lens in enumerate(stats.verify_lens)
                for row, v in lens.items() if v == GAMMA]
    assert survived.sum(dim=1).tolist() == accepted
    first = stats.confidence_logits[0]
    assert first.shape == (3, GAMMA) and torch.equal(logits[:3], first)  # round 1: every row verifies γ

    plain = make_drafter(target, block_size=GAMMA)
    _generate(target, plain, ids, mask)
    assert plain.last_generation_stats.confidence_logits == []


def test_sampling_with_scheduler_respects_bounds(target):
    torch.manual_seed(0)
    ids, mask = ragged_prompts(2, seed=9)
    drafter = make_drafter(target, block_size=GAMMA)
    config = GenerationConfig(do_sample=True, max_new_tokens=MAX_NEW, dspark_policy="lagged",
                              dspark_step_curve=StepCurve([1, 4, 16], [10.0, 8.0, 3.0]))
    output = target.generate(ids, attention_mask=mask, assistant_model=drafter, generation_config=config)
    assert output.shape == (2, ids.shape[1] + MAX_NEW)
    lens = [v for rnd in drafter.last_generation_stats.verify_lens for v in rnd.values()]
    assert all(0 <= v <= GAMMA for v in lens)
