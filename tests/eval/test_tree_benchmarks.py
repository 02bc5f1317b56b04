"""`bench speed` and `bench serve` with draft trees on tiny random models: the tree methods run losslessly and
report the nodes they verified."""

import pytest
import torch

from hf_dspark.eval.serve import ServeConfig, run_serve_benchmark
from hf_dspark.eval.speed import SpeedConfig, run_speed_benchmark
from hf_dspark.profiling.step_curve import StepCurve
from tests.helpers import make_drafter, make_target, ragged_prompts

CURVE = StepCurve([1, 8, 64], [10.0, 6.0, 1.5], model="tiny", threads=1)
DRAFT_CURVE = StepCurve([1, 8], [40.0, 20.0])


def test_speed_tree_methods(chat_tokenizer, prompt_sets, tmp_path):
    target = make_target("llama", seed=3)
    drafter = make_drafter(target, seed=1)
    config = SpeedConfig(prompt_files=prompt_sets[:1], num_prompts=1, max_new_tokens=9, repeats=1, block_sizes=[],
                         threads=1, methods=["dspark", "dspark_tree", "hybrid_tree"], tree_budget=6,
                         out=str(tmp_path / "speed.json"))
    report = run_speed_benchmark(config, target, chat_tokenizer, drafter, step_curve=CURVE)
    table = report["results"]["gsm8k"]
    assert list(table) == ["plain", "dspark", "dspark_tree", "dspark_tree_auto", "hybrid_tree", "hybrid_tree_auto"]
    assert all(row["all_outputs_identical_to_plain"] for row in table.values())
    assert 0 < table["dspark_tree"]["mean_tree_nodes"] <= 5 and "mean_tree_nodes" not in table["dspark"]


def test_speed_tree_budget_is_checked(prompt_sets, tmp_path):
    with pytest.raises(ValueError, match="tree_budget"):
        SpeedConfig(prompt_files=prompt_sets, tree_budget=1, out=str(tmp_path / "speed.json"))


def test_serve_with_trees(tmp_path):
    target = make_target("llama", seed=7)
    drafter = make_drafter(target, seed=1)
    ids, mask = ragged_prompts(4, seed=4)
    prompts = [row[m.bool()] for row, m in zip(ids, mask)]
    config = ServeConfig(concurrency=[1, 3], policies=["none", "fixed", "auto"], requests_per_level=3,
                         max_new_tokens=5, threads=1, tree_budget=6, out=str(tmp_path / "serve.json"))
    report = run_serve_benchmark(config, target, prompts, drafter, step_curve=CURVE, draft_curve=DRAFT_CURVE)
    rows = {(r["policy"], r["concurrency"]): r for r in report["results"]}
    assert all(0 < rows[("fixed", c)]["mean_tree_nodes"] <= 5 for c in (1, 3))
    assert all("mean_tree_nodes" not in rows[("none", c)] for c in (1, 3))
    with pytest.raises(ValueError, match="tree_budget"):
        ServeConfig(tree_budget=1, out=str(tmp_path / "serve.json"))
    assert torch.is_tensor(prompts[0])


@pytest.mark.parametrize("command", ["speed", "serve"])
@pytest.mark.parametrize(("value", "expected"), [("1", "a tree needs >= 2 nodes"), ("x", "expected an integer")])
def test_cli_tree_budget_is_checked_before_loading(command, value, expected, capsys, monkeypatch):
    from hf_dspark.cli import bench, main

    def forbidden(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were validated")

    monkeypatch.setattr(bench, "load_target", forbidden)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", command, "--tree-budget", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--tree-budget" in err and expected in err, err
