"""Up-front checks of a DSpark `generate` call: the `dspark_*` options and the shape of the inputs.

Run before any forward pass, so a typo or an unsupported input fails at once with a message naming the input and
the fix, as plain `generate` does for unknown keyword arguments.
"""

from __future__ import annotations

import difflib
import numbers
import os
from collections.abc import Mapping
from typing import Any

import torch

# Every `dspark_*` generation option, with what it accepts (see `hf_dspark.generation.policy`).
DSPARK_OPTIONS: dict[str, str] = {
    "dspark_policy": "a policy name (see hf_dspark.generation.policy.POLICIES)",
    "dspark_verify_len": "an integer 0..γ, the fixed verification length",
    "dspark_threshold": "a number in [0, 1], the prefix-survival threshold of the 'threshold' policy",
    "dspark_step_curve": "a StepCurve or the path of one saved by `hf-dspark profile`",
    "dspark_draft_curve": "a StepCurve (drafter proposals per second against rows) or its JSON path, for 'auto'",
    "dspark_measured_costs": "True/False, let 'auto' correct its cost curves by earlier rounds' wall times",
    "dspark_observers": "a list of round observers (objects with on_round(record)), called every round",
    "dspark_record_confidence": "True/False, keep every round's confidence logits in the statistics",
    "dspark_stock_loop": "True/False, run transformers' own batch-1 assisted loop with the DSpark drafter",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_value(name: str, value: Any) -> None:
    if value is None:
        return
    if name == "dspark_threshold":
        if not _is_number(value) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(
                f"dspark_threshold must be a number in [0, 1] (a prefix-survival probability; 0 verifies every "
                f"draft, 1 only certain ones), got {value!r}."
            )
    elif name == "dspark_verify_len":
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise ValueError(f"dspark_verify_len must be a non-negative integer (at most γ), got {value!r}.")
    elif name == "dspark_policy":
        from .policy import POLICIES

        if value not in POLICIES:
            raise ValueError(f"dspark_policy must be one of {POLICIES}, got {value!r}.")
    elif name in ("dspark_step_curve", "dspark_draft_curve"):
        if isinstance(value, (str, os.PathLike)):
            if not os.path.isfile(value):
                raise ValueError(f"{name}: no such file {os.fspath(value)!r} (save one with `hf-dspark profile`).")
        elif not hasattr(value, "steps_per_second_at"):
            raise ValueError(f"{name} must be a StepCurve or the path of its JSON file, got {value!r}.")
    elif name in ("dspark_record_confidence", "dspark_stock_loop", "dspark_measured_costs") and not isinstance(
        value, bool
    ):
        raise ValueError(f"{name} must be True or False, got {value!r}.")


def validate_dspark_options(options: Mapping[str, Any]) -> None:
    """Reject unknown `dspark_*` names (typos) and out-of-range values; `options` maps names to values.

    Names that do not start with `dspark_` are ignored (they belong to transformers).
    """
    names = [name for name in options if isinstance(name, str) and name.startswith("dspark_")]
    unknown = [name for name in names if name not in DSPARK_OPTIONS]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, DSPARK_OPTIONS, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"Unknown DSpark generate option(s): {', '.join(hints)}. Valid options: "
            f"{', '.join(DSPARK_OPTIONS)}."
        )
    for name in names:
        _check_value(name, options[name])


def generation_config_options(generation_config) -> dict[str, Any]:
    """The `dspark_*` attributes set on a `GenerationConfig` (kwargs and config-file routes alike)."""
    return {key: value for key, value in vars(generation_config).items() if key.startswith("dspark_")}


def check_left_padded(attention_mask: torch.Tensor | None) -> None:
    """Refuse right padding (a 0 after a 1 in a row of `attention_mask` `[B, L]`).

    Decoder-only generation continues each row from its last position; with right padding the new tokens would
    follow the pad tokens, and plain `generate` only warns and returns a continuation of the padding.
    """
    if attention_mask is None or attention_mask.dim() != 2:
        return
    seen = attention_mask.bool().long().cummax(dim=1).values.bool()
    holes = seen & ~attention_mask.bool()
    if bool(holes.any()):
        rows = holes.any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"attention_mask has padding after real tokens in row(s) {rows} (right padding). DSpark continues "
            "each row from its last real token and needs left-padded batches: set `tokenizer.padding_side = "
            '"left"` before tokenizing.'
        )

