"""Tree rounds: each drafting row verifies a draft tree of a fixed node budget instead of one chain.

`generate(..., assistant_model=drafter, dspark_tree_budget=N)` runs `TreeRoundKernel`, the round kernel with two
steps replaced:

- drafting: the drafter proposes a tree of at most N nodes per planned row (`model.tree_proposal.propose_tree`:
  one block forward, per-branch sequential-head distributions, `ops.tree.build_tree`); nodes deeper than the row's
  budget (`max_new_tokens`) are dropped; rows the policy does not plan verify their anchor alone;
- verification: one target forward over every row's N nodes with the tree's ancestor mask and depth positions
  (`target.tree_forward`), the target's scores processed per node, `ops.tree_verification.verify_tree_greedy` or
  `verify_tree_sampling` (siblings are chosen deterministically, so the point-mass sibling rule keeps sampling
  exact), the round's one download (accepted counts, next tokens, the accepted path's tokens), the commit through
  the caller's stopping criteria, and `commit_path`: the accepted path's keys, values and tapped features move into
  chain order, so the drafter's context and the target cache look exactly as after a chain round.

A policy that declares `supports_trees` (`auto`) sizes the trees by cost: before drafting, the node budget worth
building at this load (`scheduling.tree_budget.node_budget_cap`, none at all on a saturated curve); after, per row,
no draft, the argmax chain or the best-scored nodes (`choose_tree_budget`), read once (the kept sizes and depths),
the trees compacted to the round's widest (`ops.tree.restrict_tree`). Other policies verify the fixed budget.

Everything else (planning which rows draft, queued context updates, observers, plain rounds) is `RoundKernel`'s.
Trees need a DSpark drafter network, an attention implementation that takes 4D masks and history-free logits
processing (temperature, top-k, top-p): `round_kernel` checks them once and otherwise verifies chains, saying why
in one log line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.utils import logging

from ..model.tree_proposal import propose_tree, proposes_trees
from ..ops.tree import DraftTree, ancestor_mask, draft_tree, restrict_tree
from ..ops.tree_verification import path_tokens, verify_tree_greedy, verify_tree_sampling
from ..target.ragged_cache import VerifyOutput, attention_layout
from ..target.tree_forward import TreeSlots, path_slot_order, tree_support
from ..transfer import download, upload
from .drafting import draft_logits_processor
from .round import RoundKernel, RoundRecord

logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class TreeDrafts:
    """One round's trees for every active row (`[A, N]`; rows that do not draft hold their anchor alone)."""

    tree: DraftTree


def _scatter_score(score: torch.Tensor, index: torch.Tensor | None, rows: int) -> torch.Tensor:
    """The planned rows' node scores `[P, N]` at `index` among `rows` rows (the others: 1 at the anchor, 0 after)."""
    if index is None:
        return score
    out = score.new_zeros(rows, score.shape[1]).index_copy(0, index, score)
    out[:, 0] = 1.0
    return out


def _shape_by_cost(rule, tree: DraftTree, score: torch.Tensor) -> tuple[DraftTree, list[int]]:
    """The policy's choice per row (no draft, a chain or a tree: `shape_tree`), the trees compacted to the round's
    widest kept tree. The choice's one host read: each row's kept depth (its ℓ, what the policy observes)."""
    choice = rule.shape_tree(tree, score)
    depth = torch.where(choice.keep, tree.depth, torch.zeros_like(tree.depth)).amax(dim=1)
    host = download(torch.cat([choice.num_nodes, depth]))
    rows = tree.num_rows
    shaped, _ = restrict_tree(tree, choice.keep, 1 + max(host[:rows]))
    return shaped, host[rows:]


def _download_tree(accepted: torch.Tensor, next_token: torch.Tensor, path: torch.Tensor, tree: DraftTree):
    """The round's one device-to-host copy: accepted counts, next tokens, drafts verified per row and the accepted
    paths' tokens `[A, W]`. Returns (accepted counts, each row's tokens to commit, drafts verified per row)."""
    rows, width = path.shape
    nodes = tree.valid.sum(dim=1) - 1
    flat = download(torch.cat([accepted, next_token, nodes.to(accepted.dtype), path.reshape(-1)]))
    accepted_host, start = flat[:rows], 3 * rows
    offsets = range(start, start + rows * width, width) if width else [start] * rows
    tokens = [[*flat[o : o + m], token] for o, m, token in zip(offsets, accepted_host, flat[rows : 2 * rows])]
    return accepted_host, tokens, flat[2 * rows : start]


