"""`hf-dspark`: a thin command line over the library. Run `hf-dspark <command> --help` for each command.

One module per command group, each with an `add_*_command(subparsers)` that holds its argument definitions:
`demo`, `bench` (speed, serve), `scheduling` (profile, calibrate), `eval`, `verify`, `export`, `check_layout`, and
`training` (prepare-data, train: HfArgumentParser over the config dataclasses). `loaders` holds the target/drafter
loaders and argument types every command shares; `prompt_sets` the prompt-set options (`--sets`, `--dataset`);
`validation` the checks run before any model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .bench import add_bench_command
from .check_layout import add_check_layout_command
from .demo import add_demo_command
from .eval import add_eval_command
from .export import add_export_command
from .scheduling import add_calibrate_command, add_profile_command
from .training import PREPARE_DATA_HELP, TRAIN_HELP, run_prepare_data, run_train
from .verify import add_verify_command

# Commands whose options come from HfArgumentParser over dataclasses; `main` hands them their arguments untouched.
DELEGATED = {"prepare-data": run_prepare_data, "train": run_train}


def build_parser() -> argparse.ArgumentParser:
    """The `hf-dspark` parser with every subcommand (prepare-data and train are listed; they parse themselves)."""
    parser = argparse.ArgumentParser(prog="hf-dspark", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_command(sub)
    add_bench_command(sub)
    add_profile_command(sub)
    add_calibrate_command(sub)
    add_eval_command(sub)
    add_verify_command(sub)
    add_export_command(sub)
    add_check_layout_command(sub)
    sub.add_parser("prepare-data", help=PREPARE_DATA_HELP, add_help=False)
    sub.add_parser("train", help=TRAIN_HELP, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hf-dspark` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return int(DELEGATED[argv[0]](argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return args.func(args)

