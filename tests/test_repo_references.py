"""Every text file of the project: its references resolve inside the repository, and it speaks of the project only.

The files are the ones git tracks or would track (`git ls-files --cached --others --exclude-standard`), or, outside a
checkout, every file under the root but ignored folders; data sets (`*.jsonl`) and binaries are skipped.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".sh", ".json", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".ini", ""}
SKIPPED_DIRS = {".git", ".venv", ".venv-ci", "venv", "build", "dist", "runs", "cache", "work_dirs", "__pycache__"}


def _project_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        files = [ROOT / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in files if p.is_file() and p.suffix in TEXT_SUFFIXES and not p.name.endswith(".egg-info"))


TEXT_FILES = _project_files()
MARKDOWN_FILES = [p for p in TEXT_FILES if p.suffix == ".md"]
# Files that once lived outside the repository: nothing may point to them. The names are assembled from parts so
# that this file does not itself contain a reference.
_GONE = [
    "DESIGN" + ".md",
    "TRANSFORMERS" + "_NOTES",
    "README" + "_scheduling",
    "../" + "shared",
    "/" + "work/",
    "dspark" + "_review",
]
OUTSIDE = re.compile("|".join(re.escape(name) for name in _GONE))
# How the work on the project was organised is no part of it: earlier runs of the work, issue numbers, machines
# known only by a nickname. (Assembled from parts, as above.)
_WORKFLOW = [
    r"previous (stop|run|session)\b",
    r"\bissue #?\d+",
    r"\(#\d+\)",
    r"\bthis " + "VM\\b",
    r"\b(AVX2|AVX512|AMX|idle|Zen ?4) " + "machine\\b",
    r"\bzen" + "4\\b",
    r"\bthe " + "lead\\b",
    r"\bhelper " + "session",
    r"\bauto_v\d+",
]
WORKFLOW = re.compile("|".join(_WORKFLOW), re.IGNORECASE)
DOCS_PAGE = re.compile(r"docs/[\w./-]+\.md")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"`((?:src|scripts|tests|docs|benchmarks|configs|data)/[\w./-]*[\w/])`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def _this_file(path: Path) -> bool:
    return path.resolve() == Path(__file__).resolve()


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_project_files_are_found():
    names = {_id(p) for p in TEXT_FILES}
    assert {"README.md", "CHANGELOG.md", "scripts/train_default.sh", "configs/recipe.yaml"} <= names
    assert any(name.startswith("benchmarks/results/") for name in names)


@pytest.mark.parametrize("path", TEXT_FILES, ids=_id)
def test_no_reference_points_outside_the_repository(path):
    if _this_file(path):
        return
    hits = [line for line in path.read_text(errors="replace").splitlines() if OUTSIDE.search(line)]
    assert not hits, f"{_id(path)} points outside the repository: {hits}"


@pytest.mark.parametrize("path", TEXT_FILES, ids=_id)
def test_the_project_speaks_of_itself_only(path):
    if _this_file(path):
        return
    hits = [m.group(0) for line in path.read_text(errors="replace").splitlines() for m in WORKFLOW.finditer(line)]
    assert not hits, f"{_id(path)} speaks of how the work was organised, not of the project: {hits}"


@pytest.mark.parametrize("path", TEXT_FILES, ids=_id)
def test_docs_pages_named_anywhere_exist(path):
    missing = {page for page in DOCS_PAGE.findall(path.read_text(errors="replace")) if not (ROOT / page).is_file()}
    assert not missing, f"{_id(path)} names missing docs pages: {sorted(missing)}"


@pytest.mark.parametrize("page", MARKDOWN_FILES, ids=_id)
def test_markdown_links_and_paths_resolve(page):
    text = page.read_text()
    broken = []
    for link in MARKDOWN_LINK.findall(text):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        target, _, anchor = link.partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
            broken.append(link)
    assert not broken, f"{_id(page)}: unresolved links {broken}"


@pytest.mark.parametrize("page", MARKDOWN_FILES, ids=_id)
def test_paths_named_in_markdown_exist(page):
    broken = [path for path in REPO_PATH.findall(page.read_text()) if not (ROOT / path).exists()]
    assert not broken, f"{_id(page)}: paths that do not exist {broken}"


TOOLS = [p for p in TEXT_FILES if p.parent in (ROOT / "scripts", ROOT / "benchmarks")]


@pytest.mark.parametrize("path", TOOLS, ids=_id)
def test_every_tool_and_benchmark_is_documented(path):
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = _id(path)
    assert any(named in page.read_text() for page in pages), f"{named} is named in neither README.md nor docs/"
