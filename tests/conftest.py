"""Shared fixtures (see tests/helpers.py for the tiny models)."""

import pytest
import torch

from tests.helpers import make_target

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def llama_target():
    return make_target("llama")


@pytest.fixture(scope="session")
def qwen3_target():
    return make_target("qwen3")
