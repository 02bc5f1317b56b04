"""Realised acceptance per request: observed positions, censoring, pooled prior and memory across calls."""

import itertools

import pytest
import torch

from hf_dspark.scheduling import PolicyMemory
from hf_dspark.scheduling.acceptance import (
    PRIOR_CLIP,
    AcceptanceMemory,
    AcceptanceTracker,
    heldout_acceptance,
    observed_positions,
)


def test_observed_positions_censor_after_a_fully_accepted_prefix():
    seen, kept = observed_positions(torch.tensor([3, 3, 0, 2]), torch.tensor([1, 3, 0, 2]), block_size=4)
    # ℓ=3, m=1: positions 1 (kept) and 2 (the rejection) observed; ℓ=3, m=3: 1..3 kept, 4 censored;
    # ℓ=0: nothing; ℓ=2, m=2: 1..2 kept, 3..4 censored
    assert seen.tolist() == [
        [True, True, False, False],
        [True, True, True, False],
        [False] * 4,
        [True, True, False, False],
    ]
    assert kept.tolist() == [
        [True, False, False, False],
        [True, True, True, False],
        [False] * 4,
        [True, True, False, False],
    ]


def test_tracker_estimates_per_request_with_the_pool_as_prior():
    tracker = AcceptanceTracker(block_size=3, memory=AcceptanceMemory.empty(3), decay=0.5, prior=0.5)
    assert torch.allclose(tracker.survival(["new"]), torch.tensor([[0.5, 0.25, 0.125]], dtype=torch.float64))
    tracker.observe(["good", "bad"], torch.tensor([3, 3]), torch.tensor([3, 0]))
    survival = tracker.survival(["good", "bad", "new"])
    pooled, w = tracker.pooled(), tracker.prior_weight
    # "good": q = (1 + w·pool) / (1 + w) at each position; "bad": q1 = (0 + w·pool_1) / (1 + w), later censored
    assert torch.allclose(survival[0], ((1 + w * pooled) / (1 + w)).cumprod(0))
    assert torch.allclose(survival[1, 0], w * pooled[0] / (1 + w))
    assert torch.allclose(survival[1, 1:], survival[1, 0] * pooled[1:].cumprod(0))
    assert torch.allclose(survival[2], pooled.cumprod(0))
    assert survival[0, 0] > survival[2, 0] > survival[1, 0]
    tracker.forget(["good"])
    assert not tracker.observed("good") and tracker.observed("bad")


def test_policy_memory_is_kept_per_mode_and_gamma_and_resets():
    """Sampled drafts are accepted less often than greedy ones: one mode's evidence must not move the other's."""
    owner = PolicyMemory()
    greedy, sampled = owner.for_mode(4, greedy=True), owner.for_mode(4, greedy=False)
    assert greedy is not sampled
    AcceptanceTracker(4, sampled).observe([0], torch.tensor([4]), torch.tensor([0]))
    assert sampled.observed and not greedy.observed
    assert owner.for_mode(4, greedy=False) is sampled and owner.for_mode(4, greedy=True) is greedy
    assert not owner.for_mode(5, greedy=False).observed  # another γ: a fresh memory
    owner.reset()
    assert not owner.for_mode(4, greedy=True).observed


def test_positions_never_reached_inherit_the_rate_before_them():
    """Good drafts verified at ℓ = 2 leave positions 3.. censored: they take position 2's rate, not the prior."""
    tracker = AcceptanceTracker(block_size=5, memory=AcceptanceMemory.empty(5), prior=0.5)
    for _ in range(4):
        tracker.observe(["a"], torch.tensor([2]), torch.tensor([2]))
    pooled = tracker.pooled()
    assert pooled[1] > 0.85 and torch.allclose(pooled[2:], pooled[1].expand(3))
    tracker.observe(["b"], torch.tensor([5]), torch.tensor([0]))  # a rejection at position 1 lowers only q_1 (and
    assert tracker.pooled()[0] < pooled[0]  # what inherits from it), observed evidence elsewhere stays


