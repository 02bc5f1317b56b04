"""`scripts/device_train.py` end to end on CPU: the dry run of the GPU training run.

The fast test uses a tiny random target (a byte-level chat tokenizer) and a tiny drafter trained without q/k norms;
the slow one runs the real embedded SmolLM2 target and the shipped drafter with a tiny budget.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark import DSparkDrafter
from hf_dspark.model.configuration_dspark import DSparkConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from tiny_helpers import make_byte_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_train.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("device_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture
def tiny_setup(tmp_path):
    """A tiny target folder, an init drafter without q/k norms, two data arms and two eval sets."""
    tokenizer = make_byte_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=260,
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=1,
    )
    target = LlamaForCausalLM(config).eval()
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    drafter = DSparkDrafter(
        DSparkConfig.from_target(config, block_size=4, target_layer_ids=[0, 2], markov_rank=8, use_qk_norm=False)
    ).bind_target(target)
    drafter.save_pretrained(tmp_path / "init")
    for arm, word in (("sampled", "stone"), ("greedy", "river")):
        (tmp_path / arm).mkdir()
        rows = [
            {"turns": [f"question {i}?"], "responses": [f"the {word} number {i} is near the {word} ok"]}
            for i in range(12)
        ]
        _jsonl(tmp_path / arm / "data.jsonl", rows)
    sets = [
        _jsonl(tmp_path / "gsm8k.jsonl", [{"turns": [f"add {i} and {i}"]} for i in range(3)]),
        _jsonl(tmp_path / "mt-bench.jsonl", [{"turns": ["tell me", "more"]} for _ in range(2)]),
    ]
    return tmp_path, sets


def _check_results(out: Path, arms: list[str], sets: list[str], temperatures: list[str]) -> dict:
    results = json.loads((out / "results.json").read_text())
    assert results["complete"], results["errors"]
    assert results["out_problems"] == [] and results["provenance"]["device"] == "cpu"
    assert set(results["tau"]) == {"init", "init_qk", *arms}
    for name, tau in results["tau"].items():
        assert set(tau) == set(temperatures), name
        for row in tau.values():
            assert set(sets) <= set(row) and row["macro"] >= 1.0
    for arm in arms:
        record = results["arms"][arm]
        assert record["phase"] == "done" and record["steps"] >= 1 and record["loss"]["curve"]
        assert record["planned_steps"] is None or record["steps"] <= record["planned_steps"]
        files = sorted(p.name for p in (out / arm).iterdir())
        assert "config.json" in files and all(f == "config.json" or f.startswith("model") for f in files)
        assert json.loads((out / arm / "config.json").read_text())["use_qk_norm"] is True
    return results


def test_device_train_dry_run_on_a_tiny_target(tiny_setup):
    root, sets = tiny_setup
    device_train = _load_script()
    out = root / "out"
    argv = [
        "--target",
        str(root / "target"),
        "--init",
        str(root / "init"),
        "--device",
        "cpu",
        "--arms",
        f"sampled={root}/sampled/*.jsonl",
        f"greedy={root}/greedy/*.jsonl",
        "--eval-sets",
        *sets,
        "--minutes",
        "0.1",
        "--grace-minutes",
        "2",
        "--eval-limit",
        "2",
        "--max-new-tokens",
        "8",
        "--batch",
        "2",
        "--work-dir",
        str(root / "work"),
        "--out",
        str(out),
    ]
    assert device_train.main(argv) == 0
    results = _check_results(out, ["sampled", "greedy"], ["gsm8k", "mt-bench"], ["T=0", "T=1"])
    assert results["init"]["qk_norm"] == "fitted" and results["init"]["new_parameters"] == 4
    arms = results["arms"]
    if arms["sampled"]["stopped_by"] == "schedule" and arms["greedy"]["stopped_by"] == "schedule":
        assert arms["sampled"]["steps"] == arms["greedy"]["steps"]  # the agreed plan
    trained = DSparkDrafter.from_pretrained(out / "sampled", target=LlamaForCausalLM.from_pretrained(root / "target"))
    assert trained.layers[0].self_attn.q_norm is not None


def test_device_train_refuses_bad_inputs(tmp_path, tiny_setup):
    root, _ = tiny_setup
    device_train = _load_script()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(SystemExit):
        device_train.parse_args(["--out", str(tmp_path / "full")])
    with pytest.raises(SystemExit):
        device_train.parse_args(["--out", str(tmp_path / "o"), "--arms", f"a={root}/nothing/*.jsonl"])
    with pytest.raises(SystemExit):
        device_train.parse_args(["--out", str(tmp_path / "o"), "--arms", f"init={root}/sampled/*.jsonl"])


def test_out_tree_check(tmp_path):
    device_train = _load_script()
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    for i in range(9):
        (tmp_path / "a" / f"f{i}").write_text("")
    problems = device_train.check_out_tree(tmp_path)
    assert any("9 entries" in p for p in problems) is False and any("10 entries" in p for p in problems)
    assert any("deeper" in p for p in problems)


@pytest.mark.slow
def test_device_train_dry_run_on_the_embedded_target(tmp_path):
    pytest.importorskip("gguf")
    device_train = _load_script()
    out = tmp_path / "out"
    argv = [
        "--device",
        "cpu",
        "--minutes",
        "0.3",
        "--grace-minutes",
        "6",
        "--eval-limit",
        "1",
        "--max-new-tokens",
        "16",
        "--work-dir",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    assert device_train.main(argv) == 0
    _check_results(out, ["sampled", "greedy"], ["gsm8k", "humaneval", "mt-bench"], ["T=0", "T=1"])
