"""Moved to `hf_dspark.scheduling` (one module per policy); kept as a re-export of its public functions."""

from .scheduling.expectation import expected_throughput  # noqa: F401
from .scheduling.fixed import schedule_fixed  # noqa: F401
from .scheduling.greedy import schedule_greedy  # noqa: F401
from .scheduling.lagged import capacity_from_survival, schedule_lagged  # noqa: F401
from .scheduling.padded import schedule_padded_greedy, schedule_padded_lagged  # noqa: F401
from .scheduling.threshold import schedule_threshold  # noqa: F401
from .step_curve import StepCurve  # noqa: F401
