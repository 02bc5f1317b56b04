"""`hf-dspark check-layout DRAFTER`: measure which block layout a drafter's weights were trained for
(`interop.probe_layout`), so a mislabelled checkpoint is caught before it is exported or served."""

from __future__ import annotations

import argparse
from pathlib import Path

from .loaders import existing_file, load_target, positive_int
from .validation import check_drafter_path

# Held-out text for the probe when none is given: ordinary prose, not from any training set of ours.
DEFAULT_TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk. From the top he could see the fishing "
    "boats returning to the harbour, their lamps swaying with the swell, and the long line of the coast fading into "
    "the dark. He wrote the weather in a small book: wind from the west, light rain, the sea calm by midnight."
)


def cmd_check_layout(args: argparse.Namespace) -> int:
    """Load the target and drafter, probe both block readings, print the verdict; exit 1 when mislabelled."""
    import torch

    from ..interop.probe import probe_layout
    from ..modeling_dspark import DSparkDrafter

    check_drafter_path(args.parser, "DRAFTER", args.drafter)
    target, tokenizer = load_target(args.target, "float32", tokenizer=True, device=args.device)
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else DEFAULT_TEXT
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]], device=target.device)
    if not args.text_file:  # the target's own greedy continuation: text the drafter should draft well
        with torch.no_grad():
            ids = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id or 0,
            )
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target, assume_layout=args.assume_layout)
    probe = probe_layout(drafter, target, ids[0, -(args.tokens + 1) :], max_positions=args.tokens)
    print(f"{args.drafter}: {probe.summary()}")
    return 1 if probe.matches is False else 0


def add_check_layout_command(sub) -> None:
    """Register `check-layout DRAFTER [--target T]` on the `hf-dspark` subparsers."""
    from ..interop.layout_flags import ASSUME_LAYOUTS

    parser = sub.add_parser("check-layout", help="measure which block layout a drafter's weights were trained for")
    parser.add_argument("drafter", help="drafter folder (hf-dspark, DeepSpec, DFlash, SpecForge or speculators)")
    parser.add_argument("--target", default=None, help="target causal LM path (default: the embedded SmolLM2)")
    parser.add_argument(
        "--text-file",
        type=existing_file,
        default=None,
        help="held-out UTF-8 text to probe on (default: a built-in paragraph)",
    )
    parser.add_argument(
        "--tokens",
        type=positive_int,
        default=128,
        help="anchor positions to measure (default text: the target's greedy continuation of a "
        "built-in paragraph, this many tokens)",
    )
    parser.add_argument(
        "--assume-layout",
        default=None,
        choices=ASSUME_LAYOUTS,
        help="read a config that records no or conflicting layouts this way (the probe measures both)",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the target")
    parser.set_defaults(func=cmd_check_layout, parser=parser)
