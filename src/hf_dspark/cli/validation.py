"""Checks that `hf-dspark` commands run on their arguments before loading any model (they exit with status 2)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_nonempty(parser: argparse.ArgumentParser, option: str, value: str) -> None:
    """Text an option passes to a tokenizer: not blank, and valid Unicode (bytes that are not UTF-8 on the command
    line reach Python as lone surrogates, which no tokenizer can encode)."""
    if not value or not value.strip():
        parser.error(f"{option} is empty; give some text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        parser.error(f"{option} is not valid Unicode text (it holds bytes that are not UTF-8, read as an unpaired "
                     "surrogate); give UTF-8 text")


def check_drafter_path(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    """A drafter argument must be a folder with config.json, or look like a Hub id (`org/name`)."""
    if path is None:
        return
    folder = Path(path)
    if folder.exists():
        if not (folder / "config.json").is_file():
            parser.error(f"{option} {path}: no config.json in this folder; pass a saved drafter folder")
        return
    if not HUB_ID.match(path):
        parser.error(f"{option} {path}: no such folder (and not a Hub id of the form org/name)")


def check_files(parser: argparse.ArgumentParser, option: str, paths: list[str]) -> None:
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        parser.error(f"{option}: no such file(s): {', '.join(missing)}")


def check_output_parent(parser: argparse.ArgumentParser, option: str, path: str) -> None:
    """The output's folder must exist or be creatable, and the output must not be a folder."""
    out = Path(path)
    if out.is_dir():
        parser.error(f"{option} {path} is a folder; give a file path such as {out / 'report.json'}")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        parser.error(f"{option} {path}: {parent} is not a folder")


def check_drafter_spec(parser: argparse.ArgumentParser, option: str, spec: str | None) -> None:
    """A registered proposer (`NAME[:γ]` / `NAME:DRAFTER`, `hf_dspark.proposers`), `untrained` / `untrained:γ` (γ an
    integer >= 1) or a drafter folder / Hub id (`check_drafter_path`)."""
    from ..proposers import split_proposer_spec

    if spec is None:
        return
    found = split_proposer_spec(spec)
    if found is not None:
        proposer, rest = found
        problem = proposer.argument_error(rest)
        if problem is not None:
            parser.error(f"{option} {spec}: {problem}")
        return check_drafter_spec(parser, option, rest) if proposer.argument == "drafter" else None
    if spec == "untrained" or spec.startswith("untrained:"):
        gamma = spec.partition(":")[2]
        if gamma and (not gamma.isdigit() or int(gamma) < 1):
            parser.error(f"{option} {spec}: γ after 'untrained:' must be an integer >= 1, e.g. untrained:7")
        return
    check_drafter_path(parser, option, spec)


def check_output_folder(
    parser: argparse.ArgumentParser, option: str, path: str, overwrite: bool, keep: tuple[str | None, ...] = ()
) -> None:
    """An output folder must be new or empty (or `--overwrite`), and must not hold an input in `keep`.

    The rule is `interop.export.check_export_folder`, the one the Python API applies; here it exits with status 2.
    """
    from ..interop.export import check_export_folder

    try:
        check_export_folder(path, overwrite, keep=keep)
    except FileExistsError as error:
        parser.error(f"{option} {error}")
