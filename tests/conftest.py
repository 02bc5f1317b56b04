"""Shared fixtures (see tests/helpers.py for the tiny models)."""

import pytest
import torch

from tests.helpers import make_target

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _private_curve_cache(tmp_path_factory):
    """Curves profiled during tests go to a temporary cache, never to the user's ~/.cache/hf_dspark."""
    patch = pytest.MonkeyPatch()
    patch.setenv("HF_DSPARK_CACHE", str(tmp_path_factory.mktemp("hf_dspark_cache")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _verify_every_draft_by_default(monkeypatch):
    """Tests of the loop's mechanics verify every draft (ℓ = γ) unless they choose a policy: the library default,
    "auto", would decode the tiny random drafters' rounds plainly and leave verification untested. The default
    itself is tested in tests/generation/test_auto_policy.py."""
    monkeypatch.setattr("hf_dspark.generation.policy.DEFAULT_POLICY", "fixed")


@pytest.fixture(scope="session")
def llama_target():
    return make_target("llama")


@pytest.fixture(scope="session")
def qwen3_target():
    return make_target("qwen3")
