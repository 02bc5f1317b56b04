"""DSpark training losses (docs/method.md, section 6; paper Eqs. 11-14), as pure tensor functions.

Shapes use `...` for any leading block dimensions (typically `[S, N]`: sequences × anchor blocks), `γ` for the
block size and `V` for the vocabulary. A position is *valid* when its label is not `IGNORE_INDEX`; invalid
positions (past the end of the text, outside the loss region, unused anchor slots) contribute nothing.

Normalisation (a stated departure from the paper's per-block sums): every loss is the w_k-weighted *mean* over
valid positions, Σ w_k·m·ℓ / Σ w_k·m. For a batch of complete blocks this is the paper's Σ_k w_k ℓ_k averaged over
blocks divided by the constant Σ_k w_k, so the α defaults keep their relative meaning while the loss scale does
not change with γ or with the number of anchors per batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .functional import position_weights

IGNORE_INDEX = -100
DEFAULT_ALPHA = (0.1, 0.9, 1.0)


def weighted_position_mean(values: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ w_k·m·x / Σ w_k·m over all positions (the reduction shared by Eqs. 11-13).

    values: `[..., γ]`; mask: bool `[..., γ]`; weights: `[γ]`. Returns a scalar (0 when nothing is valid, with a
    gradient path kept so distributed backward passes stay in step).
    """
    w = weights.to(values.dtype) * mask.to(values.dtype)
    total = w.sum()
    return (values * w).sum() / total.clamp_min(torch.finfo(values.dtype).tiny)


