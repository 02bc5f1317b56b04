"""`probe_layout`: which block layout a drafter's weights were trained for, measured rather than read.

The same weights can be read two ways (docs/checkpoints.md, "Block layouts"): anchor-first (the first draft comes
from slot 0, the anchor's own slot) or anchor + γ masks (it comes from slot 1, the first mask). A drafter served
under the wrong one drafts one position shifted and is accepted almost never, with no error. The probe runs the
target over a few dozen held-out tokens and measures the first-position greedy acceptance (the first draft equals the
target's greedy next token) under both readings; the weights were trained for the reading that scores higher.

The verdict reads the backbone's first draft (argmax of U_1, without the sequential head's bias): the head's bias
B_1 depends on the anchor alone, identically under both readings, so it pulls both proposals towards the same
bigram guess and narrows their gap; the backbone's slot is what the layout moves. Both are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout_flags import ANCHOR_FIRST, ANCHOR_PLUS_MASKS, layout_name

MIN_MARGIN = 0.05  # below this gap between the two acceptances the probe reports no verdict


@dataclass(frozen=True)
class LayoutProbe:
    """First-position greedy acceptance of a drafter read anchor-first and read as anchor + γ masks.

    Attributes:
        anchor_first: acceptance with the first draft read from slot 0.
        dflash: acceptance with the first draft read from slot 1 (the anchor + γ masks / "1 + N" block).
        positions: how many anchor positions were measured.
        declared: the layout the drafter's config declares ("anchor-first" or "dflash").
    """

    anchor_first: float
    dflash: float
    positions: int
    declared: str
    backbone_anchor_first: float | None = None
    backbone_dflash: float | None = None

    @property
    def measured(self) -> str | None:
        """The layout the weights were trained for (from the backbone's first draft when measured), or None when
        the two acceptances are too close to tell."""
        first, shifted = self.anchor_first, self.dflash
        if self.backbone_anchor_first is not None and self.backbone_dflash is not None:
            first, shifted = self.backbone_anchor_first, self.backbone_dflash
        if abs(first - shifted) < MIN_MARGIN:
            return None
        return ANCHOR_FIRST if first > shifted else ANCHOR_PLUS_MASKS

    @property
    def matches(self) -> bool | None:
        """Whether the declared layout is the measured one (None: no verdict)."""
        return None if self.measured is None else self.measured == self.declared

    def summary(self) -> str:
        """One paragraph for a person: both acceptances, the verdict and, on a mismatch, the fix."""
        head = (
            f"first-position acceptance over {self.positions} positions: anchor-first {self.anchor_first:.3f}, "
            f"anchor + γ masks (dflash) {self.dflash:.3f}"
        )
        if self.backbone_anchor_first is not None and self.backbone_dflash is not None:
            head += (
                f" (backbone alone, without the sequential head: anchor-first {self.backbone_anchor_first:.3f}, "
                f"dflash {self.backbone_dflash:.3f})"
            )
        head += f"; the config declares {self.declared}."
        if self.measured is None:
            return head + " The two are too close to tell (probe on more or more typical text)."
        if self.matches:
            return head + f" The weights were trained {self.measured}: the config is right."
        return (
            head + f" The weights were trained {self.measured}: the config is MISLABELLED; load it with "
            f"assume_layout='{self.measured}' (CLI --assume-layout {self.measured}) and export again."
        )


def first_position_hits(
    drafter,
    context: torch.Tensor,
    valid: torch.Tensor,
    anchors: torch.Tensor,
    wanted: torch.Tensor,
    anchor_first: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether the first greedy draft equals `wanted` per row, reading the block as `anchor_first` says: `[R]` bool
    for the proposal and for the backbone's draft alone (argmax of U_1, no sequential-head bias).

    context `[R, T, n·d]` tapped target features (left-padded; `valid` bool `[R, T]`), anchors / wanted `[R]`.
    The config's layout is switched for the call only (the weights do not depend on it)."""
    config = drafter.config
    declared = config.sample_from_anchor
    config.sample_from_anchor = anchor_first
    try:
        cache = drafter.init_cache(anchors.shape[0], capacity=context.shape[1] + config.block_size + 1)
        drafter.extend_context(cache, context, valid)
        proposal = drafter.propose(anchors, cache)
        backbone = drafter.lm_logits(drafter.block_hidden_states(anchors, cache)[:, 0]).argmax(-1)
    finally:
        config.sample_from_anchor = declared
    draft_ids = drafter.draft_token_ids()
    backbone = backbone if draft_ids is None else draft_ids[backbone]
    return proposal.draft_ids[:, 0] == wanted, backbone == wanted


def _rows(target, drafter, sequences: list[torch.Tensor], max_positions: int, min_context: int):
    """(context, valid, anchors, wanted) with one row per anchor position of the held-out sequences (anchors at
    positions >= `min_context`, each with everything before it as context)."""
    taps = [i + 1 for i in drafter.config.target_layer_ids]  # hidden_states index (tap -1 -> the embeddings)
    rows = []
    for ids in sequences:
        out = target(ids[None], output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in taps], dim=-1)[0]
        greedy = out.logits[0].argmax(-1)
        rows += [(feats[:t], ids[t], greedy[t]) for t in range(max(1, min_context), ids.shape[0])]
    rows = rows[:max_positions]
    if not rows:
        raise ValueError(f"probe_layout needs held-out sequences longer than min_context={min_context} tokens.")
    longest = max(r[0].shape[0] for r in rows)
    context = torch.zeros(len(rows), longest, rows[0][0].shape[-1], dtype=rows[0][0].dtype)
    valid = torch.zeros(len(rows), longest, dtype=torch.bool)
    for r, (feats, _, _) in enumerate(rows):
        context[r, longest - feats.shape[0] :] = feats
        valid[r, longest - feats.shape[0] :] = True
    device = drafter.fc.weight.device
    anchors = torch.stack([r[1] for r in rows]).to(device)
    wanted = torch.stack([r[2] for r in rows]).to(device)
    return context.to(device), valid.to(device), anchors, wanted


