"""Position-based verification masks and slot positions of the ragged target cache."""

import torch
from transformers.cache_utils import DynamicCache

from hf_dspark.target.ragged_cache import AttentionLayout, RaggedTargetCache, slot_positions, verification_masks


def test_slot_positions_of_left_padded_rows():
    valid = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert slot_positions(valid).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_masks_hide_holes_future_and_out_of_window_keys():
    # one row: committed slots at positions 0..4 with a hole (slot 2, position 9 is stale), then 3 new slots
    key_valid = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 0]], dtype=torch.bool)
    key_positions = torch.tensor([[0, 1, 9, 2, 3, 4, 5, 6]])
    query_positions = torch.tensor([[4, 5, 6]])
    layout = AttentionLayout({"full_attention": None, "sliding_attention": 3}, "sdpa")
    masks = verification_masks(layout, key_valid, key_positions, query_positions, torch.float32)
    full, sliding = masks["full_attention"][0, 0].long(), masks["sliding_attention"][0, 0].long()
    assert full.tolist() == [[1, 1, 0, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1, 1, 0], [1, 1, 0, 1, 1, 1, 1, 1]]
    # window 3: position p sees p-2..p; the padded last query still sees its own slot
    assert sliding.tolist() == [[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1, 1, 1]]


def test_eager_masks_are_additive_and_single_type_gives_a_tensor():
    key_valid = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    key_positions = torch.tensor([[0, 0, 1]])
    layout = AttentionLayout({"sliding_attention": 4}, "eager")
    mask = verification_masks(layout, key_valid, key_positions, torch.tensor([[1]]), torch.bfloat16)
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bfloat16 and mask.shape == (1, 1, 1, 3)
    assert mask[0, 0, 0].tolist() == [0.0, torch.finfo(torch.bfloat16).min, 0.0]


def _cache(rows: int, width: int) -> DynamicCache:
    cache = DynamicCache()
    keys = torch.arange(rows * width, dtype=torch.float32).reshape(rows, 1, width, 1)
    cache.update(keys, keys.clone(), 0)
    return cache


