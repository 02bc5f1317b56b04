"""`hf-dspark eval` killed between the records of one batch resumes to the records of an uninterrupted run."""

import json

import pytest

from hf_dspark.eval.accepted_length import EvalConfig, WorkFile, run_eval
from tests.helpers import make_drafter, make_target

GAMMA = 4


def _config(sets, tmp_path, name: str) -> EvalConfig:
    return EvalConfig(sets=sets, max_new_tokens=12, batch_size=3, sweep_gammas=[], threads=1, temperature=1.0,
                      out=str(tmp_path / name / "eval.json"), work_file=str(tmp_path / name / "eval.work.jsonl"))


def _replies(config: EvalConfig) -> dict:
    records = {}
    for line in config.work_path.read_text().splitlines():
        record = json.loads(line)
        records[WorkFile.key(record)] = (record["reply"], record["rounds"], record["new_tokens"])
    return records


def test_a_run_killed_inside_a_batch_resumes_to_the_uninterrupted_records(prompt_sets, chat_tokenizer, tmp_path,
                                                                          monkeypatch):
    target = make_target("llama", seed=5)
    drafters = {"dspark": make_drafter(target, block_size=GAMMA)}
    whole = _config(prompt_sets[:1], tmp_path, "whole")
    run_eval(whole, target, chat_tokenizer, drafters)
    killed = _config(prompt_sets[:1], tmp_path, "killed")
    real, appended = WorkFile.append, []

    def append_then_die(self, record):
        if appended:
            raise KeyboardInterrupt  # killed after the batch's first record was written
        appended.append(record)
        real(self, record)

    monkeypatch.setattr(WorkFile, "append", append_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_eval(killed, target, chat_tokenizer, drafters)
    monkeypatch.undo()
    assert len(killed.work_path.read_text().splitlines()) == 1
    run_eval(killed, target, chat_tokenizer, drafters)
    assert _replies(killed) == _replies(whole)
