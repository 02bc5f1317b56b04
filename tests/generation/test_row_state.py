"""`RowState` keeps only the scores and logits it returns: each committed position's `[V]`, not the round's
whole `[A, T, V]` tensor it was sliced from."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.stopping_criteria import MaxLengthCriteria, StoppingCriteria, StoppingCriteriaList

from hf_dspark.generation.state import RowState


class _NeverStop(StoppingCriteria):
    """A criterion the host rules do not know: commits take the per-token path."""

    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _retained_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (what keeping them keeps alive)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@pytest.mark.parametrize("host_rules", [True, False], ids=["host-rules", "per-token"])
def test_kept_scores_and_logits_hold_only_the_committed_positions(host_rules):
    rows, steps, vocab = 3, 5, 96
    config = GenerationConfig(max_length=64, return_dict_in_generate=True, output_scores=True, output_logits=True)
    criteria = [MaxLengthCriteria(64)] + ([] if host_rules else [_NeverStop()])
    state = RowState(torch.ones(rows, 4, dtype=torch.long), StoppingCriteriaList(criteria), config)
    assert (state.host_rules is not None) is host_rules
    scores, logits = torch.randn(rows, steps, vocab), torch.randn(rows, steps, vocab)  # one round's [A, T, V]
    committed = [1, 3, 2]
    for row, count in enumerate(committed):
        tokens = list(range(3, 3 + count))
        assert state.commit(row, tokens, scores[row, :count], logits[row, :count]) == count
    for kept, source in ((state.scores, scores), (state.logits, logits)):
        flat = [t for per_row in kept for t in per_row]
        assert sum(t.numel() for t in flat) == sum(committed) * vocab
        assert _retained_bytes(flat) == sum(committed) * vocab * source.element_size()
        for row, count in enumerate(committed):
            assert torch.equal(torch.stack(kept[row]), source[row, :count])


@pytest.mark.parametrize("host_rules", [True, False], ids=["host-rules", "per-token"])
def test_histories_grow_past_the_reserved_width_and_earlier_views_keep_their_tokens(host_rules):
    """Commits past the buffer's reserved width grow it; a history read before keeps its tokens; `sequences` pads
    shorter rows with the pad token, as plain generate does."""
    prompt = torch.tensor([[0, 5, 6], [7, 8, 9]], dtype=torch.int32)
    config = GenerationConfig(max_length=1000, pad_token_id=0)
    config._pad_token_tensor = torch.tensor(0)
    criteria = [MaxLengthCriteria(1000)] + ([] if host_rules else [_NeverStop()])
    state = RowState(prompt, StoppingCriteriaList(criteria), config)
    scores = torch.zeros(2, 40, 4)
    early = state.history(0)
    expected = [prompt[0].tolist(), prompt[1].tolist()]
    for step in range(5):
        tokens = [list(range(10 + step, 50 + step)), list(range(3, 3 + step))]
        assert state.commit_rows([0, 1], tokens, scores, scores) == [len(t) for t in tokens]
        for row, row_tokens in enumerate(tokens):
            expected[row] += row_tokens
        assert state.lengths == [len(e) for e in expected]
    assert state.history(0).tolist() == expected[0] and state.history(1).tolist() == expected[1]
    assert early.tolist() == prompt[0].tolist()
    sequences = state.sequences()
    assert sequences.dtype == torch.long
    assert sequences.tolist() == [expected[0], expected[1] + [0] * (len(expected[0]) - len(expected[1]))]
