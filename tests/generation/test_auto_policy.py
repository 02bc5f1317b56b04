"""The cost-aware "auto" policy: plain-decoding rounds, subsets of drafting rows, probes; exact in every case."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.generation import oracle_for
from hf_dspark.generation.dispatch import disable, dspark_generate, enable
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.proposers.oracle import OracleDrafter
from hf_dspark.scheduling.verification_policy import VerificationPolicy
from hf_dspark.serving.engine import DSparkEngine
from tests.helpers import make_drafter, make_target, ragged_prompts, tapped_features

GAMMA = 4
FLAT = StepCurve([1, 4096], [1.0, 1.0])  # verification costs 1 s whatever B
DRAFT = StepCurve([1, 4096], [1 / 0.3, 1 / 0.3])  # a proposal costs 0.3 s for any number of rows


class FlakyOracle(OracleDrafter):
    """Right drafts while a row's generated length is outside [bad_from, bad_to), wrong ones inside."""

    def __init__(self, config, prompt_lengths: list[int], bad_from: list[int], bad_to: list[int]) -> None:
        super().__init__(config)
        self.prompt_lengths, self.bad_from, self.bad_to = prompt_lengths, bad_from, bad_to

    def propose(self, anchor_ids, cache, **kwargs):
        proposal = super().propose(anchor_ids, cache, **kwargs)
        rows = kwargs.get("row_ids") or list(range(anchor_ids.shape[0]))
        for a, row in enumerate(rows):
            generated = int(cache.lengths[a]) + 1 - self.prompt_lengths[row]
            if self.bad_from[row] <= generated < self.bad_to[row]:
                proposal.draft_ids[a] = (proposal.draft_ids[a] + 1) % self.config.vocab_size
        return proposal


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=21, eos_token_id=None)


def _plain(target, ids, mask, new):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new)


@pytest.mark.parametrize("batch", [1, 3])
def test_auto_switches_off_and_back_on_and_stays_bit_identical(target, batch):
    new = 110
    ids, mask = ragged_prompts(batch, seed=30 + batch)
    reference = _plain(target, ids, mask, new)
    base = oracle_for(target, GAMMA, reference, mask)
    lengths = mask.sum(dim=1).tolist()
    oracle = FlakyOracle(base.config, lengths, [20 + 7 * r for r in range(batch)], [50 + 7 * r for r in range(batch)])
    oracle.set_reference(reference, mask)
    config = GenerationConfig(do_sample=False, max_new_tokens=new, dspark_policy="auto", dspark_step_curve=FLAT,
                              dspark_draft_curve=DRAFT, dspark_measured_costs=False)
    output = target.generate(ids, attention_mask=mask, assistant_model=oracle, generation_config=config)
    assert torch.equal(output, reference)
    stats = oracle.last_generation_stats
    drafted = stats.drafted_rows
    assert stats.policy == "auto" and stats.skipped_rounds > 0
    first_skip = drafted.index(0)  # drafting resumes through the row's own retries (idle_decay) or probes
    assert any(d > 0 for d in drafted[:first_skip]) and any(d > 0 for d in drafted[first_skip:]), drafted
    assert stats.mean_accepted_length > 1.5  # the good stretches were drafted


def test_auto_with_an_untrained_drafter_decodes_plainly_and_matches(target):
    ids, mask = ragged_prompts(2, seed=5)
    drafter = make_drafter(target, block_size=GAMMA)
    config = GenerationConfig(do_sample=False, max_new_tokens=40, dspark_policy="auto", dspark_step_curve=FLAT,
                              dspark_draft_curve=DRAFT, dspark_measured_costs=False)
    output = target.generate(ids, attention_mask=mask, assistant_model=drafter, generation_config=config)
    assert torch.equal(output, _plain(target, ids, mask, 40))
    stats = drafter.last_generation_stats
    assert stats.skipped_rounds >= 0.8 * stats.rounds, stats.drafted_rows  # probes and a few hopeful rounds only
    assert stats.probes >= 1  # a drafter never observed is probed in its first round
    assert stats.policy_seconds > 0


def test_skipped_rounds_still_feed_the_drafter_its_context(target):
    """After plain-decoding rounds the draft cache equals one built from the full history at once."""
    drafter = make_drafter(target, block_size=GAMMA)
    policy = VerificationPolicy("auto", block_size=GAMMA, step_curve=FLAT, draft_curve=StepCurve([1, 64], [0.1, 0.1]),
                                measured_costs=False)
    engine = DSparkEngine(target, drafter, policy=policy)
    prompt = ragged_prompts(1, seed=8)[0][0]
    rid = engine.add_request(prompt, max_new_tokens=30)
    for _ in range(12):
        engine.step()
    assert sum(rec.drafted for rec in engine.records) <= 1  # at most the first probe drafted
    batch = engine.batch
    assert batch.pending, "plain rounds queue their context updates instead of running the drafter"
    assert batch.draft_cache.lengths.tolist() != batch.target_cache.next_position.tolist()
    batch.flush(drafter)
    assert not batch.pending
    assert batch.draft_cache.lengths.tolist() == batch.target_cache.next_position.tolist()
    _assert_row_context(target, drafter, batch.draft_cache, 0, prompt, engine.result(rid).generated)


