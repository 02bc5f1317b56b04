"""`hf-dspark check-layout DRAFTER`: measure which block layout a drafter's weights were trained for
(`interop.probe_layout`), so a mislabelled checkpoint is caught before it is exported or served."""

from __future__ import annotations

import argparse
from pathlib import Path

from .loaders import existing_file, load_target, positive_int
from .validation import check_drafter_path

# Held-out prompt for the probe when no text is given, not from any training set of ours: a chat request of the kind
# drafters are trained on (the target's own replies to prompts), since a drafter drafts well only in-distribution.
DEFAULT_PROMPT = (
    "A bakery sells muffins for $3 each and cookies for $2 each. On Monday it sold 14 muffins and twice as many "
    "cookies. On Tuesday it sold 5 fewer muffins than on Monday and 8 more cookies than on Monday. How much money "
    "did the bakery make on the two days together?\nPlease reason step by step, and put your final answer within "
    "\\boxed{}."
)


def _prompt_ids(tokenizer, device):
    """The default prompt in the tokenizer's chat template (plain text without one), `[1, P]`."""
    import torch

    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": DEFAULT_PROMPT}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = DEFAULT_PROMPT
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]], device=device)


def cmd_check_layout(args: argparse.Namespace) -> int:
    """Load the target and drafter, probe both block readings, print the verdict; exit 1 when mislabelled."""
    import torch

    from ..drafter import DSparkDrafter
    from ..interop.probe import probe_layout

    check_drafter_path(args.parser, "DRAFTER", args.drafter)
    target, tokenizer = load_target(args.target, "float32", tokenizer=True, device=args.device)
    if args.text_file:  # the first quarter of the text is context only
        text = Path(args.text_file).read_text(encoding="utf-8")
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]], device=target.device)
        min_context = ids.shape[1] // 4
    else:  # the target's own greedy reply to a chat prompt, measured after the whole prompt
        ids = _prompt_ids(tokenizer, target.device)
        min_context = ids.shape[1]
        with torch.no_grad():
            ids = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id or 0,
            )
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target, assume_layout=args.assume_layout)
    probe = probe_layout(drafter, target, ids[0], max_positions=args.tokens, min_context=min_context)
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
        help="held-out UTF-8 text to probe on (its first quarter is context only; default: the target's reply to a "
        "built-in chat prompt)",
    )
    parser.add_argument(
        "--tokens",
        type=positive_int,
        default=128,
        help="anchor positions to measure (default text: the target's greedy reply to a built-in chat "
        "prompt, this many tokens, each drafted with the whole prompt as context)",
    )
    parser.add_argument(
        "--assume-layout",
        default=None,
        choices=ASSUME_LAYOUTS,
        help="read a config that records no or conflicting layouts this way (the probe measures both)",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the target")
    parser.set_defaults(func=cmd_check_layout, parser=parser)
