"""Up-front checks of a DSpark `generate` call: the `dspark_*` options and the shape of the inputs.

`DSparkGenerationOptions` holds the `dspark_*` options of one call (or engine), parsed and checked once from the
`dspark_*` attributes of a `GenerationConfig` (`generate(**kwargs)` puts them there) or built directly; each
field's `metadata["help"]` is the one description of the option, from which the README's table is rendered
(`options_markdown_table`).

Run before any forward pass, so a typo or an unsupported input fails at once with a message naming the input and
the fix, as plain `generate` does for unknown keyword arguments.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..scheduling.registry import available_policies, canonical_policy_name


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
        if not isinstance(value, str) or canonical_policy_name(value) not in available_policies():
            raise ValueError(f"dspark_policy must be one of {list(available_policies())} (or a name registered "
                             f"with hf_dspark.scheduling.register_policy), got {value!r}.")
    elif name in ("dspark_step_curve", "dspark_draft_curve"):
        if isinstance(value, (str, os.PathLike)):
            if not os.path.isfile(value):
                raise ValueError(f"{name}: no such file {os.fspath(value)!r} (save one with `hf-dspark profile`).")
        elif not hasattr(value, "steps_per_second_at"):
            raise ValueError(f"{name} must be a StepCurve or the path of its JSON file, got {value!r}.")
    elif name in ("dspark_record_confidence", "dspark_stock_loop", "dspark_measured_costs",
                  "dspark_packed_weights") and not isinstance(
        value, bool
    ):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    elif name == "dspark_policy_memory" and not callable(getattr(value, "for_mode", None)):
        raise ValueError(f"dspark_policy_memory must be a hf_dspark.scheduling.PolicyMemory, got {value!r}.")
    elif name == "dspark_observers":
        _check_observers(value)
    elif name == "dspark_tree_budget":
        _check_tree_budget(name, value)


def _check_tree_budget(name: str, value: Any) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0 or value == 1:
        raise ValueError(f"{name} must be 0 (chains) or an integer ≥ 2, the draft-tree nodes per row and round "
                         f"(the anchor included), got {value!r}.")


def _check_observers(value: Any) -> None:
    """`dspark_observers`: a list (or tuple) of objects with a callable `on_round(record)`."""
    if not isinstance(value, (list, tuple)):
        wrap = " (one observer: wrap it in a list, dspark_observers=[observer])" if hasattr(value, "on_round") else ""
        raise ValueError(f"dspark_observers must be a list of round observers (objects with an on_round(record) "
                         f"method), got {value!r} of type {type(value).__name__}{wrap}.")
    for index, observer in enumerate(value):
        if not callable(getattr(observer, "on_round", None)):
            raise ValueError(
                f"dspark_observers[{index}] ({observer!r} of type {type(observer).__name__}) has no "
                "on_round(record) method; an observer is an object with one (for a plain function f, pass "
                "types.SimpleNamespace(on_round=f))."
            )


@dataclass
class DSparkGenerationOptions:
    """The `dspark_*` generation options (each field's `metadata["help"]` says what it takes; None: the default).

    Args:
        dspark_policy: the verification policy's registered name (None: "auto").
        dspark_verify_len: ℓ of the "fixed" policy (None: γ).
        dspark_threshold: threshold of "threshold" (prefix survival) and "slot_threshold" (each slot) (None: 0.5).
        dspark_step_curve: the target's SPS(B) (None: looked up or profiled when the policy needs one).
        dspark_draft_curve: the drafter's cost curve, for "auto" (None: looked up or profiled).
        dspark_measured_costs: "auto" corrects its curves by earlier rounds' wall times (None: True).
        dspark_policy_memory: caller-owned memory through which "auto" learns across calls (None: this call only).
        dspark_observers: round observers, called every round.
        dspark_record_confidence: keep every round's confidence logits in the statistics.
        dspark_stock_loop: run transformers' own batch-1 assisted loop with the DSpark drafter.
        dspark_packed_weights: verify with oneDNN-packed weight copies (None: automatic).
        dspark_tree_budget: draft-tree nodes per row and round (0 / None: chains).
    """

    dspark_policy: str | None = field(
        default=None,
        metadata={
            "help": (
            "a registered policy name (hf_dspark.scheduling.available_policies(); default 'auto')"
            )
        },
    )
    dspark_verify_len: int | None = field(
        default=None,
        metadata={
            "help": (
            "an integer 0..γ, the fixed verification length (default γ)"
            )
        },
    )
    dspark_threshold: float | None = field(
        default=None,
        metadata={
            "help": (
            "a number in [0, 1], where 'threshold' and 'slot_threshold' cut the drafts (default 0.5)"
            )
        },
    )
    dspark_step_curve: Any = field(
        default=None,
        metadata={
            "help": (
            "a StepCurve or the path of one saved by `hf-dspark profile`"
            )
        },
    )
    dspark_draft_curve: Any = field(
        default=None,
        metadata={
            "help": (
            "a StepCurve (drafter proposals per second against rows) or its JSON path, for 'auto'"
            )
        },
    )
    dspark_measured_costs: bool | None = field(
        default=None,
        metadata={
            "help": (
            "True/False, let 'auto' correct its cost curves by earlier rounds' wall times (default True)"
            )
        },
    )
    dspark_policy_memory: Any = field(
        default=None,
        metadata={
            "help": (
            "a hf_dspark.scheduling.PolicyMemory through which 'auto' learns across calls (default: each call "
            "starts afresh)"
            )
        },
    )
    dspark_observers: Any = field(
        default=None,
        metadata={
            "help": (
            "a list of round observers (objects with on_round(record)), called every round"
            )
        },
    )
    dspark_record_confidence: bool | None = field(
        default=None,
        metadata={
            "help": (
            "True/False, keep every round's confidence logits in the statistics"
            )
        },
    )
    dspark_stock_loop: bool | None = field(
        default=None,
        metadata={
            "help": (
            "True/False, run transformers' own batch-1 assisted loop with the DSpark drafter"
            )
        },
    )
    dspark_packed_weights: bool | None = field(
        default=None,
        metadata={
            "help": (
            "True/False, verify with oneDNN-packed copies of the target's linear weights (unset: on for float32 "
            "CPU targets when the copies fit in memory)"
            )
        },
    )
    dspark_tree_budget: int | None = field(default=None, metadata={"help": (
        "an integer ≥ 2, verify draft trees of this many nodes per row and round, the anchor included "
        "(0 or unset: chains)"
    )})

    def __post_init__(self) -> None:
        for item in fields(self):  # each check names the field and what it accepts
            _check_value(item.name, getattr(self, item.name))

    @classmethod
    def from_generation_config(cls, generation_config: Any) -> DSparkGenerationOptions:
        """The `dspark_*` attributes of `generation_config` (others ignored; unset ones None)."""
        return cls(**{item.name: getattr(generation_config, item.name, None) for item in fields(cls)})


def option_help() -> dict[str, str]:
    """Option name -> what it takes, in field order (the names `validate_dspark_options` accepts)."""
    return {item.name: item.metadata["help"] for item in fields(DSparkGenerationOptions)}


def options_markdown_table() -> str:
    """The options as a Markdown table (`| option | what it takes |`), as the README shows it."""
    lines = ["| option | what it takes |", "|---|---|"]
    lines += [f"| `{name}` | {text.replace('|', chr(92) + '|')} |" for name, text in option_help().items()]
    return "\n".join(lines) + "\n"


# Every `dspark_*` generation option, with what it accepts.
DSPARK_OPTIONS: dict[str, str] = option_help()


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


def check_sampling_settings(do_sample: bool, temperature: Any, top_k: Any, top_p: Any) -> None:
    """Refuse sampling settings that are out of range or of the wrong type (None: unset), before any forward.

    transformers only checks some when it builds its warpers, and skips `top_p > 1` silently; this names each.
    """
    if temperature is not None and (not _is_number(temperature) or not 0.0 <= float(temperature) < math.inf):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}.")
    if do_sample and temperature is not None and float(temperature) == 0.0:
        raise ValueError("temperature=0 cannot be sampled from: set do_sample=False for greedy decoding, or a "
                         "temperature > 0.")
    if top_p is not None and (not _is_number(top_p) or not 0.0 < float(top_p) <= 1.0):
        raise ValueError(f"top_p must be a number in (0, 1] (the probability mass kept; 1 keeps every token), got "
                         f"{top_p!r}.")
    if top_k is not None and (not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or top_k < 0):
        raise ValueError(f"top_k must be an integer >= 0 (0 or None: no top-k filtering), got {top_k!r}.")


def eos_token_ids(value: Any) -> list[int]:
    """`eos_token_id` as a list of token ids: an int, a list/tuple of ints or an integer tensor (None: no EOS).

    Anything else (a token string, a float...) is a `ValueError` naming it, instead of an EOS that never matches.
    """
    if value is None:
        return []
    if isinstance(value, torch.Tensor) and not (value.dtype.is_floating_point or value.dtype.is_complex
                                                or value.dtype == torch.bool):
        value = value.reshape(-1).tolist()
    ids = list(value) if isinstance(value, (list, tuple)) else [value]
    bad = [i for i in ids if not isinstance(i, numbers.Integral) or isinstance(i, bool) or i < 0]
    if bad:
        raise ValueError(
            f"eos_token_id must be a token id (an int >= 0) or a list of them, got {value!r}; for a token string "
            "use tokenizer.convert_tokens_to_ids(token)."
        )
    return [int(i) for i in ids]


def check_decoding_settings(config: Any) -> None:
    """A `generate` call's `eos_token_id` (token ids) and, when it samples, its temperature / top-k / top-p;
    `config` is a `GenerationConfig` or any object with those attributes. A greedy call ignores the sampling
    settings, as plain `generate` does."""
    eos_token_ids(config.eos_token_id)
    if config.do_sample:
        check_sampling_settings(True, config.temperature, config.top_k, config.top_p)


def generation_config_options(generation_config) -> dict[str, Any]:
    """The `dspark_*` attributes set on a `GenerationConfig` (kwargs and config-file routes alike)."""
    return {key: value for key, value in vars(generation_config).items() if key.startswith("dspark_")}


def check_prompt_ids(input_ids: Any) -> None:
    """Refuse a prompt tensor with no tokens (`[B, 0]`): DSpark continues each row from its last prompt token."""
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() >= 1 and input_ids.shape[-1] == 0:
        raise ValueError(
            f"input_ids has no tokens (shape {list(input_ids.shape)}): a prompt needs at least one token per row "
            "(DSpark continues each row from its last one); pass at least the BOS token (tokenizer.bos_token_id)."
        )


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

