"""An oracle drafter that proposes the target's own greedy continuation: the speed ceiling of the loop.

A model-free drafter (`ModelFreeDrafter`: no network, no weights) behind the same protocol, cache bookkeeping,
loop and verification as a trained one, whose proposals are read from reference sequences precomputed with plain
greedy `generate`, so every draft is accepted under greedy decoding (up to floating-point ties). Benchmarks use it
to measure the loop's own overhead and the best speedup a machine allows. Its drafting costs ≈ nothing, which
the "auto" policy's cost model knows (`draft_curve = None`).
"""

from __future__ import annotations

import torch

from ..model.configuration_dspark import EMBEDDING_TAP, DSparkConfig
from ..model.modeling_outputs import DSparkProposal
from .base import ContextLengths, ModelFreeDrafter


class OracleDrafter(ModelFreeDrafter):
    """Proposes `reference[row][pos + 1 : pos + 1 + γ]`, where pos is the anchor's position in that row.

    `set_reference(sequences, attention_mask)` takes plain greedy `generate` output for the same prompts
    (left-padded `[B, L]`) and the prompt attention mask; `reference` may also be set to a list of per-row
    (unpadded) sequences, indexed by the loop's row ids (batch rows in `generate`, request ids in the engine).
    """

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        self.reference: list[torch.Tensor] = []

    def set_reference(self, sequences: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        pads = (prompt_mask == 0).sum(dim=1)
        self.reference = [seq[int(p) :] for seq, p in zip(sequences, pads)]

    @torch.no_grad()
    def propose(self, anchor_ids: torch.Tensor, cache: ContextLengths, *, do_sample: bool = False,
                logits_processor=None, generator=None, return_probs: bool | None = None,
                row_ids: list[int] | None = None, histories=None) -> DSparkProposal:
        gamma = self.config.block_size
        rows = row_ids if row_ids is not None else list(range(anchor_ids.shape[0]))
        drafts = anchor_ids.new_zeros(len(rows), gamma)
        for a, row in enumerate(rows):
            ref = self.reference[row]
            start = int(cache.lengths[a]) + 1
            chunk = ref[start : start + gamma]
            drafts[a, : chunk.shape[0]] = chunk
            if chunk.shape[0] < gamma:  # past the reference: repeat the last token
                drafts[a, chunk.shape[0] :] = ref[-1]
        ones = torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
        return DSparkProposal(drafts, self.one_hot(drafts, bool(return_probs or do_sample)), ones, ones * 0.99)


def oracle_proposer(target, block_size: int, sequences: torch.Tensor, prompt_mask: torch.Tensor) -> OracleDrafter:
    """An oracle shaped for `target` with `sequences` as references (`hf_dspark.generation.oracle_for` also enables
    DSpark generate on the target)."""
    config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=1, head_type="none",
                                      use_confidence_head=False, target_layer_ids=[EMBEDDING_TAP])  # taps nothing
    oracle = OracleDrafter(config)
    oracle.set_reference(sequences, prompt_mask)
    return oracle
