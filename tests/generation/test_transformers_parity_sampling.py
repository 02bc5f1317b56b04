"""transformers' speculative-sampling and prompt-lookup unit tests (`tests/generation/test_utils.py`:
`UtilsFunctionsTest.test_speculative_sampling`, `test_speculative_sampling_target_distribution`,
`GenerationTesterMixin.test_prompt_lookup_decoding_stops_at_eos`), ported to DSpark's verification
(`hf_dspark.ops.verification.verify_sampling`) and prompt lookup."""

import collections

import torch

from hf_dspark.generation import prompt_lookup_for
from hf_dspark.ops.verification import verify_sampling
from tests.helpers import make_target, ragged_prompts

INF = float("inf")
# upstream's case: vocabulary 10, drafts 1, 4, 5 (each drafted with probability ~1)
DRAFT_IDS = torch.tensor([[1, 4, 5]])
DRAFT_LOGITS = torch.full((1, 3, 10), -10.0)
DRAFT_LOGITS[0, 0, 1] = DRAFT_LOGITS[0, 1, 4] = DRAFT_LOGITS[0, 2, 5] = 10.0


def _verify(target_logits: torch.Tensor, rows: int = 1, seed: int = 0):
    """`verify_sampling` of upstream's drafts against `target_logits` `[γ + 1, V]`, `rows` independent rows."""
    target_probs = torch.softmax(target_logits, dim=-1).expand(rows, -1, -1)
    draft_probs = torch.softmax(DRAFT_LOGITS, dim=-1).expand(rows, -1, -1)
    generator = torch.Generator().manual_seed(seed)
    return verify_sampling(DRAFT_IDS.expand(rows, -1), draft_probs, target_probs, torch.full((rows,), 3), generator)


def test_speculative_sampling():
    """Port of `test_speculative_sampling`: drafts 1 and 4 accepted, 5 rejected and replaced by 8."""
    target_logits = torch.full((4, 10), -10.0)
    target_logits[0, 1] = target_logits[1, 4] = 10.0  # accepts 1, accepts 4
    target_logits[2] = -INF
    target_logits[2, 8] = 10.0  # rejects 5, draws 8
    result = _verify(target_logits)
    assert result.num_accepted.tolist() == [2]
    assert result.next_token.tolist() == [8]


def test_speculative_sampling_target_distribution():
    """Port of `test_speculative_sampling_target_distribution` (10,000 draws, as rows of one batch): after a
    rejection the token follows the target distribution (upstream's #32867)."""
    target_logits = torch.full((4, 10), -INF)
    target_logits[0, 1] = target_logits[1, 4] = 10.0
    # most likely 1 or 8, less likely 3, then 7, never any other value
    target_logits[2, 1], target_logits[2, 3], target_logits[2, 7], target_logits[2, 8] = 2.0, 1.0, -0.01, 2.0
    result = _verify(target_logits, rows=10_000)
    assert (result.num_accepted == 2).all()
    counts = collections.Counter(result.next_token.tolist())
    assert set(counts) <= {1, 3, 7, 8}
    assert counts[1] > counts[3] > counts[7] > 0
    assert counts[8] > counts[3]


def test_prompt_lookup_decoding_stops_at_eos():
    """Port of `test_prompt_lookup_decoding_stops_at_eos`. Upstream checks that its lookup proposes nothing after
    an EOS match, so that an accepted EOS cannot be followed by accepted tokens. DSpark's lookup may propose across
    an EOS; the loop ends the row at the EOS (docs/generation.md, "Stopping"), so this checks that end to end:
    the prompt is a prefix of the target's own looping greedy text, with the EOS inside the loop, so lookups
    propose the EOS followed by tokens the target accepts, and the output still stops where plain `generate`
    stops."""
    target = make_target("llama", seed=1)
    ids, mask = ragged_prompts(1, seed=1, min_len=4, max_len=14)
    text = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=None)
    prompt, continuation = text[:, :-12], text[0, -12:].tolist()
    # the EOS: the first later token of the continuation that the prompt holds (so lookups can propose it)
    stop = next(k for k in range(2, 12) if continuation[k] in prompt[0].tolist() and continuation[k] not in
                continuation[:k])
    kwargs = dict(do_sample=False, max_new_tokens=12, eos_token_id=continuation[stop], pad_token_id=0)
    plain = target.generate(prompt, **kwargs)
    assert plain.shape[1] == prompt.shape[1] + stop + 1  # plain stops at the EOS
    lookup = prompt_lookup_for(target, 4)
    assert torch.equal(target.generate(prompt, assistant_model=lookup, **kwargs), plain)
    assert lookup.last_generation_stats.mean_accepted_length >= 2.0  # the lookups were accepted
