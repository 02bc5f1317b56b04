"""The target's KV cache under ragged per-row verification ("holes" layout).

Every row appends the same number of slots per forward (1 + max ℓ_r); slots a row did not use, or whose drafts
were rejected, stay in the cache as holes that a 2D attention mask hides, and explicit `position_ids` keep each
row's positions contiguous. When holes grow past a fraction of the cache width, `compact` gathers each row's
valid entries into a fresh left-padded cache (about one concatenation's cost). Rows that finish are dropped.

Sliding-window and hybrid targets (Mistral, Gemma 2/3, ...): every layer keeps a full `DynamicLayer` and the
window is a mask. Each slot's position is tracked, and each verification forward gets 4D masks built from those
positions: key k is visible to query q when it is valid, pos_k ≤ pos_q and, on sliding layers, pos_q − pos_k <
window. Plain `generate`'s sliding layers drop the entries these masks hide; hidden entries weigh exactly zero.

Draft trees (`tree_forward`): a forward's new slots may be tree nodes, at positions next + depth, each seeing its
ancestors among them; `commit_path` moves the accepted path into chain order, so the layout above holds after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, get_layer_types_and_kwargs

from .attention import packed_gqa_attention
from .packed_linear import PackedLinears, packed_linears
from .tree_forward import TreeSlots, gather_new_slots, new_slot_visibility

MASKABLE_LAYERS = ("full_attention", "sliding_attention")
MASK_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class AttentionLayout:
    """The target's attention pattern: one entry per layer type present, `{type: window or None}`.

    windows: e.g. `{"full_attention": None}` (Llama) or `{"full_attention": None, "sliding_attention": 4096}`.
    implementation: `config._attn_implementation` ("sdpa", "eager", ...).
    """

    windows: dict[str, int | None]
    implementation: str

    @property
    def needs_masks(self) -> bool:
        """Whether verification needs position-based 4D masks (any sliding layer)."""
        return any(window is not None for window in self.windows.values())


def attention_layout(model) -> AttentionLayout:
    """Read the target's layer types the way transformers' `DynamicCache(config=...)` does; refuse the rest.

    Raises `ValueError` naming the reason for layer types DSpark cannot verify raggedly (linear attention /
    recurrent states, chunked attention, shared-KV layers) and for sliding targets under an attention
    implementation that takes no 4D mask.
    """
    config = model.config.get_text_config(decoder=True)
    layer_types, layer_kwargs = get_layer_types_and_kwargs(config)
    windows: dict[str, int | None] = {}
    for layer_type, kwargs in zip(layer_types, layer_kwargs):
        if layer_type == "chunked_attention":
            raise ValueError(
                "DSpark cannot verify drafts on this target: it has 'chunked_attention' layers, which its ragged "
                "verification masks do not implement (full and sliding-window attention only)."
            )
        if layer_type not in MASKABLE_LAYERS:
            raise ValueError(
                f"DSpark cannot verify drafts on this target: it has {layer_type!r} layers. Ragged verification "
                "keeps rejected drafts in the KV cache as masked holes, which needs layers whose cache is a list "
                "of per-token keys and values; recurrent, convolution and shared-KV states cannot hide rejected "
                "tokens."
            )
        window = kwargs.get("sliding_window")
        if windows.get(layer_type, window) != window:
            raise ValueError(
                f"DSpark cannot verify drafts on this target: its {layer_type!r} layers use different windows "
                f"({windows[layer_type]} and {window}), and transformers passes one mask per layer type."
            )
        windows[layer_type] = window
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    layout = AttentionLayout(windows, implementation)
    if layout.needs_masks and implementation not in MASK_IMPLEMENTATIONS:
        raise ValueError(
            f"DSpark verifies this sliding-window target with 4D attention masks, which attn_implementation="
            f"{implementation!r} does not take. Load the target with attn_implementation='sdpa' (or 'eager')."
        )
    return layout


def new_target_cache(model) -> DynamicCache:
    """An empty target cache for DSpark: full `DynamicLayer`s for every layer (sliding windows become masks)."""
    attention_layout(model)
    return DynamicCache()


def slot_positions(valid: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded (or compacted) slots: pos = #valid slots before it; `[A, W]` → `[A, W]`."""
    return (valid.long().cumsum(dim=1) - 1).clamp_min(0)


