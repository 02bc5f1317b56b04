"""The `Policy` protocol every verification-length policy implements, and `BasePolicy`, its default half.

A policy is built once per `generate` call (or per engine) from `PolicySettings` and asked, every round:
`plan(rows, cap, draft_costs)` before the drafter runs (which rows draft; earlier rounds only; `draft_costs` `[R]`
or None: each row's share of the drafter's per-row cost, from `DraftModel.row_draft_costs`), then
`lengths(survival, rows, device)` for the verification lengths ℓ_r `[R]` from this round's prefix survivals
(`[R, γ]`, None without a confidence head; the caller clips them to the remaining budget). `device` is where ℓ
goes when it does not depend on the survivals: the loop passes the host, so a rule such as `fixed` costs no read
of the device; ℓ computed from the survivals stays on their device and is read once. `cap` is host ints. `observe`,
`observe_round` and `forget` feed back what verification accepted, the round's wall times and departed rows.
Losslessness (Appendix A): the decision on x_j may read x_<j and earlier rounds, never x_≥j.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from .records import DraftPlan, PolicySettings


@runtime_checkable
class Policy(Protocol):
    """A verification-length policy (see the module docstring)."""

    needs_step_curve: ClassVar[bool]
    needs_confidence: ClassVar[bool]
    settings: PolicySettings

    def plan(self, rows: list[Any], cap: Sequence[int], draft_costs: torch.Tensor | None = None) -> DraftPlan: ...

    def lengths(self, survival: torch.Tensor | None, rows: int, device: torch.device) -> torch.Tensor: ...

    def observe(self, rows: list[Any], verify_len: torch.Tensor, accepted: torch.Tensor) -> None: ...

    def observe_round(self, record: Any) -> None: ...

    def forget(self, rows: list[Any]) -> None: ...


class BasePolicy:
    """Defaults for a `Policy`: every row drafts, nothing is learnt. A subclass overrides `lengths`.

    `rule` (optional): the policy's pure function `rule(survival, step_curve, **options) -> [R]`, for stateless use
    through `schedule` (benchmarks); `uses_capacity_survival`: `schedule` forwards `capacity_survival` to it;
    `reads_survival` (default True): `lengths` reads the survivals when there are any (False: the caller skips
    computing them); `observes_host_ints`: `observe` also accepts `verify_len` / `accepted` as host int lists (the
    round kernel then passes the lists it has instead of building tensors); `uses_row_acceptance`: `plan` takes
    `acceptance=`, the drafter's own per-row forecasts (`DraftModel.row_acceptance`).
    """

    needs_step_curve: ClassVar[bool] = False
    needs_confidence: ClassVar[bool] = False
    uses_capacity_survival: ClassVar[bool] = False
    reads_survival: ClassVar[bool] = True  # `lengths` uses the survivals when given (False: not computed for it)
    observes_host_ints: ClassVar[bool] = False  # `observe` takes host int lists as well as tensors
    uses_row_acceptance: ClassVar[bool] = False  # `plan` takes the drafter's forecasts (`acceptance=`)
    rule: ClassVar[Any] = None

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings

    def plan(self, rows: list[Any], cap: Sequence[int], draft_costs: torch.Tensor | None = None) -> DraftPlan:
        return DraftPlan()

    def lengths(self, survival: torch.Tensor | None, rows: int, device: torch.device) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement lengths(survival, rows, device).")

    def observe(self, rows: list[Any], verify_len: torch.Tensor, accepted: torch.Tensor) -> None:
        return None

    def observe_round(self, record: Any) -> None:
        return None

    def forget(self, rows: list[Any]) -> None:
        return None

    @classmethod
    def schedule(
        cls,
        survival: torch.Tensor,
        step_curve: Any = None,
        *,
        capacity_survival: torch.Tensor | None = None,
        **options: Any,
    ) -> torch.Tensor:
        """The stateless rule on one survival tensor `[R, γ]` -> verify_len `[R]` (benchmarks and tests)."""
        if cls.rule is None:
            raise ValueError(f"policy {cls.__name__} has no stateless rule; build it and call lengths().")
        if cls.needs_step_curve and step_curve is None:
            raise ValueError(f"policy {cls.__name__} needs a step_curve (SPS(B)); profile one first.")
        if cls.uses_capacity_survival:
            options["capacity_survival"] = capacity_survival
        return cls.rule(survival, step_curve, **options)


def require_survival(policy: BasePolicy, survival: torch.Tensor | None, name: str) -> torch.Tensor:
    """This round's survivals, or a `ValueError` naming the policy and the fix for a drafter without confidences."""
    if survival is None:
        raise ValueError(
            f"dspark_policy={name!r} needs confidences, but this drafter has no confidence head; use "
            "dspark_policy='fixed'."
        )
    return survival
