"""Export to the DeepSpec / serving-engine layout: files, fields, sidecars, warnings, CLI, and export -> load
round trips that propose identically."""

import json
import logging
import os

import pytest
import torch
from safetensors import safe_open

from hf_dspark import DSparkDrafter
from hf_dspark.cli import main as cli_main
from hf_dspark.interop import detect_layout, engine_warnings, export_deepspec
from hf_dspark.scheduler import StepCurve
from tests.helpers import make_drafter, make_target, tapped_features
from tests.interop.reference import dflash_folder


@pytest.fixture(scope="module")
def llama_target():
    return make_target("llama")


def _proposals(drafter, target, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = [9, 4, 6]
    ids = torch.randint(3, 90, (3, 9), generator=gen)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, 9 - n :] = 1
    feats = tapped_features(target, ids, drafter.config.target_layer_ids, attention_mask=mask)
    cache = drafter.init_cache(3)
    drafter.extend_context(cache, feats[:, :-1], mask[:, :-1].bool())
    greedy = drafter.propose(ids[:, -1], cache, return_probs=True)
    sampled = drafter.propose(ids[:, -1], cache, do_sample=True, generator=torch.Generator().manual_seed(seed))
    return greedy, sampled


def _assert_same(a, b):
    assert torch.equal(a.draft_ids, b.draft_ids)
    torch.testing.assert_close(a.draft_token_probs, b.draft_token_probs, rtol=0, atol=0)
    if a.draft_probs is not None:
        torch.testing.assert_close(a.draft_probs, b.draft_probs, rtol=0, atol=0)
    assert (a.confidence is None) == (b.confidence is None)
    if a.confidence is not None:
        torch.testing.assert_close(a.confidence, b.confidence, rtol=0, atol=0)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(head_type="markov", mask_token_id=95),
        dict(head_type="rnn", mask_token_id=95, confidence_with_markov=False),
        dict(head_type="none", mask_token_id=95, use_confidence_head=False),
        dict(head_type="markov", mask_token_id=None),
    ],
    ids=["markov", "rnn", "none", "learned-mask"],
)
def test_export_then_load_proposes_identically(tmp_path, llama_target, overrides):
    acceptance = {"greedy": [0.6, 0.5, 0.4, 0.3], "sampling": [0.3, 0.2, 0.2, 0.1]}
    drafter = make_drafter(llama_target, calibration_temperatures=[1.0, 2.0, 3.0, 4.0],
                           calibration_temperatures_greedy=[0.5] * 4, heldout_acceptance=acceptance, **overrides)
    out = export_deepspec(drafter, tmp_path / "engine")
    assert detect_layout(out) == "deepspec"
    loaded = DSparkDrafter.from_pretrained(out, target=llama_target)
    assert loaded.config.head_type == drafter.config.head_type
    assert loaded.config.calibration_temperatures == [1.0, 2.0, 3.0, 4.0]
    assert loaded.config.calibration_temperatures_greedy == [0.5] * 4
    assert loaded.config.heldout_acceptance == acceptance  # the "auto" policy's prior travels in calibration.json
    for original, reloaded in zip(_proposals(drafter, llama_target), _proposals(loaded, llama_target)):
        _assert_same(original, reloaded)


def test_export_with_a_draft_vocabulary_round_trips(tmp_path, llama_target):
    """The engine layout carries draft_vocab_size, d2t [V_draft], t2d [V] and markov_w2 [V_draft, r]."""
    drafter = make_drafter(llama_target, head_type="markov", mask_token_id=95)
    drafter.restrict_draft_vocab(list(range(0, llama_target.config.vocab_size, 3)))
    out = export_deepspec(drafter, tmp_path / "engine")
    raw = json.loads((out / "config.json").read_text())
    size = drafter.config.draft_vocab_size
    assert raw["draft_vocab_size"] == size
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert handle.get_tensor("d2t").shape == (size,)
        assert handle.get_tensor("t2d").shape == (llama_target.config.vocab_size,)
        assert handle.get_tensor("markov_head.markov_w2.weight").shape == (size, drafter.config.markov_rank)
    loaded = DSparkDrafter.from_pretrained(out, target=llama_target)
    assert torch.equal(loaded.draft_token_ids(), drafter.draft_token_ids())
    for original, reloaded in zip(_proposals(drafter, llama_target), _proposals(loaded, llama_target)):
        _assert_same(original, reloaded)


