"""The batched DSpark decoding loop (DESIGN.md sections 3-4), read next to the paper:

prefill (target hidden states of the tapped layers only) → per round: propose γ drafts per row → choose ℓ_r →
one target forward for all rows with ragged lengths → per-row acceptance → commit, feeding the drafter the
target features of the anchor and the accepted drafts.

Lossless by construction: greedy accepts a draft iff it is the target's (processed) argmax on the same prefix,
and sampling uses speculative sampling with both distributions processed identically; tokens are committed one
at a time through the stopping criteria, so EOS, `max_new_tokens` and `stop_strings` end a row exactly where
plain `generate` would.
"""

from __future__ import annotations

import time

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from ..modeling_dspark import DSparkDrafter
from ..verification import verify_greedy, verify_sampling
from .candidate_generator import DSparkCandidateGenerator
from .policy import policy_from_config
from .prefill import prefill_target
from .processors import RowProcessors
from .state import RowState, validate_call
from .stats import DSparkGenerationStats
from .streaming import CommitStreamer

logger = logging.get_logger(__name__)


def _pick(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(-1)
    return scores.argmax(dim=-1)


class DSparkLoop:
    """One `generate` call's state; `run()` returns what `generate` returns."""

    def __init__(self, model, drafter: DSparkDrafter, input_ids, logits_processor, stopping_criteria,
                 generation_config, streamer=None, **model_kwargs) -> None:
        self.model, self.drafter, self.config = model, drafter, generation_config
        self.do_sample = bool(generation_config.do_sample)
        self.streamer = streamer
        self.model_kwargs = model_kwargs
        self.input_ids = input_ids
        self.taps = [i + 1 for i in drafter.config.target_layer_ids]
        batch = input_ids.shape[0]
        self.processors = RowProcessors(logits_processor, batch)
        self.rows = RowState(input_ids, stopping_criteria, generation_config)
        self.streaming = CommitStreamer(streamer, self.rows)
        self.generator = DSparkCandidateGenerator(drafter, self.processors, self.do_sample, range(batch))
        self.policy = policy_from_config(generation_config, drafter.config.block_size, target=model)
        self.stats = DSparkGenerationStats(
            batch, drafter.config.block_size, self.policy.name,
            record_confidence=bool(getattr(generation_config, "dspark_record_confidence", False)),
        )
        self.target = None
        self.anchor = None

    # ------------------------------------------------------------------ prefill
    def prefill(self) -> None:
        kwargs = self.model_kwargs
        out = prefill_target(self.model, self.input_ids, kwargs.get("attention_mask"), kwargs.get("position_ids"),
                             kwargs.get("cache"), self.taps)  # only the tokens a given cache does not hold yet
        valid = out.valid
        self.generator.add_context(out.features, valid)
        self.target = out.target
        self.stats.prefill_tokens = int(valid.sum())
        raw = out.logits
        scores = self.processors.apply(range(len(valid)), list(self.input_ids), raw)
        first = _pick(scores, self.do_sample)
        for row in range(len(valid)):
            self.rows.commit(row, [int(first[row])], scores[row : row + 1], raw[row : row + 1])
        self._stream()
        self.anchor = first
        self._drop_finished()

    # ------------------------------------------------------------------ one round
    def step(self) -> None:
        active = self.generator.rows
        histories = [self.rows.history(r) for r in active]
        start = time.perf_counter()
        proposal = self.generator.propose(self.anchor, histories)
        cap = torch.tensor([self.rows.remaining(r) - 1 for r in active], device=self.anchor.device)
        verify_len = self.policy(proposal, cap)
        self.stats.record_schedule(self.policy.last_schedule, proposal.confidence_logits)
        steps = 1 + int(verify_len.max())
        drafts = proposal.draft_ids[:, : steps - 1]
        inputs = torch.cat([self.anchor[:, None], drafts], dim=1)
        input_valid = torch.arange(steps, device=inputs.device)[None, :] <= verify_len[:, None]
        self.stats.draft_seconds += time.perf_counter() - start
        start = time.perf_counter()
        out = self.target.forward(self.model, inputs, input_valid, self.taps)
        scores = self.processors.apply_positions(active, histories, drafts, out.logits, verify_len + 1)
        if self.do_sample:
            draft_probs = proposal.draft_probs[:, : steps - 1]
            result = verify_sampling(drafts, draft_probs, torch.softmax(scores, dim=-1), verify_len)
        else:
            result = verify_greedy(drafts, scores.argmax(dim=-1), verify_len)
        self.stats.verify_seconds += time.perf_counter() - start
        self._commit_round(active, drafts, result, scores, out, verify_len, steps)

    def _commit_round(self, active, drafts, result, scores, out, verify_len, steps) -> None:
        accepted = result.num_accepted
        committed_counts = []
        for a, row in enumerate(active):
            m = int(accepted[a])
            tokens = [*drafts[a, :m].tolist(), int(result.next_token[a])]
            kept = self.rows.commit(row, tokens, scores[a, : m + 1], out.logits[a, : m + 1])
            committed_counts.append(kept)
        self._stream()
        self.stats.record_round(active, verify_len.tolist(), accepted.tolist(), committed_counts)
        kept_slots = 1 + accepted
        self.target.commit_last(steps, kept_slots)
        self.generator.update_candidate_strategy(None, None, accepted, features=out.features, committed=kept_slots)
        self.anchor = result.next_token
        self._drop_finished()

    # ------------------------------------------------------------------ bookkeeping
    def _stream(self) -> None:
        self.streaming.flush()

    def _drop_finished(self) -> None:
        active = self.generator.rows
        keep = [a for a, row in enumerate(active) if not self.rows.finished[row]]
        if len(keep) == len(active):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.anchor.device)
        self.generator.select_rows(index)
        if keep:
            self.target.select_rows(index)
            self.anchor = self.anchor.index_select(0, index)

    def run(self):
        self.prefill()
        while self.generator.rows:
            self.step()
        self.stats.compactions = self.target.compactions
        self.stats.max_cache_width = self.target.max_width
        self.drafter.last_generation_stats = self.stats
        self.streaming.end()
        sequences = self.rows.sequences()
        if not self.config.return_dict_in_generate:
            return sequences
        return GenerateDecoderOnlyOutput(
            sequences=sequences,
            scores=self.rows.step_scores("scores") if self.config.output_scores else None,
            logits=self.rows.step_scores("logits") if self.config.output_logits else None,
        )


def dspark_decoding(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                    streamer=None, assistant_model=None, **model_kwargs):
    """The `_assisted_decoding` replacement used when the assistant is a `DSparkDrafter`."""
    model_kwargs.pop("inputs_tensor", None)
    for unused in ("assistant_tokenizer", "tokenizer", "logits_to_keep", "use_cache"):
        model_kwargs.pop(unused, None)
    validate_call(model, assistant_model, generation_config)
    loop = DSparkLoop(model, assistant_model, input_ids, logits_processor, stopping_criteria, generation_config,
                      streamer=streamer, **model_kwargs)
    with torch.no_grad():
        return loop.run()
