"""How a drafter to train is made: fresh or warm-started, its draft vocabulary, optional target-layer init.

* `build_training_drafter`: a fresh drafter shaped after the target (or a warm start from a trained drafter
  folder), bound to the target, with fp32 trainable weights (bf16 compute comes from autocast, not the weights).
* `draft_vocab_from_examples`: the `size` most frequent supervised tokens of the training replies (EOS ids always in),
  with the share of supervised tokens it covers.
* `init_layers_from_target`: copy the target's last decoder layers into the drafter's layers (same shapes and
  parameter names for Llama-like targets) instead of a random init.
* `convert_drafter`: a trained drafter rebuilt with changed architecture fields (`use_qk_norm=True` adds per-head
  q/k RMSNorms, which serving engines require), every existing weight copied over.
* `fit_qk_norms`: initialise those new norm weights so the normalised queries and keys reproduce the unnormalised
  ones in least squares over a few target batches (the attention logits stay close to the init's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from transformers.utils import logging

from ..drafter import DSparkDrafter
from ..model.configuration_dspark import DSparkConfig
from ..model.draft_vocab import count_tokens, coverage, select_draft_vocab
from .collator import DSparkCollator
from .features import compute_target_features

logger = logging.get_logger(__name__)


def draft_vocab_from_examples(
    examples: Iterable[Mapping[str, Any]], size: int, vocab_size: int, always_include: Iterable[int] = ()
) -> tuple[torch.Tensor, float]:
    """(sorted target ids `[size]`, coverage 0..1) from the loss-masked tokens of tokenised training examples."""
    counts = count_tokens((e["input_ids"], e["loss_mask"]) for e in examples)
    ids = select_draft_vocab(counts, size, vocab_size, always_include)
    return ids, coverage(counts, ids)


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids a reply can end with (EOS and the chat template's end-of-turn token when it has one)."""
    if tokenizer is None:
        return []
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id >= 0:
            ids.add(token_id)
    return sorted(ids)


@torch.no_grad()
def init_layers_from_target(drafter: DSparkDrafter, target: nn.Module) -> list[int]:
    """Copy the target's last `num_hidden_layers` decoder layers into the drafter's layers. Returns their indices.

    Only parameters whose names and shapes match are copied (attention projections, q/k norms, MLP, layer norms);
    raises ValueError when the target exposes no `model.layers` or nothing matches.
    """
    layers = getattr(getattr(target, "model", None), "layers", None)
    if layers is None:
        raise ValueError("init from target layers needs a target with `model.layers` (a Llama-like decoder).")
    chosen = list(range(len(layers) - len(drafter.layers), len(layers)))
    copied = 0
    for mine, index in zip(drafter.layers, chosen):
        source = dict(layers[index].named_parameters())
        for name, param in mine.named_parameters():
            if name in source and source[name].shape == param.shape:
                param.copy_(source[name].to(param.dtype))
                copied += 1
    if copied == 0:
        raise ValueError("no drafter layer parameter matches the target's layers by name and shape.")
    return chosen


CONVERTIBLE_FIELDS = ("use_qk_norm",)  # fields a warm start may change: they only add parameters


@torch.no_grad()
def convert_drafter(source: DSparkDrafter, target: nn.Module, **changes: Any) -> tuple[DSparkDrafter, list[str]]:
    """(`source` rebuilt with the `changes` to its config and bound to `target`, names of its new parameters).

    Every parameter and buffer of `source` is copied; the new ones (q/k norms for `use_qk_norm=True`) keep their
    default init (ones) until `fit_qk_norms`. Only fields that add parameters can change (`CONVERTIBLE_FIELDS`);
    anything that would drop or reshape a trained weight is refused.
    """
    unknown = sorted(set(changes) - set(CONVERTIBLE_FIELDS))
    if unknown:
        raise ValueError(f"a warm start can only change {CONVERTIBLE_FIELDS}, not {unknown}; train a fresh drafter.")
    if changes.get("use_qk_norm") is False and source.config.use_qk_norm:
        raise ValueError(
            "the init drafter has q/k norms; removing them would discard trained weights. Keep "
            "use_qk_norm=True (or unset) with this init."
        )
    config = DSparkConfig.from_dict({**source.config.to_dict(), **changes})
    converted = DSparkDrafter(config).bind_target(target)
    result = converted.load_state_dict(source.state_dict(), strict=False)
    if result.unexpected_keys:
        raise ValueError(f"the converted drafter has no place for {result.unexpected_keys}.")
    return converted, list(result.missing_keys)


