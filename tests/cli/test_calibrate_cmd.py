"""`hf-dspark calibrate`: held-out rollouts -> STS temperatures in the drafter config, sidecar and PNGs."""

from __future__ import annotations

import json

import pytest
import torch

from hf_dspark import DSparkDrafter
from hf_dspark.cli import main
from hf_dspark.eval.calibrate import CalibrationRun, left_pad, set_calibration
from hf_dspark.ops.calibration import CalibrationReport
from hf_dspark.provenance import PROVENANCE_KEYS
from tests.helpers import char_tokenizer, make_drafter, make_target

GAMMA = 3


@pytest.fixture()
def setup(tmp_path):
    target = make_target("llama", seed=3)
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    make_drafter(target, block_size=GAMMA).save_pretrained(tmp_path / "drafter")
    prompts = tmp_path / "heldout.jsonl"
    lines = [{"turns": [text]} for text in ("abc=def", "x+y*z", "hello!", "0123456789", "q")]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return tmp_path


def _args(root, *extra):
    return ["calibrate", "--target", str(root / "target"), "--drafter", str(root / "drafter"), "--prompts",
            str(root / "heldout.jsonl"), "--limit", "4", "--max-new-tokens", "14", "--batch-size", "2",
            "--threads", "1", *extra]


def test_calibrate_both_modes_writes_config_sidecar_and_plots(setup):
    out = setup / "calibrated"
    assert main(_args(setup, "--mode", "both", "--out", str(out))) == 0
    sidecar = json.loads((out / "calibration.json").read_text())
    assert set(sidecar["reports"]) == {"greedy", "sampling"}
    assert sidecar["settings"]["limit"] == 4
    assert set(PROVENANCE_KEYS) <= set(sidecar["provenance"]) and sidecar["provenance"]["command"]
    reports = {mode: CalibrationReport(**{k: v if v is not None else float("nan") for k, v in report.items()})
               for mode, report in sidecar["reports"].items()}
    for mode, report in reports.items():
        assert report.mode == mode and report.n_samples > 0 and len(report.temperatures) == GAMMA
        assert all(a <= b + 1e-12 for a, b in zip(report.ece_after[:1], report.ece_before[:1]))
        assert (out / f"reliability_{mode}.png").stat().st_size > 0
    target = make_target("llama", seed=3)
    drafter = DSparkDrafter.from_pretrained(out, target=target)
    assert drafter.config.calibration_temperatures == pytest.approx(reports["sampling"].temperatures)
    assert drafter.config.calibration_temperatures_greedy == pytest.approx(reports["greedy"].temperatures)
    for mode, report in reports.items():  # the held-out acceptance the "auto" policy starts from
        assert len(report.acceptance) == GAMMA and all(0.0 <= q <= 1.0 for q in report.acceptance)
        assert drafter.config.acceptance_prior(greedy=mode == "greedy") == pytest.approx(report.acceptance)


def test_calibrate_in_place_rewrites_config_only(setup):
    weights = next((setup / "drafter").glob("*.safetensors"))
    before = weights.read_bytes()
    assert main(_args(setup, "--mode", "greedy")) == 0
    assert weights.read_bytes() == before
    config = json.loads((setup / "drafter" / "config.json").read_text())
    sidecar = json.loads((setup / "drafter" / "calibration.json").read_text())
    assert config["calibration_temperatures_greedy"] == pytest.approx(sidecar["reports"]["greedy"]["temperatures"])
    assert config["calibration_temperatures"] == [1.0] * GAMMA  # sampling untouched
    assert (setup / "drafter" / "reliability_greedy.png").is_file()
    assert not (setup / "drafter" / "reliability_sampling.png").exists()


def test_calibrate_in_place_keeps_the_stored_dtype(setup):
    """A bf16 drafter calibrated next to an fp32 target keeps saying bf16 (its weights are not rewritten)."""
    drafter = DSparkDrafter.from_pretrained(setup / "drafter", dtype=torch.bfloat16)
    drafter.save_pretrained(setup / "drafter")
    assert main(_args(setup, "--mode", "greedy")) == 0
    assert json.loads((setup / "drafter" / "config.json").read_text())["dtype"] == "bfloat16"
    assert DSparkDrafter.from_pretrained(setup / "drafter").fc.weight.dtype == torch.bfloat16


def test_calibration_run_validates(tmp_path):
    with pytest.raises(ValueError, match="prompt file"):
        CalibrationRun(prompt_files=[], out=str(tmp_path))
    with pytest.raises(ValueError, match="modes"):
        CalibrationRun(prompt_files=["x.jsonl"], modes="beam", out=str(tmp_path))


