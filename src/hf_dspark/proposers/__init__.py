"""Model-free proposers (prompt lookup, suffix matching), the hybrid drafter and the oracle, all `DraftModel`s of the
loop, and the registry that builds them by name (`registry`: `register_proposer` / `get_proposer` /
`available_proposers`, read by the command line)."""

from functools import partial

import torch

from .hybrid import HybridDrafter, hybrid_for
from .lookup import PromptLookupProposer, SuffixProposer, prompt_lookup_proposer, suffix_proposer
from .ngram import NgramIndex
from .oracle import OracleDrafter, oracle_proposer
from .registry import (
    DEFAULT_BLOCK_SIZE,
    ProposerSpec,
    available_proposers,
    build_proposer,
    get_proposer,
    proposers_help,
    register_proposer,
    split_proposer_spec,
)
from .scoring import choose_sources

register_proposer("prompt-lookup", prompt_lookup_proposer, description="n-gram lookup in the request's own context")
register_proposer("suffix", suffix_proposer, description="suffix matching over the context and earlier requests")
register_proposer(
    "hybrid",
    partial(hybrid_for, kind="prompt-lookup"),
    argument="drafter",
    description="per row and round, the DSpark drafter or prompt lookup",
)
register_proposer(
    "hybrid-suffix",
    partial(hybrid_for, kind="suffix"),
    argument="drafter",
    description="per row and round, the DSpark drafter or the suffix proposer",
)
register_proposer(
    "oracle",
    partial(oracle_proposer, sequences=torch.zeros(0, 0, dtype=torch.long), prompt_mask=torch.zeros(0, 0)),
    description="the target's own greedy continuation (set its `reference` first): the loop's ceiling",
    needs_reference=True,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "HybridDrafter",
    "NgramIndex",
    "OracleDrafter",
    "PromptLookupProposer",
    "ProposerSpec",
    "SuffixProposer",
    "available_proposers",
    "build_proposer",
    "choose_sources",
    "get_proposer",
    "hybrid_for",
    "oracle_proposer",
    "prompt_lookup_proposer",
    "proposers_help",
    "register_proposer",
    "split_proposer_spec",
    "suffix_proposer",
]
