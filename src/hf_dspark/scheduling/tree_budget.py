"""The cost model's choice between no draft, a chain and a draft tree per row (docs/method.md, "Draft trees").

A round that verifies n_r drafts in row r (a tree's nodes beyond the anchor, or a chain's ℓ_r) costs one target
forward over B = Σ_r (1 + n_r) tokens, priced by the step curve, and commits on average
τ = Σ_r (1 + Σ_{kept nodes i} s_{r,i}) tokens, where s_{r,i} = P(node i is reached and accepted) is the product of
the per-node acceptance estimates along its path (`TreeProposal.score`). Θ = τ·SPS(B) is expected tokens per
second. Because s is non-increasing along every path, a row's best n-node tree is its n best-scored nodes (that
set is closed under ancestors), so the choice is Algorithm 1 on the flattened node list: sort every (row, node)
candidate by s descending, Θ(m) after the first m of them, keep the best m. A chain is the special case whose
candidates are the first-child path; a tree pays its own step curve when the tree-mask forward is slower. Pure
functions, no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.tree import DraftTree, ancestor_mask
from ..ops.tree_verification import sibling_ranks
from ..profiling.step_curve import StepCurve


@dataclass
class TreeBudgetChoice:
    """The round's plan.

    Args:
        keep (`torch.BoolTensor` `[R, N]`): the nodes each row verifies (the anchor always; a prefix-closed set).
        num_nodes (`torch.LongTensor` `[R]`): drafts verified per row (0 = the row decodes plainly this round).
        use_tree (`torch.BoolTensor` scalar): True when the best plan verifies trees, False for chains.
        expected_tokens (`torch.Tensor` scalar): τ of the plan (float64).
        tokens_per_second (`torch.Tensor` scalar): Θ = τ·SPS(B) of the plan (float64).
    """

    keep: torch.Tensor
    num_nodes: torch.Tensor
    use_tree: torch.Tensor
    expected_tokens: torch.Tensor
    tokens_per_second: torch.Tensor


def first_child_chain(tree: DraftTree) -> torch.Tensor:
    """chain[r, i] = every node on anchor → i is its parent's first child: `[R, N]` bool (the argmax chain)."""
    first = (sibling_ranks(tree) == 0) | (tree.parents < 0)
    return ~(ancestor_mask(tree) & ~first[:, None, :]).any(dim=-1) & tree.valid


def _best_prefix(score: torch.Tensor, eligible: torch.Tensor, step_curve: StepCurve, causal: bool):
    """Θ(m) = (R + Σ_{first m} s)·SPS(R + m) over the eligible candidates sorted by s (ties: lower node index, then
    lower row). Returns (keep `[R, N]` with the anchor, Θ, τ) of the best m (the first non-improving m when causal).
    """
    rows, nodes = score.shape
    values = score.to(torch.float64).clamp_min(0.0).masked_fill(~eligible, -1.0)
    values[:, 0] = -1.0  # the anchor is always verified; it is not a candidate
    flat = values.t().reshape(-1)  # node-major: on ties a parent (lower index) ranks before its children
    ordered, order = torch.sort(flat, descending=True, stable=True)
    positive = ordered > 0
    gains = torch.where(positive, ordered, torch.zeros_like(ordered))
    tau = rows + torch.cat([gains.new_zeros(1), gains.cumsum(0)])
    batch_tokens = rows + torch.arange(flat.numel() + 1, device=flat.device)
    theta = tau * step_curve.steps_per_second_at(batch_tokens)
    admissible = torch.cat([positive.new_ones(1), positive])  # m candidates, all with s > 0
    theta = torch.where(admissible, theta, torch.full_like(theta, -1.0))
    if causal:
        stops = torch.cat([(theta[1:] <= theta[:-1]), torch.ones(1, dtype=torch.bool, device=flat.device)])
        count = torch.argmax(stops.to(torch.uint8))
    else:
        count = torch.argmax(theta)  # the first maximum: the smallest best plan
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(), device=flat.device))
    keep = (rank < count).reshape(nodes, rows).t().clone()
    keep[:, 0] = True
    return keep, theta.gather(0, count[None])[0], tau.gather(0, count[None])[0]


def choose_tree_budget(
    tree: DraftTree,
    score: torch.Tensor,
    step_curve: StepCurve,
    tree_step_curve: StepCurve | None = None,
    causal: bool = False,
) -> TreeBudgetChoice:
    """argmax over plans of Θ = (Σ_r 1 + Σ_{kept} s_{r,i})·SPS(Σ_r (1 + n_r)): no draft, chains, or trees per row.

    tree: the proposed trees at the largest budget the drafter built (`build_tree`); score: `[R, N]`
    `TreeProposal.score`; step_curve: SPS of chain verification; tree_step_curve: SPS of tree-mask verification
    (None: the same curve, and a tree then never loses to a chain). causal: stop at the first candidate that does
    not raise Θ (Algorithm 1's early stop) instead of the best prefix; needed only when the tree holds sampled
    drafts (a deterministic `build_tree` tree may be cut anywhere, see docs/method.md).
    Every row's kept nodes are its best-scored ones: restrict the tree with `ops.tree.restrict_tree(tree, keep)`.
    """
    if score.shape != tree.tokens.shape:
        raise ValueError(f"score must be [R, N] = {tuple(tree.tokens.shape)} like the tree; got {tuple(score.shape)}.")
    chain_keep, chain_theta, chain_tau = _best_prefix(score, first_child_chain(tree), step_curve, causal)
    tree_curve = step_curve if tree_step_curve is None else tree_step_curve
    tree_keep, tree_theta, tree_tau = _best_prefix(score, tree.valid, tree_curve, causal)
    use_tree = tree_theta > chain_theta
    keep = torch.where(use_tree, tree_keep, chain_keep)
    return TreeBudgetChoice(
        keep=keep,
        num_nodes=keep.sum(dim=1) - 1,
        use_tree=use_tree,
        expected_tokens=torch.where(use_tree, tree_tau, chain_tau),
        tokens_per_second=torch.where(use_tree, tree_theta, chain_theta),
    )


def node_budget_cap(step_curve: StepCurve, rows: int, max_nodes: int) -> int:
    """n_max(R) = the smallest argmax_{0≤n≤max_nodes} R(1 + n)·SPS(R(1 + n)): drafts per row worth building.

    Even if every node were accepted (s = 1), Θ cannot grow past n_max drafts per row at this load, so the drafter
    builds trees of budget 1 + n_max nodes; the cap shrinks as R grows on a saturating curve. Host arithmetic on
    the curve's table (a Python int: it sizes tensors).
    """
    if rows < 1 or max_nodes < 0:
        raise ValueError(f"node_budget_cap needs rows ≥ 1 and max_nodes ≥ 0; got {rows} and {max_nodes}.")
    best, best_theta = 0, -1.0
    for nodes in range(max_nodes + 1):
        batch_tokens = rows * (1 + nodes)
        theta = batch_tokens * step_curve.steps_per_second_at(batch_tokens)
        if theta > best_theta * (1 + 1e-12):
            best, best_theta = nodes, theta
    return best
