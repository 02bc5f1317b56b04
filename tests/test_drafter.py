"""`hf_dspark.DSparkDrafter` is the network (`DSparkModel`) plus what needs the layers above it: other layouts, the
Hub shim on save, `generate` routing, the last call's statistics; the statistics also travel on the output."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModel

from hf_dspark import DSparkConfig, DSparkDrafter, DSparkGenerateOutput, DSparkModel, load_default_drafter
from hf_dspark.defaults import default_drafter_dir
from hf_dspark.generation import prompt_lookup_for
from hf_dspark.generation.dispatch import is_enabled
from hf_dspark.interop.hub import REMOTE_CODE_FILE
from hf_dspark.proposers import hybrid_for
from hf_dspark.proposers.base import DraftModel
from tests.helpers import make_drafter, make_target, ragged_prompts

NEW = 8


def _config(target) -> DSparkConfig:
    return DSparkConfig.from_target(target.config, block_size=3, markov_rank=8, target_layer_ids=[0, 2])


def test_the_network_binds_without_routing_generate():
    target = make_target("llama", seed=41)
    network = DSparkModel(_config(target)).bind_target(target)
    assert network.is_bound and not is_enabled(target) and not isinstance(network, DraftModel)
    drafter = DSparkDrafter(network.config).bind_target(target)
    assert is_enabled(target) and isinstance(drafter, DSparkModel) and isinstance(drafter, DraftModel)
    assert drafter.last_generation_stats is None


def test_saved_drafters_name_the_public_class_and_import_only_the_public_api(tmp_path):
    target = make_target("llama", seed=41)
    drafter = DSparkDrafter(_config(target))
    drafter.save_pretrained(tmp_path / "drafter")
    raw = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert raw["architectures"] == ["DSparkDrafter"]
    assert raw["auto_map"]["AutoModel"] == "hf_dspark_auto.DSparkDrafter"
    shim = (tmp_path / "drafter" / REMOTE_CODE_FILE).read_text()
    assert "from hf_dspark import DSparkDrafter as _DSparkDrafter" in shim and "hf_dspark.model" not in shim
    DSparkModel(drafter.config).save_pretrained(tmp_path / "network")
    assert not (tmp_path / "network" / REMOTE_CODE_FILE).exists()  # the network writes no remote code

    auto = AutoModel.from_pretrained(tmp_path / "drafter")
    assert type(auto) is DSparkDrafter
    network = DSparkModel.from_pretrained(tmp_path / "drafter", target=target)
    assert type(network) is DSparkModel and network.is_bound and not is_enabled(target)
    assert torch.equal(network.fc.weight, drafter.fc.weight)


@pytest.mark.parametrize("variant", ["dspark", "dflash"])
def test_the_shipped_shims_import_the_public_api(variant):
    shim = (default_drafter_dir(variant) / REMOTE_CODE_FILE).read_text()
    assert "from hf_dspark import DSparkConfig as _DSparkConfig" in shim and "hf_dspark.model" not in shim


def test_a_missing_default_drafter_names_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_default_drafter(make_target("llama", seed=41), path=tmp_path)


def test_the_output_carries_the_calls_stats():
    target = make_target("llama", seed=42)
    drafter = make_drafter(target, block_size=3)
    ids, mask = ragged_prompts(3, seed=4)
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True)
    plain = target.generate(ids, **kwargs)
    out = target.generate(ids, assistant_model=drafter, **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    assert isinstance(out, DSparkGenerateOutput) and out.dspark_stats is drafter.last_generation_stats
    assert out.dspark_stats.rounds > 0 and out.dspark_stats.batch_size == 3
    assert set(out.keys()) == set(plain.keys()) and len(out.to_tuple()) == len(plain.to_tuple())  # not a field
    again = target.generate(ids, assistant_model=drafter, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(again, plain.sequences) and drafter.last_generation_stats is not out.dspark_stats


def test_every_kind_of_drafter_keeps_its_own_last_stats():
    target = make_target("llama", seed=43)
    drafter = make_drafter(target, block_size=3)
    lookup = prompt_lookup_for(target, block_size=3)
    hybrid = hybrid_for(make_drafter(target, block_size=3))
    ids, mask = ragged_prompts(2, seed=5)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    kinds = (drafter, lookup, hybrid)
    for kind in kinds:
        assert kind.last_generation_stats is None
        out = target.generate(ids, assistant_model=kind, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
        assert torch.equal(out, plain)
    stats = [kind.last_generation_stats for kind in kinds]
    assert all(s is not None and s.rounds > 0 for s in stats) and len({id(s) for s in stats}) == len(stats)


def test_a_drafter_that_implements_nothing_says_what_is_missing():
    class Empty(DraftModel):
        pass

    empty = Empty()
    assert empty.row_draft_costs(None, []) is None and empty.row_acceptance(None) is None
    with pytest.raises(NotImplementedError, match="Empty must implement propose"):
        empty.propose(torch.zeros(1, dtype=torch.long), None)
