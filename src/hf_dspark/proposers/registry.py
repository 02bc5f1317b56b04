"""The one registry of drafters the command line builds by name: `register_proposer`, `get_proposer`,
`available_proposers`, and `build_proposer`, which builds one from a spec `NAME[:ARGUMENT]`.

`hf-dspark eval --drafters NAME=SPEC`, `bench serve --drafter SPEC` and `demo --drafter SPEC` look names up here
(`cli/loaders.py`); a spec whose NAME is not registered is a drafter folder, a Hub id or `untrained[:γ]`. Adding a
proposer is one factory and one `register_proposer` line (docs/adding-a-proposer.md).

A proposer takes one of two kinds of argument (`ProposerSpec.argument`):

- `"block_size"`: `NAME[:γ]` (γ an integer >= 1, default `DEFAULT_BLOCK_SIZE`); built as `factory(target, γ)`.
- `"drafter"`: `NAME:DRAFTER`, DRAFTER itself a spec (e.g. `hybrid:untrained:7`); the caller loads it, bound to the
  target, and the proposer is built as `factory(drafter)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

DEFAULT_BLOCK_SIZE = 7  # γ of `NAME` without `:γ`
_ARGUMENTS = ("block_size", "drafter")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class ProposerSpec:
    """A registered proposer.

    Args:
        name: its spelling in specs (lower-case letters, digits, `-`, `_`).
        factory: `factory(target, block_size)` or, with `argument="drafter"`, `factory(drafter)`; returns a
            `DraftModel` shaped for the target (the caller enables DSpark generate on the target:
            `hf_dspark.enable(target)`).
        argument: `"block_size"` (`NAME[:γ]`) or `"drafter"` (`NAME:DRAFTER`).
        description: one line for help texts and errors.
        needs_reference: proposes from reference continuations the caller sets after building it (the oracle's
            `reference`); commands with no references to give (`eval`) refuse it.
    """

    name: str
    factory: Callable[..., Any]
    argument: Literal["block_size", "drafter"] = "block_size"
    description: str = ""
    needs_reference: bool = False

    @property
    def usage(self) -> str:
        """How a spec spells it: `NAME[:γ]` or `NAME:DRAFTER`."""
        return f"{self.name}[:γ]" if self.argument == "block_size" else f"{self.name}:DRAFTER"

    def argument_error(self, argument: str) -> str | None:
        """Why `argument` (the text after `NAME:`) cannot build this proposer, or None."""
        example = f"{self.name}:{DEFAULT_BLOCK_SIZE}" if self.argument == "block_size" else f"{self.name}:untrained:7"
        if self.argument == "drafter":
            return None if argument else f"name the DSpark drafter after '{self.name}:', e.g. {example}"
        if argument and (not argument.isdigit() or int(argument) < 1):
            return f"γ after '{self.name}:' must be an integer >= 1, e.g. {example}"
        return None


_REGISTRY: dict[str, ProposerSpec] = {}


def register_proposer(
    name: str,
    factory: Callable[..., Any],
    *,
    argument: Literal["block_size", "drafter"] = "block_size",
    description: str = "",
    needs_reference: bool = False,
    overwrite: bool = False,
) -> None:
    """Make `name` a drafter spec (`NAME[:γ]`, or `NAME:DRAFTER` with `argument="drafter"`); see `ProposerSpec`.
    A second registration of a name raises unless `overwrite=True`."""
    if not isinstance(name, str) or not _NAME.match(name) or name == "untrained":
        raise ValueError(
            f"proposer name must be lower-case letters, digits, '-' or '_' (not 'untrained'), got {name!r}."
        )
    if not callable(factory):
        raise TypeError(f"register_proposer({name!r}, factory) needs a callable factory, got {factory!r}.")
    if argument not in _ARGUMENTS:
        raise ValueError(f"argument must be one of {_ARGUMENTS}, got {argument!r}.")
    spec = ProposerSpec(name, factory, argument, description, needs_reference)
    if name in _REGISTRY and _REGISTRY[name] != spec and not overwrite:
        raise ValueError(f"proposer {name!r} is already registered; pass overwrite=True to replace it.")
    _REGISTRY[name] = spec


def available_proposers() -> tuple[str, ...]:
    """Registered proposer names, in registration order (the built-ins first)."""
    return tuple(_REGISTRY)


def get_proposer(name: str) -> ProposerSpec:
    """The `ProposerSpec` registered under `name`; a `ValueError` listing the registered ones otherwise."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown proposer {name!r}; choose one of {list(_REGISTRY)} (or register yours with "
            "hf_dspark.proposers.register_proposer, docs/adding-a-proposer.md)."
        )
    return _REGISTRY[name]


def split_proposer_spec(spec: str) -> tuple[ProposerSpec, str] | None:
    """(proposer, argument) of a spec `NAME[:ARGUMENT]` whose NAME is registered; None for any other spec (a
    drafter folder, a Hub id, `untrained[:γ]`)."""
    name, _, argument = spec.partition(":")
    proposer = _REGISTRY.get(name)
    return None if proposer is None else (proposer, argument)


def build_proposer(target, spec: str, load_drafter: Callable[[str], Any]):
    """The drafter a registered spec names, shaped for `target` (enable DSpark generate on it to use it);
    `load_drafter(spec)` loads the DSpark drafter of a `NAME:DRAFTER` spec (bound to `target`). A `ValueError` for an
    unregistered NAME or a bad argument."""
    found = split_proposer_spec(spec)
    if found is None:
        get_proposer(spec.partition(":")[0])  # raises, listing the registered names
    proposer, argument = found
    problem = proposer.argument_error(argument)
    if problem is not None:
        raise ValueError(f"drafter spec {spec!r}: {problem}.")
    if proposer.argument == "drafter":
        return proposer.factory(load_drafter(argument))
    return proposer.factory(target, int(argument or DEFAULT_BLOCK_SIZE))


def proposers_help() -> str:
    """The registered specs, for help texts: `prompt-lookup[:γ]`, `hybrid:DRAFTER`, ..."""
    return ", ".join(f"`{spec.usage}`" for spec in _REGISTRY.values())


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ProposerSpec",
    "available_proposers",
    "build_proposer",
    "get_proposer",
    "proposers_help",
    "register_proposer",
    "split_proposer_spec",
]
