"""`AutoPolicy` (registered as `auto`, the default): cost-aware drafting (plans from earlier rounds,
`scheduling.cost_policy`), then the sunk-cost stop; in tree rounds it sizes each row's tree by cost instead
(`tree_budget`: no draft, a chain or a tree, the node budget shrinking with load).

The lagged acceptance is kept per request, or per (request, source) where the drafter prices its rows
(`DraftModel.row_draft_costs`): rows priced at different shares draft from different sources (a hybrid's lookup
rows at 0, its DSpark rows at 1), whose acceptance differs, so a request that switches source is planned with the
acceptance of the source it uses this round. The share is chosen from the committed context and lagged scores
before anything is drafted, so the key is too: the plan stays a function of the past (lossless).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from ..ops.tree import DraftTree
from .acceptance import INFORMED_PRIOR_WEIGHT, AcceptanceMemory, AcceptanceTracker
from .base import BasePolicy, PolicyOptions
from .cost_policy import CostAwarePlanner
from .padded import sunk_cost_stop
from .records import DraftPlan, PolicySettings
from .tree_budget import TreeBudgetChoice, choose_tree_budget, node_budget_cap


class AutoPolicy(BasePolicy):
    """Drafts only when it is expected to pay (`CostAwarePlanner.plan`), at the planned L cut by the causal
    sunk-cost stop on this round's survivals (`sunk_cost_stop`). Its memory across calls is
    `settings.memory` (a `PolicyMemory` the caller owns; None: this call only)."""

    needs_step_curve = True
    needs_draft_curve = True
    plans_rows = True
    uses_row_acceptance = True
    learns = True
    observes_host_ints = True
    per_decoding_mode = True
    supports_trees = True

    def __init__(self, settings: PolicySettings, options: PolicyOptions | None = None) -> None:
        super().__init__(settings, options)
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
        self._keys: tuple[list[Any], list[Hashable]] | None = None  # (rows, acceptance keys) of the last plan
        self._sources: dict[Any, set[Hashable]] = {}  # request -> the acceptance keys it was tracked under

    def plan(self, rows, cap, draft_costs=None, acceptance=None):
        """The planner's decision; `acceptance`: the drafter's own forecasts for some rows (`row_acceptance`),
        which replace the lagged estimates of those rows."""
        keys = acceptance_keys(rows, draft_costs)
        self._keys = (list(rows), keys)
        if draft_costs is not None or self._sources:  # keys other than the rows themselves (`forget` reads them)
            for row, key in zip(rows, keys):
                self._sources.setdefault(row, set()).add(key)
        self._plan = self.planner.plan(keys, cap, draft_costs, acceptance)
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

    def tree_node_cap(self, rows: int, max_nodes: int) -> int:
        """Drafts per row worth building at this load (`tree_budget.node_budget_cap`; 0: none), a host int."""
        return node_budget_cap(self.planner.step_curve, rows, max_nodes)

    def shape_tree(self, tree: DraftTree, score: torch.Tensor) -> TreeBudgetChoice:
        """Per row: no draft, a chain or a tree, whichever maximises Θ = τ·SPS(B) (`tree_budget.choose_tree_budget`
        on the planner's step curve); score `[R, N]`: P(node reached and accepted). No host read."""
        return choose_tree_budget(tree, score, self.planner.step_curve)

    def observe(self, rows, verify_len, accepted):
        """Record the round under the keys its plan used (each row's source this round), and the plan's forecast
        against what was accepted."""
        planned = self._keys is not None and self._keys[0] == list(rows)
        self.planner.tracker.observe(self._keys[1] if planned else list(rows), verify_len, accepted)
        if planned:  # the plan's forecast against what was accepted (`AcceptanceCorrection`)
            host = [v.tolist() if isinstance(v, torch.Tensor) else list(v) for v in (verify_len, accepted)]
            self.planner.observe_acceptance(*host)

    def observe_round(self, record):
        self.planner.observe_round(record)

    def forget(self, rows):
        keys = [key for row in rows for key in self._sources.pop(row, {row})]
        self.planner.tracker.forget(keys)


def acceptance_keys(rows: list[Any], draft_costs: torch.Tensor | None) -> list[Hashable]:
    """The keys `rows`' acceptance is tracked under this round: each request id, or with `draft_costs` `[R]` (each
    row's share of the drafter's per-row cost, one value per source) (request, share), one estimate per source."""
    if draft_costs is None:
        return list(rows)
    shares = draft_costs.detach().cpu().to(torch.float64).tolist()
    return [(row, share) for row, share in zip(rows, shares)]
