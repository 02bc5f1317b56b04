"""Outputs of the DSpark drafter: one round's proposal (Eqs. 4-7) and the teacher-forced training outputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

# (draft position k (0-based), drafted tokens so far [R, k], logits [R, V]) -> processed logits [R, V]
DraftLogitsProcessor = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DSparkProposal:
    """One round of drafts for R requests.

    Attributes:
        draft_ids: `[R, γ]` drafted tokens x_1..x_γ.
        draft_probs: `[R, γ, V]` the full p_draft_k each token was drawn from (after the logits processors), or
            `None` when not requested (greedy verification needs none).
        draft_token_probs: `[R, γ]` p_draft_k(x_k).
        confidence: `[R, γ]` calibrated c_k, or `None` without a confidence head.
        confidence_logits: `[R, γ]` raw head logits z_k before temperature scaling (for calibration), or `None`.
    """

    draft_ids: torch.Tensor
    draft_probs: torch.Tensor | None
    draft_token_probs: torch.Tensor
    confidence: torch.Tensor | None
    confidence_logits: torch.Tensor | None = None


@dataclass
class DSparkDrafterOutput(ModelOutput):
    """Teacher-forced outputs: `logits` `[S, N, γ, V]` (U + B from gold previous tokens), `confidence_logits`
    `[S, N, γ]` (before sigmoid and calibration), `hidden_states` `[S, N, γ, d]`."""

    logits: torch.Tensor | None = None
    confidence_logits: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
