"""Realised acceptance per request: observed positions, censoring, pooled prior and memory across calls."""

import torch

from hf_dspark.generation.acceptance import AcceptanceMemory, AcceptanceTracker, memory_for, observed_positions


def test_observed_positions_censor_after_a_fully_accepted_prefix():
    seen, kept = observed_positions(torch.tensor([3, 3, 0, 2]), torch.tensor([1, 3, 0, 2]), block_size=4)
    # ℓ=3, m=1: positions 1 (kept) and 2 (the rejection) observed; ℓ=3, m=3: 1..3 kept, 4 censored;
    # ℓ=0: nothing; ℓ=2, m=2: 1..2 kept, 3..4 censored
    assert seen.tolist() == [[True, True, False, False], [True, True, True, False], [False] * 4,
                             [True, True, False, False]]
    assert kept.tolist() == [[True, False, False, False], [True, True, True, False], [False] * 4,
                             [True, True, False, False]]


def test_tracker_estimates_per_request_with_the_pool_as_prior():
    tracker = AcceptanceTracker(block_size=3, memory=AcceptanceMemory.empty(3), decay=0.5, prior=0.5)
    assert torch.allclose(tracker.survival(["new"]), torch.tensor([[0.5, 0.25, 0.125]], dtype=torch.float64))
    tracker.observe(["good", "bad"], torch.tensor([3, 3]), torch.tensor([3, 0]))
    survival = tracker.survival(["good", "bad", "new"])
    pooled = tracker.pooled()
    # "good": q = (1 + pool) / 2 at each position; "bad": q1 = (0 + pool_1) / 2, later positions censored
    assert torch.allclose(survival[0], ((1 + pooled) / 2).cumprod(0))
    assert torch.allclose(survival[1, 0], pooled[0] / 2)
    assert torch.allclose(survival[1, 1:], survival[1, 0] * pooled[1:].cumprod(0))
    assert torch.allclose(survival[2], pooled.cumprod(0))
    assert survival[0, 0] > survival[2, 0] > survival[1, 0]
    tracker.forget(["good"])
    assert not tracker.observed("good") and tracker.observed("bad")


def test_memory_is_kept_per_drafter_across_calls():
    class Drafter:
        pass

    drafter = Drafter()
    memory = memory_for(drafter, 4)
    AcceptanceTracker(4, memory).observe([0], torch.tensor([4]), torch.tensor([4]))
    assert memory_for(drafter, 4) is memory and memory.observed
    assert not memory_for(drafter, 5).observed  # another γ: a fresh memory


def test_positions_never_reached_inherit_the_rate_before_them():
    """Good drafts verified at ℓ = 2 leave positions 3.. censored: they take position 2's rate, not the prior."""
    tracker = AcceptanceTracker(block_size=5, memory=AcceptanceMemory.empty(5), prior=0.5)
    for _ in range(4):
        tracker.observe(["a"], torch.tensor([2]), torch.tensor([2]))
    pooled = tracker.pooled()
    assert pooled[1] > 0.85 and torch.allclose(pooled[2:], pooled[1].expand(3))
    tracker.observe(["b"], torch.tensor([5]), torch.tensor([0]))  # a rejection at position 1 lowers only q_1 (and
    assert tracker.pooled()[0] < pooled[0]  # what inherits from it), observed evidence elsewhere stays
