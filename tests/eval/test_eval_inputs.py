"""`hf-dspark eval` inputs that used to give wrong results or destroy files silently: a retrained drafter under the
same name resumed from old records, two prompt files with the same stem, `--limit -1`, `--out` onto an input."""

import json
from pathlib import Path

import pytest
import torch

from hf_dspark.eval.accepted_length import EvalConfig, run_eval
from hf_dspark.eval.eval_report import domain_of
from hf_dspark.eval.prompts import set_names
from hf_dspark.eval.work_file import drafter_identity, target_identity
from tests.helpers import make_drafter, make_target

GAMMA = 4


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=5)


def _config(sets, tmp_path, **overrides) -> EvalConfig:
    fields = dict(sets=sets, max_new_tokens=6, batch_size=4, sweep_gammas=[], threads=1,
                  out=str(tmp_path / "out" / "eval_tiny.json"))
    fields.update(overrides)
    return EvalConfig(**fields)


def _count_rows(target, monkeypatch) -> list[int]:
    rows = []
    original = target.generate

    def generate(input_ids, **kwargs):
        rows.append(input_ids.shape[0])
        return original(input_ids, **kwargs)

    monkeypatch.setattr(target, "generate", generate)
    return rows


def test_a_retrained_drafter_under_the_same_name_is_evaluated_afresh(target, prompt_sets, chat_tokenizer,
                                                                     tmp_path, monkeypatch, caplog):
    old, retrained = make_drafter(target, seed=1, block_size=GAMMA), make_drafter(target, seed=2, block_size=GAMMA)
    assert drafter_identity(old) != drafter_identity(retrained)
    assert drafter_identity(old) == drafter_identity(make_drafter(target, seed=1, block_size=GAMMA))
    run_eval(_config(prompt_sets[:1], tmp_path), target, chat_tokenizer, {"dspark": old})
    rows = _count_rows(target, monkeypatch)
    run_eval(_config(prompt_sets[:1], tmp_path), target, chat_tokenizer, {"dspark": old})
    assert rows == []  # same drafter: everything resumed
    report = run_eval(_config(prompt_sets[:1], tmp_path), target, chat_tokenizer, {"dspark": retrained})
    assert rows == [3] and "changed since 3 of its records were written" in caplog.text
    assert "evaluating it afresh" in caplog.text
    records = [json.loads(line) for line in _config(prompt_sets[:1], tmp_path).work_path.read_text().splitlines()]
    assert {r["drafter_id"] for r in records[-3:]} == {f"{drafter_identity(retrained)}-{target_identity(target)}"}
    assert report["table"]["dspark"]["sets"]["gsm8k"]["turns"] == 3
    caplog.clear()
    run_eval(_config(prompt_sets[:1], tmp_path), target, chat_tokenizer, {"dspark": retrained})
    assert rows == [3]  # the retrained drafter's own records are reused; the old ones only earn a warning
    assert "its records of these weights are reused" in caplog.text


def test_two_sets_with_the_same_stem_are_both_evaluated(target, prompt_sets, chat_tokenizer, tmp_path):
    for folder, prompts in (("a", ["one", "two"]), ("b", ["three"])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "gsm8k.jsonl").write_text("\n".join(json.dumps({"turns": [p]}) for p in prompts))
    sets = [str(tmp_path / "a" / "gsm8k.jsonl"), str(tmp_path / "b" / "gsm8k.jsonl"), prompt_sets[1]]
    assert set_names(sets) == ["a/gsm8k", "b/gsm8k", "mt-bench"]
    twin = tmp_path / "a" / "gsm8k.json"  # same folder and stem, another suffix
    twin.write_text(json.dumps({"turns": ["x"]}))
    assert set_names([sets[0], str(twin)]) == [str(Path(sets[0]).resolve()), str(twin.resolve())]
    report = run_eval(_config(sets, tmp_path), target, chat_tokenizer, {"dspark": make_drafter(target)})
    rows = report["table"]["dspark"]["sets"]
    assert (rows["a/gsm8k"]["turns"], rows["b/gsm8k"]["turns"], rows["mt-bench"]["turns"]) == (2, 1, 4)
    assert domain_of("a/gsm8k") == "math" and report["sets"]["b/gsm8k"]["domain"] == "math"
    with pytest.raises(ValueError, match="given more than once"):
        _config([sets[0], sets[0]], tmp_path)


@pytest.mark.parametrize("limit", [-1, 0])
def test_a_limit_below_one_is_refused(prompt_sets, tmp_path, limit):
    with pytest.raises(ValueError, match=rf"limit \(prompts per set\) must be >= 1, got {limit}; omit it"):
        _config(prompt_sets, tmp_path, limit=limit)


