"""Draft trees (hf_dspark.ops.tree): masks, depths and positions against brute force; shaping; merging branches."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_dspark.ops.tree import (
    DraftTree,
    ancestor_mask,
    build_tree,
    chain_tree,
    check_tree,
    children_mask,
    draft_tree,
    merge_branch,
    path_mask,
    path_nodes,
    position_ids,
    sibling_acceptance,
)


def _random_tree(seed: int, rows: int, nodes: int, vocab: int = 50, pad_prob: float = 0.3) -> DraftTree:
    """Random topological parents; a node is padding with probability pad_prob (its descendants too)."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.full((rows, nodes), -1, dtype=torch.long)
    valid = torch.zeros(rows, nodes, dtype=torch.bool)
    valid[:, 0] = True
    for i in range(1, nodes):
        parents[:, i] = (torch.rand(rows, generator=gen) * i).long()
        alive = valid.gather(1, parents[:, i, None]).squeeze(1)
        valid[:, i] = alive & (torch.rand(rows, generator=gen) >= pad_prob)
    tokens = torch.randperm(vocab, generator=gen)[:nodes].expand(rows, -1).clone()  # distinct: siblings are too
    return draft_tree(tokens, parents, valid)


def _brute_ancestors(tree: DraftTree) -> torch.Tensor:
    rows, nodes = tree.tokens.shape
    out = torch.zeros(rows, nodes, nodes, dtype=torch.bool)
    for r, i in itertools.product(range(rows), range(nodes)):
        out[r, i, i] = True
        if not tree.valid[r, i]:
            continue
        j = int(tree.parents[r, i])
        while j >= 0:
            out[r, i, j] = True
            j = int(tree.parents[r, j])
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 4), nodes=st.integers(1, 17))
def test_mask_depth_positions_match_brute_force(seed, rows, nodes):
    tree = _random_tree(seed, rows, nodes)
    check_tree(tree)
    brute = _brute_ancestors(tree)
    assert torch.equal(ancestor_mask(tree), brute)
    assert torch.equal(tree.depth, brute.sum(-1) - 1)
    # a valid node's depth is its parent's + 1; padding sees only itself, nobody sees padding
    real = tree.valid[:, 1:]
    parent_depth = tree.depth.gather(1, tree.parents[:, 1:].clamp_min(0))
    assert torch.equal(tree.depth[:, 1:][real], (parent_depth + 1)[real])
    pad = ~tree.valid
    assert not (brute & pad[:, None, :] & ~torch.eye(nodes, dtype=torch.bool)).any()
    base = torch.arange(rows) * 7 + 3
    assert torch.equal(position_ids(tree, base), base[:, None] + tree.depth)
    for r, i in itertools.product(range(rows), range(nodes)):
        if tree.valid[r, i]:
            expected = [j for j in range(nodes) if brute[r, i, j]]
            path, count = path_nodes(tree, torch.full((rows,), i))
            assert path[r, : count[r]].tolist() == expected and count[r] == tree.depth[r, i] + 1
            assert torch.equal(path_mask(tree, torch.full((rows,), i))[r], brute[r, i])


def test_chain_tree_is_the_causal_chain():
    drafts = torch.tensor([[4, 5, 6], [7, 8, 9]])
    tree = chain_tree(drafts, torch.tensor([1, 3]), anchor=torch.tensor([1, 2]))
    check_tree(tree)
    assert tree.tokens.tolist() == [[1, 4, 0, 0], [2, 7, 8, 9]]
    assert tree.valid.tolist() == [[True, True, False, False], [True] * 4]
    assert tree.depth.tolist() == [[0, 1, 0, 0], [0, 1, 2, 3]]
    assert torch.equal(ancestor_mask(tree)[1], torch.ones(4, 4, dtype=torch.bool).tril())
    assert children_mask(tree)[1].nonzero().tolist() == [[0, 1], [1, 2], [2, 3]]


@pytest.mark.parametrize(
    "parents, tokens, message",
    [
        ([[-1, 0, 2]], [[1, 2, 3]], "topological"),
        ([[-1, 0, 0]], [[1, 2, 2]], "distinct"),
        ([[0, 0, 0]], [[1, 2, 3]], "anchor"),
    ],
)
def test_check_tree_names_the_broken_invariant(parents, tokens, message):
    tree = DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.ones(1, 3, dtype=torch.bool),
                     torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=message):
        check_tree(tree)


def test_sibling_acceptance_is_calibrated_and_bounded():
    top = torch.tensor([[0.5, 0.3, 0.1], [0.9, 0.1, 0.0]])
    accept = sibling_acceptance(top, torch.tensor([0.6, 0.95]))
    assert torch.allclose(accept[0], torch.tensor([0.6, 0.4 * 0.6, 0.4 * 0.2]))
    assert torch.allclose(accept[1], torch.tensor([0.95, 0.05, 0.0]))
    assert (accept.sum(-1) <= 1 + 1e-6).all()


