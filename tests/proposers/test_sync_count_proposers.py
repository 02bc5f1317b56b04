"""Host-device sync points per verification round of the model-free and hybrid drafters
(`hf_dspark.diagnostics.SyncCounter`): each round reads the rows' new tokens once, whatever the batch, beside the
loop's own packed download."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.diagnostics import COUNTED, SyncCounter
from hf_dspark.generation import loop as loop_module
from hf_dspark.generation import prompt_lookup_for, suffix_proposer_for
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.proposers import hybrid_for
from hf_dspark.proposers.hybrid import DSPARK, LOOKUP
from tests.helpers import make_drafter, make_target, ragged_prompts

FLAT = StepCurve([1, 4096], [1.0, 1.0])
CHEAP = StepCurve([1, 4096], [1000.0, 1000.0])  # the DSpark drafter's cost curve: drafting nearly free
NEW_TOKENS = 16
GAMMA = 4
# per round: the loop's packed download and the drafter's one read of the rows' new tokens; "auto" adds the
# sunk-cost stop's read of this round's confidences (the hybrid's DSpark rows have a confidence head)
STEADY = {"lookup": {"fixed": 2, "auto": 2}, "suffix": {"fixed": 2, "auto": 2}, "hybrid": {"fixed": 2, "auto": 3}}
# once per call, in the round that first runs the DSpark drafter: its context update from the prompt (prefill
# gives no host counts), its rotary tables' first build and its confidence temperatures
FIRST_DSPARK_ROUND = 3
# once per call, in some round (the last, whose verification is shorter): transformers' own attention-mask check
TRANSFORMERS_MASK_CHECK = "masking_utils.py"


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=3, eos_token_id=None)


def _repetitive(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged prompts whose last 6 tokens repeat twice, so that lookup matches from the first round."""
    ids, mask = ragged_prompts(batch, seed=batch)
    tail = ids[:, -6:]
    return torch.cat([ids, tail, tail], dim=1), torch.cat([mask, torch.ones(batch, 12, dtype=torch.long)], dim=1)


def _drafter(target, kind: str):
    """(the drafter, the modules whose weights live on the device)."""
    if kind == "lookup":
        return prompt_lookup_for(target, GAMMA), ()
    if kind == "suffix":
        return suffix_proposer_for(target, GAMMA), ()
    inner = make_drafter(target, block_size=GAMMA, seed=1)
    return hybrid_for(inner, "prompt-lookup", draft_curve=CHEAP), (inner,)


def syncs_per_round(target, kind: str, batch: int, policy: str, do_sample: bool):
    """(each `DSparkLoop.step`'s counted events, the drafter) for one generate call; greedy output is checked
    against plain generate."""
    ids, mask = _repetitive(batch)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS)
    drafter, roots = _drafter(target, kind)
    options = dict(do_sample=do_sample, max_new_tokens=NEW_TOKENS, dspark_policy=policy, dspark_step_curve=FLAT,
                   dspark_measured_costs=False)  # fmt: skip
    if do_sample:
        options.update(top_k=0, temperature=1.0)
    counter = SyncCounter(target, ids, mask, *roots, record_sites=True)
    rounds = []
    step = loop_module.DSparkLoop.step

    def counted_step(loop):
        before = len(counter.events)
        step(loop)
        rounds.append([e for e in counter.events[before:] if e.kind in COUNTED])

    patch = pytest.MonkeyPatch()
    patch.setattr(loop_module.DSparkLoop, "step", counted_step)
    try:
        torch.manual_seed(0)
        with counter:
            output = target.generate(ids, attention_mask=mask, assistant_model=drafter,
                                     generation_config=GenerationConfig(**options))  # fmt: skip
    finally:
        patch.undo()
    if not do_sample:
        assert torch.equal(output, reference)
    return rounds, drafter


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("policy", ["fixed", "auto"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("kind", ["lookup", "suffix", "hybrid"])
def test_sync_points_per_round(target, kind, batch, policy, do_sample):
    rounds, drafter = syncs_per_round(target, kind, batch, policy, do_sample)
    assert len(rounds) > 2, "too few verification rounds ran"
    mask_checks = [sum(TRANSFORMERS_MASK_CHECK in (e.site or "") for e in events) for events in rounds]
    assert sum(mask_checks) <= 1
    counts = [len(events) - checks for events, checks in zip(rounds, mask_checks)]
    first = next((i for i, events in enumerate(rounds) if any("modeling_dspark" in (e.site or "") for e in events)),
                 None)  # fmt: skip
    bound = STEADY[kind][policy]
    for i, count in enumerate(counts):
        extra = FIRST_DSPARK_ROUND if i == first else 0
        assert count <= bound + extra, (i, counts, sorted({(e.kind, e.site) for e in rounds[i]}))
    if kind == "hybrid":
        assert drafter.source_counts[DSPARK] > 0
        assert do_sample or drafter.source_counts[LOOKUP] > 0  # greedy: both sources drafted
        assert first is not None and all(c == bound for c in counts[first + 1 : -1])
