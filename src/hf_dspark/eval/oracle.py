"""An oracle drafter that proposes the target's own greedy continuation: the speed ceiling of the loop.

It is a real `DSparkDrafter` (same cache, same loop, same verification) whose proposals are read from reference
sequences precomputed with plain greedy `generate`, so every draft is accepted under greedy decoding (up to
floating-point ties). Benchmarks use it to measure the loop's own overhead and the best speedup a machine allows.
"""

from __future__ import annotations

import torch

from ..configuration_dspark import DSparkConfig
from ..modeling_dspark import DSparkDrafter, DSparkProposal


class OracleDrafter(DSparkDrafter):
    """Proposes `reference[row][pos + 1 : pos + 1 + γ]`, where pos is the anchor's position in that row.

    `set_reference(sequences, attention_mask)` takes plain greedy `generate` output for the same prompts
    (left-padded `[B, L]`) and the prompt attention mask.
    """

    def set_reference(self, sequences: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        pads = (prompt_mask == 0).sum(dim=1)
        self.reference = [seq[int(p) :] for seq, p in zip(sequences, pads)]

    @torch.no_grad()
    def propose(self, anchor_ids, cache, *, do_sample=False, logits_processor=None, generator=None,
                return_probs=None, row_ids=None, histories=None) -> DSparkProposal:
        gamma, vocab = self.config.block_size, self.config.vocab_size
        rows = row_ids if row_ids is not None else list(range(anchor_ids.shape[0]))
        drafts = anchor_ids.new_zeros(len(rows), gamma)
        for a, row in enumerate(rows):
            ref = self.reference[row]
            start = int(cache.lengths[a]) + 1
            chunk = ref[start : start + gamma]
            drafts[a, : chunk.shape[0]] = chunk
            if chunk.shape[0] < gamma:  # past the reference: repeat the last token
                drafts[a, chunk.shape[0] :] = ref[-1]
        probs = torch.nn.functional.one_hot(drafts, vocab).float() if (return_probs or do_sample) else None
        ones = torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
        return DSparkProposal(drafts, probs, ones, ones * 0.99)


def oracle_for(target, block_size: int, sequences: torch.Tensor, prompt_mask: torch.Tensor) -> OracleDrafter:
    config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=1, head_type="none",
                                      use_confidence_head=False)
    oracle = OracleDrafter(config)
    oracle.bind_target(target)
    oracle.set_reference(sequences, prompt_mask)
    return oracle