def on_devices(index: torch.Tensor) -> Callable[[torch.device], torch.Tensor]:
    """`index` on a given device, copied once per device (without blocking) and reused: for caches whose layers a
    `device_map` spreads over several devices."""
    copies: dict[torch.device, torch.Tensor] = {index.device: index}

    def on(device: torch.device) -> torch.Tensor:
        if device not in copies:
            copies[device] = index.to(device, non_blocking=True)
        return copies[device]

    return on


def verification_masks(layout: AttentionLayout, key_valid: torch.Tensor, key_positions: torch.Tensor,
                       query_positions: torch.Tensor, dtype: torch.dtype, tree: TreeSlots | None = None):
    """4D masks `[A, 1, T, K]` for one forward: a tensor, or `{layer type: tensor}` for hybrid targets.

    key_valid / key_positions: `[A, K]` (cached slots then the T new ones); query_positions: `[A, T]`. Each query
    also sees its own slot, so padded query slots (never read) are never fully masked. Bool for sdpa, additive
    (0 / dtype min) for eager, as transformers' own mask functions produce. tree: the new slots are tree nodes,
    each seeing only its ancestors among them (`tree_forward`).
    """
    steps = query_positions.shape[1]
    distance = query_positions[:, :, None] - key_positions[:, None, :]
    visible = key_valid[:, None, :] & (distance >= 0)
    if tree is not None:
        visible[:, :, -steps:] &= new_slot_visibility(steps, visible.device, tree)
    own_slot = torch.zeros_like(visible)
    own_slot[:, :, -steps:] = torch.eye(steps, dtype=torch.bool, device=visible.device)
    masks = {}
    for layer_type, window in layout.windows.items():
        allowed = visible & (distance < window) if window is not None else visible
        allowed = (allowed | own_slot)[:, None]
        if layout.implementation == "eager":
            allowed = torch.where(allowed, torch.zeros((), dtype=dtype, device=allowed.device),
                                  torch.finfo(dtype).min)
        masks[layer_type] = allowed
    return next(iter(masks.values())) if len(masks) == 1 else masks


@dataclass
class VerifyOutput:
    logits: torch.Tensor  # [A, T, V] float32
    features: torch.Tensor | None  # [A, T, n_taps·d] concatenated tapped layer outputs (None without taps)


