"""The draft vocabulary (EAGLE-3 style): a frequent subset of the target's tokens the drafter proposes from.

Conventions shared with the serving engines' checkpoints:

* draft ids are `0..V_draft-1`, listed in increasing target-id order;
* `d2t` `[V_draft]` (long) holds offsets: `target_id = draft_id + d2t[draft_id]`;
* `t2d` `[V]` (bool) marks the target ids that are in the draft vocabulary.

Drafting over a subset stays lossless: p_draft is zero outside it, so greedy verification only accepts a draft
that is the target's argmax, and speculative sampling's residual max(0, p_target − p_draft) carries the mass of
every token the drafter cannot propose.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch


def normalise_token_ids(token_ids: Sequence[int] | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Sorted, de-duplicated long `[V_draft]`; raises ValueError naming ids outside `0..vocab_size-1`."""
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().unique(sorted=True)
    if ids.numel() == 0:
        raise ValueError("the draft vocabulary is empty; give at least one token id.")
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"draft vocabulary ids must lie in 0..{vocab_size - 1}; got {int(ids[0])}..{int(ids[-1])}.")
    return ids


def d2t_from_token_ids(token_ids: torch.Tensor) -> torch.Tensor:
    """Offsets `d2t[i] = token_ids[i] − i` for sorted ids `[V_draft]` -> long `[V_draft]`."""
    return token_ids - torch.arange(token_ids.numel(), device=token_ids.device)


def token_ids_from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    """Inverse of `d2t_from_token_ids`: `[V_draft]` offsets -> target ids `[V_draft]`."""
    return d2t + torch.arange(d2t.numel(), device=d2t.device)


def t2d_from_token_ids(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool `[V]` membership mask of the draft vocabulary."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool, device=token_ids.device)
    t2d[token_ids] = True
    return t2d


def target_to_draft_index(t2d: torch.Tensor) -> torch.Tensor:
    """Long `[V]`: the draft id of every target id, −1 outside the draft vocabulary (ids sorted ascending)."""
    index = torch.cumsum(t2d.long(), dim=0) - 1
    return torch.where(t2d, index, torch.full_like(index, -1))


def scatter_to_target_vocab(logits: torch.Tensor, token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits `[..., V_draft]` -> target-vocabulary logits `[..., V]`, −inf outside the subset."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    full[..., token_ids] = logits
    return full


def count_tokens(sequences: Iterable[tuple[Sequence[int], Sequence[int]]]) -> Counter:
    """Frequencies of the supervised tokens: for each (input_ids, loss_mask), the ids where loss_mask is 1."""
    counts: Counter = Counter()
    for input_ids, loss_mask in sequences:
        counts.update(token for token, keep in zip(input_ids, loss_mask) if keep)
    return counts


def select_draft_vocab(
    counts: Counter, size: int, vocab_size: int, always_include: Iterable[int] = ()
) -> torch.Tensor:
    """The `size` most frequent token ids (ties by id), `always_include` (e.g. EOS ids) forced in. Sorted `[size]`."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in 1..{vocab_size}, got {size}.")
    forced = sorted({int(t) for t in always_include})
    if len(forced) > size:
        raise ValueError(f"{len(forced)} always-included tokens do not fit a draft vocabulary of {size}.")
    chosen = set(forced)
    for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(chosen) >= size:
            break
        chosen.add(int(token))
    filler = (t for t in range(vocab_size) if t not in chosen)  # rare: fewer distinct tokens than `size`
    while len(chosen) < size:
        chosen.add(next(filler))
    return normalise_token_ids(sorted(chosen), vocab_size)


def coverage(counts: Counter, token_ids: torch.Tensor) -> float:
    """Share of the counted supervised tokens that fall inside the draft vocabulary (0..1)."""
    total = sum(counts.values())
    if total == 0:
        return 0.0
    inside = set(token_ids.tolist())
    return sum(n for token, n in counts.items() if token in inside) / total