def ce_loss(
    draft_logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. (11): L_ce = −Σ_k w_k log p_draft_k(x*_k), as a weighted mean over valid positions.

    draft_logits: `[..., γ, V]`; labels: `[..., γ]` gold tokens (`IGNORE_INDEX` = invalid); weights: `[γ]`;
    mask: bool `[..., γ]` (defaults to `labels != IGNORE_INDEX`). Returns a scalar.
    """
    return nll_loss(torch.log_softmax(draft_logits.float(), dim=-1), labels, weights, mask)


def nll_loss(
    log_p_draft: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. (11) from log-probabilities `[..., γ, V]` (shares the log-softmax with Eq. 12 in `dspark_loss`)."""
    mask = labels.ne(IGNORE_INDEX) if mask is None else mask
    safe_labels = labels.masked_fill(~mask, 0)
    nll = -log_p_draft.gather(-1, safe_labels[..., None]).squeeze(-1)
    return weighted_position_mean(nll, mask, weights)


def total_variation(p_draft: torch.Tensor, p_target: torch.Tensor) -> torch.Tensor:
    """Eq. (12) per position: ‖p_draft_k − p_target_k‖₁ on the full vocabulary; `[..., V_d]` ×2 -> `[...]` in [0, 2].

    Both are given over the drafter's vocabulary (`V_d`: the draft vocabulary, or all of V). p_draft is zero
    outside it, so the target's mass there, 1 − Σ p_target (0 for a full vocabulary), adds to the distance.
    """
    outside = (1.0 - p_target.sum(dim=-1)).clamp_min(0.0)
    return (p_draft - p_target).abs().sum(dim=-1) + outside


def tv_loss(
    p_draft: torch.Tensor, p_target: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Eq. (12): L_tv = Σ_k w_k ‖p_draft_k − p_target_k‖₁, as a weighted mean over valid positions.

    p_draft, p_target: `[..., γ, V]` probabilities (p_target carries no gradient); mask: bool `[..., γ]`;
    weights: `[γ]`. Returns a scalar in [0, 2].
    """
    return weighted_position_mean(total_variation(p_draft, p_target.detach()), mask, weights)


def kd_loss(
    log_p_draft: torch.Tensor, p_target: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Distillation term (an extension, not in the paper): L_kd = Σ_k w_k KL(p_target_k ‖ p_draft_k) over the
    drafter's vocabulary, as a weighted mean over valid positions.

    log_p_draft: `[..., γ, V_d]` log-probabilities; p_target: `[..., γ, V_d]` the target's full-vocabulary softmax
    restricted to the drafter's vocabulary (rows sum to ≤ 1, not renormalised; no gradient); mask: bool `[..., γ]`;
    weights: `[γ]`. Returns a scalar ≥ 0 (0 when p_draft equals p_target on the subset and the subset holds all
    of p_target's mass). Its gradient on the drafter's logits, Σp_target·p_draft − p_target, raises every token
    the target likes however little mass the drafter gives it now; Eq. (12)'s gradient p_draft·(s − E[s]) does
    not, so a token the drafter all but excludes stays excluded under L_tv alone.
    """
    p_target = p_target.detach()
    kl = (torch.xlogy(p_target, p_target) - p_target * log_p_draft).sum(dim=-1)
    return weighted_position_mean(kl, mask, weights)


def confidence_loss(
    confidence_logits: torch.Tensor, acceptance: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Eq. (13): L_conf = −Σ_k w_k [c*_k log c_k + (1 − c*_k) log(1 − c_k)], c_k = σ(z_k), c* detached.

    confidence_logits: `[..., γ]` (z_k before the sigmoid); acceptance: `[..., γ]` soft labels c*_k (Eq. 8);
    mask: bool `[..., γ]`; weights: `[γ]`. Returns a scalar.
    """
    bce = F.binary_cross_entropy_with_logits(
        confidence_logits.float(), acceptance.detach().float().clamp(0.0, 1.0), reduction="none"
    )
    return weighted_position_mean(bce, mask, weights)


def combine_losses(
    ce: torch.Tensor, tv: torch.Tensor, conf: torch.Tensor | None, alpha: tuple[float, float, float] = DEFAULT_ALPHA
) -> torch.Tensor:
    """Eq. (14): L = α_ce·L_ce + α_tv·L_tv + α_conf·L_conf (L_conf dropped without a confidence head)."""
    alpha_ce, alpha_tv, alpha_conf = alpha
    loss = alpha_ce * ce + alpha_tv * tv
    return loss if conf is None else loss + alpha_conf * conf


def per_position_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unweighted mean of `values` `[..., γ]` over valid positions, per position k. Returns `[γ]` (NaN-free: 0)."""
    m = mask.to(values.dtype).reshape(-1, values.shape[-1])
    v = values.reshape(-1, values.shape[-1])
    return (v * m).sum(0) / m.sum(0).clamp_min(1.0)


def greedy_agreement(p_draft: torch.Tensor, p_target: torch.Tensor) -> torch.Tensor:
    """Where greedy verification would accept the draft: argmax p_draft = argmax p_target. `[..., V_d]` ×2 -> bool
    `[...]`.

    p_target is restricted to the drafter's vocabulary (rows may sum to < 1); its argmax over the subset is the
    target's argmax over the full vocabulary for certain only when it exceeds the mass outside the subset, so
    positions where it does not count as rejections (a lower bound; exact without a draft vocabulary).
    """
    top_target, argmax_target = p_target.max(dim=-1)
    certain = top_target > (1.0 - p_target.sum(dim=-1))
    return p_draft.argmax(dim=-1).eq(argmax_target) & certain


def accepted_length_estimate(acceptance: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """τ estimate: mean over blocks of 1 + Σ_k ∏_{i≤k} c*_i (docs/scheduling.md, section 1).

    acceptance: `[..., γ]` c*_k; mask: bool `[..., γ]`. Invalid positions count as rejected (c* = 0: nothing past
    the end of a reply can be accepted); blocks whose first position is invalid (unused anchor slots) are skipped.
    Returns a scalar (1.0 when no block is valid).
    """
    c = (acceptance * mask.to(acceptance.dtype)).reshape(-1, acceptance.shape[-1])
    blocks = mask.reshape(-1, mask.shape[-1])[:, 0]
    tau = 1.0 + torch.cumprod(c, dim=-1).sum(dim=-1)
    if not bool(blocks.any()):
        return tau.new_tensor(1.0)
    return tau[blocks].mean()


@dataclass
class DSparkLossOutput:
    """Parts of the DSpark objective (Eq. 14) and detached training metrics.

    Attributes:
        loss: scalar L (with gradient).
        ce, tv: scalars L_ce (Eq. 11), L_tv (Eq. 12).
        kd: scalar L_kd (`kd_loss`), or `None` when its weight is 0.
        confidence: scalar L_conf (Eq. 13), or `None` without confidence logits.
        acceptance_rate: `[γ]` mean c*_k per position over valid positions (detached).
        accepted_length: scalar τ estimate 1 + Σ_k ∏_{i≤k} c*_i (detached).
        confidence_mae: scalar mean |σ(z_k) − c*_k| over valid positions, or `None`.
        num_positions: 0-d tensor, the number of valid positions in the batch.
        greedy_rate: `[γ]` share of valid positions where greedy verification would accept (`greedy_agreement`),
            teacher-forced on the gold previous tokens (detached).
        greedy_length: scalar 1 + Σ_k ∏_{i≤k} [agreement_i], the T = 0 analogue of `accepted_length` (detached).
        position_counts: `[γ]` valid positions per block position; num_blocks: 0-d, blocks whose first position is
            valid; weight_mass: 0-d, Σ w_k·m, the losses' denominator. What each metric averages over
            (`metric_weights`); tensors on the loss's device, so the step reads them to the host once, there.
    """

    loss: torch.Tensor
    ce: torch.Tensor
    tv: torch.Tensor
    confidence: torch.Tensor | None
    acceptance_rate: torch.Tensor
    accepted_length: torch.Tensor
    confidence_mae: torch.Tensor | None
    num_positions: torch.Tensor | int
    kd: torch.Tensor | None = None
    greedy_rate: torch.Tensor | None = None
    greedy_length: torch.Tensor | None = None
    position_counts: torch.Tensor | None = None
    num_blocks: torch.Tensor | int = 0
    weight_mass: torch.Tensor | float = 0.0

    def metric_weights(self, names=None) -> dict[str, float]:
        """For each key of `metrics()` (or of `names`, its keys when already computed), how many items its value
        averages over (losses: their weight mass; τ: blocks; per-position rates: that position's valid count;
        `conf_mae`: positions), so batches pool exactly as one large batch would, whatever the batching (a mean of
        per-batch means is not)."""
        gamma = len(self.acceptance_rate)
        per_position = self.position_counts if self.position_counts is not None else torch.zeros(gamma)
        scalars = [torch.as_tensor(v, dtype=torch.float32).reshape(1)
                   for v in (self.num_positions, self.num_blocks, self.weight_mass)]
        device = per_position.device
        stacked = torch.cat([s.to(device) for s in scalars] + [per_position.float().reshape(-1)]).tolist()  # one sync
        num_positions, num_blocks, weight_mass, counts = stacked[0], stacked[1], stacked[2], stacked[3:]
        weights = {}
        for name in self.metrics() if names is None else names:
            if name.startswith(("acc_rate_k", "greedy_acc_k")):
                weights[name] = counts[int(name.rsplit("k", 1)[1]) - 1]
            elif name.startswith("tau"):
                weights[name] = num_blocks
            elif name == "conf_mae":
                weights[name] = num_positions
            else:
                weights[name] = weight_mass
        return weights

    def metrics(self) -> dict[str, float]:
        """Flat float metrics for logging: loss parts, `acc_rate_k{k}` (1-based), `tau_est`, `conf_mae`."""
        named = {"loss_ce": self.ce, "loss_tv": self.tv, "tau_est": self.accepted_length}
        if self.kd is not None:
            named["loss_kd"] = self.kd
        if self.confidence is not None:
            named["loss_conf"] = self.confidence
        if self.confidence_mae is not None:
            named["conf_mae"] = self.confidence_mae
        for k, rate in enumerate(self.acceptance_rate, start=1):
            named[f"acc_rate_k{k}"] = rate
        if self.greedy_length is not None:
            named["tau_greedy_est"] = self.greedy_length
            for k, rate in enumerate(self.greedy_rate, start=1):
                named[f"greedy_acc_k{k}"] = rate
        values = torch.stack([v.detach().float().reshape(()) for v in named.values()]).tolist()  # one device sync
        return dict(zip(named, values))


def dspark_loss(
    draft_logits: torch.Tensor,
    p_target: torch.Tensor,
    labels: torch.Tensor,
    confidence_logits: torch.Tensor | None = None,
    alpha: tuple[float, float, float] = DEFAULT_ALPHA,
    weights: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    alpha_kd: float = 0.0,
    decay: float | None = None,
) -> DSparkLossOutput:
    """Eq. (14) with its parts (Eqs. 11-13) and metrics, from teacher-forced drafter logits and target probabilities.

    draft_logits: `[..., γ, V_d]` (U + B with gold previous tokens) over the drafter's vocabulary (`V_d`: its draft
    vocabulary, or the full V); p_target: `[..., γ, V_d]` the target's probabilities for the same tokens, softmax over
    the FULL vocabulary restricted to the drafter's (rows sum to ≤ 1; no gradient); labels: `[..., γ]` gold tokens as
    drafter-vocabulary ids, `IGNORE_INDEX` where invalid or outside the draft vocabulary (Eq. 11 skips them);
    valid: bool `[..., γ]` positions that count for Eqs. 12-13 and the metrics (default: labels != IGNORE_INDEX; with a
    draft vocabulary pass the positions whose gold token exists, so positions the drafter cannot get right still
    count as rejections); confidence_logits: `[..., γ]` or `None`; alpha: (α_ce, α_tv, α_conf); weights: `[γ]`
    (default w_k of Eq. 11 with the decay constant `decay`, γ when None); alpha_kd: weight of the distillation
    term `kd_loss` added to Eq. (14) (0: the paper's objective, and L_kd is not computed). p_draft and p_target
    are both at temperature 1, the label the confidence head learns.
    """
    gamma = labels.shape[-1]
    if draft_logits.shape[:-1] != labels.shape or p_target.shape != draft_logits.shape:
        raise ValueError(
            f"shape mismatch: draft_logits {tuple(draft_logits.shape)}, p_target {tuple(p_target.shape)}, "
            f"labels {tuple(labels.shape)}; expected [..., γ, V_d], [..., γ, V_d], [..., γ]."
        )
    if weights is None:
        weights = position_weights(gamma, device=labels.device, decay=decay)
    ce_mask = labels.ne(IGNORE_INDEX)
    mask = ce_mask if valid is None else valid.bool()
    log_p_draft = torch.log_softmax(draft_logits.float(), dim=-1)
    p_draft = log_p_draft.exp()
    p_target = p_target.detach().float()
    ce = nll_loss(log_p_draft, labels, weights, ce_mask & mask)
    tv = tv_loss(p_draft, p_target, mask, weights)
    with torch.no_grad():
        acceptance = (1.0 - 0.5 * total_variation(p_draft, p_target)).clamp(0.0, 1.0)  # Eq. (8), Σ min(p_d, p_t)
        greedy = greedy_agreement(p_draft, p_target).to(acceptance.dtype)
    conf = mae = None
    if confidence_logits is not None:
        conf = confidence_loss(confidence_logits, acceptance, mask, weights)
        with torch.no_grad():
            err = (torch.sigmoid(confidence_logits.float()) - acceptance).abs()
            mae = (err * mask).sum() / mask.sum().clamp_min(1)
    kd = kd_loss(log_p_draft, p_target, mask, weights) if alpha_kd > 0 else None
    loss = combine_losses(ce, tv, conf, alpha)
    return DSparkLossOutput(
        loss=loss if kd is None else loss + alpha_kd * kd,
        ce=ce,
        tv=tv,
        confidence=conf,
        acceptance_rate=per_position_mean(acceptance, mask),
        accepted_length=accepted_length_estimate(acceptance, mask),
        confidence_mae=mae,
        num_positions=mask.sum().detach(),
        kd=kd,
        greedy_rate=per_position_mean(greedy, mask),
        greedy_length=accepted_length_estimate(greedy, mask),
        position_counts=mask.reshape(-1, gamma).sum(0).detach(),
        num_blocks=mask.reshape(-1, gamma)[:, 0].sum().detach(),
        weight_mass=(weights.to(torch.float32) * mask.to(torch.float32)).sum().detach(),
    )