def test_out_may_not_overwrite_an_input_or_a_foreign_file(target, prompt_sets, chat_tokenizer, tmp_path):
    before = Path(prompt_sets[0]).read_text()
    with pytest.raises(ValueError, match="is the input file"):
        _config(prompt_sets, tmp_path, out=prompt_sets[0])
    with pytest.raises(ValueError, match="the work file of --out"):  # the work file would be an input
        _config([*prompt_sets, str(_jsonl(tmp_path))], tmp_path, work_file=str(tmp_path / "x.work.jsonl"))
    assert Path(prompt_sets[0]).read_text() == before
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match=r"not an hf-dspark eval report.*--overwrite"):
        _config(prompt_sets, tmp_path, out=str(notes))
    config = _config(prompt_sets[:1], tmp_path, out=str(notes), overwrite=True, limit=1)
    run_eval(config, target, chat_tokenizer, {"dspark": make_drafter(target)})
    _config(prompt_sets[:1], tmp_path, out=str(notes))  # now an eval report: rerunning into it is fine


def test_work_file_defaults_to_the_user_cache_not_beside_the_report(tmp_path, prompt_sets, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path / "cache"))
    here, there = (_config(prompt_sets, tmp_path, out=str(tmp_path / name / "eval.json")) for name in ("a", "b"))
    assert here.work_path.parent == tmp_path / "cache" / "eval" and here.work_path.name.startswith("eval-")
    assert here.work_path != there.work_path  # two reports of one name keep separate records
    assert here.work_path == _config(prompt_sets, tmp_path, out=str(tmp_path / "a" / "eval.json")).work_path
    mine = tmp_path / "runs" / "mine.work.jsonl"
    assert _config(prompt_sets, tmp_path, work_file=str(mine)).work_path == mine


def _jsonl(tmp_path):
    path = tmp_path / "x.work.jsonl"
    path.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    return path


def test_identity_covers_dtype_and_config_but_not_calibration(target):
    drafter = make_drafter(target)
    before = drafter_identity(drafter)
    drafter.config.calibration_temperatures = [2.0] * drafter.config.block_size  # records keep raw logits
    assert drafter_identity(drafter) == before
    drafter.config.rms_norm_eps = 1e-3
    assert drafter_identity(drafter) != before
    assert drafter_identity(make_drafter(target).to(torch.bfloat16)) != drafter_identity(make_drafter(target))


def test_an_empty_or_malformed_prompt_file_is_refused_before_any_model_loads(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"empty.jsonl holds no prompts"):
        _config([str(tmp_path / "empty.jsonl")], tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"turns": ["ok"]}\n{"turns": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not valid JSON"):
        _config([str(tmp_path / "bad.jsonl")], tmp_path)


def test_a_byte_order_mark_is_accepted_and_a_lone_surrogate_is_refused_at_the_file_check(tmp_path):
    from hf_dspark.eval.prompts import load_prompt_set

    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + '{"turns": ["caf\u00e9"]}\n{"turns": ["two"]}\n'.encode())
    assert [item["turns"] for item in load_prompt_set(bom)] == [["caf\u00e9"], ["two"]]
    _config([str(bom)], tmp_path)  # the eval config's file check passes
    lone = tmp_path / "surrogate.jsonl"
    lone.write_text('{"turns": ["fine"]}\n{"turns": ["ok", "bad \\ud800 text"]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"surrogate.jsonl:2: turn 1 is not valid Unicode text"):
        _config([str(lone)], tmp_path)
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"turns": ["caf\u00e9"]}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.jsonl is not UTF-8 text"):
        load_prompt_set(latin)


def test_out_may_not_be_a_folder(prompt_sets, tmp_path):
    with pytest.raises(ValueError, match=r"is a folder; give the report's file path"):
        _config(prompt_sets, tmp_path, out=str(tmp_path), overwrite=True)


def test_records_written_before_identities_are_reused_with_a_warning(target, prompt_sets, chat_tokenizer, tmp_path,
                                                                     monkeypatch, caplog):
    config = _config(prompt_sets[:1], tmp_path)
    drafter = make_drafter(target, block_size=GAMMA)
    run_eval(config, target, chat_tokenizer, {"dspark": drafter})
    lines = [json.loads(line) for line in config.work_path.read_text().splitlines()]
    config.work_path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "drafter_id"}) + "\n"
                                        for r in lines))  # the format of earlier hf-dspark versions
    rows = _count_rows(target, monkeypatch)
    run_eval(config, target, chat_tokenizer, {"dspark": drafter})
    assert rows == [] and "predate drafter identities" in caplog.text and "--restart" in caplog.text


def test_records_of_another_target_are_not_reused(target, prompt_sets, chat_tokenizer, tmp_path, monkeypatch):
    config = _config(prompt_sets[:1], tmp_path, prompt_lookup=True)
    run_eval(config, target, chat_tokenizer, {"dspark": make_drafter(target, block_size=GAMMA)})
    other = make_target("llama", seed=6)  # same shapes, other weights (e.g. another checkpoint of the family)
    assert target_identity(other) != target_identity(target)
    rows = _count_rows(other, monkeypatch)
    run_eval(config, other, chat_tokenizer, {"dspark": make_drafter(other, block_size=GAMMA)})
    assert sum(rows) == 6  # both the drafter and prompt lookup re-run all 3 prompts

