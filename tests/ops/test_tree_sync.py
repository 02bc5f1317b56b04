"""The tree functions never wait for the device: zero host-device sync points (`diagnostics.SyncCounter`), so the
round keeps its one packed download."""

import torch

from hf_dspark.diagnostics import SyncCounter
from hf_dspark.ops.tree import (
    ancestor_mask,
    build_tree,
    chain_tree,
    merge_branch,
    position_ids,
    restrict_tree,
)
from hf_dspark.ops.tree_verification import sibling_draft_probs, verify_tree_greedy, verify_tree_sampling
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling.tree_budget import choose_tree_budget

ROWS, GAMMA, VOCAB = 3, 3, 11


def _assert_no_sync(counter: SyncCounter) -> None:
    assert counter.total == 0, [(event.kind, event.site) for event in counter.events]


def test_shaping_and_structure_do_not_sync():
    gen = torch.Generator().manual_seed(0)
    slot_probs = torch.softmax(torch.randn(ROWS, GAMMA, VOCAB, generator=gen), -1)
    confidence = torch.rand(ROWS, GAMMA, generator=gen)
    anchor = torch.randint(0, VOCAB, (ROWS,), generator=gen)
    branch = torch.randint(0, VOCAB, (ROWS, 4), generator=gen)

    transition = torch.randn(VOCAB, VOCAB, generator=gen)

    def child_fn(depth, parent_tokens, beam_parent):  # a Markov head: the parent's token shifts the logits
        probs = torch.softmax(slot_probs[:, depth, None].log() + transition[parent_tokens], -1)
        return probs, confidence[:, depth, None].expand(parent_tokens.shape)

    with SyncCounter(record_sites=True) as counter:
        proposal = build_tree(anchor, slot_probs, confidence, budget=7, sibling_cap=3)
        build_tree(anchor, child_fn, None, budget=7, depth=GAMMA, sibling_cap=2)
        tree = proposal.tree
        ancestor_mask(tree)
        position_ids(tree, torch.arange(ROWS) + 5)
        merge_branch(tree, branch, torch.tensor([4, 2, 0]))
        chain_tree(branch, torch.tensor([1, 2, 3]), anchor)
        choice = choose_tree_budget(tree, proposal.score, StepCurve([1, 8, 64], [1.0, 0.9, 0.2]))
        restrict_tree(tree, choice.keep, 4)
    _assert_no_sync(counter)


def test_verification_does_not_sync():
    gen = torch.Generator().manual_seed(1)
    slot_probs = torch.softmax(torch.randn(ROWS, GAMMA, VOCAB, generator=gen), -1)
    tree = build_tree(torch.zeros(ROWS, dtype=torch.long), slot_probs, torch.rand(ROWS, GAMMA, generator=gen), 8).tree
    target_probs = torch.softmax(torch.randn(ROWS, tree.num_nodes, VOCAB, generator=gen), -1)
    child_probs = torch.softmax(torch.randn(ROWS, tree.num_nodes, VOCAB, generator=gen), -1)
    with SyncCounter(record_sites=True) as counter:
        verify_tree_greedy(tree, target_probs.log())
        verify_tree_sampling(tree, target_probs, generator=gen)
        verify_tree_sampling(tree, target_probs, sibling_draft_probs(tree, child_probs), generator=gen, max_siblings=4)
    _assert_no_sync(counter)
