"""Kept import path: the `"auto"` planner lives in `hf_dspark.scheduling.cost_policy`."""

from ..scheduling.cost_policy import CostAwarePlanner, DraftPlan, seconds_per_call

__all__ = ["CostAwarePlanner", "DraftPlan", "seconds_per_call"]