def _assert_row_context(target, drafter, cache, row: int, prompt: torch.Tensor, generated: list[int]) -> None:
    """Row `row` of the draft cache holds exactly the context a fresh cache built from the history holds."""
    history = torch.cat([prompt, torch.tensor(generated[:-1], dtype=torch.long)])
    fresh = drafter.init_cache(1)
    drafter.extend_context(fresh, tapped_features(target, history[None], drafter.config.target_layer_ids),
                           torch.ones(1, history.numel(), dtype=torch.bool))
    count = history.numel()
    assert int(cache.lengths[row]) == count
    for mine, theirs in zip([*cache.keys, *cache.values], [*fresh.keys, *fresh.values]):
        assert torch.allclose(mine[row, :, :count], theirs[0, :, :count], atol=1e-4)


def test_queued_context_survives_requests_joining_and_leaving(target):
    """Requests leave and join while plain rounds' context updates wait; the flushed cache is right per row."""
    drafter = make_drafter(target, block_size=GAMMA)
    policy = VerificationPolicy("auto", block_size=GAMMA, step_curve=FLAT, draft_curve=StepCurve([1, 64], [0.1, 0.1]),
                                measured_costs=False)
    engine = DSparkEngine(target, drafter, policy=policy, max_running=2)
    ids, mask = ragged_prompts(4, seed=12)
    prompts = [ids[r][mask[r].bool()] for r in range(4)]
    rids = [engine.add_request(p, max_new_tokens=n) for p, n in zip(prompts, [6, 40, 9, 40])]
    joined_with_queue = False
    while engine.has_work():
        before = list(engine.batch.rows) if engine.batch is not None else []
        queued = engine.batch is not None and bool(engine.batch.pending)
        engine.step()
        after = list(engine.batch.rows) if engine.batch is not None else []
        joined_with_queue |= queued and any(r not in before for r in after)
        if engine.batch is not None and joined_with_queue and len(after) == 2 and engine.batch.pending:
            break
    assert joined_with_queue
    batch = engine.batch
    batch.flush(drafter)
    for a, rid in enumerate(batch.rows):
        prompt = prompts[rids.index(rid)]
        _assert_row_context(target, drafter, batch.draft_cache, a, prompt, engine.result(rid).generated)


def test_engine_auto_matches_plain_generate_for_joining_requests(target):
    ids, mask = ragged_prompts(5, seed=9)
    prompts = [ids[r][mask[r].bool()] for r in range(len(ids))]
    references = [_plain(target, p[None], torch.ones(1, p.numel(), dtype=torch.long), 24)[0] for p in prompts]
    oracle = oracle_for(target, GAMMA, references[0][None], torch.ones(1, 1))
    oracle.reference = list(references)
    engine = DSparkEngine(target, oracle, policy=VerificationPolicy("auto", block_size=GAMMA, step_curve=FLAT,
                                                                   draft_curve=DRAFT), max_running=3)
    rids = [engine.add_request(p, max_new_tokens=24) for p in prompts]
    while engine.has_work():
        engine.step()
    for rid, (prompt, ref) in zip(rids, zip(prompts, references)):
        assert engine.result(rid).generated == ref[prompt.numel() :].tolist()
    assert sum(rec.drafted > 0 for rec in engine.records) > len(engine.records) / 2  # good drafts are drafted


def test_auto_is_the_library_default(target, monkeypatch):
    from hf_dspark.generation import policy as policy_module

    monkeypatch.undo()  # the suite pins "fixed" for the mechanics tests (tests/conftest.py)
    assert policy_module.DEFAULT_POLICY == "auto"
    drafter = make_drafter(target, block_size=GAMMA)
    config = GenerationConfig(dspark_step_curve=FLAT, dspark_draft_curve=DRAFT)
    assert policy_module.policy_from_config(config, GAMMA, target=target, drafter=drafter).name == "auto"


def test_auto_starts_from_the_drafters_heldout_acceptance(target):
    """A calibrated drafter's measured acceptance (per decoding mode) is the pool's prior; uncalibrated: 0.5."""
    from hf_dspark.generation.policy import policy_from_config

    drafter = make_drafter(target, block_size=GAMMA)
    config = GenerationConfig(dspark_policy="auto", dspark_step_curve=FLAT, dspark_draft_curve=DRAFT)
    planner = policy_from_config(config, GAMMA, target=target, drafter=drafter).planner
    assert planner.tracker.pooled().tolist() == pytest.approx([0.5] * GAMMA)
    drafter.config.heldout_acceptance = {"greedy": [0.9, 0.8, 0.7, 0.6], "sampling": [0.3, 0.3, 0.2, 0.1]}
    for do_sample, rates in ((False, [0.9, 0.8, 0.7, 0.6]), (True, [0.3, 0.3, 0.2, 0.1])):
        config = GenerationConfig(dspark_policy="auto", dspark_step_curve=FLAT, dspark_draft_curve=DRAFT,
                                  do_sample=do_sample)
        planner = policy_from_config(config, GAMMA, target=target, drafter=drafter).planner
        assert planner.tracker.pooled().tolist() == pytest.approx(rates)
    from hf_dspark.eval.serve import make_policy  # the serving benchmark's engines start from it too

    for greedy, rates in ((True, [0.9, 0.8, 0.7, 0.6]), (False, [0.3, 0.3, 0.2, 0.1])):
        policy = make_policy("auto", GAMMA, FLAT, 0.5, DRAFT, memory_key=drafter, greedy=greedy)
        assert policy.planner.tracker.pooled().tolist() == pytest.approx(rates)
    policy = make_policy("auto", GAMMA, FLAT, 0.5, DRAFT, memory_key=drafter, acceptance_prior=[0.5, 0.5, 0.5, 0.5])
    assert policy.planner.tracker.pooled().tolist() == pytest.approx([0.5] * GAMMA)  # given rates win


