"""`hf-dspark verify` on a saved tiny target: the JSON report with provenance, the summary, the figure, the exit
status; and its argument checks before any model loads."""

from __future__ import annotations

import json

import pytest

from hf_dspark.cli import main
from hf_dspark.provenance import PROVENANCE_KEYS
from tests.helpers import char_tokenizer, make_target


@pytest.fixture()
def setup(tmp_path):
    target = make_target("llama", seed=3)
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"turns": [text]} for text in ("abcabcabc", "x+y=5, so 5", "hello hello", "0123012301")]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return tmp_path


def test_verify_writes_a_report_a_summary_and_a_figure(setup, capsys):
    out = setup / "verify.json"
    code = main(["verify", "--target", str(setup / "target"), "--drafter", "prompt-lookup:3", "--sets",
                 str(setup / "prompts.jsonl"), "--prompts", "4", "--max-new-tokens", "16", "--samples", "200",
                 "--sample-batch", "200", "--sample-tokens", "2", "--min-position-samples", "20",
                 "--quality-samples", "2", "--quality-max-new-tokens", "8", "--min-accepted", "1", "--threads", "1",
                 "--device", "cpu", "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == {"pass": 0, "pass (near-ties)": 0, "fail": 1, "inconclusive": 3}[report["verdict"]]
    assert report["greedy"]["verdict"] in ("pass", "inconclusive")  # fp32: never a divergence
    assert report["greedy"]["identical"] == 4
    assert set(PROVENANCE_KEYS) <= set(report["provenance"])
    assert report["quality"]["metric"].startswith("final_answer_match")
    assert (setup / "verify.png").is_file()
    text = capsys.readouterr().out
    assert text.startswith("losslessness certificate: ") and "greedy" in text and "sampling" in text


def test_verify_checks_its_arguments_before_loading(setup, capsys):
    with pytest.raises(SystemExit):
        main(["verify", "--sets", "no-such-set", "--out", str(setup / "v.json")])
    assert "--sets: prompt set no-such-set" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["verify", "--sets", "gsm8k", "--alpha", "2", "--out", str(setup / "v.json")])
    assert "--alpha" in capsys.readouterr().err
