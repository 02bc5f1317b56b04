"""The target's KV cache under ragged per-row verification ("holes" layout).

Every row appends the same number of slots per forward (1 + max ℓ_r); slots a row did not use, or whose drafts
were rejected, stay in the cache as holes that a 2D attention mask hides, and explicit `position_ids` keep each
row's positions contiguous. When holes grow past a fraction of the cache width, `compact` gathers each row's
valid entries into a fresh left-padded cache (about one concatenation's cost). Rows that finish are dropped.
Measured in TRANSFORMERS_NOTES.md: logits within ~6e-5 of an unbatched reference in fp32 (sdpa and eager).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


@dataclass
class VerifyOutput:
    logits: torch.Tensor  # [A, T, V] float32
    features: torch.Tensor | None  # [A, T, n_taps·d] concatenated tapped layer outputs (None without taps)


class RaggedTargetCache:
    """Target KV cache plus a `[A, W]` validity mask and each row's next position."""

    def __init__(self, cache: DynamicCache, valid: torch.Tensor, next_position: torch.Tensor,
                 compact_fraction: float = 0.25, compact_min_holes: int = 16) -> None:
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise ValueError(
                    f"DSpark's ragged verification needs full-attention dynamic cache layers; this target uses "
                    f"{type(layer).__name__} (sliding window / linear attention), which is not supported yet."
                )
        self.cache = cache
        self.valid = valid.bool()
        self.next_position = next_position.long()
        self.compact_fraction = compact_fraction
        self.compact_min_holes = compact_min_holes
        self.compactions = 0
        self.max_width = self.width

    @property
    def width(self) -> int:
        return int(self.valid.shape[1])

    def forward(self, model, input_ids: torch.Tensor, input_valid: torch.Tensor, tap_indices: list[int],
                extra_kwargs: dict | None = None) -> VerifyOutput:
        """One target forward over `[A, T]` new tokens; returns fp32 logits and tapped features for all T."""
        steps = input_ids.shape[1]
        positions = self.next_position[:, None] + torch.arange(steps, device=input_ids.device)[None, :]
        mask = torch.cat([self.valid, input_valid.bool()], dim=1).long()
        out = model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True,
            output_hidden_states=list(tap_indices) or None, logits_to_keep=0, **(extra_kwargs or {}),
        )
        self.cache = out.cache
        # Until `commit`, the new slots count as holes.
        self.valid = torch.cat([self.valid, torch.zeros_like(input_valid, dtype=torch.bool)], dim=1)
        self.max_width = max(self.max_width, self.width)
        features = torch.cat([out.hidden_states[i] for i in tap_indices], dim=-1) if tap_indices else None
        return VerifyOutput(out.logits.float(), features)

    def commit_last(self, steps: int, kept: torch.Tensor) -> None:
        """The last forward appended `steps` slots; row a keeps the first kept[a] of them."""
        new = torch.arange(steps, device=kept.device)[None, :] < kept[:, None]
        self.valid[:, -steps:] = new
        self.next_position = self.next_position + kept
        self.maybe_compact()

    def maybe_compact(self) -> None:
        counts = self.valid.sum(dim=1)
        holes = self.width - int(counts.max())
        if holes >= self.compact_min_holes and holes >= self.compact_fraction * self.width:
            self.compact()

    def compact(self) -> None:
        """Gather each row's valid entries into a left-padded cache of width max_a(valid count)."""
        counts = self.valid.sum(dim=1)
        new_width = int(counts.max())
        # Stable order: invalid slots first, valid slots last, keeping the valid ones in their order.
        order = torch.argsort(self.valid.to(torch.int8), dim=1, stable=True)[:, -new_width:]
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.valid = self.valid.gather(1, order)
        self.compactions += 1

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current active set)."""
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
        self.valid = self.valid.index_select(0, rows)
        self.next_position = self.next_position.index_select(0, rows)
        self.maybe_compact()

    def add_rows(self, other: RaggedTargetCache) -> None:
        """Append the rows of another cache (e.g. newly admitted requests), left-padding both to one width."""
        width = max(self.width, other.width)

        def pad(tensor: torch.Tensor, have: int) -> torch.Tensor:
            return torch.nn.functional.pad(tensor, (0, 0, width - have, 0)) if have < width else tensor

        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([pad(mine.keys, self.width), pad(theirs.keys, other.width)])
            mine.values = torch.cat([pad(mine.values, self.width), pad(theirs.values, other.width)])
        left = torch.nn.functional.pad(self.valid, (width - self.width, 0))
        right = torch.nn.functional.pad(other.valid, (width - other.width, 0))
        self.valid = torch.cat([left, right])
        self.next_position = torch.cat([self.next_position, other.next_position])
