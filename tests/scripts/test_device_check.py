"""`scripts/device_check.py` on CPU with the tiny shape: the dry run of the GPU A/B (Llama-3.2-1B / 3.1-8B shapes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.py"
TINY_RUN = [
    "--tiny",
    "--new-tokens",
    "12",
    "--batches",
    "1",
    "2",
    "--repeats",
    "1",
    "--gamma",
    "4",
    "--equality-batches",
    "1",
    "3",
]


def _load_script():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_device_check_dry_run_on_cpu(tmp_path, capsys):
    device_check = _load_script()
    out = tmp_path / "report.json"
    assert device_check.main([*TINY_RUN, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and report["environment"]["device"] == "cpu" and report["skipped"] == []
    equality = report["equality"]
    assert {(r["batch"], r["drafter"]) for r in equality} == {
        (1, "oracle"),
        (1, "untrained"),
        (3, "oracle"),
        (3, "untrained"),
    }
    assert all(r["identical"] and r["dtype"] == "float32" for r in equality)
    assert all(r["drafts_verified"] > 0 for r in equality)  # the drafters ran (fixed policy), not plain decoding
    assert all(r["tau"] > 3 for r in equality if r["drafter"] == "oracle")  # every oracle draft is accepted
    assert report["step_curves"]["tiny"]["device"] == "cpu"
    rows = {(r["batch"], r["method"]): r for r in report["ab"]}
    methods = device_check.METHODS
    expected = {(b, m) for b in (1, 2) for m in methods if b == 1 or m not in ("stock-oracle", "stock-noisy")}
    assert set(rows) == expected
    for key, row in rows.items():
        if "refused" in row:  # hf-dspark may decline a static cache / compiling, with the reason
            assert key[1] == "oracle-fixed-static-compile" and "static" in row["refused"]
            continue
        assert "error" not in row, row
        assert row["identical_to_plain"], row  # fp32 greedy: every method reproduces plain generate
        assert row["tokens_per_second"] > 0 and row["ms_per_round"] > 0 and row["syncs_per_round"] > 0
        assert row["gpu_busy_fraction"] is None  # the profiler's GPU share exists on CUDA only
        if not key[1].startswith("plain"):
            assert row["verify_ms_per_round"] > 0 and row["draft_ms_per_round"] >= 0
    assert rows[(1, "plain")]["tokens_per_round"] == 1.0
    assert rows[(1, "oracle-fixed")]["tokens_per_round"] == pytest.approx(11 / 3)  # 1 from prefill, then 5, 5, 1
    assert rows[(1, "stock-oracle")]["tokens_per_round"] == pytest.approx(12 / 3)  # 5, 5, 2 (from the prefill)
    assert 1.0 < rows[(2, "noisy-fixed")]["tokens_per_round"] < rows[(2, "oracle-fixed")]["tokens_per_round"]
    printed = capsys.readouterr().out
    assert "| tiny | 1 | stock-noisy |" in printed and "PASSED" in printed


def test_time_guard_lists_what_it_skipped(capsys):
    device_check = _load_script()
    assert device_check.main([*TINY_RUN, "--time-limit", "0"]) == 0
    assert "skipped (time limit): tiny (every check)" in capsys.readouterr().out


def test_noisy_oracle_acceptance_is_geometric():
    ab = _load_script().ab
    p = ab.acceptance_for(3.5, 8)
    assert 1 + sum(p**k for k in range(1, 9)) == pytest.approx(3.5, abs=1e-6)
    noise = ab.Noise(p, vocab=50, seed=3)
    drafts = torch.zeros(20000, 8, dtype=torch.long)
    wrong = noise(drafts) != drafts
    assert int(wrong.sum(dim=1).max()) <= 1  # one corrupted position at most: the first wrong draft
    accepted = torch.where(wrong.any(dim=1), wrong.int().argmax(dim=1), torch.full((20000,), 8))
    assert float(accepted.float().mean()) + 1 == pytest.approx(3.5, abs=0.05)
    noise.reset()
    assert not torch.equal(noise(drafts), noise(drafts))  # a fresh draw per round...
    noise.reset()
    first = noise(drafts)
    noise.reset()
    assert torch.equal(first, noise(drafts))  # ...and the same rounds after a reset


@pytest.mark.parametrize("argv", [["--tau", "9", "--gamma", "4"], ["--repeats", "0"], ["--batches", "0"]])
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit) as error:
        _load_script().parse_args(argv)
    assert error.value.code == 2


def test_divergence_reports_the_plain_margin():
    """A differing token is located and priced by the plain run's logits (the tie diagnosis on GPUs)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    device_check = _load_script()
    sequences = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 9]])
    logits = (torch.zeros(2, 10), torch.zeros(2, 10))
    logits[1][1, 9], logits[1][1, 4] = 2.0, 1.5
    reference = GenerateDecoderOnlyOutput(sequences=sequences, logits=logits)
    assert device_check.first_divergence(reference, sequences.clone(), prompt_width=2) is None
    output = sequences.clone()
    output[1, 3] = 4
    found = device_check.first_divergence(reference, output, prompt_width=2)
    assert found == {"row": 1, "step": 1, "plain_token": 9, "dspark_token": 4, "margin": 0.5}


def test_busy_time_is_the_union_of_device_events():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    ab = _load_script().ab

    def event(start, end, device=DeviceType.CUDA):
        return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), device_type=device)

    events = [event(0, 10), event(5, 12), event(20, 25), event(0, 100, DeviceType.CPU), event(21, 22)]
    assert ab.busy_microseconds(events) == 17  # [0, 12] and [20, 25]; host events do not count
