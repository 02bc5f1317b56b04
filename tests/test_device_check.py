"""`scripts/device_check.py` on CPU with the tiny shape (the run a GPU machine does at Llama-3.2-1B shape)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_check_runs_on_cpu_tiny(tmp_path, capsys):
    device_check = _load_script()
    out = tmp_path / "report.json"
    code = device_check.main(["--device", "cpu", "--shape", "tiny", "--new-tokens", "12", "--batches", "1", "3",
                              "--gammas", "4", "8", "--repeats", "1", "--batch-tokens", "1", "4",
                              "--cache-length", "16", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["passed"] and report["environment"]["device"] == "cpu"
    equality = report["equality"]
    assert {(r["batch"], r["drafter"]) for r in equality} == {(1, "oracle"), (1, "untrained"), (3, "oracle"),
                                                              (3, "untrained")}
    assert all(r["identical"] and r["dtype"] == "float32" for r in equality)
    assert all(r["drafts_verified"] > 0 for r in equality)  # the drafters ran (fixed policy), not plain decoding
    assert all(r["tau"] > 4 for r in equality if r["drafter"] == "oracle")  # every oracle draft is accepted
    assert {(r["batch"], r["gamma"]) for r in report["speed"]} == {(1, 4), (1, 8), (3, 4), (3, 8)}
    assert report["step_curve"]["batch_tokens"] == [1, 4] and report["step_curve"]["device"] == "cpu"
    assert "PASSED" in capsys.readouterr().out


def test_divergence_reports_the_plain_margin():
    """A differing token is located and priced by the plain run's logits (the tie diagnosis on GPUs)."""
    import torch
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
