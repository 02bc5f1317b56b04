"""Tree rounds under `auto` (`dspark_tree_budget` is then the maximum): the policy sizes each row's tree by cost,
keeping trees at batch 1 on a memory-bound curve and shrinking them to chains or nothing under load on a
compute-bound one; greedy output stays bit-identical to plain `generate`, with one read of the device for the
choice."""

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.profiling.step_curve import StepCurve
from tests.generation.test_families import make_family
from tests.generation.test_tree_round import second_best_oracle
from tests.helpers import make_drafter, ragged_prompts

FLAT = StepCurve([1, 4096], [1.0, 1.0])  # memory-bound: a forward costs the same whatever its width
KNEE = StepCurve([1, 16], [1.0, 1.0])  # flat up to 16 tokens a forward, compute-bound (SPS ∝ 1/B) beyond
CHEAP = StepCurve([1, 4096], [1000.0, 1000.0])  # the drafter's proposals per second: drafting is nearly free
BUDGET, GAMMA = 12, 4


def _auto(curve):
    return dict(dspark_policy="auto", dspark_tree_budget=BUDGET, dspark_step_curve=curve, dspark_draft_curve=CHEAP,
                dspark_measured_costs=False)


def _run(batch: int, seed: int, curve, **kwargs):
    target = make_family("llama")
    ids, mask = ragged_prompts(batch, seed=seed, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30, **kwargs)
    reference = target.generate(ids, **kwargs)
    oracle = second_best_oracle(target, GAMMA, reference, mask)
    output = target.generate(ids, assistant_model=oracle, **_auto(curve), **kwargs)
    return reference, output, oracle.last_generation_stats


def test_batch_one_on_a_flat_curve_keeps_trees():
    reference, output, stats = _run(1, seed=4, curve=FLAT)
    assert torch.equal(reference, output)
    nodes = [n for rnd in stats.tree_nodes for n in rnd.values()]
    assert nodes and max(nodes) > GAMMA  # more nodes than any chain of γ drafts: a tree
    assert stats.mean_accepted_length >= 2.5  # the second-best branches are reached
    assert stats.mean_tree_nodes == pytest.approx(sum(nodes) / len(nodes))
    assert stats.draft_tokens_verified == sum(nodes)


def test_load_on_a_compute_bound_curve_shrinks_trees():
    """8 rows and a knee at 16 tokens: at most one draft per row pays (B = 8·(1 + 1)); at 17 rows none does."""
    reference, output, stats = _run(8, seed=5, curve=KNEE)
    assert torch.equal(reference, output)
    nodes = [n for rnd in stats.tree_nodes for n in rnd.values()]
    assert nodes and max(nodes) <= 1
    assert all(len(rnd) + sum(rnd.values()) <= 16 for rnd in stats.tree_nodes)
    reference, output, stats = _run(17, seed=6, curve=KNEE)
    assert torch.equal(reference, output)
    assert stats.tree_nodes == [] and stats.skipped_rounds == stats.rounds


@pytest.mark.parametrize("head_type", ["markov", "rnn"])
@pytest.mark.parametrize("batch", [1, 3])
def test_auto_trees_greedy_matches_plain_generate(batch, head_type):
    """A learned drafter's trees sized by `auto` on every row layout, with history-free warpers."""
    target = make_family("qwen3")
    drafter = make_drafter(target, head_type=head_type)
    ids, mask = ragged_prompts(batch, seed=batch + 30, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=25)
    reference = target.generate(ids, **kwargs)
    assert torch.equal(reference, target.generate(ids, assistant_model=drafter, **_auto(FLAT), **kwargs))


def test_auto_keeps_the_hybrids_lookup_branch():
    """A repeated request: the suffix store's continuation, scored by its lookup forecast, survives the sizing."""
    from hf_dspark.proposers import hybrid_for

    target = make_family("llama")
    ids, mask = ragged_prompts(1, seed=5, min_len=6, max_len=6)
    hybrid = hybrid_for(make_drafter(target, block_size=GAMMA), "suffix")
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30)
    reference = target.generate(ids, **kwargs)
    for _ in range(2):  # the second call finds the first call's continuation in the suffix store
        assert torch.equal(reference, target.generate(ids, assistant_model=hybrid, **_auto(FLAT), **kwargs))
    assert hybrid.last_generation_stats.mean_accepted_length >= 3.0


def test_the_shaping_capability_is_declared():
    from hf_dspark.scheduling import get_policy

    assert get_policy("auto").supports_trees
    assert not get_policy("fixed").supports_trees


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("batch", [1, 8])
def test_auto_tree_rounds_read_the_device_twice(batch, do_sample):
    """The round's packed download and the choice's one read (kept sizes and depths), nothing else; a round that
    verifies nothing adds transformers' mask check instead of the choice."""
    from hf_dspark.diagnostics import COUNTED, SyncCounter
    from hf_dspark.generation import loop as loop_module

    target = make_family("llama", eos_token_id=None)
    ids, mask = ragged_prompts(batch, seed=batch)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    drafter = make_drafter(target, seed=4)
    drafter.__dict__.pop("_temperature_tensors", None)  # its first round uploads them again, counted
    options = dict(do_sample=do_sample, max_new_tokens=12, **_auto(FLAT))
    if do_sample:
        options.update(top_k=0, temperature=1.0)
    counter, rounds, step = SyncCounter(target, drafter, ids, mask), [], loop_module.DSparkLoop.step

    def counted_step(loop):
        before = len(counter.events)
        step(loop)
        rounds.append([e for e in counter.events[before:] if e.kind in COUNTED])

    with pytest.MonkeyPatch.context() as patch, counter:
        patch.setattr(loop_module.DSparkLoop, "step", counted_step)
        output = target.generate(ids, attention_mask=mask, assistant_model=drafter,
                                 generation_config=GenerationConfig(**options))
    if not do_sample:
        assert torch.equal(output, reference)
    assert drafter.last_generation_stats.tree_nodes
    assert rounds and max(len(events) for events in rounds) <= 2, [sorted({(e.kind, e.op) for e in r}) for r in rounds]
