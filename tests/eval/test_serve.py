"""`hf-dspark bench serve` on tiny random models: every policy × load level is served and reported."""

import json

import pytest
import torch

from hf_dspark.eval.serve import POLICY_NAMES, ServeConfig, run_serve_benchmark
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.provenance import PROVENANCE_KEYS
from tests.helpers import make_drafter, make_target, ragged_prompts


def _prompts(count: int = 4) -> list[torch.Tensor]:
    ids, mask = ragged_prompts(count, seed=4)
    return [row[m.bool()] for row, m in zip(ids, mask)]


def test_serve_benchmark_covers_every_policy_and_level(tmp_path):
    target = make_target("llama", seed=7)
    drafter = make_drafter(target, seed=1)
    curve = StepCurve([1, 8, 64], [10.0, 6.0, 1.5], model="tiny", threads=1)
    config = ServeConfig(concurrency=[1, 3], requests_per_level=3, max_new_tokens=5, threads=1, repeats=2,
                         out=str(tmp_path / "serve.json"))
    draft_curve = StepCurve([1, 8], [40.0, 20.0])
    report = run_serve_benchmark(config, target, _prompts(), drafter, step_curve=curve, drafter_label="tiny",
                                 draft_curve=draft_curve)
    rows = {(r["policy"], r["concurrency"]): r for r in report["results"]}
    assert set(rows) == {(p, c) for p in POLICY_NAMES for c in (1, 3)}
    for row in rows.values():
        assert 0 < row["tokens"] <= 3 * 5
        assert row["aggregate_tokens_per_second"] > 0 and row["per_user_tokens_per_second"] > 0
        assert 0 <= row["mean_verify_len"] <= drafter.config.block_size
    assert all(rows[("none", c)]["mean_verify_len"] == 0 for c in (1, 3))
    assert all(rows[("fixed1", c)]["mean_verify_len"] <= 1 for c in (1, 3))
    assert max(r["mean_running"] for (p, c), r in rows.items() if c == 1) <= 1
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert saved["drafter"] == "tiny" and len(saved["results"]) == len(rows)
    assert set(PROVENANCE_KEYS) <= set(saved["provenance"]) and saved["provenance"]["command"]
    assert set(saved["ratios_to_plain"]) == set(POLICY_NAMES) - {"none"}
    assert len(saved["runs"]) == 2 * len(rows) and all(row["passes"] == 2 for row in rows.values())
    assert all(0 <= rows[("auto", c)]["drafted_round_fraction"] <= 1 for c in (1, 3))
    assert (tmp_path / "serve_frontier.png").stat().st_size > 0 and (tmp_path / "serve_budget.png").is_file()
    ServeConfig(out=str(tmp_path / "serve.json"))  # a rerun may replace its own report


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policies"):
        ServeConfig(policies=["fixed", "fastest"])
    with pytest.raises(ValueError, match=">= 1"):
        ServeConfig(concurrency=[0])


def test_out_may_only_replace_an_earlier_serve_report(tmp_path):
    prompts = tmp_path / "gsm8k.jsonl"
    prompts.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    with pytest.raises(ValueError, match=r"gsm8k\.jsonl exists and is not an hf-dspark bench serve report; choose "
                       r"another path or pass --overwrite"):
        ServeConfig(out=str(prompts))
    assert prompts.read_text() == json.dumps({"turns": ["hi"]}) + "\n"
    ServeConfig(out=str(prompts), overwrite=True)
    speed_report = tmp_path / "speed.json"  # another benchmark's report is not a serve report
    speed_report.write_text(json.dumps({"config": {}, "torch_threads": 1, "cpu_count": 2, "results": {}, "runs": []}))
    with pytest.raises(ValueError, match="not an hf-dspark bench serve report"):
        ServeConfig(out=str(speed_report))
    earlier = tmp_path / "serve.json"  # reports written before `runs` was added are serve reports too
    earlier.write_text(json.dumps({"config": {}, "drafter": "x", "block_size": 7, "torch_threads": 2, "results": []}))
    ServeConfig(out=str(earlier))
    with pytest.raises(ValueError, match="is a folder"):
        ServeConfig(out=str(tmp_path), overwrite=True)


def _repetitive_prompts(target, count: int = 5) -> list[torch.Tensor]:
    """Prompts whose greedy continuations copy from them: each a reference output of the target, twice."""
    prompts = []
    for seed in range(count):
        start = torch.randint(3, target.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(seed))
        out = target.generate(start, attention_mask=torch.ones_like(start), do_sample=False, max_new_tokens=10)
        prompts.append(torch.cat([out, out], dim=1)[0])
    return prompts


@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_the_engine_serves_the_hybrid_with_plain_greedy_output(policy):
    from hf_dspark.eval.serve import make_policy
    from hf_dspark.proposers import hybrid_for
    from hf_dspark.proposers.hybrid import DSPARK, LOOKUP
    from hf_dspark.serving.engine import DSparkEngine

    target = make_target("llama", seed=21, eos_token_id=None)
    prompts = _repetitive_prompts(target)
    new = 12
    references = [target.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long),
                                  do_sample=False, max_new_tokens=new)[0, p.numel():].tolist() for p in prompts]
    hybrid = hybrid_for(make_drafter(target, block_size=4, seed=1), "prompt-lookup",
                        draft_curve=StepCurve([1, 64], [1000.0, 1000.0]))
    flat = StepCurve([1, 4096], [1.0, 1.0])
    engine = DSparkEngine(target, hybrid, policy=make_policy(policy, 4, flat, 0.5, hybrid.draft_curve), max_running=3)
    rids = [engine.add_request(p, max_new_tokens=new) for p in prompts[:3]]
    engine.step()
    rids += [engine.add_request(p, max_new_tokens=new) for p in prompts[3:]]  # admitted while others run
    while engine.has_work():
        engine.step()
    assert [engine.result(r).generated for r in rids] == references
    assert hybrid.source_counts[LOOKUP] > 0 and hybrid.source_counts[DSPARK] >= 0
    assert sum(rec.drafted > 0 for rec in engine.records) > 0


def test_serve_benchmark_runs_with_the_hybrid(tmp_path):
    from hf_dspark.proposers import hybrid_for

    target = make_target("llama", seed=7)
    hybrid = hybrid_for(make_drafter(target, seed=1), "prompt-lookup")
    curve = StepCurve([1, 8, 64], [10.0, 6.0, 1.5], model="tiny", threads=1)
    config = ServeConfig(concurrency=[1, 2], policies=["none", "fixed", "auto"], requests_per_level=2,
                         max_new_tokens=5, threads=1, out=str(tmp_path / "serve.json"))
    report = run_serve_benchmark(config, target, _prompts(), hybrid, step_curve=curve, drafter_label="hybrid",
                                 draft_curve=StepCurve([1, 8], [40.0, 20.0]))
    assert {(r["policy"], r["concurrency"]) for r in report["results"]} == {
        (p, c) for p in ("none", "fixed", "auto") for c in (1, 2)}
    assert report["drafter"] == "hybrid" and set(report["ratios_to_plain"]) == {"fixed", "auto"}
    assert sum(hybrid.source_counts) > 0
