"""Model-free drafters ready for `target.generate(assistant_model=...)`: each builds the proposer shaped for the
target (`hf_dspark.proposers`) and enables DSpark generate on the target (`dispatch.enable`)."""

from __future__ import annotations

import torch

from ..proposers.lookup import PromptLookupProposer, SuffixProposer, prompt_lookup_proposer, suffix_proposer
from ..proposers.oracle import OracleDrafter, oracle_proposer
from .dispatch import enable


def prompt_lookup_for(target, block_size: int, max_ngram: int = 3) -> PromptLookupProposer:
    """A prompt-lookup proposer for `target`, with DSpark generate enabled on it."""
    enable(target)
    return prompt_lookup_proposer(target, block_size, max_ngram=max_ngram)


def suffix_proposer_for(target, block_size: int, max_ngram: int = 8, max_tokens: int = 1 << 18) -> SuffixProposer:
    """A suffix proposer (the request's context and earlier requests) for `target`, with DSpark generate enabled."""
    enable(target)
    return suffix_proposer(target, block_size, max_ngram=max_ngram, max_tokens=max_tokens)


def oracle_for(target, block_size: int, sequences: torch.Tensor, prompt_mask: torch.Tensor) -> OracleDrafter:
    """An oracle for `target` with `sequences` as references, with DSpark generate enabled on it."""
    enable(target)
    return oracle_proposer(target, block_size, sequences, prompt_mask)
