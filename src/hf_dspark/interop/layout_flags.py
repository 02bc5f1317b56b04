"""The block-layout flag in every spelling the engines and trainers use, read and written consistently.

Two block conventions exist for the same weights (docs/checkpoints.md, "Block layouts"):

- anchor-first (DSpark, DeepSpec, hf-dspark): the block is [x_0, mask × (γ − 1)] and slot k drafts the token after
  it, so γ slots give γ drafts;
- anchor + γ masks (z-lab DFlash, SpecForge, "1 + N"): the block is [x_0, mask × γ] and slot k drafts the token at
  its own position, so γ + 1 slots give γ drafts.

Each stack spells the flag differently, and some read it from `dflash_config`:

| spelling | anchor-first when | read by |
|---|---|---|
| `sample_from_anchor` | true | vLLM (some versions), speculators, DeepSpec DFlash-1 checkpoints |
| `dspark_bonus_anchor` | false | vLLM (other versions), vLLM's speculators adapter |
| `query_zero_predicts_next` | true | newer DFlash checkpoints and the SGLang DFLASH proposals |
| `shift_label` | true | TensorRT-LLM / speculators DFlash discussions (the polarity seen there) |

A config that declares two values is refused; one that declares none takes the default of its format when that
format has one (DeepSpec: anchor-first; z-lab DFlash and SpecForge: anchor + γ masks), and is refused otherwise.
`assume_layout` ("anchor-first" or "dflash") overrides both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)

ANCHOR_FIRST = "anchor-first"
ANCHOR_PLUS_MASKS = "dflash"
ASSUME_LAYOUTS = (ANCHOR_FIRST, ANCHOR_PLUS_MASKS)
# key -> whether a true value means anchor-first
LAYOUT_KEYS = {
    "sample_from_anchor": True,
    "dspark_bonus_anchor": False,
    "query_zero_predicts_next": True,
    "shift_label": True,
}
NESTED = "dflash_config"


def layout_name(sample_from_anchor: bool) -> str:
    """"anchor-first" or "dflash" (anchor + γ masks) for a `sample_from_anchor` value."""
    return ANCHOR_FIRST if sample_from_anchor else ANCHOR_PLUS_MASKS


def check_assume_layout(assume_layout: str | None) -> bool | None:
    """`sample_from_anchor` for an `assume_layout` value (None passes through); ValueError naming the choices."""
    if assume_layout is None:
        return None
    if assume_layout not in ASSUME_LAYOUTS:
        raise ValueError(f"assume_layout must be one of {ASSUME_LAYOUTS} (or None), got {assume_layout!r}.")
    return assume_layout == ANCHOR_FIRST


def declared_layouts(raw: dict[str, Any]) -> dict[str, bool]:
    """Every layout spelling a config dict declares, top level or in `dflash_config`, as `sample_from_anchor`
    values keyed by where it was found (e.g. `"dflash_config.query_zero_predicts_next"`)."""
    found: dict[str, bool] = {}
    inner = raw.get(NESTED) if isinstance(raw.get(NESTED), dict) else {}
    for where, source in (("", raw), (f"{NESTED}.", inner)):
        for key, anchor_when_true in LAYOUT_KEYS.items():
            value = source.get(key)
            if value is None:
                continue
            if not isinstance(value, bool):
                raise ValueError(f"{where}{key} must be true or false, got {value!r}.")
            found[where + key] = value if anchor_when_true else not value
    return found


def resolve_layout(
    raw: dict[str, Any], config_file: Path, format_default: bool | None, format_name: str,
    assume_layout: str | None = None,
) -> bool:
    """`sample_from_anchor` of a foreign config: its declared spellings (which must agree), else the format's own
    default, else `assume_layout`; ValueError naming the file, the spellings and the fix otherwise."""
    assumed = check_assume_layout(assume_layout)
    declared = declared_layouts(raw)
    values = set(declared.values())
    if assumed is not None:
        if values and values != {assumed}:
            logger.warning(
                f"{config_file} declares {_describe(declared)}; reading it as {assume_layout} because assume_layout "
                "says so."
            )
        return assumed
    fix = (f"correct the config, or pass assume_layout='{ANCHOR_FIRST}' or '{ANCHOR_PLUS_MASKS}' (CLI "
           "--assume-layout) once you know how the weights were trained (`hf-dspark check-layout` measures it)")
    if len(values) > 1:
        raise ValueError(f"{config_file} declares conflicting block layouts: {_describe(declared)}; {fix}.")
    if values:
        return values.pop()
    if format_default is None:
        raise ValueError(
            f"{config_file} ({format_name}) records no block layout (none of {sorted(LAYOUT_KEYS)}, top level or in "
            f"{NESTED}) and that format has no fixed one; {fix}."
        )
    return format_default


def _describe(declared: dict[str, bool]) -> str:
    return ", ".join(f"{key} -> {layout_name(value)}" for key, value in sorted(declared.items()))


def layout_fields(sample_from_anchor: bool) -> dict[str, bool]:
    """Every spelling, with the value meaning `sample_from_anchor` (for a top-level or `dflash_config` dict)."""
    return {key: sample_from_anchor if anchor_when_true else not sample_from_anchor
            for key, anchor_when_true in LAYOUT_KEYS.items()}


__all__ = [
    "ANCHOR_FIRST",
    "ANCHOR_PLUS_MASKS",
    "ASSUME_LAYOUTS",
    "LAYOUT_KEYS",
    "check_assume_layout",
    "declared_layouts",
    "layout_fields",
    "layout_name",
    "resolve_layout",
]
