"""How each round's verification lengths ℓ_r are chosen (the interface the scheduler plugs into).

Selected through `GenerationConfig` attributes (they survive transformers' kwarg validation):

- `dspark_policy`: `"fixed"` (default), `"greedy"` (Algorithm 1), `"lagged"` (lagged-capacity top-K) or
  `"threshold"` (static confidence threshold), or `"greedy_padded"` / `"lagged_padded"`, the same two rules under
  the padded batch's real cost R·(1 + max ℓ_r) (one uniform ℓ for all rows; see `hf_dspark.padded_scheduler`).
  The load-aware policies need a drafter with a confidence head.
- `dspark_verify_len`: ℓ for `"fixed"` (default γ).
- `dspark_threshold`: survival threshold for `"threshold"` (default 0.5).
- `dspark_step_curve`: a `StepCurve` or a path to its JSON, for `"greedy"` and `"lagged"`. When unset, the curve
  of the target's (model, device, dtype, torch threads) is taken from the user cache or the curves shipped with
  the package, or profiled once (`hf_dspark.profiling.load_or_profile_step_curve`).
- `dspark_record_confidence`: when True, the statistics keep every round's raw confidence logits, so that
  `stats.calibration_pairs()` yields held-out (logits, prefix survival) pairs for STS (`hf-dspark calibrate`).

Every round the policy also records its own expectation for the admitted candidates (`last_schedule`): the
expected committed tokens τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}) and, with a step curve, Θ̂ = τ̂·SPS(B); the loop copies
them into `DSparkGenerationStats.expected_tokens` / `expected_throughput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.utils import logging

from ..functional import prefix_survival
from ..modeling_dspark import DSparkProposal

logger = logging.get_logger(__name__)

POLICIES = ("fixed", "greedy", "lagged", "threshold", "greedy_padded", "lagged_padded")
LOAD_AWARE = ("greedy", "lagged", "greedy_padded", "lagged_padded")


@dataclass
class ScheduleRecord:
    """What a policy expected from its last decision (None when the drafter has no confidence head).

    expected_tokens: τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}); expected_throughput: Θ̂ = τ̂·SPS(B) (None without a curve).
    """

    expected_tokens: float | None = None
    expected_throughput: float | None = None


@dataclass
class VerificationPolicy:
    """Chooses `verify_len` `[A]` from a proposal; `cap` `[A]` bounds it (e.g. the remaining token budget − 1)."""

    name: str = "fixed"
    block_size: int = 4
    verify_len: int | None = None
    threshold: float = 0.5
    step_curve: Any = None
    last_schedule: ScheduleRecord = field(default_factory=ScheduleRecord, repr=False)
    _previous_survival: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"dspark_policy must be one of {POLICIES}, got {self.name!r}.")
        if self.verify_len is not None and not 0 <= self.verify_len <= self.block_size:
            raise ValueError(f"dspark_verify_len must be in 0..{self.block_size} (γ), got {self.verify_len}.")
        if self.name in LOAD_AWARE and self.step_curve is None:
            raise ValueError(
                f"dspark_policy={self.name!r} needs a step curve: set generation_config.dspark_step_curve to a "
                "StepCurve or the path of one saved by `hf-dspark profile`."
            )
        if isinstance(self.step_curve, str):
            from ..scheduler import StepCurve

            self.step_curve = StepCurve.load(self.step_curve)

    def __call__(self, proposal: DSparkProposal, cap: torch.Tensor) -> torch.Tensor:
        rows = proposal.draft_ids.shape[0]
        device = proposal.draft_ids.device
        survival = prefix_survival(proposal.confidence) if proposal.confidence is not None else None
        if self.name == "fixed":
            length = self.block_size if self.verify_len is None else self.verify_len
            chosen = torch.full((rows,), length, dtype=torch.long, device=device)
        else:
            chosen = self._scheduled(survival)
        verify_len = torch.minimum(chosen, cap.clamp_min(0))
        self.last_schedule = self._expectation(survival, verify_len)
        return verify_len

    def _scheduled(self, survival: torch.Tensor | None) -> torch.Tensor:
        if survival is None:
            raise ValueError(
                f"dspark_policy={self.name!r} needs confidences, but this drafter has no confidence head; "
                "use dspark_policy='fixed'."
            )
        from .. import padded_scheduler, scheduler

        if self.name == "greedy":
            return scheduler.schedule_greedy(survival, self.step_curve)
        if self.name == "threshold":
            return scheduler.schedule_threshold(survival, threshold=self.threshold)
        if self.name == "greedy_padded":
            return padded_scheduler.schedule_padded_greedy(survival, self.step_curve)
        previous, self._previous_survival = self._previous_survival, survival
        if self.name == "lagged_padded":
            return padded_scheduler.schedule_padded_lagged(survival, self.step_curve, previous)
        return scheduler.schedule_lagged(survival, self.step_curve, previous)

    def _expectation(self, survival: torch.Tensor | None, verify_len: torch.Tensor) -> ScheduleRecord:
        """τ̂ and Θ̂ of the admitted candidates (a few small tensor ops; one host sync)."""
        if survival is None:
            return ScheduleRecord()
        positions = torch.arange(1, survival.shape[1] + 1, device=survival.device)
        admitted = positions[None, :] <= verify_len[:, None]
        tau = float((1.0 + (survival.double() * admitted).sum(dim=-1)).sum())
        if self.step_curve is None:
            return ScheduleRecord(tau, None)
        batch_tokens = int(verify_len.numel() + verify_len.sum())
        return ScheduleRecord(tau, tau * self.step_curve.steps_per_second_at(batch_tokens))


def _attr_or(config, name: str, default):
    value = getattr(config, name, None)
    return default if value is None else value


def policy_from_config(generation_config, block_size: int, target=None) -> VerificationPolicy:
    """Build the policy from `generation_config`'s `dspark_*` attributes (see the module docstring).

    target: the target model; when given, a load-aware policy without `dspark_step_curve` gets the curve of this
    target's (model, device, dtype, current torch threads) from `load_or_profile_step_curve`.
    """
    name = getattr(generation_config, "dspark_policy", None) or "fixed"
    step_curve = getattr(generation_config, "dspark_step_curve", None)
    if name in LOAD_AWARE and step_curve is None and target is not None:
        from ..profiling import load_or_profile_step_curve

        step_curve = load_or_profile_step_curve(target)
    return VerificationPolicy(
        name=name,
        block_size=block_size,
        verify_len=getattr(generation_config, "dspark_verify_len", None),
        threshold=_attr_or(generation_config, "dspark_threshold", 0.5),
        step_curve=step_curve,
    )