class RaggedTargetCache:
    """Target KV cache plus a `[A, W]` validity mask, each slot's position and each row's next position.

    Args:
        cache: the target's cache after prefill; every layer a full `DynamicLayer` (see `new_target_cache`).
        valid: `[A, W]` which slots hold committed tokens.
        next_position: `[A]` position of each row's next token.
        layout: the target's `AttentionLayout`; with sliding layers, forwards pass position-based 4D masks.
        positions: `[A, W]` slot positions (default: `slot_positions(valid)`, right for left-padded prompts).
        host_counts: each row's valid slot count as host ints (default: read from `valid` once, here). The cache
            keeps this mirror up to date while callers pass host counts (`commit_last`, `select_rows`), so the
            compaction check reads nothing from the device.
    """

    def __init__(self, cache: DynamicCache, valid: torch.Tensor, next_position: torch.Tensor,
                 compact_fraction: float = 0.25, compact_min_holes: int = 16, layout: AttentionLayout | None = None,
                 positions: torch.Tensor | None = None, host_counts: Sequence[int] | None = None) -> None:
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise ValueError(
                    f"DSpark's ragged verification needs a cache of full DynamicLayers; this one has "
                    f"{type(layer).__name__} layers. Prefill into hf_dspark.target.ragged_cache."
                    "new_target_cache(model) (sliding windows are applied as masks)."
                )
        self.cache = cache
        self.valid = valid.bool()
        self.next_position = next_position.long()
        self.layout = layout
        self.positions = positions.long() if positions is not None else slot_positions(self.valid)
        self.compact_fraction = compact_fraction
        self.compact_min_holes = compact_min_holes
        self.compactions = 0
        self.max_width = self.width
        self.host_counts: list[int] | None = (
            [int(n) for n in host_counts] if host_counts is not None else self.valid.sum(dim=1).tolist()
        )

    @property
    def width(self) -> int:
        return int(self.valid.shape[1])

    def forward(self, model, input_ids: torch.Tensor, input_valid: torch.Tensor, tap_indices: list[int],
                extra_kwargs: dict | None = None, packs: PackedLinears | None = None,
                host_input_counts: Sequence[int] | None = None, tree: TreeSlots | None = None) -> VerifyOutput:
        """One target forward over `[A, T]` new tokens; returns fp32 logits and tapped features for all T.
        packs: the target's packed linear weights (`packed_linear`), or None. host_input_counts: each row's valid
        inputs (1 + ℓ_r) as host ints; with the host mirror they tell a batch without holes, which an SDPA target
        then runs without a mask (transformers' causal path, no device read of the mask).

        The new slots hold `input_valid` until the commit (`commit_last` writes what each row kept; `commit_every`
        marks them all, which a caller whose inputs were all valid may skip with `marked=True`): the validity the
        mask was built from becomes the cache's, one concatenation for both. tree: the inputs are draft-tree nodes
        (`tree_forward`): positions next + depth, each node attending to its ancestors; `commit_path` keeps one
        path."""
        steps = input_ids.shape[1]
        if tree is not None:
            positions = self.next_position[:, None] + tree.depth
        elif steps == 1:  # a plain step: each row's next position (a view; `next_position` is replaced, never written)
            positions = self.next_position[:, None]
        else:
            positions = self.next_position[:, None] + torch.arange(steps, device=input_ids.device)[None, :]
        valid = torch.cat([self.valid, input_valid.bool()], dim=1)
        mask = None  # no hole anywhere: transformers' causal path
        if tree is not None or not self._without_holes(steps, host_input_counts):
            mask = valid.long()
        self.positions = torch.cat([self.positions, positions], dim=1)
        if tree is not None or (mask is not None and self.layout is not None and self.layout.needs_masks):
            dtype = model.get_input_embeddings().weight.dtype
            layout = self.layout or attention_layout(model)
            mask = verification_masks(layout, valid, self.positions, positions, dtype, tree)
        # no KV copy per layer for grouped-query attention (attention.py); few-row products on packed weights
        # (a single token, batch-1 plain decoding, is never routed there, so it skips the swap)
        with packed_gqa_attention(model), packed_linears(packs if input_ids.numel() > 1 else None):
            out = model(
                input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True,
                output_hidden_states=list(tap_indices) or None, logits_to_keep=0, **(extra_kwargs or {}),
            )
        self.cache = out.cache
        self.valid = valid
        self.max_width = max(self.max_width, self.width)
        features = torch.cat([out.hidden_states[i] for i in tap_indices], dim=-1) if tap_indices else None
        return VerifyOutput(out.logits.float(), features)

    def _without_holes(self, steps: int, host_input_counts: Sequence[int] | None) -> bool:
        """Whether every cached slot and every input slot is valid (host ints only) on a full-attention SDPA target."""
        if host_input_counts is None or self.host_counts is None or self.layout is None:
            return False
        if self.layout.needs_masks or self.layout.implementation != "sdpa":
            return False
        # counts never exceed the width / the steps: their minimum tells whether all are full
        width = self.width
        return min(self.host_counts, default=width) == width and min(host_input_counts, default=steps) == steps

    def commit_last(self, steps: int, kept: torch.Tensor, host_kept: Sequence[int] | None = None) -> torch.Tensor:
        """The last forward appended `steps` slots; row a keeps the first kept[a] of them (`[A]` on the device;
        `host_kept`, the same as host ints, keeps the host mirror of the valid counts, None drops it). Returns the
        kept slots `[A, steps]` (bool)."""
        new = torch.arange(steps, device=kept.device)[None, :] < kept[:, None]
        self.valid[:, -steps:] = new
        self.next_position = self.next_position + kept
        if host_kept is None or self.host_counts is None:
            self.host_counts = None
        else:
            self.host_counts = [have + int(n) for have, n in zip(self.host_counts, host_kept)]
            self.drop_tail(steps - max(host_kept, default=steps))
        self.maybe_compact()
        return new

    def commit_path(self, steps: int, order: torch.Tensor, kept: torch.Tensor,
                    host_kept: Sequence[int] | None = None) -> torch.Tensor:
        """The last forward appended `steps` tree nodes; row a keeps its accepted path, kept[a] nodes long (anchor
        included). order `[A, steps]`: `tree_forward.path_slot_order` of the path. The path's keys, values and
        positions move into the first new slots in depth order, then `commit_last` keeps them like a chain."""
        start = self.width - steps
        order_on = {}
        for layer in self.cache.layers:
            device = layer.keys.device
            order_on.setdefault(device, order.to(device, non_blocking=True))
            gather_new_slots(layer.keys, order_on[device], start, dim=2)
            gather_new_slots(layer.values, order_on[device], start, dim=2)
        gather_new_slots(self.positions, order, start, dim=1)
        return self.commit_last(steps, kept, host_kept)

    def drop_tail(self, slots: int) -> None:
        """Drop the last `slots` slots, which no row keeps (the drafts every row rejected): views of the layers, no
        copy. At batch 1 a round then leaves no hole, so the next forward needs no mask (transformers' causal path,
        as in its own assisted loop, which crops the cache the same way)."""
        if slots <= 0:
            return
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, :-slots]
            layer.values = layer.values[:, :, :-slots]
        self.valid = self.valid[:, :-slots]
        self.positions = self.positions[:, :-slots]

    def commit_every(self, steps: int, marked: bool = False) -> None:
        """The last forward appended `steps` slots and every row keeps them all (`commit_last` without a device
        tensor of counts: a plain decoding step). marked: that forward's inputs were all valid, so its slots are."""
        if not marked:
            self.valid[:, -steps:].fill_(True)  # a view filled in place (cheaper than indexed assignment)
        self.next_position = self.next_position + steps
        if self.host_counts is not None:
            self.host_counts = [have + steps for have in self.host_counts]
        self.maybe_compact()

    def longest(self) -> int:
        """max_a (valid slots of row a): from the host mirror when kept, else one device read."""
        if self.host_counts is not None:
            return max(self.host_counts, default=0)
        return int(self.valid.sum(dim=1).max()) if self.valid.shape[0] else 0

    def maybe_compact(self) -> None:
        """Compact when the holes past the longest row reach `compact_min_holes` and `compact_fraction` of the
        width (decided on the host mirror: no device read while it is kept)."""
        longest = self.longest()
        holes = self.width - longest
        if holes >= self.compact_min_holes and holes >= self.compact_fraction * self.width:
            self.compact(longest)

    def compact(self, new_width: int | None = None) -> None:
        """Gather each row's valid entries into a left-padded cache of width max_a(valid count) (`new_width`, when
        the caller has it on the host)."""
        if new_width is None:
            new_width = self.longest()
        # Stable order: invalid slots first, valid slots last, keeping the valid ones in their order.
        order = torch.argsort(self.valid.to(torch.int8), dim=1, stable=True)[:, -new_width:]
        order_on = on_devices(order)
        for layer in self.cache.layers:
            index = order_on(layer.keys.device)[:, None, :, None]
            index = index.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.valid = self.valid.gather(1, order)
        self.positions = self.positions.gather(1, order)
        self.compactions += 1

    def select_rows(self, rows: torch.Tensor, host_rows: Sequence[int] | None = None) -> None:
        """Keep only `rows` (indices into the current active set); `host_rows`, the same as host ints, keeps the
        host mirror of the valid counts (None drops it)."""
        rows_on = on_devices(rows)  # a device_map may spread the layers over several devices
        for layer in self.cache.layers:
            index = rows_on(layer.keys.device)
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.valid = self.valid.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)
        self.next_position = self.next_position.index_select(0, rows)  # compaction: at the next commit's check
        mirror = self.host_counts
        self.host_counts = None if mirror is None or host_rows is None else [mirror[int(a)] for a in host_rows]

    def add_rows(self, other: RaggedTargetCache) -> None:
        """Append the rows of another cache (e.g. newly admitted requests), left-padding both to one width."""
        width = max(self.width, other.width)

        def pad(tensor: torch.Tensor, have: int) -> torch.Tensor:
            return torch.nn.functional.pad(tensor, (0, 0, width - have, 0)) if have < width else tensor

        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([pad(mine.keys, self.width), pad(theirs.keys, other.width)])
            mine.values = torch.cat([pad(mine.values, self.width), pad(theirs.values, other.width)])
        self.positions = torch.cat([torch.nn.functional.pad(self.positions, (width - self.width, 0)),
                                    torch.nn.functional.pad(other.positions, (width - other.width, 0))])
        left = torch.nn.functional.pad(self.valid, (width - self.width, 0))
        right = torch.nn.functional.pad(other.valid, (width - other.width, 0))
        self.valid = torch.cat([left, right])
        self.next_position = torch.cat([self.next_position, other.next_position])
        mirrors = (self.host_counts, other.host_counts)
        self.host_counts = None if None in mirrors else [*mirrors[0], *mirrors[1]]
