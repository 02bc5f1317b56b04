"""`hf-dspark bench speed` on tiny random models: every method runs, stays lossless, and the report is complete."""

import json
from pathlib import Path

import pytest

from hf_dspark.eval.speed import SpeedConfig, run_speed_benchmark
from hf_dspark.provenance import PROVENANCE_KEYS
from hf_dspark.scheduler import StepCurve
from tests.helpers import make_drafter, make_target


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=3)


def test_speed_benchmark_runs_every_method_losslessly(target, chat_tokenizer, prompt_sets, tmp_path):
    drafter = make_drafter(target, seed=1)
    baseline = make_drafter(target, seed=2, head_type="none", confidence_with_markov=False)
    curve = StepCurve([1, 8, 64], [10.0, 5.0, 1.0], model="tiny", threads=1)
    config = SpeedConfig(prompt_files=prompt_sets, num_prompts=1, max_new_tokens=9, repeats=2, block_sizes=[3],
                         threads=1, untrained=True, out=str(tmp_path / "speed.json"))
    report = run_speed_benchmark(config, target, chat_tokenizer, drafter, baseline, step_curve=curve)
    methods = ["plain", "prompt_lookup", "dflash", "dspark", "dspark_auto", "dspark_lagged_padded", "untrained",
               "untrained_auto", "oracle_g3", "oracle_g3_auto"]
    for set_name in ("gsm8k", "mt-bench"):
        table = report["results"][set_name]
        assert list(table) == methods
        for name, row in table.items():
            assert row["all_outputs_identical_to_plain"], name
            assert row["median_tokens_per_second"] > 0 and row["median_ratio_to_plain"] > 0
            assert (row["mean_accepted_length"] is None) == (name in ("plain", "prompt_lookup"))
        assert table["plain"]["median_ratio_to_plain"] == 1.0
        assert table["oracle_g3"]["mean_accepted_length"] == 4.0  # 1 prefill token + 2 rounds of γ + 1
        assert 0 <= table["untrained_auto"]["skipped_round_fraction"] <= 1
        assert 0 < table["dspark_auto"]["policy_share_of_time"] < 1
    assert len(report["runs"]) == 2 * len(methods) * 2  # sets × methods × repeats
    saved = json.loads((tmp_path / "speed.json").read_text())
    assert saved["results"] == json.loads(json.dumps(report["results"]))
    assert set(PROVENANCE_KEYS) <= set(saved["provenance"]) and saved["provenance"]["command"]
    assert (tmp_path / "speed.png").stat().st_size > 0
    SpeedConfig(prompt_files=prompt_sets, out=str(tmp_path / "speed.json"))  # a rerun may replace its own report


def test_scheduler_method_is_skipped_without_confidence_head(target, chat_tokenizer, prompt_sets, tmp_path):
    drafter = make_drafter(target, use_confidence_head=False)
    config = SpeedConfig(prompt_files=prompt_sets[:1], num_prompts=1, max_new_tokens=4, repeats=1, block_sizes=[],
                         threads=1, out=str(tmp_path / "speed.json"))
    report = run_speed_benchmark(config, target, chat_tokenizer, drafter)
    assert list(report["results"]["gsm8k"]) == ["plain", "prompt_lookup", "dspark", "dspark_auto"]


def test_bad_speed_config_is_refused(prompt_sets, tmp_path):
    with pytest.raises(ValueError, match=">= 1"):
        SpeedConfig(prompt_files=prompt_sets, repeats=0)
    with pytest.raises(ValueError, match=r"missing\.jsonl does not exist"):
        SpeedConfig(prompt_files=[str(tmp_path / "missing.jsonl")])


def test_out_may_only_replace_an_earlier_speed_report(prompt_sets, tmp_path):
    before = Path(prompt_sets[0]).read_text()
    with pytest.raises(ValueError, match=r"gsm8k\.jsonl exists and is not an hf-dspark bench speed report; choose "
                       r"another path or pass --overwrite"):
        SpeedConfig(prompt_files=prompt_sets, out=prompt_sets[0])
    assert Path(prompt_sets[0]).read_text() == before
    SpeedConfig(prompt_files=prompt_sets, out=prompt_sets[0], overwrite=True)
    serve_report = tmp_path / "serve.json"  # another benchmark's report is not a speed report
    serve_report.write_text(json.dumps({"config": {}, "drafter": "x", "block_size": 7, "results": [], "runs": []}))
    with pytest.raises(ValueError, match="not an hf-dspark bench speed report"):
        SpeedConfig(prompt_files=prompt_sets, out=str(serve_report))
    earlier = tmp_path / "speed.json"
    earlier.write_text(json.dumps({"config": {}, "torch_threads": 1, "cpu_count": 2, "results": {}, "runs": []}))
    SpeedConfig(prompt_files=prompt_sets, out=str(earlier))
    with pytest.raises(ValueError, match="is a folder"):
        SpeedConfig(prompt_files=prompt_sets, out=str(tmp_path), overwrite=True)


def test_unpacked_methods_run_beside_the_packed_ones(target, chat_tokenizer, prompt_sets, tmp_path):
    drafter = make_drafter(target, seed=1)
    config = SpeedConfig(prompt_files=prompt_sets[:1], num_prompts=1, max_new_tokens=6, repeats=1, block_sizes=[],
                         threads=1, scheduler=None, unpacked=True, out=str(tmp_path / "speed.json"))
    report = run_speed_benchmark(config, target, chat_tokenizer, drafter)
    table = report["results"]["gsm8k"]
    assert list(table) == ["plain", "prompt_lookup", "dspark", "dspark_auto", "dspark_auto_unpacked",
                           "dspark_unpacked"]
    assert all(row["all_outputs_identical_to_plain"] for row in table.values())
