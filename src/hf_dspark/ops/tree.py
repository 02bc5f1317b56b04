"""Draft trees: the batched, ragged token tree one round verifies (docs/method.md, "Draft trees").

A row's tree has N node slots in topological order. Node 0 is the anchor (the row's last committed token, whose
target distribution predicts the first drafts); nodes 1..N-1 are drafts, each the child of an earlier node. Rows with
fewer nodes are padded to the round's budget N: a padded node has `valid` False, parent -1 and token 0, sees only
itself and is seen by nobody, so it can ride through the target forward as a hole. A chain is the special case
parents[:, i] = i - 1. Pure functions on tensors; no host syncs except in `check_tree` (a debugging/test aid).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    """One round's draft trees, batched over rows and padded to a common node budget.

    Args:
        tokens (`torch.LongTensor` `[R, N]`): node tokens; tokens[:, 0] is the anchor (the last committed token).
        parents (`torch.LongTensor` `[R, N]`): parent node index; parents[:, 0] = -1 and parents[r, i] < i
            (topological order). Padded nodes have parent -1.
        valid (`torch.BoolTensor` `[R, N]`): real nodes; valid[:, 0] is True. Padded nodes are False.
        depth (`torch.LongTensor` `[R, N]`): edges from the anchor (0 for the anchor and for padded nodes).
            Derived: build trees with `draft_tree` (or `chain_tree`), which computes it.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    valid: torch.Tensor
    depth: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def _ancestor_closure(parents: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A = (I + P)^N by repeated squaring, P[r, i, j] = [j = parents[r, i]]: `[R, N]` -> `[R, N, N]` bool.

    ⌈log₂ N⌉ boolean matrix products, no host sync. Padded nodes keep only the diagonal.
    """
    rows, nodes = parents.shape
    linked = (parents >= 0) & valid
    step = torch.zeros(rows, nodes, nodes, dtype=torch.float32, device=parents.device)
    step.scatter_(2, parents.clamp_min(0)[..., None], linked[..., None].to(step.dtype))
    closure = step + torch.eye(nodes, device=parents.device, dtype=step.dtype)
    reach = 1
    while reach < nodes:
        closure = (closure @ closure).clamp_max(1.0)
        reach *= 2
    return closure > 0


def draft_tree(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None) -> DraftTree:
    """depth_i = depth_{parent(i)} + 1, depth_0 = 0: assemble a `DraftTree` from tokens/parents `[R, N]`.

    valid `[R, N]` defaults to parents ≥ 0 plus the anchor. Padded nodes get parent -1 and token 0.
    """
    if tokens.shape != parents.shape or tokens.dim() != 2:
        raise ValueError(
            f"tokens and parents must both be [R, N]; got {tuple(tokens.shape)} and {tuple(parents.shape)}."
        )
    if valid is None:
        valid = parents >= 0
        valid[:, 0] = True
    valid = valid.to(torch.bool)
    parents = torch.where(valid, parents, torch.full_like(parents, -1))
    tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
    depth = _ancestor_closure(parents, valid).sum(dim=-1) - 1
    return DraftTree(tokens=tokens, parents=parents, valid=valid, depth=depth)


def chain_tree(drafts: torch.Tensor, verify_len: torch.Tensor | None, anchor: torch.Tensor | None = None) -> DraftTree:
    """The chain x_0 → x_1 → … → x_ℓ as a tree: parents[:, i] = i − 1, valid[:, i] = i ≤ ℓ_r.

    drafts: `[R, γ]`; verify_len: `[R]` (None: every row keeps all γ drafts); anchor: `[R]` the last committed
    tokens (None: 0, for callers that only need the tree's shape). Returns a tree with N = γ + 1 nodes.
    """
    rows, gamma = drafts.shape
    device = drafts.device
    if anchor is None:
        anchor = torch.zeros(rows, dtype=drafts.dtype, device=device)
    tokens = torch.cat([anchor[:, None].to(drafts.dtype), drafts], dim=1)
    index = torch.arange(gamma + 1, device=device)
    parents = (index - 1).expand(rows, gamma + 1).clone()
    if verify_len is None:
        valid = torch.ones(rows, gamma + 1, dtype=torch.bool, device=device)
    else:
        valid = index[None, :] <= verify_len[:, None]
    return draft_tree(tokens, parents, valid)


def ancestor_mask(tree: DraftTree) -> torch.Tensor:
    """M[r, i, j] = [j is an ancestor of i or j = i]: `[R, N, N]` bool (the tree's attention mask among its nodes).

    A padded node sees only itself (never an empty attention row) and no valid node sees it.
    """
    return _ancestor_closure(tree.parents, tree.valid)


def position_ids(tree: DraftTree, base: torch.Tensor) -> torch.Tensor:
    """pos[r, i] = base_r + depth[r, i]: `[R]` -> `[R, N]` (base_r = the anchor's position)."""
    return base[:, None].to(tree.depth.dtype) + tree.depth


def children_mask(tree: DraftTree) -> torch.Tensor:
    """C[r, i, j] = [parents[r, j] = i and node j is valid]: `[R, N, N]` bool (row i lists node i's children)."""
    nodes = tree.num_nodes
    index = torch.arange(nodes, device=tree.parents.device)
    return (tree.parents[:, None, :] == index[None, :, None]) & tree.valid[:, None, :]


def path_mask(tree: DraftTree, leaf: torch.Tensor) -> torch.Tensor:
    """On[r, j] = [j is on the anchor → leaf_r path]: leaf `[R]` -> `[R, N]` bool (the accepted path's slots)."""
    mask = ancestor_mask(tree)
    return mask[torch.arange(tree.num_rows, device=leaf.device), leaf]


def path_nodes(tree: DraftTree, leaf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The anchor → leaf_r path in depth order: leaf `[R]` -> (nodes `[R, N]` padded with -1, count `[R]`).

    nodes[r, :count_r] are the path (nodes[r, 0] = 0, the anchor); count_r = depth[r, leaf_r] + 1.
    """
    on_path = path_mask(tree, leaf)
    nodes = tree.num_nodes
    # topological order = depth order along one path: sort the on-path indices to the front, keeping their order
    index = torch.arange(nodes, device=leaf.device).expand_as(on_path)
    key = torch.where(on_path, index, index + nodes)
    ordered = key.sort(dim=1).values
    count = on_path.sum(dim=1)
    ordered = torch.where(ordered < nodes, ordered, torch.full_like(ordered, -1))
    return ordered, count


def check_tree(tree: DraftTree) -> None:
    """Validate the invariants (host syncs: tests and debugging only); raise ValueError naming the broken one."""
    rows, nodes = tree.tokens.shape
    for name in ("parents", "valid", "depth"):
        if tuple(getattr(tree, name).shape) != (rows, nodes):
            shape = tuple(getattr(tree, name).shape)
            raise ValueError(f"DraftTree.{name} must be [R, N] = {(rows, nodes)}; got {shape}.")
    if not bool(tree.valid[:, 0].all()) or not bool((tree.parents[:, 0] == -1).all()):
        raise ValueError("node 0 must be the anchor: valid[:, 0] True and parents[:, 0] = -1.")
    index = torch.arange(nodes, device=tree.parents.device)
    if not bool((tree.parents < index[None, :]).all()):
        raise ValueError("parents[r, i] must be < i (topological order); reorder the nodes.")
    real = tree.valid[:, 1:]
    parent_ok = (tree.parents[:, 1:] >= 0) & tree.valid.gather(1, tree.parents[:, 1:].clamp_min(0))
    if not bool((parent_ok | ~real).all()):
        raise ValueError("every valid node except the anchor needs a valid parent; mark orphans invalid.")
    siblings = children_mask(tree)[:, :, :, None] & children_mask(tree)[:, :, None, :]
    same = tree.tokens[:, None, :, None] == tree.tokens[:, None, None, :]
    clash = siblings & same & ~torch.eye(nodes, dtype=torch.bool, device=same.device)
    if bool(clash.any()):
        raise ValueError("sibling tokens must be distinct: merge duplicate children into one node.")