def _gather_slots(values: torch.Tensor | None, order: torch.Tensor) -> torch.Tensor | None:
    """values `[A, N, ...]` in the order `[A, N]` (the accepted path first)."""
    if values is None:
        return None
    index = order.to(values.device).view(*order.shape, *([1] * (values.dim() - 2))).expand(-1, -1, *values.shape[2:])
    return values.gather(1, index)


def _within_budget(tree: DraftTree, cap: torch.Tensor) -> DraftTree:
    """The tree without nodes deeper than cap[a] (the drafts row a may still commit): `[A]`."""
    valid = tree.valid & (tree.depth <= cap[:, None])
    return draft_tree(tree.tokens, tree.parents, valid)


def _scatter_tree(tree: DraftTree, index: torch.Tensor | None, anchor: torch.Tensor) -> DraftTree:
    """The planned rows' trees at `index` among all rows; the others verify their anchor alone."""
    if index is None:
        return tree
    rows, nodes = anchor.shape[0], tree.num_nodes
    tokens = tree.tokens.new_zeros(rows, nodes).index_copy(0, index, tree.tokens)
    tokens[:, 0] = anchor
    parents = tree.parents.new_full((rows, nodes), -1).index_copy(0, index, tree.parents)
    valid = tree.valid.new_zeros(rows, nodes).index_copy(0, index, tree.valid)
    valid[:, 0] = True
    return draft_tree(tokens, parents, valid)


