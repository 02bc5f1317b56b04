"""Drafter layers: grouped-query attention without repeated keys and values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_dspark.model.layers import grouped_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 3])
def test_grouped_attention_equals_attention_over_repeated_heads(dtype, groups):
    gen = torch.Generator().manual_seed(groups)
    queries = torch.randn(4, 6, 7, 16, generator=gen).to(dtype)
    keys = torch.randn(4, 6 // groups, 30, 16, generator=gen).to(dtype)
    values = torch.randn(4, 6 // groups, 30, 16, generator=gen).to(dtype)
    mask = torch.rand(4, 7, 30, generator=gen) > 0.4
    mask[..., -1] = True
    expected = F.scaled_dot_product_attention(queries, keys.repeat_interleave(groups, dim=1),
                                              values.repeat_interleave(groups, dim=1), attn_mask=mask[:, None])
    assert torch.equal(grouped_attention(queries, keys, values, mask), expected)