class _SecondMoments:
    """Per-dimension sums over the heads of one projection: Σx², Σx·u and Σu² with u = x / rms(x)."""

    def __init__(self, head_dim: int, eps: float) -> None:
        self.head_dim, self.eps = head_dim, eps
        self.xx = self.xu = self.uu = torch.zeros(head_dim, dtype=torch.float64)

    def __call__(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        x = output.detach().double().reshape(-1, self.head_dim).cpu()
        u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        self.xx, self.xu, self.uu = self.xx + (x * x).sum(0), self.xu + (x * u).sum(0), self.uu + (u * u).sum(0)

    def fit(self) -> tuple[torch.Tensor, float, float]:
        """(w minimising Σ‖w⊙u − x‖², relative residual with that w, relative residual with w = 1)."""
        weight = self.xu / self.uu.clamp_min(1e-30)
        total = self.xx.sum().clamp_min(1e-30)
        fitted = (self.xx - self.xu.pow(2) / self.uu.clamp_min(1e-30)).sum().clamp_min(0) / total
        ones = (self.xx - 2 * self.xu + self.uu).sum() / total
        return weight, float(fitted.sqrt()), float(ones.sqrt())


@torch.no_grad()
def fit_qk_norms(
    source: DSparkDrafter, converted: DSparkDrafter, run_batches: Callable[[DSparkDrafter], None]
) -> dict[str, dict[str, float]]:
    """Set every q/k norm weight of `converted` so that the normalised projections w ⊙ x/rms(x) match `source`'s
    unnormalised ones x in least squares: w_d = Σ x_d·u_d / Σ u_d² over the positions `run_batches(source)` runs
    (a few teacher-forced target batches). The attention logits q·k then stay close to the init's wherever a row's
    rms is near its typical value. Returns per layer the relative residual ‖w⊙u − x‖/‖x‖ with the fitted w and
    with w = 1 (the default init), for the log.
    """
    stats, handles = [], []
    for layer in source.layers:
        attn = layer.self_attn
        pair = (
            _SecondMoments(attn.head_dim, source.config.rms_norm_eps),
            _SecondMoments(attn.head_dim, source.config.rms_norm_eps),
        )
        handles += [attn.q_proj.register_forward_hook(pair[0]), attn.k_proj.register_forward_hook(pair[1])]
        stats.append(pair)
    try:
        run_batches(source)
    finally:
        for handle in handles:
            handle.remove()
    report = {}
    for index, (layer, (q_stats, k_stats)) in enumerate(zip(converted.layers, stats)):
        if not float(q_stats.uu.sum()) or not float(k_stats.uu.sum()):
            raise ValueError("fit_qk_norms saw no positions: run_batches ran no drafter forward.")
        q_weight, q_fit, q_ones = q_stats.fit()
        k_weight, k_fit, k_ones = k_stats.fit()
        attn = layer.self_attn
        attn.q_norm.weight.copy_(q_weight.to(attn.q_norm.weight))
        attn.k_norm.weight.copy_(k_weight.to(attn.k_norm.weight))
        report[f"layer_{index}"] = {
            "q_residual": q_fit,
            "q_residual_ones": q_ones,
            "k_residual": k_fit,
            "k_residual_ones": k_ones,
        }
    return report


def build_training_drafter(
    target: nn.Module,
    overrides: Mapping[str, Any],
    init_drafter: str | None = None,
    init_from_target_layers: bool = False,
    draft_vocab: torch.Tensor | None = None,
    init_changes: Mapping[str, Any] | None = None,
    fit_batches: Callable[[DSparkDrafter], None] | None = None,
) -> DSparkDrafter:
    """A drafter ready to train: fresh (`overrides` are `DSparkConfig` fields) or warm-started from `init_drafter`,
    optionally restricted to `draft_vocab` (target ids) and initialised from the target's last layers, bound to
    `target`, with fp32 weights.

    `init_changes` (warm start only): `CONVERTIBLE_FIELDS` to change in the init's config (`convert_drafter`); new
    q/k norms are fitted with `fit_batches` (`fit_qk_norms`) when given, else left at ones.
    """
    if init_drafter:
        drafter = DSparkDrafter.from_pretrained(init_drafter, target=target)
        changes = {k: v for k, v in (init_changes or {}).items() if getattr(drafter.config, k) != v}
        if changes:
            drafter = warm_start_conversion(drafter, target, changes, fit_batches)
    else:
        drafter = DSparkDrafter(DSparkConfig.from_target(target.config, **overrides))
        drafter.bind_target(target)
        if init_from_target_layers:
            logger.warning(f"drafter layers initialised from target layers {init_layers_from_target(drafter, target)}")
    drafter.float()  # master weights in fp32; bf16 compute comes from autocast (--bf16)
    current = drafter.draft_token_ids()
    if draft_vocab is not None and current is not None and draft_vocab.numel() >= current.numel():
        if not torch.equal(draft_vocab.to(current.device), current):
            logger.warning(
                f"keeping the init drafter's {current.numel()}-token draft vocabulary (its trained rows); "
                "the one selected from this data differs"
            )
    elif draft_vocab is not None:
        drafter.restrict_draft_vocab(draft_vocab)
    return drafter


def target_batch_runner(
    target: nn.Module, examples: Sequence[Mapping[str, Any]], seed: int = 0
) -> Callable[[DSparkDrafter], None]:
    """`run(drafter)`: a teacher-forced drafter forward (no LM head) on each of `examples`, one sequence per batch
    (no padding) with every reply position anchoring a block, the target's features computed where the drafter
    lives: the batches `fit_qk_norms` reads."""
    chosen = list(examples)

    def run(drafter: DSparkDrafter) -> None:
        device = next(drafter.parameters()).device
        for example in chosen:
            collator = DSparkCollator(drafter.config.block_size, max(1, len(example["input_ids"])), seed=seed)
            batch = {k: v.to(device) for k, v in collator([example]).items()}
            features = compute_target_features(
                target, batch["input_ids"], batch["attention_mask"], drafter.config.target_layer_ids
            )
            drafter(
                target_hidden=features.tapped_hidden.to(drafter.dtype),
                input_ids=batch["input_ids"],
                anchor_positions=batch["anchor_positions"],
                context_mask=batch["attention_mask"].bool(),
                return_logits=False,
            )

    return run


def warm_start_conversion(
    source: DSparkDrafter,
    target: nn.Module,
    changes: Mapping[str, Any],
    fit_batches: Callable[[DSparkDrafter], None] | None = None,
) -> DSparkDrafter:
    """`convert_drafter` then, for new q/k norms, `fit_qk_norms` with `fit_batches` (else the norms stay at ones)."""
    converted, added = convert_drafter(source, target, **changes)
    logger.warning(f"warm start converted with {dict(changes)}: new parameters {added}")
    if added and fit_batches is not None:
        for layer, errors in fit_qk_norms(source, converted, fit_batches).items():
            logger.warning(
                f"q/k norms of {layer} fitted to the init's projections: relative residual "
                f"q {errors['q_residual']:.3f} (ones: {errors['q_residual_ones']:.3f}), "
                f"k {errors['k_residual']:.3f} (ones: {errors['k_residual_ones']:.3f})"
            )
    return converted


def describe_draft_vocab(ids: Sequence[int] | torch.Tensor, share: float, vocab_size: int) -> dict[str, Any]:
    """The record written next to a trained drafter (`draft_vocab.json`)."""
    return {"draft_vocab_size": len(ids), "vocab_size": vocab_size, "coverage_of_supervised_tokens": round(share, 5)}
