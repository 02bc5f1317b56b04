"""Model-free proposers (prompt lookup, suffix matching) and the hybrid drafter, all `DraftModel`s of the loop."""

from .hybrid import HybridDrafter, hybrid_for
from .lookup import PromptLookupProposer, SuffixProposer, prompt_lookup_for, suffix_proposer_for
from .ngram import NgramIndex
from .scoring import choose_sources

__all__ = [
    "HybridDrafter",
    "NgramIndex",
    "PromptLookupProposer",
    "SuffixProposer",
    "choose_sources",
    "hybrid_for",
    "prompt_lookup_for",
    "suffix_proposer_for",
]
