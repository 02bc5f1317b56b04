"""Errors name the file and the mismatch: unknown layouts, missing or mis-shaped tensors, checkpoints that do not fit
the bound target, unsupported variants, and pickle weights (never loaded)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_dspark import DSparkDrafter
from hf_dspark.interop import detect_layout
from tests.helpers import make_drafter, make_target
from tests.interop.reference import deepspec_folder, dflash_folder


@pytest.fixture(scope="module")
def qwen3_target():
    return make_target("qwen3")


def _edit_config(folder, **changes):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


def _edit_tensors(folder, drop=(), **replace):
    tensors = load_file(folder / "model.safetensors")
    for name in drop:
        del tensors[name]
    tensors.update(replace)
    save_file(tensors, folder / "model.safetensors")


def test_unknown_layout_and_missing_config_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match=r"config\.json describes model_type='llama'.*not a known drafter layout"):
        DSparkDrafter.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"empty/config\.json does not exist"):
        detect_layout(tmp_path / "empty")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        detect_layout(tmp_path)


@pytest.mark.parametrize("layout", ["dflash", "deepspec", "native"])
def test_pickle_weights_are_refused(tmp_path, qwen3_target, layout):
    if layout == "native":
        folder = tmp_path / "native"
        make_drafter(qwen3_target).save_pretrained(folder)
    else:
        folder = (dflash_folder if layout == "dflash" else deepspec_folder)(tmp_path / layout, qwen3_target)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(ValueError, match=r"holds only pickle weights \['pytorch_model.bin'\].*will not unpickle"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)


def test_missing_weight_files_and_shards_are_named(tmp_path, qwen3_target):
    folder = dflash_folder(tmp_path / "d", qwen3_target)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"has no weight file: expected model\.safetensors"):
        DSparkDrafter.from_pretrained(folder)
    index = {"weight_map": {"fc.weight": "part-1.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"index\.json lists shard\(s\) \['part-1.safetensors'\] that are missing"):
        DSparkDrafter.from_pretrained(folder)


@pytest.mark.parametrize("layout", ["dflash", "deepspec"])
def test_missing_and_misshapen_tensors_name_the_file(tmp_path, qwen3_target, layout):
    make = dflash_folder if layout == "dflash" else deepspec_folder
    folder = make(tmp_path / "a", qwen3_target)
    _edit_tensors(folder, drop=["layers.1.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match=r"missing tensors \[layers\.1\.mlp\.up_proj\.weight\].*model\.safetensors"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    folder = make(tmp_path / "b", qwen3_target)
    _edit_tensors(folder, **{"fc.weight": torch.zeros(64, 3 * 64)})
    with pytest.raises(ValueError, match=r"fc\.weight in .*model\.safetensors has shape \[64, 192\], config\.json "
                                         r"implies \[64, 128\]"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    folder = make(tmp_path / "c", qwen3_target)
    _edit_tensors(folder, **{"candidate_selector.hidden_projection.weight": torch.zeros(4, 64)})
    with pytest.raises(ValueError, match=r"tensors this drafter does not have \[candidate_selector"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)


def test_native_folder_with_a_missing_tensor_fails_instead_of_random_init(tmp_path, qwen3_target):
    make_drafter(qwen3_target).save_pretrained(tmp_path)
    _edit_tensors(tmp_path, drop=["norm.weight"])
    with pytest.raises(ValueError, match=r"missing tensors \[norm\.weight\]"):
        DSparkDrafter.from_pretrained(tmp_path, target=qwen3_target)


def test_checkpoints_that_do_not_fit_the_bound_target(tmp_path, qwen3_target):
    small_vocab = make_target("qwen3", vocab_size=80)
    folder = dflash_folder(tmp_path / "d", qwen3_target, mask_token_id=50)
    with pytest.raises(ValueError, match=r"d/config\.json: This drafter does not fit the target \(vocabulary"):
        DSparkDrafter.from_pretrained(folder, target=small_vocab)
    deeper = make_target("qwen3", num_hidden_layers=6)
    with pytest.raises(ValueError, match=r"config\.json: .*depth: the drafter taps a 5-layer target, this one has 6"):
        DSparkDrafter.from_pretrained(folder, target=deeper)
    folder = deepspec_folder(tmp_path / "s", qwen3_target, mask_token_id=50)
    _edit_tensors(folder, **{"embed_tokens.weight": torch.zeros(96, 32)})
    with pytest.raises(ValueError, match=r"embed_tokens\.weight in .*s has shape \[96, 32\] but the bound target's"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)


def test_different_embedding_values_only_warn(tmp_path, qwen3_target, caplog):
    folder = deepspec_folder(tmp_path / "s", qwen3_target)
    _edit_tensors(folder, **{"lm_head.weight": torch.zeros(96, 64)})
    drafter = DSparkDrafter.from_pretrained(folder, target=qwen3_target)
    assert drafter.is_bound and "lm_head.weight in" in caplog.text and "differs from the bound target" in caplog.text


def test_unsupported_variants_are_refused_with_the_reason(tmp_path, qwen3_target):
    folder = dflash_folder(tmp_path / "a", qwen3_target)
    _edit_config(folder, architectures=["DFlash2DraftModel"])
    with pytest.raises(ValueError, match=r"DFlash2DraftModel.*grouped dynamic convolutions"):
        DSparkDrafter.from_pretrained(folder)
    folder = dflash_folder(tmp_path / "b", qwen3_target)
    _edit_config(folder, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match=r"b/config\.json declares draft layers of type \['sliding_attention'\]"):
        DSparkDrafter.from_pretrained(folder)
    folder = dflash_folder(tmp_path / "c", qwen3_target)
    _edit_config(folder, dflash_config={"target_layer_ids": [0, 2]})
    with pytest.raises(ValueError, match=r"lacks dflash_config\.target_layer_ids or dflash_config\.mask_token_id"):
        DSparkDrafter.from_pretrained(folder)
    folder = deepspec_folder(tmp_path / "d", qwen3_target)
    _edit_config(folder, markov_head_type="gated")
    with pytest.raises(ValueError, match=r"markov_head_type='gated'; hf-dspark implements \['rnn', 'vanilla'\]"):
        DSparkDrafter.from_pretrained(folder)
