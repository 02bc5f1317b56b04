"""Where `generate` and the engine find a cost curve the caller did not pass, handed in rather than imported.

The step curve SPS(B) of a target and the cost curve of a drafter are looked up (or profiled once) by
`hf_dspark.profiling.target_steps` and `hf_dspark.profiling.draft_steps`, which sit above `generation`: they time verification forwards
built from its pieces. `CURVE_SOURCES` holds the two look-ups; the package (`hf_dspark/__init__.py`) fills it on
import, which always runs before any of its modules does. A caller may replace one, e.g. to refuse
profiling in a service (`CURVE_SOURCES.step_curve = my_lookup`), or pass the curves explicitly
(`dspark_step_curve`, `dspark_draft_curve`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class CurveSources:
    """The look-ups of the curves a policy needs and the caller did not give.

    Attributes:
        step_curve: `(target, packed_weights) -> StepCurve`, the target's SPS(B) for its model, device, dtype and
            torch threads (`hf_dspark.profiling.target_steps.load_or_profile_step_curve`).
        draft_curve: `(drafter) -> StepCurve`, the drafter's proposals per second against rows
            (`hf_dspark.profiling.draft_steps.load_or_profile_draft_curve`).
    """

    step_curve: Callable[[Any, Any], Any] | None = None
    draft_curve: Callable[[Any], Any] | None = None

    def get(self, name: str) -> Callable[..., Any]:
        """The look-up `name`, or a RuntimeError naming it and the fix."""
        source = getattr(self, name)
        if source is None:
            raise RuntimeError(
                f"No {name.replace('_', ' ')} look-up is set: import the package (`import hf_dspark`), set "
                f"hf_dspark.profiling.curve_sources.CURVE_SOURCES.{name}, or pass generation_config.dspark_{name}."
            )
        return source


CURVE_SOURCES = CurveSources()
