"""The `Policy` protocol every verification-length policy implements, `BasePolicy` (its default half and the
declared capabilities the loop reads), and `PolicyOptions` (a policy's own settings).

A policy is built once per `generate` call (or per engine) from the shared `PolicySettings` and its own options
(`options_class`, built by the registry from the generic option mapping, `registry.build_policy`) and asked, every
round: `plan(rows, cap, draft_costs)` before the drafter runs (which rows draft; earlier rounds only; `draft_costs`
`[R]` or None: each row's share of the drafter's per-row cost, from `DraftModel.row_draft_costs`), then
`lengths(survival, rows, device)` for the verification lengths ℓ_r `[R]` from this round's prefix survivals
(`[R, γ]`, None without a confidence head; the caller clips them to the remaining budget). `device` is where ℓ
goes when it does not depend on the survivals: the loop passes the host, so a rule such as `fixed` costs no read
of the device; ℓ computed from the survivals stays on their device and is read once. `cap` is host ints. `observe`,
`observe_round` and `forget` feed back what verification accepted, the round's wall times and departed rows.
Losslessness (Appendix A): the decision on x_j may read x_<j and earlier rounds, never x_≥j.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from .records import DraftPlan, PolicySettings

OPTION_PREFIX = "dspark_"  # `generate`'s spelling of a policy option: dspark_<field>


@dataclass(frozen=True)
class PolicyOptions:
    """A policy's own settings: none here; a policy with settings subclasses this dataclass, declares its fields
    (each with a default, validated in `__post_init__`, described in its `Args:`) and names it `options_class`.

    The registry builds it from the generic option mapping (`from_mapping`): field `x` is read from key `x` or
    `dspark_x` (how `generate` spells it); a None value keeps the default; keys it does not declare are ignored.
    """

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> PolicyOptions:
        """The options of `options` that this class declares (None values keep the defaults)."""
        declared = {item.name for item in fields(cls)}
        values = {}
        for key, value in options.items():
            name = key[len(OPTION_PREFIX):] if key.startswith(OPTION_PREFIX) else key
            if name in declared and value is not None:
                values[name] = value
        return cls(**values)

    def check(self, settings: PolicySettings) -> None:
        """Checks that need the shared settings (e.g. ℓ ≤ γ); none by default."""
        return None


@runtime_checkable
class Policy(Protocol):
    """A verification-length policy (see the module docstring)."""

    needs_confidence: ClassVar[bool]
    needs_step_curve: ClassVar[bool]
    settings: PolicySettings

    def plan(self, rows: list[Any], cap: Sequence[int], draft_costs: torch.Tensor | None = None) -> DraftPlan: ...

    def lengths(self, survival: torch.Tensor | None, rows: int, device: torch.device) -> torch.Tensor: ...

    def observe(self, rows: list[Any], verify_len: torch.Tensor, accepted: torch.Tensor) -> None: ...

    def observe_round(self, record: Any) -> None: ...

    def forget(self, rows: list[Any]) -> None: ...


class BasePolicy:
    """Defaults for a `Policy`: every row drafts, nothing is learnt. A subclass overrides `lengths`, and declares
    what it needs and does through the class attributes below (the loop reads them; nothing is probed)."""

    options_class: ClassVar[type[PolicyOptions]] = PolicyOptions
    """The policy's own settings dataclass (`self.options`), built by the registry from the option mapping."""

    needs_confidence: ClassVar[bool] = False
    """`lengths` reads this round's survivals: a round without confidences (a drafter without a confidence head)
    is refused, naming the policy, before `lengths` runs; `lengths` may then assume `survival` is a tensor."""

    needs_step_curve: ClassVar[bool] = False
    """`settings.step_curve` (the target's SPS(B)) must be set: the caller looks it up or profiles it first."""

    needs_draft_curve: ClassVar[bool] = False
    """`settings.draft_curve` (the drafter's cost against rows) is used: the caller looks it up for the drafter
    (None where the drafter has none, e.g. model-free drafters, which count as free)."""

    reads_survival: ClassVar[bool] = True
    """`lengths` uses the survivals when there are any (False: the caller skips computing them)."""

    plans_rows: ClassVar[bool] = False
    """`plan` chooses which rows draft (possibly none: a plain-decoding round). False: every row drafts and the
    caller skips `plan`; a policy that overrides `plan` must set it."""

    uses_row_acceptance: ClassVar[bool] = False
    """`plan` takes `acceptance=`, the drafter's own per-row forecasts (`DraftModel.row_acceptance`)."""

    learns: ClassVar[bool] = False
    """`observe` learns from what verification accepted (False: the caller skips `observe`); a policy that
    overrides `observe` must set it."""

    observes_host_ints: ClassVar[bool] = False
    """`observe` takes `verify_len` / `accepted` as host int lists as well as tensors (the caller then passes the
    lists it has instead of building tensors)."""

    per_decoding_mode: ClassVar[bool] = False
    """The policy's state depends on the decoding mode (`settings.greedy`): it must be built for the mode it
    serves (an engine refuses one built for the other mode)."""

    supports_trees: ClassVar[bool] = False
    """Tree rounds (`dspark_tree_budget`) let the policy size each row's tree: `tree_node_cap(rows, max_nodes)`
    (drafts per row worth building at this load, host ints) before drafting and `shape_tree(tree, score)` (a
    `tree_budget.TreeBudgetChoice`: no draft, a chain or a tree per row) after. False: trees of the fixed budget."""

    uses_capacity_survival: ClassVar[bool] = False
    """`schedule` forwards `capacity_survival` (earlier survivals) to `rule`."""

    planner: Any = None
    """The cost model a row-planning policy plans with (`auto`'s `CostAwarePlanner`, set by its constructor), for
    inspection; None for the others."""

    rule: ClassVar[Any] = None
    """Optional: the policy's pure function `rule(survival, step_curve, **options) -> [R]`, for stateless use
    through `schedule` (benchmarks)."""

    def __init__(self, settings: PolicySettings, options: PolicyOptions | None = None) -> None:
        self.settings = settings
        self.options = type(self).options_class() if options is None else options

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


def missing_confidence_error(name: str) -> ValueError:
    """The refusal of a policy that `needs_confidence` for a round without confidences, naming `name` and the fix."""
    return ValueError(
        f"dspark_policy={name!r} needs confidences, but this drafter has no confidence head; use "
        "dspark_policy='fixed'."
    )
