"""Anchor sampling and batch packing for teacher-forced DSpark training (docs/method.md, section 6).

An anchor a is a position whose next token a+1 is in the loss region; its block's slot k (0-based) predicts token
a+k+1 and is labelled with it. Labels are prefix-closed: once a slot leaves the loss region (the reply ended, the
next user turn began, the text ended) every later slot of that block is `IGNORE_INDEX`, as verification would stop
there too. The drafter's forward builds the block attention mask itself from `anchor_positions` and
`context_mask` (each block sees its own sequence's real tokens before its anchor and its own γ slots).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..ops.losses import IGNORE_INDEX


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a with loss_mask[a+1] == 1. loss_mask: `[L]` -> long `[n]`."""
    return torch.nonzero(loss_mask[1:].bool(), as_tuple=False).flatten()


def sample_anchors(loss_mask: torch.Tensor, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to `count` distinct anchors drawn uniformly from `anchor_candidates`, sorted. Returns long `[≤ count]`."""
    candidates = anchor_candidates(loss_mask)
    if candidates.numel() <= count:
        return candidates
    chosen = torch.randperm(candidates.numel(), generator=generator)[:count]
    return candidates[chosen].sort().values


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, gamma: int) -> torch.Tensor:
    """Labels `[n, γ]`: token a+k+1, `IGNORE_INDEX` from the first slot outside the loss region or the text on.

    input_ids, loss_mask: `[L]`; anchors: long `[n]`.
    """
    length = input_ids.shape[0]
    positions = anchors[:, None] + torch.arange(1, gamma + 1)  # [n, γ] label positions a+k+1
    inside = positions < length
    clamped = positions.clamp_max(length - 1)
    valid = inside & loss_mask[clamped].bool()
    valid = torch.cummin(valid.to(torch.int8), dim=-1).values.bool()  # prefix-closed
    return torch.where(valid, input_ids[clamped], torch.full_like(clamped, IGNORE_INDEX))


@dataclass
class DSparkCollator:
    """Pads examples (right padding) and samples anchor blocks.

    Args:
        block_size: γ of the drafter being trained.
        anchors_per_sequence: N, the most blocks per sequence (drawn without replacement). Set it at or above the
            reply length for dense anchors (every position of the loss region anchors a block). The block axis is
            padded to the largest count in the batch (at most N); unused slots are −1.
        pad_token_id: id used to pad `input_ids` (never attended: `attention_mask` is 0 there).
        seed: when set, the anchors of an example are a pure function of (seed, `epoch`, its `sample_index`): the
            same on any number of processes or workers and after resuming from a checkpoint. `DSparkTrainer`
            sets it to `args.seed` and advances `epoch` at every epoch start. With `seed=None` the anchors come
            from `generator`, else from torch's global RNG.
        epoch: the current epoch (see `seed`).
        generator: optional torch generator used when `seed` is None or an example has no `sample_index`.

    Each example is a mapping with `input_ids` and `loss_mask` (sequences of ints) and optionally `sample_index`.
    Returns `input_ids` `[S, L]`, `attention_mask` `[S, L]` (long; the drafter's `context_mask`),
    `anchor_positions` `[S, n]` (n ≤ N; −1 unused), `labels` `[S, n, γ]`, `target_positions` `[S, n, γ]` (a+k: where
    the target's final hidden state predicts label k) and `sample_index` `[S]` when given.
    """

    block_size: int
    anchors_per_sequence: int = 16
    pad_token_id: int = 0
    seed: int | None = None
    epoch: int = 0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}.")
        if self.anchors_per_sequence < 1:
            raise ValueError(f"anchors_per_sequence must be >= 1, got {self.anchors_per_sequence}.")

    def example_generator(self, example: Mapping[str, Any]) -> torch.Generator | None:
        """The generator drawing this example's anchors (see `seed`)."""
        if self.seed is None or "sample_index" not in example:
            return self.generator
        key = ((self.seed * 1_000_003 + self.epoch) * 1_000_033 + int(example["sample_index"])) % (2**63 - 1)
        return torch.Generator().manual_seed(key)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("DSparkCollator got an empty batch.")
        gamma = self.block_size
        length = max(len(e["input_ids"]) for e in examples)
        # Dense anchors: pad the block axis to the most anchors any example of this batch has, not to N.
        most = max(int(anchor_candidates(torch.as_tensor(e["loss_mask"])).numel()) for e in examples)
        n_blocks = max(1, min(self.anchors_per_sequence, most))
        seqs = len(examples)
        input_ids = torch.full((seqs, length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(seqs, length, dtype=torch.long)
        anchor_positions = torch.full((seqs, n_blocks), -1, dtype=torch.long)
        labels = torch.full((seqs, n_blocks, gamma), IGNORE_INDEX, dtype=torch.long)
        for row, example in enumerate(examples):
            ids = torch.as_tensor(example["input_ids"], dtype=torch.long)
            mask = torch.as_tensor(example["loss_mask"], dtype=torch.long)
            if ids.shape != mask.shape:
                raise ValueError(f"example {row}: input_ids and loss_mask differ in length.")
            input_ids[row, : ids.numel()] = ids
            attention_mask[row, : ids.numel()] = 1
            anchors = sample_anchors(mask, n_blocks, self.example_generator(example))
            anchor_positions[row, : anchors.numel()] = anchors
            if anchors.numel():
                labels[row, : anchors.numel()] = block_labels(ids, mask, anchors, gamma)
        target_positions = anchor_positions.clamp_min(0)[..., None] + torch.arange(gamma)
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "anchor_positions": anchor_positions,
            "labels": labels,
            "target_positions": target_positions.clamp_max(length - 1),
        }
        if all("sample_index" in e for e in examples):
            batch["sample_index"] = torch.tensor([int(e["sample_index"]) for e in examples], dtype=torch.long)
        return batch