def _tree_paths(tree: DraftTree, row: int = 0) -> dict[tuple, int]:
    """{token path (anchor excluded): node index} of one row's valid nodes."""
    out = {}
    for i in range(tree.num_nodes):
        if tree.valid[row, i]:
            path, count = path_nodes(tree, torch.full((tree.num_rows,), i))
            out[tuple(tree.tokens[row, path[row, 1 : count[row]]].tolist())] = i
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), gamma=st.integers(1, 3), cap=st.integers(1, 3), budget=st.integers(1, 12))
def test_build_tree_keeps_the_best_scored_paths(seed, gamma, cap, budget):
    """With a beam wide enough to expand everything, the tree is the budget − 1 best of all top-k paths."""
    gen = torch.Generator().manual_seed(seed)
    vocab = 6
    slot_probs = torch.softmax(3 * torch.randn(1, gamma, vocab, generator=gen), -1)
    confidence = torch.rand(1, gamma, generator=gen)
    proposal = build_tree(torch.tensor([9]), slot_probs, confidence, budget, sibling_cap=cap, beam_width=cap**gamma)
    tree = proposal.tree
    check_tree(tree)
    top_q, top_tok = slot_probs[0].topk(cap, -1)
    accept = sibling_acceptance(top_q, confidence[0])
    candidates = {}
    for length in range(1, gamma + 1):
        for ranks in itertools.product(range(cap), repeat=length):
            path = tuple(int(top_tok[d, k]) for d, k in enumerate(ranks))
            candidates[path] = float(torch.prod(torch.stack([accept[d, k] for d, k in enumerate(ranks)])))
    best = sorted(candidates.values(), reverse=True)[: budget - 1]
    kept = _tree_paths(tree)
    assert len(kept) == 1 + len(best) and tree.valid.sum() == len(kept)
    for path, node in kept.items():
        if path:
            assert proposal.score[0, node] == pytest.approx(candidates[path], rel=1e-5)
            assert candidates[path] >= min(best) - 1e-6
    assert torch.allclose(
        proposal.score[0, tree.valid[0]],
        torch.stack([proposal.acceptance[0, path_nodes(tree, torch.tensor([i]))[0][0, : tree.depth[0, i] + 1]].prod()
                     for i in range(tree.num_nodes) if tree.valid[0, i]]),
    )


def test_build_tree_conditions_children_on_their_branch():
    """A recurrent child_fn: each node's children are the top-k of q(· | its whole path), tracked by beam_parent."""
    vocab, gamma, cap = 5, 3, 2

    def q_of(path: tuple) -> torch.Tensor:
        gen = torch.Generator().manual_seed(hash(path) % 2**31)
        return torch.softmax(2 * torch.randn(vocab, generator=gen), -1)

    frontier_paths = [[(7,)], [(8,)]]  # per row: the token paths of the current frontier (anchor first)

    def child_fn(depth, parent_tokens, beam_parent):
        rows, width = parent_tokens.shape
        if depth > 0:
            for r in range(rows):
                frontier_paths[r] = [frontier_paths[r][int(beam_parent[r, m])] + (int(parent_tokens[r, m]),)
                                     for m in range(width)]
        probs = torch.stack([torch.stack([q_of(frontier_paths[r][m]) for m in range(width)]) for r in range(rows)])
        return probs, torch.full((rows, width), 0.7)

    proposal = build_tree(torch.tensor([7, 8]), child_fn, None, budget=9, depth=gamma, sibling_cap=cap)
    tree = proposal.tree
    check_tree(tree)
    for r in range(2):
        anchor = int(tree.tokens[r, 0])
        for path, node in _tree_paths(tree, r).items():
            children = [int(tree.tokens[r, j]) for j in range(tree.num_nodes)
                        if tree.valid[r, j] and tree.parents[r, j] == node]
            top = q_of((anchor, *path)).topk(cap).indices.tolist()
            assert children == top[: len(children)], (path, children, top)  # kept in rank order


def test_build_tree_pads_small_pools_and_checks_arguments():
    slot_probs = torch.softmax(torch.randn(2, 1, 4), -1)
    proposal = build_tree(torch.tensor([1, 2]), slot_probs, torch.ones(2, 1), budget=6, sibling_cap=2)
    assert proposal.tree.valid.tolist() == [[True, True, True, False, False, False]] * 2
    assert (proposal.score[:, 3:] == 0).all()
    with pytest.raises(ValueError, match="budget"):
        build_tree(torch.tensor([1]), slot_probs[:1], None, budget=0)
    with pytest.raises(ValueError, match="confidence"):
        build_tree(torch.tensor([1]), slot_probs[:1], None, budget=3)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 3), nodes=st.integers(1, 9), length=st.integers(1, 4))
def test_merge_branch_shares_the_common_prefix(seed, rows, nodes, length):
    tree = _random_tree(seed, rows, nodes, vocab=4 * nodes + 8, pad_prob=0.1)
    gen = torch.Generator().manual_seed(seed + 1)
    branch = torch.randint(0, 4, (rows, length), generator=gen)
    for r in range(rows):  # half the time the branch starts down an existing path
        path, count = path_nodes(tree, torch.full((rows,), nodes - 1))
        if seed % 2 and tree.valid[r, nodes - 1]:
            shared = tree.tokens[r, path[r, 1 : count[r]]][:length]
            branch[r, : len(shared)] = shared
    branch_len = torch.randint(0, length + 1, (rows,), generator=gen)
    merged, branch_nodes = merge_branch(tree, branch, branch_len)
    check_tree(merged)
    assert torch.equal(merged.tokens[:, :nodes], tree.tokens) and torch.equal(merged.parents[:, :nodes], tree.parents)
    for r in range(rows):
        before = _tree_paths(tree, r)
        after = _tree_paths(merged, r)
        live = branch[r, : branch_len[r]].tolist()
        for k in range(1, len(live) + 1):
            assert tuple(live[:k]) in after
            assert after[tuple(live[:k])] == branch_nodes[r, k - 1]
        assert (branch_nodes[r, branch_len[r]:] == -1).all()
        new = {path for path in after if path not in before}
        assert new == {tuple(live[:k]) for k in range(1, len(live) + 1)} - set(before)
