"""Kept import path: the wall-time cost correction lives in `hf_dspark.scheduling.cost_correction`."""

from ..scheduling.cost_correction import CostCorrection, running_log_mean

__all__ = ["CostCorrection", "running_log_mean"]
