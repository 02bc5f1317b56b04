"""`certify` (hf-dspark verify): passes a lossless pair, catches a lossy verification, calls a no-acceptance run
inconclusive; on tiny random models with a small vocabulary (so drafts get accepted)."""

import dataclasses

import pytest
import torch
from transformers import LlamaForCausalLM

from hf_dspark import DSparkDrafter
from hf_dspark.eval.verify import VerifyConfig, certify
from hf_dspark.generation import prompt_lookup_for
from tests.helpers import make_drafter, make_target, tiny_llama_config

VOCAB = 8
CONFIG = VerifyConfig(prompts=3, max_new_tokens=12, samples=1200, sample_tokens=3, sample_batch=600,
                      quality_samples=0, min_accepted=5, min_position_samples=60)
PROMPTS = [torch.tensor([3, 5, 1, 6, 2]), torch.tensor([4, 4, 2, 7]), torch.tensor([1, 2, 3, 4, 5, 6])]
TARGET = dict(vocab_size=VOCAB, eos_token_id=None, bos_token_id=None, pad_token_id=0)


class AcceptEveryDraft(LlamaForCausalLM):
    """A target whose multi-token forwards favour each next input token by +100 at the position before it: in a
    verification forward that is the draft, so verification accepts drafts the target would not pick. Plain
    decoding (one new token per forward, last position only) is unchanged."""

    def forward(self, input_ids=None, **kwargs):
        out = super().forward(input_ids=input_ids, **kwargs)
        if input_ids is not None and input_ids.shape[1] > 1 and out.logits.shape[1] == input_ids.shape[1]:
            boost = torch.full(input_ids[:, 1:, None].shape, 100.0, dtype=out.logits.dtype)
            out.logits[:, :-1].scatter_add_(-1, input_ids[:, 1:, None], boost)
        return out


class AlwaysDraftsSeven(DSparkDrafter):
    """An honest drafter that always proposes token 7 (with probability 1); the target suppresses 7, so every
    draft is rejected: lossless, and nothing accepted."""

    def propose(self, anchor_ids, cache, **kwargs):
        proposal = super().propose(anchor_ids, cache, **kwargs)
        sevens = torch.full_like(proposal.draft_ids, 7)
        probs = proposal.draft_probs
        if probs is not None:
            probs = torch.nn.functional.one_hot(sevens, probs.shape[-1]).to(probs.dtype)
        return dataclasses.replace(proposal, draft_ids=sevens, draft_probs=probs,
                                   draft_token_probs=torch.ones_like(proposal.draft_token_probs))


def _sharpened(target):
    with torch.no_grad():  # a peaked target, so the drafter's guesses are often right
        target.lm_head.weight.mul_(6.0)
    return target


@pytest.fixture(scope="module")
def pair():
    target = _sharpened(make_target("llama", seed=4, **TARGET))
    return target, make_drafter(target, seed=5, block_size=3, markov_rank=4)


def test_a_lossless_pair_passes(pair):
    """Prompt lookup: the tiny target's greedy continuations repeat, so its drafts get accepted."""
    target, _ = pair
    report = certify(target, prompt_lookup_for(target, 3), PROMPTS, CONFIG)
    assert report["greedy"]["verdict"] == "pass", report["greedy"]
    assert report["greedy"]["identical"] == len(PROMPTS)
    sampling = report["sampling"]
    assert sampling["verdict"] == "pass", sampling
    tested = [p for p in sampling["positions"] if "pvalue" in p]
    assert len(tested) >= 2 and all(0 < p["detectable_difference"] < 0.2 for p in tested)
    assert report["verdict"] == "pass"


def test_a_verification_that_accepts_every_draft_is_caught():
    torch.manual_seed(4)
    target = _sharpened(AcceptEveryDraft(tiny_llama_config(**TARGET)).eval())
    drafter = make_drafter(target, seed=5, block_size=3, markov_rank=4)
    report = certify(target, drafter, PROMPTS, CONFIG)
    assert report["verdict"] == "fail"
    greedy = report["greedy"]
    assert greedy["verdict"] == "fail"
    diverged = [row for row in greedy["prompts"] if row["first_divergence"] is not None]
    assert diverged and not any(row["near_tie"] for row in diverged)
    assert all(len(row["top2_logits"]) == 2 and row["plain_token"] != row["speculative_token"] for row in diverged)
    assert report["sampling"]["verdict"] == "fail"
    assert min(p["pvalue"] for p in report["sampling"]["positions"] if "pvalue" in p) < 1e-6


def test_no_accepted_draft_is_inconclusive():
    target = _sharpened(make_target("llama", seed=4, **TARGET))
    target.generation_config.suppress_tokens = [7]
    torch.manual_seed(5)
    drafter = AlwaysDraftsSeven(make_drafter(target, block_size=3, markov_rank=4).config).eval().bind_target(target)
    report = certify(target, drafter, PROMPTS, CONFIG)
    assert report["greedy"]["accepted_drafts"] == 0 and report["sampling"]["accepted_drafts"] == 0
    assert report["greedy"]["verdict"] == "inconclusive" and report["sampling"]["verdict"] == "inconclusive"
    assert report["verdict"] == "inconclusive"


def test_the_config_refuses_bad_values():
    with pytest.raises(ValueError, match="alpha must lie in"):
        VerifyConfig(alpha=1.5)
    with pytest.raises(ValueError, match="samples must be >= 1"):
        VerifyConfig(samples=0)
