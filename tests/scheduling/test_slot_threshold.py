"""`"slot_threshold"` (DeepSpec's rule: each slot's own confidence) against `"threshold"` (the running product)."""

from __future__ import annotations

import pytest
import torch

from hf_dspark.scheduling import SlotThresholdPolicy, ThresholdPolicy, available_policies, get_policy
from hf_dspark.scheduling.slot_threshold import schedule_slot_threshold, slot_confidences
from hf_dspark.scheduling.threshold import schedule_threshold
from tests.helpers import make_drafter, make_target, ragged_prompts

# own confidences c_{r,j}; the policies see their running products a_{r,j} (the prefix survivals)
CONFIDENCES = torch.tensor(
    [
        [0.95, 0.95, 0.95, 0.95],  # every product stays above 0.5
        [0.60, 0.60, 0.60, 0.60],  # each slot above 0.5, the product below it from slot 2 on
        [0.70, 0.60, 0.90, 0.55],
        [0.60, 0.60, 0.40, 0.90],  # slot 3 falls below 0.5 on its own
    ]
)
SURVIVAL = CONFIDENCES.cumprod(dim=-1)


def test_the_same_threshold_gives_4_4_4_2_per_slot_and_4_1_1_1_on_the_product():
    assert schedule_slot_threshold(SURVIVAL, threshold=0.5).tolist() == [4, 4, 4, 2]
    assert schedule_threshold(SURVIVAL, threshold=0.5).tolist() == [4, 1, 1, 1]
    assert SlotThresholdPolicy.schedule(SURVIVAL, threshold=0.5).tolist() == [4, 4, 4, 2]


def test_slot_confidences_invert_the_running_product_and_treat_a_dead_prefix_as_zero():
    torch.testing.assert_close(slot_confidences(SURVIVAL), CONFIDENCES)
    dead = torch.tensor([[0.5, 0.0, 0.0]])
    assert slot_confidences(dead).tolist() == [[0.5, 0.0, 0.0]]
    assert schedule_slot_threshold(dead, threshold=0.1).tolist() == [1]


@pytest.mark.parametrize("threshold, expected", [(0.0, [4, 4, 4, 4]), (0.99, [0, 0, 0, 0]), (0.65, [4, 0, 1, 0])])
def test_threshold_edges(threshold, expected):
    assert schedule_slot_threshold(SURVIVAL, threshold=threshold).tolist() == expected


def test_it_is_registered_beside_the_product_rule_and_needs_confidences():
    assert "slot_threshold" in available_policies() and get_policy("slot_threshold") is SlotThresholdPolicy
    assert SlotThresholdPolicy.needs_confidence and ThresholdPolicy.needs_confidence


def test_greedy_generate_with_the_policy_is_plain_greedy():
    target = make_target("llama", seed=5, eos_token_id=None)
    drafter = make_drafter(target, block_size=4, seed=3, use_confidence_head=True)
    ids, mask = ragged_prompts(3, seed=4)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    output = target.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=16,
        assistant_model=drafter,
        dspark_policy="slot_threshold",
        dspark_threshold=0.3,
    )
    assert torch.equal(output, reference)
    assert drafter.last_generation_stats.verify_lens  # the policy ran
