"""One target forward verifies a draft tree; committing its accepted path leaves the cache as plain decoding would.

For every family of the matrix (tests/generation/test_families.py): the fp32 logits at each tree node equal those
of a plain forward over the row's prompt followed by the node's root-to-node chain, and after `commit_path` the
next plain step's logits equal those of plain decoding of the same tokens. Dynamic (ragged) and static caches,
SDPA (through the packed grouped-query attention) and eager attention.
"""

import pytest
import torch

from hf_dspark.generation.prefill import prefill_target
from hf_dspark.ops.tree import ancestor_mask, draft_tree, path_nodes
from hf_dspark.target.static_cache import StaticPlan
from hf_dspark.target.tree_forward import TreeSlots, gather_new_slots, path_slot_order, tree_support
from tests.generation.test_families import FAMILIES, make_family
from tests.helpers import ragged_prompts

ATOL = 2e-5
# three rows, seven node slots: a bushy tree, a chain with padding, and a tree with a padded slot in the middle
PARENTS = torch.tensor([
    [-1, 0, 0, 1, 1, 2, 3],
    [-1, 0, 1, 2, -1, -1, -1],
    [-1, 0, 0, 0, -1, 3, 5],
])


def _tree(seed: int):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 96, PARENTS.shape, generator=gen)
    valid = PARENTS >= 0
    valid[:, 0] = True
    return draft_tree(tokens, PARENTS.clone(), valid)


def _chain(tree, row: int, node: int) -> list[int]:
    """Tokens of the anchor → node path of `row`."""
    path = []
    while node >= 0:
        path.append(int(tree.tokens[row, node]))
        node = int(tree.parents[row, node])
    return path[::-1]


def _plain_last_logits(model, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    ids = torch.cat([prompt, torch.tensor(tokens, dtype=torch.long)])[None]
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].float()


def _prefill(model, ids, mask, static: bool):
    plan = StaticPlan(ids.shape[1] + 32, 8) if static else None
    with torch.no_grad():
        return prefill_target(model, ids, mask, None, None, [], static=plan)


def _check_tree_then_step(model, static: bool = False):
    ids, mask = ragged_prompts(3, seed=11, min_len=4, max_len=14)
    prompts = [ids[a][mask[a].bool()] for a in range(3)]
    target = _prefill(model, ids, mask, static).target
    tree = _tree(seed=3)
    slots = TreeSlots(tree.depth, ancestor_mask(tree))
    with torch.no_grad():
        out = target.forward(model, tree.tokens, tree.valid, [], tree=slots)
    for a in range(3):
        for node in range(tree.num_nodes):
            if tree.valid[a, node]:
                expected = _plain_last_logits(model, prompts[a], _chain(tree, a, node))
                torch.testing.assert_close(out.logits[a, node], expected, atol=ATOL, rtol=0)
    # commit the path to each row's last valid node, then one plain step past it
    leaf = torch.tensor([6, 3, 6])
    nodes, count = path_nodes(tree, leaf)
    target.commit_path(tree.num_nodes, path_slot_order(nodes, tree.num_nodes), count, count.tolist())
    following = torch.tensor([5, 17, 42])
    with torch.no_grad():
        step = target.forward(model, following[:, None], torch.ones(3, 1, dtype=torch.bool), [],
                              host_input_counts=[1, 1, 1])
    target.commit_every(1, marked=True)
    for a in range(3):
        expected = _plain_last_logits(model, prompts[a], [*_chain(tree, a, int(leaf[a])), int(following[a])])
        torch.testing.assert_close(step.logits[a, 0], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tree_logits_match_plain_chains_every_family(name):
    _check_tree_then_step(make_family(name))


@pytest.mark.parametrize(("name", "implementation"), [("llama", "eager"), ("mistral", "eager"), ("gemma3", "eager")])
def test_tree_logits_match_plain_chains_eager(name, implementation):
    model = make_family(name, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation
    _check_tree_then_step(model)


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral", "gemma2", "gemma3"])
def test_tree_logits_match_plain_chains_static_cache(name):
    _check_tree_then_step(make_family(name), static=True)


def test_two_tree_rounds_in_a_row_keep_the_cache_exact():
    """A second tree after a committed path (holes from the first): still plain-forward logits."""
    model = make_family("gemma3")
    ids, mask = ragged_prompts(3, seed=2, min_len=4, max_len=14)
    prompts = [ids[a][mask[a].bool()] for a in range(3)]
    target = _prefill(model, ids, mask, static=False).target
    history = [[] for _ in range(3)]
    for seed, leaf in ((4, torch.tensor([5, 2, 2])), (5, torch.tensor([4, 1, 5]))):
        tree = _tree(seed)
        with torch.no_grad():
            out = target.forward(model, tree.tokens, tree.valid, [], tree=TreeSlots(tree.depth, ancestor_mask(tree)))
        for a in range(3):
            for node in range(tree.num_nodes):
                if tree.valid[a, node]:
                    expected = _plain_last_logits(model, prompts[a], history[a] + _chain(tree, a, node))
                    torch.testing.assert_close(out.logits[a, node], expected, atol=ATOL, rtol=0)
        nodes, count = path_nodes(tree, leaf)
        target.commit_path(tree.num_nodes, path_slot_order(nodes, tree.num_nodes), count, count.tolist())
        history = [history[a] + _chain(tree, a, int(leaf[a])) for a in range(3)]


def test_gather_new_slots_moves_the_path_to_the_front():
    keys = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 1, 8, 1)
    order = torch.tensor([[0, 2, 3, 0], [0, 1, 3, 0]])
    gather_new_slots(keys, order, torch.tensor([2, 4]), dim=2)
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 4, 5, 2, 6, 7]
    assert keys[1, 0, :, 0].tolist() == [8, 9, 10, 11, 12, 13, 15, 12]


def test_attention_without_4d_masks_is_detected():
    assert tree_support("sdpa") is None and tree_support("eager") is None
    assert "attn_implementation='sdpa'" in tree_support("flash_attention_2")


def test_tree_slots_check_their_shapes():
    with pytest.raises(ValueError, match="ancestor_mask"):
        TreeSlots(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, 4, dtype=torch.bool))