def test_positions_follow_commit_compact_select_and_add_rows():
    valid = torch.tensor([[0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    target = RaggedTargetCache(_cache(2, 3), valid, valid.sum(dim=1), compact_min_holes=1, compact_fraction=0.1)
    # pretend a forward appended 3 slots at each row's next positions; each row keeps 1 (2 holes)
    target.cache.layers[0].keys = torch.cat([target.cache.layers[0].keys, torch.zeros(2, 1, 3, 1)], dim=2)
    target.cache.layers[0].values = target.cache.layers[0].keys.clone()
    target.valid = torch.cat([target.valid, torch.zeros(2, 3, dtype=torch.bool)], dim=1)
    target.positions = torch.cat([target.positions, target.next_position[:, None] + torch.arange(3)], dim=1)
    target.commit_last(3, torch.tensor([1, 1]))  # compacts
    assert target.compactions == 1
    for row in range(2):
        kept = target.positions[row][target.valid[row]].tolist()
        assert kept == list(range(int(target.next_position[row])))
    target.select_rows(torch.tensor([1]))
    other = RaggedTargetCache(_cache(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.tensor([2]))
    target.add_rows(other)
    assert target.positions.shape == target.valid.shape == (2, 4)
    assert target.positions[0][target.valid[0]].tolist() == [0, 1, 2, 3]
    assert target.positions[1][target.valid[1]].tolist() == [0, 1]


def _appended(rows: int, width: int, valid: torch.Tensor, steps: int) -> RaggedTargetCache:
    """A cache whose last forward appended `steps` slots to every row (not committed yet)."""
    target = RaggedTargetCache(_cache(rows, width), valid, valid.sum(dim=1), compact_min_holes=1, compact_fraction=0.1)
    target.cache.layers[0].keys = torch.cat([target.cache.layers[0].keys, torch.zeros(rows, 1, steps, 1)], dim=2)
    target.cache.layers[0].values = target.cache.layers[0].keys.clone()
    target.valid = torch.cat([target.valid, torch.zeros(rows, steps, dtype=torch.bool)], dim=1)
    target.positions = torch.cat([target.positions, target.next_position[:, None] + torch.arange(steps)], dim=1)
    return target


def test_compaction_is_decided_on_the_host_mirror_without_device_reads():
    from hf_dspark.diagnostics import SyncCounter

    valid = torch.tensor([[1, 1, 1], [0, 1, 1]], dtype=torch.bool)
    mirrored, unmirrored = _appended(2, 3, valid, 3), _appended(2, 3, valid, 3)
    assert mirrored.host_counts == [3, 2]
    with SyncCounter() as counter:
        mirrored.commit_last(3, torch.tensor([1, 3]), [1, 3])
        mirrored.select_rows(torch.tensor([1, 0]), [1, 0])
    assert counter.total == 0, counter.events
    assert mirrored.compactions == 1 and mirrored.host_counts == [5, 4]
    unmirrored.commit_last(3, torch.tensor([1, 3]))  # no host counts: the mirror is dropped, the device is read
    assert unmirrored.host_counts is None and unmirrored.compactions == 1
    unmirrored.select_rows(torch.tensor([1, 0]))
    assert torch.equal(mirrored.valid, unmirrored.valid) and mirrored.width == unmirrored.width == 5
    assert unmirrored.longest() == 5
    assert torch.equal(mirrored.cache.layers[0].keys, unmirrored.cache.layers[0].keys)


class _IndexDevices(torch.overrides.TorchFunctionMode):
    """Records (source device, index device) of every `gather` / `index_select` run inside it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.gather, torch.gather, torch.Tensor.index_select, torch.index_select):
            source, index = args[0], args[2]
            self.calls.append((source.device, index.device))
        return func(*args, **kwargs)


def test_slots_no_row_keeps_are_dropped_without_a_copy():
    """The last forward's tail that every row rejected leaves the cache (host counts tell it): at batch 1 no hole is
    left, so the next forward runs without a mask; the kept layers are views of the old ones."""
    one = _appended(1, 3, torch.ones(1, 3, dtype=torch.bool), 4)
    keys = one.cache.layers[0].keys
    one.commit_last(4, torch.tensor([2]), [2])
    assert one.width == 5 and one.valid.all() and one.positions[0].tolist() == [0, 1, 2, 3, 4]
    assert one.cache.layers[0].keys.shape == (1, 1, 5, 1)
    assert one.cache.layers[0].keys.untyped_storage().data_ptr() == keys.untyped_storage().data_ptr()
    assert one.compactions == 0 and one.host_counts == [5]
    two = _appended(2, 3, torch.ones(2, 3, dtype=torch.bool), 4)
    two.commit_last(4, torch.tensor([1, 3]), [1, 3])  # only the slot neither row keeps goes
    assert two.width == 6 and two.valid.sum(dim=1).tolist() == [4, 6]
    unmirrored = _appended(1, 3, torch.ones(1, 3, dtype=torch.bool), 4)
    unmirrored.commit_last(4, torch.tensor([2]))  # no host counts: no drop; the holes wait for compaction (a copy)
    assert unmirrored.width == 5 and unmirrored.compactions == 1


def test_compact_and_select_rows_index_each_layer_on_its_own_device():
    """A `device_map` puts layers on several devices: each layer is indexed with a copy on its keys' device."""
    valid = torch.tensor([[1, 1, 1], [0, 1, 1]], dtype=torch.bool)
    target = _appended(2, 3, valid, 3)
    keys = target.cache.layers[0].keys
    target.cache.update(keys.to("meta"), keys.to("meta"), 1)  # a second layer on another device
    with _IndexDevices() as calls:
        target.commit_last(3, torch.tensor([1, 3]), [1, 3])  # compacts
        target.select_rows(torch.tensor([1, 0]), [1, 0])
    assert target.compactions == 1
    assert calls.calls and all(source == index for source, index in calls.calls), calls.calls
    cpu, meta = target.cache.layers
    assert meta.keys.device.type == "meta" and meta.keys.shape == cpu.keys.shape == (2, 1, 5, 1)
    assert cpu.keys[:, 0, :, 0].tolist() == [[4, 5, 0, 0, 0], [0, 0, 1, 2, 0]]


def test_sdpa_batch_without_holes_runs_without_a_mask_and_matches_plain():
    """A batch whose cache has no holes (one unpadded row, every draft accepted) needs no mask: SDPA gets none,
    and greedy output stays plain's; a ragged batch still gets its 2D mask."""
    from hf_dspark.generation import oracle_for
    from tests.helpers import make_target, ragged_prompts

    model = make_target("llama", seed=3, eos_token_id=None)
    assert model.config._attn_implementation == "sdpa"
    masks = []

    def hook(module, args, kwargs):
        if kwargs.get("position_ids") is not None and kwargs["input_ids"].shape[1] <= 5:
            masks.append(kwargs.get("attention_mask"))

    handle = model.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch, holes in ((1, False), (3, True)):
            ids, mask = ragged_prompts(batch, seed=4, min_len=6 if holes else 9, max_len=9)
            reference = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
            masks.clear()
            drafter = oracle_for(model, 4, reference, mask)
            output = model.generate(ids, attention_mask=mask, assistant_model=drafter, do_sample=False,
                                    max_new_tokens=12, dspark_policy="fixed")
            assert torch.equal(output, reference)
            rounds = drafter.last_generation_stats.rounds
            assert rounds > 0 and len(masks) >= rounds
            assert all((m is not None) is holes for m in masks[-rounds:]), [m is None for m in masks]
    finally:
        handle.remove()
