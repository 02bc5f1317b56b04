"""LoRA adaptation through peft: only adapter weights train; the adapter saves and loads."""

from __future__ import annotations

import pytest
import torch
from tiny_helpers import make_tiny_drafter, tokenized_records

from hf_dspark.training.collator import DSparkCollator
from hf_dspark.training.data import build_dataset
from hf_dspark.training.lora import LoraAdaptConfig, apply_lora, load_lora_drafter
from hf_dspark.training.trainer import DSparkTrainer, DSparkTrainingArguments


def _forward(model, target, batch):
    from hf_dspark.training.features import compute_target_features

    feats = compute_target_features(target, batch["input_ids"], batch["attention_mask"], [0, 1])
    with torch.no_grad():
        return model(target_hidden=feats.tapped_hidden, input_ids=batch["input_ids"],
                     anchor_positions=batch["anchor_positions"], context_mask=batch["attention_mask"].bool()).logits


def test_lora_trains_only_adapters_and_round_trips(tmp_path, tiny_target):
    drafter = make_tiny_drafter(tiny_target)
    base_state = {k: v.clone() for k, v in drafter.state_dict().items()}
    model = apply_lora(drafter, LoraAdaptConfig(r=4, alpha=8))
    lora_before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    assert lora_before and all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())
    dataset = build_dataset(tokenized_records(8, seed=7))  # the "new domain"
    args = DSparkTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
        save_strategy="no", use_cpu=True, report_to="none", disable_tqdm=True, anchors_per_sequence=4,
    )
    trainer = DSparkTrainer(model=model, args=args, target=tiny_target, train_dataset=dataset)
    trainer.train()
    after = model.state_dict()
    assert any(not torch.equal(after[k], v) for k, v in lora_before.items() if "lora_B" in k)
    base_after = model.get_base_model().state_dict()
    for name, value in base_state.items():  # peft renames adapted linears to <name>.base_layer.weight
        key = name if name in base_after else name.replace(".weight", ".base_layer.weight")
        assert torch.equal(base_after[key], value), name

    trainer.save_model(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    batch = DSparkCollator(block_size=4, anchors_per_sequence=3, seed=0)(dataset.examples[:2])
    expected = _forward(model, tiny_target, batch)
    reloaded = load_lora_drafter(make_tiny_drafter(tiny_target), tmp_path / "adapter")
    torch.testing.assert_close(_forward(reloaded, tiny_target, batch), expected)
    merged = load_lora_drafter(make_tiny_drafter(tiny_target), tmp_path / "adapter", merge=True)
    assert not any("lora_" in k for k in merged.state_dict())
    torch.testing.assert_close(_forward(merged, tiny_target, batch), expected, atol=1e-5, rtol=1e-4)


def test_lora_config_validation(tiny_drafter):
    with pytest.raises(ValueError, match="r >= 1"):
        LoraAdaptConfig(r=0)
    with pytest.raises(ValueError, match="not linear layers"):
        apply_lora(tiny_drafter, LoraAdaptConfig(target_modules=["qkv"]))
