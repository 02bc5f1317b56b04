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


def _columns(rounds) -> dict[str, list[int]]:
    verify_len, accepted, committed = zip(*rounds) if rounds else ((), (), ())
    return {"verify_len": list(verify_len), "accepted": list(accepted), "committed": list(committed)}


def round_metrics(rounds) -> dict:
    """The `accepted_length` metric of rounds `[ℓ, m, c]`: tau, tau_without_bonus, acceptance_rate, rounds."""
    if not rounds:
        return {"tau": None, "tau_without_bonus": None, "acceptance_rate": None, "rounds": 0}
    return load_metric("accepted_length").compute(**_columns(rounds))


def position_metrics(rounds, block_size: int) -> dict:
    """The `position_acceptance` metric of rounds `[ℓ, m, c]`: conditional_acceptance and reached, per position."""
    if not rounds:
        return {"conditional_acceptance": [None] * block_size, "reached": [0] * block_size}
    return load_metric("position_acceptance").compute(**_columns(rounds), block_size=block_size)
