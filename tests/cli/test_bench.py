"""`hf-dspark bench serve`'s printed verdict: the ratio to plain per policy and load C, and whether auto reaches
the project's goal (≥ 0.95× plain at every C), without changing the exit code."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from hf_dspark.cli import bench, main

RATIOS = {"fixed": {1: 1.488, 2: 0.97, 8: 0.718}, "auto": {1: 1.597, 2: 1.133, 8: 0.951}}


def test_ratio_table_has_a_column_per_load_and_a_row_per_policy():
    lines = bench.ratio_table({"fixed": {1: 1.488, 8: 0.718}, "auto": {2: 1.133}})
    assert lines[1].split() == ["policy", "C=1", "C=2", "C=8"]
    assert lines[2].split() == ["fixed", "1.49", "-", "0.72"]
    assert lines[3].split() == ["auto", "-", "1.13", "-"]


def test_ratio_table_reads_a_report_loaded_back_from_json():
    loaded = json.loads(json.dumps(RATIOS))  # C keys become strings
    assert bench.ratio_table(loaded) == bench.ratio_table(RATIOS)
    assert bench.auto_verdict(loaded) == bench.auto_verdict(RATIOS)


def test_auto_verdict_names_the_loads_below_the_goal():
    assert bench.auto_verdict(RATIOS) == "auto >= 0.95x plain at every C: yes (lowest 0.951x at C=8)"
    missed = {"auto": {1: 1.2, 4: 0.949, 16: 0.9}}
    assert bench.auto_verdict(missed) == "auto >= 0.95x plain at every C: no (0.949x at C=4, 0.900x at C=16)"
    assert "not measured" in bench.auto_verdict({"fixed": {1: 1.0}})
    assert "not measured" in bench.ratio_table({})[0]


@pytest.mark.parametrize("auto_at_8", [1.05, 0.6])
def test_bench_serve_prints_the_verdict_and_exits_0_either_way(auto_at_8, tmp_path, capsys, monkeypatch):
    from hf_dspark.eval import prompts, serve

    prompt_file = tmp_path / "set.jsonl"
    prompt_file.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    ratios = {"fixed": {1: 1.2, 8: 0.7}, "auto": {1: 1.3, 8: auto_at_8}}
    report = {"results": [], "ratios_to_plain": ratios}
    drafter = SimpleNamespace(config=SimpleNamespace(block_size=7))
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # keep this process's thread count
    monkeypatch.setattr(bench, "load_target", lambda *a, **k: (None, None))
    monkeypatch.setattr(bench, "load_drafter", lambda *a, **k: (drafter, "a drafter"))
    monkeypatch.setattr(prompts, "chat_input_ids", lambda tokenizer, turns: torch.ones(1, 3, dtype=torch.long))
    configs = []
    monkeypatch.setattr(serve, "run_serve_benchmark", lambda config, *a, **k: configs.append(config) or report)
    argv = [
        "bench",
        "serve",
        "--sets",
        str(prompt_file),
        "--policies",
        "none",
        "fixed",
        "auto",
        "--concurrency",
        "1",
        "8",
        "--out",
        str(tmp_path / "serve.json"),
        "--repeats",
        "2",
    ]
    assert main(argv) == 0
    assert configs[0].repeats == 2  # interleaved passes, the ratios' median over them
    out = capsys.readouterr().out
    assert "auto              1.30" in out
    verdict = "yes (lowest 1.050x at C=8)" if auto_at_8 > 1 else "no (0.600x at C=8)"
    assert f"auto >= 0.95x plain at every C: {verdict}" in out
