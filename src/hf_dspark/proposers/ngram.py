"""N-gram indexes over token sequences: the matching behind the model-free proposers.

`NgramIndex` maps every n-gram (n = 1..max_ngram) of the sequences it was fed to the latest place it occurred
*with a continuation* (the position of the token that followed it), so a lookup of a history's suffix n-gram
never returns the suffix itself. Sequences are fed incrementally (`extend`), a few tokens per round, so the
index costs O(max_ngram) dictionary updates per committed token and a lookup costs O(max_ngram).

Memory is bounded: `max_tokens` caps the tokens held over all sequences; the oldest sequences are dropped first
and index entries pointing into a dropped sequence are treated as misses (and pruned when the index is rebuilt).
"""

from __future__ import annotations

from collections import OrderedDict


class NgramIndex:
    """Latest-occurrence n-gram index over a bounded store of token sequences.

    Args:
        max_ngram: the longest n-gram matched.
        max_tokens: the most tokens kept over all sequences (oldest sequences are evicted first).
    """

    def __init__(self, max_ngram: int = 3, max_tokens: int = 1 << 18) -> None:
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_ngram, self.max_tokens = max_ngram, max_tokens
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}
        self.total = 0
        self._next_id = 0

    def new_sequence(self) -> int:
        """A fresh, empty sequence id to `extend`."""
        seq_id = self._next_id
        self._next_id += 1
        self.sequences[seq_id] = []
        return seq_id

    def extend(self, seq_id: int, tokens: list[int]) -> int:
        """Append `tokens` to sequence `seq_id` and index the n-grams they complete; returns the id to use next
        (a new one when `seq_id` had been evicted)."""
        if seq_id not in self.sequences:
            seq_id = self.new_sequence()
        seq = self.sequences[seq_id]
        for token in tokens:
            end = len(seq)  # `token` continues every n-gram ending just before it
            for n in range(1, min(self.max_ngram, end) + 1):
                self.index[tuple(seq[end - n : end])] = (seq_id, end)
            seq.append(int(token))
        self.total += len(tokens)
        self._evict(keep=seq_id)
        return seq_id

    def _evict(self, keep: int) -> None:
        while self.total > self.max_tokens and len(self.sequences) > 1:
            oldest = next(iter(self.sequences))
            if oldest == keep:
                self.sequences.move_to_end(keep)
                continue
            self.total -= len(self.sequences.pop(oldest))
        if len(self.index) > 4 * self.max_ngram * max(self.total, 1):
            self.index = {k: v for k, v in self.index.items() if v[0] in self.sequences}

    def lookup(self, history: list[int], length: int) -> tuple[list[int], int]:
        """(up to `length` tokens that followed the latest occurrence of the history's longest suffix n-gram, that
        n); `([], 0)` without a match."""
        for n in range(min(self.max_ngram, len(history)), 0, -1):
            hit = self.index.get(tuple(history[-n:]))
            if hit is None:
                continue
            seq = self.sequences.get(hit[0])
            if seq is None:
                continue
            follow = seq[hit[1] : hit[1] + length]
            if follow:
                return follow, n
        return [], 0
