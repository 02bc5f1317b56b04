"""The project's metrics as `evaluate` modules: each folder here is loadable with `evaluate.load(metric_path(name))`.

- `accepted_length`: τ per round, with and without the bonus token (inputs: verified ℓ, accepted m, committed c);
- `position_acceptance`: P(position k accepted | positions < k accepted), k = 1..γ (same inputs);
- `calibration_error`: expected calibration error of confidences against realised acceptance;
- `final_answer_match`: exact match of final answers (`\\boxed{...}` or the last number) of generated texts.

Their `_compute` calls the library's functions (`eval.acceptance_metrics`, `ops.calibration`), so `hf-dspark eval`
and a user's `evaluate.load` give the same numbers.
"""

from __future__ import annotations

import functools
from pathlib import Path

METRICS = ("accepted_length", "position_acceptance", "calibration_error", "final_answer_match")


def metric_path(name: str) -> str:
    """The folder of the shipped metric `name` (one of `METRICS`), to pass to `evaluate.load`."""
    if name not in METRICS:
        raise ValueError(f"no shipped metric {name!r}; the shipped ones are {', '.join(METRICS)}")
    return str(Path(__file__).parent / name)


@functools.cache
def load_metric(name: str):
    """`evaluate.load(metric_path(name))`, loaded once per process."""
    import evaluate

    return evaluate.load(metric_path(name))
