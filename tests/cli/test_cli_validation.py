"""Bad command-line input is refused before any model is loaded, with a message naming the option (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_dspark.cli import bench, demo, main


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a target would mean validation came too late: make it fail the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were validated")

    monkeypatch.setattr(demo, "load_target", forbidden)
    monkeypatch.setattr(bench, "load_target", forbidden)


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--max-new-tokens", "0"], "--max-new-tokens: expected an integer >= 1, got 0"),
        (["--threads", "two"], "--threads: expected an integer >= 1, got 'two'"),
        (["--prompt", "  "], "--prompt is empty"),
        (["--prompt", "caf\udce9"], "--prompt is not valid Unicode text"),  # Latin-1 bytes on a UTF-8 command line
        (["--drafter", "no/such/folder"], "--drafter no/such/folder: no such folder"),
        (["--device", "gpu0"], "--device: not a torch device: 'gpu0'"),
        (["--policy", "fastest"], "--policy 'fastest' is not a dspark_policy"),
    ],
)
def test_demo_validates_before_loading(argv, expected, capsys, no_model_load):
    err = _usage_error(["demo", *argv], capsys)
    assert err.startswith("usage: hf-dspark demo")
    assert expected in err


def test_demo_refuses_a_folder_without_config(tmp_path, capsys, no_model_load):
    err = _usage_error(["demo", "--drafter", str(tmp_path)], capsys)
    assert f"--drafter {tmp_path}: no config.json" in err


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--policies", "fixed", "bogus"], "unknown policies ['bogus']"),
        (["--threshold", "5"], "--threshold: expected a number in [0, 1], got 5.0"),
        (["--concurrency", "4", "0"], "--concurrency: expected an integer >= 1, got 0"),
        (["--arrival-rate", "-1"], "--arrival-rate: expected a finite number > 0, got -1"),
        (["--sets", "missing.jsonl"], "--sets: prompt set missing.jsonl: no such file"),
        (["--drafter", "missing_drafter_dir/x/y"], "no such folder"),
    ],
)
def test_bench_serve_validates_before_loading(argv, expected, prompt_file, capsys, no_model_load):
    sets = [] if "--sets" in argv else ["--sets", prompt_file]
    err = _usage_error(["bench", "serve", *sets, *argv], capsys)
    assert err.startswith("usage: hf-dspark bench serve")
    assert expected in err


def test_bench_serve_names_a_malformed_prompt_line(tmp_path, capsys, no_model_load):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{"turns": [oops]}\n')
    err = _usage_error(["bench", "serve", "--sets", str(bad)], capsys)
    assert f"{bad}:2 is not valid JSON" in err


def test_bench_speed_validates_before_loading(prompt_file, capsys, no_model_load):
    err = _usage_error(["bench", "speed", "--sets", "missing.jsonl"], capsys)
    assert "--sets: prompt set missing.jsonl: no such file" in err
    err = _usage_error(["bench", "speed", "--sets", prompt_file, "--scheduler", "lagged_paded"], capsys)
    assert "--scheduler 'lagged_paded' is not a dspark_policy" in err
    err = _usage_error(["bench", "speed", "--sets", prompt_file, "--methods", "hybrid", "hybird"], capsys)
    assert "--methods: invalid choice: 'hybird'" in err


def test_bench_serve_refuses_the_hybrid_with_the_oracle(prompt_file, capsys, no_model_load):
    err = _usage_error(["bench", "serve", "--sets", prompt_file, "--hybrid", "--oracle"], capsys)
    assert "--hybrid and --oracle exclude each other" in err


@pytest.mark.parametrize("command", ["speed", "serve"])
def test_bench_out_refuses_a_file_that_is_not_its_report(command, prompt_file, capsys, no_model_load, monkeypatch):
    before = Path(prompt_file).read_text()
    err = _usage_error(["bench", command, "--sets", prompt_file, "--out", prompt_file], capsys)
    assert err.startswith(f"usage: hf-dspark bench {command}")
    assert f"--out {prompt_file} exists and is not an hf-dspark bench {command} report" in err
    assert "pass --overwrite to replace it" in err
    assert Path(prompt_file).read_text() == before
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # keep this process's thread count
    with pytest.raises(AssertionError, match="the target was loaded"):  # --overwrite: validation passes
        main(["bench", command, "--sets", prompt_file, "--out", prompt_file, "--overwrite"])
    assert Path(prompt_file).read_text() == before


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{bad", "extra_generate_kwargs is not valid JSON (Expecting property name enclosed in double quotes"),
        ("[1, 2]", "extra_generate_kwargs must be a JSON object, got a list"),
    ],
)
def test_prepare_data_names_malformed_extra_generate_kwargs(value, expected, prompt_file, tmp_path, capsys):
    err = _usage_error(
        [
            "prepare-data",
            "--inputs",
            prompt_file,
            "--output_dir",
            str(tmp_path / "out"),
            "--extra_generate_kwargs",
            value,
        ],
        capsys,
    )
    assert err.startswith("usage: hf-dspark prepare-data")
    assert expected in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '{"batch_tokens": [1, 2],\n "steps_per_second": [3.0, }',
            "is not valid JSON: Expecting value at line 2, column",
        ),
        ("[1, 2]", "must hold a JSON object, got a list"),
        ('{"batch_tokens": [1, 2]}', "is not a step curve: A step curve needs 'batch_tokens' and 'steps_per_second'"),
    ],
)
def test_export_names_a_malformed_step_curve(content, expected, tmp_path, capsys):
    curve = tmp_path / "curve.json"
    curve.write_text(content)
    err = _usage_error(
        ["export", "--drafter", str(tmp_path), "--step-curve", str(curve), str(tmp_path / "out")], capsys
    )
    assert f"argument --step-curve: {curve} {expected}" in err
    assert not (tmp_path / "out").exists()


def test_auto_device_is_cuda_only_when_available():
    import torch

    from hf_dspark.cli.loaders import resolve_device

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:1") == "cuda:1"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--drafters", "a=untrained", "a=untrained:3"], "names must be unique; 'a' is given more than once"),
        (["--drafters", "prompt_lookup=untrained", "--prompt-lookup"], "'prompt_lookup' is reserved"),
        (["--drafters", "prompt_lookup=prompt-lookup:7"], "'prompt_lookup' is reserved for --prompt-lookup"),
    ],
)
def test_eval_refuses_ambiguous_drafter_names(argv, expected, capsys, monkeypatch):
    from hf_dspark.cli import eval as eval_cli

    monkeypatch.setattr(eval_cli, "load_target", lambda *a, **k: pytest.fail("loaded before validating"))
    err = _usage_error(["eval", *argv], capsys)
    assert err.startswith("usage: hf-dspark eval") and expected in err


def test_profile_refuses_to_replace_a_user_file_or_write_into_a_folder(tmp_path, capsys, monkeypatch):
    from hf_dspark.cli import scheduling

    def forbidden(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were validated")

    monkeypatch.setattr(scheduling, "load_target", forbidden)
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    err = _usage_error(["profile", "--out", str(notes)], capsys)
    assert "is not a curve saved by hf-dspark profile" in err and "--overwrite" in err
    assert notes.read_text() == '{"mine": 1}'
    assert f"--out {tmp_path} is a folder" in _usage_error(["profile", "--out", str(tmp_path)], capsys)
    assert f"--plot {tmp_path} is a folder" in _usage_error(["profile", "--plot", str(tmp_path)], capsys)


def test_eval_checks_sets_limit_and_drafters_before_loading(tmp_path, capsys, monkeypatch):
    from hf_dspark.cli import eval as eval_cli

    def forbidden(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were validated")

    monkeypatch.setattr(eval_cli, "load_target", forbidden)
    sets = tmp_path / "set.jsonl"
    sets.write_text('{"turns": ["hi"]}\n')
    out = ["--out", str(tmp_path / "eval.json")]
    assert "missing.jsonl" in _usage_error(["eval", "--sets", str(tmp_path / "missing.jsonl"), *out], capsys)
    assert "--limit" in _usage_error(["eval", "--sets", str(sets), "--limit", "0", *out], capsys)
    err = _usage_error(["eval", "--sets", str(sets), "--drafters", "a=/no/such/drafter", *out], capsys)
    assert "no such folder" in err
    err = _usage_error(["eval", "--sets", str(sets), "--drafters", "a=untrained:abc", *out], capsys)
    assert "must be an integer >= 1" in err


def test_a_cuda_device_on_a_machine_without_one_is_a_usage_error(capsys, no_model_load):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert "CUDA device(s)" in _usage_error(["demo", "--device", "cuda:7"], capsys)


def test_export_checks_the_drafter_before_loading_the_target(tmp_path, capsys):
    err = _usage_error(["export", "--drafter", str(tmp_path / "none"), str(tmp_path / "out")], capsys)
    assert "no such folder" in err and not (tmp_path / "out").exists()


def test_export_refuses_a_non_empty_output_folder_before_loading_anything(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = _usage_error(["export", "--drafter", str(tmp_path / "none"), str(out)], capsys)
    assert err.startswith("usage: hf-dspark export")
    assert f"OUT {out} is not empty (keep.txt)" in err and "--overwrite" in err
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_prepare_data_refuses_an_input_file_without_prompts(content, prompt_file, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content)
    err = _usage_error(
        ["prepare-data", "--inputs", prompt_file, str(empty), "--output_dir", str(tmp_path / "out")], capsys
    )
    assert err.startswith("usage: hf-dspark prepare-data")
    assert f"inputs: {empty} holds no prompts (the file is empty or blank)" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"turns": ["fine"]}\n{"turns": ["a lone \\ud800 surrogate"]}\n', ":2 holds text that is not valid Unicode"),
        (b'{"turns": ["not \xed\xa0\x80 UTF-8"]}\n', "is not UTF-8 text"),
    ],
    ids=["surrogate-escape", "surrogate-bytes"],
)
def test_prepare_data_refuses_a_prompt_file_that_is_not_unicode_text(content, expected, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    err = _usage_error(["prepare-data", "--inputs", str(bad), "--output_dir", str(tmp_path / "out")], capsys)
    assert err.startswith("usage: hf-dspark prepare-data") and f"inputs: {bad}" in err and expected in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


class _Configured(Exception):
    """Raised by a recording config class: the command got as far as building its config."""


@pytest.mark.parametrize(
    ("argv", "module", "config_class", "name"),
    [
        (["bench", "speed"], "hf_dspark.eval.speed", "SpeedConfig", "speed"),
        (["bench", "serve"], "hf_dspark.eval.serve", "ServeConfig", "serve"),
        (["eval"], "hf_dspark.eval.accepted_length", "EvalConfig", "eval"),
    ],
)
def test_default_out_is_filed_under_the_processor_kind(
    argv, module, config_class, name, prompt_file, capsys, monkeypatch
):
    """Without --out, every result command writes `benchmarks/results/<processor kind>/<name>.json` (the folders
    of every other result), and its help says so; the config classes default to the same place."""
    import importlib

    from hf_dspark.provenance import processor_kind

    expected = f"benchmarks/results/{processor_kind('cpu')}/{name}.json"
    seen = {}

    def record(**kwargs):
        seen["out"] = kwargs["out"]
        raise _Configured

    config_module = importlib.import_module(module)
    assert getattr(config_module, config_class).__dataclass_fields__["out"].default_factory() == expected
    monkeypatch.setattr(config_module, config_class, record)
    with pytest.raises(_Configured):
        main([*argv, "--sets", prompt_file, "--device", "cpu"])
    assert seen["out"] == expected
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    assert f"benchmarks/results/<processor kind>/{name}.json" in " ".join(capsys.readouterr().out.split())
