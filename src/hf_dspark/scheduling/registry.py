"""The one registry of verification-length policies: `register_policy`, `get_policy`, `available_policies`.

`generate` (`dspark_policy`), `DSparkEngine`, the CLI and the benchmarks all look policies up here. Adding a
policy is one class (a `BasePolicy` subclass, docs/adding-a-policy.md) and one `register_policy` line.
"""

from __future__ import annotations

import re
import warnings

from .base import Policy

NO_SPECULATION = "none"  # the one spelling of "no drafter: plain decoding" (engine, CLI, benchmarks)
_REGISTRY: dict[str, type] = {}
_DEPRECATED: dict[str, str] = {"scheduler": "lagged_padded"}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def register_policy(name: str, cls: type, *, overwrite: bool = False) -> None:
    """Make `cls` available as `dspark_policy=name`.

    name: lower-case identifier (letters, digits, `_`), not `"none"`; cls: a class whose instances satisfy
    `Policy` (built as `cls(settings)` from a `PolicySettings`; subclass `BasePolicy`). A second registration of a
    name raises unless `overwrite=True`.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"policy name must be a lower-case identifier such as 'my_policy', got {name!r}.")
    if name == NO_SPECULATION or name in _DEPRECATED:
        raise ValueError(f"policy name {name!r} is reserved; choose another name.")
    if not isinstance(cls, type):
        raise TypeError(f"register_policy({name!r}, cls) needs a class, got {cls!r}; register the class itself.")
    missing = [
        attr
        for attr in ("plan", "lengths", "observe", "observe_round", "forget", "needs_step_curve", "needs_confidence")
        if not hasattr(cls, attr)
    ]
    if missing:
        raise TypeError(
            f"{cls.__name__} does not implement the Policy protocol (missing {', '.join(missing)}); "
            "subclass hf_dspark.scheduling.BasePolicy."
        )
    if name in _REGISTRY and _REGISTRY[name] is not cls and not overwrite:
        raise ValueError(
            f"policy {name!r} is already registered ({_REGISTRY[name].__name__}); pass overwrite=True to replace it."
        )
    _REGISTRY[name] = cls


def canonical_policy_name(name: str) -> str:
    """`name` stripped and lower-cased, with deprecated spellings mapped to their policy (with a warning)."""
    if not isinstance(name, str):
        raise ValueError(f"a policy name must be a string, got {name!r}; choose one of {available_policies()}.")
    key = name.strip().lower()
    if key in _DEPRECATED:
        warnings.warn(f"policy name {key!r} is deprecated; use {_DEPRECATED[key]!r}.", FutureWarning, stacklevel=3)
        key = _DEPRECATED[key]
    return key


def get_policy(name: str) -> type:
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


__all__ = ["NO_SPECULATION", "Policy", "available_policies", "canonical_policy_name", "get_policy", "register_policy"]
