"""The cost model's tree/chain/no-draft choice (scheduling/tree_budget.py) against brute force over every plan."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_dspark.ops.tree import ancestor_mask, build_tree, restrict_tree
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling.tree_budget import choose_tree_budget, first_child_chain, node_budget_cap


def _proposal(seed: int, rows: int, budget: int, gamma: int = 3, cap: int = 2):
    gen = torch.Generator().manual_seed(seed)
    slot_probs = torch.softmax(2 * torch.randn(rows, gamma, 8, generator=gen), -1)
    confidence = torch.rand(rows, gamma, generator=gen)
    return build_tree(torch.zeros(rows, dtype=torch.long), slot_probs, confidence, budget, sibling_cap=cap)


def _curve(seed: int, points: int = 40) -> StepCurve:
    """A saturating random curve: SPS(B) non-increasing, flat at first, then ~1/B."""
    gen = torch.Generator().manual_seed(seed)
    knee = 1 + int(torch.randint(1, 12, (1,), generator=gen))
    sps = [1.0 / max(1.0, b / knee) * (1 - 0.02 * float(torch.rand(1, generator=gen))) for b in range(1, points + 1)]
    return StepCurve(list(range(1, points + 1)), sorted(sps, reverse=True))


def _closed_subsets(tree, row: int, allowed: torch.Tensor):
    """Every ancestor-closed set of allowed nodes of one row (the anchor always in)."""
    nodes = [i for i in range(1, tree.num_nodes) if tree.valid[row, i] and allowed[row, i]]
    for size in range(len(nodes) + 1):
        for subset in itertools.combinations(nodes, size):
            chosen = {0, *subset}
            if all(int(tree.parents[row, i]) in chosen for i in subset):
                yield chosen


def _brute_theta(tree, score, curve, allowed) -> float:
    rows = tree.num_rows
    per_row = [list(_closed_subsets(tree, r, allowed)) for r in range(rows)]
    best = -1.0
    for plan in itertools.product(*per_row):
        tau = sum(1 + sum(float(score[r, i]) for i in chosen if i) for r, chosen in enumerate(plan))
        batch = sum(len(chosen) for chosen in plan)
        best = max(best, tau * curve.steps_per_second_at(batch))
    return best


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 2), budget=st.integers(1, 6))
def test_choice_is_the_best_plan(seed, rows, budget):
    proposal = _proposal(seed, rows, budget)
    tree, score = proposal.tree, proposal.score
    curve = _curve(seed)
    choice = choose_tree_budget(tree, score, curve)
    brute = _brute_theta(tree, score, curve, tree.valid)
    assert float(choice.tokens_per_second) == pytest.approx(brute, rel=1e-9)
    keep = choice.keep
    assert keep[:, 0].all() and not (keep & ~tree.valid).any()
    assert not (ancestor_mask(tree) & keep[:, :, None] & ~keep[:, None, :]).any()  # closed under ancestors
    assert torch.equal(choice.num_nodes, keep.sum(1) - 1)
    tau = (score * keep).sum() .double()
    assert float(choice.expected_tokens) == pytest.approx(float(tau), rel=1e-6)
    causal = choose_tree_budget(tree, score, curve, causal=True)
    assert float(causal.tokens_per_second) <= float(choice.tokens_per_second) + 1e-12


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(2, 6))
def test_chains_win_when_trees_verify_slower(seed, budget):
    proposal = _proposal(seed, 2, budget)
    tree, score = proposal.tree, proposal.score
    curve = _curve(seed)
    slow = StepCurve(curve.batch_tokens, [s * 0.6 for s in curve.steps_per_second])
    choice = choose_tree_budget(tree, score, curve, tree_step_curve=slow)
    chain = first_child_chain(tree)
    best_chain = _brute_theta(tree, score, curve, chain)
    best_tree = 0.6 * _brute_theta(tree, score, curve, tree.valid)
    assert float(choice.tokens_per_second) == pytest.approx(max(best_chain, best_tree), rel=1e-9)
    assert bool(choice.use_tree) == (best_tree > best_chain * (1 + 1e-12))
    if not choice.use_tree:
        assert not (choice.keep & ~chain).any()


def test_first_child_chain_is_the_argmax_path():
    proposal = _proposal(3, 2, 9, gamma=3, cap=3)
    tree = proposal.tree
    chain = first_child_chain(tree)
    assert (chain.sum(1) == 4).all()  # anchor + γ argmax drafts, kept first by best-first shaping
    assert torch.equal(tree.depth.masked_fill(~chain, -1).sort(1, descending=True).values[:, :4],
                       torch.tensor([[3, 2, 1, 0]] * 2))


def test_the_budget_shrinks_with_load():
    sizes = list(range(1, 257))  # flat to B = 8, then B·SPS(B) falls as B^-1/2: a saturated target
    curve = StepCurve(sizes, [min(1.0, (8 / b) ** 1.5) for b in sizes])
    caps = [node_budget_cap(curve, rows, 15) for rows in (1, 2, 4, 8, 16)]
    assert caps == [7, 3, 1, 0, 0], caps
    proposal = _proposal(0, 1, 16, gamma=4, cap=4)
    kept = []
    for rows in (1, 2, 4, 8, 16):
        tree = proposal.tree
        fields = (tree.tokens, tree.parents, tree.valid, tree.depth)
        repeated = type(tree)(*(t.expand(rows, -1).clone() for t in fields))
        choice = choose_tree_budget(repeated, proposal.score.expand(rows, -1), curve)
        kept.append(float(choice.num_nodes.double().mean()))
    assert kept == sorted(kept, reverse=True) and kept[0] > kept[-1], kept


def test_no_draft_when_nothing_pays():
    proposal = _proposal(1, 3, 6)
    steep = StepCurve([1, 3, 4, 40], [1.0, 1.0, 0.5, 0.05])  # any extra token halves the speed
    choice = choose_tree_budget(proposal.tree, proposal.score * 0.1, steep)
    assert choice.num_nodes.tolist() == [0, 0, 0] and float(choice.expected_tokens) == 3.0


def test_kept_nodes_compact_into_a_smaller_tree():
    proposal = _proposal(5, 3, 8)
    choice = choose_tree_budget(proposal.tree, proposal.score, _curve(2))
    width = int(choice.num_nodes.max()) + 1
    small, source = restrict_tree(proposal.tree, choice.keep, width)
    assert small.num_nodes == width
    assert torch.equal(small.valid.sum(1) - 1, choice.num_nodes)
    assert torch.equal(small.tokens[small.valid], proposal.tree.tokens.gather(1, source.clamp_min(0))[small.valid])
    with pytest.raises(ValueError, match="num_nodes"):
        restrict_tree(proposal.tree, choice.keep, 99)
    with pytest.raises(ValueError, match="score"):
        choose_tree_budget(proposal.tree, proposal.score[:, :2], _curve(2))
