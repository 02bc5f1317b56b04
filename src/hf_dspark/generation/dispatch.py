"""Route `target.generate(assistant_model=<DSparkDrafter>)` to the DSpark loop (placeholder until the loop lands)."""

from __future__ import annotations


def enable(target) -> None:
    return None


def disable(target) -> None:
    return None
