"""2-process data-parallel training under `accelerate launch` (gloo on CPU): both ranks end identical."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from tiny_helpers import tokenized_records, write_jsonl

WORKER = Path(__file__).with_name("accelerate_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_cpu_processes_agree(tmp_path, tiny_target_dir):
    data = write_jsonl(tmp_path / "data.jsonl", tokenized_records(16))
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()), str(WORKER), str(tiny_target_dir), str(data), str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(WORKER.parent)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with safe_open(str(out / "rank0.safetensors"), "pt") as handle:
        assert handle.metadata()["world_size"] == "2"
    rank0, rank1 = load_file(out / "rank0.safetensors"), load_file(out / "rank1.safetensors")
    assert rank0.keys() == rank1.keys() and "fc.weight" in rank0
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    saved = load_file(out / "model.safetensors")  # written once, by the main process
    assert all(torch.equal(saved[name], rank0[name]) for name in saved)
