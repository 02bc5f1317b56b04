"""The batched DSpark decoding loop behind `generate(assistant_model=drafter)`, read next to the paper:

prefill (target hidden states of the tapped layers only) → per round, `round.RoundKernel` (shared with the serving
engine): plan → propose γ drafts per drafting row → choose ℓ_r → one target forward for all rows with ragged
lengths → per-row acceptance → commit (here: through the stopping criteria, streamed) → feed the drafter the target
features of the anchor and the accepted drafts.

Lossless by construction: greedy accepts a draft iff it is the target's (processed) argmax on the same prefix,
and sampling uses speculative sampling with both distributions processed identically; tokens are committed one
at a time through the stopping criteria, so EOS, `max_new_tokens` and `stop_strings` end a row exactly where
plain `generate` would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.utils import logging

from ..ops.functional import greedy_token_ids
from ..target.attention import packed_gqa_config
from ..target.output_cache import dict_output
from ..target.packed_linear import installed_linears, linear_packs_for
from ..target.static_cache import static_plan
from .call_checks import check_prompt
from .options import DSparkGenerationOptions
from .policy import policy_from_options
from .prefill import prefill_target
from .processors import RowProcessors
from .state import RowHistories, RowState
from .stats import DSparkGenerateOutput, DSparkGenerationStats
from .streaming import CommitStreamer
from .tree_round import round_kernel, verify_block_size

if TYPE_CHECKING:
    from ..proposers.base import DraftModel

logger = logging.get_logger(__name__)


def _pick(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(-1)
    return greedy_token_ids(scores)


class DSparkLoop:
    """One `generate` call's state; `run()` returns what `generate` returns.

    `generation_config.dspark_observers` (optional): more round observers (objects with `on_round(record)`),
    called after the call's own statistics.
    """

    def __init__(self, model, drafter: DraftModel, input_ids, logits_processor, stopping_criteria,
                 generation_config, options: DSparkGenerationOptions, streamer=None, **model_kwargs) -> None:
        self.model, self.drafter, self.config = model, drafter, generation_config
        self.do_sample = bool(generation_config.do_sample)
        self.model_kwargs = model_kwargs
        self.input_ids = input_ids
        batch = input_ids.shape[0]
        self.processors = RowProcessors(logits_processor, batch)
        self.rows = RowState(input_ids, stopping_criteria, generation_config)
        self.streaming = CommitStreamer(streamer, self.rows)
        block_size = drafter.config.block_size
        self.options = options  # parsed once, where the call was taken over
        self.policy = policy_from_options(options, block_size, greedy=not self.do_sample, target=model,
                                          drafter=drafter)
        self.stats = DSparkGenerationStats(batch, block_size, self.policy.name,
                                           record_confidence=bool(options.dspark_record_confidence))
        observers = [self.stats, *(options.dspark_observers or [])]
        packs = linear_packs_for(model, options.dspark_packed_weights)
        self.stats.packed_weights = packs is not None
        self.kernel = round_kernel(options.dspark_tree_budget, model, drafter, self.policy, self.processors,
                                   self.do_sample, observers, packs=packs)
        self.batch = None

    # ------------------------------------------------------------------ prefill
    def prefill(self) -> None:
        kwargs = self.model_kwargs
        out = prefill_target(self.model, self.input_ids, kwargs.get("attention_mask"), kwargs.get("position_ids"),
                             kwargs.get("cache"), self.kernel.taps,  # only the tokens a given cache does not hold yet
                             static=static_plan(self.model, self.config,
                                                verify_block_size(self.kernel, self.drafter.config.block_size)))
        valid = out.valid
        self.stats.prefill_tokens = int(valid.sum())
        raw = out.logits
        scores = self.processors.apply(range(len(valid)), list(self.input_ids), raw)
        first = _pick(scores, self.do_sample)
        self.rows.commit_rows(list(range(len(valid))), [[token] for token in first.tolist()], scores[:, None],
                              raw[:, None])
        self.streaming.flush()
        self.batch = self.kernel.start(list(range(len(valid))), first, out.target, out.features, valid)
        self._drop_finished()

    # ------------------------------------------------------------------ one round
    def step(self) -> None:
        rows = self.batch.rows
        histories = RowHistories(self.rows, rows)  # read only by drafters and processors that need them
        last = self.rows.max_length - 1
        lengths = self.rows.lengths
        cap = [last - lengths[r] for r in rows]  # host ints: budgets never visit the device

        def commit(tokens: list[list[int]], scores: torch.Tensor, logits: torch.Tensor) -> list[int]:
            return self.rows.commit_rows(rows, tokens, scores, logits)

        self.kernel.step(self.batch, histories, cap, commit)
        self.streaming.flush()
        self._drop_finished()

    # ------------------------------------------------------------------ bookkeeping
    def _drop_finished(self) -> None:
        rows = self.batch.rows
        keep = [a for a, row in enumerate(rows) if not self.rows.finished[row]]
        if len(keep) == len(rows):
            return
        self.policy.forget([row for row in rows if self.rows.finished[row]])
        if keep:
            self.batch.keep(keep)
        else:
            self.batch.rows = []

    def run(self):
        """Prefill, rounds until every row finished, then the statistics to the drafter (`record_generation`):
        the sequences, or with `return_dict_in_generate` a `DSparkGenerateOutput` whose `dspark_stats` they are."""
        self.prefill()
        # the config switched and the packed linear forwards installed once for every verification forward
        with packed_gqa_config(self.model), installed_linears(self.kernel.packs):
            while self.batch.rows:
                self.step()
        self.stats.compactions = self.batch.target_cache.compactions
        self.stats.max_cache_width = self.batch.target_cache.max_width
        self.drafter.record_generation(self.stats)
        self.streaming.end()
        sequences = self.rows.sequences()
        if not self.config.return_dict_in_generate:
            return sequences
        output = dict_output(self.model, self.config, self.rows, self.processors, sequences,
                             self.model_kwargs.get("attention_mask"))
        return DSparkGenerateOutput.with_stats(output, self.stats)


def dspark_decoding(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                    streamer=None, assistant_model=None, *, options: DSparkGenerationOptions, **model_kwargs):
    """The `_assisted_decoding` replacement used when the assistant is a DSpark drafter (`DraftModel`), for a call
    already checked (`call_checks.check_call`) whose `options` are parsed; the prompt is checked here, once
    (`call_checks.check_prompt`)."""
    model_kwargs.pop("inputs_tensor", None)
    for unused in ("assistant_tokenizer", "tokenizer", "logits_to_keep", "use_cache"):
        model_kwargs.pop(unused, None)
    check_prompt(model, assistant_model, input_ids, model_kwargs, generation_config)
    loop = DSparkLoop(model, assistant_model, input_ids, logits_processor, stopping_criteria, generation_config,
                      options, streamer=streamer, **model_kwargs)
    with torch.no_grad():
        return loop.run()