def test_engine_refuses_an_auto_policy_built_for_the_other_decoding_mode(target):
    drafter = make_drafter(target, block_size=GAMMA)
    policy = VerificationPolicy("auto", block_size=GAMMA, step_curve=FLAT, draft_curve=DRAFT, greedy=True)
    with pytest.raises(ValueError, match=r"built for greedy.*do_sample=True.*greedy=False"):
        DSparkEngine(target, drafter, policy=policy, do_sample=True)
    sampled = VerificationPolicy("auto", block_size=GAMMA, step_curve=FLAT, draft_curve=DRAFT, greedy=False)
    assert DSparkEngine(target, drafter, policy=sampled, do_sample=True).policy is sampled


def test_max_pending_caps_the_queue_and_keeps_every_row_right(target):
    """With a small cap the queue is flushed while requests join and leave; every row's context stays right."""
    drafter = make_drafter(target, block_size=GAMMA)
    policy = VerificationPolicy("auto", block_size=GAMMA, step_curve=FLAT, draft_curve=StepCurve([1, 64], [0.1, 0.1]),
                                measured_costs=False)
    engine = DSparkEngine(target, drafter, policy=policy, max_running=2)
    engine.kernel.max_pending = 3
    ids, mask = ragged_prompts(5, seed=12)
    prompts = [ids[r][mask[r].bool()] for r in range(5)]
    rids = [engine.add_request(p, max_new_tokens=n) for p, n in zip(prompts, [5, 60, 8, 60, 11])]
    for _ in range(40):
        engine.step()
        assert engine.batch.pending_slots() < engine.kernel.max_pending
    batch = engine.batch
    batch.flush(drafter)
    for a, rid in enumerate(batch.rows):
        prompt = prompts[rids.index(rid)]
        _assert_row_context(target, drafter, batch.draft_cache, a, prompt, engine.result(rid).generated)


class _Collect:
    def __init__(self) -> None:
        self.records = []
        self.lock = threading.Lock()  # observers need not survive a deep copy

    def on_round(self, record) -> None:
        self.records.append(record)


@pytest.mark.parametrize("route", ["kwarg", "generation_config", "custom_generate"])
def test_observers_are_the_callers_objects(target, route):
    """`dspark_observers` reach the caller's own objects whichever way they are passed (transformers deep-copies a
    GenerationConfig, which must not copy the observers, nor fail on one holding a lock), one record per round."""
    ids, mask = ragged_prompts(2, seed=3)
    drafter = make_drafter(target, block_size=GAMMA)
    observer = _Collect()
    if route == "kwarg":
        target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                        dspark_observers=[observer])
    elif route == "generation_config":
        config = GenerationConfig(do_sample=False, max_new_tokens=12)
        config.dspark_observers = [observer]
        target.generate(ids, attention_mask=mask, generation_config=config, assistant_model=drafter)
        assert config.dspark_observers == [observer]  # the caller's config is left as it was
    else:
        disable(target)
        try:
            target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                            custom_generate=dspark_generate, drafter=drafter, dspark_observers=[observer])
        finally:
            enable(target)
    stats = drafter.last_generation_stats
    assert len(observer.records) == stats.rounds > 0
    assert [r.verify_len for r in observer.records] == [[lens[a] for a in sorted(lens)] for lens in stats.verify_lens]


def test_observers_where_they_would_be_copies_are_refused(target):
    ids, mask = ragged_prompts(1, seed=3)
    drafter = make_drafter(target, block_size=GAMMA)
    target.generation_config.dspark_observers = [_Collect()]
    try:
        with pytest.raises(ValueError, match="model's generation_config"):
            target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter)
    finally:
        del target.generation_config.dspark_observers
    config = GenerationConfig(do_sample=False, max_new_tokens=4)
    config.dspark_observers = [[]]  # unpatched, transformers copies the config before DSpark sees it
    disable(target)
    try:
        with pytest.raises(ValueError, match=r"dspark_observers=\[...\]"):
            target.generate(ids, attention_mask=mask, generation_config=config, custom_generate=dspark_generate,
                            drafter=drafter)
    finally:
        enable(target)
