"""Tree verification (hf_dspark.ops.tree_verification): greedy = plain greedy decoding and = `verify_greedy` on
chains; sampling follows the target exactly (exact joint vs Monte Carlo, chi-square), for deterministic (top-k,
point-mass) and drawn (with and without replacement) siblings; a leaky sibling rule and an anticipating tree shape
(Appendix A) fail the same test."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_dspark.ops.tree import DraftTree, build_tree, chain_tree, check_tree, draft_tree
from hf_dspark.ops.tree_verification import (
    TreeVerificationResult,
    _first_among_siblings,
    _point_mass_residual,
    _walk,
    path_tokens,
    sibling_draft_probs,
    verify_tree_greedy,
    verify_tree_sampling,
)
from hf_dspark.ops.verification import verify_greedy

VOCAB, OUT_LEN = 3, 4
BASE = VOCAB + 1  # a context (token path) is coded in base V + 1 with digits token + 1: unique for every length


def _table(seed: int, sharpness: float = 1.5) -> torch.Tensor:
    """Distributions over V for every context code up to length OUT_LEN: `[BASE^(OUT_LEN+1), V]` float64."""
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(sharpness * torch.randn(BASE ** (OUT_LEN + 1), VOCAB, generator=gen, dtype=torch.float64), -1)


P_TARGET = _table(0)
NOISE = torch.randn(P_TARGET.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
Q_DRAFT = torch.softmax(torch.log(P_TARGET) + 2 * NOISE, -1)  # correlated with the target, often wrong


def _child_code(code: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    return code * BASE + token + 1


def _node_codes(tree: DraftTree) -> torch.Tensor:
    """Context code of every node (the anchor's context is the empty path, code 0): `[R, N]`."""
    codes = torch.zeros_like(tree.tokens)
    for i in range(1, tree.num_nodes):
        parent = tree.parents[:, i].clamp_min(0)
        codes[:, i] = _child_code(codes.gather(1, parent[:, None]).squeeze(1), tree.tokens[:, i])
    return codes


def _table_child_fn(table: torch.Tensor):
    """A `ChildDistributions` reading q(· | whole path) from a table: a recurrent head, tracked by beam_parent."""
    state = {}

    def child_fn(depth, parent_tokens, beam_parent):
        if depth == 0:
            state["codes"] = torch.zeros_like(parent_tokens)
        else:
            state["codes"] = _child_code(state["codes"].gather(1, beam_parent), parent_tokens)
        probs = table[state["codes"]]
        return probs, probs.max(-1).values

    return child_fn


def _emitted_codes(tree: DraftTree, result, gen: torch.Generator) -> torch.Tensor:
    """Accepted drafts + next token, continued by target sampling to OUT_LEN tokens; coded in base V: `[R]`."""
    rows = tree.num_rows
    drafts = path_tokens(tree, result.path)
    length = result.num_accepted
    sequence = torch.zeros(rows, OUT_LEN, dtype=torch.long)
    width = min(OUT_LEN, drafts.shape[1])
    sequence[:, :width] = drafts[:, :width]
    sequence.scatter_(1, length.clamp_max(OUT_LEN - 1)[:, None], result.next_token[:, None])
    code = torch.zeros(rows, dtype=torch.long)
    for k in range(OUT_LEN):
        fresh = torch.multinomial(P_TARGET[code], 1, generator=gen).squeeze(1)
        token = torch.where(k <= length, sequence[:, k], fresh)
        sequence[:, k] = token
        code = _child_code(code, token)
    return sum(sequence[:, k] * VOCAB ** (OUT_LEN - 1 - k) for k in range(OUT_LEN))


def _exact_joint() -> torch.Tensor:
    joint = torch.ones(1, dtype=torch.float64)
    codes = torch.zeros(1, dtype=torch.long)
    for _ in range(OUT_LEN):
        joint = (joint[:, None] * P_TARGET[codes]).flatten()
        codes = _child_code(codes[:, None], torch.arange(VOCAB)[None, :]).flatten()
    return joint


def _chi_square_z(codes: torch.Tensor, joint: torch.Tensor) -> float:
    """Wilson-Hilferty z of Pearson's χ² (cells with expected count < 5 pooled): ~N(0, 1) when codes ~ joint."""
    counts = torch.bincount(codes, minlength=joint.numel()).double()
    expected = joint * codes.numel()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    statistic = float(((observed - expected)[keep] ** 2 / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    return ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))


# ---------------------------------------------------------------- greedy


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 5), gamma=st.integers(0, 6))
def test_greedy_on_a_chain_is_verify_greedy(seed, rows, gamma):
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, 2, (rows, gamma), generator=gen)
    target_ids = torch.randint(0, 2, (rows, gamma + 1), generator=gen)
    verify_len = torch.randint(0, gamma + 1, (rows,), generator=gen)
    tree = chain_tree(drafts, verify_len, anchor=torch.full((rows,), 5))
    result = verify_tree_greedy(tree, target_ids)
    expected = verify_greedy(drafts, target_ids, verify_len)
    assert torch.equal(result.num_accepted, expected.num_accepted)
    assert torch.equal(result.next_token, expected.next_token)
    assert torch.equal(result.leaf, expected.num_accepted)
    for r in range(rows):
        count = int(expected.num_accepted[r])
        assert result.path[r].tolist() == list(range(count + 1)) + [-1] * (gamma - count)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(1, 14), cap=st.integers(1, 3))
