"""Model-free proposers and the hybrid drafter: matching, greedy bit-identity, sampling exactness."""

import pytest
import torch

from hf_dspark.eval.lossless import chi_square_pvalue
from hf_dspark.generation import prompt_lookup_for, suffix_proposer_for
from hf_dspark.proposers import HybridDrafter, NgramIndex, hybrid_for
from tests.generation.test_sampling_lossless import SETTINGS, _exact_joint, _sample_codes
from tests.helpers import make_drafter, make_target, ragged_prompts
from tests.proposers.reference_lookup import lookup_continuation


def test_index_matches_the_latest_longest_suffix():
    index = NgramIndex(max_ngram=3)
    seq = index.new_sequence()
    history = [5, 6, 7, 9, 5, 6, 7, 8, 1, 5, 6]
    index.extend(seq, history[:-1])
    assert index.lookup(history, 4) == ([7, 8, 1, 5], 2)
    assert index.lookup(history, 4)[0] == lookup_continuation(history, 4, 3)
    assert index.lookup([42], 3) == ([], 0)


def test_index_memory_is_bounded():
    index = NgramIndex(max_ngram=2, max_tokens=10)
    first = index.new_sequence()
    index.extend(first, [1, 2, 3, 4, 5, 6])
    second = index.new_sequence()
    index.extend(second, [7, 8, 9, 10, 11, 12])
    assert index.total <= 10 and first not in index.sequences
    assert index.lookup([1, 2], 2) == ([], 0)  # pointed into the evicted sequence
    assert index.lookup([8], 2) == ([9, 10], 1)


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=11)


def _kinds(target):
    return {
        "prompt-lookup": lambda: prompt_lookup_for(target, 4),
        "suffix": lambda: suffix_proposer_for(target, 4),
        "hybrid": lambda: hybrid_for(make_drafter(target, block_size=4), "prompt-lookup"),
        "hybrid-suffix": lambda: hybrid_for(make_drafter(target, block_size=4), "suffix"),
    }


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("kind", ["prompt-lookup", "suffix", "hybrid", "hybrid-suffix"])
def test_greedy_matches_plain_generate(target, batch, kind):
    ids, mask = ragged_prompts(batch, seed=batch + 20, min_len=8, max_len=20)
    ids[:, -6:] = ids[:, -12:-6] if ids.shape[1] >= 12 else ids[:, -6:]  # something to copy
    drafter = _kinds(target)[kind]()
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    for _ in range(2):  # the second call also sees the first call's rows (the suffix store)
        output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, assistant_model=drafter)
        assert torch.equal(reference, output)
    stats = drafter.last_generation_stats
    assert stats.rounds > 0 and stats.draft_tokens_verified > 0


def test_suffix_store_copies_an_earlier_output(target):
    """A repeated request: the second time every draft comes from the first request's output."""
    ids, mask = ragged_prompts(1, seed=5, min_len=6, max_len=6)
    proposer = suffix_proposer_for(target, 4)
    target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, assistant_model=proposer)
    target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, assistant_model=proposer)
    assert proposer.last_generation_stats.mean_accepted_length >= 3.0


def test_hybrid_uses_both_sources_and_skips_the_drafter_when_copying(target):
    hybrid = hybrid_for(make_drafter(target, block_size=4), "suffix")
    ids, mask = ragged_prompts(2, seed=6, min_len=6, max_len=9)
    for _ in range(2):
        target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, assistant_model=hybrid)
    dspark, lookup = hybrid.source_counts
    assert dspark > 0 and lookup > 0


def test_hybrid_refuses_mismatched_block_sizes(target):
    with pytest.raises(ValueError, match="block size"):
        HybridDrafter(make_drafter(target, block_size=4), prompt_lookup_for(target, 3))


@pytest.fixture(scope="module")
def sampling_setup():
    from tests.generation.test_sampling_lossless import VOCAB

    target = make_target("llama", seed=4, vocab_size=VOCAB, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)
    prompt = torch.tensor([[3, 5, 1, 6, 2, 3, 5]])
    return target, prompt


@pytest.mark.parametrize("kind,name", [("prompt-lookup", "plain"), ("hybrid", "plain"), ("hybrid", "top_p")])
def test_sampling_matches_target_distribution(sampling_setup, kind, name):
    target, prompt = sampling_setup
    if kind == "hybrid":
        drafter = hybrid_for(make_drafter(target, seed=5, block_size=3, markov_rank=4), "suffix", prior=(1.0, 1.0))
    else:
        drafter = prompt_lookup_for(target, 3)
    joint = _exact_joint(target, prompt, SETTINGS[name])
    codes = _sample_codes(target, drafter, prompt, SETTINGS[name], seed=7)
    stats = drafter.last_generation_stats
    assert 0.02 < stats.acceptance_rate < 0.98
    if kind == "hybrid":
        assert min(drafter.source_counts) > 0, drafter.source_counts
    assert chi_square_pvalue(codes, joint) > 1e-4


def test_eval_specs_build_model_free_and_hybrid_drafters(target):
    import argparse

    from hf_dspark.cli.loaders import load_drafter_spec
    from hf_dspark.cli.validation import check_drafter_spec
    from hf_dspark.proposers import SuffixProposer

    assert isinstance(load_drafter_spec(target, "suffix:5"), SuffixProposer)
    hybrid = load_drafter_spec(target, "hybrid-suffix:untrained:4")
    assert isinstance(hybrid, HybridDrafter) and hybrid.config.block_size == 4
    parser = argparse.ArgumentParser()
    check_drafter_spec(parser, "--drafters x=", "prompt-lookup:7")
    for bad in ("hybrid", "suffix:zero"):
        with pytest.raises(SystemExit):
            check_drafter_spec(parser, "--drafters x=", bad)
