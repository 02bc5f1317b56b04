"""Tests for the DSpark losses (Eqs. 11-14)."""

from __future__ import annotations

import math

import pytest
import torch

from hf_dspark.ops.functional import position_weights
from hf_dspark.ops.losses import (
    IGNORE_INDEX,
    accepted_length_estimate,
    ce_loss,
    combine_losses,
    confidence_loss,
    dspark_loss,
    greedy_agreement,
    kd_loss,
    tv_loss,
    weighted_position_mean,
)


def _logits(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_position_weights_match_formula():
    gamma = 4
    expected = torch.tensor([math.exp(-(k - 1) / gamma) for k in range(1, gamma + 1)])
    torch.testing.assert_close(position_weights(gamma), expected)


def test_position_weights_take_a_decay_constant():
    """DeepSpec weighs position k by exp(-(k-1)/4) for every block size; the default constant is γ."""
    expected = torch.tensor([math.exp(-(k - 1) / 4.0) for k in range(1, 8)])
    torch.testing.assert_close(position_weights(7, decay=4.0), expected)
    assert not torch.allclose(position_weights(7, decay=4.0), position_weights(7))
    with pytest.raises(ValueError, match="decay constant"):
        position_weights(7, decay=0.0)


def test_the_loss_uses_the_decay_constant():
    logits, labels = _logits(2, 7, 11), torch.randint(0, 11, (2, 7))
    target = _logits(2, 7, 11, seed=1).softmax(-1)
    ours = dspark_loss(logits, target, labels, alpha=(0.1, 0.9, 1.0))
    deepspec = dspark_loss(logits, target, labels, alpha=(0.1, 0.9, 1.0), decay=4.0)
    explicit = dspark_loss(logits, target, labels, alpha=(0.1, 0.9, 1.0), weights=position_weights(7, decay=4.0))
    torch.testing.assert_close(deepspec.loss, explicit.loss)
    assert not torch.allclose(ours.loss, deepspec.loss)


def test_equal_distributions_give_zero_tv_and_full_acceptance():
    logits = _logits(2, 3, 4, 11)
    labels = torch.randint(0, 11, (2, 3, 4))
    out = dspark_loss(logits, logits.softmax(-1), labels, confidence_logits=torch.zeros(2, 3, 4))
    assert out.tv.item() == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(out.acceptance_rate, torch.ones(4))
    assert out.accepted_length.item() == pytest.approx(5.0)  # 1 + γ
    assert out.confidence_mae.item() == pytest.approx(0.5)  # σ(0) against c* = 1


def test_ce_hand_computed():
    # one block, γ = 2, V = 2: p = softmax([0, 0]) = 0.5 at k=1; softmax([ln 3, 0]) = 0.75 at k=2
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])
    labels = torch.tensor([[1, 0]])
    w = position_weights(2)
    expected = (w[0] * math.log(2.0) + w[1] * -math.log(0.75)) / w.sum()
    assert ce_loss(logits, labels, w).item() == pytest.approx(float(expected), rel=1e-6)


def test_tv_hand_computed():
    p_draft = torch.tensor([[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]])
    p_target = torch.tensor([[[0.5, 0.0, 0.5], [1.0, 0.0, 0.0]]])
    w = torch.tensor([1.0, 0.5])
    mask = torch.ones(1, 2, dtype=torch.bool)
    # ‖·‖₁ = 1.0 at k=1, 0 at k=2 -> (1·1 + 0.5·0) / 1.5
    assert tv_loss(p_draft, p_target, mask, w).item() == pytest.approx(1.0 / 1.5)