def test_an_informed_prior_is_the_pool_before_anything_is_observed_and_yields_to_data():
    """The drafter's held-out rates are the pool's prior, each position its own, held as `pool_prior_weight`."""
    rates = [0.4, 0.6, 0.7]
    tracker = AcceptanceTracker(3, AcceptanceMemory.empty(3), prior=rates, pool_prior_weight=8.0)
    assert torch.allclose(tracker.pooled(), torch.tensor(rates, dtype=torch.float64))
    tracker.observe(["a"], torch.tensor([3]), torch.tensor([0]))  # one rejection at position 1
    assert tracker.pooled()[0].item() == pytest.approx(8 * 0.4 / 9)  # one trial against eight pseudo-trials
    assert tracker.pooled()[1:].tolist() == pytest.approx(rates[1:])  # censored positions keep their own rates
    for _ in range(200):
        tracker.observe(["b"], torch.tensor([3]), torch.tensor([3]))
    # a long run of evidence outweighs the prior: one row's decayed counts saturate at 1 / (1 − 0.95) = 20 trials
    assert tracker.pooled().tolist() == pytest.approx([(20 + 8 * q) / 28 for q in rates], abs=1e-3)


def test_a_request_that_stops_drafting_drifts_back_to_the_pool():
    """Rounds without drafting multiply a request's own counts by idle_decay: after rejections its estimate
    recovers monotonically towards the pool, so it is re-tried rather than switched off for good."""
    tracker = AcceptanceTracker(2, AcceptanceMemory.empty(2), prior=[0.5, 0.5], pool_prior_weight=1e6)
    for _ in range(3):
        tracker.observe(["r", "other"], torch.tensor([2, 2]), torch.tensor([0, 2]))
    low = tracker.survival(["r"])[0, 0].item()
    assert low < 0.25
    estimates = []
    for _ in range(40):
        version = tracker.version
        tracker.observe(["r", "other"], torch.tensor([0, 2]), torch.tensor([0, 2]))  # "r" decodes plainly
        assert tracker.version > version
        estimates.append(tracker.survival(["r"])[0, 0].item())
    assert all(b > a for a, b in itertools.pairwise(estimates))
    assert estimates[-1] == pytest.approx(tracker.pooled()[0].item(), abs=0.01)
    frozen = AcceptanceTracker(2, AcceptanceMemory.empty(2), idle_decay=1.0)
    frozen.observe(["r"], torch.tensor([2]), torch.tensor([0]))
    version = frozen.version
    frozen.observe(["r"], torch.tensor([0]), torch.tensor([0]))
    assert frozen.version == version  # idle_decay = 1 keeps the old behaviour: nothing changes, nothing recomputed


def test_tracker_validates_its_prior():
    with pytest.raises(ValueError, match="prior must be one q or 3 rates"):
        AcceptanceTracker(3, AcceptanceMemory.empty(3), prior=[0.5, 0.5])
    with pytest.raises(ValueError, match="prior must be one q or 3 rates"):
        AcceptanceTracker(3, AcceptanceMemory.empty(3), prior=[0.5, 1.5, 0.5])
    with pytest.raises(ValueError, match="idle_decay"):
        AcceptanceTracker(3, AcceptanceMemory.empty(3), idle_decay=1.5)
    with pytest.raises(ValueError, match="pool_prior_weight"):
        AcceptanceTracker(3, AcceptanceMemory.empty(3), pool_prior_weight=0.0)


def test_heldout_acceptance_reads_the_drafter_config():
    from hf_dspark.model.configuration_dspark import DSparkConfig

    class Drafter:
        config = DSparkConfig(
            block_size=2,
            num_target_layers=4,
            target_layer_ids=[1],
            heldout_acceptance={"greedy": [0.7, 0.8], "sampling": [0.3, 0.4]},
        )

    assert heldout_acceptance(Drafter(), greedy=True) == [0.7, 0.8]
    assert heldout_acceptance(Drafter(), greedy=False) == [0.3, 0.4]
    assert heldout_acceptance(object(), greedy=True) is None  # model-free drafters have none
    with pytest.raises(ValueError, match="heldout_acceptance"):
        DSparkConfig(block_size=2, num_target_layers=4, target_layer_ids=[1], heldout_acceptance={"greedy": [0.7]})


