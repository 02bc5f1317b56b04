"""`hf-dspark export`: write a trained drafter in a serving engine's own layout (docs/checkpoints.md)."""

from __future__ import annotations

import argparse

from .loaders import DTYPE_CHOICES, step_curve_file
from .validation import check_drafter_path, check_output_folder


def cmd_export(args: argparse.Namespace) -> int:
    """Load the target (default: the embedded one) and the drafter, export, and print what was written."""
    from ..interop.export import export_from_paths, exported_summary

    # Both before the target loads: the output folder first (the costlier mistake), then the drafter path.
    check_output_folder(args.parser, "OUT", args.out, args.overwrite, keep=(args.drafter, args.target))
    check_drafter_path(args.parser, "--drafter", args.drafter)
    out = export_from_paths(
        args.drafter,
        args.out,
        engine=args.engine,
        target_path=args.target,
        step_curve=args.step_curve,
        dtype=args.dtype,
        overwrite=args.overwrite,
        assume_layout=args.assume_layout,
    )
    print(f"wrote {out}: {exported_summary(out)}")
    print(f"launch settings (num_speculative_tokens = γ is required): {out / 'README.md'}")
    return 0


def add_export_command(sub) -> None:
    """Register `export --engine NAME --drafter PATH OUT` on the `hf-dspark` subparsers."""
    from ..interop.contracts import ENGINE_CONTRACTS
    from ..interop.layout_flags import ASSUME_LAYOUTS

    export = sub.add_parser(
        "export",
        help="write a drafter in the layout vLLM, SGLang, speculators, DeepSpec or TensorRT-LLM load",
    )
    export.add_argument(
        "--engine",
        "--format",
        dest="engine",
        choices=sorted({*ENGINE_CONTRACTS, *(name.replace("_", "-") for name in ENGINE_CONTRACTS)}),
        default="vllm",
        help="engine whose loader the folder is written for (refused, with the reason and the fix, "
        "when that engine cannot serve the drafter)",
    )
    export.add_argument("--drafter", required=True, help="drafter folder (hf-dspark, DeepSpec, DFlash or speculators)")
    export.add_argument("--target", default=None, help="target causal LM path (default: the embedded SmolLM2)")
    export.add_argument(
        "--step-curve",
        type=step_curve_file,
        default=None,
        help="step_curve.json (from `hf-dspark profile`) to ship (default: the drafter's own)",
    )
    export.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPE_CHOICES,
        help="dtype of the exported weights (default bfloat16, what the engines serve in)",
    )
    export.add_argument(
        "--assume-layout",
        default=None,
        choices=ASSUME_LAYOUTS,
        help="block layout of a drafter whose config records none or conflicting ones",
    )
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT when it is not empty (default: refuse a non-empty folder)",
    )
    export.add_argument("out", help="output folder (new or empty)")
    export.set_defaults(func=cmd_export, parser=export)