def test_exported_files_and_fields(tmp_path, llama_target):
    drafter = make_drafter(llama_target, mask_token_id=95, calibration_temperatures=[1.0, 1.5, 2.0, 2.5])
    curve = StepCurve([1, 8, 64], [50.0, 45.0, 12.0], model="tiny", device="cpu")
    out = export_deepspec(drafter, tmp_path / "engine", step_curve=curve)
    assert {p.name for p in out.iterdir()} == {
        "config.json", "model.safetensors", "calibration.json", "step_curve.json", "README.md"
    }
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["LlamaDSparkModel"] and raw["model_type"] == "llama"
    assert raw["sample_from_anchor"] is True and raw["block_size"] == 4
    assert raw["target_layer_ids"] == [0, 2] and raw["num_target_layers"] == 5 and raw["mask_token_id"] == 95
    assert raw["markov_rank"] == 8 and raw["markov_head_type"] == "vanilla"
    assert raw["enable_confidence_head"] is True and raw["confidence_head_with_markov"] is True
    assert raw["hidden_size"] == 64 and raw["vocab_size"] == 96 and raw["num_hidden_layers"] == 2
    with safe_open(out / "model.safetensors", "pt") as handle:
        names = set(handle.keys())
        embed, lm_head = handle.get_tensor("embed_tokens.weight"), handle.get_tensor("lm_head.weight")
    assert not any(n.startswith("model.") for n in names)
    assert {"fc.weight", "markov_head.markov_w1.weight", "confidence_head.proj.bias"} <= names
    assert torch.equal(embed, llama_target.get_input_embeddings().weight)
    assert torch.equal(lm_head, llama_target.get_output_embeddings().weight)
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["sampling"] == [1.0, 1.5, 2.0, 2.5] and calibration["greedy"] == [1.0, 1.5, 2.0, 2.5]
    assert StepCurve.from_dict(json.loads((out / "step_curve.json").read_text())).batch_tokens == [1, 8, 64]
    readme = (out / "README.md").read_text()
    for needle in ('"method": "dspark"', '"num_speculative_tokens": 4', "--speculative-algorithm DSPARK",
                   "--speculative-dspark-block-size 4", "DSparkDecodingConfig(max_draft_len=4"):
        assert needle in readme


def test_step_curve_beside_the_drafter_folder_is_shipped(tmp_path, llama_target):
    drafter = make_drafter(llama_target, mask_token_id=95)
    drafter.save_pretrained(tmp_path / "native")
    StepCurve([1, 4], [10.0, 9.0]).save(tmp_path / "native" / "step_curve.json")
    loaded = DSparkDrafter.from_pretrained(tmp_path / "native", target=llama_target)
    out = export_deepspec(loaded, tmp_path / "engine")
    assert (out / "step_curve.json").is_file()
    assert not (export_deepspec(drafter, tmp_path / "engine2") / "step_curve.json").exists()


def test_unservable_settings_warn_in_log_and_readme(tmp_path, llama_target, caplog):
    drafter = make_drafter(llama_target, head_type="rnn", mask_token_id=None)
    with caplog.at_level(logging.WARNING):
        out = export_deepspec(drafter, tmp_path / "engine")
    readme = (out / "README.md").read_text()
    assert "RNN sequential head is not supported" in caplog.text and "RNN sequential head is not supported" in readme
    assert "learned its own mask embedding" in caplog.text and "learned its own mask embedding" in readme
    assert "no LlamaDSparkModel in the model registry" in readme
    assert readme.count("WARNING") == len(engine_warnings(drafter.config)) == 3


def test_a_qwen3_markov_drafter_exports_without_warnings(tmp_path, caplog):
    target = make_target("qwen3")
    drafter = make_drafter(target, mask_token_id=95)
    with caplog.at_level(logging.WARNING):
        out = export_deepspec(drafter, tmp_path / "engine")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    assert engine_warnings(drafter.config) == [] and "WARNING" not in (out / "README.md").read_text()


def test_dflash_origin_drafter_exports_its_own_convention(tmp_path, caplog):
    target = make_target("qwen3")
    drafter = DSparkDrafter.from_pretrained(dflash_folder(tmp_path / "dflash", target, block_size=5), target=target)
    out = export_deepspec(drafter, tmp_path / "engine")
    raw = json.loads((out / "config.json").read_text())
    assert raw["sample_from_anchor"] is False and raw["block_size"] == 5 and raw["markov_rank"] == 0
    assert "markov_head_type" not in raw
    assert "DFlash convention" in (out / "README.md").read_text()
    loaded = DSparkDrafter.from_pretrained(out, target=target)
    assert (loaded.config.block_size, loaded.config.sample_from_anchor) == (4, False)
    for original, reloaded in zip(_proposals(drafter, target), _proposals(loaded, target)):
        _assert_same(original, reloaded)


def test_export_needs_a_bound_drafter_and_an_empty_or_exported_folder(tmp_path, llama_target):
    drafter = make_drafter(llama_target)
    unbound = DSparkDrafter(drafter.config)
    with pytest.raises(RuntimeError, match="bind_target"):
        export_deepspec(unbound, tmp_path / "a")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="busy"):
        export_deepspec(drafter, tmp_path / "busy")
    (tmp_path / "empty").mkdir()
    assert (export_deepspec(drafter, tmp_path / "empty") / "config.json").is_file()


