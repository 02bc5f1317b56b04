"""The `dspark_*` options of one DSpark `generate` call (or engine), parsed and checked once.

`DSparkGenerationOptions` is built once where DSpark takes a call over, from the `dspark_*` attributes of the
per-call `GenerationConfig` (`generate(**kwargs)` puts the `dspark_*` keywords there:
`DSparkGenerationOptions.from_generation_config`), and passed down to the loop, the policy and the engine;
nothing re-reads the config. Each field is checked by its own validator in `__post_init__` (PEFT-config style; the
message names the option and what it takes), and each field's `metadata["help"]` is the one description of the
option, from which the README's table is rendered (`options_markdown_table`).

A verification policy's own settings (`dspark_verify_len` of "fixed", `dspark_threshold` of "threshold" and
"slot_threshold", ...) are not fields here: each policy declares them, with their defaults and validation, in its
`options_class` (`hf_dspark.scheduling.base.PolicyOptions`). `policy_options` carries the ones a call sets,
checked by `hf_dspark.scheduling.registry.check_policy_options`, and the policy is built from them.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from ..scheduling.base import OPTION_PREFIX
from ..scheduling.registry import (
    DEFAULT_POLICY,
    available_policies,
    canonical_policy_name,
    check_policy_options,
    get_policy,
    policy_option_names,
)


def _check_policy(name: str, value: Any) -> None:
    if not isinstance(value, str) or canonical_policy_name(value) not in available_policies():
        raise ValueError(f"{name} must be one of {list(available_policies())} (or a name registered with "
                         f"hf_dspark.scheduling.register_policy), got {value!r}.")


def _check_curve(name: str, value: Any) -> None:
    if isinstance(value, (str, os.PathLike)):
        if not os.path.isfile(value):
            raise ValueError(f"{name}: no such file {os.fspath(value)!r} (save one with `hf-dspark profile`).")
    elif not hasattr(value, "steps_per_second_at"):
        raise ValueError(f"{name} must be a StepCurve or the path of its JSON file, got {value!r}.")


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}.")


def _check_memory(name: str, value: Any) -> None:
    if not callable(getattr(value, "for_mode", None)):
        raise ValueError(f"{name} must be a hf_dspark.scheduling.PolicyMemory, got {value!r}.")


def _check_observers(name: str, value: Any) -> None:
    """A list (or tuple) of objects with a callable `on_round(record)`."""
    if not isinstance(value, (list, tuple)):
        wrap = " (one observer: wrap it in a list, dspark_observers=[observer])" if hasattr(value, "on_round") else ""
        raise ValueError(f"{name} must be a list of round observers (objects with an on_round(record) method), got "
                         f"{value!r} of type {type(value).__name__}{wrap}.")
    for index, observer in enumerate(value):
        if not callable(getattr(observer, "on_round", None)):
            raise ValueError(
                f"{name}[{index}] ({observer!r} of type {type(observer).__name__}) has no on_round(record) method; "
                "an observer is an object with one (for a plain function f, pass "
                "types.SimpleNamespace(on_round=f))."
            )


def _check_policy_options(name: str, value: Any) -> None:
    """`{"dspark_<option>": value}` of the options the registered policies declare, each value checked by them."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must map policy options to values (e.g. {{'dspark_verify_len': 2}}), got {value!r}.")
    check_policy_options(value)


