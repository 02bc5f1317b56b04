"""Batched, lossless verification of draft trees (docs/method.md, "Draft trees").

The target scores every node of a `DraftTree` in one forward: target distribution i (`[R, N, V]`) is the one that
predicts node i's children (node 0, the anchor, predicts the first drafts). Verification walks from the anchor: at
each accepted node it picks at most one child, and the round emits the accepted path's drafts plus one token drawn
at the last accepted node (the correction after rejected children, or the bonus token at a leaf). Pure functions;
no host sync: vectorised over rows and nodes, the only loop runs over sibling ranks (≤ the sibling cap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .functional import greedy_token_ids, residual_distribution
from .tree import DraftTree, ancestor_mask


@dataclass
class TreeVerificationResult:
    """The accepted path of each row.

    Args:
        leaf (`torch.LongTensor` `[R]`): the last accepted node (0 when no draft is kept).
        path (`torch.LongTensor` `[R, N]`): anchor → leaf node indices in depth order (path[:, 0] = 0), padded
            with -1; the first num_accepted + 1 entries are real.
        num_accepted (`torch.LongTensor` `[R]`): drafts kept (= depth of the leaf).
        next_token (`torch.LongTensor` `[R]`): the correction or bonus token drawn at the leaf.
    """

    leaf: torch.Tensor
    path: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor


def path_tokens(tree: DraftTree, path: torch.Tensor, pad_token_id: int = 0) -> torch.Tensor:
    """tokens[r, path[r, k + 1]], k = 0..N-2: the accepted drafts in order, `[R, N - 1]`, padded with pad_token_id."""
    drafts = path[:, 1:]
    gathered = tree.tokens.gather(1, drafts.clamp_min(0))
    return torch.where(drafts >= 0, gathered, torch.full_like(gathered, pad_token_id))


def sibling_ranks(tree: DraftTree) -> torch.Tensor:
    """rank[r, j] = #{k < j : parents[r, k] = parents[r, j], node k valid}: `[R, N]` (0 for the first child)."""
    nodes = tree.num_nodes
    same_parent = (tree.parents[:, :, None] == tree.parents[:, None, :]) & tree.valid[:, None, :]
    earlier = torch.ones(nodes, nodes, dtype=torch.bool, device=tree.parents.device).tril(-1)
    return (same_parent & earlier).sum(dim=-1)


def _first_among_siblings(tree: DraftTree, accepted: torch.Tensor) -> torch.Tensor:
    """chosen[r, j] = accepted[r, j] and no earlier sibling of j is accepted: `[R, N]` bool (≤ 1 per parent)."""
    nodes = tree.num_nodes
    same_parent = (tree.parents[:, :, None] == tree.parents[:, None, :]) & accepted[:, None, :]
    earlier = torch.ones(nodes, nodes, dtype=torch.bool, device=tree.parents.device).tril(-1)
    return accepted & ~(same_parent & earlier).any(dim=-1)


