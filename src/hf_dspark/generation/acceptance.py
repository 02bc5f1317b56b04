"""Kept import path: the acceptance estimates live in `hf_dspark.scheduling.acceptance`."""

from ..scheduling.acceptance import (
    INFORMED_PRIOR_WEIGHT,
    PRIOR_CLIP,
    AcceptanceMemory,
    AcceptanceTracker,
    heldout_acceptance,
    observed_positions,
)

__all__ = [
    "INFORMED_PRIOR_WEIGHT",
    "PRIOR_CLIP",
    "AcceptanceMemory",
    "AcceptanceTracker",
    "heldout_acceptance",
    "observed_positions",
]