def _check_tree_budget(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value == 1:
        raise ValueError(f"{name} must be 0 (chains) or an integer ≥ 2, the draft-tree nodes per row and round "
                         f"(the anchor included), got {value!r}.")


def _meta(help_text: str, check: Callable[[str, Any], None]) -> dict[str, Any]:
    """A field's metadata: its one description (`help`) and its validator (`check(name, value)`, run when not
    None)."""
    return {"help": help_text, "check": check}


@dataclass
class DSparkGenerationOptions:
    """The `dspark_*` options of one call (each field's `metadata["help"]` says what it takes; None: the default).

    Args:
        dspark_policy: the verification policy's registered name (None: "auto").
        dspark_step_curve: the target's SPS(B) (None: looked up or profiled when the policy needs one).
        dspark_draft_curve: the drafter's cost curve, for "auto" (None: looked up or profiled).
        dspark_measured_costs: "auto" corrects its curves by earlier rounds' wall times (None: True).
        dspark_policy_memory: caller-owned memory through which "auto" learns across calls (None: this call only).
        dspark_observers: round observers, called every round.
        dspark_record_confidence: keep every round's confidence logits in the statistics.
        dspark_stock_loop: run transformers' own batch-1 assisted loop with the DSpark drafter.
        dspark_packed_weights: verify with oneDNN-packed weight copies (None: automatic).
        dspark_tree_budget: draft-tree nodes per row and round, the anchor included (0 / None: chains); under
            "auto" the most, each row's tree sized by cost.
        policy_options: the policies' own options the call sets, by their `dspark_*` name (`dspark_verify_len`,
            `dspark_threshold`, ...; `policy_option_help()` lists them), defaults and checks in each policy's
            `options_class`.
    """

    dspark_policy: str | None = field(default=None, metadata=_meta(
        "a registered policy name (hf_dspark.scheduling.available_policies(); default 'auto')", _check_policy
    ))
    dspark_step_curve: Any = field(
        default=None, metadata=_meta("a StepCurve or the path of one saved by `hf-dspark profile`", _check_curve)
    )
    dspark_draft_curve: Any = field(default=None, metadata=_meta(
        "a StepCurve (drafter proposals per second against rows) or its JSON path, for 'auto'", _check_curve
    ))
    dspark_measured_costs: bool | None = field(default=None, metadata=_meta(
        "True/False, let 'auto' correct its cost curves by earlier rounds' wall times (default True)", _check_flag
    ))
    dspark_policy_memory: Any = field(default=None, metadata=_meta(
        "a hf_dspark.scheduling.PolicyMemory through which 'auto' learns across calls (default: each call starts "
        "afresh)",
        _check_memory,
    ))
    dspark_observers: Any = field(default=None, metadata=_meta(
        "a list of round observers (objects with on_round(record)), called every round", _check_observers
    ))
    dspark_record_confidence: bool | None = field(default=None, metadata=_meta(
        "True/False, keep every round's confidence logits in the statistics", _check_flag
    ))
    dspark_stock_loop: bool | None = field(default=None, metadata=_meta(
        "True/False, run transformers' own batch-1 assisted loop with the DSpark drafter", _check_flag
    ))
    dspark_packed_weights: bool | None = field(default=None, metadata=_meta(
        "True/False, verify with oneDNN-packed copies of the target's linear weights (unset: on for float32 CPU "
        "targets when the copies fit in memory)",
        _check_flag,
    ))
    dspark_tree_budget: int | None = field(default=None, metadata=_meta(
        "an integer ≥ 2, verify draft trees of this many nodes per row and round, the anchor included; under 'auto' "
        "the most, each row's tree sized by cost (0 or unset: chains)", _check_tree_budget,
    ))
    policy_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "the policies' own options (see policy_option_help())", "check": _check_policy_options},
    )

    def __post_init__(self) -> None:
        for item in fields(self):  # each field by its own validator, which names it and what it accepts
            value = getattr(self, item.name)
            if value is not None:
                item.metadata["check"](item.name, value)

    @property
    def policy_name(self) -> str:
        """The canonical name of the chosen policy (`DEFAULT_POLICY` when unset)."""
        return canonical_policy_name(self.dspark_policy or DEFAULT_POLICY)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> DSparkGenerationOptions:
        """The `dspark_*` entries of `options` (other names ignored: they belong to transformers); an unknown
        `dspark_*` name is refused, with the closest known one."""
        given = {name: value for name, value in options.items() if isinstance(name, str)
                 and name.startswith(OPTION_PREFIX)}
        check_option_names(given)
        own = set(own_option_names())
        return cls(
            **{name: value for name, value in given.items() if name in own},
            policy_options={name: value for name, value in given.items() if name not in own and value is not None},
        )

    @classmethod
    def from_generation_config(cls, generation_config: Any, **overrides: Any) -> DSparkGenerationOptions:
        """The `dspark_*` attributes of `generation_config` (a `GenerationConfig`; unset ones None), with
        `overrides` (options passed beside it) replacing them."""
        return cls.from_mapping({**vars(generation_config), **overrides})


