"""Fixtures for the training tests; the builders live in tiny_helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_helpers import make_byte_tokenizer, make_tiny_drafter, make_tiny_target

torch.set_num_threads(1)


@pytest.fixture
def tiny_target():
    return make_tiny_target()


@pytest.fixture
def tiny_drafter(tiny_target):
    return make_tiny_drafter(tiny_target)


@pytest.fixture
def tiny_target_dir(tmp_path, tiny_target) -> Path:
    folder = tmp_path / "tiny_target"
    tiny_target.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def byte_tokenizer():
    return make_byte_tokenizer()
