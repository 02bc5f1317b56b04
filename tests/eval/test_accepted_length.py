"""`hf-dspark eval` on tiny random models: τ bookkeeping, oracle τ = γ+1, resume, multi-turn, CLI smoke."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hf_dspark import DSparkDrafter
from hf_dspark.cli import eval as eval_cli
from hf_dspark.eval.accepted_length import EvalConfig, ProposalRecorder, WorkFile, rounds_from_generation, run_eval
from hf_dspark.eval.prompts import chat_input_ids
from hf_dspark.model.modeling_dspark import DSparkProposal
from hf_dspark.provenance import PROVENANCE_KEYS
from tests.helpers import make_drafter, make_target, ragged_prompts

GAMMA = 4


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=5)


class GreedyOracle(DSparkDrafter):
    """Proposes the target's own greedy continuation of each row's history (every draft accepted at T=0)."""

    def propose(self, anchor_ids, cache, *, histories=None, **kwargs) -> DSparkProposal:
        drafts = []
        for history in histories:
            start = int((history != self.pad_token_id).nonzero()[0])  # drop the batch's left padding
            prompt = history[start:][None]
            out = self.target_model.generate(prompt, do_sample=False, max_new_tokens=self.config.block_size,
                                             pad_token_id=0)[0, prompt.shape[1] :]
            drafts.append(torch.cat([out, out[-1:].repeat(self.config.block_size - out.shape[0])]))  # EOS: pad
        drafts = torch.stack(drafts)
        ones = torch.ones(drafts.shape)
        return DSparkProposal(drafts, None, ones, None)


def _oracle(target) -> GreedyOracle:
    oracle = GreedyOracle(make_drafter(target, block_size=GAMMA).config).bind_target(target)
    oracle.target_model, oracle.pad_token_id = target, 0
    return oracle


def _config(sets, tmp_path, **overrides) -> EvalConfig:
    fields = dict(sets=sets, max_new_tokens=12, batch_size=2, sweep_gammas=[], threads=1,
                  out=str(tmp_path / "out" / "eval_tiny.json"))
    fields.update(overrides)
    return EvalConfig(**fields)


def _records(config) -> list[dict]:
    return [json.loads(line) for line in config.work_path.read_text().splitlines()]


@pytest.mark.parametrize("do_sample", [False, True])
def test_rounds_match_the_loop_stats(target, do_sample):
    drafter = make_drafter(target, block_size=GAMMA)
    ids, mask = ragged_prompts(3, seed=2)
    torch.manual_seed(0)
    recorder = ProposalRecorder()
    out = target.generate(ids, attention_mask=mask, do_sample=do_sample, max_new_tokens=20, top_k=0,
                          assistant_model=drafter, dspark_observers=[recorder])
    assert len(recorder.calls) == drafter.last_generation_stats.rounds  # one record per round, the caller's object
    stats = drafter.last_generation_stats
    rows = rounds_from_generation(stats, recorder.calls, out, ids.shape[1])
    with pytest.raises(RuntimeError, match="acceptance counts"):
        rounds_from_generation(dataclasses.replace(stats, accepted_drafts=[]), recorder.calls, out, ids.shape[1])
    all_rounds = [r for rounds, _, _ in rows for r in rounds]
    assert sum(r[2] for r in all_rounds) / len(all_rounds) == pytest.approx(stats.mean_accepted_length)
    assert sum(r[1] for r in all_rounds) == stats.draft_tokens_accepted  # no EOS in 20 random tokens
    for row, (rounds, logits, new_tokens) in enumerate(rows):
        assert [r[2] for r in rounds] == stats.per_row_accepted_lengths(row)
        assert new_tokens == out.shape[1] - ids.shape[1]
        assert all(c == m + 1 for _, m, c in rounds) and len(logits) == len(rounds)


def test_oracle_accepts_every_draft(target, prompt_sets, chat_tokenizer, tmp_path):
    config = _config(prompt_sets[:1], tmp_path, temperature=0.0, max_new_tokens=14)
    report = run_eval(config, target, chat_tokenizer, {"oracle": _oracle(target)})
    for record in _records(config):
        *body, (verify_len, m, c) = record["rounds"]
        assert body and all(r == [GAMMA, GAMMA, GAMMA + 1] for r in body)  # τ = γ + 1 until the length limit
        ended_by_eos = c == m and record["new_tokens"] < 14  # EOS drafted and accepted: a censored round
        assert ended_by_eos or (m == verify_len and record["new_tokens"] == 14)
    assert report["table"]["oracle"]["sets"]["gsm8k"]["tau"] > GAMMA
    assert report["position_acceptance"]["oracle"]["math"]["p"] == [1.0] * GAMMA


def _count_generate(target, monkeypatch) -> list[torch.Tensor]:
    seen = []
    original = target.generate

    def generate(input_ids, **kwargs):
        seen.append(input_ids.clone())
        return original(input_ids, **kwargs)

    monkeypatch.setattr(target, "generate", generate)
    return seen


def test_resume_skips_done_prompts(target, prompt_sets, chat_tokenizer, tmp_path, monkeypatch):
    drafters = {"dspark": make_drafter(target, block_size=GAMMA)}
    first = _config(prompt_sets[:1], tmp_path, limit=2)
    run_eval(first, target, chat_tokenizer, drafters)
    with open(first.work_path, "a") as handle:
        handle.write('{"fingerprint": "T=1|new=12|se')  # a line cut by an interruption
    seen = _count_generate(target, monkeypatch)
    report = run_eval(_config(prompt_sets[:1], tmp_path), target, chat_tokenizer, drafters)
    assert [ids.shape[0] for ids in seen] == [1]  # only prompt 2 is new
    assert report["table"]["dspark"]["sets"]["gsm8k"]["turns"] == 3
    seen.clear()
    run_eval(_config(prompt_sets[:1], tmp_path, max_new_tokens=10), target, chat_tokenizer, drafters)
    assert sum(ids.shape[0] for ids in seen) == 3  # other settings: nothing reused
    assert WorkFile(first.work_path, first.fingerprint).get("dspark", GAMMA, "gsm8k", 2, 0) is not None


def test_multi_turn_plays_turn_two_after_the_turn_one_answer(target, prompt_sets, chat_tokenizer, tmp_path,
                                                             monkeypatch):
    seen = _count_generate(target, monkeypatch)
    config = _config(prompt_sets[1:], tmp_path, max_new_tokens=8)
    report = run_eval(config, target, chat_tokenizer, {"dspark": make_drafter(target, block_size=GAMMA)})
    records = {(r["prompt"], r["turn"]): r for r in _records(config)}
    assert set(records) == {(0, 0), (0, 1), (1, 0), (1, 1)} and len(seen) == 2  # one batched call per turn
    turn_two = seen[1]
    for row, (user_turns, prompt) in enumerate([(["tell", "more"], 0), (["why?", "again"], 1)]):
        expected = chat_input_ids(chat_tokenizer, user_turns, [records[(prompt, 0)]["reply"]])[0]
        assert turn_two[row, -expected.shape[0] :].tolist() == expected.tolist()
    assert report["sets"]["mt-bench"]["domain"] == "chat"
    assert report["table"]["dspark"]["sets"]["mt-bench"]["turns"] == 4
    assert "length_sweep" not in report["figures"]  # no γ swept: no empty figure
    assert not list(tmp_path.rglob("*_length_sweep.png"))


def test_cli_smoke_writes_json_and_figures(target, prompt_sets, chat_tokenizer, tmp_path, monkeypatch, capsys):
    from hf_dspark.cli import main

    monkeypatch.setattr(eval_cli, "load_target", lambda path, dtype, device: (target, chat_tokenizer))
    out = tmp_path / "results" / "eval_smoke.json"
    code = main(["eval", "--drafters", "dspark=untrained:4", "--prompt-lookup", "--sets", *prompt_sets,
                 "--limit", "2", "--max-new-tokens", "8", "--sweep", "4", "8", "--threads", "1", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report["table"]) == {"dspark", "prompt_lookup"}
    assert set(PROVENANCE_KEYS) <= set(report["provenance"]) and report["provenance"]["command"]
    assert report["length_sweep"]["skipped"] == {"dspark": [8]}
    assert set(report["length_sweep"]["results"]["prompt_lookup"]) == {"4", "8"}
    assert report["threshold_sweep"]["prompt_lookup"] == {"skipped": "no confidence head"}
    assert "ece_before" in report["calibration"]["dspark"]
    for figure in ("accepted_length", "position_acceptance", "length_sweep", "threshold_sweep", "calibration",
                   "reliability_dspark"):
        assert Path(report["figures"][figure]).stat().st_size > 0
    assert "macro" in capsys.readouterr().out
