"""The DSpark drafter proposes a draft tree from one block forward (docs/method.md, "Draft trees").

One block forward gives the per-slot hidden states h_1..h_γ and base logits U_k, exactly as a chain proposal
(`DSparkModel.propose`). A tree branches where a chain takes the argmax: each node at depth d gets the slot-(d+1)
distribution of its own branch,

    p_draft(· | branch) = softmax(process(U_{d+1} + B_{d+1}(x_node, state_node))),

where the sequential head's bias B is low-rank (W2ᵀ W1[x], or W2ᵀ tanh(W_o z) for the RNN head, whose state is
carried per branch), so each frontier node costs one `[r] → [V]` product, not a block forward. Without a sequential
head every branch at a depth shares its slot's distribution. The calibrated confidence of each node's argmax child
(Eq. 7 with STS, per branch: the confidence head sees the branch's W1[x]) prices the expansion; `ops.tree.build_tree`
keeps the best nodes under the node budget. The tree's shape is a deterministic function of the distributions
(top-k children), so sampling verification uses the point-mass sibling rule and stays lossless.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.functional import calibrated_confidence, semi_autoregressive_logits
from ..ops.tree import TreeProposal, build_tree
from .draft_vocab import scatter_to_target_vocab
from .modeling_outputs import DraftLogitsProcessor

TREE_METHODS = ("block_hidden_states", "lm_logits", "confidence_temperatures", "draft_token_ids")


def proposes_trees(drafter: Any) -> bool:
    """Whether `drafter` is a DSpark drafter network whose block forward `propose_tree` can branch."""
    return all(callable(getattr(drafter, name, None)) for name in TREE_METHODS)


def _branch_logits(drafter, base_logits: torch.Tensor, parent_tokens: torch.Tensor, state: torch.Tensor | None,
                   hidden: torch.Tensor):
    """U + B(x_parent, state) for every frontier branch: base `[R, V_d]`, parents `[R, M]`, state `[R, M, r]` or
    None, hidden `[R, d]` → (logits `[R, M, V_d]`, the branches' new state, W1[x_parent] `[R, M, r]` or None)."""
    head = getattr(drafter, "markov_head", None)
    branches = parent_tokens.shape[1]
    if head is None:
        return base_logits[:, None].expand(-1, branches, -1), None, None
    prev_embedding = head.embed_previous(parent_tokens)
    hidden = hidden[:, None].expand(-1, branches, -1)
    state, bias = head.step(state, prev_embedding, hidden)
    return semi_autoregressive_logits(base_logits[:, None], bias), state, prev_embedding


def _node_confidence(drafter, hidden: torch.Tensor, prev_embedding: torch.Tensor | None, probs: torch.Tensor,
                     temperature: torch.Tensor) -> torch.Tensor:
    """c = σ(z / T) of each branch's argmax child `[R, M]`; without a confidence head its draft probability."""
    head = getattr(drafter, "confidence_head", None)
    if head is None or (prev_embedding is None and getattr(head, "with_markov", False)):
        return probs.max(dim=-1).values
    hidden = hidden[:, None].expand(-1, probs.shape[1], -1)
    return calibrated_confidence(head(hidden, prev_embedding).float(), temperature)


@torch.no_grad()
def propose_tree(
    drafter,
    anchor_ids: torch.Tensor,
    cache,
    budget: int,
    *,
    do_sample: bool = False,
    logits_processor: DraftLogitsProcessor | None = None,
    sibling_cap: int = 4,
    beam_width: int | None = None,
) -> TreeProposal:
    """A draft tree of at most `budget` nodes per row (the anchor included) from one block forward.

    anchor_ids: `[R]` each row's last committed token; cache: the drafter's context cache (everything before the
    anchor). logits_processor: a history-free processing of the drafts (temperature, top-k/p: the same the target's
    scores get), applied to each branch's logits; one that reads token ids cannot process branches (each would need
    its own prefix): pass None and verify chains instead. Returns `ops.tree.TreeProposal` (tokens are target ids).
    """
    if logits_processor is not None and getattr(logits_processor, "reads_token_ids", True):
        raise ValueError(
            "propose_tree applies only history-free draft processing (temperature, top-k, top-p); this "
            "logits_processor reads token ids, which differ per branch. Verify chains for this call."
        )
    hidden = drafter.block_hidden_states(anchor_ids, cache)
    base_logits = drafter.lm_logits(hidden)
    temperatures = drafter.confidence_temperatures(not do_sample, hidden.device)
    draft_ids, vocab = drafter.draft_token_ids(), drafter.config.vocab_size
    states: list[torch.Tensor | None] = [None]

    def child_fn(depth: int, parent_tokens: torch.Tensor, beam_parent: torch.Tensor):
        state = states[-1]
        if state is not None:
            state = state.gather(1, beam_parent[..., None].expand(-1, -1, state.shape[-1]))
        logits, state, prev_embedding = _branch_logits(drafter, base_logits[:, depth], parent_tokens, state,
                                                       hidden[:, depth])
        states.append(state)
        rows, branches = parent_tokens.shape
        flat = logits.reshape(rows * branches, -1)
        if draft_ids is not None:  # −inf outside the draft vocabulary: p_draft = 0 there
            flat = scatter_to_target_vocab(flat, draft_ids, vocab)
        if logits_processor is not None:
            flat = logits_processor(depth, None, flat)
        probs = torch.softmax(flat.float(), dim=-1).view(rows, branches, -1)
        confidence = _node_confidence(drafter, hidden[:, depth], prev_embedding, probs, temperatures[depth])
        return probs, confidence

    return build_tree(anchor_ids, child_fn, None, budget, depth=drafter.config.block_size, sibling_cap=sibling_cap,
                      beam_width=beam_width)

