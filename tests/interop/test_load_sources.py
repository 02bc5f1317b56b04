"""Loading refuses, up front and naming the input: missing local folders, unreachable or uncached Hub names, truncated
safetensors files, NaN/Inf weights, native configs that lack a field a default would silently replace, unknown
activations."""

import json

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import load_file, save_file

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.interop.sources import looks_like_repo_id, resolve_model_source
from tests.helpers import make_drafter, make_target
from tests.interop.reference import deepspec_folder


@pytest.fixture(scope="module")
def qwen3_target():
    return make_target("qwen3")


@pytest.fixture
def native_folder(tmp_path, qwen3_target):
    folder = tmp_path / "native"
    make_drafter(qwen3_target).save_pretrained(folder)
    return folder


def test_a_missing_local_folder_says_so(tmp_path):
    for path in (tmp_path / "runs" / "missing", "./missing-drafter", "runs/x/checkpoint-5"):
        with pytest.raises(FileNotFoundError, match=r"drafter folder .*missing|checkpoint-5.* does not exist"):
            DSparkDrafter.from_pretrained(path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file"):
        DSparkDrafter.from_pretrained(tmp_path / "file.txt")


def test_repo_id_shapes():
    assert looks_like_repo_id("gpt2") and looks_like_repo_id("org/model-1.5B")
    assert not any(map(looks_like_repo_id, ["a/b/c", "./x", "/abs/x", "../x", "x/", "-x", "a..b"]))


def test_an_uncached_name_fails_fast_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"'nodrafter-here' is not a local folder .*HF_HUB_OFFLINE is set"):
        DSparkDrafter.from_pretrained("nodrafter-here")


def test_an_unreachable_hub_fails_fast_without_retries(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")  # RFC 2606: never resolves
    with pytest.raises(OSError, match=r"'org/nodrafter' is not a local folder .*Hub is unreachable"):
        resolve_model_source("org/nodrafter", what="drafter")


@pytest.mark.parametrize("layout", ["native", "deepspec"])
def test_a_truncated_weight_file_is_named(tmp_path, qwen3_target, native_folder, layout):
    folder = native_folder if layout == "native" else deepspec_folder(tmp_path / "ds", qwen3_target)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(ValueError, match=rf"{weights}.*not a readable safetensors file.*truncated"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)


@pytest.mark.parametrize("layout", ["native", "deepspec"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_with_the_tensor_name(tmp_path, qwen3_target, native_folder, layout, bad):
    folder = native_folder if layout == "native" else deepspec_folder(tmp_path / "ds", qwen3_target)
    tensors = load_file(folder / "model.safetensors")
    tensors["fc.weight"][0, 0] = bad
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"tensor fc\.weight holds 1 NaN/Inf value"):
        DSparkDrafter.from_pretrained(folder, target=qwen3_target)


@pytest.mark.parametrize("field", ["block_size", "target_layer_ids", "hidden_act"])
def test_a_native_config_without_a_shape_neutral_field_is_refused(native_folder, qwen3_target, field):
    raw = json.loads((native_folder / "config.json").read_text())
    del raw[field]
    (native_folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"config\.json lacks the field\(s\) \['{field}'\]"):
        DSparkDrafter.from_pretrained(native_folder, target=qwen3_target)


def test_a_saved_default_config_records_every_required_field(tmp_path):
    DSparkConfig().save_pretrained(tmp_path)  # γ = 7 is the default: it must still be written
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["block_size"] == 7 and raw["head_type"] == "markov" and "target_layer_ids" in raw


def test_unknown_activation_is_a_config_error(native_folder, qwen3_target):
    with pytest.raises(ValueError, match="hidden_act 'bogus' is not a transformers activation"):
        DSparkConfig(hidden_act="bogus")
    raw = json.loads((native_folder / "config.json").read_text())
    (native_folder / "config.json").write_text(json.dumps({**raw, "hidden_act": "bogus"}))
    with pytest.raises(ValueError, match=r"native/config\.json: hidden_act 'bogus'"):
        DSparkDrafter.from_pretrained(native_folder, target=qwen3_target)
    engine = deepspec_folder(native_folder.parent / "ds", qwen3_target)
    raw = json.loads((engine / "config.json").read_text())
    (engine / "config.json").write_text(json.dumps({**raw, "hidden_act": "bogus"}))
    with pytest.raises(ValueError, match=r"ds/config\.json: hidden_act 'bogus'"):
        DSparkDrafter.from_pretrained(engine, target=qwen3_target)


def test_a_healthy_native_folder_still_loads(native_folder, qwen3_target):
    drafter = DSparkDrafter.from_pretrained(native_folder, target=qwen3_target)
    assert drafter.config.block_size == 4 and all(torch.isfinite(p).all() for p in drafter.parameters())


def test_cli_target_loader_names_a_missing_folder(tmp_path):
    from hf_dspark.cli.loaders import load_target

    with pytest.raises(FileNotFoundError, match=r"target folder .*no-target does not exist"):
        load_target(str(tmp_path / "models" / "no-target"))
