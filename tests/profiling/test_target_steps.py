"""SPS(B) profiling and the step-curve cache (hf_dspark.profiling.target_steps, `hf-dspark profile`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_dspark.hardware import processor_signature
from hf_dspark.profiling import draft_steps as draft_profiling
from hf_dspark.profiling import target_steps as profiling
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.profiling.target_steps import (
    block_layout,
    default_taps,
    load_or_profile_step_curve,
    model_name,
    profile_step_curve,
    shipped_step_curve_path,
    step_curve_path,
)

FAST = dict(batch_tokens=(1, 3, 8, 12), rows=4, cache_length=16, repeats=1, warmup=0, progress=False)


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(profiling.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_profile_tiny_target(llama_target):
    curve = profile_step_curve(llama_target, threads=1, **FAST)
    assert curve.batch_tokens == [1, 3, 8, 12]
    assert all(s > 0 for s in curve.steps_per_second)
    assert curve.model == model_name(llama_target) == "llama-5L-64d"
    assert (curve.device, curve.dtype, curve.threads) == ("cpu", "float32", 1)
    assert curve.processor == processor_signature("cpu")
    assert torch.get_num_threads() == 1  # restored


def test_profile_restores_thread_count(llama_target):
    before = torch.get_num_threads()
    profile_step_curve(llama_target, threads=2, **{**FAST, "batch_tokens": (2,)})
    assert torch.get_num_threads() == before


def test_profile_validates_arguments(llama_target):
    with pytest.raises(ValueError, match="positive"):
        profile_step_curve(llama_target, **{**FAST, "batch_tokens": (0, 2)})
    with pytest.raises(ValueError, match="repeats"):
        profile_step_curve(llama_target, **{**FAST, "repeats": 0})


def test_block_layout_and_taps():
    assert block_layout(1, 8) == (1, 1)
    assert block_layout(3, 8) == (3, 1)
    assert block_layout(12, 8) == (8, 2)
    assert block_layout(128, 8) == (8, 16)
    assert block_layout(5, 1) == (1, 5)
    assert default_taps(30) == [1, 15, 30]
    assert default_taps(2, count=3) == [1, 2]


def test_save_load_round_trip(llama_target, tmp_path):
    curve = profile_step_curve(llama_target, threads=1, **FAST)
    curve.save(tmp_path / "curve.json")
    loaded = StepCurve.load(tmp_path / "curve.json")
    assert loaded == curve
    assert loaded.steps_per_second_at(5) == pytest.approx(curve.steps_per_second_at(5))


def test_step_curve_path_uses_env_and_key(cache_dir):
    path = step_curve_path("HuggingFaceTB/SmolLM2-135M-Instruct", "cpu", "float32", 2)
    assert path == cache_dir / "step_curves" / "HuggingFaceTB--SmolLM2-135M-Instruct__cpu__float32__t2.json"
    shipped = shipped_step_curve_path("HuggingFaceTB/SmolLM2-135M-Instruct", "cpu", "float32", 1)
    assert shipped.name == "SmolLM2-135M-Instruct__cpu__float32__t1.json"
    here = processor_signature("cpu")  # e.g. "x86_64/AVX2": this kind of processor's folder
    assert shipped.parent.parent == profiling.SHIPPED_STEP_CURVES
    assert shipped.parent.name == here.replace("/", "--").replace("+", "--")
    assert profiling.shipped_curves_dir("cpu", "x86_64/AVX512+bf16").name == "x86_64--AVX512--bf16"
    assert profiling.shipped_curves_dir("cpu", "x86_64/AVX512+bf16+amx").name == "x86_64--AVX512--bf16--amx"


def test_load_or_profile_caches(llama_target, cache_dir, monkeypatch):
    first = load_or_profile_step_curve(llama_target, packed_weights=False, threads=1, progress=False,
                                       **{k: v for k, v in FAST.items() if k != "progress"})
    path = step_curve_path(model_name(llama_target), "cpu", "float32", 1)
    assert path.is_file() and StepCurve.load(path) == first

    def forbidden(*args, **kwargs):
        raise AssertionError("profiled again despite a cached curve")

    monkeypatch.setattr(profiling, "profile_step_curve", forbidden)
    assert load_or_profile_step_curve(llama_target, packed_weights=False, threads=1) == first
    with pytest.raises(AssertionError, match="profiled again"):  # other thread count: another key
        load_or_profile_step_curve(llama_target, packed_weights=False, threads=3)


def test_load_or_profile_prefers_shipped_curve(llama_target, cache_dir, tmp_path, monkeypatch):
    shipped_dir = tmp_path / "shipped"
    monkeypatch.setattr(profiling, "SHIPPED_STEP_CURVES", shipped_dir)
    shipped = StepCurve([1, 8], [10.0, 5.0], model=model_name(llama_target), threads=1,
                        profiler=profiling.PROFILER_VERSION)
    shipped.save(shipped_step_curve_path(model_name(llama_target), "cpu", "float32", 1))
    monkeypatch.setattr(profiling, "profile_step_curve", lambda *a, **k: pytest.fail("should not profile"))
    assert load_or_profile_step_curve(llama_target, packed_weights=False, threads=1) == shipped
    # A curve the user profiled on this machine wins over the shipped one.
    user = StepCurve([1, 8], [20.0, 9.0], threads=1, profiler=profiling.PROFILER_VERSION)
    user.save(step_curve_path(model_name(llama_target), "cpu", "float32", 1))
    assert load_or_profile_step_curve(llama_target, packed_weights=False, threads=1) == user


def test_curves_of_another_profiler_version_are_measured_again(llama_target, cache_dir, tmp_path, monkeypatch,
                                                               caplog):
    """A user-cache curve from an older release (before a change that made verification cheaper, say) must not
    outlive the change: it is skipped for the shipped curve, and without one the target is profiled again."""
    monkeypatch.setattr(profiling, "SHIPPED_STEP_CURVES", tmp_path / "shipped")
    stale_path = step_curve_path(model_name(llama_target), "cpu", "float32", 1)
    StepCurve([1, 8], [1.0, 0.5], threads=1).save(stale_path)  # no version: written before versions existed
    fresh = StepCurve([1, 8], [30.0, 20.0], threads=1, profiler=profiling.PROFILER_VERSION)
    monkeypatch.setattr(profiling, "profile_step_curve", lambda *a, **k: fresh)
    with caplog.at_level("WARNING"):
        assert load_or_profile_step_curve(llama_target, packed_weights=False, threads=1) == fresh
    assert "measured by profiler version None" in caplog.text and str(stale_path) in caplog.text
    assert StepCurve.load(stale_path) == fresh  # the re-measured curve replaced the stale one
    shipped = StepCurve([1, 8], [10.0, 5.0], threads=1, profiler=profiling.PROFILER_VERSION)
    shipped.save(shipped_step_curve_path(model_name(llama_target), "cpu", "float32", 1))
    StepCurve([1, 8], [1.0, 0.5], threads=1, profiler=profiling.PROFILER_VERSION - 1).save(stale_path)
    assert load_or_profile_step_curve(llama_target, packed_weights=False, threads=1) == shipped


def test_curves_from_another_kind_of_processor_are_measured_again(llama_target, cache_dir, tmp_path, monkeypatch,
                                                                  caplog):
    """A shipped curve measured on another kind of processor (an AVX512-bf16 machine's costs on an AVX2 one, where
    bf16 is ~10x slower instead of faster) is skipped and this machine is profiled; the new curve records where."""
    monkeypatch.setattr(profiling, "SHIPPED_STEP_CURVES", tmp_path / "shipped")
    here = processor_signature("cpu")
    elsewhere = StepCurve([1, 8], [10.0, 5.0], threads=1, profiler=profiling.PROFILER_VERSION,
                          processor=f"{here}-but-another-one")
    shipped_path = shipped_step_curve_path(model_name(llama_target), "cpu", "float32", 1)
    elsewhere.save(shipped_path)
    with caplog.at_level("WARNING"):
        measured = load_or_profile_step_curve(llama_target, packed_weights=False, threads=1, **FAST)
    assert measured != elsewhere and measured.processor == here
    assert f"measured on a {here}-but-another-one processor" in caplog.text and str(shipped_path) in caplog.text
    StepCurve([1, 8], [10.0, 5.0], threads=1, profiler=profiling.PROFILER_VERSION, processor=here).save(shipped_path)
    # the user cache comes first
    assert load_or_profile_step_curve(llama_target, packed_weights=False, threads=1) == measured


def test_packed_verification_has_its_own_curve(llama_target, cache_dir, monkeypatch):
    """generate's default packs a float32 CPU target (`generation.packed_linear`): its curve is timed on the packed
    weights and kept apart from the unpacked one."""
    monkeypatch.setattr(profiling, "profile_step_curve", lambda target, **kw: StepCurve(
        [1, 2], [10.0, 9.0] if kw["packs"] is None else [10.0, 9.5], kernel="onednn" if kw["packs"] else None))
    packed = load_or_profile_step_curve(llama_target, threads=1)
    plain = load_or_profile_step_curve(llama_target, threads=1, packed_weights=False)
    assert packed.kernel == "onednn" and plain.kernel is None
    assert step_curve_path(model_name(llama_target), "cpu", "float32-onednn", 1).is_file()
    assert StepCurve.load(step_curve_path(model_name(llama_target), "cpu", "float32", 1)) == plain


def test_every_shipped_curve_has_the_current_profiler_version():
    paths = sorted(profiling.SHIPPED_STEP_CURVES.glob("*/*.json"))
    assert paths
    for path in paths:
        draft = path.name.startswith("draft__")
        expected = draft_profiling.DRAFT_PROFILER_VERSION if draft else profiling.PROFILER_VERSION
        assert StepCurve.load(path).profiler == expected, path


def test_shipped_default_curves_are_valid_and_filed_under_their_processor():
    folders = sorted(path for path in profiling.SHIPPED_STEP_CURVES.iterdir() if path.is_dir())
    assert [folder.name for folder in folders] == ["x86_64--AVX2", "x86_64--AVX512--bf16", "x86_64--AVX512--bf16--amx"]
    for folder in folders:
        for path in folder.glob("*.json"):  # a curve is only looked up in its own processor's folder
            assert profiling.shipped_curves_dir("cpu", StepCurve.load(path).processor) == folder, path
        path = shipped_step_curve_path("SmolLM2-135M-Instruct", "cpu", "float32", 1, processor=StepCurve.load(
            next(folder.glob("*.json"))).processor)
        curve = StepCurve.load(path)
        assert curve.batch_tokens[0] == 1 and curve.batch_tokens[-1] >= 64
        assert curve.threads == 1 and curve.dtype == "float32" and curve.device == "cpu"
        assert curve.steps_per_second[0] > curve.steps_per_second[-1]


def test_profile_cli(llama_target, tmp_path):
    from hf_dspark.cli import main

    llama_target.save_pretrained(tmp_path / "target")
    out, plot = tmp_path / "curve.json", tmp_path / "curve.png"
    code = main(["profile", "--target", str(tmp_path / "target"), "--threads", "1", "--out", str(out),
                 "--plot", str(plot), "--batch-tokens", "1", "4", "--repeats", "1", "--warmup", "0",
                 "--cache-length", "8"])
    assert code == 0 and plot.stat().st_size > 0
    payload = json.loads(out.read_text())
    assert payload["batch_tokens"] == [1, 4] and payload["threads"] == 1


def test_profile_cli_profiles_a_drafter(llama_target, tmp_path, cache_dir, capsys):
    from hf_dspark.cli import main
    from hf_dspark.profiling.draft_steps import draft_curve_path

    llama_target.save_pretrained(tmp_path / "target")
    plot = tmp_path / "draft.png"
    code = main(["profile", "--target", str(tmp_path / "target"), "--drafter", "untrained:3", "--threads", "1",
                 "--plot", str(plot), "--batch-tokens", "1", "2", "--repeats", "1", "--warmup", "0",
                 "--cache-length", "8"])
    assert code == 0 and plot.stat().st_size > 0
    printed = capsys.readouterr().out
    assert "R=   1" in printed and "proposals/s" in printed
    written = Path(printed.strip().splitlines()[-2].removeprefix("wrote "))
    curve = StepCurve.load(written)
    assert curve.batch_tokens == [1, 2] and curve.model.startswith("dspark-") and "-g3-" in curve.model
    assert written == draft_curve_path(curve.model, "cpu", "float32", 1)  # where generate looks for it


def test_profile_cli_refuses_a_missing_drafter_before_loading(tmp_path, capsys):
    from hf_dspark.cli import main

    with pytest.raises(SystemExit):
        main(["profile", "--drafter", str(tmp_path / "nowhere")])
    assert "--drafter" in capsys.readouterr().err


def test_draft_curve_profiled_cached_and_shared_by_architecture(llama_target, cache_dir, monkeypatch):
    from hf_dspark.generation import oracle_for
    from hf_dspark.profiling.draft_steps import draft_curve_path, drafter_architecture, load_or_profile_draft_curve
    from tests.helpers import make_drafter

    drafter = make_drafter(llama_target, block_size=3)
    first = load_or_profile_draft_curve(drafter, threads=1, progress=False, rows=(1, 2, 4), context=8, repeats=1,
                                        warmup=0)
    assert first.batch_tokens == [1, 2, 4] and all(s > 0 for s in first.steps_per_second)
    path = draft_curve_path(drafter_architecture(drafter), "cpu", "float32", 1)
    assert path.is_file() and StepCurve.load(path) == first

    def forbidden(*args, **kwargs):
        raise AssertionError("profiled again despite a cached curve")

    monkeypatch.setattr(draft_profiling, "profile_draft_curve", forbidden)
    other_weights = make_drafter(llama_target, seed=9, block_size=3)  # same shape, other weights: same curve
    assert load_or_profile_draft_curve(other_weights, threads=1) == first
    with pytest.raises(AssertionError, match="profiled again"):  # another γ: another architecture
        load_or_profile_draft_curve(make_drafter(llama_target, block_size=4), threads=1)
    oracle = oracle_for(llama_target, 3, torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4))
    assert load_or_profile_draft_curve(oracle) is None  # model-free: free


def test_shipped_draft_curves_are_valid():
    for path in profiling.SHIPPED_STEP_CURVES.glob("*/draft__*.json"):
        curve = StepCurve.load(path)
        assert curve.batch_tokens[0] == 1 and curve.model in path.name
        costs = [1 / s for s in curve.steps_per_second]
        assert costs == sorted(costs), path.name  # shipped costs never fall with more rows


def test_draft_curve_times_the_context_update_and_propose_of_a_round(llama_target):
    """A drafting round runs the drafter twice: the context update with the last round's committed tokens, then
    `propose`; the curve times both (profiler `DRAFT_PROFILER_VERSION`)."""
    from hf_dspark.profiling.draft_steps import DRAFT_COMMITTED, DRAFT_PROFILER_VERSION, profile_draft_curve
    from tests.helpers import make_drafter

    drafter = make_drafter(llama_target, block_size=3)
    calls = []
    extend, propose = drafter.extend_context, drafter.propose

    def counted_extend(cache, features, valid):
        calls.append(("extend", tuple(valid.shape)))
        return extend(cache, features, valid)

    def counted_propose(anchors, cache, **kwargs):
        calls.append(("propose", tuple(anchors.shape)))
        return propose(anchors, cache, **kwargs)

    drafter.extend_context, drafter.propose = counted_extend, counted_propose
    curve = profile_draft_curve(drafter, rows=(1, 2), context=8, repeats=2, warmup=1, threads=1, progress=False)
    assert curve.profiler == DRAFT_PROFILER_VERSION
    timed = [c for c in calls if c != ("extend", (1, 8)) and c != ("extend", (2, 8))]  # the caches' own context
    assert timed == [(kind, shape) for _ in range(3) for r in (1, 2)
                     for kind, shape in (("extend", (r, DRAFT_COMMITTED)), ("propose", (r,)))]
