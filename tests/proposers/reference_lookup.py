"""A plain-list prompt lookup, the reference `PromptLookupProposer`'s n-gram index is tested against."""

from __future__ import annotations


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
