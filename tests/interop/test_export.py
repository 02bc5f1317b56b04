"""Export to the DeepSpec / serving-engine layout: files, fields, sidecars, warnings, CLI, and export -> load
round trips that propose identically."""

import importlib
import json
import logging
import os

import pytest
import torch
from safetensors import safe_open

from hf_dspark import DSparkDrafter
from hf_dspark.cli import main as cli_main
from hf_dspark.interop import check_export, detect_layout, export_deepspec, export_drafter
from hf_dspark.profiling.step_curve import StepCurve
from tests.helpers import make_drafter, make_target, tapped_features
from tests.interop.reference import dflash_folder


@pytest.fixture(scope="module")
def qwen3_target():
    return make_target("qwen3")


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
    ],
    ids=["markov", "rnn", "none"],
)
def test_export_then_load_proposes_identically(tmp_path, qwen3_target, overrides):
    acceptance = {"greedy": [0.6, 0.5, 0.4, 0.3], "sampling": [0.3, 0.2, 0.2, 0.1]}
    drafter = make_drafter(
        qwen3_target,
        calibration_temperatures=[1.0, 2.0, 3.0, 4.0],
        calibration_temperatures_greedy=[0.5] * 4,
        heldout_acceptance=acceptance,
        **overrides,
    )
    out = export_deepspec(drafter, tmp_path / "engine", dtype=torch.float32)
    assert detect_layout(out) == "deepspec"
    loaded = DSparkDrafter.from_pretrained(out, target=qwen3_target)
    assert loaded.config.head_type == drafter.config.head_type
    assert loaded.config.calibration_temperatures == [1.0, 2.0, 3.0, 4.0]
    assert loaded.config.calibration_temperatures_greedy == [0.5] * 4
    assert loaded.config.heldout_acceptance == acceptance  # the "auto" policy's prior travels in calibration.json
    for original, reloaded in zip(_proposals(drafter, qwen3_target), _proposals(loaded, qwen3_target)):
        _assert_same(original, reloaded)


def test_export_with_a_draft_vocabulary_round_trips(tmp_path, qwen3_target):
    """vLLM's layout carries draft_vocab_size, lm_head [V_draft, d], d2t [V_draft] and markov_w2 [V_draft, r]."""
    drafter = make_drafter(qwen3_target, head_type="markov", mask_token_id=95)
    drafter.restrict_draft_vocab(list(range(0, qwen3_target.config.vocab_size, 3)))
    out = export_drafter(drafter, tmp_path / "engine", engine="vllm", dtype=torch.float32)
    raw = json.loads((out / "config.json").read_text())
    size = drafter.config.draft_vocab_size
    assert raw["draft_vocab_size"] == size
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert handle.get_tensor("d2t").shape == (size,)
        assert "t2d" not in set(handle.keys())
        assert handle.get_tensor("lm_head.weight").shape == (size, qwen3_target.config.hidden_size)
        assert handle.get_tensor("markov_head.markov_w2.weight").shape == (size, drafter.config.markov_rank)
    loaded = DSparkDrafter.from_pretrained(out, target=qwen3_target)
    assert torch.equal(loaded.draft_token_ids(), drafter.draft_token_ids())
    for original, reloaded in zip(_proposals(drafter, qwen3_target), _proposals(loaded, qwen3_target)):
        _assert_same(original, reloaded)


