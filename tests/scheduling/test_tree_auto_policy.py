"""`auto`'s tree sizing (`AutoPolicy.tree_node_cap`, `shape_tree`): the budget shrinks with load on a saturating
curve, and per row the plan is a tree, a chain or nothing, by Θ = τ·SPS(B)."""

import torch

from hf_dspark.ops.tree import draft_tree
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling.verification_policy import VerificationPolicy

FLAT = StepCurve([1, 4096], [1.0, 1.0])
KNEE = StepCurve([1, 16], [1.0, 1.0])  # flat to 16 tokens, SPS ∝ 1/B beyond
SATURATED = StepCurve([1], [1.0])  # SPS ∝ 1/B from one token on: a forward's cost grows with every token


def _rule(curve):
    return VerificationPolicy("auto", block_size=4, step_curve=curve, draft_curve=FLAT, measured_costs=False).rule


def _tree():
    """anchor → a (0.9) → c (0.8); anchor → b (0.5): a tree of three drafts whose argmax chain is a → c."""
    tokens = torch.tensor([[7, 1, 2, 3]])
    parents = torch.tensor([[-1, 0, 0, 1]])
    return draft_tree(tokens, parents, torch.ones(1, 4, dtype=torch.bool)), torch.tensor([[1.0, 0.9, 0.5, 0.72]])


def test_the_node_budget_shrinks_with_load():
    rule = _rule(KNEE)
    assert rule.supports_trees
    assert [rule.tree_node_cap(rows, 15) for rows in (1, 2, 8, 16, 17)] == [15, 7, 1, 0, 0]
    assert _rule(FLAT).tree_node_cap(64, 15) == 15


def test_shape_tree_picks_a_tree_a_chain_or_nothing():
    tree, score = _tree()
    keep = _rule(FLAT).shape_tree(tree, score)
    assert bool(keep.use_tree) and keep.keep.tolist() == [[True, True, True, True]] and keep.num_nodes.tolist() == [3]
    two = StepCurve([1, 3], [1.0, 1.0])  # three tokens cost one step: the two best nodes, the chain a → c
    chain = _rule(two).shape_tree(tree, score)
    assert chain.keep.tolist() == [[True, True, False, True]] and chain.num_nodes.tolist() == [2]
    nothing = _rule(SATURATED).shape_tree(tree, score)
    assert nothing.num_nodes.tolist() == [0] and nothing.keep.tolist() == [[True, False, False, False]]