def test_a_prior_rate_of_zero_is_clipped_so_the_position_can_still_be_verified():
    tracker = AcceptanceTracker(3, AcceptanceMemory.empty(3), prior=[0.9, 0.0, 1.0], pool_prior_weight=8.0)
    assert tracker.pooled().tolist() == pytest.approx([0.9, PRIOR_CLIP, 1 - PRIOR_CLIP])


def test_a_single_rows_update_on_floats_equals_the_array_path():
    """One drafting row takes the float path (`_observe_one`), the same row beside an idle one the array path: the
    counts, the pooled memory and the evidence mirror agree bit for bit over random rounds."""
    import random

    import numpy as np

    rng = random.Random(1)
    for _ in range(300):
        gamma = rng.randint(1, 6)
        alone = AcceptanceTracker(gamma, AcceptanceMemory.empty(gamma))
        beside = AcceptanceTracker(gamma, AcceptanceMemory.empty(gamma))
        for _ in range(rng.randint(1, 12)):
            length = rng.randint(0, gamma)
            accepted = rng.randint(0, length)
            alone.observe(["r"], [length], [accepted])
            beside.observe(["r", "idle"], [length, 0], [accepted, 0])
        assert ("r" in alone._slots) == ("r" in beside._slots)
        if "r" in alone._slots:
            slot_a, slot_b = alone._slots["r"], beside._slots["r"]
            assert np.array_equal(alone._counts[slot_a], beside._counts[slot_b])
            assert alone._evidence[slot_a] == beside._evidence[slot_b]
        assert torch.equal(alone.memory.successes, beside.memory.successes)
        assert torch.equal(alone.memory.trials, beside.memory.trials)


def test_slot_lookups_kept_for_the_same_rows_follow_new_and_forgotten_rows():
    """The rows' slots, kept between look-ups of the same rows, follow rows observed for the first time, rows
    forgotten and rows observed again: each estimate is the one a fresh tracker fed the same rounds gives."""
    import numpy as np

    def replay(tracker, check):
        rows = ["a", "b", "c"]
        check(tracker.host_conditional(rows))  # none observed yet: the pool's estimate
        tracker.observe(rows, [3, 0, 2], [1, 0, 2])  # "b" idle: no slot
        check(tracker.host_conditional(rows))
        tracker.observe(rows, [3, 3, 3], [0, 3, 1])  # now "b" gets one
        check(tracker.host_conditional(rows))
        tracker.forget(["a"])
        check(tracker.host_conditional(rows))
        tracker.observe(rows, [2, 2, 2], [2, 2, 2])
        check(tracker.host_conditional(rows))

    seen = []
    replay(AcceptanceTracker(3, AcceptanceMemory.empty(3)), seen.append)
    fresh = AcceptanceTracker(3, AcceptanceMemory.empty(3))
    look_up = fresh._slot_index

    def uncached(rows, create):
        fresh._last_slots = None  # every look-up afresh
        return look_up(rows, create)

    fresh._slot_index = uncached
    expected = []
    replay(fresh, expected.append)
    assert all(np.array_equal(a, b) for a, b in zip(seen, expected)) and len(seen) == 5
    assert not np.array_equal(seen[1][1], seen[2][1])  # "b"'s own evidence counts once it has a slot


def test_a_row_joining_after_another_left_never_shares_a_live_rows_counts():
    """Requests join and leave (the serving engine): a new row gets a cleared slot, never a live row's, so its
    estimate starts from the pool and forgetting it leaves the other rows' counts alone; the array stays bounded."""
    tracker = AcceptanceTracker(4, AcceptanceMemory.empty(4))
    tracker.observe(["a", "b"], [4, 4], [4, 0])
    b_counts = tracker._counts[tracker._slots["b"]].copy()  # b's own counts (its estimate also reads the pool)
    tracker.forget(["a"])
    tracker.observe(["c"], [4], [4])
    assert tracker._slots["c"] != tracker._slots["b"]
    assert (tracker._counts[tracker._slots["b"]] == b_counts).all()  # c's round did not touch b
    tracker.forget(["c"])
    assert (tracker._counts[tracker._slots["b"]] == b_counts).all()
    for i in range(100):  # one row in flight at a time beside b: two slots in use, never more
        tracker.observe([f"r{i}"], [4], [2])
        tracker.forget([f"r{i}"])
    assert tracker._counts.shape[0] <= 4