@torch.no_grad()
def probe_layout(
    drafter, target, input_ids: torch.Tensor | list[torch.Tensor], max_positions: int = 48, min_context: int = 1
) -> LayoutProbe:
    """Measure which block layout `drafter`'s weights were trained for on held-out token ids.

    Args:
        drafter: a `DSparkDrafter` bound to `target`.
        target: the target causal LM.
        input_ids: `[B, L]` or a list of 1-D id tensors of text neither was trained on (a few dozen tokens).
        max_positions: at most this many anchor positions are measured.
        min_context: anchors start at this position, so every measured draft sees at least this much context (a
            chat prompt, say): a drafter drafts poorly after a handful of tokens under either reading, and those
            positions only dilute the difference between the two.
    """
    drafter._require_bound()
    sequences = list(input_ids) if not torch.is_tensor(input_ids) or input_ids.dim() == 2 else [input_ids]
    device = next(target.parameters()).device
    sequences = [torch.as_tensor(s, dtype=torch.long).reshape(-1).to(device) for s in sequences]
    context, valid, anchors, wanted = _rows(target, drafter, sequences, max_positions, min_context)
    hits = [first_position_hits(drafter, context, valid, anchors, wanted, first) for first in (True, False)]
    rates = torch.stack([h.float().mean() for pair in hits for h in pair]).cpu().tolist()  # the one host transfer
    return LayoutProbe(
        rates[0],
        rates[2],
        int(anchors.shape[0]),
        layout_name(drafter.config.sample_from_anchor),
        backbone_anchor_first=rates[1],
        backbone_dflash=rates[3],
    )


__all__ = ["LayoutProbe", "first_position_hits", "probe_layout"]
