"""Warm starts that convert: a drafter trained without q/k norms gains them, keeps every weight, and trains."""

from __future__ import annotations

import pytest
import torch
from tiny_helpers import make_tiny_drafter, tokenized_records, write_jsonl

from hf_dspark import DSparkDrafter
from hf_dspark.training.collator import DSparkCollator
from hf_dspark.training.data import build_dataset
from hf_dspark.training.drafter_init import convert_drafter, fit_qk_norms, target_batch_runner
from hf_dspark.training.features import compute_target_features
from hf_dspark.training.train import DSparkTrainConfig, train
from hf_dspark.training.trainer import DSparkTrainingArguments

NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


@pytest.fixture
def plain_drafter(tiny_target):
    return make_tiny_drafter(tiny_target, use_qk_norm=False)


def _examples(count: int = 3) -> list[dict]:
    return build_dataset(tokenized_records(count)).examples


def test_convert_adds_qk_norms_keeps_every_weight_and_round_trips(tmp_path, tiny_target, plain_drafter):
    converted, added = convert_drafter(plain_drafter, tiny_target, use_qk_norm=True)
    assert converted.config.use_qk_norm and not plain_drafter.config.use_qk_norm
    assert sorted(added) == sorted(f"layers.{i}.{n}" for i in range(len(converted.layers)) for n in NORMS)
    before, after = plain_drafter.state_dict(), converted.state_dict()
    assert set(after) - set(before) == set(added)
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    converted.save_pretrained(tmp_path / "converted")
    loaded = DSparkDrafter.from_pretrained(tmp_path / "converted", target=tiny_target)
    assert loaded.config.use_qk_norm
    for name, value in after.items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_convert_refuses_changes_that_drop_or_reshape_weights(tiny_target, plain_drafter):
    with pytest.raises(ValueError, match="can only change"):
        convert_drafter(plain_drafter, tiny_target, block_size=3)
    with_norms = make_tiny_drafter(tiny_target, use_qk_norm=True)
    with pytest.raises(ValueError, match="removing them"):
        convert_drafter(with_norms, tiny_target, use_qk_norm=False)


def _draft_logits(drafter, target, example) -> torch.Tensor:
    """The teacher-forced draft logits of one sequence, every reply position anchoring a block."""
    batch = DSparkCollator(drafter.config.block_size, len(example["input_ids"]))([example])
    features = compute_target_features(
        target, batch["input_ids"], batch["attention_mask"], drafter.config.target_layer_ids
    )
    with torch.no_grad():
        return drafter(
            target_hidden=features.tapped_hidden,
            input_ids=batch["input_ids"],
            anchor_positions=batch["anchor_positions"],
            context_mask=batch["attention_mask"].bool(),
        ).logits


def test_fitted_norms_keep_the_init_projections_and_outputs_closer_than_ones(tiny_target, plain_drafter):
    examples = _examples()
    ones, _ = convert_drafter(plain_drafter, tiny_target, use_qk_norm=True)
    fitted, _ = convert_drafter(plain_drafter, tiny_target, use_qk_norm=True)
    report = fit_qk_norms(plain_drafter, fitted, target_batch_runner(tiny_target, examples))
    assert set(report) == {f"layer_{i}" for i in range(len(fitted.layers))}
    for errors in report.values():
        assert errors["q_residual"] < errors["q_residual_ones"] and errors["k_residual"] < errors["k_residual_ones"]
        assert errors["q_residual"] < 0.5 and errors["k_residual"] < 0.5
    for layer in fitted.layers:  # per-dimension weights near the init's typical projection scale, not ones
        assert not torch.allclose(layer.self_attn.q_norm.weight, torch.ones_like(layer.self_attn.q_norm.weight))

    reference = _draft_logits(plain_drafter, tiny_target, examples[0])
    fitted_gap = (_draft_logits(fitted, tiny_target, examples[0]) - reference).abs().mean()
    ones_gap = (_draft_logits(ones, tiny_target, examples[0]) - reference).abs().mean()
    assert fitted_gap < ones_gap


def test_fit_refuses_a_runner_that_runs_nothing(tiny_target, plain_drafter):
    converted, _ = convert_drafter(plain_drafter, tiny_target, use_qk_norm=True)
    with pytest.raises(ValueError, match="saw no positions"):
        fit_qk_norms(plain_drafter, converted, lambda drafter: None)


@pytest.mark.parametrize("qk_norm_init", ["fit", "ones"])
def test_train_converts_an_init_without_norms_and_trains_it(
    tmp_path, tiny_target, tiny_target_dir, plain_drafter, qk_norm_init
):
    plain_drafter.save_pretrained(tmp_path / "init")
    data = write_jsonl(tmp_path / "data.jsonl", tokenized_records(8))
    config = DSparkTrainConfig(
        data=[str(data)],
        target=str(tiny_target_dir),
        init_drafter=str(tmp_path / "init"),
        use_qk_norm=True,
        qk_norm_init=qk_norm_init,
        validation_fraction=0.0,
    )
    args = DSparkTrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=2,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        anchors_per_sequence=4,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = train(config, args)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    trained = DSparkDrafter.from_pretrained(tmp_path / "out", target=tiny_target)
    assert trained.config.use_qk_norm
    names = dict(trained.named_parameters())
    assert all(f"layers.{i}.{n}" in names for i in range(len(trained.layers)) for n in NORMS)
    init_norm = torch.ones(trained.config.head_dim)
    moved = trained.layers[0].self_attn.q_norm.weight.detach().float()
    assert not torch.allclose(moved, init_norm)  # trained (and, with `fit`, fitted) away from ones


def test_qk_norm_options_are_validated(tmp_path):
    data = write_jsonl(tmp_path / "data.jsonl", tokenized_records(2))
    with pytest.raises(ValueError, match="qk_norm_init"):
        DSparkTrainConfig(data=[str(data)], qk_norm_init="zeros")
    with pytest.raises(ValueError, match="qk_norm_fit_sequences"):
        DSparkTrainConfig(data=[str(data)], qk_norm_fit_sequences=0)