def test_greedy_tree_tokens_are_plain_greedy(seed, budget, cap):
    """Emitted = the target's greedy roll-out, and the walk keeps the deepest node whose path matches it."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(P_TARGET.shape, generator=gen)  # a context-dependent greedy target
    draft = torch.softmax(scores + 2 * torch.randn(scores.shape, generator=gen), -1)
    rows, gamma = 3, 3
    tree = build_tree(torch.zeros(rows, dtype=torch.long), _table_child_fn(draft), None, budget, depth=gamma,
                      sibling_cap=cap).tree
    check_tree(tree)
    result = verify_tree_greedy(tree, scores[_node_codes(tree)])  # [R, N, V] scores at every node
    rollout, code = [], torch.zeros(rows, dtype=torch.long)
    for _ in range(gamma + 1):
        rollout.append(scores[code].argmax(-1))
        code = _child_code(code, rollout[-1])
    rollout = torch.stack(rollout, 1)
    drafts = path_tokens(tree, result.path)
    for r in range(rows):
        count = int(result.num_accepted[r])
        emitted = [*drafts[r, :count].tolist(), int(result.next_token[r])]
        assert emitted == rollout[r, : count + 1].tolist()
        matching = [int(tree.depth[r, i]) for i in range(tree.num_nodes)
                    if tree.valid[r, i] and _path_of(tree, r, i) == rollout[r, : tree.depth[r, i]].tolist()]
        assert count == max(matching)


def _path_of(tree: DraftTree, row: int, node: int) -> list[int]:
    tokens = []
    while node > 0:
        tokens.append(int(tree.tokens[row, node]))
        node = int(tree.parents[row, node])
    return tokens[::-1]


# ---------------------------------------------------------------- sampling: exact distribution

ROWS = 120_000
TOPOLOGY = [-1, 0, 0, 0, 1, 1, 2, 4]  # three siblings at the anchor, two under the first, depth 3


def _deterministic_tree(rows: int) -> DraftTree:
    """build_tree on Q_DRAFT (top-k children): the same tree in every row."""
    return build_tree(torch.zeros(rows, dtype=torch.long), _table_child_fn(Q_DRAFT), None, budget=8, depth=3,
                      sibling_cap=3).tree


def _sampled_tree(rows: int, replacement: bool, gen: torch.Generator) -> tuple[DraftTree, torch.Tensor]:
    """TOPOLOGY filled with tokens drawn from q(· | parent path), siblings with or without replacement.

    Returns the tree and q_k per node (`sibling_draft_probs`)."""
    parents = torch.tensor(TOPOLOGY).expand(rows, -1).clone()
    tokens = torch.zeros_like(parents)
    codes = torch.zeros_like(parents)
    for i in range(1, len(TOPOLOGY)):
        q_parent = Q_DRAFT[codes[:, TOPOLOGY[i]]].clone()
        if not replacement:
            for j in range(1, i):
                if TOPOLOGY[j] == TOPOLOGY[i]:
                    q_parent.scatter_(1, tokens[:, j, None], 0.0)
        tokens[:, i] = torch.multinomial(q_parent, 1, generator=gen).squeeze(1)
        codes[:, i] = _child_code(codes[:, TOPOLOGY[i]], tokens[:, i])
    tree = draft_tree(tokens, parents)
    return tree, sibling_draft_probs(tree, Q_DRAFT[codes], replacement=replacement)


def _leaky_verify(tree: DraftTree, target_probs: torch.Tensor, gen: torch.Generator):
    """THE WRONG RULE: accept each (point-mass) sibling w.p. min(1, p/q) = p(x_k), never renormalising p."""
    parent = tree.parents.clamp_min(0)
    p_token = target_probs.gather(1, parent[..., None].expand(-1, -1, VOCAB)).gather(-1, tree.tokens[..., None])
    accepted = torch.rand(tree.tokens.shape, generator=gen, dtype=torch.float64) < p_token.squeeze(-1)
    leaf, path, count = _walk(tree, _first_among_siblings(tree, accepted & tree.valid))
    next_token = torch.multinomial(_point_mass_residual(tree, target_probs, leaf), 1, generator=gen).squeeze(1)
    return TreeVerificationResult(leaf, path, count, next_token)


def _run(kind: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if kind in ("top_k", "leaky"):
        tree, sibling_probs = _deterministic_tree(ROWS), None
    else:
        tree, sibling_probs = _sampled_tree(ROWS, kind == "with_replacement", gen)
    target_probs = P_TARGET[_node_codes(tree)]
    if kind == "leaky":
        result = _leaky_verify(tree, target_probs, gen)
    else:
        result = verify_tree_sampling(tree, target_probs, sibling_probs, generator=gen, max_siblings=3)
    return tree, result, _emitted_codes(tree, result, gen)


def _later_sibling_rate(tree: DraftTree, result) -> float:
    """Fraction of rows whose path goes through a node that is not its parent's first child."""
    first = torch.ones_like(tree.valid)
    for i in range(1, tree.num_nodes):
        first[:, i] = ~((tree.parents[:, 1:i] == tree.parents[:, i, None]) & tree.valid[:, 1:i]).any(1)
    on_path = torch.zeros_like(tree.valid).scatter_(1, result.path.clamp_min(0), result.path >= 0)
    return float((on_path & ~first).any(1).double().mean())


