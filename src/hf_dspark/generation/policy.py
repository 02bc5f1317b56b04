"""How each round's verification lengths ℓ_r are chosen (the interface the scheduler plugs into).

Selected through `GenerationConfig` attributes (they survive transformers' kwarg validation):

- `dspark_policy`: `"fixed"` (default), `"greedy"` (Algorithm 1), `"lagged"` (lagged-capacity top-K) or
  `"threshold"` (static confidence threshold).
- `dspark_verify_len`: ℓ for `"fixed"` (default γ).
- `dspark_threshold`: survival threshold for `"threshold"` (default 0.5).
- `dspark_step_curve`: a `StepCurve` or a path to its JSON, for `"greedy"` and `"lagged"`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..functional import prefix_survival
from ..modeling_dspark import DSparkProposal

POLICIES = ("fixed", "greedy", "lagged", "threshold")


@dataclass
class VerificationPolicy:
    """Chooses `verify_len` `[A]` from a proposal; `cap` `[A]` bounds it (e.g. the remaining token budget − 1)."""

    name: str = "fixed"
    block_size: int = 4
    verify_len: int | None = None
    threshold: float = 0.5
    step_curve: Any = None
    _previous_survival: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"dspark_policy must be one of {POLICIES}, got {self.name!r}.")
        if self.verify_len is not None and not 0 <= self.verify_len <= self.block_size:
            raise ValueError(f"dspark_verify_len must be in 0..{self.block_size} (γ), got {self.verify_len}.")
        if self.name in ("greedy", "lagged") and self.step_curve is None:
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
        if self.name == "fixed":
            length = self.block_size if self.verify_len is None else self.verify_len
            chosen = torch.full((rows,), length, dtype=torch.long, device=device)
        else:
            chosen = self._scheduled(proposal)
        return torch.minimum(chosen, cap.clamp_min(0))

    def _scheduled(self, proposal: DSparkProposal) -> torch.Tensor:
        if proposal.confidence is None:
            raise ValueError(
                f"dspark_policy={self.name!r} needs confidences, but this drafter has no confidence head; "
                "use dspark_policy='fixed'."
            )
        from .. import scheduler

        survival = prefix_survival(proposal.confidence)
        if self.name == "greedy":
            return scheduler.schedule_greedy(survival, self.step_curve)
        if self.name == "threshold":
            return scheduler.schedule_threshold(survival, threshold=self.threshold)
        previous, self._previous_survival = self._previous_survival, survival
        return scheduler.schedule_lagged(survival, self.step_curve, previous)


def _attr_or(config, name: str, default):
    value = getattr(config, name, None)
    return default if value is None else value


def policy_from_config(generation_config, block_size: int) -> VerificationPolicy:
    return VerificationPolicy(
        name=getattr(generation_config, "dspark_policy", None) or "fixed",
        block_size=block_size,
        verify_len=getattr(generation_config, "dspark_verify_len", None),
        threshold=_attr_or(generation_config, "dspark_threshold", 0.5),
        step_curve=getattr(generation_config, "dspark_step_curve", None),
    )