def test_export_refuses_a_folder_holding_a_model_unless_overwrite(tmp_path, llama_target):
    llama_target.save_pretrained(tmp_path / "model")  # e.g. a copy of the target
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    drafter = make_drafter(llama_target, mask_token_id=95)
    with pytest.raises(FileExistsError, match=r"model is not empty \(config.json.*--overwrite"):
        export_deepspec(drafter, tmp_path / "model")
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before
    out = export_deepspec(drafter, tmp_path / "model", overwrite=True)  # replaces the whole folder
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "calibration.json", "config.json",
                                                      "model.safetensors"]
    assert detect_layout(out) == "deepspec" and [p.name for p in tmp_path.iterdir()] == ["model"]
    assert out.stat().st_mode & 0o777 == 0o777 & ~_umask()  # an ordinary folder, not mkdtemp's private one
    with pytest.raises(FileExistsError, match="not empty"):
        export_deepspec(drafter, out)  # a finished export is not replaced silently either


def test_an_export_that_fails_midway_leaves_the_folder_untouched(tmp_path, llama_target, monkeypatch):
    from hf_dspark.interop import deepspec

    drafter = make_drafter(llama_target, mask_token_id=95)
    out = export_deepspec(drafter, tmp_path / "engine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(deepspec, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        export_deepspec(make_drafter(llama_target, seed=9, mask_token_id=95), out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["engine"]  # no staging folder left behind


def test_the_next_export_removes_what_a_killed_export_left(tmp_path, llama_target, caplog):
    """SIGKILL skips the cleanup: the next export to the folder removes the dead process's staging folder (and
    its replaced old export once the folder is back), but never a live export's folder or the only copy."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    partial = tmp_path / f".engine.tmp-{dead_pid}-x1"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    live = tmp_path / f".engine.tmp-{os.getpid()}-x2"  # an export running now (this process)
    live.mkdir()
    only_copy = tmp_path / f".other.old-{dead_pid}-x3"  # swap of `other` interrupted: this is its only copy
    only_copy.mkdir()
    drafter = make_drafter(llama_target, mask_token_id=95)
    with caplog.at_level(logging.WARNING):
        export_deepspec(drafter, tmp_path / "engine")
    assert not partial.exists() and live.is_dir() and "interrupted export" in caplog.text
    replaced = tmp_path / f".engine.old-{dead_pid}-x4"
    replaced.mkdir()
    export_deepspec(drafter, tmp_path / "engine", overwrite=True)
    assert not replaced.exists()
    export_deepspec(drafter, tmp_path / "other")
    assert only_copy.is_dir()  # `other` was missing when the export started: the old folder was kept


def test_export_never_replaces_a_folder_holding_its_input(tmp_path, llama_target):
    make_drafter(llama_target, mask_token_id=95).save_pretrained(tmp_path / "runs" / "drafter")
    drafter = DSparkDrafter.from_pretrained(tmp_path / "runs" / "drafter", target=llama_target)
    for out in (tmp_path / "runs", tmp_path / "runs" / "drafter"):
        with pytest.raises(FileExistsError, match="holds the input"):
            export_deepspec(drafter, out, overwrite=True)
    assert (tmp_path / "runs" / "drafter" / "config.json").is_file()


def test_cli_export_checks_the_folder_before_loading_anything(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="--overwrite"):  # the target path is never opened
        cli_main(["export", "--drafter", str(tmp_path / "d"), "--target", str(tmp_path / "no-target"),
                  str(tmp_path / "out")])
    assert (tmp_path / "out" / "config.json").read_text() == "{}"


def test_cli_export_with_a_target_folder(tmp_path, llama_target, capsys):
    llama_target.save_pretrained(tmp_path / "target")
    make_drafter(llama_target, mask_token_id=95).save_pretrained(tmp_path / "drafter")
    code = cli_main(["export", "--format", "deepspec", "--drafter", str(tmp_path / "drafter"),
                     "--target", str(tmp_path / "target"), str(tmp_path / "out")])
    assert code == 0 and "LlamaDSparkModel" in capsys.readouterr().out
    raw = json.loads((tmp_path / "out" / "config.json").read_text())
    assert raw["sample_from_anchor"] is True
    assert str(tmp_path / "target") in (tmp_path / "out" / "README.md").read_text()
    code = cli_main(["export", "--drafter", str(tmp_path / "drafter"), "--target", str(tmp_path / "target"),
                     "--overwrite", str(tmp_path / "out")])
    assert code == 0 and detect_layout(tmp_path / "out") == "deepspec"


def test_export_refuses_non_finite_weights(tmp_path, llama_target):
    drafter = make_drafter(llama_target, mask_token_id=95)
    with torch.no_grad():
        drafter.fc.weight[0, 0] = 1e6
    with pytest.raises(ValueError, match=r"tensor fc\.weight holds 1 NaN/Inf value\(s\) in float16"):
        export_deepspec(drafter.to(torch.float16), tmp_path / "engine")  # 1e6 overflows float16
    assert not (tmp_path / "engine").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
