"""Tests for DSparkTrainer / DSparkTrainingArguments and the train() entry, on a tiny random Llama target."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_helpers import make_tiny_drafter, make_tiny_target, tokenized_records, write_jsonl

from hf_dspark import DSparkDrafter
from hf_dspark.training.data import build_dataset
from hf_dspark.training.train import DSparkTrainConfig, parse_train_args, train, validation_examples
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments


def _args(output_dir, **overrides) -> DSparkTrainingArguments:
    defaults = {
        "output_dir": str(output_dir), "max_steps": 3, "per_device_train_batch_size": 4, "learning_rate": 3e-3,
        "logging_steps": 1, "save_strategy": "no", "use_cpu": True, "report_to": "none", "disable_tqdm": True,
        "anchors_per_sequence": 4, "seed": 0, "dataloader_num_workers": 0,
    }
    return DSparkTrainingArguments(**{**defaults, **overrides})


def _state(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("head", ["markov", "rnn", "none"])
def test_only_drafter_trains_and_metrics_are_logged(tmp_path, tiny_target, head):
    drafter = make_tiny_drafter(tiny_target, head_type=head)
    target_before, drafter_before = _state(tiny_target), _state(drafter)
    trainer = DSparkTrainer(
        model=drafter, args=_args(tmp_path), target=tiny_target, train_dataset=build_dataset(tokenized_records(8))
    )
    trainer.train()
    assert all(torch.equal(v, tiny_target.state_dict()[k]) for k, v in target_before.items())
    changed = [k for k, v in drafter_before.items() if not torch.equal(v, drafter.state_dict()[k])]
    assert "fc.weight" in changed and "layers.0.self_attn.q_proj.weight" in changed
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimised <= {id(p) for p in drafter.parameters()}
    assert not any(p.requires_grad for p in tiny_target.parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert {"acc_rate_k1", "acc_rate_k4", "tau_est", "loss_tv", "loss_ce"} <= set(logs[0])
    assert ("conf_mae" in logs[0]) and 1.0 <= logs[0]["tau_est"] <= 5.0


def test_distillation_term_is_trained_and_logged(tmp_path, tiny_target):
    drafter = make_tiny_drafter(tiny_target)
    data = build_dataset(tokenized_records(8))
    trainer = DSparkTrainer(model=drafter, args=_args(tmp_path, alpha_kd=1.0), target=tiny_target, train_dataset=data)
    trainer.train()
    kd = [entry["loss_kd"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(kd) == 3 and all(value > 0 for value in kd)


def test_the_position_decay_constant_reaches_the_loss(tmp_path, tiny_target):
    """`loss_decay` (DeepSpec: 4.0) changes the training loss from the default exp(-(k-1)/γ) weighting."""
    data = build_dataset(tokenized_records(4))
    gamma = make_tiny_drafter(tiny_target).config.block_size
    losses = []
    for decay in (None, float(gamma), 1.0):
        trainer = DSparkTrainer(model=make_tiny_drafter(tiny_target), args=_args(tmp_path, max_steps=1,
                                loss_decay=decay), target=tiny_target, train_dataset=data)
        trainer.train()
        losses.append(trainer.state.log_history[0]["loss"])
    assert losses[0] == losses[1] != losses[2]
    with pytest.raises(ValueError, match="loss_decay"):
        _args(tmp_path, loss_decay=0.0)


def test_save_model_writes_drafter_only_and_reloads(tmp_path, tiny_target, tiny_drafter):
    trainer = DSparkTrainer(model=tiny_drafter, args=_args(tmp_path, max_steps=1), target=tiny_target,
                            train_dataset=build_dataset(tokenized_records(4)))
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    with safe_open(str(tmp_path / "final" / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert "fc.weight" in keys and not any("embed_tokens" in k or "lm_head" in k for k in keys)
    reloaded = DSparkDrafter.from_pretrained(tmp_path / "final", target=tiny_target)
    for name, value in tiny_drafter.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], value)


@pytest.mark.parametrize("strategy", ["random", "group_by_length"])
def test_resume_from_checkpoint_matches_uninterrupted_run(tmp_path, tiny_target, strategy):
    # Length grouping shuffles megabatches of 50 batches: 60 one-example batches make two, so the order depends on
    # the sampler's draw; 70 steps cross into a second epoch after resuming at step 35.
    dataset = build_dataset(tokenized_records(60))
    full = make_tiny_drafter(tiny_target)
    common = dict(max_steps=70, per_device_train_batch_size=1, train_sampling_strategy=strategy, logging_steps=10)
    args = _args(tmp_path / "a", save_strategy="steps", save_steps=35, **common)
    DSparkTrainer(model=full, args=args, target=tiny_target, train_dataset=dataset).train()
    resumed = make_tiny_drafter(tiny_target, seed=123)  # different init: the checkpoint must restore everything
    args_b = _args(tmp_path / "b", save_strategy="no", **common)
    trainer = DSparkTrainer(model=resumed, args=args_b, target=tiny_target, train_dataset=dataset)
    trainer.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-35"))
    assert trainer.state.global_step == 70
    for name, value in full.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, atol=1e-6, rtol=1e-5)


def test_stop_after_steps_keeps_the_schedule_and_saves(tmp_path, tiny_target):
    dataset = build_dataset(tokenized_records(16))
    args = _args(tmp_path, max_steps=10, stop_after_steps=3, save_strategy="steps", save_steps=100,
                 per_device_train_batch_size=2, lr_scheduler_type="linear", warmup_steps=0)
    trainer = DSparkTrainer(model=make_tiny_drafter(tiny_target), args=args, target=tiny_target,
                            train_dataset=dataset)
    trainer.train()
    assert trainer.state.global_step == 3 and trainer.state.max_steps == 10
    assert (tmp_path / "checkpoint-3" / "model.safetensors").is_file()
    lrs = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    assert lrs[-1] == pytest.approx(3e-3 * (10 - 2) / 10)  # the 10-step linear schedule, not a 3-step one
    with pytest.raises(ValueError, match="stop_after_steps"):
        _args(tmp_path, stop_after_steps=0)


def test_train_entry_online_and_offline(tmp_path, tiny_target_dir):
    data = write_jsonl(tmp_path / "data.jsonl", tokenized_records(10))
    config = DSparkTrainConfig(data=[str(data)], target=str(tiny_target_dir), block_size=4, target_layer_ids=[0, 1],
                               markov_rank=8, validation_fraction=0.2)
    trainer = train(config, _args(tmp_path / "online", max_steps=2, eval_strategy="steps", eval_steps=2))
    assert (tmp_path / "online" / "model.safetensors").is_file()
    assert any("eval_tau_est" in entry for entry in trainer.state.log_history)
    # scripts measuring on the run's held-out split (target_entropy.py, eval_validation_split.py) get the same one
    held_out = validation_examples(config, None, seed=trainer.args.seed)
    assert held_out == trainer.eval_dataset.examples and len(held_out) == 2
    offline_args = _args(tmp_path / "offline", max_steps=2, feature_mode="offline",
                         feature_cache_dir=str(tmp_path / "cache"))
    trainer = train(config, offline_args)
    assert (tmp_path / "cache" / "manifest.json").is_file()
    assert trainer.state.global_step == 2


def test_parse_train_args_and_validation(tmp_path):
    files = [str(tmp_path / name) for name in ("a.jsonl", "b.jsonl")]
    for name in files:
        Path(name).write_text("")
    config, args = parse_train_args(
        ["--data", *files, "--output_dir", str(tmp_path), "--head_type", "none",
         "--target_layer_ids", "1", "3", "--alpha_tv", "0.5", "--alpha_kd", "0.25", "--use_cpu", "--report_to",
         "none"]
    )
    assert config.data == files and config.target_layer_ids == [1, 3]
    with pytest.raises(ValueError, match=r"data: .*missing\.jsonl does not exist"):  # before the target loads
        DSparkTrainConfig(data=[str(tmp_path / "missing.jsonl")])
    assert config.head_type == "none" and args.alpha == (0.1, 0.5, 1.0) and args.alpha_kd == 0.25
    with pytest.raises(ValueError, match="alpha_kd must be >= 0"):
        _args(tmp_path, alpha_kd=-1.0)
    with pytest.raises(ValueError, match="feature_cache_dir"):
        _args(tmp_path, feature_mode="offline")
    with pytest.raises(ValueError, match="feature_mode"):
        _args(tmp_path, feature_mode="disk")
    with pytest.raises(ValueError, match="head_type"):
        DSparkTrainConfig(data=["x"], head_type="gru")


def test_trainer_refuses_unbound_drafter(tmp_path):
    target, other = make_tiny_target(), make_tiny_target(seed=3)
    drafter = make_tiny_drafter(other)
    with pytest.raises(ValueError, match="not bound"):
        DSparkTrainer(model=drafter, args=_args(tmp_path), target=target)