def test_exported_files_and_fields(tmp_path, qwen3_target):
    drafter = make_drafter(qwen3_target, mask_token_id=95, calibration_temperatures=[1.0, 1.5, 2.0, 2.5])
    curve = StepCurve([1, 8, 64], [50.0, 45.0, 12.0], model="tiny", device="cpu")
    out = export_drafter(drafter, tmp_path / "engine", step_curve=curve)  # vLLM, bfloat16 by default
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "model.safetensors",
        "calibration.json",
        "step_curve.json",
        "README.md",
    }
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["model_type"] == "qwen3"
    assert raw["dtype"] == "bfloat16"
    assert raw["sample_from_anchor"] is True and raw["dspark_bonus_anchor"] is False and raw["block_size"] == 4
    assert raw["dflash_config"]["query_zero_predicts_next"] is True and raw["shift_label"] is True
    assert raw["target_layer_ids"] == [0, 2] and raw["num_target_layers"] == 5 and raw["mask_token_id"] == 95
    assert raw["markov_rank"] == 8 and raw["markov_head_type"] == "vanilla"
    assert raw["enable_confidence_head"] is True and raw["confidence_head_with_markov"] is True
    assert raw["hidden_size"] == 64 and raw["vocab_size"] == 96 and raw["num_hidden_layers"] == 2
    with safe_open(out / "model.safetensors", "pt") as handle:
        names = set(handle.keys())
        embed, lm_head = handle.get_tensor("embed_tokens.weight"), handle.get_tensor("lm_head.weight")
    assert not any(n.startswith("model.") for n in names)
    assert {"fc.weight", "markov_head.markov_w1.weight", "confidence_head.proj.bias"} <= names
    assert torch.equal(embed, qwen3_target.get_input_embeddings().weight.to(torch.bfloat16))
    assert torch.equal(lm_head, qwen3_target.get_output_embeddings().weight.to(torch.bfloat16))
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["sampling"] == [1.0, 1.5, 2.0, 2.5] and calibration["greedy"] == [1.0, 1.5, 2.0, 2.5]
    assert StepCurve.from_dict(json.loads((out / "step_curve.json").read_text())).batch_tokens == [1, 8, 64]
    readme = (out / "README.md").read_text()
    for needle in (
        '"method": "dspark"',
        '"num_speculative_tokens": 4',
        "exactly γ = 4 speculative tokens",
        "vLLM reads neither file",
        "dspark_online_sts",
    ):
        assert needle in readme


def test_step_curve_beside_the_drafter_folder_is_shipped(tmp_path, qwen3_target):
    drafter = make_drafter(qwen3_target, mask_token_id=95)
    drafter.save_pretrained(tmp_path / "native")
    StepCurve([1, 4], [10.0, 9.0]).save(tmp_path / "native" / "step_curve.json")
    loaded = DSparkDrafter.from_pretrained(tmp_path / "native", target=qwen3_target)
    out = export_deepspec(loaded, tmp_path / "engine")
    assert (out / "step_curve.json").is_file()
    assert not (export_deepspec(drafter, tmp_path / "engine2") / "step_curve.json").exists()


def test_unservable_drafters_are_refused_with_engine_reason_and_fix(tmp_path, caplog):
    llama = make_target("llama")
    drafter = make_drafter(llama, head_type="rnn", mask_token_id=None)
    with pytest.raises(ValueError, match="vLLM cannot serve") as info:
        export_drafter(drafter, tmp_path / "engine", engine="vllm")
    message = str(info.value)
    for needle in ("RNN head is not implemented", "q/k RMSNorms", "learned its own mask embedding", "Fix: retrain"):
        assert needle in message
    assert not (tmp_path / "engine").exists()
    with pytest.raises(ValueError, match=r"SGLang cannot serve(.|\n)*confidence_with_markov=False"):
        export_drafter(
            make_drafter(make_target("qwen3"), mask_token_id=95, confidence_with_markov=False),
            tmp_path / "engine",
            engine="sglang",
        )


def test_a_qwen3_markov_drafter_exports_without_warnings(tmp_path, qwen3_target, caplog):
    drafter = make_drafter(qwen3_target, mask_token_id=95)
    with caplog.at_level(logging.WARNING):
        out = export_deepspec(drafter, tmp_path / "engine")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    assert "WARNING" not in caplog.text and check_export(out, "deepspec") == []


def test_dflash_origin_drafter_exports_under_the_dflash_architecture(tmp_path, qwen3_target):
    drafter = DSparkDrafter.from_pretrained(
        dflash_folder(tmp_path / "dflash", qwen3_target, block_size=5), target=qwen3_target
    )
    with pytest.raises(ValueError, match="DeepSpec cannot serve"):
        export_deepspec(drafter, tmp_path / "deepspec")
    out = export_drafter(drafter, tmp_path / "engine", engine="vllm", dtype=torch.float32)
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["block_size"] == 5
    assert raw["sample_from_anchor"] is False and raw["dspark_bonus_anchor"] is True
    assert raw["dflash_config"]["query_zero_predicts_next"] is False
    assert '"method": "dflash"' in (out / "README.md").read_text()
    loaded = DSparkDrafter.from_pretrained(out, target=qwen3_target)
    assert (loaded.config.block_size, loaded.config.sample_from_anchor) == (4, False)
    for original, reloaded in zip(_proposals(drafter, qwen3_target), _proposals(loaded, qwen3_target)):
        _assert_same(original, reloaded)


