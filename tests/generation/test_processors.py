"""Row-wise logits processing: the cheaper stand-ins give transformers' values exactly."""

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from hf_dspark.generation.processors import EosFloor, RowProcessors, cheaper_equivalent


class _SubclassedMinLength(MinLengthLogitsProcessor):
    pass


def _processors(eos):
    return [
        MinLengthLogitsProcessor(min_length=9, eos_token_id=eos),
        MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=5, min_new_tokens=3, eos_token_id=eos),
    ]


@pytest.mark.parametrize("eos", [2, [2, 7], [7, 2, 7], [3, 40, -1]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eos_floor_matches_transformers_bit_for_bit(eos, dtype):
    generator = torch.Generator().manual_seed(0)
    for processor in _processors(eos):
        fast = cheaper_equivalent(processor)
        assert isinstance(fast, EosFloor)
        for length in range(4, 12):  # below, at and past both floors
            ids = torch.randint(0, 32, (2, length), generator=generator)
            scores = torch.randn(2, 32, generator=generator).to(dtype)
            expected = processor(ids, scores)
            got = fast(ids, scores)
            assert got.dtype == expected.dtype and torch.equal(got, expected), (type(processor).__name__, length)
            assert got.data_ptr() != scores.data_ptr()  # a new tensor, like transformers'


def test_only_the_exact_transformers_classes_are_replaced():
    subclassed = _SubclassedMinLength(min_length=3, eos_token_id=2)
    penalty = RepetitionPenaltyLogitsProcessor(1.3)
    assert cheaper_equivalent(subclassed) is subclassed
    assert cheaper_equivalent(penalty) is penalty


def test_row_processors_use_the_stand_in_and_keep_per_row_results():
    processors = LogitsProcessorList([*_processors([2]), RepetitionPenaltyLogitsProcessor(1.5)])
    rows = RowProcessors(processors, batch_size=2)
    assert all(isinstance(p, EosFloor) for row in rows.per_row for p in row[:2])
    generator = torch.Generator().manual_seed(1)
    prefixes = [torch.randint(0, 32, (n,), generator=generator) for n in (6, 10)]
    scores = torch.randn(2, 32, generator=generator)
    got = rows.apply([0, 1], prefixes, scores)
    for i, prefix in enumerate(prefixes):
        assert torch.equal(got[i : i + 1], processors(prefix[None, :], scores[i : i + 1]))
    assert torch.isinf(got[0, 2]) and not torch.isinf(got[1, 2])  # row 0 is below the floors, row 1 past them
