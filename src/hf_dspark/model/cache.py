"""The drafter's per-row KV cache of context features (Eq. 3's W_K H_ctx, W_V H_ctx).

Rows hold different numbers of committed tokens. Entries are stored right-padded: row r's valid entries are
slots 0..lengths[r]-1, and slot i holds the committed token at position i (positions count from the row's
first non-padding token, as HF generate's position ids do). Appends write each row's new entries after its
own end, so rows never need to be cropped together. `host_lengths` mirrors `lengths` on the host, so growing
the buffers never reads the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


def _host_rows(rows: torch.Tensor | Sequence[int]) -> list[int]:
    """Row indices as host ints (free for a host tensor or a list; one read for a device tensor)."""
    return rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)


@dataclass
class DSparkDraftCache:
    """Context K/V per drafter layer, `[R, kv_heads, capacity, head_dim]`, with per-row `lengths` `[R]` and their
    host mirror `host_lengths` (None: not kept; then `reserve` reads the device)."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    lengths: torch.Tensor | None = None
    host_lengths: list[int] | None = None

    @classmethod
    def empty(
        cls, num_layers: int, batch_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device, capacity=64
    ) -> DSparkDraftCache:
        shape = (batch_size, kv_heads, capacity, head_dim)
        return cls(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            lengths=torch.zeros(batch_size, dtype=torch.long, device=device),
            host_lengths=[0] * batch_size,
        )

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def longest(self) -> int:
        """The longest row's context length (from the host mirror when kept)."""
        if self.host_lengths is not None:
            return max(self.host_lengths, default=0)
        return int(self.lengths.max().item()) if self.batch_size else 0

    def key_mask(self) -> torch.Tensor:
        """bool `[R, capacity]`: which slots hold committed context."""
        return torch.arange(self.capacity, device=self.lengths.device)[None, :] < self.lengths[:, None]

    def positions_for(self, count: int) -> torch.Tensor:
        """Positions `[R, count]` of `count` tokens appended after each row's context."""
        return self.lengths[:, None] + torch.arange(count, device=self.lengths.device)[None, :]

    def reserve(self, extra: int) -> None:
        """Grow capacity (doubling) so every row can take `extra` more entries."""
        needed = self.longest + extra
        if needed <= self.capacity:
            return
        new_cap = max(needed, 2 * self.capacity)
        for store in (self.keys, self.values):
            for i, tensor in enumerate(store):
                grown = tensor.new_zeros(*tensor.shape[:2], new_cap, tensor.shape[3])
                grown[:, :, : tensor.shape[2]] = tensor
                store[i] = grown

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write `[R, kvh, n, hd]` entries at slots lengths[r] .. lengths[r]+n-1 (call `advance` after all layers).

        Entries beyond a row's own count land past its new length and stay masked until overwritten.
        """
        n = keys.shape[2]
        index = self.positions_for(n)[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        self.keys[layer].scatter_(2, index, keys.to(self.keys[layer].dtype))
        self.values[layer].scatter_(2, index, values.to(self.values[layer].dtype))

    def advance(self, counts: torch.Tensor, host_counts: Sequence[int] | None = None) -> None:
        """Lengths += counts `[R]` (on the device); `host_counts`, the same as host ints, keeps the mirror (None:
        the mirror is dropped)."""
        self.lengths = self.lengths + counts.to(self.lengths)
        if host_counts is None or self.host_lengths is None:
            self.host_lengths = None
        else:
            self.host_lengths = [have + int(n) for have, n in zip(self.host_lengths, host_counts)]

    def select_rows(self, rows: torch.Tensor) -> DSparkDraftCache:
        """A cache holding only `rows` (LongTensor of row indices, best on the host: the mirror then costs no
        read), e.g. when requests leave a batch."""
        index = rows.to(self.lengths.device, non_blocking=True)
        mirror = None
        if self.host_lengths is not None:
            mirror = [self.host_lengths[i] for i in _host_rows(rows)]
        return DSparkDraftCache(
            keys=[k.index_select(0, index) for k in self.keys],
            values=[v.index_select(0, index) for v in self.values],
            lengths=self.lengths.index_select(0, index),
            host_lengths=mirror,
        )

    @staticmethod
    def concat(caches: list[DSparkDraftCache]) -> DSparkDraftCache:
        """Stack the rows of several caches (e.g. a request joining a running batch)."""
        caches = [c for c in caches if c.batch_size > 0]
        cap = max(c.capacity for c in caches)
        for c in caches:
            c.reserve(cap - c.longest)

        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, 0, 0, cap - t.shape[2]))

        return DSparkDraftCache(
            keys=[torch.cat([pad(c.keys[i]) for c in caches]) for i in range(len(caches[0].keys))],
            values=[torch.cat([pad(c.values[i]) for c in caches]) for i in range(len(caches[0].values))],
            lengths=torch.cat([c.lengths for c in caches]),
            host_lengths=None
            if any(c.host_lengths is None for c in caches)
            else [n for c in caches for n in c.host_lengths],
        )