def _walk(tree: DraftTree, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """on_path[r, i] = ∀ ancestors a ≠ 0 of i (i included): chosen[r, a] → (leaf `[R]`, path `[R, N]`, count `[R]`).

    With at most one chosen child per node the accepted nodes form one path from the anchor; the leaf is its
    deepest node.
    """
    mask = ancestor_mask(tree)
    chosen = chosen & tree.valid
    chosen = torch.cat([torch.ones_like(chosen[:, :1]), chosen[:, 1:]], dim=1)  # the anchor is always kept
    on_path = ~(mask & ~chosen[:, None, :]).any(dim=-1) & tree.valid
    depth = torch.where(on_path, tree.depth, torch.full_like(tree.depth, -1))
    leaf = depth.max(dim=1).indices
    nodes = tree.num_nodes
    index = torch.arange(nodes, device=chosen.device).expand_as(on_path)
    ordered = torch.where(on_path, index, index + nodes).sort(dim=1).values  # topological = depth order on a path
    path = torch.where(ordered < nodes, ordered, torch.full_like(ordered, -1))
    return leaf, path, tree.depth.gather(1, leaf[:, None]).squeeze(1)


def verify_tree_greedy(tree: DraftTree, target_scores: torch.Tensor) -> TreeVerificationResult:
    """Greedy: node j is accepted iff every node on its path equals the target's argmax at its parent.

    accept_j = [x_j = argmax_v s_{parent(j)}(v)] for all j on anchor → j; next token = argmax s_leaf.
    target_scores: `[R, N, V]` the target's processed scores at every node, or `[R, N]` their argmax already taken.
    Siblings are distinct, so at most one child matches and the result is the tokens of plain greedy decoding.
    """
    target_ids = greedy_token_ids(target_scores) if target_scores.dim() == 3 else target_scores
    expected = target_ids.gather(1, tree.parents.clamp_min(0))
    chosen = _first_among_siblings(tree, (tree.tokens == expected) & tree.valid)
    leaf, path, count = _walk(tree, chosen)
    next_token = target_ids.gather(1, leaf[:, None]).squeeze(1)
    return TreeVerificationResult(leaf, path, count, next_token)


def _point_mass_coins(tree: DraftTree, target_probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Deterministic siblings: accept x_k w.p. r_k(x_k) = p(x_k) / (1 − Σ_{i<k} p(x_i)) (q_k = δ_{x_k}).

    uniform `[R, N]`; returns accepted `[R, N]` (before the first-sibling rule).
    """
    parent = tree.parents.clamp_min(0)
    row_index = torch.arange(tree.num_rows, device=parent.device)[:, None]
    p_token = target_probs[row_index, parent, tree.tokens] * tree.valid  # p_{parent(j)}(x_j), `[R, N]`
    nodes = tree.num_nodes
    same_parent = (tree.parents[:, :, None] == tree.parents[:, None, :]) & tree.valid[:, None, :]
    earlier = torch.ones(nodes, nodes, dtype=torch.bool, device=tree.parents.device).tril(-1)
    mass_before = ((same_parent & earlier) * p_token[:, None, :]).sum(dim=-1)
    return uniform * (1.0 - mass_before).clamp_min(0.0) < p_token


def _point_mass_residual(tree: DraftTree, target_probs: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """r_final = norm(p_leaf with its children's tokens zeroed): `[R, V]` (p_leaf itself at a childless leaf)."""
    rows = torch.arange(tree.num_rows, device=leaf.device)
    p_leaf = target_probs[rows, leaf]
    is_child = (tree.parents == leaf[:, None]) & tree.valid
    zeroed = torch.zeros_like(p_leaf).scatter_add_(1, tree.tokens, is_child.to(p_leaf.dtype)) > 0
    return residual_distribution(p_leaf, torch.where(zeroed, p_leaf, torch.zeros_like(p_leaf)))


def _recursive_coins(
    tree: DraftTree, target_probs: torch.Tensor, sibling_probs: torch.Tensor, uniform: torch.Tensor, max_siblings: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drawn siblings: r_1 = p, accept x_k w.p. min(1, r_k(x_k) / q_k(x_k)), r_{k+1} = norm(max(r_k − q_k, 0)).

    Every node's residual sequence is computed at once (loop over the sibling rank k only). Returns (accepted
    `[R, N]`, final residual `[R, N, V]` = r_{K_i + 1} after all K_i children of node i).
    """
    rows, nodes, vocab = target_probs.shape
    rank = sibling_ranks(tree)
    parent = tree.parents.clamp_min(0)
    q_token = sibling_probs.gather(-1, tree.tokens[..., None]).squeeze(-1)  # q_j(x_j)
    residual, accepted = target_probs, torch.zeros_like(tree.valid)
    row_index = torch.arange(rows, device=parent.device)[:, None]
    node_index = torch.arange(nodes, device=parent.device).expand(rows, -1)
    for k in range(max_siblings):
        at_rank = tree.valid & (rank == k) & (tree.parents >= 0)  # the rank-k child of each parent, `[R, N]`
        r_token = residual[row_index, parent, tree.tokens]  # r_{parent(j), k}(x_j)
        accepted = accepted | (at_rank & (uniform * q_token < r_token))
        slot = torch.where(at_rank, parent, nodes)  # column N collects the nodes of other ranks
        child_at = torch.full((rows, nodes + 1), -1, dtype=torch.long, device=parent.device)
        child_at = child_at.scatter(1, slot, node_index)[:, :nodes]  # parent i -> its rank-k child, or -1
        q_rank = sibling_probs.gather(1, child_at.clamp_min(0)[..., None].expand(-1, -1, vocab))
        q_rank = q_rank * (child_at >= 0)[..., None]  # zeros where there is none: the residual is unchanged there
        residual = residual_distribution(residual, q_rank)
    return accepted, residual


def verify_tree_sampling(
    tree: DraftTree,
    target_probs: torch.Tensor,
    sibling_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    max_siblings: int | None = None,
) -> TreeVerificationResult:
    """Lossless multi-candidate speculative sampling over each node's children, in sibling order.

    At a node with target distribution p and children x_1..x_K: r_1 = p; accept x_k w.p. min(1, r_k(x_k)/q_k(x_k)),
    else r_{k+1} = norm(max(r_k − q_k, 0)); after K rejections the correction is drawn from r_{K+1}; at a leaf
    (no children) the bonus token is drawn from p. The emitted tokens follow p_target exactly.

    target_probs: `[R, N, V]` (row i predicts node i's children). sibling_probs: `[R, N, V]`, q_k for node j = the
    distribution node j's token was drawn from given its parent and earlier siblings (`sibling_draft_probs`);
    None = every child was chosen deterministically (top-k, lookup), q_k = δ_{x_k}: accept x_k w.p. r_k(x_k), on
    rejection zero x_k and renormalise (closed form, no loop). max_siblings bounds the rank loop (default N − 1).
    The tree's shape must not depend on the sampled tokens it holds (a deterministic tree always qualifies).
    """
    rows, nodes = tree.tokens.shape
    uniform = torch.rand(rows, nodes, device=target_probs.device, generator=generator, dtype=target_probs.dtype)
    if sibling_probs is None:
        accepted = _point_mass_coins(tree, target_probs, uniform)
    else:
        siblings = nodes - 1 if max_siblings is None else max_siblings
        accepted, final_residual = _recursive_coins(tree, target_probs, sibling_probs, uniform, siblings)
    leaf, path, count = _walk(tree, _first_among_siblings(tree, accepted & tree.valid))
    if sibling_probs is None:
        next_dist = _point_mass_residual(tree, target_probs, leaf)
    else:
        next_dist = final_residual[torch.arange(rows, device=leaf.device), leaf]
    next_token = torch.multinomial(next_dist, 1, generator=generator).squeeze(1)
    return TreeVerificationResult(leaf, path, count, next_token)


def sibling_draft_probs(tree: DraftTree, child_probs: torch.Tensor, replacement: bool = False) -> torch.Tensor:
    """q_k for each node: q(·|parent) with the earlier siblings' tokens zeroed and renormalised (without
    replacement), or q(·|parent) itself (i.i.d. draws, replacement=True; duplicate siblings then stay separate nodes).

    child_probs: `[R, N, V]`, row i = the distribution node i's children were drawn from. Returns `[R, N, V]`
    (row 0, the anchor, is zeros: it is nobody's child).
    """
    vocab = child_probs.shape[-1]
    parent = tree.parents.clamp_min(0)
    q_parent = child_probs.gather(1, parent[..., None].expand(-1, -1, vocab))
    q_parent = q_parent * (tree.parents >= 0)[..., None]
    if replacement:
        return q_parent
    nodes = tree.num_nodes
    same_parent = (tree.parents[:, :, None] == tree.parents[:, None, :]) & tree.valid[:, None, :]
    earlier = (same_parent & torch.ones(nodes, nodes, dtype=torch.bool, device=parent.device).tril(-1))
    taken = torch.zeros_like(q_parent).scatter_add_(
        2, tree.tokens[:, None, :].expand(-1, nodes, -1), earlier.to(q_parent.dtype)
    ) > 0  # taken[r, j, v]: an earlier sibling of j holds token v
    kept = q_parent.masked_fill(taken, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True).clamp_min(1e-30)
