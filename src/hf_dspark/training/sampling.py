"""Training samplers whose order is a function of (seed, epoch) alone, so a resumed run sees the batches an
uninterrupted one would.

transformers' `LengthGroupedSampler` draws its permutation from the global torch generator at the moment the epoch's
iterator is built; a resumed run builds it before the checkpoint's RNG state is restored, so it walks another order
and ends with other weights. `EpochSeededLengthGroupedSampler` draws from its own generator seeded with
`seed + epoch`; the Trainer's data loader calls `set_epoch` before each epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """Length-grouped order (megabatches sorted by length, longest first) drawn from `seed + epoch`.

    Args:
        batch_size (`int`): the number of examples per optimizer step (batch size × gradient accumulation).
        lengths (`Sequence[int]`): each example's length in tokens.
        seed (`int`): the base seed; epoch `e` uses `seed + e`.
    """

    def __init__(self, batch_size: int, lengths: Sequence[int], seed: int) -> None:
        super().__init__(batch_size, lengths=list(lengths))
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))
