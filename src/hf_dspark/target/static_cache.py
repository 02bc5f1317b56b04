"""A preallocated target KV cache for static-shape verification (`cache_implementation="static"`, `compile_config`).

Every layer holds `[A, H, C, D]` key and value buffers of fixed capacity C = max_length + γ + 1 (prompt, every new
token, one verification block of slack). Each row has its own write offset o_a: a verification forward writes its
T new slots at o_a, ..., o_a + T − 1 (a device scatter, no host read), and committing k_a tokens moves o_a by k_a,
so rejected drafts are simply overwritten by the next round: no holes past the prompt, no compaction.
The forward input is padded to one of two buckets, T ∈ {1, γ + 1}, so every verification forward has one of two
shapes, which `torch.compile` (or CUDA graphs) can capture once each. The 4D mask is written on the device into a
preallocated buffer per bucket: key slot k is visible to the query at slot s of row a when it is a valid prompt slot
or L ≤ k ≤ s (and, on sliding layers, pos_s − pos_k < window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.generation import configuration_utils

from .attention import packed_gqa_attention
from .packed_linear import PackedLinears, packed_linears
from .ragged_cache import AttentionLayout, RaggedTargetCache, VerifyOutput
from .tree_forward import TreeSlots, gather_new_slots, new_slot_visibility


class RaggedStaticLayer(CacheLayerMixin):
    """One layer's preallocated keys / values `[A, H, C, D]`; `update` scatters the new slots at `slots` `[A, T]`."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.device = keys.device
        self.slots: torch.Tensor | None = None  # set by the owning cache before each forward, on this device
        self.is_initialized = True
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        index = self.slots[:, None, :, None]
        self.keys.scatter_(2, index.expand(-1, key_states.shape[1], -1, key_states.shape[3]), key_states)
        self.values.scatter_(2, index.expand(-1, value_states.shape[1], -1, value_states.shape[3]), value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.keys.shape[2]


def static_masks(
    layout: AttentionLayout,
    prompt_valid: torch.Tensor,
    slot_positions: torch.Tensor,
    prompt_width: int,
    query_slots: torch.Tensor,
    query_positions: torch.Tensor,
    tree: TreeSlots | None = None,
) -> dict[str, torch.Tensor]:
    """Visibility `{layer type: [A, 1, T, C]}` (bool) of key slot k for the query at slot s (module docstring).

    prompt_valid / slot_positions: `[A, C]`; query_slots / query_positions: `[A, T]`; prompt_width: L. tree: the
    T queries are draft-tree nodes written at query_slots (`tree_forward`): each sees the committed slots before
    the first of them and its ancestors among them; slot_positions must then hold the nodes' positions.
    """
    slots = torch.arange(prompt_valid.shape[1], device=prompt_valid.device)
    if tree is None:
        written = (slots[None, None, :] >= prompt_width) & (slots[None, None, :] <= query_slots[:, :, None])
    else:
        first = query_slots[:, :1, None]
        written = (slots[None, None, :] >= prompt_width) & (slots[None, None, :] < first)
        written = written.expand(-1, query_slots.shape[1], -1)
        among = new_slot_visibility(query_slots.shape[1], query_slots.device, tree)
        written = written.scatter(2, query_slots[:, None, :].expand_as(among), among)
    visible = written | prompt_valid[:, None, :]
    masks = {}
    for layer_type, window in layout.windows.items():
        allowed = visible
        if window is not None:
            allowed = visible & (query_positions[:, :, None] - slot_positions[:, None, :] < window)
        masks[layer_type] = allowed[:, None]
    return masks


@dataclass(frozen=True)
class StaticPlan:
    """capacity: max_length + γ + 1 slots; block_size: γ; compiled: the compiled model call, or None (eager)."""

    capacity: int
    block_size: int
    compiled: Any = None


class StaticTargetCache:
    """The `RaggedTargetCache` interface over preallocated buffers with per-row write offsets (module docstring)."""

    def __init__(self, ragged: RaggedTargetCache, plan: StaticPlan) -> None:
        valid = ragged.valid
        rows, width = valid.shape
        capacity = plan.capacity
        if capacity < width + plan.block_size + 1:
            raise ValueError(
                f"static target cache of {capacity} slots cannot hold a {width}-slot prompt and "
                f"one verification block of {plan.block_size + 1}; raise max_new_tokens."
            )
        layers = []
        for layer in ragged.cache.layers:
            keys = layer.keys.new_zeros(rows, layer.keys.shape[1], capacity, layer.keys.shape[3])
            values = layer.values.new_zeros(rows, layer.values.shape[1], capacity, layer.values.shape[3])
            keys[:, :, :width] = layer.keys
            values[:, :, :width] = layer.values
            layers.append(RaggedStaticLayer(keys, values))
        self.cache = Cache(layers=layers)
        self.layout = ragged.layout or AttentionLayout({"full_attention": None}, "sdpa")
        self.prompt_width, self.plan = width, plan
        self.prompt_valid = torch.nn.functional.pad(valid, (0, capacity - width))
        tail = ragged.next_position[:, None] + torch.arange(capacity - width, device=valid.device)[None, :]
        self.slot_positions = torch.cat([ragged.positions, tail], dim=1)
        self.offset = torch.full((rows,), width, dtype=torch.long, device=valid.device)
        self.next_position = ragged.next_position.clone()
        self.compactions = 0
        self.max_width = capacity
        self._masks: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def width(self) -> int:
        return self.plan.capacity

    def bucket(self, steps: int) -> int:
        """The padded input width for `steps` tokens: 1, or γ + 1."""
        if steps > self.plan.block_size + 1:
            raise ValueError(
                f"a verification forward of {steps} tokens exceeds the bucket γ + 1 = {self.plan.block_size + 1}"
            )
        return 1 if steps == 1 else self.plan.block_size + 1

    def _write_masks(self, bucket: int, query_slots: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
        fresh = static_masks(
            self.layout, self.prompt_valid, self.slot_positions, self.prompt_width, query_slots, positions
        )
        eager = self.layout.implementation == "eager"
        buffers = self._masks.get(bucket)
        if buffers is None or next(iter(buffers.values())).shape[0] != query_slots.shape[0]:
            buffers = {
                k: torch.empty(v.shape, dtype=dtype if eager else torch.bool, device=v.device)
                for k, v in fresh.items()
            }
            self._masks[bucket] = buffers
        for layer_type, allowed in fresh.items():
            if eager:
                buffers[layer_type].copy_(torch.where(allowed, 0.0, torch.finfo(dtype).min))
            else:
                buffers[layer_type].copy_(allowed)
        return next(iter(buffers.values())) if len(buffers) == 1 else buffers

    def forward(
        self,
        model,
        input_ids: torch.Tensor,
        input_valid: torch.Tensor,
        tap_indices: list[int],
        extra_kwargs: dict | None = None,
        packs: PackedLinears | None = None,
        host_input_counts=None,
        tree: TreeSlots | None = None,
    ) -> VerifyOutput:
        """One target forward over `[A, T]` new tokens, padded to its bucket; fp32 logits / features for the T
        (`host_input_counts`: unused, the static path always writes its mask buffer). tree: the T inputs are
        draft-tree nodes, one bucket of their own (T, the round's node budget); `commit_path` keeps one path."""
        steps = input_ids.shape[1]
        if tree is not None:
            padded, query_slots, positions, mask = self._tree_inputs(input_ids, tree, model)
        else:
            bucket = self.bucket(steps)
            padded = torch.nn.functional.pad(input_ids, (0, bucket - steps))
            offsets = torch.arange(bucket, device=input_ids.device)[None, :]
            positions = self.next_position[:, None] + offsets
            query_slots = (self.offset[:, None] + offsets).clamp_max(self.plan.capacity - 1)
            mask = self._write_masks(bucket, query_slots, positions, model.get_input_embeddings().weight.dtype)
        on_device: dict[torch.device, torch.Tensor] = {}
        for layer in self.cache.layers:
            layer.slots = on_device.setdefault(layer.device, query_slots.to(layer.device))
        kwargs = dict(
            input_ids=padded,
            attention_mask=mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=list(tap_indices) or None,
            logits_to_keep=0,
            **(extra_kwargs or {}),
        )
        if self.plan.compiled is not None:
            out = self.plan.compiled(**kwargs)
        else:
            with packed_gqa_attention(model), packed_linears(packs if input_ids.numel() > 1 else None):
                out = model(**kwargs)
        features = torch.cat([out.hidden_states[i] for i in tap_indices], dim=-1)[:, :steps] if tap_indices else None
        return VerifyOutput(out.logits[:, :steps].float(), features)

    def _tree_inputs(self, input_ids: torch.Tensor, tree: TreeSlots, model):
        """(inputs, query slots, positions, mask) of a tree forward: the T nodes at o_a, ..., o_a + T − 1, at
        positions next + depth, each seeing the committed slots and its ancestors (a fresh mask: trees have
        their own bucket)."""
        steps = input_ids.shape[1]
        if steps > self.plan.block_size + 1:
            raise ValueError(
                f"a tree of {steps} nodes exceeds the static cache's slack of {self.plan.block_size + 1} slots; "
                "build the static plan with block_size ≥ the tree's node budget (static_plan(..., block_size))."
            )
        offsets = torch.arange(steps, device=input_ids.device)[None, :]
        query_slots = (self.offset[:, None] + offsets).clamp_max(self.plan.capacity - 1)
        positions = self.next_position[:, None] + tree.depth.to(input_ids.device)
        key_positions = self.slot_positions.scatter(1, query_slots, positions)
        fresh = static_masks(self.layout, self.prompt_valid, key_positions, self.prompt_width, query_slots,
                             positions, tree)
        if self.layout.implementation == "eager":
            dtype = model.get_input_embeddings().weight.dtype
            fresh = {k: torch.where(v, 0.0, torch.finfo(dtype).min).to(dtype) for k, v in fresh.items()}
        mask = next(iter(fresh.values())) if len(fresh) == 1 else fresh
        return input_ids, query_slots, positions, mask

    def commit_path(self, steps: int, order: torch.Tensor, kept: torch.Tensor, host_kept=None) -> torch.Tensor:
        """The last forward wrote `steps` tree nodes at o_a, ...; row a keeps its accepted path, kept[a] nodes
        long (order `[A, steps]`: `tree_forward.path_slot_order`): the path's keys and values move to o_a, o_a + 1,
        ... in depth order, then `commit_last` moves the write offset as for a chain."""
        for layer in self.cache.layers:
            device = layer.keys.device
            gather_new_slots(layer.keys, order.to(device), self.offset.to(device), dim=2)
            gather_new_slots(layer.values, order.to(device), self.offset.to(device), dim=2)
        return self.commit_last(steps, kept, host_kept)

    def commit_last(self, steps: int, kept: torch.Tensor, host_kept=None) -> torch.Tensor:
        """Row a keeps the first kept[a] slots of the last forward: its write offset moves by kept[a] (`host_kept`:
        unused, no compaction to decide). Returns the kept slots `[A, steps]` (bool)."""
        self.offset = self.offset + kept
        self.next_position = self.next_position + kept
        return torch.arange(steps, device=kept.device)[None, :] < kept[:, None]

    def commit_every(self, steps: int, marked: bool = False) -> None:
        """Every row keeps all `steps` slots of the last forward (a plain decoding step; `marked`: unused)."""
        self.offset = self.offset + steps
        self.next_position = self.next_position + steps

    def select_rows(self, rows: torch.Tensor, host_rows=None) -> None:
        """Keep only `rows` (indices into the current active set); each layer indexes on its own device
        (`host_rows`: unused)."""
        for layer in self.cache.layers:
            index = rows.to(layer.device)
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        for name in ("prompt_valid", "slot_positions", "offset", "next_position"):
            setattr(self, name, getattr(self, name).index_select(0, rows))

    def add_rows(self, other) -> None:
        raise NotImplementedError(
            "the static target cache serves one generate call; the serving engine admits "
            "requests into the ragged cache (generation.target_cache)"
        )


# The cache_implementation names for which transformers builds a (non-offloaded) StaticCache: "static" and its
# deprecated aliases, whose layer structure StaticCache infers from the config as the static path does.
STATIC_PATH_CACHES = tuple(
    name for name in getattr(configuration_utils, "ALL_STATIC_CACHE_IMPLEMENTATIONS", ("static",))
    if "offloaded" not in name
)


def static_plan(model, generation_config, block_size: int) -> StaticPlan | None:
    """The static path for this call, or None (ragged dynamic cache).

    Taken when `cache_implementation="static"` (or an alias transformers builds the same cache for,
    `STATIC_PATH_CACHES`) or a `compile_config` is given. The verification forward is compiled
    (`model.get_compiled_call(compile_config)`, per bucket shape) when a `compile_config` is given, or, as plain
    `generate` does, for a static cache on an accelerator; `disable_compile=True` keeps it eager.
    """
    implementation = getattr(generation_config, "cache_implementation", None)
    compile_config = getattr(generation_config, "compile_config", None)
    if implementation not in STATIC_PATH_CACHES and compile_config is None:
        return None
    compiled = None
    accelerator = model.device.type not in ("cpu", "meta", "mps")
    if not getattr(generation_config, "disable_compile", False) and (compile_config is not None or accelerator):
        compiled = model.get_compiled_call(compile_config)
    return StaticPlan(int(generation_config.max_length) + block_size + 1, block_size, compiled)
