"""Batched, lossless verification of ragged draft prefixes (docs/method.md, section 5).

Row r verifies its first ℓ_r drafts against target distributions at ℓ_r + 1 positions (position j's target
distribution is the one that predicts draft j; position ℓ_r gives the bonus token). Pure functions: no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .functional import residual_distribution


@dataclass
class VerificationResult:
    """num_accepted `[R]` (0 ≤ m_r ≤ ℓ_r drafts kept) and next_token `[R]` (the correction or bonus token)."""

    num_accepted: torch.Tensor
    next_token: torch.Tensor


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Count of leading True values per row: `[R, γ]` bool -> `[R]` long."""
    return mask.cumprod(dim=-1, dtype=torch.long).sum(dim=-1)  # the cast inside the scan: one op fewer


def _in_budget(mask: torch.Tensor, verify_len: torch.Tensor | None) -> torch.Tensor:
    """`mask` `[R, γ]` with the positions past each row's ℓ_r cleared (verify_len None: every row verifies γ)."""
    if verify_len is None:
        return mask
    return mask & (torch.arange(mask.shape[1], device=mask.device)[None, :] < verify_len[:, None])


def verify_greedy(
    draft_ids: torch.Tensor, target_ids: torch.Tensor, verify_len: torch.Tensor | None
) -> VerificationResult:
    """Greedy: accept draft x_j iff it equals the target's argmax at that position.

    draft_ids: `[R, γ]`; target_ids: `[R, γ + 1]` the target's (processed) argmax at each verified position
    (entries past ℓ_r are ignored); verify_len: `[R]`, or None when every row verifies all γ drafts. The next token
    is the target's choice after the last kept draft, so the output equals target-only greedy decoding token for
    token.
    """
    gamma = draft_ids.shape[1]
    matches = _in_budget(draft_ids == target_ids[:, :gamma], verify_len)
    accepted = _leading_true(matches)
    next_token = target_ids.gather(1, accepted[:, None]).squeeze(1)
    return VerificationResult(accepted, next_token)


def verify_sampling(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_len: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerificationResult:
    """Speculative sampling: accept x_j with probability min(1, p_target(x_j) / p_draft(x_j)).

    At the first rejection j the next token is drawn from norm(max(0, p_target_j − p_draft_j)); when all ℓ_r
    drafts are kept it is drawn from p_target at position ℓ_r (the bonus token). The output then follows the
    target distribution exactly, for any verify_len chosen without looking at x_≥j.

    draft_ids: `[R, γ]`; draft_probs: `[R, γ, V]` the distributions the drafts were drawn from; target_probs:
    `[R, γ + 1, V]`; verify_len: `[R]`.
    """
    rows, gamma = draft_ids.shape
    device = draft_ids.device
    if gamma == 0:  # nothing drafted: plain sampling from the target
        next_token = torch.multinomial(target_probs[:, 0], 1, generator=generator).squeeze(1)
        return VerificationResult(torch.zeros(rows, dtype=torch.long, device=device), next_token)
    p_draft_tok = draft_probs.gather(-1, draft_ids[..., None]).squeeze(-1)
    p_target_tok = target_probs[:, :gamma].gather(-1, draft_ids[..., None]).squeeze(-1)
    uniform = torch.rand(rows, gamma, device=device, generator=generator, dtype=p_draft_tok.dtype)
    keep = uniform * p_draft_tok < p_target_tok  # u < p_t / p_d without dividing by a tiny p_d
    accepted = _leading_true(_in_budget(keep, verify_len))
    row_idx = torch.arange(rows, device=device)
    at_target = target_probs[row_idx, accepted]  # [R, V]
    rejected = accepted < verify_len
    safe_pos = accepted.clamp_max(gamma - 1)
    at_draft = draft_probs[row_idx, safe_pos]
    next_dist = torch.where(rejected[:, None], residual_distribution(at_target, at_draft), at_target)
    next_token = torch.multinomial(next_dist, 1, generator=generator).squeeze(1)
    return VerificationResult(accepted, next_token)
