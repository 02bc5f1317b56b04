"""Draft trees: the batched, ragged token tree one round verifies (docs/method.md, "Draft trees").

A row's tree has N node slots in topological order. Node 0 is the anchor (the row's last committed token, whose
target distribution predicts the first drafts); nodes 1..N-1 are drafts, each the child of an earlier node. Rows with
fewer nodes are padded to the round's budget N: a padded node has `valid` False, parent -1 and token 0, sees only
itself and is seen by nobody, so it can ride through the target forward as a hole. A chain is the special case
parents[:, i] = i - 1. Pure functions on tensors; no host syncs except in `check_tree` (a debugging/test aid).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


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


# ---------------------------------------------------------------------------------------------------- shaping

ChildDistributions = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, "torch.Tensor | None"]]
"""child_fn(depth d, parent_tokens `[R, M]`, beam_parent `[R, M]`) -> (probs `[R, M, V]`, confidence `[R, M]` or None).

The draft distribution of the children of each of the M frontier nodes at depth d (slot d + 1 of the block), given
that node's token; beam_parent[r, m] is the position, in the previous call's frontier, of frontier node m's parent
(zeros at d = 0, whose single frontier node is the anchor), so a recurrent head can gather its state per branch.
The confidence is the calibrated probability that the slot's argmax is accepted (None: the per-slot one)."""


@dataclass(frozen=True)
class TreeProposal:
    """A shaped tree and its estimates.

    Args:
        tree (`DraftTree`): the selected nodes in topological order, padded to the node budget.
        score (`torch.Tensor` `[R, N]`): estimated P(node reached and accepted) = ∏ of `acceptance` along its path
            (1 at the anchor, 0 at padded nodes). Σ_i score_i is the expected accepted length + 1.
        acceptance (`torch.Tensor` `[R, N]`): the per-node estimate given its parent is accepted.
    """

    tree: DraftTree
    score: torch.Tensor
    acceptance: torch.Tensor


def shared_child_distributions(slot_probs: torch.Tensor) -> ChildDistributions:
    """child_fn for a drafter without a sequential head: every branch at depth d shares slot d's distribution.

    slot_probs: `[R, γ, V]`.
    """

    def child_fn(depth: int, parent_tokens: torch.Tensor, beam_parent: torch.Tensor):
        return slot_probs[:, depth, None].expand(-1, parent_tokens.shape[1], -1), None

    return child_fn


