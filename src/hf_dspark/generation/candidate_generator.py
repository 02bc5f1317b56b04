"""`DSparkCandidateGenerator`: the drafting side of the loop, in transformers' `CandidateGenerator` shape.

Transformers' interface is `get_candidates(input_ids) -> (candidate_ids, candidate_logits)` and
`update_candidate_strategy(input_ids, scores, num_matches)`, for one row. DSpark extends both to a batch of
rows with ragged histories: `get_candidates` also takes each row's anchor and returns per-row draft
distributions and confidences (kept in `last_proposal`), and `update_candidate_strategy` also takes the target's
tapped hidden states of the newly committed tokens, which become the drafter's context (Eqs. 2-3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from .drafting import draft_logits_processor
from .processors import RowProcessors

if TYPE_CHECKING:
    from ..model.modeling_dspark import DSparkModel, DSparkProposal


class DSparkCandidateGenerator(CandidateGenerator):
    """Batched DSpark drafting with a per-row context cache.

    Args:
        drafter: a `DSparkDrafter` bound to the target.
        processors: the generate call's logits processors, wrapped per row (`RowProcessors`).
        do_sample: sample drafts (for speculative sampling) or take the argmax (greedy).
        rows: original batch indices of the rows this generator drafts for.
    """

    requires_model_outputs = False

    def __init__(self, drafter: DSparkModel, processors: RowProcessors, do_sample: bool, rows: Sequence[int]):
        self.drafter = drafter
        self.processors = processors
        self.do_sample = do_sample
        self.rows = list(rows)
        self.cache = drafter.init_cache(len(self.rows))
        self.last_proposal: DSparkProposal | None = None
        self._prefilled = False

    @classmethod
    def for_stock_loop(cls, drafter: DSparkModel, logits_processor, do_sample: bool) -> DSparkCandidateGenerator:
        """A batch-1 generator that transformers' own `_assisted_decoding` can host.

        It asks that loop for the tapped hidden states of each target forward (`model_kwargs_overrides`) and skips
        drafting on the first iteration, so the prefill forward supplies the prompt's context features.
        """
        generator = cls(drafter, RowProcessors(logits_processor, 1), do_sample, [0])
        generator.requires_model_outputs = True
        generator.model_kwargs_overrides = {"output_hidden_states": [i + 1 for i in drafter.config.target_layer_ids]}
        return generator

    # -- transformers' interface, batched -------------------------------------------------------------
    @property
    def num_drafting_tokens(self) -> int:
        """Tokens drafted per round (γ); transformers >= 5.25 reads it to size the cache's rollback record."""
        return self.drafter.config.block_size

    def get_candidates(
        self, input_ids: torch.LongTensor, anchor_ids: torch.Tensor | None = None,
        histories: Sequence[torch.Tensor] | None = None, **kwargs,
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Draft γ tokens per row after its anchor (default: the last token of each `input_ids` row).

        Returns `(input_ids ‖ drafts, log p_draft)` like transformers' generators (`[R, L+γ]`, `[R, γ, V]`); the
        full proposal, with confidences, is in `self.last_proposal`.
        """
        if self.requires_model_outputs:
            return self._stock_candidates(input_ids, **kwargs)
        if anchor_ids is None:
            anchor_ids = input_ids[:, -1]
        if histories is None:
            histories = list(input_ids)
        proposal = self.propose(anchor_ids, histories)
        logits = proposal.draft_probs.clamp_min(1e-30).log() if proposal.draft_probs is not None else None
        return torch.cat([input_ids, proposal.draft_ids], dim=1), logits

    def _stock_candidates(self, input_ids, model_outputs=None, is_first_iteration=False, n_last_matches=0, **_):
        """The stock loop's call: feed the last forward's accepted features, then draft after the new token."""
        if is_first_iteration:
            return input_ids, None  # let the prefill forward run first
        taps = self.model_kwargs_overrides["output_hidden_states"]
        features = torch.cat([model_outputs.hidden_states[i] for i in taps], dim=-1)
        count = input_ids.shape[1] - 1 if not self._prefilled else int(n_last_matches) + 1
        self._prefilled = True
        valid = torch.arange(features.shape[1], device=features.device)[None, :] < count
        self.drafter.extend_context(self.cache, features, valid)
        proposal = self.propose(input_ids[:, -1], [input_ids[0]])
        logits = proposal.draft_probs.clamp_min(1e-30).log() if proposal.draft_probs is not None else None
        return torch.cat([input_ids, proposal.draft_ids], dim=1), logits

    def update_candidate_strategy(
        self, input_ids: torch.LongTensor, scores: torch.Tensor | None, num_matches: torch.Tensor | int,
        features: torch.Tensor | None = None, committed: torch.Tensor | None = None,
    ) -> None:
        """Feed the drafter the target features of the newly committed tokens.

        features: `[R, T, n_taps·d]` tapped target hidden states of the verification forward's inputs
        (anchor, drafts...); committed: `[R]` how many of them are now context (1 + accepted drafts; defaults to
        1 + num_matches).
        """
        if features is None:
            return
        if committed is None:
            committed = torch.as_tensor(num_matches, device=features.device).reshape(-1) + 1
        valid = torch.arange(features.shape[1], device=features.device)[None, :] < committed[:, None]
        self.drafter.extend_context(self.cache, features, valid)

    # -- DSpark specifics -------------------------------------------------------------------------------
    def add_context(self, features: torch.Tensor, valid: torch.Tensor) -> None:
        """Append committed tokens' target features (e.g. the whole prompt after prefill)."""
        self.drafter.extend_context(self.cache, features, valid)

    def propose(self, anchor_ids: torch.Tensor, histories: Sequence[torch.Tensor]) -> DSparkProposal:
        processors = draft_logits_processor(self.processors, self.rows, list(histories))
        self.last_proposal = self.drafter.propose(anchor_ids, self.cache, do_sample=self.do_sample,
                                                  logits_processor=processors, row_ids=self.rows,
                                                  histories=list(histories))
        return self.last_proposal

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the rows at positions `keep` of the current active set."""
        self.cache = self.cache.select_rows(keep)
        self.rows = [self.rows[i] for i in keep.tolist()]