def test_helpers():
    ids, mask = left_pad([torch.tensor([5, 6, 7]), torch.tensor([9])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    config = make_drafter(make_target("llama"), block_size=GAMMA).config
    assert config.acceptance_prior(greedy=True) is None

    def report(temperatures, acceptance):
        return CalibrationReport(temperatures, [0.0] * 3, [0.0] * 3, [0.5] * 3, [0.5] * 3, 10, acceptance=acceptance)

    set_calibration(config, "greedy", report([2.0, 1.0, 0.5], [0.6, 0.7, 0.8]))
    assert config.acceptance_prior(greedy=False) == [0.6, 0.7, 0.8]  # the other mode's until sampling is measured
    set_calibration(config, "sampling", report([1.5, 1.5, 1.5], [0.3, 0.4, 0.5]))
    assert config.temperatures_for(True) == [2.0, 1.0, 0.5]
    assert config.temperatures_for(False) == [1.5, 1.5, 1.5]
    assert config.acceptance_prior(greedy=True) == [0.6, 0.7, 0.8]
    assert config.acceptance_prior(greedy=False) == [0.3, 0.4, 0.5]


def test_calibrate_in_place_keeps_an_engine_layout_folder_loadable(setup):
    from hf_dspark.interop import detect_layout, export_deepspec

    target = make_target("llama", seed=3)
    # DeepSpec serves drafters with q/k norms and a vocabulary mask token (its loader refuses the fixture's).
    servable = make_drafter(target, block_size=GAMMA, use_qk_norm=True, mask_token_id=95)
    export_deepspec(servable, setup / "engine", dtype=torch.float32)
    config_before = (setup / "engine" / "config.json").read_bytes()
    args = _args(setup, "--mode", "greedy")
    args[args.index("--drafter") + 1] = str(setup / "engine")
    assert main(args) == 0
    assert (setup / "engine" / "config.json").read_bytes() == config_before  # the layout is not rewritten
    assert detect_layout(setup / "engine") == "deepspec"
    sidecar = json.loads((setup / "engine" / "calibration.json").read_text())
    reloaded = DSparkDrafter.from_pretrained(setup / "engine", target=target)
    assert reloaded.config.calibration_temperatures_greedy == pytest.approx(
        sidecar["reports"]["greedy"]["temperatures"])
    assert reloaded.config.acceptance_prior(greedy=True) == pytest.approx(sidecar["reports"]["greedy"]["acceptance"])


def test_calibrate_refuses_an_out_folder_holding_another_model(setup):
    before = {p.name: p.read_bytes() for p in (setup / "target").iterdir()}
    with pytest.raises(ValueError, match=r"holds no hf-dspark drafter \(config.json model_type='llama'\)"):
        main(_args(setup, "--mode", "greedy", "--out", str(setup / "target")))
    assert {p.name: p.read_bytes() for p in (setup / "target").iterdir()} == before


def test_calibrate_refuses_to_replace_another_drafter_before_loading_unless_overwrite(setup, monkeypatch):
    from hf_dspark.cli import scheduling

    other = setup / "other"
    make_drafter(make_target("llama", seed=3), seed=9, block_size=GAMMA).save_pretrained(other)
    before = {p.name: p.read_bytes() for p in other.iterdir()}

    def no_load(*args, **kwargs):
        raise AssertionError("the target was loaded before the refusal")

    monkeypatch.setattr(scheduling, "load_target", no_load)
    with pytest.raises(ValueError, match=r"holds another trained drafter.*--overwrite"):
        main(_args(setup, "--mode", "greedy", "--out", str(other)))
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    monkeypatch.undo()
    assert main(_args(setup, "--mode", "greedy", "--out", str(other), "--overwrite")) == 0
    weights = next(other.glob("*.safetensors")).read_bytes()
    assert weights == next((setup / "drafter").glob("*.safetensors")).read_bytes()
    assert main(_args(setup, "--mode", "sampling", "--out", str(other))) == 0  # the same drafter again: allowed


@pytest.mark.parametrize("existing", [False, True])
def test_a_failing_write_leaves_the_out_folder_as_it_was(setup, monkeypatch, existing):
    out = setup / "calibrated"
    if existing:
        assert main(_args(setup, "--mode", "greedy", "--out", str(out))) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()} if existing else None
    real = DSparkDrafter.save_pretrained

    def full_disk(self, folder, *args, **kwargs):
        real(self, folder, *args, **kwargs)
        for weights in __import__("pathlib").Path(folder).glob("*.safetensors"):
            weights.unlink()  # config.json got written, the weights did not
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DSparkDrafter, "save_pretrained", full_disk)
    with pytest.raises(OSError, match="No space left"):
        main(_args(setup, "--mode", "sampling", "--out", str(out)))
    if existing:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert not out.exists() or not any(out.iterdir())
    assert not [p for p in setup.iterdir() if p.name.startswith(".calibrated")]  # no staging folder left behind
