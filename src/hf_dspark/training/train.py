"""`train(config, args)`: the library entry behind `hf-dspark train` (and `accelerate launch -m hf_dspark.training`).

The defaults of `DSparkTrainConfig` and `DSparkTrainingArguments` are the recipe in `configs/recipe.yaml`. Example
(the embedded default target, online features, the recipe with a shorter schedule)::

    from hf_dspark.training import DSparkTrainConfig, DSparkTrainingArguments, train

    config = DSparkTrainConfig(data=["data/train_regenerated"])
    args = DSparkTrainingArguments(output_dir="runs/dspark", max_steps=500)
    train(config, args)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, TrainerCallback, set_seed
from transformers.utils import logging

from ..drafter import DSparkDrafter
from ..interop.sources import resolve_model_source
from ..model.heads import available_heads, get_head
from .checkpoints import (
    check_output_dir,
    check_resume_config,
    checkpoint_problem,
    last_complete_checkpoint,
    save_final_model,
)
from .data import DSparkDataset, build_dataset, expand_jsonl_paths, load_conversations, split_validation
from .drafter_init import build_training_drafter, draft_vocab_from_examples, end_of_turn_ids, target_batch_runner
from .features import TargetFeatureProvider, build_feature_cache
from .trainer import DSparkTrainer, DSparkTrainingArguments

logger = logging.get_logger(__name__)

QK_NORM_INITS = ("fit", "ones")


@dataclass
class DSparkTrainConfig:
    """What to train on and which drafter to build (the optimisation settings are `DSparkTrainingArguments`).

    Args:
        data: regenerated conversation JSONL files or folders (prepare-data shards, `data/train_regenerated`).
        target: target path / Hub id; `None` uses the embedded default target (SmolLM2-135M-Instruct GGUF).
        gguf_file: GGUF file inside `target` when it is a GGUF folder.
        target_dtype: dtype of the frozen target and of the drafter while training (`float32` or `bfloat16`).
        init_drafter: start from this trained drafter folder instead of a fresh one (the fields below are then
            taken from its config, except `use_qk_norm`, which converts it).
        use_qk_norm: per-head q/k RMSNorms in the drafter layers (vLLM and speculators require them). `None`: a fresh
            drafter follows the target family, a warm start keeps its init's. `True` with an init trained without
            them converts it (`drafter_init.convert_drafter`): every weight is kept and the new norms are
            initialised as `qk_norm_init` says.
        qk_norm_init: `fit` (default) sets the new norm weights so the normalised queries and keys reproduce the
            init's in least squares over `qk_norm_fit_sequences` training sequences (`drafter_init.fit_qk_norms`);
            `ones` leaves RMSNorm's default.
        qk_norm_fit_sequences: training sequences the `fit` init reads.
        block_size, num_hidden_layers, head_type, markov_rank, target_layer_ids, use_confidence_head,
        confidence_with_markov, mask_token_id: `DSparkConfig` fields of a fresh drafter.
        max_length: tokens per training sequence (cut from the right).
        max_new_tokens: generation limit of the data (infers truncated replies in files without `truncated`).
        validation_fraction: share of conversations held out as `eval_dataset` (deterministic in the seed below; at
            least one conversation when above 0).
        validation_seed: seed of that split (default 0, so a continued run that changes `--seed` keeps its
            held-out conversations out of training; `None`: `args.seed`).
        max_examples: use only the first n conversations (smoke tests).
        num_threads: torch CPU threads per process (`None`: torch's default).
        feature_cache_batch_size: target batch size while building an offline feature cache.
        draft_vocab_size: draft only over this many most frequent supervised tokens of the training replies
            (EOS and end-of-turn ids always in; default 8192); `0`/`None`, or a size at or above the target's
            vocabulary, drafts over the full vocabulary. A warm start whose init already drafts over a vocabulary
            this size or smaller keeps the init's.
        init_from_target_layers: initialise a fresh drafter's layers from the target's last decoder layers.
    """

    data: list[str] = field(default_factory=list, metadata={"help": "Regenerated conversation JSONL files/dirs."})
    target: str | None = field(
        default=None,
        metadata={"help": "Target model path or Hub id (default: the embedded SmolLM2-135M-Instruct GGUF)."},
    )
    gguf_file: str | None = field(
        default=None, metadata={"help": "GGUF file name inside --target when it is a GGUF folder."}
    )
    target_dtype: str = field(
        default="float32",
        metadata={"help": "dtype of the frozen target and of the training drafter: float32, bfloat16 or float16."},
    )
    init_drafter: str | None = field(
        default=None,
        metadata={"help": "Start from this trained drafter folder (its config then fixes the drafter fields)."},
    )
    use_qk_norm: bool | None = field(
        default=None,
        metadata={
            "help": "q/k RMSNorms in the drafter layers (engines need them); True converts an --init_drafter "
            "trained without them (default: the target family's for a fresh drafter, the init's otherwise)."
        },
    )
    qk_norm_init: str = field(
        default="fit",
        metadata={
            "help": "Init of q/k norms added to an --init_drafter: fit (match the init's attention "
            "projections on training sequences) or ones."
        },
    )
    qk_norm_fit_sequences: int = field(default=8, metadata={"help": "Training sequences read by --qk_norm_init fit."})
    block_size: int = field(default=7, metadata={"help": "γ, draft tokens proposed per round by a fresh drafter."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Decoder layers of a fresh drafter."})
    head_type: str = field(
        default="markov",
        metadata={"help": f"Sequential head of a fresh drafter, one of {', '.join(available_heads())} (markov: Eq. 5, "
                          "rnn: Eq. 6, none: DFlash-style; hf_dspark.model.heads.register_head adds more)."},
    )
    markov_rank: int = field(
        default=64,
        metadata={"help": "Rank r of the Markov/RNN head's factorisation W1, W2 (V×r) of a fresh drafter."},
    )
    target_layer_ids: list[int] | None = field(
        default=None,
        metadata={"help": "0-based target layers whose outputs form the features (Eq. 2; default: 5 spread evenly)."},
    )
    use_confidence_head: bool = field(
        default=True, metadata={"help": "Give a fresh drafter a confidence head (Eq. 7; the scheduler needs it)."}
    )
    confidence_with_markov: bool = field(
        default=True, metadata={"help": "Let the confidence head also see W1[x_{k-1}] (needs a markov or rnn head)."}
    )
    mask_token_id: int | None = field(
        default=None,
        metadata={"help": "Token whose target embedding fills the mask slots (default: a learned mask embedding)."},
    )
    max_length: int = field(
        default=1024, metadata={"help": "Tokens per training sequence (longer ones are cut from the right)."}
    )
    max_new_tokens: int = field(
        default=256,
        metadata={"help": "Generation limit of the data; marks truncated replies in files without 'truncated'."},
    )
    validation_fraction: float = field(
        default=0.004,
        metadata={"help": "Share of conversations held out as the eval dataset (deterministic in --validation_seed)."},
    )
    validation_seed: int | None = field(
        default=0,
        metadata={
            "help": "Seed of the validation split, independent of --seed so a continued run can change its data "
            "order while keeping its held-out conversations out of training."
        },
    )
    max_examples: int | None = field(
        default=None, metadata={"help": "Use only the first n conversations (smoke runs)."}
    )
    num_threads: int | None = field(
        default=None, metadata={"help": "torch CPU threads per process (default: torch's own)."}
    )
    feature_cache_batch_size: int = field(
        default=4, metadata={"help": "Target batch size while building an offline feature cache."}
    )
    draft_vocab_size: int | None = field(
        default=8192,
        metadata={
            "help": "Draft vocabulary size (most frequent reply tokens); 0, or at least the target's vocabulary "
            "size: the full vocabulary."
        },
    )
    init_from_target_layers: bool = field(
        default=False, metadata={"help": "Initialise a fresh drafter's layers from the target's last layers."}
    )

    def __post_init__(self) -> None:
        if isinstance(self.data, (str, Path)):
            self.data = [str(self.data)]
        if not self.data:
            raise ValueError("data is empty; pass regenerated JSONL files, e.g. data/train_regenerated.")
        if self.target_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"target_dtype must be float32, bfloat16 or float16, got {self.target_dtype!r}.")
        get_head(self.head_type)  # an unknown head type raises, listing the registered ones
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}.")
        if self.qk_norm_init not in QK_NORM_INITS:
            raise ValueError(f"qk_norm_init must be one of {QK_NORM_INITS}, got {self.qk_norm_init!r}.")
        if self.qk_norm_fit_sequences < 1:
            raise ValueError(f"qk_norm_fit_sequences must be >= 1, got {self.qk_norm_fit_sequences}.")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 0:
            raise ValueError(f"draft_vocab_size must be >= 0 (0: the full vocabulary), got {self.draft_vocab_size}.")
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}.")
        try:
            expand_jsonl_paths(self.data)  # before the target loads
        except FileNotFoundError as error:
            raise ValueError(f"data: {error}") from None

    def drafter_overrides(self) -> dict:
        overrides = {
            "block_size": self.block_size,
            "num_hidden_layers": self.num_hidden_layers,
            "head_type": self.head_type,
            "markov_rank": self.markov_rank,
            "use_confidence_head": self.use_confidence_head,
            "confidence_with_markov": self.confidence_with_markov,
            "mask_token_id": self.mask_token_id,
        }
        if self.target_layer_ids:
            overrides["target_layer_ids"] = list(self.target_layer_ids)
        if self.use_qk_norm is not None:
            overrides["use_qk_norm"] = self.use_qk_norm
        return overrides


def load_training_target(config: DSparkTrainConfig):
    """(target, tokenizer or None): the default target, or `config.target` (a folder without a tokenizer is fine
    when the data is pre-tokenised)."""
    dtype = getattr(torch, config.target_dtype)
    if config.target is None:
        from ..defaults import load_default_target

        target, tokenizer = load_default_target(dtype)
    else:
        kwargs = {"gguf_file": config.gguf_file} if config.gguf_file else {}
        kwargs.update(resolve_model_source(config.target, what="target"))
        target = AutoModelForCausalLM.from_pretrained(config.target, dtype=dtype, **kwargs)
        try:
            tokenizer = AutoTokenizer.from_pretrained(config.target, **kwargs)
        except (OSError, ValueError, TypeError):
            tokenizer = None
    return target.eval().requires_grad_(False), tokenizer


def validation_examples(config: DSparkTrainConfig, tokenizer, seed: int) -> list[dict]:
    """The held-out examples a run with `config` evaluates on (`seed`: its `--validation_seed`, else `--seed`), for
    scripts that measure something else on the same split."""
    records = load_conversations(config.data)[: config.max_examples]
    dataset = build_dataset(records, tokenizer, max_length=config.max_length, max_new_tokens=config.max_new_tokens)
    return split_validation(dataset.examples, config.validation_fraction, seed)[1]


def build_drafter(config: DSparkTrainConfig, target, examples=(), tokenizer=None) -> DSparkDrafter:
    """The drafter to train, bound to `target`: fresh or `config.init_drafter` (converted when `use_qk_norm` asks
    for norms it lacks), restricted to a draft vocabulary built from `examples` when `config.draft_vocab_size` is
    set and smaller than the target's vocabulary."""
    examples = list(examples)
    changes = {"use_qk_norm": config.use_qk_norm} if config.use_qk_norm is not None else {}
    fit = None
    if config.qk_norm_init == "fit" and examples:
        fit = target_batch_runner(target, examples[: config.qk_norm_fit_sequences])
    draft_vocab = None
    vocab_size = target.config.get_text_config().vocab_size
    if config.draft_vocab_size and config.draft_vocab_size >= vocab_size:
        logger.info(f"draft_vocab_size {config.draft_vocab_size} >= the target's {vocab_size}: the full vocabulary")
    elif config.draft_vocab_size:
        draft_vocab, share = draft_vocab_from_examples(
            examples, config.draft_vocab_size, vocab_size, end_of_turn_ids(tokenizer)
        )
        logger.warning(f"draft vocabulary: {draft_vocab.numel()} tokens cover {share:.2%} of the supervised tokens")
    return build_training_drafter(
        target,
        config.drafter_overrides(),
        config.init_drafter,
        config.init_from_target_layers,
        draft_vocab,
        init_changes=changes,
        fit_batches=fit,
    )


def _resume_path(args: DSparkTrainingArguments) -> str | None:
    """`resume_from_checkpoint`: a path, or `auto`/`last`/`true` for the newest complete checkpoint in output_dir if
    any (incomplete ones, e.g. cut short by a kill, are skipped). An incomplete explicit path is a `ValueError`."""
    value = args.resume_from_checkpoint
    if value is True or (isinstance(value, str) and value.lower() in ("auto", "last", "true")):
        last = last_complete_checkpoint(args.output_dir)
        if last is None:
            logger.warning(f"no complete checkpoint in {args.output_dir}; starting from scratch")
        return last
    if value in (None, False, "") or (isinstance(value, str) and value.lower() in ("false", "none")):
        return None
    problem = checkpoint_problem(value) if os.path.isdir(value) else "no such folder"
    if problem:
        raise ValueError(f"resume_from_checkpoint {value} is not a complete checkpoint: {problem}.")
    return str(value)


def _check_examples(config: DSparkTrainConfig, records: list, usable: int, train_count: int) -> None:
    """Refuse before the Trainer does ("num_samples=0") when no conversation is left to train on, saying why."""
    if train_count:
        return
    held_out = f"; {usable} went to validation (validation_fraction={config.validation_fraction})" if usable else ""
    raise ValueError(
        f"no training examples: {len(records)} conversation(s) read from {config.data}, {usable} with at least 2 "
        f"reply tokens within max_length={config.max_length}{held_out}. Check that the files hold regenerated "
        "replies (responses), raise max_length, or add data."
    )


def train(
    config: DSparkTrainConfig, args: DSparkTrainingArguments, callbacks: Sequence[TrainerCallback] = ()
) -> DSparkTrainer:
    """Load the target and data, build (or load) the drafter, train it, save it to `args.output_dir`.

    Works unchanged under `accelerate launch` (DDP, FSDP, DeepSpeed configs; see README.md, "Training a drafter").
    `callbacks` are added to the Trainer's. Returns the trainer (its `.model` is the trained drafter,
    `.state.log_history` the logs).
    """
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    set_seed(args.seed)
    resume = _resume_path(args)
    with args.main_process_first(desc="checking output_dir"):
        check_output_dir(
            args.output_dir,
            args.overwrite_output_dir,
            resuming=resume is not None,
            resume_requested=args.resume_from_checkpoint not in (None, False, ""),
        )
    if args.device.type == "cpu":
        from ..hardware import warn_if_slow_dtype

        slow = "bfloat16" if args.bf16 else "float16" if args.fp16 else config.target_dtype
        warn_if_slow_dtype(slow, "cpu", fix="train with --target_dtype float32 and without --bf16 / --fp16")
    records = load_conversations(config.data)[: config.max_examples]  # bad data is refused before the target loads
    if not records:
        raise ValueError(
            f"no conversations in {config.data}: the data files are empty. Run `hf-dspark prepare-data` "
            "on a prompt file to make training data."
        )
    target, tokenizer = load_training_target(config)
    dataset = build_dataset(records, tokenizer, max_length=config.max_length, max_new_tokens=config.max_new_tokens)
    train_examples, val_examples = split_validation(
        dataset.examples,
        config.validation_fraction,
        args.seed if config.validation_seed is None else config.validation_seed,
    )
    _check_examples(config, records, len(dataset), len(train_examples))
    drafter = build_drafter(config, target, train_examples, tokenizer)
    if resume is not None:
        check_resume_config(resume, drafter.config)
    train_set = DSparkDataset(train_examples)
    eval_set = DSparkDataset(val_examples) if val_examples else None
    if args.process_index == 0:
        logger.warning(
            f"training {drafter.num_trainable_parameters():,} drafter parameters on {len(train_set)} sequences "
            f"({train_set.num_loss_tokens():,} loss tokens), {len(val_examples)} for validation"
        )
    provider = None
    if args.feature_mode == "offline":
        layer_ids = drafter.config.target_layer_ids
        with args.main_process_first(desc="building the feature cache"):
            build_feature_cache(
                target.to(args.device),
                dataset.examples,
                args.feature_cache_dir,
                layer_ids,
                batch_size=config.feature_cache_batch_size,
            )
        provider = TargetFeatureProvider.offline(args.feature_cache_dir, target, layer_ids)
    pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    trainer = DSparkTrainer(
        model=drafter,
        args=args,
        target=target,
        feature_provider=provider,
        pad_token_id=pad_id,
        train_dataset=train_set,
        eval_dataset=eval_set,
        callbacks=list(callbacks) or None,
    )
    trainer.train(resume_from_checkpoint=resume)
    save_final_model(trainer, args.output_dir)
    return trainer


def parse_train_args(argv: Sequence[str] | None = None) -> tuple[DSparkTrainConfig, DSparkTrainingArguments]:
    """Command-line flags: every `DSparkTrainConfig` and `DSparkTrainingArguments` field (HfArgumentParser)."""
    parser = HfArgumentParser((DSparkTrainConfig, DSparkTrainingArguments))
    config, args = parser.parse_args_into_dataclasses(args=list(argv) if argv is not None else None)
    return config, args


def main(argv: Sequence[str] | None = None) -> int:
    """`hf-dspark train` / `python -m hf_dspark.training --data ... --output_dir ...` (also `accelerate launch -m`)."""
    train(*parse_train_args(argv))
    return 0
