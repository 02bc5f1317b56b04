"""`CURVE_SOURCES`: the cost-curve look-ups `generate` and the engine use when the caller passes no curve."""

from __future__ import annotations

import pytest

from hf_dspark.generation.options import DSparkGenerationOptions
from hf_dspark.generation.policy import policy_from_options
from hf_dspark.profiling.curve_sources import CURVE_SOURCES, CurveSources
from hf_dspark.profiling.step_curve import StepCurve


def test_the_package_fills_both_look_ups():
    assert CURVE_SOURCES.step_curve is not None and CURVE_SOURCES.draft_curve is not None


def test_a_missing_look_up_names_the_fix():
    with pytest.raises(RuntimeError, match="dspark_step_curve"):
        CurveSources().get("step_curve")


def test_policies_take_their_curves_from_the_sources(monkeypatch):
    step, draft = StepCurve([1, 64], [10.0, 5.0]), StepCurve([1, 64], [100.0, 50.0])
    seen = []
    monkeypatch.setattr(CURVE_SOURCES, "step_curve", lambda target, packed: seen.append((target, packed)) or step)
    monkeypatch.setattr(CURVE_SOURCES, "draft_curve", lambda drafter: seen.append(drafter) or draft)
    target, drafter = object(), object()
    lagged = policy_from_options(DSparkGenerationOptions(dspark_policy="lagged"), 4, target=target)
    assert lagged.step_curve is step and seen == [(target, None)]
    auto = policy_from_options(DSparkGenerationOptions(dspark_policy="auto"), 4, target=target, drafter=drafter)
    assert auto.draft_curve is draft and seen[-1] is drafter
    given = policy_from_options(DSparkGenerationOptions(dspark_policy="lagged", dspark_step_curve=draft), 4, target=1)
    assert given.step_curve is draft and len(seen) == 3  # a curve the caller gives is never looked up
