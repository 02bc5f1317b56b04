"""Write the README's result tables from the result JSONs under `benchmarks/results/<processor kind>/`.

    python benchmarks/readme_tables.py            # rewrite every table between its markers in README.md
    python benchmarks/readme_tables.py --check    # exit 1 (and name the tables) when README.md is out of date

Each table sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`. A result table is generated from one
kind of result file, one row group per processor kind that has it, followed by the command and commit that produced
each file (its `"provenance"` record); the `options` table comes from the library's list of generation options. A
result file without a command or a commit is refused: a number in the README must say where it came from.
`tests/benchmarks/test_readme_tables.py` fails when README.md and the JSONs disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)

SPEED_METHODS = {
    "hybrid_auto": "hybrid (DSpark or prompt lookup per row), `auto` (default)",
    "hybrid": "hybrid, ℓ = γ",
    "dspark_auto": "DSpark drafter alone, `auto`",
    "dspark": "DSpark drafter alone, ℓ = γ",
    "dflash": "DFlash-style baseline, ℓ = γ",
    "prompt_lookup": "transformers' prompt lookup",
    "lookup": "prompt lookup in the DSpark loop, ℓ = γ",
    "oracle_g7": "oracle drafter, γ = 7",
}


def load_result(path: Path) -> dict:
    """A result JSON; ValueError naming the file when its provenance lacks the command or the commit."""
    report = json.loads(path.read_text(encoding="utf-8"))
    provenance = report.get("provenance") or {}
    missing = [key for key in ("command", "git_commit") if not provenance.get(key)]
    if missing:
        raise ValueError(
            f"{path.relative_to(ROOT)}: its provenance lacks {missing}; measure it again with the "
            "command in docs/benchmarks.md (every writer records it)."
        )
    return report


def result_files(name: str) -> list[Path]:
    """`benchmarks/results/<kind>/<name>` for every processor kind that has one, in name order."""
    return sorted(RESULTS.glob(f"*/{name}"))


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _caveats(record: dict) -> list[str]:
    """What a reader should know about a provenance record beyond its command and commit."""
    notes = ["reconstructed from git history"] if record.get("source") else []
    if record.get("dirty"):
        notes.append("the checkout had uncommitted changes")
    unknown = [
        what
        for key, what in (("dirty", "working-tree state"), ("versions", "package versions"))
        if record.get(key) is None
    ]
    if unknown:
        notes.append(f"{' and '.join(unknown)} not recorded")
    program = next((word for word in record["command"].split() if word.endswith((".py", ".sh"))), None)
    if program is not None and not (ROOT / program).is_file():
        notes.append(f"{program} has since been replaced")
    if notes:
        notes.append("re-measure with `benchmarks/measure_readme.sh`")
    return notes


def _source(report: dict, path: Path) -> str:
    record = report["provenance"]
    caveats = _caveats(record)
    how = f" ({'; '.join(caveats)})" if caveats else ""
    count = record.get("threads")
    threads = f", {count} thread{'s' if count != 1 else ''}" if count else ""
    return (
        f"*`{path.relative_to(ROOT)}`: {record.get('processor')}{threads}, commit "
        f"`{record['git_commit'][:10]}`{how}; `{record['command']}`*"
    )


def _kind(path: Path) -> str:
    return f"`{path.parent.name}`"


def _sources(used: list[tuple[Path, dict]]) -> list[str]:
    lines = [_source(report, path) + "  " for path, report in used]
    if lines:
        lines[-1] = lines[-1].rstrip()
    return lines


def tau_table() -> list[str]:
    """τ per set and macro average, T = 0 and T = 1 (`hf-dspark eval`, eval_t0.json / eval_t1.json)."""
    rows, used, header_sets = [], [], None
    for t0_path in result_files("eval_t0.json"):
        pair = [(0, t0_path, load_result(t0_path))]
        t1_path = t0_path.with_name("eval_t1.json")
        if t1_path.is_file():
            pair.append((1, t1_path, load_result(t1_path)))
        sets = list(pair[0][2]["sets"])
        if header_sets not in (None, sets):
            raise ValueError(
                f"{t0_path.relative_to(ROOT)}: sets {sets} differ from the other eval results' "
                f"{header_sets}; measure every kind on the same sets"
            )
        header_sets = sets
        drafters = list(dict.fromkeys(d for _, _, report in pair for d in report["table"]))
        for drafter in drafters:
            for temperature, _, report in pair:
                row = report["table"].get(drafter)
                if row is not None:
                    rows.append(
                        [
                            _kind(t0_path),
                            drafter,
                            str(temperature),
                            *(f"{row['sets'][s]['tau']:.2f}" for s in sets),
                            f"**{row['macro']:.2f}**",
                        ]
                    )
        used += [(path, report) for _, path, report in pair]
    if not rows:
        return []
    return [*_markdown(["processor", "drafter", "T", *header_sets, "macro"], rows), "", *_sources(used)]


def speed_table() -> list[str]:
    """Batch-1 `hf-dspark bench speed`: plain tokens/s, then each method's median paired ratio to plain (τ)."""
    rows, used, header_sets = [], [], None
    for path in result_files("speed.json"):
        report = load_result(path)
        results = report["results"]
        sets = list(results)
        if header_sets not in (None, sets):
            raise ValueError(
                f"{path.relative_to(ROOT)}: sets {sets} differ from the other speed results' "
                f"{header_sets}; measure every kind on the same sets"
            )
        header_sets = sets
        identical = all(cell["all_outputs_identical_to_plain"] for s in sets for cell in results[s].values())
        plain = "plain `generate`, tokens/s" + ("" if identical else " (not every output identical)")
        rows.append([_kind(path), plain, *(f"{results[s]['plain']['median_tokens_per_second']:.1f}" for s in sets)])
        for method, label in SPEED_METHODS.items():
            if all(method in results[s] for s in sets):
                cells = []
                for s in sets:
                    cell = results[s][method]
                    tau = cell.get("mean_accepted_length")
                    cells.append(f"×{cell['median_ratio_to_plain']:.2f}" + (f" (τ {tau:.2f})" if tau else ""))
                rows.append([_kind(path), label, *cells])
        used.append((path, report))
    if not rows:
        return []
    return [*_markdown(["processor", "method", *header_sets], rows), "", *_sources(used)]


