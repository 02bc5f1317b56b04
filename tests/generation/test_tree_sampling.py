"""Tree rounds sample from the target's distribution exactly: exact enumeration vs DSpark tree samples."""

import pytest
import torch
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

import hf_dspark.generation.tree_round as tree_round_module
from hf_dspark.eval.lossless import chi_square_pvalue, exact_joint, sample_codes
from hf_dspark.ops.tree_verification import verify_tree_greedy
from tests.helpers import make_drafter, make_target

VOCAB, NEW_TOKENS, SAMPLES, BUDGET = 8, 4, 12_000, 6
SETTINGS = {"plain": dict(), "temperature+top_k": dict(temperature=0.7, top_k=5)}


@pytest.fixture(scope="module")
def setup():
    target = make_target("llama", seed=4, vocab_size=VOCAB, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.no_grad():  # sharpen the tiny random target so drafts are accepted as well as rejected
        target.lm_head.weight.mul_(6.0)
    drafter = make_drafter(target, seed=5, block_size=3, markov_rank=4)
    prompt = torch.tensor([[3, 5, 1, 6, 2]])
    return target, drafter, prompt


def _warpers(settings) -> LogitsProcessorList:
    out = LogitsProcessorList()
    if "temperature" in settings:
        out.append(TemperatureLogitsWarper(settings["temperature"]))
    if "top_k" in settings:
        out.append(TopKLogitsWarper(settings["top_k"]))
    return out


def _codes(target, drafter, prompt, settings, seed):
    return sample_codes(target, prompt, NEW_TOKENS, SAMPLES, seed, assistant_model=drafter,
                        dspark_tree_budget=BUDGET, dspark_policy="fixed", **{"top_k": 0, **settings})


@pytest.mark.parametrize("name", list(SETTINGS))
def test_tree_sampling_matches_target_distribution(setup, name):
    target, drafter, prompt = setup
    joint = exact_joint(target, prompt, NEW_TOKENS, _warpers(SETTINGS[name]))
    codes = _codes(target, drafter, prompt, SETTINGS[name], seed=1)
    stats = drafter.last_generation_stats
    assert 1.05 < stats.mean_accepted_length < 3.0, "the test needs both accepted and rejected drafts"
    assert chi_square_pvalue(codes, joint) > 1e-4


def test_a_lossy_tree_rule_is_detected(setup, monkeypatch):
    """Power check: keeping the path the target's argmax picks, with the next token sampled from the target at its
    end, is lossy (it over-weights argmax tokens); the same test rejects it."""
    target, drafter, prompt = setup

    def argmax_path(tree, target_probs, sibling_probs=None, generator=None, max_siblings=None):
        result = verify_tree_greedy(tree, target_probs)
        rows = torch.arange(tree.num_rows)
        result.next_token = torch.multinomial(target_probs[rows, result.leaf], 1).squeeze(1)
        return result

    monkeypatch.setattr(tree_round_module, "verify_tree_sampling", argmax_path)
    joint = exact_joint(target, prompt, NEW_TOKENS, _warpers(SETTINGS["plain"]))
    codes = _codes(target, drafter, prompt, SETTINGS["plain"], seed=2)
    assert chi_square_pvalue(codes, joint) < 1e-6
