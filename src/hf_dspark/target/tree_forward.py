"""Verifying a draft tree in one target forward, and committing its accepted path.

A round's tree gives every row N new slots: node 0 the anchor, nodes 1..N−1 drafts in topological order
(`hf_dspark.ops.tree.DraftTree`). One forward feeds all N with

    position_ids[a, i] = next_position[a] + depth[a, i],
    mask[a, i, k]      = cached slot k valid (holes hidden; sliding layers: pos_i − pos_k < window)   (k cached)
                       = node k is an ancestor of node i, or i itself                                 (k new)

so the logits at node i are those of a plain forward over the committed tokens followed by node i's root-to-node
chain. `TreeSlots` carries (depth, visibility) into the caches' `forward(..., tree=...)`; the mask functions of
`ragged_cache` and `static_cache` AND the new slots' causal visibility with the ancestor mask.

After verification only the accepted path stays: `commit_path` moves the path's keys and values (and positions)
into the first new slots, in depth order, and commits them as a chain of the same length would be committed
(`commit_last`): the cache after a tree round looks exactly like the cache after a chain round that kept the same
tokens, so later forwards (sliding-window masks, compaction, the static cache's write offsets) need nothing new.
The gather touches only the N new slots of each layer (no re-forward, no copy of the cache).

Trees need an attention implementation that takes an arbitrary 4D mask (sdpa, eager, and DSpark's packed
grouped-query SDPA built on sdpa): `tree_support` says why another cannot, and the round then verifies chains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TREE_IMPLEMENTATIONS = ("sdpa", "eager", "dspark_packed_sdpa")


@dataclass(frozen=True)
class TreeSlots:
    """What a forward over tree nodes needs beyond a chain's inputs.

    depth: `[A, T]` long, each node's depth (node 0, the anchor, at 0); the node's position is the row's next
        position + depth.
    visibility: `[A, T, T]` bool, visibility[a, i, j] = node j is an ancestor of node i or i itself
        (`ops.tree.ancestor_mask`).
    """

    depth: torch.Tensor
    visibility: torch.Tensor

    def __post_init__(self) -> None:
        rows, steps = self.depth.shape
        if tuple(self.visibility.shape) != (rows, steps, steps):
            raise ValueError(
                f"TreeSlots: visibility must be [A, T, T] = [{rows}, {steps}, {steps}] for depth "
                f"{list(self.depth.shape)}, got {list(self.visibility.shape)}; pass ops.tree.ancestor_mask(tree) "
                "of the same tree."
            )


def tree_support(implementation: str | None) -> str | None:
    """None when the target's attention implementation takes a tree's 4D mask, else the reason it cannot."""
    if implementation in TREE_IMPLEMENTATIONS:
        return None
    return (
        f"attn_implementation={implementation!r} takes no arbitrary 4D attention mask, which verifying a draft tree "
        "in one forward needs; load the target with attn_implementation='sdpa' (or 'eager') to verify trees"
    )


def new_slot_visibility(steps: int, device: torch.device, tree: TreeSlots | None) -> torch.Tensor:
    """Which new slots each new slot sees, `[A or 1, T, T]` bool: the tree's visibility, or causal for a chain.
    Every slot sees itself, so padded nodes (never read) are never fully masked."""
    eye = torch.eye(steps, dtype=torch.bool, device=device)
    if tree is None:
        return torch.ones(steps, steps, dtype=torch.bool, device=device).tril()[None]
    return tree.visibility.to(device).bool() | eye


def path_slot_order(accepted_nodes: torch.Tensor, steps: int) -> torch.Tensor:
    """Source slot of each committed slot: order[a, d] = the accepted path's node at depth d, `[A, P]` → `[A, T]`.

    accepted_nodes: `[A, P]` node indices along each row's accepted path from the anchor (node 0), padded with
    anything past the path (those slots are not kept). Slots past P copy node 0 (never kept either).
    """
    rows, width = accepted_nodes.shape
    order = accepted_nodes.new_zeros(rows, steps)
    take = min(width, steps)
    order[:, :take] = accepted_nodes[:, :take].clamp(0, steps - 1)
    return order


def gather_new_slots(tensor: torch.Tensor, order: torch.Tensor, start: torch.Tensor | int, dim: int) -> None:
    """In place: tensor's slots start + d (along `dim`) take the slots start + order[:, d], for each row.

    tensor: `[A, ...]` with the slot axis at `dim` (2 for keys / values `[A, H, S, D]`, 1 for `[A, S]`);
    order: `[A, T]`; start: each row's first new slot `[A]`, or an int shared by all rows. Reads every source
    slot before writing any (a gather, then a scatter).
    """
    steps = order.shape[1]
    offsets = torch.arange(steps, device=order.device)[None, :]
    base = start[:, None] if isinstance(start, torch.Tensor) else start
    source, target = base + order.to(tensor.device), base + offsets.to(tensor.device)
    shape = [1] * tensor.dim()
    shape[0], shape[dim] = order.shape[0], steps
    expand = list(tensor.shape)
    expand[dim] = steps
    source = source.reshape(shape).expand(expand)
    target = target.expand(order.shape[0], steps).reshape(shape).expand(expand)
    tensor.scatter_(dim, target, tensor.gather(dim, source))
