"""Tests for the online and offline target feature providers."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_helpers import make_tiny_target, tokenized_records
from transformers.utils import logging as hf_logging

from hf_dspark.training.collator import DSparkCollator
from hf_dspark.training.data import build_dataset
from hf_dspark.training.features import (
    TargetFeatureProvider,
    build_feature_cache,
    read_manifest,
    target_fingerprint,
    target_logits_at,
)


def test_online_features_are_layer_outputs_and_final_norm(tiny_target):
    ids = torch.randint(0, 128, (2, 9))
    mask = torch.ones_like(ids)
    feats = TargetFeatureProvider.online(tiny_target, [0, 2])({"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        full = tiny_target(ids, attention_mask=mask, output_hidden_states=True)
    torch.testing.assert_close(feats.tapped_hidden, torch.cat([full.hidden_states[1], full.hidden_states[3]], -1))
    torch.testing.assert_close(feats.final_hidden, full.hidden_states[-1])
    positions = torch.tensor([[[0, 1], [4, 5]], [[2, 3], [7, 8]]])
    logits = target_logits_at(feats.final_hidden, positions, tiny_target.lm_head)
    assert logits.shape == (2, 2, 2, 128)
    torch.testing.assert_close(logits[1, 1, 0], full.logits[1, 7])


def _dataset():
    return build_dataset(tokenized_records(6))


def test_offline_cache_matches_online(tmp_path, tiny_target, caplog):
    dataset = _dataset()
    build_feature_cache(tiny_target, dataset.examples, tmp_path / "cache", [0, 1], batch_size=2, samples_per_shard=4)
    manifest = read_manifest(tmp_path / "cache")
    assert manifest["layer_ids"] == [0, 1] and manifest["dtype"] == "bfloat16"
    assert len(manifest["shards"]) == 2
    batch = DSparkCollator(block_size=4, anchors_per_sequence=2)(dataset.examples[:3])
    offline = TargetFeatureProvider.offline(tmp_path / "cache", tiny_target, [0, 1])(batch)
    online = TargetFeatureProvider.online(tiny_target, [0, 1])(batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(offline.tapped_hidden.float()[real], online.tapped_hidden[real], atol=0.05, rtol=0.02)
    torch.testing.assert_close(offline.final_hidden.float()[real], online.final_hidden[real], atol=0.05, rtol=0.02)
    assert offline.tapped_hidden[~real].abs().sum() == 0
    # a rebuild with the same target (in another dtype) and data reuses the cache without writing anything
    build_feature_cache(tiny_target.to(torch.bfloat16), dataset.examples, tmp_path / "cache", [0, 1])
    assert read_manifest(tmp_path / "cache") == manifest


def test_offline_cache_refuses_other_target_layers_or_data(tmp_path, tiny_target):
    dataset = _dataset()
    build_feature_cache(tiny_target, dataset.examples, tmp_path / "cache", [0, 1])
    other = make_tiny_target(seed=5)
    assert target_fingerprint(other) != target_fingerprint(tiny_target)
    with pytest.raises(ValueError, match="target_fingerprint"):
        build_feature_cache(other, dataset.examples, tmp_path / "cache", [0, 1])
    with pytest.raises(ValueError, match="layer_ids"):
        build_feature_cache(tiny_target, dataset.examples, tmp_path / "cache", [0, 2])
    with pytest.raises(ValueError, match="dataset_fingerprint"):
        build_feature_cache(tiny_target, dataset.examples[:3], tmp_path / "cache", [0, 1])
    with pytest.raises(ValueError, match="target_fingerprint"):
        TargetFeatureProvider.offline(tmp_path / "cache", other)
    with pytest.raises(ValueError, match="layer_ids"):
        TargetFeatureProvider.offline(tmp_path / "cache", layer_ids=[1, 2])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        build_feature_cache(tiny_target, dataset.examples, tmp_path / "busy", [0, 1])
    with pytest.raises(FileNotFoundError):
        TargetFeatureProvider.offline(tmp_path / "nothing")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_offline_cache_logs_size_estimate(tmp_path, tiny_target):
    dataset = _dataset()
    tokens = sum(len(e["input_ids"]) for e in dataset.examples)
    logger, capture = hf_logging.get_logger("hf_dspark.training.features"), _Capture()
    logger.addHandler(capture)
    try:
        build_feature_cache(tiny_target, dataset.examples, tmp_path / "cache", [0, 1])
    finally:
        logger.removeHandler(capture)
    assert any(f"{tokens} tokens" in m and "GiB" in m for m in capture.messages)
