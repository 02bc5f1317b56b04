"""`greedy_token_ids`: the same index as `argmax` on both sides of its kernel switch (ties, -inf, NaN)."""

import pytest
import torch

from hf_dspark.ops.functional import ARGMAX_MAX_ELEMENTS, greedy_token_ids


@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 97), (4, 3, ARGMAX_MAX_ELEMENTS + 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_token_ids_is_argmax(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    for trial in range(6):
        scores = torch.randint(0, 3, shape, generator=gen).to(dtype)  # many ties: the first maximum must win
        if trial % 2:
            scores[scores == 0] = float("-inf")
        if trial % 3 == 2:
            scores[torch.rand(shape, generator=gen) < 0.05] = float("nan")
        picked = greedy_token_ids(scores)
        assert picked.dtype == torch.long and picked.shape == shape[:-1]
        assert torch.equal(picked, scores.argmax(dim=-1))
        view = scores[..., 1:]  # a non-contiguous view
        assert torch.equal(greedy_token_ids(view), view.argmax(dim=-1))
    assert torch.equal(greedy_token_ids(torch.full((2, 9000), float("-inf"))), torch.zeros(2, dtype=torch.long))
