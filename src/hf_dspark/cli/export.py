"""`hf-dspark export`: write a trained drafter in a serving-engine layout (registered by `hf_dspark.cli`)."""

from __future__ import annotations

import argparse


def cmd_export(args: argparse.Namespace) -> int:
    """Load the target (default: the embedded one) and the drafter, export, and print what was written."""
    from .export import export_from_paths, exported_summary

    out = export_from_paths(args.drafter, args.out, target_path=args.target, step_curve=args.step_curve,
                            dtype=args.dtype)
    print(f"wrote {out}: {exported_summary(out)}")
    print(f"launch settings for vLLM, SGLang and TensorRT-LLM: {out / 'README.md'}")
    return 0


def add_export_command(sub) -> None:
    """Register `export --format deepspec --drafter PATH OUT` on the `hf-dspark` subparsers."""
    export = sub.add_parser("export", help="write a drafter in the DeepSpec layout vLLM/SGLang/TensorRT-LLM load")
    export.add_argument("--format", choices=["deepspec"], default="deepspec", help="checkpoint layout to write")
    export.add_argument("--drafter", required=True, help="drafter folder (hf-dspark, DeepSpec or DFlash layout)")
    export.add_argument("--target", default=None, help="target causal LM path (default: the embedded SmolLM2)")
    export.add_argument("--step-curve", default=None, help="step_curve.json to ship (default: the drafter's own)")
    export.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the exported weights (the target is loaded in it)")
    export.add_argument("out", help="output folder")
    export.set_defaults(func=cmd_export)