def test_tree_sampling_with_top_k_siblings_follows_the_target():
    tree, result, codes = _run("top_k", seed=11)
    check_tree(tree)
    assert _later_sibling_rate(tree, result) > 0.05 and result.num_accepted.double().mean() > 0.8
    assert abs(_chi_square_z(codes, _exact_joint())) < 4.5


def test_tree_sampling_with_drawn_siblings_follows_the_target():
    for seed, kind in enumerate(["without_replacement", "with_replacement"]):
        tree, result, codes = _run(kind, seed=20 + seed)
        assert _later_sibling_rate(tree, result) > 0.05
        assert abs(_chi_square_z(codes, _exact_joint())) < 4.5, kind


def test_a_leaky_sibling_rule_is_detected():
    """Power check: the rule without the residual update fails the same test (P(x_k) shrinks by ∏(1 − p(x_i)))."""
    tree, result, codes = _run("leaky", seed=12)
    assert _later_sibling_rate(tree, result) > 0.05
    assert _chi_square_z(codes, _exact_joint()) > 10


# ---------------------------------------------------------------- Appendix A, with trees

TOKEN_A = 0


def _appendix_a_first_token_rate(anticipating: bool, rows: int = 200_000, seed: int = 0) -> tuple[float, float]:
    """The Appendix-A setup on a tree: V = {A, B}; q = (0.5, 0.5) everywhere; p_target = (0.7, 0.3) at the anchor,
    (0.6, 0.4) below. Topology: two siblings x_1, x_2 at the anchor (without replacement), x_1 has a child x_3.
    c_1 = 0.8 and c_3 = 0.9 if x_1 = A else 0. The anticipating shape keeps x_1's branch only when its own
    score (0.8 + 0.8·c_3, which reads x_1) pays; the lossless one fixes the topology before the draws.
    Returns (P̂(first emitted token = A), its standard error)."""
    gen = torch.Generator().manual_seed(seed)
    x1 = torch.multinomial(torch.full((rows, 2), 0.5, dtype=torch.float64), 1, generator=gen).squeeze(1)
    x3 = torch.multinomial(torch.full((rows, 2), 0.5, dtype=torch.float64), 1, generator=gen).squeeze(1)
    tokens = torch.stack([torch.zeros_like(x1), x1, 1 - x1, x3], 1)
    parents = torch.tensor([-1, 0, 0, 1]).expand(rows, -1)
    valid = torch.ones(rows, 4, dtype=torch.bool)
    if anticipating:  # Θ with the branch 2.52·0.45 > 1 when x_1 = A; 0.81 < 1 when x_1 = B: drop every draft
        valid[:, 1:] = (x1 == TOKEN_A)[:, None]
    tree = draft_tree(tokens, parents.clone(), valid)
    child_probs = torch.full((rows, 4, 2), 0.5, dtype=torch.float64)
    target_probs = torch.tensor([[0.7, 0.3]] + [[0.6, 0.4]] * 3, dtype=torch.float64).expand(rows, -1, -1)
    result = verify_tree_sampling(tree, target_probs.contiguous(), sibling_draft_probs(tree, child_probs),
                                  generator=gen, max_siblings=2)
    first = torch.where(result.num_accepted >= 1, path_tokens(tree, result.path)[:, 0], result.next_token)
    rate = float((first == TOKEN_A).double().mean())
    return rate, math.sqrt(rate * (1 - rate) / rows)


def test_appendix_a_anticipating_tree_shape_is_biased():
    rate, sigma = _appendix_a_first_token_rate(anticipating=True)
    assert abs(rate - 0.85) < 4 * sigma, rate  # 0.5·1 + 0.5·0.7: not the target's 0.7


def test_appendix_a_fixed_tree_shape_is_lossless():
    rate, sigma = _appendix_a_first_token_rate(anticipating=False)
    assert abs(rate - 0.7) < 4 * sigma, rate