OBSERVERS = "dspark_observers"  # the option whose values (the caller's objects) must never be copied


def configured_option(generation_config: Any, name: str) -> Any:
    """The value of option `name` set on `generation_config` (None when unset), unchecked: for moving an option
    between configs (`dispatch`), never for reading what it means (parse `DSparkGenerationOptions` for that)."""
    return vars(generation_config).get(name)


def own_option_names() -> list[str]:
    """The `dspark_*` fields of `DSparkGenerationOptions`, in field order."""
    return [item.name for item in fields(DSparkGenerationOptions) if item.name.startswith(OPTION_PREFIX)]


def option_names() -> list[str]:
    """Every `dspark_*` option a call may set: the own fields, then the registered policies' options."""
    return own_option_names() + [OPTION_PREFIX + name for name in policy_option_names()]


def check_option_names(options: Mapping[str, Any]) -> None:
    """Refuse unknown `dspark_*` names (typos) in `options`, naming the closest known one and every valid one."""
    known = option_names()
    unknown = [name for name in options if name.startswith(OPTION_PREFIX) and name not in known]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ValueError(f"Unknown DSpark generate option(s): {', '.join(hints)}. Valid options: {', '.join(known)}.")


def _args_help(cls: type) -> dict[str, str]:
    """The `Args:` entries of `cls`'s docstring (name -> text, continuation lines joined)."""
    found: dict[str, str] = {}
    current = None
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    for line in lines[next((i + 1 for i, text in enumerate(lines) if text.strip() == "Args:"), len(lines)):]:
        stripped = line.strip()
        if not stripped:
            break
        name, colon, text = stripped.partition(":")
        if colon and line.startswith("    ") and not line.startswith("     ") and name.isidentifier():
            current, found[name] = name, text.strip()
        elif current is not None:
            found[current] += " " + stripped
    return found


def policy_option_help() -> dict[str, str]:
    """`dspark_<option>` -> what it takes and which policies read it, for the registered policies' options (from
    each `options_class`'s `Args:`)."""
    described: dict[str, str] = {}
    readers: dict[str, list[str]] = {}
    for policy in available_policies():
        options_class = get_policy(policy).options_class
        texts = _args_help(options_class)
        for item in fields(options_class):
            readers.setdefault(item.name, []).append(repr(policy))
            default = f"; default {item.default!r}" if item.default not in (None, MISSING) else ""
            text = texts.get(item.name, f"an option of {options_class.__name__}").rstrip(".")
            text = text.replace(f"`{OPTION_PREFIX}{item.name}`; ", "").replace(f" (`{OPTION_PREFIX}{item.name}`)", "")
            described.setdefault(item.name, f"{text}{default}")
    return {
        OPTION_PREFIX + name: f"{described[name]}; read by {', '.join(readers[name])}" for name in sorted(described)
    }


def option_help() -> dict[str, str]:
    """Option name -> what it takes: the own fields in field order, then the policies' options."""
    own = {item.name: item.metadata["help"] for item in fields(DSparkGenerationOptions)
           if item.name.startswith(OPTION_PREFIX)}
    return own | policy_option_help()


def options_markdown_table() -> str:
    """The options as a Markdown table (`| option | what it takes |`), as the README shows it."""
    lines = ["| option | what it takes |", "|---|---|"]
    lines += [f"| `{name}` | {text.replace('|', chr(92) + '|')} |" for name, text in option_help().items()]
    return "\n".join(lines) + "\n"