def test_export_needs_a_bound_drafter_and_an_empty_or_exported_folder(tmp_path, qwen3_target):
    drafter = make_drafter(qwen3_target, mask_token_id=95)
    unbound = DSparkDrafter(drafter.config)
    with pytest.raises(RuntimeError, match="bind_target"):
        export_deepspec(unbound, tmp_path / "a")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="busy"):
        export_deepspec(drafter, tmp_path / "busy")
    (tmp_path / "empty").mkdir()
    assert (export_deepspec(drafter, tmp_path / "empty") / "config.json").is_file()


def test_export_refuses_a_folder_holding_a_model_unless_overwrite(tmp_path, qwen3_target):
    qwen3_target.save_pretrained(tmp_path / "model")  # e.g. a copy of the target
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    drafter = make_drafter(qwen3_target, mask_token_id=95)
    with pytest.raises(FileExistsError, match=r"model is not empty \(config.json.*--overwrite"):
        export_deepspec(drafter, tmp_path / "model")
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before
    out = export_deepspec(drafter, tmp_path / "model", overwrite=True)  # replaces the whole folder
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "calibration.json",
        "config.json",
        "model.safetensors",
    ]
    assert detect_layout(out) == "deepspec" and [p.name for p in tmp_path.iterdir()] == ["model"]
    assert out.stat().st_mode & 0o777 == 0o777 & ~_umask()  # an ordinary folder, not mkdtemp's private one
    with pytest.raises(FileExistsError, match="not empty"):
        export_deepspec(drafter, out)  # a finished export is not replaced silently either


