"""The prompt-set options every command shares: `--sets` (shipped names, JSONL files, `hf://datasets/...`) and
`--dataset/--split/--field` (one Hugging Face dataset, or a local dataset folder, read through `datasets`)."""

from __future__ import annotations

import argparse

from ..eval.prompts import PROMPT_SETS, PROMPT_SPEC_HELP


def add_sets_arguments(parser: argparse.ArgumentParser, default: list[str] | None, what: str,
                       option: str = "--sets") -> None:
    """`option` (nargs="+") plus `--dataset`, `--split`, `--field`; `what` says how the command uses the prompts."""
    shown = f" (default: {' '.join(default)})" if default else ""
    parser.add_argument(option, nargs="+", default=default,
                        help=f"prompt sets, {what}: each {PROMPT_SPEC_HELP}{shown}. Shipped: "
                        + ", ".join(f"{name} ({domain})" for name, domain in PROMPT_SETS.items()))
    parser.add_argument("--dataset", default=None,
                        help=f"also read prompts from this Hugging Face dataset (OWNER/NAME) or local dataset folder "
                        f"through the `datasets` library (cached; offline once read); adds to {option}")
    parser.add_argument("--split", default="test", help="--dataset's split (default: test)")
    parser.add_argument("--field", default=None,
                        help="--dataset's prompt column (default: the first of turns, prompt, question, "
                        "instruction, problem, input, text)")
    parser.set_defaults(sets_option=option)


def resolve_sets(args: argparse.Namespace) -> list[str]:
    """The command's prompt-set specs (`--dataset` appended as `hf://datasets/...`), each checked to resolve and
    read (a dataset is fetched and cached here, before any model loads); a bad one exits with status 2."""
    from ..eval.hf_prompts import DatasetSpec
    from ..eval.prompts import load_prompt_set

    option = args.sets_option
    specs = list(getattr(args, option.lstrip("-").replace("-", "_")) or [])
    try:
        if args.dataset:
            specs.append(DatasetSpec(args.dataset, args.split, args.field).uri)
        if not specs:
            raise ValueError(f"give at least one prompt set: {PROMPT_SPEC_HELP}")
        for spec in specs:
            load_prompt_set(spec)
    except ValueError as error:
        args.parser.error(f"{option}: {error}")
    return specs
