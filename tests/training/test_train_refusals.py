"""Training inputs refused early and clearly: changed drafter settings on resume, malformed or empty data."""

from __future__ import annotations

import importlib

import pytest
from tiny_helpers import make_tiny_drafter, make_tiny_target, tokenized_records, write_jsonl

from hf_dspark.training.data import build_dataset
from hf_dspark.training.train import DSparkTrainConfig, train
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments

train_module = importlib.import_module("hf_dspark.training.train")


def _args(output_dir, **overrides) -> DSparkTrainingArguments:
    defaults = {
        "output_dir": str(output_dir),
        "max_steps": 2,
        "per_device_train_batch_size": 2,
        "learning_rate": 3e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "use_cpu": True,
        "report_to": "none",
        "disable_tqdm": True,
        "anchors_per_sequence": 2,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    return DSparkTrainingArguments(**{**defaults, **overrides})


@pytest.fixture(scope="module")
def tiny_target_module():
    return make_tiny_target()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_target_module):
    """checkpoint-2 of a run with block_size 4 and target_layer_ids [0, 1]."""
    folder = tmp_path_factory.mktemp("run")
    args = _args(folder, save_strategy="steps", save_steps=2)
    dataset = build_dataset(tokenized_records(8))
    DSparkTrainer(
        model=make_tiny_drafter(tiny_target_module), args=args, target=tiny_target_module, train_dataset=dataset
    ).train()
    return folder / "checkpoint-2"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"block_size": 3}, "block_size"), ({"target_layer_ids": [1, 2]}, "target_layer_ids")],
)
def test_resume_with_changed_drafter_settings_is_refused(tmp_path, tiny_target_module, checkpoint, overrides, field):
    drafter = make_tiny_drafter(tiny_target_module, **overrides)  # same tensor shapes as the checkpoint's drafter
    dataset = build_dataset(tokenized_records(8))
    trainer = DSparkTrainer(
        model=drafter, args=_args(tmp_path, max_steps=4), target=tiny_target_module, train_dataset=dataset
    )
    with pytest.raises(ValueError, match=rf"{field}: checkpoint .*now "):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 0


def test_resume_with_the_same_settings_goes_on(tmp_path, tiny_target_module, checkpoint):
    trainer = DSparkTrainer(
        model=make_tiny_drafter(tiny_target_module, seed=5),
        args=_args(tmp_path, max_steps=3),
        target=tiny_target_module,
        train_dataset=build_dataset(tokenized_records(8)),
    )
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n{"turns": [\n', r"data\.jsonl:2 is not valid JSON"),
        ("", r"no conversations in .*data\.jsonl.*empty"),
        ("\n\n", r"no conversations"),
        ("[1, 2, 3]\n", r"record 0 is a JSON list, not an object"),
    ],
)
def test_bad_training_data_is_refused_before_the_target_loads(tmp_path, monkeypatch, content, message):
    def no_target(config):
        raise AssertionError("the target was loaded before the data was checked")

    monkeypatch.setattr(train_module, "load_training_target", no_target)
    (tmp_path / "data.jsonl").write_text(content)
    config = DSparkTrainConfig(data=[str(tmp_path / "data.jsonl")], target="unused")
    with pytest.raises(ValueError, match=message):
        train(config, _args(tmp_path / "out"))


def test_good_training_data_reaches_the_target(tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr(train_module, "load_training_target", lambda config: loaded.append(1) or 1 / 0)
    data = write_jsonl(tmp_path / "data.jsonl", tokenized_records(4))
    with pytest.raises(ZeroDivisionError):
        train(DSparkTrainConfig(data=[str(data)], target="unused"), _args(tmp_path / "out"))
    assert loaded == [1]
