"""The one registry of verification-length policies: `register_policy`, `get_policy`, `available_policies`, and
`build_policy`, which builds one from the shared `PolicySettings` and the generic option mapping.

`generate` (`dspark_policy`), `DSparkEngine`, the CLI and the benchmarks all look policies up here. Adding a
policy is one class (a `BasePolicy` subclass, with its own `options_class` when it has settings;
docs/adding-a-policy.md) and one `register_policy` line.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping
from typing import Any

from .base import OPTION_PREFIX, BasePolicy, PolicyOptions
from .records import PolicySettings

NO_SPECULATION = "none"  # the one spelling of "no drafter: plain decoding" (engine, CLI, benchmarks)
DEFAULT_POLICY = "auto"  # the policy of a call that names none (`generate`, the engine, the CLI)
_REGISTRY: dict[str, type[BasePolicy]] = {}
_DEPRECATED: dict[str, str] = {"scheduler": "lagged_padded"}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def register_policy(name: str, cls: type[BasePolicy], *, overwrite: bool = False) -> None:
    """Make `cls` available as `dspark_policy=name`.

    name: lower-case identifier (letters, digits, `_`), not `"none"`; cls: a `BasePolicy` subclass (built as
    `cls(settings, options)` by `build_policy`), whose class attributes declare what it needs and does. A second
    registration of a name raises unless `overwrite=True`.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"policy name must be a lower-case identifier such as 'my_policy', got {name!r}.")
    if name == NO_SPECULATION or name in _DEPRECATED:
        raise ValueError(f"policy name {name!r} is reserved; choose another name.")
    if not isinstance(cls, type):
        raise TypeError(f"register_policy({name!r}, cls) needs a class, got {cls!r}; register the class itself.")
    if not issubclass(cls, BasePolicy):
        methods = ("plan", "lengths", "observe", "observe_round", "forget")
        missing = [attr for attr in methods if not hasattr(cls, attr)]
        raise TypeError(
            f"{cls.__name__} is not a policy (missing {', '.join(missing) or 'the declared capabilities'}); "
            "subclass hf_dspark.scheduling.BasePolicy."
        )
    _check_declarations(cls)
    if name in _REGISTRY and _REGISTRY[name] is not cls and not overwrite:
        raise ValueError(
            f"policy {name!r} is already registered ({_REGISTRY[name].__name__}); pass overwrite=True to replace it."
        )
    _REGISTRY[name] = cls


def _check_declarations(cls: type[BasePolicy]) -> None:
    """`cls` declares what it overrides (`plan` -> `plans_rows`, `observe` -> `learns`), and its `options_class` is
    a `PolicyOptions` dataclass."""
    overrides = {"plan": cls.plan is not BasePolicy.plan, "observe": cls.observe is not BasePolicy.observe}
    declared = {"plan": cls.plans_rows, "observe": cls.learns}
    for method, flag in (("plan", "plans_rows"), ("observe", "learns")):
        if overrides[method] and not declared[method]:
            raise TypeError(
                f"{cls.__name__} overrides {method}() but does not declare {flag} = True; the loop calls "
                f"{method}() only for policies that declare it. Add `{flag} = True` to the class."
            )
    options = cls.options_class
    if not (isinstance(options, type) and issubclass(options, PolicyOptions) and dataclasses.is_dataclass(options)):
        raise TypeError(
            f"{cls.__name__}.options_class must be a dataclass subclassing hf_dspark.scheduling.PolicyOptions, "
            f"got {options!r}."
        )


def canonical_policy_name(name: str) -> str:
    """`name` stripped and lower-cased, with deprecated spellings mapped to their policy (with a warning)."""
    if not isinstance(name, str):
        raise ValueError(f"a policy name must be a string, got {name!r}; choose one of {available_policies()}.")
    key = name.strip().lower()
    if key in _DEPRECATED:
        warnings.warn(f"policy name {key!r} is deprecated; use {_DEPRECATED[key]!r}.", FutureWarning, stacklevel=3)
        key = _DEPRECATED[key]
    return key


def get_policy(name: str) -> type[BasePolicy]:
    """The class registered under `name` (case-insensitive); a `ValueError` naming the known policies otherwise."""
    key = canonical_policy_name(name)
    if key not in _REGISTRY:
        raise ValueError(
            f"Unknown policy {name!r}; choose one of {list(available_policies())} (or register "
            "yours with hf_dspark.scheduling.register_policy)."
        )
    return _REGISTRY[key]


def available_policies() -> tuple[str, ...]:
    """Registered policy names, in registration order (the built-ins first)."""
    return tuple(_REGISTRY)


def policy_option_names() -> tuple[str, ...]:
    """Every option a registered policy declares (the fields of their `options_class`), sorted."""
    return tuple(sorted({item.name for cls in _REGISTRY.values() for item in dataclasses.fields(cls.options_class)}))


def build_policy(name: str, settings: PolicySettings, options: Mapping[str, Any] | None = None) -> BasePolicy:
    """The policy registered under `name`, built from the shared `settings` and its own options.

    options: the generic option mapping (`{"verify_len": 2}` or `generate`'s `{"dspark_verify_len": 2}`); each
    policy reads the fields its `options_class` declares (None values keep their defaults). Every given value is
    validated by the policies that declare it, also when another policy is chosen (which ignores it); a non-None
    key that no registered policy declares raises, naming the known ones.
    """
    cls = get_policy(name)
    options = check_policy_options(options or {})
    built = cls.options_class.from_mapping(options)
    built.check(settings)
    return cls(settings, built)


def check_policy_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` (a copy), each non-None value validated by every registered policy that declares it; a key that
    none declares raises, naming the known options."""
    options = dict(options)
    known = set(policy_option_names())
    unknown = [key for key, value in options.items() if value is not None and _bare(key) not in known]
    if unknown:
        raise ValueError(
            f"unknown policy option(s) {unknown}; the registered policies take {sorted(known)} (each policy's "
            "options_class declares its own)."
        )
    for options_class in dict.fromkeys(cls.options_class for cls in _REGISTRY.values()):
        options_class.from_mapping(options)  # each declared value through its own __post_init__
    return options


def _bare(key: str) -> str:
    return key[len(OPTION_PREFIX):] if key.startswith(OPTION_PREFIX) else key


__all__ = [
    "DEFAULT_POLICY",
    "NO_SPECULATION",
    "available_policies",
    "build_policy",
    "canonical_policy_name",
    "check_policy_options",
    "get_policy",
    "policy_option_names",
    "register_policy",
]
