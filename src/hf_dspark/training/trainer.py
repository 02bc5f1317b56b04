"""`DSparkTrainer(Trainer)` and `DSparkTrainingArguments(TrainingArguments)` (docs/method.md, section 6).

Only the drafter is the Trainer's model: the target is passed separately, frozen, and never wrapped, optimised
or saved. Each step gets the target's features from a `TargetFeatureProvider`, runs the drafter teacher-forced
over the collator's anchor blocks, computes the target's logits at the labelled positions from its final hidden
state, and minimises Eq. (14). Everything else (accelerate / DDP / FSDP / DeepSpeed, checkpoints and resuming,
logging integrations) is the stock Trainer.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import (
    PREFIX_CHECKPOINT_DIR,
    IntervalStrategy,
    SchedulerType,
    get_last_checkpoint,
    rotate_checkpoints,
)
from transformers.utils import logging

from ..model.draft_vocab import target_to_draft_index
from ..ops.losses import IGNORE_INDEX, DSparkLossOutput, dspark_loss
from .checkpoints import check_resume_config, publish_checkpoint, staging_dir
from .collator import DSparkCollator
from .features import TargetFeatureProvider, target_probs_at
from .sampling import EpochSeededLengthGroupedSampler
from .time_budget import TimeBudgetCallback

logger = logging.get_logger(__name__)

FEATURE_MODES = ("online", "offline")


@dataclass
class DSparkTrainingArguments(TrainingArguments):
    """`TrainingArguments` plus the DSpark objective and feature settings (all independent of γ).

    The defaults are the recipe in `configs/recipe.yaml` (docs/training.md, "The recipe"): dense anchors, 3,000
    steps of 2 sequences at a cosine learning rate of 5e-4 after 20 warmup steps, no weight decay, seed 0,
    length-grouped batches, an evaluation every 100 steps (off when there is no `eval_dataset`), a checkpoint every
    25 steps (the last 3 kept) and a log every 5.

    Args:
        alpha_ce, alpha_tv, alpha_conf: weights of Eq. (14) (paper defaults 0.1, 0.9, 1.0).
        alpha_kd: weight of the distillation term KL(p_target ‖ p_draft) added to Eq. (14) (`losses.kd_loss`;
            default 0, the paper's objective).
        anchors_per_sequence: anchor blocks sampled per sequence per step (N); the default 512 is at or above the
            reply length, so every position of the loss region anchors a block (dense anchors).
        feature_mode: `"online"` (the target runs in-process, default) or `"offline"` (safetensors cache).
        feature_cache_dir: folder of the offline cache (required with `feature_mode="offline"`).
        remove_unused_columns: defaults to False here: the batch keys are not the drafter's forward arguments.
        block_sparse_attention: compute the drafter's attention block by block (default); False uses the dense
            masked reference (same result, for benchmarks).
        loss_decay: the position-decay constant c of the loss weights w_k = exp(−(k−1)/c) (Eqs. 11-13); `None`
            (default) uses c = γ, so the weights span the same range for every block size; DeepSpec uses 4.0.
        stop_after_steps: end training (with a checkpoint) after this many optimizer steps while the learning-rate
            schedule keeps following `max_steps`: a budget cut that stays comparable across runs and resumes.
        overwrite_output_dir: train into an `output_dir` that already holds a trained model or checkpoints (its
            checkpoints are removed first); without it `train` refuses such a folder unless it resumes.
        time_budget_minutes: train for about this long (`time_budget.TimeBudgetCallback`): the step time measured
            during warmup fixes the total steps and the LR schedule (cosine/linear) ends there; `max_steps` stays an
            upper bound.
    """

    alpha_ce: float = field(default=0.1, metadata={"help": "α_ce, weight of the cross-entropy loss (Eq. 11)."})
    alpha_tv: float = field(default=0.9, metadata={"help": "α_tv, weight of the total-variation loss (Eq. 12)."})
    alpha_conf: float = field(default=1.0, metadata={"help": "α_conf, weight of the confidence BCE (Eq. 13)."})
    alpha_kd: float = field(
        default=0.0, metadata={"help": "Weight of the distillation term KL(p_target || p_draft) (0: paper objective)."}
    )
    anchors_per_sequence: int = field(
        default=512, metadata={"help": "Anchor blocks sampled per sequence (512: every reply position, dense)."}
    )
    feature_mode: str = field(default="online", metadata={"help": "Target features: 'online' or 'offline'."})
    feature_cache_dir: str | None = field(default=None, metadata={"help": "Offline feature cache folder."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep False for DSpark batches."})
    block_sparse_attention: bool = field(
        default=True,
        metadata={"help": "Block-sparse drafter attention over anchor blocks (False: the dense reference, slower)."},
    )
    loss_decay: float | None = field(
        default=None,
        metadata={"help": "Position-decay constant c of the loss weights exp(-(k-1)/c) (default: γ; DeepSpec: 4.0)."},
    )
    stop_after_steps: int | None = field(
        default=None, metadata={"help": "Stop (and save) after this many steps; the LR schedule follows max_steps."}
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a finished run in output_dir (default: refuse unless resuming)."}
    )
    time_budget_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Train for about this many minutes: steps (and the LR schedule's end) from the measured "
            "step time; max_steps stays an upper bound."
        },
    )

    # TrainingArguments fields whose defaults follow the recipe (configs/recipe.yaml; tests/test_recipe.py).
    per_device_train_batch_size: int = field(default=2, metadata={"help": "Training sequences per device per step."})
    per_device_eval_batch_size: int = field(default=4, metadata={"help": "Evaluation sequences per device."})
    max_steps: int = field(default=3000, metadata={"help": "Optimizer steps (overrides num_train_epochs when > 0)."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak AdamW learning rate."})
    lr_scheduler_type: SchedulerType | str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_steps: float = field(default=20, metadata={"help": "Linear warmup steps (a ratio when below 1)."})
    seed: int = field(default=0, metadata={"help": "Seed of the drafter init, the anchors and the data order."})
    eval_strategy: IntervalStrategy | str = field(
        default="steps", metadata={"help": "When to evaluate (off by itself when there is no eval dataset)."}
    )
    eval_steps: float | None = field(default=100, metadata={"help": "Evaluate every this many steps."})
    save_steps: float = field(default=25, metadata={"help": "Save a checkpoint every this many steps."})
    save_total_limit: int | None = field(default=3, metadata={"help": "Checkpoints kept (the oldest are removed)."})
    logging_steps: float = field(default=5, metadata={"help": "Log every this many steps."})
    train_sampling_strategy: str = field(
        default="group_by_length",
        metadata={"help": "Training order: group_by_length (seeded per epoch, resumable), random or sequential."},
    )

    def __post_init__(self) -> None:
        if self.feature_mode not in FEATURE_MODES:
            raise ValueError(f"feature_mode must be one of {FEATURE_MODES}, got {self.feature_mode!r}.")
        if self.feature_mode == "offline" and not self.feature_cache_dir:
            raise ValueError("feature_mode='offline' needs feature_cache_dir (a folder for the safetensors cache).")
        if self.anchors_per_sequence < 1:
            raise ValueError(f"anchors_per_sequence must be >= 1, got {self.anchors_per_sequence}.")
        if min(self.alpha_ce, self.alpha_tv, self.alpha_conf, self.alpha_kd) < 0:
            raise ValueError("alpha_ce, alpha_tv, alpha_conf and alpha_kd must be >= 0.")
        if self.remove_unused_columns:
            raise ValueError("remove_unused_columns=True would drop the DSpark batch keys; leave it False.")
        if self.loss_decay is not None and not self.loss_decay > 0:
            raise ValueError(f"loss_decay (the position-decay constant c) must be > 0 or unset, got {self.loss_decay}")
        if self.time_budget_minutes is not None and not self.time_budget_minutes > 0:
            raise ValueError(f"time_budget_minutes must be > 0 or unset, got {self.time_budget_minutes}.")
        if self.stop_after_steps is not None and self.stop_after_steps < 1:
            raise ValueError(f"stop_after_steps must be >= 1 (or unset), got {self.stop_after_steps}.")
        super().__post_init__()

    @property
    def alpha(self) -> tuple[float, float, float]:
        return (self.alpha_ce, self.alpha_tv, self.alpha_conf)


def unwrap_drafter(model: nn.Module) -> nn.Module:
    """The DSparkDrafter inside DDP / accelerate / PEFT wrappers."""
    while hasattr(model, "module"):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


class _CollatorEpochCallback(TrainerCallback):
    """Tells a seeded `DSparkCollator` the epoch, so anchors are reproducible across resumes and processes."""

    def __init__(self, collator: Any) -> None:
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        if hasattr(self.collator, "epoch"):
            self.collator.epoch = math.floor((state.epoch or 0.0) + 1e-6)


class _StopAfterStepsCallback(TrainerCallback):
    """Ends training with a checkpoint at `args.stop_after_steps` without changing the LR schedule."""

    def on_step_end(self, args, state, control, **kwargs):
        if args.stop_after_steps is not None and state.global_step >= args.stop_after_steps:
            control.should_training_stop = True
            control.should_save = True
        return control


class DSparkTrainer(Trainer):
    """Trains a bound `DSparkDrafter` against a frozen target.

    Args:
        model: the drafter (or a PEFT-wrapped drafter), already bound to `target` (`drafter.bind_target(target)`).
        args: `DSparkTrainingArguments`.
        target: the frozen target model; moved to `args.device`, not a Trainer parameter, never saved.
        feature_provider: where target features come from (default: online from `target`).
        **kwargs: the usual `Trainer` arguments (`train_dataset`, `eval_dataset`, `data_collator`, callbacks...).
            The default collator is `DSparkCollator(γ, args.anchors_per_sequence, pad_token_id)`.
    """

    def __init__(
        self,
        model: nn.Module,
        args: DSparkTrainingArguments,
        target: nn.Module,
        feature_provider: TargetFeatureProvider | None = None,
        pad_token_id: int = 0,
        **kwargs: Any,
    ) -> None:
        if not isinstance(args, DSparkTrainingArguments):
            raise TypeError("DSparkTrainer needs DSparkTrainingArguments (they carry the loss weights).")
        drafter = unwrap_drafter(model)
        if not getattr(drafter, "bound_to", lambda _: False)(target):
            raise ValueError("the drafter is not bound to this target; call drafter.bind_target(target) first.")
        self.target = target.to(args.device).eval().requires_grad_(False)
        self.feature_provider = feature_provider or TargetFeatureProvider.online(
            self.target, drafter.config.target_layer_ids
        )
        if list(self.feature_provider.layer_ids) != list(drafter.config.target_layer_ids):
            raise ValueError(
                f"the feature provider taps layers {self.feature_provider.layer_ids} but the drafter was built for "
                f"{drafter.config.target_layer_ids}; rebuild the cache or the drafter with matching layers."
            )
        kwargs.setdefault(
            "data_collator",
            DSparkCollator(drafter.config.block_size, args.anchors_per_sequence, pad_token_id, seed=args.seed),
        )
        if kwargs.get("eval_dataset") is None and args.eval_strategy != IntervalStrategy.NO:
            logger.warning(f"no eval_dataset: evaluation is off (eval_strategy was {args.eval_strategy}).")
            args.eval_strategy = IntervalStrategy.NO
        super().__init__(model=model, args=args, **kwargs)
        self.add_callback(_CollatorEpochCallback(self.data_collator))
        self.add_callback(_StopAfterStepsCallback())
        if args.time_budget_minutes and not any(
            isinstance(c, TimeBudgetCallback) for c in kwargs.get("callbacks") or ()
        ):
            self.add_callback(TimeBudgetCallback(60.0 * args.time_budget_minutes))
        self._cpu_clock_offset_s: float | None = None
        self.loss_is_scaled_for_ga = False  # compute_loss returns a per-micro-batch mean
        self._metric_sums: dict[str, dict[str, float]] = {"train": defaultdict(float), "eval": defaultdict(float)}
        self._metric_weights: dict[str, dict[str, float]] = {"train": defaultdict(float), "eval": defaultdict(float)}
        self._metric_counts = {"train": 0, "eval": 0}

    def _get_train_sampler(self, train_dataset=None):
        """`group_by_length` with an order drawn from (seed, epoch), so resuming reproduces an uninterrupted run."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.args.train_sampling_strategy != "group_by_length" or not hasattr(dataset, "examples"):
            return super()._get_train_sampler(train_dataset)
        lengths = [len(example["input_ids"]) for example in dataset.examples]
        batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
        return EpochSeededLengthGroupedSampler(batch, lengths, seed=self.args.seed)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """`Trainer.train`, refusing first a checkpoint trained with other drafter settings (`check_resume_config`),
        also when the Trainer is used directly rather than through `train()`."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)
        if isinstance(checkpoint, (str, os.PathLike)):
            check_resume_config(checkpoint, unwrap_drafter(self.model).config)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ):
        """Eq. (14) on one batch of anchor blocks; stores per-position acceptance, τ estimate and confidence MAE."""
        features = self.feature_provider(inputs)
        outputs = model(
            target_hidden=features.tapped_hidden,
            input_ids=inputs["input_ids"],
            anchor_positions=inputs["anchor_positions"],
            context_mask=inputs["attention_mask"].bool(),
            block_sparse=self.args.block_sparse_attention,
        )
        drafter = unwrap_drafter(model)
        draft_ids = drafter.draft_token_ids()
        labels = inputs["labels"]
        valid = labels.ne(IGNORE_INDEX)
        p_target = target_probs_at(
            features.final_hidden, inputs["target_positions"], valid, self.target.get_output_embeddings(), draft_ids
        )
        if draft_ids is not None:  # gold tokens as draft ids; those outside the draft vocabulary skip Eq. (11) only
            index = target_to_draft_index(drafter.t2d)[labels.clamp_min(0)]
            labels = index.masked_fill(~valid | index.lt(0), IGNORE_INDEX)
        parts = dspark_loss(
            outputs.logits,
            p_target,
            labels,
            outputs.confidence_logits,
            alpha=self.args.alpha,
            valid=valid,
            alpha_kd=self.args.alpha_kd,
            decay=self.args.loss_decay,
        )
        self._store_metrics(parts, "train" if model.training else "eval")
        return (parts.loss, outputs) if return_outputs else parts.loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation: the DSpark loss (and stored metrics) only; no logits are gathered."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def _get_output_dir(self, trial) -> str:
        return getattr(self, "_checkpoint_staging", None) or super()._get_output_dir(trial)

    def _save_checkpoint(self, model: nn.Module, trial) -> None:
        """The stock checkpoint, written into a staging folder and renamed into place when complete."""
        if self.hp_search_backend is not None or self.args.push_to_hub:
            return super()._save_checkpoint(model, trial)
        run_dir, name = self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = str(staging_dir(run_dir))
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # left by a killed run
        self.accelerator.wait_for_everyone()
        self._checkpoint_staging = staging
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._checkpoint_staging = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            final = publish_checkpoint(run_dir, name)
            best = self.state.best_model_checkpoint
            if best and best.startswith(staging):
                self.state.best_model_checkpoint = os.path.join(run_dir, os.path.relpath(best, staging))
                self.state.save_to_json(str(final / "trainer_state.json"))
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()

    def _store_metrics(self, parts: DSparkLossOutput, mode: str) -> None:
        metrics = parts.metrics()  # one device sync; the weights reuse its keys
        weights = parts.metric_weights(metrics)
        for name, value in metrics.items():
            self._metric_sums[mode][name] += value * weights[name]
            self._metric_weights[mode][name] += weights[name]
        self._metric_counts[mode] += 1

    def _reduced_metrics(self, mode: str) -> dict[str, float]:
        """The stored metrics since the last log, pooled over batches and processes by what each averages over
        (`DSparkLossOutput.metric_weights`), so the result does not depend on how the data was batched."""
        sums, weights = self._metric_sums[mode], self._metric_weights[mode]
        keys = sorted(sums)
        values = torch.tensor([sums[k] for k in keys] + [weights[k] for k in keys], dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            values = self.accelerator.reduce(values.to(self.args.device), reduction="sum").cpu()
        self._metric_sums[mode], self._metric_weights[mode] = defaultdict(float), defaultdict(float)
        self._metric_counts[mode] = 0
        totals = values[len(keys) :].tolist()
        return {key: float(v) / total for key, v, total in zip(keys, values[: len(keys)].tolist(), totals) if total}

    def _cpu_hours(self) -> float:
        """CPU time of this process (all threads) plus what the resumed run had logged: training compute so far."""
        if self._cpu_clock_offset_s is None:
            earlier = [entry["cpu_hours"] for entry in self.state.log_history if "cpu_hours" in entry]
            self._cpu_clock_offset_s = (3600.0 * earlier[-1] if earlier else 0.0) - time.process_time()
        return round((self._cpu_clock_offset_s + time.process_time()) / 3600.0, 5)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs["cpu_hours"] = self._cpu_hours()
        mode = "eval" if any(key.startswith("eval_") for key in logs) else "train"
        if self._metric_counts[mode]:  # equal on every rank: all ranks run the same steps
            prefix = "eval_" if mode == "eval" else ""
            logs.update({prefix + key: round(value, 5) for key, value in self._reduced_metrics(mode).items()})
        super().log(logs, start_time)
