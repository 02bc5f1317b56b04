"""`benchmarks/demo_prompts.py`: per-prompt τ of a drafter (and the hybrid's copied share), the best per domain."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from hf_dspark.proposers import hybrid_for
from tests.helpers import make_drafter, make_target

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "demo_prompts.py"


def _load():
    spec = importlib.util.spec_from_file_location("demo_prompts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_score_prompt_gives_tau_and_the_copied_share():
    bench = _load()
    target = make_target("llama", seed=21, eos_token_id=None)
    seed = torch.tensor([[5, 9, 14, 3, 22, 7, 11]])
    reply = target.generate(seed, attention_mask=torch.ones_like(seed), do_sample=False, max_new_tokens=24)
    repetitive = torch.cat([reply, reply], dim=1)  # its continuation repeats what the prompt holds
    hybrid = hybrid_for(make_drafter(target, block_size=4), "prompt-lookup")
    row = bench.score_prompt(target, hybrid, repetitive, max_new_tokens=24)
    assert row["new_tokens"] == 24 and row["rounds"] >= 1
    assert row["tau"] == pytest.approx(24 / row["rounds"], abs=1.0) and row["tau"] > 2.0
    assert 0.5 < row["lookup_share"] <= 1.0
    alone = bench.score_prompt(target, make_drafter(target, block_size=4), repetitive, max_new_tokens=24)
    assert "lookup_share" not in alone and alone["tau"] < row["tau"]


def test_best_per_domain_ranks_domains_by_their_best_tau():
    bench = _load()
    rows = [
        {"domain": d, "index": i, "default": {"tau": t}}
        for d, i, t in [("math", 0, 2.0), ("code", 0, 1.5), ("math", 1, 3.0), ("code", 1, 4.0), ("math", 2, 3.0)]
    ]
    best = bench.best_per_domain(rows)
    assert list(best) == ["code", "math"]
    assert best["code"]["index"] == 1 and best["math"]["index"] == 1  # ties keep the earlier prompt


def test_bad_options_are_refused_before_loading(capsys):
    bench = _load()
    with pytest.raises(SystemExit):
        bench.main(["--prompts", "0"])
    with pytest.raises(SystemExit):
        bench.main(["--sets", "missing.jsonl"])
    assert "no such file(s): missing.jsonl" in capsys.readouterr().err
