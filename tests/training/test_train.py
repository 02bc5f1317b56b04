"""`train.py` on any target: the recipe's draft vocabulary is clipped to the target's, evaluation needs data."""

from __future__ import annotations

import pytest
from tiny_helpers import make_tiny_drafter, tokenized_records, write_jsonl

from hf_dspark.training.data import build_dataset
from hf_dspark.training.train import DSparkTrainConfig, build_drafter
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments


def _config(tmp_path, **overrides) -> DSparkTrainConfig:
    data = write_jsonl(tmp_path / "data.jsonl", tokenized_records(8))
    return DSparkTrainConfig(data=[str(data)], block_size=4, target_layer_ids=[0, 1], markov_rank=8, **overrides)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, None),
        ({"draft_vocab_size": None}, None),
        ({"draft_vocab_size": 0}, None),
        ({"draft_vocab_size": 128}, None),
        ({"draft_vocab_size": 32}, 32),
    ],
)
def test_draft_vocab_size_is_clipped_to_the_target_vocabulary(tmp_path, tiny_target, overrides, expected):
    """The default (8,192) is larger than the tiny target's 128 tokens: it drafts over the full vocabulary."""
    config = _config(tmp_path, **overrides)
    examples = build_dataset(tokenized_records(8)).examples
    ids = build_drafter(config, tiny_target, examples).draft_token_ids()
    assert (None if ids is None else ids.numel()) == expected


def test_a_negative_draft_vocab_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="draft_vocab_size must be >= 0"):
        _config(tmp_path, draft_vocab_size=-1)


def test_the_default_evaluation_is_off_without_an_eval_dataset(tmp_path, tiny_target):
    args = DSparkTrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert args.eval_strategy == "steps"
    DSparkTrainer(
        model=make_tiny_drafter(tiny_target),
        args=args,
        target=tiny_target,
        train_dataset=build_dataset(tokenized_records(4)),
    )
    assert args.eval_strategy == "no"
    evaluating = DSparkTrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    dataset = build_dataset(tokenized_records(4))
    trainer = DSparkTrainer(
        model=make_tiny_drafter(tiny_target),
        args=evaluating,
        target=tiny_target,
        train_dataset=dataset,
        eval_dataset=dataset,
    )
    assert trainer.args.eval_strategy == "steps"
