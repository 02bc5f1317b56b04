"""Prompt sets by name (shipped in the package), by file, and from datasets (`hf://datasets/...`, `--dataset`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_dspark.eval.hf_prompts import DatasetSpec, parse_dataset_spec
from hf_dspark.eval.prompts import PROMPT_SETS, load_prompt_set, resolve_prompt_set, set_names, shipped_prompt_set

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_set_loads_by_name_with_its_provenance():
    provenance = (shipped_prompt_set("gsm8k").parent / "PROVENANCE.md").read_text()
    for name in PROMPT_SETS:
        items = load_prompt_set(name)
        assert items and all(item["turns"] for item in items)
        assert f"| {name} |" in provenance
    assert set_names(list(PROMPT_SETS)) == list(PROMPT_SETS)
    assert len(load_prompt_set("mt-bench")[0]["turns"]) == 2
    assert "aime25" not in PROMPT_SETS and "Not shipped: AIME 2025" in provenance


def test_shipped_sets_equal_the_checkout_files():
    for name in ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench"):
        assert shipped_prompt_set(name).read_bytes() == (ROOT / "data" / "eval" / f"{name}.jsonl").read_bytes()


def test_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"not a shipped set name \(gsm8k, math500"):
        load_prompt_set("gsm9k")


def test_a_file_in_the_current_folder_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("gsm8k").write_text(json.dumps({"turns": ["mine"]}) + "\n")
    assert load_prompt_set("gsm8k") == [{"turns": ["mine"]}]


def test_dataset_specs_parse():
    assert parse_dataset_spec("hf://datasets/openai/gsm8k") == DatasetSpec("openai/gsm8k", "test", None)
    assert parse_dataset_spec("hf://datasets/a/b:train:question") == DatasetSpec("a/b", "train", "question")
    assert DatasetSpec("a/b", "train", "q").uri == "hf://datasets/a/b:train:q"
    with pytest.raises(ValueError, match="dataset name is empty"):
        parse_dataset_spec("hf://datasets/:test")


@pytest.fixture
def local_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tiny_dataset"
    folder.mkdir()
    rows = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "Name a prime.", "answer": "7"}]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_dataset_is_read_once_through_datasets_then_cached(local_dataset, tmp_path):
    spec = DatasetSpec(str(local_dataset), "test", "question").uri
    assert load_prompt_set(spec) == [{"turns": ["What is 2 + 2?"]}, {"turns": ["Name a prime."]}]
    cached = resolve_prompt_set(spec)
    assert cached.is_relative_to(tmp_path / "cache" / "prompts")
    (local_dataset / "test.jsonl").unlink()  # the cache answers from now on, without the dataset
    assert load_prompt_set(spec)[0] == {"turns": ["What is 2 + 2?"]}
    assert set_names([spec]) == [cached.stem]


def test_the_prompt_column_is_found_or_named(local_dataset):
    assert load_prompt_set(DatasetSpec(str(local_dataset)).uri)[1] == {"turns": ["Name a prime."]}  # "question"
    with pytest.raises(ValueError, match=r"no column 'prompt'; this split has \['question', 'answer'\]"):
        load_prompt_set(DatasetSpec(str(local_dataset), "test", "prompt").uri)


def test_an_uncached_dataset_offline_is_a_clear_error(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DSPARK_CACHE": str(tmp_path),
           "HF_HOME": str(tmp_path / "hf")}
    code = ("from hf_dspark.eval.prompts import load_prompt_set\n"
            "try:\n    load_prompt_set('hf://datasets/nobody-here/no-such-set:test:question')\n"
            "except ValueError as error:\n    print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300).stdout
    assert "could not be read" in out and "Offline" in out and "JSONL file" in out


def test_the_cli_reads_a_dataset_folder_before_loading_any_model(local_dataset, capsys):
    from hf_dspark.cli import main

    with pytest.raises(SystemExit) as exit_info:  # the bad --field is refused before the target loads
        main(["bench", "speed", "--dataset", str(local_dataset), "--field", "nope", "--sets", "gsm8k"])
    assert exit_info.value.code == 2
    assert "--sets: hf://datasets/" in capsys.readouterr().err
