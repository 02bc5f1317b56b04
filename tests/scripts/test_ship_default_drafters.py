"""`scripts/ship_default_drafters.py`: the model card's record of a stage trained by `scripts/device_train.py`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "benchmarks/results/x86_64--AVX512--bf16/qk_finetune.json"


def _ship():
    spec = importlib.util.spec_from_file_location("ship", ROOT / "scripts" / "ship_default_drafters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_device_train_stage_is_described_from_its_record():
    results = json.loads(RECORD.read_text())
    arm = results["arms"]["greedy"]
    text, reproduce = _ship().device_train_stage("dspark", RECORD, "greedy", "v7", 7.1)
    assert text.startswith("v1: ") and "v6: warm start from v5" in text
    assert "v7 (this stage): v6 converted to per-head q/k RMSNorms" in text
    assert f"{arm['steps']} steps × {arm['batch']} sequences on the greedy replies" in text
    assert "beside the other data arms (sampled)" in text and "7.1 CPU-hours" in text
    assert results["command"] in reproduce
    assert f"--checkpoint {results['settings']['out']}/greedy" in reproduce
    assert "smollm2-135m-instruct-dspark --prompts" in reproduce


def test_an_arm_the_record_lacks_is_refused_with_the_arms_it_has(tmp_path):
    results = json.loads(RECORD.read_text())
    results["arms"]["sampled"]["weights"] = []  # trained but not saved
    record = tmp_path / "results.json"
    record.write_text(json.dumps(results))
    with pytest.raises(SystemExit, match=r"no trained arm 'sampled' \(arms: \['greedy', 'sampled'\]\)"):
        _ship().device_train_stage("dspark", record, "sampled", "v7", None)
    with pytest.raises(SystemExit, match="no trained arm 'other'"):
        _ship().device_train_stage("dspark", record, "other", "v7", None)
