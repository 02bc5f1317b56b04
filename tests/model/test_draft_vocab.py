"""The draft vocabulary: the mapping helpers, and that drafting over a subset stays lossless."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from hf_dspark.eval.lossless import chi_square_pvalue
from hf_dspark.model.draft_vocab import (
    coverage,
    d2t_from_token_ids,
    scatter_to_target_vocab,
    select_draft_vocab,
    t2d_from_token_ids,
    target_to_draft_index,
    token_ids_from_d2t,
)
from tests.generation.test_sampling_lossless import SETTINGS, VOCAB, _exact_joint, _sample_codes
from tests.helpers import make_drafter, make_target, ragged_prompts


def test_mapping_round_trips():
    ids = torch.tensor([0, 3, 4, 9, 15])
    d2t = d2t_from_token_ids(ids)
    assert d2t.tolist() == [0, 2, 2, 6, 11]  # target = draft + d2t[draft]
    assert torch.equal(token_ids_from_d2t(d2t), ids)
    t2d = t2d_from_token_ids(ids, 16)
    assert t2d.sum() == 5 and t2d[ids].all()
    index = target_to_draft_index(t2d)
    assert index[ids].tolist() == [0, 1, 2, 3, 4] and index[1].item() == -1


def test_selection_forces_end_of_turn_and_ranks_by_frequency():
    counts = Counter({5: 10, 7: 9, 2: 9, 11: 1})
    ids = select_draft_vocab(counts, 3, 16, always_include=[15])
    assert ids.tolist() == [2, 5, 15]  # 15 forced in; then 5 (10), then 2 before 7 (tie broken by id)
    assert coverage(counts, ids) == pytest.approx(19 / 29)
    with pytest.raises(ValueError, match=r"1\.\.16"):
        select_draft_vocab(counts, 17, 16)


def test_scatter_puts_minus_infinity_outside_the_subset():
    full = scatter_to_target_vocab(torch.tensor([[1.0, 2.0]]), torch.tensor([1, 3]), 5)
    assert full[0, 1] == 1.0 and full[0, 3] == 2.0 and torch.isinf(full[0, [0, 2, 4]]).all()


def test_restricted_drafter_only_drafts_inside_its_vocabulary():
    target = make_target("llama", seed=3)
    drafter = make_drafter(target).restrict_draft_vocab(list(range(10, 60)))
    ids, mask = ragged_prompts(3, seed=2)
    out = target.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=12, assistant_model=drafter)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    greedy = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, assistant_model=drafter)
    assert torch.equal(plain, greedy) and out.shape[0] == 3
    stats = drafter.last_generation_stats
    assert stats.rounds > 0


def test_sampling_with_a_draft_vocabulary_matches_the_target_distribution():
    """V = 8, drafts only over {1, 2, 4, 6}: tokens 0, 3, 5, 7 come only from the residual; still exact."""
    target = make_target("llama", seed=4, vocab_size=VOCAB, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)
    drafter = make_drafter(target, seed=5, block_size=3, markov_rank=4).restrict_draft_vocab([1, 2, 4, 6])
    prompt = torch.tensor([[3, 5, 1, 6, 2]])
    joint = _exact_joint(target, prompt, SETTINGS["top_p"])
    codes = _sample_codes(target, drafter, prompt, SETTINGS["top_p"], seed=3)
    stats = drafter.last_generation_stats
    assert 0.05 < stats.acceptance_rate < 0.95, "the test needs both accepted and rejected drafts"
    assert chi_square_pvalue(codes, joint) > 1e-4


def test_warpers_run_over_the_draft_vocabulary_with_the_same_distribution():
    """History-free warpers (temperature, top-k, top-p) are applied to draft-vocabulary logits; the distribution
    equals the one computed over the target vocabulary with −inf outside the subset, zero outside it."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from hf_dspark.generation.drafting import draft_logits_processor
    from hf_dspark.generation.processors import RowProcessors

    target = make_target("llama", seed=3)
    subset = list(range(10, 60))
    drafter = make_drafter(target, seed=2).restrict_draft_vocab(subset)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.9)])
    processing = draft_logits_processor(RowProcessors(warpers, 2), [0, 1], [torch.tensor([1, 2])] * 2)
    assert processing.reads_token_ids is False

    def on_target_vocab(k, drafts_so_far, logits):  # the same warpers, declared as reading token ids
        return processing(k, drafts_so_far, logits)

    cache = drafter.init_cache(2)
    anchors = torch.tensor([11, 12])
    fast = drafter.propose(anchors, cache, do_sample=True, logits_processor=processing)
    full = drafter.propose(anchors, cache, do_sample=True, logits_processor=on_target_vocab)
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool)
    outside[subset] = False
    assert fast.draft_probs[..., outside].abs().max() == 0
    torch.testing.assert_close(fast.draft_probs.sum(-1), torch.ones(2, drafter.config.block_size))
    assert torch.isin(fast.draft_ids, torch.tensor(subset)).all()
    picked = fast.draft_probs.gather(-1, fast.draft_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(picked, fast.draft_token_probs.to(picked.dtype))
    torch.testing.assert_close(fast.draft_probs[:, 0], full.draft_probs[:, 0])  # position 1 has no sampled prefix