def test_confidence_loss_is_bce_against_detached_soft_label():
    logits = torch.tensor([[0.0, 2.0]], requires_grad=True)
    target = torch.tensor([[0.25, 1.0]], requires_grad=True)
    w = torch.tensor([1.0, 1.0])
    loss = confidence_loss(logits, target, torch.ones(1, 2, dtype=torch.bool), w)
    s = 1 / (1 + math.exp(-2.0))
    expected = (-(0.25 * math.log(0.5) + 0.75 * math.log(0.5)) - math.log(s)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert target.grad is None and logits.grad is not None


def test_invalid_positions_are_ignored():
    logits = _logits(1, 2, 3, 7, seed=1)
    target = _logits(1, 2, 3, 7, seed=2)
    labels = torch.randint(0, 7, (1, 2, 3))
    labels[0, 1, 2] = IGNORE_INDEX
    labels[0, 0, 1:] = IGNORE_INDEX
    base = dspark_loss(logits, target.softmax(-1), labels, confidence_logits=torch.zeros(1, 2, 3))
    noisy_logits, noisy_target = logits.clone(), target.clone()
    noisy_logits[0, 1, 2] += 100 * torch.randn(7)
    noisy_target[0, 0, 2] -= 50
    other = dspark_loss(noisy_logits, noisy_target.softmax(-1), labels, confidence_logits=torch.zeros(1, 2, 3))
    for name in ("loss", "ce", "tv", "confidence", "confidence_mae", "accepted_length"):
        torch.testing.assert_close(getattr(base, name), getattr(other, name))
    assert base.num_positions == 3


def test_all_invalid_gives_zero_loss_with_gradient_path():
    logits = _logits(1, 1, 3, 5).requires_grad_()
    labels = torch.full((1, 1, 3), IGNORE_INDEX)
    out = dspark_loss(logits, logits.detach().softmax(-1), labels, confidence_logits=torch.zeros(1, 1, 3))
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert torch.count_nonzero(logits.grad) == 0
    assert out.accepted_length.item() == 1.0


def test_weights_change_the_mean():
    values = torch.tensor([[1.0, 0.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert weighted_position_mean(values, mask, torch.tensor([3.0, 1.0])).item() == pytest.approx(0.75)


def test_tau_estimate_hand_computed():
    acc = torch.tensor([[0.5, 0.5, 1.0], [0.9, 0.9, 0.9], [0.3, 0.3, 0.3]])
    mask = torch.tensor([[True, True, True], [True, True, False], [False, False, False]])
    # block 1: 1 + .5 + .25 + .25 = 2.0; block 2 (last invalid = rejected): 1 + .9 + .81 = 2.71; block 3 skipped
    assert accepted_length_estimate(acc, mask).item() == pytest.approx((2.0 + 2.71) / 2)


def test_combined_alpha_and_gradients_only_to_draft():
    logits = _logits(2, 2, 3, 9, seed=3).requires_grad_()
    target = _logits(2, 2, 3, 9, seed=4).requires_grad_()
    conf = torch.zeros(2, 2, 3, requires_grad=True)
    labels = torch.randint(0, 9, (2, 2, 3))
    out = dspark_loss(logits, target.softmax(-1), labels, conf, alpha=(0.1, 0.9, 1.0))
    expected = combine_losses(out.ce, out.tv, out.confidence, (0.1, 0.9, 1.0))
    torch.testing.assert_close(out.loss, 0.1 * out.ce + 0.9 * out.tv + out.confidence)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert target.grad is None and logits.grad is not None and conf.grad is not None
    metrics = out.metrics()
    assert set(metrics) >= {"loss_ce", "loss_tv", "loss_conf", "tau_est", "conf_mae", "acc_rate_k1", "acc_rate_k3"}


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape mismatch"):
        dspark_loss(torch.zeros(1, 2, 3, 5), torch.zeros(1, 2, 3, 6), torch.zeros(1, 2, 3, dtype=torch.long))


def test_draft_vocabulary_loss_equals_full_vocabulary_loss_with_zero_outside():
    """A drafter over a vocabulary subset is a full-vocabulary drafter with p_draft = 0 outside it: TV, acceptance
    and τ computed from the subset (target mass outside counted as lost) equal the full-vocabulary values."""
    vocab, subset = 9, torch.tensor([0, 2, 3, 7])
    draft_logits = _logits(2, 3, 4, subset.numel(), seed=5)
    p_target_full = _logits(2, 3, 4, vocab, seed=6).softmax(-1)
    labels_full = torch.randint(0, vocab, (2, 3, 4), generator=torch.Generator().manual_seed(7))
    full_logits = torch.full((2, 3, 4, vocab), float("-inf"))
    full_logits[..., subset] = draft_logits
    index = torch.full((vocab,), -1)
    index[subset] = torch.arange(subset.numel())
    labels_draft = index[labels_full].masked_fill(index[labels_full] < 0, IGNORE_INDEX)
    valid = torch.ones(2, 3, 4, dtype=torch.bool)
    sub = dspark_loss(draft_logits, p_target_full[..., subset], labels_draft, valid=valid)
    p_draft_full = full_logits.softmax(-1)
    tv_full = (p_draft_full - p_target_full).abs().sum(-1)
    accept_full = torch.minimum(p_draft_full, p_target_full).sum(-1)
    w = position_weights(4)
    assert sub.tv.item() == pytest.approx(float((tv_full * w).sum() / (w.sum() * 6)), rel=1e-5)
    torch.testing.assert_close(sub.acceptance_rate, accept_full.reshape(-1, 4).mean(0), rtol=1e-5, atol=1e-6)
    # CE only counts labels inside the subset
    inside = labels_draft.ne(IGNORE_INDEX)
    assert 0 < int(inside.sum()) < inside.numel()


def test_kd_hand_computed_and_zero_at_the_target():
    p_target = torch.tensor([[[0.5, 0.3, 0.2]]])
    log_p_draft = torch.tensor([[[0.25, 0.25, 0.5]]]).log()
    mask, weights = torch.ones(1, 1, dtype=torch.bool), torch.ones(1)
    expected = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    assert kd_loss(log_p_draft, p_target, mask, weights).item() == pytest.approx(expected, rel=1e-5)
    assert kd_loss(p_target.log(), p_target, mask, weights).item() == pytest.approx(0.0, abs=1e-7)
    # a draft vocabulary: p_target restricted (sums to < 1) is not renormalised; zeros contribute nothing
    restricted = torch.tensor([[[0.6, 0.0]]])
    log_q = torch.tensor([[[0.75, 0.25]]]).log()
    assert kd_loss(log_q, restricted, mask, weights).item() == pytest.approx(0.6 * math.log(0.6 / 0.75), rel=1e-5)


def test_kd_raises_a_token_the_drafter_all_but_excludes_where_tv_does_not():
    """The reason for the term: Eq. (12)'s gradient on a logit is p_draft·(s − E[s]), ~0 for a token the drafter
    gives ~0 mass, however much the target wants it; KL's is p_draft − p_target."""
    p_target = torch.tensor([[[0.5, 0.5, 0.0]]])
    logits = torch.tensor([[[-12.0, 6.0, 0.0]]], requires_grad=True)
    mask, weights = torch.ones(1, 1, dtype=torch.bool), torch.ones(1)
    (grad_tv,) = torch.autograd.grad(tv_loss(logits.softmax(-1), p_target, mask, weights), logits)
    (grad_kd,) = torch.autograd.grad(kd_loss(logits.log_softmax(-1), p_target, mask, weights), logits)
    assert abs(grad_tv[0, 0, 0].item()) < 1e-6  # TV: no push on token 0
    assert grad_kd[0, 0, 0].item() == pytest.approx(-0.5, abs=1e-4)  # KD: p_draft − p_target ≈ −0.5


def test_alpha_kd_adds_the_weighted_term_and_is_skipped_at_zero():
    logits, target = _logits(2, 2, 3, 7), _logits(2, 2, 3, 7, seed=1)
    labels = torch.randint(0, 7, (2, 2, 3), generator=torch.Generator().manual_seed(2))
    off = dspark_loss(logits, target.softmax(-1), labels)
    on = dspark_loss(logits, target.softmax(-1), labels, alpha_kd=0.5)
    assert off.kd is None and "loss_kd" not in off.metrics()
    expected = kd_loss(logits.log_softmax(-1), target.softmax(-1), labels.ne(IGNORE_INDEX), position_weights(3))
    torch.testing.assert_close(on.kd, expected)
    torch.testing.assert_close(on.loss, off.loss + 0.5 * expected)
    assert on.metrics()["loss_kd"] == pytest.approx(expected.item())


def test_greedy_agreement_by_hand_and_with_a_draft_vocabulary():
    p_draft = torch.tensor([[0.6, 0.4], [0.2, 0.8], [0.9, 0.1]])
    p_target = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.5, 0.5]])  # full vocabulary: argmax ties go to index 0
    assert greedy_agreement(p_draft, p_target).tolist() == [True, False, True]
    # restricted target rows: the subset's argmax is certain only when it beats the mass outside (1 - Σ)
    restricted = torch.tensor([[0.5, 0.1], [0.3, 0.1]])  # outside: 0.4 < 0.5 (certain), 0.6 > 0.3 (not)
    assert greedy_agreement(torch.tensor([[0.9, 0.1], [0.9, 0.1]]), restricted).tolist() == [True, False]


def test_greedy_metrics_in_the_loss_output():
    logits = _logits(1, 2, 3, 5)
    labels = torch.randint(0, 5, (1, 2, 3), generator=torch.Generator().manual_seed(3))
    same = dspark_loss(logits, logits.softmax(-1), labels)
    torch.testing.assert_close(same.greedy_rate, torch.ones(3))
    assert same.greedy_length.item() == pytest.approx(4.0) and same.metrics()["tau_greedy_est"] == pytest.approx(4.0)
    flipped = dspark_loss(logits, (-logits).softmax(-1), labels)  # the target's argmax is the drafter's argmin
    torch.testing.assert_close(flipped.greedy_rate, torch.zeros(3))
    assert flipped.metrics()["greedy_acc_k1"] == 0.0


def test_metrics_pooled_by_their_weights_do_not_depend_on_the_batching():
    """Two batches pooled with `metric_weights` give the metrics of the one batch holding both (a mean of per-batch
    means does not when the batches hold different numbers of valid blocks)."""
    gen = torch.Generator().manual_seed(5)
    logits, target = torch.randn(5, 4, 9, generator=gen), torch.randn(5, 4, 9, generator=gen)
    labels = torch.randint(0, 9, (5, 4), generator=gen)
    labels[3:, 2:] = IGNORE_INDEX  # ragged blocks
    labels[4, :] = IGNORE_INDEX  # an unused block
    conf = torch.randn(5, 4, generator=gen)
    whole = dspark_loss(logits, target.softmax(-1), labels, conf, alpha_kd=1.0)
    parts = [dspark_loss(logits[s], target[s].softmax(-1), labels[s], conf[s], alpha_kd=1.0)
             for s in (slice(0, 1), slice(1, 5))]
    for name, value in whole.metrics().items():
        pooled = sum(p.metrics()[name] * p.metric_weights()[name] for p in parts)
        pooled /= sum(p.metric_weights()[name] for p in parts)
        assert pooled == pytest.approx(value, rel=1e-5, abs=1e-6), name
    naive = sum(p.metrics()["tau_est"] for p in parts) / 2
    assert naive != pytest.approx(whole.metrics()["tau_est"], rel=1e-3)