class TreeRoundKernel(RoundKernel):
    """`RoundKernel` whose drafting rows verify draft trees of at most `budget` nodes (the anchor included).

    Args (beyond `RoundKernel`'s):
        budget: N, node slots per row and round (≥ 2). A static target cache of γ + 1 slack slots caps it there.
        sibling_cap: the most children a node may get (`ops.tree.build_tree`).
    """

    def __init__(self, *args, budget: int, sibling_cap: int = 4, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if budget < 2:
            raise ValueError(f"dspark_tree_budget must be ≥ 2 nodes (the anchor and a draft), got {budget}.")
        self.budget, self.sibling_cap = budget, sibling_cap

    def _shaping_rule(self):
        """The policy rule that sizes trees by cost (`BasePolicy.supports_trees`), or None: the fixed budget."""
        rule = None if self.policy is None else self.policy.rule
        return rule if rule is not None and rule.supports_trees else None

    def _budget_for(self, target_cache) -> int:
        plan = getattr(target_cache, "plan", None)  # a static cache holds block_size + 1 new slots a forward
        return self.budget if plan is None else min(self.budget, plan.block_size + 1)

    def _draft(self, batch, histories, cap: list[int], plan):
        """Propose a tree for the planned rows: (`TreeDrafts`, None, each row's deepest possible path as host ints,
        a record with the drafter's time). A policy that `supports_trees` sizes them: the budget before drafting
        (`tree_node_cap`: none at all when no draft pays at this load), each row's kept nodes after (`shape_tree`;
        the depths are then the kept trees')."""
        rows, device = len(batch.rows), batch.anchor.device
        record = RoundRecord(list(batch.rows), [], [], [], drafted=0, probe=plan.probe)
        budget, rule = self._budget_for(batch.target_cache), self._shaping_rule()
        if rule is not None:  # drafts per row worth building at this load (host arithmetic on the step curve)
            budget = 1 + rule.tree_node_cap(rows, budget - 1)
        if not plan.drafts or budget < 2:
            return None, None, [0] * rows, record
        started = time.perf_counter()
        batch.flush(self.drafter, self.takes_counts)
        host_index = plan.rows.tolist() if plan.rows is not None and plan.rows.numel() < rows else None
        index = None if host_index is None else upload(host_index, device)
        sub_rows = batch.rows if index is None else [batch.rows[i] for i in host_index]
        sub_hist = histories if index is None else [histories[i] for i in host_index]
        cache = batch.draft_cache if index is None else batch.draft_cache.select_rows(
            torch.tensor(host_index, dtype=torch.long))
        anchor = batch.anchor if index is None else batch.anchor.index_select(0, index)
        processing = draft_logits_processor(self.processors, sub_rows, sub_hist)
        own = getattr(self.drafter, "propose_tree", None)  # a drafter that builds its own trees (the hybrid's)
        if own is not None:
            proposal = own(anchor, cache, budget, do_sample=self.do_sample, logits_processor=processing,
                           sibling_cap=self.sibling_cap, histories=sub_hist)
        else:
            proposal = propose_tree(self.drafter, anchor, cache, budget, do_sample=self.do_sample,
                                    logits_processor=processing, sibling_cap=self.sibling_cap)
        planned = set(range(rows)) if host_index is None else set(host_index)
        gamma = self.drafter.config.block_size
        host_len = [min(gamma, cap[a]) if a in planned else 0 for a in range(rows)]
        tree = _within_budget(_scatter_tree(proposal.tree, index, batch.anchor), upload(host_len, device))
        shaped_at = time.perf_counter()
        if rule is not None:
            tree, host_len = _shape_by_cost(rule, tree, _scatter_score(proposal.score, index, rows))
            record.policy_seconds = time.perf_counter() - shaped_at
        record.draft_seconds = shaped_at - started
        record.drafted = len(sub_rows)
        return TreeDrafts(tree), None, host_len, record

    def _verify_round(self, batch, histories, commit, record: RoundRecord, drafts: TreeDrafts, draft_probs,
                      host_len: list[int]):
        """One target forward over every row's tree, verification, one download, commit of the accepted paths.
        Returns (the forward's output in path order, accepted drafts per row, next tokens `[A]`, kept slots)."""
        tree = drafts.tree
        steps = tree.num_nodes
        out = batch.target_cache.forward(self.target, tree.tokens, tree.valid, self.taps, packs=self.packs,
                                         tree=TreeSlots(tree.depth, ancestor_mask(tree)))
        scores = out.logits
        if not self.processors.is_empty:  # history-free processing (`round_kernel`): every node alike
            scores = self.processors.apply([], [], scores.flatten(0, 1)).view_as(scores)
        if self.do_sample:
            result = verify_tree_sampling(tree, torch.softmax(scores, dim=-1))
        else:
            result = verify_tree_greedy(tree, scores)
        accepted_host, tokens, record.nodes_verified = _download_tree(result.num_accepted, result.next_token,
                                                                      path_tokens(tree, result.path), tree)
        order = path_slot_order(result.path, steps)
        scores, logits = _gather_slots(scores, order), _gather_slots(out.logits, order)
        record.committed = list(commit(tokens, scores, logits))
        valid = batch.target_cache.commit_path(steps, order, 1 + result.num_accepted, [1 + m for m in accepted_host])
        return VerifyOutput(logits, _gather_slots(out.features, order)), accepted_host, result.next_token, valid


def tree_fallback_reason(target, drafter, processors) -> str | None:
    """Why this call cannot verify trees (None: it can): the drafter, the attention, the logits processing."""
    if not (proposes_trees(drafter) or callable(getattr(drafter, "propose_tree", None))):
        return f"the drafter ({type(drafter).__name__}) proposes chains only"
    reason = tree_support(attention_layout(target).implementation)
    if reason is not None:
        return reason
    if not processors.is_empty and not processors.history_free:
        return "a logits processor reads each row's token history (repetition penalty, ...), which differs per branch"
    return None


def verify_block_size(kernel: RoundKernel, block_size: int) -> int:
    """The most drafts one verification forward holds (a static cache's slack): γ for chains, N − 1 for trees."""
    return max(block_size, kernel.budget - 1) if isinstance(kernel, TreeRoundKernel) else block_size


def round_kernel(tree_budget: int | None, target, drafter, policy, processors, do_sample: bool,
                 observers: Sequence = (), **kwargs) -> RoundKernel:
    """The call's round kernel: `TreeRoundKernel` when `tree_budget` (nodes per row) is set and the call can verify
    trees, else `RoundKernel` (chains), with one log line saying why trees were not used."""
    if not tree_budget or drafter is None:
        return RoundKernel(target, drafter, policy, processors, do_sample, observers, **kwargs)
    reason = tree_fallback_reason(target, drafter, processors)
    if reason is not None:
        logger.warning_once(f"dspark_tree_budget={tree_budget}: verifying chains instead of trees: {reason}.")
        return RoundKernel(target, drafter, policy, processors, do_sample, observers, **kwargs)
    return TreeRoundKernel(target, drafter, policy, processors, do_sample, observers, budget=int(tree_budget),
                           **kwargs)
