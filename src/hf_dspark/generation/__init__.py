"""generate(assistant_model=drafter) integration and the batched DSpark loop."""

from .dispatch import disable, enable

__all__ = ["disable", "enable"]
