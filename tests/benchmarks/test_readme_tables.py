"""README.md's result tables are exactly what `benchmarks/readme_tables.py` writes from the result JSONs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_tables_match_the_result_jsons():
    tables = _tables()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = {match.group("name") for match in tables.BLOCK.finditer(text)}
    assert blocks == set(tables.TABLES), f"README.md's result blocks {sorted(blocks)} != {sorted(tables.TABLES)}"
    _, changed = tables.update(text)
    assert not changed, (
        f"README.md tables {changed} disagree with benchmarks/results/; run python benchmarks/readme_tables.py"
    )


def test_every_result_json_records_its_command_and_commit():
    from hf_dspark.provenance import PROVENANCE_KEYS

    tables = _tables()
    files = sorted((ROOT / "benchmarks" / "results").glob("*/*.json"))
    assert files
    for path in files:
        record = tables.load_result(path)["provenance"]
        assert set(PROVENANCE_KEYS) <= set(record), f"{path.name}: lacks {set(PROVENANCE_KEYS) - set(record)}"
        unknown = [key for key in ("dirty", "versions", "processor", "created") if record[key] is None]
        assert not unknown or record.get("source"), f"{path.name}: {unknown} unset in a record measured here"


def test_a_record_that_lacks_its_state_says_so_beneath_the_table():
    tables = _tables()
    rebuilt = {
        "command": "python scripts/no_such_program.py --x 1",
        "git_commit": "a" * 40,
        "dirty": None,
        "versions": None,
        "source": "reconstructed from git history",
    }
    assert tables._caveats(rebuilt) == [
        "reconstructed from git history",
        "working-tree state and package versions not recorded",
        "scripts/no_such_program.py has since been replaced",
        "re-measure with `benchmarks/measure_readme.sh`",
    ]
    measured = {"command": "hf-dspark bench speed", "git_commit": "a" * 40, "dirty": False, "versions": {"torch": ""}}
    assert tables._caveats(measured) == []
    assert tables._caveats({**measured, "dirty": True})[0] == "the checkout had uncommitted changes"


def test_a_result_without_provenance_is_refused(tmp_path, monkeypatch):
    tables = _tables()
    folder = tmp_path / "benchmarks" / "results" / "x86_64--AVX2"
    folder.mkdir(parents=True)
    good = json.loads((ROOT / "benchmarks/results/x86_64--AVX512--bf16/speed.json").read_text())
    (folder / "speed.json").write_text(json.dumps({k: v for k, v in good.items() if k != "provenance"}))
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "RESULTS", tmp_path / "benchmarks" / "results")
    with pytest.raises(ValueError, match=r"speed.json: its provenance lacks \['command', 'git_commit'\]"):
        tables.speed_table()


def test_a_changed_number_is_caught(tmp_path, monkeypatch):
    tables = _tables()
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:speed -->\n<!-- /results:speed -->\n")
    assert tables.main(["--readme", str(readme)]) == 0
    assert tables.main(["--readme", str(readme), "--check"]) == 0
    text = readme.read_text()
    first_ratio = text.index("×")
    readme.write_text(text[: first_ratio + 1] + "9" + text[first_ratio + 2 :])
    assert tables.main(["--readme", str(readme), "--check"]) == 1


def test_the_hybrid_rows_appear_beside_transformers_prompt_lookup(tmp_path, monkeypatch):
    tables = _tables()
    folder = tmp_path / "benchmarks" / "results" / "x86_64--AVX2"
    folder.mkdir(parents=True)
    report = json.loads((ROOT / "benchmarks/results/x86_64--AVX512--bf16/speed.json").read_text())
    for cells in report["results"].values():
        cells["hybrid"] = {**cells["dspark"], "median_ratio_to_plain": 1.25, "mean_accepted_length": 2.5}
        cells["hybrid_auto"] = {**cells["dspark"], "median_ratio_to_plain": 1.5, "mean_accepted_length": 3.0}
    (folder / "speed.json").write_text(json.dumps(report))
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "RESULTS", tmp_path / "benchmarks" / "results")
    lines = tables.speed_table()
    labels = [line.split(" | ")[1] for line in lines if line.startswith("| `")]
    assert labels.index("hybrid (DSpark or prompt lookup per row), `auto` (default)") < labels.index(
        "transformers' prompt lookup"
    )
    hybrid = next(line for line in lines if "| hybrid, ℓ = γ |" in line)
    assert hybrid.count("×1.25 (τ 2.50)") == len(report["results"])


@pytest.mark.parametrize("variant", ["dspark", "dflash"])
def test_model_cards_show_the_tau_of_the_eval_results_they_name(variant, monkeypatch):
    spec = importlib.util.spec_from_file_location("ship", ROOT / "scripts" / "ship_default_drafters.py")
    ship = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship)
    card = (ROOT / f"src/hf_dspark/resources/drafters/smollm2-135m-instruct-{variant}/README.md").read_text()
    sources = re.findall(r"`(benchmarks/results/[^`]+/eval_t\d\.json)`", card)
    assert sources, f"the {variant} card names no eval result"
    assert all((ROOT / path).is_file() for path in sources)
    monkeypatch.chdir(ROOT)  # the card names the files relative to the repository
    assert card == ship.replace_tau_section(card, variant, sources), (
        f"the {variant} card's τ table disagrees with {sources}; run python scripts/ship_default_drafters.py tau "
        f"--variant {variant} --eval {' '.join(sources)}"
    )


@pytest.mark.parametrize(
    ("label", "named"),
    [
        ("the hybrid of the shipped drafter and prompt lookup", "hybrid"),
        ("oracle drafter (γ=7)", "oracle drafter"),
        ("shipped (float32)", "DSpark drafter alone"),
    ],
)
def test_serve_rows_name_the_drafter_they_served_with(label, named):
    assert _tables()._serve_drafter({"drafter": label}) == named
