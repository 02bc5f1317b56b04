"""A `generate` call's policy gets the cost curves it needs from `hf_dspark.profiling` when the caller passes none
(the user cache, then the shipped curves, else profiled once), and uses the caller's curves as given."""

from __future__ import annotations

import torch

from hf_dspark.generation import prompt_lookup_for
from hf_dspark.generation.options import DSparkGenerationOptions
from hf_dspark.generation.policy import policy_from_options
from hf_dspark.profiling.draft_steps import DRAFT_PROFILER_VERSION, draft_curve_path, drafter_architecture
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.profiling.target_steps import PROFILER_VERSION, step_curve_key, step_curve_path
from hf_dspark.target.packed_linear import linear_packs_for
from tests.helpers import make_drafter, make_target


def _cached_curves(target, drafter) -> tuple[list[float], list[float]]:
    """Save a step curve for `target` and a cost curve for `drafter` where the user cache keeps them."""
    step = StepCurve([1, 64], [10.0, 5.0], profiler=PROFILER_VERSION)
    step.save(step_curve_path(*step_curve_key(target, packs=linear_packs_for(target, None))))
    weight = drafter.fc.weight
    key = (drafter_architecture(drafter), weight.device.type, str(weight.dtype).removeprefix("torch."),
           torch.get_num_threads())
    StepCurve([1, 64], [100.0, 50.0], profiler=DRAFT_PROFILER_VERSION).save(draft_curve_path(*key))
    return [10.0, 5.0], [100.0, 50.0]


def test_missing_curves_are_looked_up_in_the_profiling_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    target = make_target("llama", seed=31)
    drafter = make_drafter(target, block_size=4)
    step, draft = _cached_curves(target, drafter)
    lagged = policy_from_options(DSparkGenerationOptions(dspark_policy="lagged"), 4, target=target)
    assert lagged.step_curve.steps_per_second == step
    auto = policy_from_options(DSparkGenerationOptions(dspark_policy="auto"), 4, target=target, drafter=drafter)
    assert auto.step_curve.steps_per_second == step and auto.draft_curve.steps_per_second == draft


def test_the_callers_curves_are_used_as_given(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    target = make_target("llama", seed=31)
    drafter = make_drafter(target, block_size=4)
    _cached_curves(target, drafter)
    step, draft = StepCurve([1, 64], [3.0, 2.0]), StepCurve([1, 64], [30.0, 20.0])
    options = DSparkGenerationOptions(dspark_policy="auto", dspark_step_curve=step, dspark_draft_curve=draft)
    policy = policy_from_options(options, 4, target=target, drafter=drafter)
    assert policy.step_curve is step and policy.draft_curve is draft


def test_a_model_free_drafter_costs_nothing():
    """Prompt lookup has no weights: its cost curve is its own `draft_curve` (None), never profiled."""
    target = make_target("llama", seed=31)
    lookup = prompt_lookup_for(target, block_size=4)
    options = DSparkGenerationOptions(dspark_policy="auto", dspark_step_curve=StepCurve([1, 64], [3.0, 2.0]))
    assert policy_from_options(options, 4, target=target, drafter=lookup).draft_curve is None
