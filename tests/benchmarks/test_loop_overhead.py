"""`benchmarks/loop_overhead.py` with tiny settings: the report's fields, the round accounting, bad options."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from hf_dspark.provenance import PROVENANCE_KEYS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "loop_overhead.py"


def _load():
    spec = importlib.util.spec_from_file_location("loop_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_the_report(tmp_path, capsys):
    bench = _load()
    out = tmp_path / "loop_overhead.json"
    assert (
        bench.main(["--batches", "1", "2", "--new-tokens", "12", "--gamma", "2", "--repeats", "1", "--out", str(out)])
        == 0
    )
    report = json.loads(out.read_text())
    assert set(PROVENANCE_KEYS) <= set(report["provenance"])
    provenance = report["provenance"]
    assert provenance["command"].startswith("python benchmarks/loop_overhead.py --batches 1 2")
    assert provenance["threads"] == 1 and isinstance(provenance["dirty"], bool) and provenance["versions"]["torch"]
    assert report["threads"] == 1 and report["code"]["root"] == "."
    cases = {r["key"]: r for r in report["cases"]}
    assert set(cases) == {"plain@1", "plain@2", "fixed@1", "fixed@2", "auto@1", "auto@2", "auto-nodraft@1", "stock@1"}
    for row in cases.values():
        assert row["error"] is None and row["identical_to_plain"], row
        assert row["rounds"] >= 1 and row["overhead_ms"] > 0 and row["forward_ms"] > 0
    assert cases["plain@1"]["drafter_ms"] == 0 and cases["fixed@1"]["drafter_ms"] > 0
    assert cases["plain@1"]["forwards"] == 12  # one forward per token
    assert cases["fixed@1"]["forwards"] < 12  # the oracle's drafts are accepted
    labels = {r["ratio"] for r in report["ratios"]}
    assert {
        "fixed / stock (batch 1)",
        "auto no-draft round / plain step (batch 1)",
        "auto / plain step (batch 2)",
    } <= labels
    printed = capsys.readouterr().out
    assert "| stock | 1 |" in printed and str(out) in printed
    again = tmp_path / "again.json"
    assert (
        bench.main(
            [
                "--batches",
                "1",
                "--new-tokens",
                "12",
                "--gamma",
                "2",
                "--repeats",
                "1",
                "--out",
                str(again),
                "--before",
                str(out),
            ]
        )
        == 0
    )
    assert "| case | batch | before ms | after ms | after / before |" in capsys.readouterr().out


def test_rounds_subtract_forwards_and_drafter_calls():
    bench = _load()
    timeline = bench.Timeline()
    # prefill 0-10, then forwards at 12-13 (3 tokens), 16-17 (1 token), 20-21 (3 tokens); a draft call 18-19
    timeline.forwards = [(0.0, 10.0, 24), (12.0, 13.0, 3), (16.0, 17.0, 1), (20.0, 21.0, 3)]
    timeline.drafts = [(18.0, 19.0)]
    every = timeline.rounds(only_plain=False)
    assert every["rounds"] == 2 and every["overhead_s"] == pytest.approx((3.0 + 2.0) / 2)
    assert every["drafter_s"] == pytest.approx(0.5) and every["forward_s"] == pytest.approx(1.0)
    plain = timeline.rounds(only_plain=True)
    assert plain["rounds"] == 1 and plain["overhead_s"] == pytest.approx(3.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--repeats", "0"],
        ["--layers", "2"],
        ["--batches", "0"],
        ["--new-tokens", "4", "--gamma", "4"],
        ["--code-root", "/nonexistent"],
        ["--before", "/nonexistent.json"],
    ],
)
def test_bad_options_are_refused(argv, capsys):
    bench = _load()
    with pytest.raises(SystemExit) as error:
        bench.parse_args(argv)
    assert error.value.code == 2
    message = capsys.readouterr().err
    assert "must" in message or "no such file" in message or "no src/hf_dspark" in message


def test_worker_argv_drops_the_parent_options():
    bench = _load()
    argv = ["--code-root", "/old", "--repeats", "3", "--out=/tmp/x.json", "--before", "b.json", "--batches", "1"]
    assert bench._without_option(argv, ("--code-root", "--out", "--before")) == ["--repeats", "3", "--batches", "1"]


def test_another_checkout_is_timed_in_a_worker(tmp_path):
    """--code-root: a child process imports hf_dspark from that checkout's src/ (here: a link to this one's)."""
    bench = _load()
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "src").symlink_to(SCRIPT.parents[1] / "src")
    out = tmp_path / "before.json"
    argv = ["--batches", "1", "--new-tokens", "12", "--gamma", "2", "--repeats", "1", "--code-root", str(root)]
    assert bench.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["code"]["root"] == os.path.relpath(root.resolve(), SCRIPT.parents[1])
    assert report["code"]["git_commit"] is None
    assert not [word for word in report["provenance"]["command"].split() if word.startswith("/")]  # all relative
    assert {r["key"] for r in report["cases"] if r["error"] is None} == {
        "plain@1",
        "fixed@1",
        "auto@1",
        "auto-nodraft@1",
        "stock@1",
    }
