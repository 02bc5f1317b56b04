"""`hf-dspark bench speed` on tiny random models: every method runs, stays lossless, and the report is complete."""

import json
from pathlib import Path

import pytest

from hf_dspark.eval.speed import SpeedConfig, run_speed_benchmark
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.provenance import PROVENANCE_KEYS
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
    methods = ["plain", "prompt_lookup", "dflash", "dspark", "dspark_auto", "dspark_lagged_padded", "hybrid",
               "hybrid_auto", "untrained", "untrained_auto", "oracle_g3", "oracle_g3_auto"]
    for set_name in ("gsm8k", "mt-bench"):
        table = report["results"][set_name]
        assert list(table) == methods
        for name, row in table.items():
            assert row["all_outputs_identical_to_plain"], name
            assert row["median_tokens_per_second"] > 0 and row["median_ratio_to_plain"] > 0
            low, high = row["ratio_interquartile_range"]
            assert row["ratio_min"] <= low <= row["median_ratio_to_plain"] <= high <= row["ratio_max"]
            assert row["pairs"] == 2  # 1 prompt × 2 repeats, each paired with plain in the same repeat
            assert (row["mean_accepted_length"] is None) == (name in ("plain", "prompt_lookup"))
        assert table["plain"]["median_ratio_to_plain"] == 1.0
        assert table["oracle_g3"]["mean_accepted_length"] == 4.0  # 1 prefill token + 2 rounds of γ + 1
        assert 0 <= table["untrained_auto"]["skipped_round_fraction"] <= 1
        assert 0 < table["dspark_auto"]["policy_share_of_time"] < 1
        assert 0 <= table["hybrid"]["lookup_share"] <= 1 and "lookup_share" not in table["dspark"]
    assert set(report["macro"]) == set(methods) and report["macro"]["plain"]["mean_of_median_ratios_to_plain"] == 1
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
    assert list(report["results"]["gsm8k"]) == ["plain", "prompt_lookup", "dspark", "dspark_auto", "hybrid",
                                                "hybrid_auto"]


def test_bad_speed_config_is_refused(prompt_sets, tmp_path):
    with pytest.raises(ValueError, match=">= 1"):
        SpeedConfig(prompt_files=prompt_sets, repeats=0)
    with pytest.raises(ValueError, match=r"unknown speed methods \['hybird'\]; choose from"):
        SpeedConfig(prompt_files=prompt_sets, methods=["hybrid", "hybird"])
    with pytest.raises(ValueError, match=r"missing\.jsonl: no such file, and not a shipped set name"):
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
                           "dspark_unpacked", "hybrid", "hybrid_auto"]
    assert all(row["all_outputs_identical_to_plain"] for row in table.values())


def test_selected_methods_run_and_auto_learns_across_prompts(target, chat_tokenizer, prompt_sets, tmp_path,
                                                             monkeypatch):
    from hf_dspark.generation import loop as loop_module

    memories = []
    build = loop_module.policy_from_options

    def recording(options, *args, **kwargs):  # a spy: the PolicyMemory each "auto" generate call is given
        if options.dspark_policy == "auto":
            memories.append(options.dspark_policy_memory)
        return build(options, *args, **kwargs)

    monkeypatch.setattr(loop_module, "policy_from_options", recording)
    drafter = make_drafter(target, seed=1)
    curve = StepCurve([1, 8, 64], [10.0, 5.0, 1.0], model="tiny", threads=1)
    config = SpeedConfig(prompt_files=prompt_sets, num_prompts=2, max_new_tokens=8, repeats=1, block_sizes=[3],
                         threads=1, methods=["lookup", "hybrid", "hybrid_auto"], out=str(tmp_path / "speed.json"))
    report = run_speed_benchmark(config, target, chat_tokenizer, drafter, step_curve=curve)
    for table in report["results"].values():
        assert list(table) == ["plain", "lookup", "hybrid", "hybrid_auto"]
        assert all(row["all_outputs_identical_to_plain"] for row in table.values())
        assert table["lookup"]["mean_accepted_length"] >= 1
    assert report["config"]["methods"] == ["lookup", "hybrid", "hybrid_auto"]
    assert len(memories) == 2 * 2 * 2  # sets × prompts × (warm-up, timed run) of hybrid_auto
    assert memories[0] is not None and all(m is memories[0] for m in memories)  # one memory, shared


def test_identity_check_catches_an_output_that_differs_from_plain(target, chat_tokenizer, prompt_sets, tmp_path):
    from hf_dspark.eval.speed import _timed_row

    ids = chat_tokenizer.apply_chat_template([{"role": "user", "content": "abc"}], add_generation_prompt=True,
                                             return_tensors="pt")
    ids = ids if hasattr(ids, "shape") else ids["input_ids"]
    plain = target.generate(ids, do_sample=False, max_new_tokens=4, min_new_tokens=4)
    other = plain.clone()
    other[0, -1] = (other[0, -1] + 1) % target.config.vocab_size
    assert _timed_row(lambda: plain, None, ids, plain)["identical"]
    row = _timed_row(lambda: other, None, ids, plain)
    assert not row["identical"] and row["new_tokens"] == 4 and row["accepted_length"] is None
