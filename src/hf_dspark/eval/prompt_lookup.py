"""Prompt lookup (n-gram copying from the context) as a drafter of the DSpark loop, for side-by-side τ.

Transformers ships prompt lookup for its stock batch-1 loop (`prompt_lookup_num_tokens`); this drafter runs the
same idea inside the DSpark loop so accepted lengths are measured by the same code for every drafter: find the
latest earlier occurrence of the longest suffix n-gram (max_ngram down to 1) of the row's history and propose the
tokens that followed it; with no match, propose the anchor repeated. Draft distributions are one-hot, which is
exact for greedy verification and valid (if wasteful) for speculative sampling. A model-free drafter
(`ModelFreeDrafter`): no weights, no context features.
"""

from __future__ import annotations

import torch

from ..configuration_dspark import DSparkConfig
from ..generation.dispatch import enable
from ..generation.drafting import ContextLengths, ModelFreeDrafter
from ..modeling_outputs import DSparkProposal


def lookup_continuation(history: list[int], length: int, max_ngram: int = 3) -> list[int]:
    """Tokens following the latest earlier match of the history's longest suffix n-gram (≤ `length` tokens)."""
    for n in range(min(max_ngram, len(history) - 1), 0, -1):
        suffix = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start : start + n] == suffix:
                follow = history[start + n : start + n + length]
                if follow:
                    return follow
    return []


class PromptLookupDrafter(ModelFreeDrafter):
    """A model-free drafter; `max_ngram` is the longest suffix n-gram it looks up."""

    def __init__(self, config: DSparkConfig, max_ngram: int = 3) -> None:
        super().__init__(config)
        self.max_ngram = max_ngram

    @torch.no_grad()
    def propose(self, anchor_ids: torch.Tensor, cache: ContextLengths, *, do_sample: bool = False,
                logits_processor=None, generator=None, return_probs: bool | None = None, row_ids=None,
                histories: list[torch.Tensor] | None = None) -> DSparkProposal:
        if histories is None:
            raise ValueError("PromptLookupDrafter needs the rows' histories (the DSpark loop passes them)")
        gamma = self.config.block_size
        drafts = anchor_ids[:, None].repeat(1, gamma)
        for a, history in enumerate(histories):
            follow = lookup_continuation(history.tolist(), gamma, self.max_ngram)
            if follow:
                drafts[a, : len(follow)] = torch.tensor(follow, dtype=drafts.dtype)
                drafts[a, len(follow) :] = follow[-1]
        ones = torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
        return DSparkProposal(drafts, self.one_hot(drafts, bool(return_probs or do_sample)), ones, None)


def prompt_lookup_for(target, block_size: int, max_ngram: int = 3) -> PromptLookupDrafter:
    """A prompt-lookup drafter for `target` (DSpark generate enabled on it)."""
    config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=1, head_type="none",
                                      use_confidence_head=False)
    enable(target)
    return PromptLookupDrafter(config, max_ngram=max_ngram)
