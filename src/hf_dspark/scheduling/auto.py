"""`"auto"`: cost-aware drafting (plans from earlier rounds, `scheduling.cost_policy`), then the sunk-cost stop."""

from __future__ import annotations

import torch

from .acceptance import INFORMED_PRIOR_WEIGHT, AcceptanceMemory, AcceptanceTracker
from .base import BasePolicy
from .cost_policy import CostAwarePlanner
from .padded import sunk_cost_stop
from .records import DraftPlan, PolicySettings


class AutoPolicy(BasePolicy):
    """Drafts only when it is expected to pay (`CostAwarePlanner.plan`), at the planned L cut by the causal
    sunk-cost stop on this round's survivals (`sunk_cost_stop`). Its memory across calls is
    `settings.memory` (a `PolicyMemory` the caller owns; None: this call only)."""

    needs_step_curve = True

    def __init__(self, settings: PolicySettings) -> None:
        super().__init__(settings)
        gamma = settings.block_size
        memory = (
            settings.memory.for_mode(gamma, settings.greedy)
            if settings.memory is not None
            else AcceptanceMemory.empty(gamma)
        )
        prior = (
            {}
            if settings.acceptance_prior is None
            else {"prior": list(settings.acceptance_prior), "pool_prior_weight": INFORMED_PRIOR_WEIGHT}
        )
        tracker = AcceptanceTracker(gamma, memory, **prior)
        self.planner = CostAwarePlanner(
            tracker, settings.step_curve, settings.draft_curve, measured_costs=settings.measured_costs
        )
        self._plan = DraftPlan()

    def plan(self, rows, cap, draft_costs=None):
        self._plan = self.planner.plan(rows, cap, draft_costs)
        return self._plan

    def lengths(self, survival, rows, device):
        """The planned L, cut by the sunk-cost early stop on this round's survivals when there are any."""
        length = int(self._plan.length if self._plan.length is not None else self.settings.block_size)
        if survival is not None and not self._plan.probe:
            total = self._plan.batch_rows or rows
            priced = rows if self._plan.priced_rows is None else self._plan.priced_rows
            sunk = float(self.planner.draft_seconds(rows)[priced])
            length = sunk_cost_stop(
                survival, total, self.planner.verify_seconds(total), sunk, length, forecast=self._plan.forecast
            )
        return torch.full((rows,), length, dtype=torch.long, device=device)

    def observe(self, rows, verify_len, accepted):
        self.planner.tracker.observe(rows, verify_len, accepted)

    def observe_round(self, record):
        self.planner.observe_round(record)

    def forget(self, rows):
        self.planner.tracker.forget(rows)
