"""hf_dspark.provenance: the record every result JSON carries."""

import json
import subprocess

import pytest

from hf_dspark.provenance import PROVENANCE_KEYS, git_state, result_provenance, with_provenance


def test_record_has_every_key_and_is_json():
    record = result_provenance(command=["hf-dspark", "bench", "speed", "--out", "a b.json"])
    assert tuple(record) == PROVENANCE_KEYS
    assert record["command"] == "hf-dspark bench speed --out 'a b.json'"
    assert record["versions"]["torch"] and record["versions"]["python"]
    assert record["threads"] >= 1
    json.dumps(record)


def test_git_state_of_a_fresh_repo(tmp_path):
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git is not installed")
    run = {"cwd": tmp_path, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)
    (tmp_path / "f.txt").write_text("one\n")
    subprocess.run(["git", "add", "f.txt"], **run)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"], **run)
    head = subprocess.run(["git", "rev-parse", "HEAD"], text=True, **run).stdout.strip()
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "f.txt").write_text("two\n")
    assert git_state(tmp_path) == (head, True)


def test_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) == (None, None)


def test_with_provenance_keeps_an_existing_record():
    assert with_provenance({"x": 1, "provenance": {"command": "kept"}})["provenance"] == {"command": "kept"}
    assert with_provenance({"x": 1}, command="c")["provenance"]["command"] == "c"


def test_processor_kind_is_the_shipped_curves_folder_name():
    from hf_dspark.profiling.target_steps import shipped_curves_dir
    from hf_dspark.provenance import processor_kind

    assert processor_kind() == shipped_curves_dir().name and "/" not in processor_kind()
