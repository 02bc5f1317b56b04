"""`hf-dspark demo`'s explanation of what the "auto" policy did (hf_dspark.cli.demo)."""

from __future__ import annotations

import pytest

from hf_dspark.cli.demo import _auto_explained
from hf_dspark.generation.stats import DSparkGenerationStats
from hf_dspark.profiling import draft_steps as draft_profiling
from hf_dspark.profiling import target_steps as profiling
from hf_dspark.profiling.step_curve import StepCurve
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


def test_demo_line_says_where_each_rounds_drafts_came_from():
    from hf_dspark.cli.demo import rounds_by_source

    stats = _stats([1, 0, 1, 1, 0])
    assert rounds_by_source(stats, None) == "3 rounds drafted, 2 decoded plainly"
    line = rounds_by_source(stats, (1, 2))
    assert (
        line
        == "drafts per round: copied from the context in 2, from the DSpark drafter in 1, none (plain decoding) in 2"
    )


def test_demo_explains_the_hybrid_copied_rounds_as_free(llama_target, monkeypatch):
    from hf_dspark.proposers import hybrid_for

    step = StepCurve([1, 2, 5], [10.0, 8.0, 5.0])  # verifying 4 drafts: 2 plain steps
    monkeypatch.setattr(profiling, "load_or_profile_step_curve", lambda target: step)
    monkeypatch.setattr(draft_profiling, "load_or_profile_draft_curve", lambda drafter: StepCurve([1, 8], [1.0, 1.0]))
    drafter = make_drafter(llama_target, heldout_acceptance={"greedy": [0.2] * 4})
    line = _auto_explained(llama_target, hybrid_for(drafter), _stats([1, 1, 0, 1]), greedy=True, sources=(1, 2))
    assert line.startswith("'auto' drafted in 3 of 4 rounds (2 copied from the context, 1 by the DSpark drafter).")
    assert "the DSpark drafter's held-out acceptance" in line and "its drafts alone cannot pay here" in line
    assert line.endswith(
        "a round verifying 4 of them costs 2.00 plain steps, so it pays when it commits more tokens than that."
    )


def test_demo_drafter_defaults_to_the_hybrid_and_keeps_the_dspark_drafter_alone(llama_target, monkeypatch):
    from hf_dspark.cli import demo
    from hf_dspark.proposers import HybridDrafter, PromptLookupProposer

    shipped = make_drafter(llama_target)
    monkeypatch.setattr(demo, "load_drafter", lambda target, path, block_size: (shipped, "the shipped one"))
    hybrid, what = demo.demo_drafter(llama_target, "hybrid")
    assert isinstance(hybrid, HybridDrafter) and hybrid.drafter is shipped
    assert isinstance(hybrid.proposer, PromptLookupProposer) and what.startswith("the default drafter: per round,")
    assert demo.demo_drafter(llama_target, "dspark") == (shipped, "the shipped one")
    lookup, what = demo.demo_drafter(llama_target, "prompt-lookup:3")
    assert isinstance(lookup, PromptLookupProposer) and lookup.config.block_size == 3


def test_demo_prompts_are_two_domains():
    from hf_dspark.cli.demo import DEMO_PROMPTS

    assert len(DEMO_PROMPTS) == 2 and len({domain for domain, _ in DEMO_PROMPTS}) == 2
    assert all(prompt.strip() for _, prompt in DEMO_PROMPTS)
