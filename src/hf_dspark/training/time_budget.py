"""Training for a wall-clock budget with a learning-rate schedule that still ends where training ends.

`TimeBudgetCallback(seconds)` measures the seconds per optimizer step over the first steps (while the learning rate
warms up, after `skip` steps of device warm-up), then fixes the total step count to what fits in the budget and
re-targets the schedule (cosine or linear decay after warmup) to end exactly there. `args.max_steps` stays an upper
bound. The step count depends on the measured speed only, so two runs on the same machine and load agree to within
the timing noise; `agree` lets concurrent runs settle on one count (e.g. the smallest) so an A/B keeps equal steps.
A hard stop at the budget catches a machine that slows down later; `summary` says which ended the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from transformers import TrainerCallback
from transformers.utils import logging

logger = logging.get_logger(__name__)

BUDGET_SCHEDULES = ("cosine", "linear", "constant", "constant_with_warmup")


@dataclass
class BudgetedSchedule:
    """The LR multiplier at a step: linear warmup, then cosine / linear decay to 0 at `total` (constant: 1)."""

    kind: str
    warmup: int
    total: int

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return step / max(1, self.warmup)
        if self.kind.startswith("constant"):
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress


def steps_within(seconds_left: float, seconds_per_step: float, done: int, cap: int, safety: float) -> int:
    """Total steps when `done` are finished and `seconds_left` remain at `seconds_per_step` (`safety` < 1 leaves
    room for evaluations and the final save), between `done` and `cap`."""
    more = math.floor(max(0.0, seconds_left) * safety / max(seconds_per_step, 1e-9))
    return max(done, min(cap, done + more))


class TimeBudgetCallback(TrainerCallback):
    """Ends training, and its LR schedule, inside `seconds` of wall time from the first step.

    Args:
        seconds: the training budget (from `on_train_begin`).
        skip: steps left out of the speed measurement (device warm-up, first allocations).
        measure: steps timed after `skip` (at least; the measurement also runs to the end of warmup).
        safety: share of the remaining time planned for (the rest absorbs evaluations and saving).
        agree: maps this run's planned total to the one used (default: itself), e.g. the minimum over runs.
    """

    def __init__(
        self,
        seconds: float,
        skip: int = 2,
        measure: int = 8,
        safety: float = 0.92,
        agree: Callable[[int], int] | None = None,
    ) -> None:
        if seconds <= 0 or skip < 0 or measure < 1 or not 0 < safety <= 1:
            raise ValueError("TimeBudgetCallback needs seconds > 0, skip >= 0, measure >= 1 and 0 < safety <= 1.")
        self.seconds, self.skip, self.measure, self.safety = seconds, skip, measure, safety
        self.agree = agree or (lambda steps: steps)
        self.schedule: BudgetedSchedule | None = None
        self.started = self.marked = 0.0
        self.decide_at = 0
        self.summary: dict = {"budget_seconds": seconds, "planned_steps": None, "seconds_per_step": None}

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
        if kind not in BUDGET_SCHEDULES:
            raise ValueError(
                f"a time budget re-targets the LR schedule; lr_scheduler_type must be one of "
                f"{BUDGET_SCHEDULES}, got {kind!r}."
            )
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper holds the torch one
        if not hasattr(scheduler, "lr_lambdas"):
            raise ValueError("a time budget needs the Trainer's LambdaLR scheduler (no custom optimizers=...).")
        warmup = args.get_warmup_steps(state.max_steps)
        self.schedule = BudgetedSchedule(kind, warmup, state.max_steps)
        scheduler.lr_lambdas = [self.schedule for _ in scheduler.lr_lambdas]
        self.decide_at = max(warmup, self.skip + self.measure)
        self.started = time.monotonic()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        now, step = time.monotonic(), state.global_step
        if step == self.skip:
            self.marked = now
        elif step == self.decide_at and self.summary["planned_steps"] is None:
            since = self.marked if self.skip else self.started
            per_step = (now - since) / max(1, step - self.skip)
            own = steps_within(self.seconds - (now - self.started), per_step, step, state.max_steps, self.safety)
            planned = max(step, min(state.max_steps, int(self.agree(own))))
            self.schedule.total = planned
            self.summary.update(seconds_per_step=round(per_step, 5), planned_steps=planned, own_estimate=own)
            logger.warning(f"time budget: {per_step:.3f} s/step, {planned} steps fit in {self.seconds:.0f} s")
        if self.summary["planned_steps"] is not None and step >= self.summary["planned_steps"]:
            control.should_training_stop = True
            self.summary["stopped_by"] = "schedule"
        elif now - self.started >= self.seconds:
            control.should_training_stop = True
            self.summary["stopped_by"] = "time"
        self.summary.update(steps=step, train_seconds=round(now - self.started, 2))
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.summary.setdefault("stopped_by", "max_steps")
        return control
