"""Moved to `hf_dspark.scheduling.padded`; kept as a re-export of its public names."""

from .scheduling.padded import (  # noqa: F401
    batch1_outlook,
    draft_or_decode,
    padded_throughput,
    padded_verify_seconds,
    schedule_padded_greedy,
    schedule_padded_lagged,
    sunk_cost_stop,
)
