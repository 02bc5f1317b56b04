"""The drafter's tree proposal: one block forward, per-branch sequential-head distributions, the node budget."""

import pytest
import torch

from hf_dspark.model.tree_proposal import propose_tree, proposes_trees
from hf_dspark.ops.tree import check_tree
from tests.helpers import make_drafter, make_target, tapped_features


def _drafter_and_context(head_type: str, **overrides):
    target = make_target()
    drafter = make_drafter(target, head_type=head_type, **overrides)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 96, (3, 9), generator=gen)
    features = tapped_features(target, ids[:, :-1], drafter.config.target_layer_ids)
    cache = drafter.init_cache(3)
    drafter.extend_context(cache, features, torch.ones(3, 8, dtype=torch.bool))
    return drafter, cache, ids[:, -1]


@pytest.mark.parametrize("head_type", ["markov", "rnn", "none"])
def test_a_one_child_tree_is_the_greedy_chain(head_type):
    drafter, cache, anchor = _drafter_and_context(head_type)
    gamma = drafter.config.block_size
    chain = drafter.propose(anchor, cache).draft_ids
    proposal = propose_tree(drafter, anchor, cache, gamma + 1, sibling_cap=1)
    check_tree(proposal.tree)
    assert torch.equal(proposal.tree.tokens[:, 1:], chain)
    assert proposal.tree.parents[:, 1:].tolist() == [list(range(gamma))] * 3


@pytest.mark.parametrize("head_type", ["markov", "rnn"])
def test_each_branch_gets_its_own_sequential_bias(head_type):
    """Siblings at depth 1 get different child distributions: the sequential head conditions on the branch's own
    token (a strong Markov projection makes the difference visible); for the Markov head each node's best child is
    argmax(U_{d+1} + W2ᵀ W1[x_node])."""
    drafter, cache, anchor = _drafter_and_context(head_type)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.mul_(200.0)
        drafter.markov_head.markov_w1.weight.mul_(20.0)
    tree = propose_tree(drafter, anchor, cache, 12, sibling_cap=2, beam_width=2).tree
    check_tree(tree)
    assert bool(tree.valid.all())
    kids = {(r, i): [j for j in range(12) if int(tree.parents[r, j]) == i] for r in range(3) for i in range(12)}
    firsts = [[int(tree.tokens[r, kids[r, i][0]]) for i in kids[r, 0] if kids[r, i]] for r in range(3)]
    assert any(len(set(f)) > 1 for f in firsts)
    if head_type == "markov":
        with torch.no_grad():
            base = drafter.lm_logits(drafter.block_hidden_states(anchor, cache))
            for (r, i), children in kids.items():
                if children and i > 0:
                    parent_token = tree.tokens[r, i]
                    bias = drafter.markov_head.markov_w2(drafter.markov_head.markov_w1(parent_token))
                    best = int((base[r, int(tree.depth[r, i])] + bias).argmax())
                    assert int(tree.tokens[r, children[0]]) == best


def test_without_a_sequential_head_branches_share_the_slot_distribution():
    drafter, cache, anchor = _drafter_and_context("none")
    tree = propose_tree(drafter, anchor, cache, 20, sibling_cap=2, beam_width=2).tree
    for r in range(3):
        at_depth_1 = [j for j in range(20) if int(tree.parents[r, j]) == 0]
        kids = [sorted(int(tree.tokens[r, j]) for j in range(20) if int(tree.parents[r, j]) == i) for i in at_depth_1]
        assert kids[0] == kids[1]


def test_node_budget_and_scores():
    drafter, cache, anchor = _drafter_and_context("markov")
    proposal = propose_tree(drafter, anchor, cache, 6)
    assert proposal.tree.num_nodes == 6 and bool(proposal.tree.valid.all())
    assert bool((proposal.score[:, 0] == 1).all()) and bool((proposal.score[:, 1:] <= 1).all())
    assert proposes_trees(drafter) and not proposes_trees(object())


def test_history_reading_processors_are_refused():
    drafter, cache, anchor = _drafter_and_context("markov")

    def reads_ids(k, drafts, logits):
        return logits

    with pytest.raises(ValueError, match="history-free"):
        propose_tree(drafter, anchor, cache, 6, logits_processor=reads_ids)
