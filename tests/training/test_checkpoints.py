"""Training output folders: `--resume_from_checkpoint auto` skips partial checkpoints, checkpoints are written through
a staging folder, a finished run is not overwritten silently, and an all-filtered data set is named before torch's
"num_samples=0"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_helpers import make_tiny_drafter, tokenized_records, write_jsonl

from hf_dspark.training.checkpoints import STAGING_DIR, checkpoint_problem, last_complete_checkpoint
from hf_dspark.training.data import build_dataset
from hf_dspark.training.train import DSparkTrainConfig, train
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments


def _args(output_dir, **overrides) -> DSparkTrainingArguments:
    defaults = {
        "output_dir": str(output_dir), "max_steps": 4, "per_device_train_batch_size": 2, "learning_rate": 3e-3,
        "logging_steps": 1, "save_strategy": "steps", "save_steps": 2, "use_cpu": True, "report_to": "none",
        "disable_tqdm": True, "anchors_per_sequence": 4, "seed": 0, "dataloader_num_workers": 0,
    }
    return DSparkTrainingArguments(**{**defaults, **overrides})


def _config(tmp_path, tiny_target_dir, records=None, **overrides) -> DSparkTrainConfig:
    data = write_jsonl(tmp_path / "data.jsonl", tokenized_records(8) if records is None else records)
    fields = dict(data=[str(data)], target=str(tiny_target_dir), block_size=4, target_layer_ids=[0, 1],
                  markov_rank=8, validation_fraction=0.0)
    return DSparkTrainConfig(**{**fields, **overrides})


@pytest.fixture
def run_dir(tmp_path, tiny_target):
    """A 4-step run with checkpoints at steps 2 and 4."""
    args = _args(tmp_path / "run")
    DSparkTrainer(model=make_tiny_drafter(tiny_target), args=args, target=tiny_target,
                  train_dataset=build_dataset(tokenized_records(8))).train()
    return tmp_path / "run"


def test_checkpoints_are_published_whole(run_dir):
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-2", "checkpoint-4"]  # no staging folder left
    assert checkpoint_problem(run_dir / "checkpoint-4") is None
    state = json.loads((run_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and STAGING_DIR not in json.dumps(state)


@pytest.mark.parametrize("damage", ["no_state", "cut_state", "cut_weights", "no_weights", "cut_optimizer",
                                    "missing_shard"])
def test_auto_resume_skips_a_partial_checkpoint(run_dir, damage):
    newest = run_dir / "checkpoint-4"
    if damage == "missing_shard":
        (newest / "model.safetensors").rename(newest / "model-00001-of-00002.safetensors")
        index = {"metadata": {}, "weight_map": {"fc.weight": "model-00001-of-00002.safetensors",
                                                "norm.weight": "model-00002-of-00002.safetensors"}}
        (newest / "model.safetensors.index.json").write_text(json.dumps(index))
    elif damage == "no_state":
        (newest / "trainer_state.json").unlink()
    elif damage == "no_weights":
        (newest / "model.safetensors").unlink()
    else:
        name = {"cut_state": "trainer_state.json", "cut_weights": "model.safetensors",
                "cut_optimizer": "optimizer.pt"}[damage]
        (newest / name).write_bytes((newest / name).read_bytes()[:40])
    assert checkpoint_problem(newest) is not None
    assert last_complete_checkpoint(run_dir) == str(run_dir / "checkpoint-2")


def test_train_auto_resumes_from_the_newest_complete_checkpoint(tmp_path, tiny_target_dir, run_dir, caplog):
    (run_dir / "checkpoint-4" / "trainer_state.json").unlink()  # killed while writing checkpoint-4
    trainer = train(_config(tmp_path, tiny_target_dir), _args(run_dir, resume_from_checkpoint="auto"))
    assert trainer.state.global_step == 4 and "skipping the incomplete checkpoint" in caplog.text
    assert checkpoint_problem(run_dir / "checkpoint-4") is None  # rewritten whole
    with pytest.raises(ValueError, match=r"checkpoint-2 is not a complete checkpoint: trainer_state.json is missing"):
        (run_dir / "checkpoint-2" / "trainer_state.json").unlink()
        train(_config(tmp_path, tiny_target_dir), _args(run_dir, resume_from_checkpoint=str(run_dir / "checkpoint-2")))


def test_a_finished_output_dir_is_not_overwritten_silently(tmp_path, tiny_target_dir):
    out = tmp_path / "out"
    train(_config(tmp_path, tiny_target_dir), _args(out, max_steps=2))
    weights = (out / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match=r"already holds a training run .*--overwrite_output_dir"):
        train(_config(tmp_path, tiny_target_dir), _args(out, max_steps=2, seed=5))
    assert (out / "model.safetensors").read_bytes() == weights
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-9")  # a later checkpoint of the old run
    train(_config(tmp_path, tiny_target_dir), _args(out, max_steps=2, seed=5, overwrite_output_dir=True))
    assert (out / "model.safetensors").read_bytes() != weights
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # the old run's are gone


def test_every_example_filtered_out_is_named(tmp_path, tiny_target_dir):
    no_reply = [{"id": f"x:{i}", "input_ids": [5, 6, 7], "loss_mask": [0, 0, 0]} for i in range(3)]
    with pytest.raises(ValueError, match=r"no training examples: 3 conversation\(s\) .* 0 with at least 2 reply"):
        train(_config(tmp_path, tiny_target_dir, records=no_reply), _args(tmp_path / "out"))
    one = tokenized_records(1)
    with pytest.raises(ValueError, match=r"1 went to validation \(validation_fraction=0.5\)"):
        train(_config(tmp_path, tiny_target_dir, records=one, validation_fraction=0.5), _args(tmp_path / "out"))


def test_a_missing_target_folder_is_named(tmp_path, tiny_target_dir):
    config = _config(tmp_path, tiny_target_dir, target=str(tmp_path / "models" / "no-such-target"))
    with pytest.raises(FileNotFoundError, match=r"target folder .*no-such-target does not exist"):
        train(config, _args(tmp_path / "out"))


def test_an_interrupted_final_save_leaves_the_previous_model_whole(tmp_path, tiny_target_dir, monkeypatch):
    out = tmp_path / "out"
    train(_config(tmp_path, tiny_target_dir), _args(out, max_steps=2))
    assert not (out / ".final-staging").exists()
    weights = (out / "model.safetensors").read_bytes()

    def disk_full(self, output_dir=None, state_dict=None):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "model.safetensors").write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DSparkTrainer, "_save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train(_config(tmp_path, tiny_target_dir),
              _args(out, max_steps=3, save_strategy="no", resume_from_checkpoint="auto"))
    assert (out / "model.safetensors").read_bytes() == weights


def test_staged_checkpoints_keep_rotation_and_best_model_tracking(tmp_path, tiny_target):
    args = _args(tmp_path / "run", save_steps=1, save_total_limit=2, load_best_model_at_end=True,
                 eval_strategy="steps", eval_steps=1, metric_for_best_model="loss")
    trainer = DSparkTrainer(model=make_tiny_drafter(tiny_target), args=args, target=tiny_target,
                            train_dataset=build_dataset(tokenized_records(8)),
                            eval_dataset=build_dataset(tokenized_records(4, seed=3)))
    trainer.train()
    kept = sorted(p.name for p in (tmp_path / "run").iterdir())
    best = trainer.state.best_model_checkpoint
    assert len(kept) == 2 and all(name.startswith("checkpoint-") for name in kept)
    assert STAGING_DIR not in best and (tmp_path / "run" / best.rsplit("/", 1)[-1]).is_dir()
    for name in kept:
        state = json.loads((tmp_path / "run" / name / "trainer_state.json").read_text())
        assert STAGING_DIR not in json.dumps(state)


def test_auto_resume_with_only_partial_checkpoints_says_so(tmp_path, tiny_target_dir, run_dir):
    for checkpoint in run_dir.glob("checkpoint-*"):
        (checkpoint / "trainer_state.json").unlink()
    with pytest.raises(FileExistsError, match=r"none of its checkpoints is complete .*--overwrite_output_dir"):
        train(_config(tmp_path, tiny_target_dir), _args(run_dir, resume_from_checkpoint="auto"))
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        train(_config(tmp_path, tiny_target_dir), _args(tmp_path / "a-file"))


def _validation_inputs(tmp_path, tiny_target_dir, name: str, seed: int, validation_seed: int | None) -> list:
    config = _config(tmp_path, tiny_target_dir, records=tokenized_records(12), validation_fraction=0.25,
                     validation_seed=validation_seed)
    trainer = train(config, _args(tmp_path / name, max_steps=1, save_strategy="no", seed=seed, eval_strategy="no"))
    return sorted(tuple(example["input_ids"]) for example in trainer.eval_dataset.examples)


def test_validation_seed_keeps_the_split_when_the_seed_changes(tmp_path, tiny_target_dir):
    """A continued run with a new --seed (a new data order) keeps its held-out conversations via --validation_seed;
    without it, the split follows --seed."""
    first = _validation_inputs(tmp_path, tiny_target_dir, "seed0", seed=0, validation_seed=None)
    continued = _validation_inputs(tmp_path, tiny_target_dir, "seed1_split0", seed=1, validation_seed=0)
    reseeded = _validation_inputs(tmp_path, tiny_target_dir, "seed1", seed=1, validation_seed=None)
    assert continued == first
    assert reseeded != first


@pytest.mark.parametrize("change", [dict(block_size=3), dict(target_layer_ids=[1, 0])])
def test_resuming_with_other_drafter_settings_is_refused(tmp_path, tiny_target_dir, run_dir, change):
    # Same tensor shapes as the checkpoint, other meaning: the run must not continue under the new settings.
    name = next(iter(change))
    with pytest.raises(ValueError, match=rf"cannot resume from .*checkpoint-4: .*{name}: checkpoint"):
        train(_config(tmp_path, tiny_target_dir, **change), _args(run_dir, resume_from_checkpoint="auto"))


def test_empty_or_malformed_data_is_refused_before_the_target_loads(tmp_path, monkeypatch):
    import hf_dspark.training.train as train_module

    def no_target(config):
        raise AssertionError("the target was loaded before the data was checked")

    monkeypatch.setattr(train_module, "load_training_target", no_target)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    config = DSparkTrainConfig(data=[str(empty)], target=str(tmp_path / "unused"), block_size=4)
    with pytest.raises(ValueError, match=r"no conversations in .*empty.jsonl.*prepare-data"):
        train(config, _args(tmp_path / "out"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n{"input_ids": [1, 2\n')
    config = DSparkTrainConfig(data=[str(broken)], target=str(tmp_path / "unused"), block_size=4)
    with pytest.raises(ValueError, match=r"broken.jsonl"):
        train(config, _args(tmp_path / "out2"))