def _serve_drafter(report: dict) -> str:
    """The drafter a serve report ran with, as the table names it (older reports name the shipped drafter)."""
    label = str(report.get("drafter", ""))
    if label.startswith("the hybrid"):
        return "hybrid"
    if label.startswith("oracle"):
        return "oracle drafter"
    return "DSpark drafter alone"


def serve_table() -> list[str]:
    """`hf-dspark bench serve`: aggregate tokens/s per policy and concurrency C, with the ratio to plain."""
    rows, used, header_levels = [], [], None
    for path in result_files("serve.json"):
        report = load_result(path)
        levels = sorted({row["concurrency"] for row in report["results"]})
        if header_levels not in (None, levels):
            raise ValueError(
                f"{path.relative_to(ROOT)}: load levels {levels} differ from the other serve results' "
                f"{header_levels}; measure every kind at the same levels"
            )
        header_levels = levels
        by_key = {(row["policy"], row["concurrency"]): row for row in report["results"]}
        ratios = report.get("ratios_to_plain", {})
        for policy in dict.fromkeys(row["policy"] for row in report["results"]):
            cells = []
            for c in levels:
                row = by_key.get((policy, c))
                ratio = ratios.get(policy, {}).get(str(c))
                cells.append(
                    ""
                    if row is None
                    else f"{row['aggregate_tokens_per_second']:.1f}"
                    + (f" (×{ratio:.2f})" if ratio is not None else "")
                )
            label = "plain batched decoding" if policy == "none" else f"{_serve_drafter(report)}, `{policy}`"
            rows.append([_kind(path), label, *cells])
        used.append((path, report))
    if not rows:
        return []
    return [*_markdown(["processor", "policy", *(f"C = {c}" for c in header_levels)], rows), "", *_sources(used)]


def options_table() -> list[str]:
    """The `dspark_*` generation options, from the library's own list of them."""
    from hf_dspark.generation import options

    table = getattr(options, "options_markdown_table", None)
    if table is not None:
        return table().rstrip("\n").splitlines()
    rows = [[f"`{name}`", what.replace("|", "\\|")] for name, what in options.DSPARK_OPTIONS.items()]
    return _markdown(["option", "what it takes"], rows)


TABLES: dict[str, Callable[[], list[str]]] = {
    "options": options_table,
    "tau": tau_table,
    "speed": speed_table,
    "serve": serve_table,
}


def render(name: str) -> str:
    """The markdown of table `name` (ending with a newline); a note when no result file has it yet."""
    lines = TABLES[name]()
    if not lines:
        lines = ["*Not measured yet: run the command in docs/benchmarks.md, then this program.*", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def update(text: str) -> tuple[str, list[str]]:
    """`text` with every known table regenerated, and the names of the tables that changed."""
    changed: list[str] = []

    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise ValueError(f"README.md has a results block {name!r} this program does not know: {sorted(TABLES)}")
        body = render(name)
        if body != match.group("body"):
            changed.append(name)
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(replace, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when README.md is out of date")
    parser.add_argument("--readme", type=Path, default=README, help="the markdown file holding the result blocks")
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    new, changed = update(text)
    if args.check:
        if changed:
            sys.stderr.write(f"{args.readme}: out of date tables {changed}; run python benchmarks/readme_tables.py\n")
        return 1 if changed else 0
    if changed:
        tmp = args.readme.with_suffix(".md.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(args.readme)
    sys.stdout.write(f"{args.readme}: {'rewrote ' + ', '.join(changed) if changed else 'up to date'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
