"""Every `hf-dspark` subcommand: a usage line that names it, and help text for every option."""

from __future__ import annotations

import argparse

import pytest

from hf_dspark.cli import build_parser, main
from hf_dspark.cli.training import prepare_data_parser, train_parser


def _subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """`{"demo": parser, "bench speed": parser, ...}` from the argparse tree plus the HfArgumentParser commands."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers and prefix:
            found[prefix] = parser
        for action in subparsers:
            for name, child in action.choices.items():
                walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    found["prepare-data"] = prepare_data_parser()
    found["train"] = train_parser()
    return found


PARSERS = _subcommand_parsers()


def test_every_command_is_found():
    assert set(PARSERS) >= {"demo", "bench speed", "bench serve", "profile", "calibrate", "eval", "verify",
                            "export", "prepare-data", "train"}


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_has_help(command):
    parser = PARSERS[command]
    missing = [action.option_strings or action.dest for action in parser._actions
               if action.help in (None, "", argparse.SUPPRESS)]
    assert not missing, f"`hf-dspark {command}` options without help text: {missing}"


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_help_output_names_the_command_and_lists_each_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: hf-dspark {command} ")
    # argparse wraps help text; compare on whitespace-normalised text, first words of each help.
    flat = " ".join(text.split())
    for action in PARSERS[command]._actions:
        words = " ".join(action.help.split()[:4]).replace("%%", "%")
        if "%(" not in words:
            assert words in flat, f"help of {action.option_strings or action.dest} missing from --help"


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for command in ("demo", "bench", "profile", "calibrate", "eval", "verify", "export", "prepare-data", "train"):
        assert command in text


@pytest.mark.parametrize("command", ["bench speed", "bench serve", "eval", "calibrate", "verify"])
def test_help_lists_the_shipped_prompt_sets(command, capsys):
    from hf_dspark.eval.prompts import PROMPT_SETS

    with pytest.raises(SystemExit):
        main([*command.split(), "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert all(name in flat for name in PROMPT_SETS) and "hf://datasets/OWNER/NAME" in flat and "--dataset" in flat
