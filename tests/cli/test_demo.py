"""`hf-dspark demo`'s explanation of what the "auto" policy did (hf_dspark.cli.demo)."""

from __future__ import annotations

import pytest

from hf_dspark import draft_profiling, profiling
from hf_dspark.cli.demo import _auto_explained
from hf_dspark.generation.stats import DSparkGenerationStats
from hf_dspark.step_curve import StepCurve
from tests.helpers import make_drafter


def _stats(drafted_rows: list[int]) -> DSparkGenerationStats:
    stats = DSparkGenerationStats(1, 4, "auto")
    stats.rounds = len(drafted_rows)
    stats.drafted_rows = list(drafted_rows)
    return stats


@pytest.mark.parametrize("acceptance, verdict", [(0.2, "cannot pay here"), (0.95, "drafting pays here")])
def test_demo_says_how_often_auto_drafted_and_what_drafting_can_give(llama_target, monkeypatch, acceptance, verdict):
    # 5 tokens cost 2 plain steps, a proposal 0.2 of one: 0.95 acceptance pays (≈ 2.1x), 0.2 cannot (≈ 0.8x).
    step = StepCurve([1, 2, 5], [10.0, 8.0, 5.0])
    monkeypatch.setattr(profiling, "load_or_profile_step_curve", lambda target: step)
    draft = StepCurve([1, 8], [50.0, 10.0])
    monkeypatch.setattr(draft_profiling, "load_or_profile_draft_curve", lambda drafter: draft)
    drafter = make_drafter(llama_target, heldout_acceptance={"greedy": [acceptance] * 4})
    line = _auto_explained(llama_target, drafter, _stats([0, 1, 0, 0]), greedy=True)
    assert line.startswith("'auto' drafted in 1 of 4 rounds. On this machine (")
    assert verdict in line and "held-out acceptance" in line


def test_demo_says_when_the_drafter_has_no_acceptance_to_forecast_with(llama_target):
    line = _auto_explained(llama_target, make_drafter(llama_target), _stats([0, 0]), greedy=True)
    assert line == "'auto' drafted in 0 of 2 rounds (this drafter has no held-out acceptance to forecast with)."


def test_demo_speedup_line_has_median_and_spread_or_says_drafting_did_not_help():
    from hf_dspark.cli.demo import speedup_summary

    line = speedup_summary([1.0, 1.2, 1.4, 1.6, 1.8], accepted_drafts=12)
    assert "1.40x" in line and "interquartile range 1.20-1.60x" in line and "5 interleaved pairs" in line
    idle = speedup_summary([2.6, 0.98, 1.0], accepted_drafts=0)
    assert "drafting did not help" in idle and "speedup" not in idle
