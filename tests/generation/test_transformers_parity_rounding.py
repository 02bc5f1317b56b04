"""What DSpark's greedy output shares with plain `generate` bit for bit, and what only up to float rounding
(docs/generation.md, "What is bit-identical").

Tokens are bit-identical (fp32). `scores`, `logits` and the returned cache are not: a position verified inside a
multi-token forward goes through matmuls of another shape than plain decoding's one-token step, so its values
differ in the last bits, as they do in transformers' own assisted loop (whose test, `_check_similar_generate_outputs`,
allows 1e-5). The bound asserted here is relative to each row's magnitude: |Δ| ≤ ROUNDING · ε · max|row|, ε the
float32 machine epsilon. Measured on these tiny families (batches of 1 and 3, 16 new tokens, drafters whose drafts
are all, some or none accepted): at most 9.3 ε·max|row| for scores and logits (4.8e-7 absolute), 9.8 for the
returned cache's keys and values (3.0e-6 absolute); transformers' own assisted loop reaches 7.0 on the same scores.
"""

import copy

import pytest
import torch

from tests.generation.test_families import FAMILIES, make_family
from tests.helpers import holed_oracle, ragged_prompts

ROUNDING = 16  # in units of ε·max|row|
EPS = torch.finfo(torch.float32).eps


def assert_within_rounding(ours: torch.Tensor, theirs: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """|ours − theirs| ≤ ROUNDING·ε·max|theirs| per row (dim 0) over the `valid` entries (default: the finite ones,
    which must be finite in both: a −inf from a processor stays at the same place)."""
    finite = torch.isfinite(theirs)
    assert torch.equal(finite, torch.isfinite(ours)), "different -inf / nan entries"
    valid = finite if valid is None else valid & finite
    magnitude = theirs.masked_fill(~valid, 0).abs().flatten(1).amax(dim=1)
    error = (ours - theirs).masked_fill(~valid, 0).abs().flatten(1).amax(dim=1)
    assert (error <= ROUNDING * EPS * magnitude).all(), (error / (EPS * magnitude)).max()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param, make_family(request.param)


def test_tokens_bit_identical_scores_logits_and_cache_within_rounding(family):
    name, target = family
    ids, mask = ragged_prompts(3, seed=3, min_len=4, max_len=14)
    kwargs = dict(eos_token_id=None, pad_token_id=0, max_new_tokens=16, do_sample=False, return_dict_in_generate=True,
                  output_scores=True, output_logits=True, bad_words_ids=[[1, 0]], repetition_penalty=1.2)
    plain = target.generate(ids, attention_mask=mask, **kwargs)
    drafter = holed_oracle(target, 4, plain.sequences, mask)  # every draft accepted in even rows, none in odd ones
    output = target.generate(ids, attention_mask=mask, assistant_model=drafter, dspark_policy="fixed", **kwargs)
    assert drafter.last_generation_stats.mean_accepted_length > 1.5, name  # multi-token verified positions
    assert torch.equal(output.sequences, plain.sequences)
    for ours, theirs in zip(output.scores + output.logits, plain.scores + plain.logits):
        assert_within_rounding(ours, theirs)
    # the returned cache: plain's layer types and shapes; keys and values within rounding wherever attention reads
    # them. A left-pad slot is never read; an eager target (Gemma 2) may hold other values there than plain's.
    attended = torch.nn.functional.pad(mask, (0, plain.sequences.shape[1] - 1 - mask.shape[1]), value=1).bool()
    assert len(output.cache.layers) == len(plain.cache.layers)
    for ours, theirs in zip(output.cache.layers, plain.cache.layers):
        assert type(ours) is type(theirs) and ours.keys.shape == theirs.keys.shape
        valid = attended[:, -theirs.keys.shape[2] :][:, None, :, None].expand_as(theirs.keys)
        assert_within_rounding(ours.keys, theirs.keys, valid)
        assert_within_rounding(ours.values, theirs.values, valid)


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma3"])
def test_transformers_own_assisted_loop_rounds_alike(name):
    """The same bound holds for transformers' own assisted loop (the target drafting for itself, batch 1, two
    drafts per round as its tests set it): its scores are not bit-identical to plain's either."""
    target = make_family(name)  # a fresh instance: DSpark is not enabled on it
    assistant = copy.deepcopy(target)
    assistant.generation_config.num_assistant_tokens = 2
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    ids, mask = ragged_prompts(1, seed=1, min_len=4, max_len=14)
    kwargs = dict(eos_token_id=None, max_new_tokens=16, do_sample=False, return_dict_in_generate=True,
                  output_scores=True, output_logits=True)
    plain = target.generate(ids, attention_mask=mask, **kwargs)
    assisted = target.generate(ids, attention_mask=mask, assistant_model=assistant, **kwargs)
    assert torch.equal(assisted.sequences, plain.sequences)
    for ours, theirs in zip(assisted.scores + assisted.logits, plain.scores + plain.logits):
        assert_within_rounding(ours, theirs)
