"""Tests for anchor sampling, block labels and batch packing."""

from __future__ import annotations

import pytest
import torch

from hf_dspark.ops.losses import IGNORE_INDEX
from hf_dspark.training.collator import DSparkCollator, anchor_candidates, block_labels, sample_anchors

X = IGNORE_INDEX


def test_anchor_candidates_precede_loss_tokens():
    mask = torch.tensor([0, 0, 1, 1, 0, 1])
    assert anchor_candidates(mask).tolist() == [1, 2, 4]


def test_sample_anchors_without_replacement_and_sorted():
    mask = torch.tensor([0] + [1] * 20)
    anchors = sample_anchors(mask, 5, torch.Generator().manual_seed(0))
    assert anchors.numel() == 5 and len(set(anchors.tolist())) == 5
    assert anchors.tolist() == sorted(anchors.tolist())
    assert sample_anchors(torch.tensor([0, 1, 1]), 5).tolist() == [0, 1]


def test_block_labels_hand_computed():
    ids = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    mask = torch.tensor([0, 0, 1, 1, 0, 1, 1])  # loss region: 12, 13 | 15, 16 (a user turn at 14)
    labels = block_labels(ids, mask, torch.tensor([1, 2, 4, 5]), gamma=3)
    assert labels.tolist() == [
        [12, 13, X],  # leaves the loss region at position 4
        [13, X, X],  # prefix-closed: 15 after the gap is not labelled
        [15, 16, X],  # past the end of the text
        [16, X, X],
    ]


def test_collator_packs_and_pads():
    examples = [
        {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 1], "sample_index": 3},
        {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "sample_index": 7},
    ]
    batch = DSparkCollator(block_size=2, anchors_per_sequence=4, pad_token_id=0)(examples)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # the block axis is padded to the most anchors in the batch (3), not to anchors_per_sequence (4)
    assert batch["anchor_positions"].tolist() == [[1, 2, 3], [0, 1, -1]]
    assert batch["labels"].tolist() == [
        [[7, 8], [8, 9], [9, X]],
        [[2, 3], [3, X], [X, X]],
    ]
    assert batch["target_positions"][0, 1].tolist() == [2, 3]  # a + k: the hidden state predicting label k
    assert batch["sample_index"].tolist() == [3, 7]


def test_labels_are_the_targets_own_greedy_tokens(tiny_target):
    """The target's logits at target_positions predict exactly the labels on target-generated text."""
    from hf_dspark.training.features import compute_target_features, target_logits_at

    prompt = torch.tensor([[3, 9, 27, 81]])
    with torch.no_grad():
        seq = tiny_target.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    example = {"input_ids": seq, "loss_mask": [0] * 4 + [1] * 12}
    batch = DSparkCollator(block_size=3, anchors_per_sequence=6)([example])
    feats = compute_target_features(tiny_target, batch["input_ids"], batch["attention_mask"], [0, 1])
    logits = target_logits_at(feats.final_hidden, batch["target_positions"], tiny_target.lm_head)
    valid = batch["labels"] != X
    assert valid.sum() > 0
    assert torch.equal(logits.argmax(-1)[valid], batch["labels"][valid])


def test_collator_validation():
    with pytest.raises(ValueError, match="anchors_per_sequence"):
        DSparkCollator(block_size=2, anchors_per_sequence=0)
    with pytest.raises(ValueError, match="differ in length"):
        DSparkCollator(block_size=2)([{"input_ids": [1, 2], "loss_mask": [1]}])


def test_seeded_anchors_depend_only_on_seed_epoch_and_sample():
    examples = [{"input_ids": list(range(40)), "loss_mask": [0] * 5 + [1] * 35, "sample_index": i} for i in range(3)]
    collator = DSparkCollator(block_size=2, anchors_per_sequence=4, seed=11)
    together = collator(examples)["anchor_positions"]
    alone = collator(examples[2:])["anchor_positions"]
    assert torch.equal(together[2], alone[0])  # independent of the batch it lands in
    assert not torch.equal(together[0], together[1])
    collator.epoch = 1
    assert not torch.equal(collator(examples)["anchor_positions"], together)