def sibling_acceptance(top_probs: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """a_1 = c, a_k = (1 − c)·q(x_k) / (1 − q(x_1)) for k ≥ 2: per-sibling acceptance estimates.

    The calibrated confidence c prices the argmax x_1; the rest of the mass, 1 − c, is shared by the other
    candidates in proportion to their draft probabilities, so Σ_k a_k ≤ 1 and a_k ≤ 1.
    top_probs: `[..., K]` the draft probabilities of the K candidates, in descending order; confidence: `[...]`.
    """
    confidence = confidence.clamp(0.0, 1.0)[..., None].to(top_probs.dtype)
    rest = (1.0 - top_probs[..., :1]).clamp_min(1e-12)
    others = (1.0 - confidence) * (top_probs / rest).clamp_max(1.0)
    first = torch.zeros_like(top_probs, dtype=torch.bool)
    first[..., 0] = True
    return torch.where(first, confidence.expand_as(top_probs), others)


def build_tree(
    anchor: torch.Tensor,
    child_probs: torch.Tensor | ChildDistributions,
    confidence: torch.Tensor | None,
    budget: int,
    depth: int | None = None,
    sibling_cap: int = 4,
    beam_width: int | None = None,
) -> TreeProposal:
    """EAGLE-2-style best-first shaping: keep the budget − 1 candidates with the largest ∏_{path} a_i.

    At each depth d < γ the beam_width best frontier nodes (by score) are expanded with their top sibling_cap
    children (distinct tokens, descending draft probability), each scored parent score × `sibling_acceptance`;
    the tree keeps the best budget − 1 of all candidates (ties: the earlier one, so every kept node's parent is
    kept). Deterministic in the distributions, so sampling verification stays lossless (point-mass siblings).

    anchor: `[R]`; child_probs: `[R, γ, V]` per-slot draft distributions shared by all branches, or a
    `ChildDistributions` callable (Markov/RNN heads: each child's distribution given its parent's token);
    confidence: `[R, γ]` per-slot calibrated confidence (None: the callable returns it). budget: N, nodes per row
    including the anchor; depth: γ (default: child_probs.shape[1]); beam_width: default sibling_cap.
    """
    if budget < 1 or sibling_cap < 1:
        raise ValueError(f"build_tree needs budget ≥ 1 and sibling_cap ≥ 1; got {budget} and {sibling_cap}.")
    if callable(child_probs):
        child_fn = child_probs
        if depth is None:
            raise ValueError("build_tree with a child_fn callable needs depth (the block's γ slots).")
    else:
        child_fn, depth = shared_child_distributions(child_probs), child_probs.shape[1] if depth is None else depth
    beam_width = sibling_cap if beam_width is None else beam_width
    rows, device = anchor.shape[0], anchor.device
    tokens, parents, scores, accepts = [anchor[:, None]], [torch.full_like(anchor[:, None], -1)], [], []
    frontier_tokens, frontier_index = anchor[:, None], torch.zeros_like(anchor[:, None])
    frontier_score = torch.ones(rows, 1, device=device)
    scores.append(frontier_score)
    accepts.append(torch.ones(rows, 1, device=device))
    beam_parent, offset = torch.zeros_like(frontier_index), 1
    for d in range(depth):
        probs, node_confidence = child_fn(d, frontier_tokens, beam_parent)
        if node_confidence is None:
            if confidence is None:
                raise ValueError("build_tree needs confidence [R, γ] when child_fn returns None for it.")
            node_confidence = confidence[:, d, None].expand(-1, frontier_tokens.shape[1])
        top_probs, top_tokens = probs.topk(min(sibling_cap, probs.shape[-1]), dim=-1)  # [R, M, K]
        accept = sibling_acceptance(top_probs.float(), node_confidence.float())
        child_score = (frontier_score[..., None] * accept).flatten(1)  # [R, M·K]
        siblings = top_tokens.shape[-1]
        tokens.append(top_tokens.flatten(1))
        parents.append(frontier_index.repeat_interleave(siblings, dim=1))
        scores.append(child_score)
        accepts.append(accept.flatten(1))
        keep = child_score.topk(min(beam_width, child_score.shape[1]), dim=1).indices  # next frontier, [R, M']
        frontier_tokens = tokens[-1].gather(1, keep)
        frontier_score = child_score.gather(1, keep)
        frontier_index, beam_parent = keep + offset, keep // siblings
        offset += child_score.shape[1]
    return _select(torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(scores, 1), torch.cat(accepts, 1), budget)


def _select(tokens, parents, scores, accepts, budget: int) -> TreeProposal:
    """Keep the anchor and the budget − 1 best candidates (stable: parents before children), in pool order."""
    rows, pool = tokens.shape
    device = tokens.device
    order = scores[:, 1:].sort(dim=1, descending=True, stable=True).indices + 1
    kept = min(budget - 1, pool - 1)
    chosen = torch.cat([torch.zeros(rows, 1, dtype=torch.long, device=device), order[:, :kept]], dim=1)
    chosen = chosen.sort(dim=1).values  # pool order is topological
    new_index = torch.full((rows, pool), -1, dtype=torch.long, device=device)
    new_index.scatter_(1, chosen, torch.arange(chosen.shape[1], device=device).expand(rows, -1))
    parent_pool = parents.gather(1, chosen)
    new_parents = torch.where(parent_pool >= 0, new_index.gather(1, parent_pool.clamp_min(0)), parent_pool)
    pad = budget - chosen.shape[1]
    out_tokens = F.pad(tokens.gather(1, chosen), (0, pad))
    out_parents = F.pad(new_parents, (0, pad), value=-1)
    valid = F.pad(torch.ones_like(chosen, dtype=torch.bool), (0, pad), value=False)
    out_scores = F.pad(scores.gather(1, chosen), (0, pad))
    out_accepts = F.pad(accepts.gather(1, chosen), (0, pad))
    return TreeProposal(draft_tree(out_tokens, out_parents, valid), out_scores, out_accepts)


def merge_branch(
    tree: DraftTree, branch: torch.Tensor, branch_len: torch.Tensor | None = None
) -> tuple[DraftTree, torch.Tensor]:
    """Join the chain anchor → b_1 → … → b_L to the tree, sharing its longest common prefix with existing nodes.

    branch: `[R, L]` a lookup/suffix continuation of each row's anchor; branch_len: `[R]` (None: all L). New nodes
    take the L appended slots N..N+L−1 (unused ones stay padding). Returns (the tree with N + L slots, node
    `[R, L]`: the node index of each branch token, -1 past branch_len) so callers can attach scores to them.
    """
    rows, length = branch.shape
    nodes, device = tree.num_nodes, branch.device
    live_len = torch.full((rows,), length, device=device) if branch_len is None else branch_len
    current = torch.zeros(rows, dtype=torch.long, device=device)
    on_tree = torch.ones(rows, dtype=torch.bool, device=device)
    new_parents = torch.full((rows, length), -1, dtype=torch.long, device=device)
    new_valid = torch.zeros(rows, length, dtype=torch.bool, device=device)
    branch_nodes = torch.full((rows, length), -1, dtype=torch.long, device=device)
    for d in range(length):
        live = d < live_len
        match = (tree.parents == current[:, None]) & tree.valid & (tree.tokens == branch[:, d, None])
        found = on_tree & live & match.any(dim=1)
        create = live & ~found
        new_parents[:, d] = current
        new_valid[:, d] = create
        current = torch.where(found, match.to(torch.long).argmax(dim=1), torch.where(create, nodes + d, current))
        on_tree = found
        branch_nodes[:, d] = torch.where(live, current, torch.full_like(current, -1))
    merged = draft_tree(
        torch.cat([tree.tokens, branch.to(tree.tokens.dtype)], dim=1),
        torch.cat([tree.parents, new_parents], dim=1),
        torch.cat([tree.valid, new_valid], dim=1),
    )
    return merged, branch_nodes


def restrict_tree(
    tree: DraftTree, keep: torch.Tensor, num_nodes: int | None = None
) -> tuple[DraftTree, torch.Tensor]:
    """valid' = valid ∧ keep, optionally compacted: the kept nodes moved to the front, in order, N' = num_nodes.

    keep: `[R, N]` bool, closed under ancestors (a prefix of the best-scored nodes, `choose_tree_budget`), anchor
    included. num_nodes: the slots to keep (≥ the largest kept count; None: no compaction, N' = N). Returns (the
    tree, source `[R, N']`: the original node index of each slot, -1 at padding) to gather scores or logits with.
    """
    nodes, device = tree.num_nodes, tree.tokens.device
    valid = tree.valid & keep
    index = torch.arange(nodes, device=device).expand_as(valid)
    if num_nodes is None:
        return draft_tree(tree.tokens, tree.parents, valid), torch.where(valid, index, torch.full_like(index, -1))
    if not 1 <= num_nodes <= nodes:
        raise ValueError(f"restrict_tree: num_nodes must be in [1, N = {nodes}]; got {num_nodes}.")
    ordered = torch.where(valid, index, index + nodes).sort(dim=1).values[:, :num_nodes]
    slot_valid = ordered < nodes
    source = torch.where(slot_valid, ordered, torch.full_like(ordered, -1))
    new_index = torch.full((tree.num_rows, nodes + 1), -1, dtype=torch.long, device=device)  # column N: padding
    slots = torch.arange(num_nodes, device=device).expand_as(ordered)
    new_index = new_index.scatter(1, torch.where(slot_valid, ordered, nodes), slots)[:, :nodes]
    old_parents = tree.parents.gather(1, source.clamp_min(0))
    parents = torch.where(old_parents >= 0, new_index.gather(1, old_parents.clamp_min(0)), old_parents)
    return draft_tree(tree.tokens.gather(1, source.clamp_min(0)), parents, slot_valid), source
