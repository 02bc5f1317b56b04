"""Every reference in code, tests, scripts, README and docs resolves inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_FILES = sorted(
    [*ROOT.glob("src/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/**/*.py"),
     *ROOT.glob("docs/**/*.md"), *ROOT.glob("benchmarks/results/*.json"), ROOT / "README.md"]
)
# Files that once lived outside the repository: nothing may point to them. The names are assembled from parts so
# that this file does not itself contain a reference.
_GONE = ["DESIGN" + ".md", "TRANSFORMERS" + "_NOTES", "README" + "_scheduling", "../" + "shared", "/" + "work/",
         "dspark" + "_review"]
OUTSIDE = re.compile("|".join(re.escape(name) for name in _GONE))
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


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_points_outside_the_repository(path):
    if _this_file(path):
        return
    hits = [line for line in path.read_text().splitlines() if OUTSIDE.search(line)]
    assert not hits, f"{path.relative_to(ROOT)} points outside the repository: {hits}"


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_pages_named_anywhere_exist(path):
    missing = {page for page in DOCS_PAGE.findall(path.read_text()) if not (ROOT / page).is_file()}
    assert not missing, f"{path.relative_to(ROOT)} names missing docs pages: {sorted(missing)}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))], ids=lambda p: p.name)
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
    assert not broken, f"{page.relative_to(ROOT)}: unresolved links {broken}"


@pytest.mark.parametrize("page", sorted(ROOT.glob("docs/*.md")), ids=lambda p: p.name)
def test_paths_named_in_docs_exist(page):
    broken = [path for path in REPO_PATH.findall(page.read_text()) if not (ROOT / path).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: paths that do not exist {broken}"