def test_an_export_that_fails_midway_leaves_the_folder_untouched(tmp_path, qwen3_target, monkeypatch):
    export_module = importlib.import_module("hf_dspark.interop.export")

    drafter = make_drafter(qwen3_target, mask_token_id=95)
    out = export_deepspec(drafter, tmp_path / "engine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        export_deepspec(make_drafter(qwen3_target, seed=9, mask_token_id=95), out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["engine"]  # no staging folder left behind


def test_the_next_export_removes_what_a_killed_export_left(tmp_path, qwen3_target, caplog):
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
    drafter = make_drafter(qwen3_target, mask_token_id=95)
    with caplog.at_level(logging.WARNING):
        export_deepspec(drafter, tmp_path / "engine")
    assert not partial.exists() and live.is_dir() and "interrupted export" in caplog.text
    replaced = tmp_path / f".engine.old-{dead_pid}-x4"
    replaced.mkdir()
    export_deepspec(drafter, tmp_path / "engine", overwrite=True)
    assert not replaced.exists()
    export_deepspec(drafter, tmp_path / "other")
    assert only_copy.is_dir()  # `other` was missing when the export started: the old folder was kept


def test_export_never_replaces_a_folder_holding_its_input(tmp_path, qwen3_target):
    make_drafter(qwen3_target, mask_token_id=95).save_pretrained(tmp_path / "runs" / "drafter")
    drafter = DSparkDrafter.from_pretrained(tmp_path / "runs" / "drafter", target=qwen3_target)
    for out in (tmp_path / "runs", tmp_path / "runs" / "drafter"):
        with pytest.raises(FileExistsError, match="holds the input"):
            export_deepspec(drafter, out, overwrite=True)
    assert (tmp_path / "runs" / "drafter" / "config.json").is_file()


def test_cli_export_checks_the_folder_before_loading_anything(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as info:  # a usage error; the target path is never opened
        cli_main(
            [
                "export",
                "--drafter",
                str(tmp_path / "d"),
                "--target",
                str(tmp_path / "no-target"),
                str(tmp_path / "out"),
            ]
        )
    assert info.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "out" / "config.json").read_text() == "{}"


def test_cli_export_with_a_target_folder(tmp_path, qwen3_target, capsys):
    qwen3_target.save_pretrained(tmp_path / "target")
    make_drafter(qwen3_target, mask_token_id=95).save_pretrained(tmp_path / "drafter")
    code = cli_main(
        [
            "export",
            "--engine",
            "deepspec",
            "--drafter",
            str(tmp_path / "drafter"),
            "--target",
            str(tmp_path / "target"),
            str(tmp_path / "out"),
        ]
    )
    assert code == 0 and "Qwen3DSparkModel" in capsys.readouterr().out
    raw = json.loads((tmp_path / "out" / "config.json").read_text())
    assert raw["sample_from_anchor"] is True
    assert str(tmp_path / "target") in (tmp_path / "out" / "README.md").read_text()
    code = cli_main(
        [
            "export",
            "--drafter",
            str(tmp_path / "drafter"),
            "--target",
            str(tmp_path / "target"),
            "--overwrite",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0 and detect_layout(tmp_path / "out") == "deepspec"


def test_export_refuses_non_finite_weights(tmp_path, qwen3_target):
    drafter = make_drafter(qwen3_target, mask_token_id=95)
    with torch.no_grad():
        drafter.fc.weight[0, 0] = 1e6
    with pytest.raises(ValueError, match=r"tensor fc\.weight holds NaN/Inf in float16"):
        export_deepspec(drafter, tmp_path / "engine", dtype="float16")  # 1e6 overflows float16
    assert not (tmp_path / "engine").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_cli_export_dtype_and_assume_layout(tmp_path, qwen3_target, capsys):
    qwen3_target.save_pretrained(tmp_path / "target")
    make_drafter(qwen3_target, mask_token_id=95).save_pretrained(tmp_path / "drafter")
    base = ["export", "--drafter", str(tmp_path / "drafter"), "--target", str(tmp_path / "target")]
    assert cli_main([*base, str(tmp_path / "bf16")]) == 0  # vLLM in bfloat16 by default
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert check_export(tmp_path / "bf16", "vllm") == []
    assert cli_main([*base, "--engine", "speculators", "--dtype", "float32", str(tmp_path / "fp32")]) == 0
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["dtype"] == "float32"
    assert check_export(tmp_path / "fp32", "speculators") == []
    raw = json.loads((tmp_path / "bf16" / "config.json").read_text())
    raw["dflash_config"]["query_zero_predicts_next"] = False  # now conflicts with the other spellings
    (tmp_path / "bf16" / "config.json").write_text(json.dumps(raw))
    conflicting = ["export", "--drafter", str(tmp_path / "bf16"), "--target", str(tmp_path / "target")]
    with pytest.raises(ValueError, match="conflicting block layouts"):
        cli_main([*conflicting, str(tmp_path / "again")])
    assert cli_main([*conflicting, "--assume-layout", "anchor-first", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "config.json").read_text())["dflash_config"]["query_zero_predicts_next"]


def test_cli_export_into_the_empty_current_folder(tmp_path, qwen3_target, capsys, monkeypatch):
    qwen3_target.save_pretrained(tmp_path / "target")
    make_drafter(qwen3_target, mask_token_id=95).save_pretrained(tmp_path / "drafter")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    base = ["export", "--engine", "deepspec", "--drafter", str(tmp_path / "drafter"),
            "--target", str(tmp_path / "target")]
    assert cli_main([*base, "."]) == 0  # filled in place: the current folder cannot be renamed
    assert sorted(p.name for p in (tmp_path / "here").iterdir()) == [
        "README.md", "calibration.json", "config.json", "model.safetensors"]
    assert check_export(tmp_path / "here", "deepspec") == [] and detect_layout(tmp_path / "here") == "deepspec"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left beside it
    with pytest.raises(SystemExit) as info:  # not empty now: refused before anything loads
        cli_main(["export", "--drafter", str(tmp_path / "drafter"), "--target", str(tmp_path / "no-target"), "."])
    assert info.value.code == 2 and "--overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # replacing it would rename the current folder: refused up front
        cli_main(["export", "--drafter", str(tmp_path / "drafter"), "--target", str(tmp_path / "no-target"),
                  "--overwrite", "."])
    assert info.value.code == 2 and "is the current folder" in capsys.readouterr().err


def test_a_staging_folder_left_inside_an_empty_output_folder_is_removed(tmp_path, qwen3_target, caplog):
    out = tmp_path / "out"
    stale = out / ".hf-dspark-export.tmp-999999999-abc"  # no such process
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    drafter = make_drafter(qwen3_target, mask_token_id=95)
    with caplog.at_level(logging.WARNING):
        export_deepspec(drafter, out, dtype=torch.float32)
    assert not stale.exists() and "left over from an interrupted export" in caplog.text
    assert check_export(out, "deepspec") == []
