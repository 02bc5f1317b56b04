"""Host-device sync points per verification round (`hf_dspark.diagnostics.SyncCounter`), fixed and auto, greedy
and sampling, at batch 1, 8 and 64, with the oracle drafter and with a learned `DSparkDrafter`: every one would
stall the device's queue on a GPU."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.diagnostics import COUNTED, SyncCounter
from hf_dspark.generation import loop as loop_module
from hf_dspark.generation import oracle_for
from hf_dspark.profiling.step_curve import StepCurve
from tests.helpers import make_drafter, make_target, ragged_prompts

FLAT = StepCurve([1, 4096], [1.0, 1.0])
NEW_TOKENS = 16
# the most sync points one round may have, per (batch, policy, sampling): the round's one packed download and, for
# "auto", the sunk-cost stop's read of this round's confidences; a round that verifies no draft (the last token of
# a budget) adds transformers' own mask check. The learned drafter adds none: its cache keeps a host mirror of its
# lengths, gets each row's committed count from the round's download and uploads its temperatures once, unblocked.
BOUND = {
    (batch, policy, sampling): 2 for batch in (1, 8, 64) for policy in ("fixed", "auto") for sampling in (False, True)
}
DRAFTERS = ("oracle", "dspark")
# where the learned drafter's rounds may sync at all: the round's download, the sunk-cost stop, transformers' masks
ALLOWED_SITES = ("transfer.py", "scheduling/padded.py", "transformers/masking_utils.py")


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=3, eos_token_id=None)


@pytest.fixture(scope="module")
def learned(target):
    """A tiny random `DSparkDrafter` (confidence head, Markov head) bound to `target`."""
    return make_drafter(target, seed=4)


def syncs_per_round(target, batch: int, policy: str, do_sample: bool, record_sites: bool = False, learned=None):
    """(sync points of each `DSparkLoop.step`, the events of each) for one generate call with the oracle drafter,
    or with `learned` when given (its parameters and buffers count as device tensors); greedy output is checked
    against plain generate."""
    ids, mask = ragged_prompts(batch, seed=batch)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS)
    if learned is None:
        drafter = oracle_for(target, 4, reference, mask)
        roots = (target, ids, mask, drafter.reference)
    else:
        drafter = learned
        roots = (target, learned, ids, mask)
        learned.__dict__.pop("_temperature_tensors", None)  # its first round uploads them again, counted
    options = dict(
        do_sample=do_sample,
        max_new_tokens=NEW_TOKENS,
        dspark_policy=policy,
        dspark_step_curve=FLAT,
        dspark_measured_costs=False,
    )
    if learned is not None:
        options.update(dspark_draft_curve=FLAT)  # given, so "auto" never profiles the drafter here
    if do_sample:
        options.update(top_k=0, temperature=1.0)
    counter = SyncCounter(*roots, record_sites=record_sites)
    rounds = []
    step = loop_module.DSparkLoop.step

    def counted_step(loop):
        before = len(counter.events)
        step(loop)
        rounds.append(counter.events[before:])

    patch = pytest.MonkeyPatch()
    patch.setattr(loop_module.DSparkLoop, "step", counted_step)
    try:
        torch.manual_seed(0)
        with counter:
            output = target.generate(
                ids, attention_mask=mask, assistant_model=drafter, generation_config=GenerationConfig(**options)
            )
    finally:
        patch.undo()
    if not do_sample:
        assert torch.equal(output, reference)
    return [sum(1 for e in events if e.kind in COUNTED) for events in rounds], rounds


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("policy", ["fixed", "auto"])
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_sync_points_per_round(target, learned, drafter, batch, policy, do_sample):
    dspark = drafter == "dspark"
    counts, rounds = syncs_per_round(
        target, batch, policy, do_sample, record_sites=dspark, learned=learned if dspark else None
    )
    assert counts, "no verification round ran"
    worst = max(range(len(counts)), key=counts.__getitem__)
    events = sorted({(e.kind, e.op) for e in rounds[worst] if e.kind in COUNTED})
    assert counts[worst] <= BOUND[batch, policy, do_sample], (counts, events)
    if dspark:  # the drafter's own propose / extend_context / cache growth read nothing back
        sites = {e.site for events in rounds for e in events if e.kind in COUNTED}
        assert all(site and any(a in site for a in ALLOWED_SITES) for site in sites), sites
