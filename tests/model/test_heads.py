"""The head table: every head type is one registered `HeadSpec`, read by modeling, configuration, interop and
training; a head registered from outside the package is built, exported and read back without other edits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_dspark import DSparkConfig
from hf_dspark.interop.contracts import get_contract, refusals
from hf_dspark.interop.deepspec import _head_fields
from hf_dspark.interop.hub import _architecture
from hf_dspark.interop.speculators import _head as speculators_head
from hf_dspark.interop.writers import dspark_config, speculators_config
from hf_dspark.model import heads
from hf_dspark.model.heads import (
    HEAD_MODULE,
    MARKOV_PARAMETERS,
    HeadSpec,
    MarkovHead,
    available_heads,
    get_head,
    head_from_export,
    register_head,
)
from hf_dspark.training.train import DSparkTrainConfig
from tests.helpers import make_drafter, make_target


class ScaledMarkovHead(MarkovHead):
    """Eq. (5) with a learnt per-rank scale: B = W2ᵀ (s ⊙ W1[x_{k-1}])."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.scale = torch.nn.Parameter(torch.ones(config.markov_rank))

    def embed_previous(self, prev_tokens):
        return self.markov_w1(prev_tokens) * self.scale


SCALED = HeadSpec("scaled", ScaledMarkovHead, "scaled Markov", "scaled Markov head (rank {rank})", True,
                  {**MARKOV_PARAMETERS, "scale": lambda v, vd, r, d: (r,)}, "scaled")


@pytest.fixture
def head_table():
    saved = dict(heads._HEADS)
    yield
    heads._HEADS.clear()
    heads._HEADS.update(saved)


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=3)


def test_the_builtin_heads_and_a_clear_error_for_an_unknown_one(target):
    assert available_heads() == ("markov", "rnn", "none")
    assert get_head("markov").export_name == "vanilla" and get_head("none").module is None
    known = r"choose one of \['markov', 'rnn', 'none'\]"
    with pytest.raises(ValueError, match=rf"unknown sequential head_type 'gru'; {known}"):
        DSparkConfig.from_target(target.config, head_type="gru")
    with pytest.raises(ValueError, match="unknown sequential head_type 'gru'"):
        DSparkTrainConfig(data=["train.jsonl"], head_type="gru")
    with pytest.raises(ValueError, match=r"markov_head_type='gated'; hf-dspark implements \['rnn', 'vanilla'\]"):
        head_from_export("gated", 64, "config.json")


@pytest.mark.parametrize("name", ["markov", "rnn", "none"])
def test_declared_parameters_are_the_modules_tensors(target, name):
    drafter = make_drafter(target, head_type=name, draft_vocab_size=None)
    config = drafter.config
    tensors = {key: tuple(value.shape) for key, value in drafter.state_dict().items()
               if key.startswith(HEAD_MODULE + ".")}
    expected = get_head(name).parameter_shapes(config.vocab_size, config.num_draft_tokens, config.markov_rank,
                                               config.hidden_size)
    assert tensors == expected
    assert config.confidence_with_markov == get_head(name).conditions_on_previous


def test_a_head_registered_outside_the_package_is_built_exported_and_read_back(target, head_table, tmp_path):
    with pytest.raises(ValueError, match="unknown sequential head_type 'scaled'"):
        DSparkConfig.from_target(target.config, head_type="scaled")
    register_head(SCALED)
    with pytest.raises(ValueError, match="already registered"):
        register_head(HeadSpec("scaled", None, "x", "x", False, {}, None))
    drafter = make_drafter(target, head_type="scaled")
    assert isinstance(drafter.markov_head, ScaledMarkovHead)
    proposal = drafter.propose(torch.tensor([1, 2]), drafter.init_cache(2))
    assert proposal.draft_ids.shape == (2, drafter.config.block_size)

    config = drafter.config
    raw = dspark_config(config, get_contract("deepspec"), torch.float32)
    assert raw["markov_head_type"] == "scaled" and raw["markov_rank"] == config.markov_rank
    assert _head_fields(raw, Path("config.json")) == {"head_type": "scaled", "markov_rank": config.markov_rank}
    raw = speculators_config(config, torch.float32, "TARGET", ["LlamaForCausalLM"])
    assert speculators_head(raw, Path("config.json"))["head_type"] == "scaled"
    assert "scaled Markov head (rank 8)" in _architecture(config)
    refused = refusals(config, "vllm")
    assert any("the scaled Markov head is not implemented there" in refusal.reason for refusal in refused)


def test_the_none_head_is_written_as_rank_zero_and_read_back(target):
    config = make_drafter(target, head_type="none").config
    raw = dspark_config(config, get_contract("deepspec"), torch.float32)
    assert raw["markov_rank"] == 0 and "markov_head_type" not in raw
    assert _head_fields(raw, Path("config.json"))["head_type"] == "none"
    assert "no sequential head" in _architecture(config)
