"""`VerificationPolicy`: a registered policy rule with its settings, as the decoding loops drive it.

It chooses each round's drafting rows (`plan`, before the drafter runs) and ℓ_r (`choose`, from the proposal),
takes back what verification accepted (`observe`) and the round's wall times (`observe_round`, a `RoundRecord`),
and keeps its expectation of each decision (`schedule`: τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}) and, with a step curve,
Θ̂ = τ̂·SPS(B), computed when read). It is built from `PolicySettings` whose curves the caller resolved
(`VerificationPolicy.from_settings`, or the same fields as keywords): no profiling and no look-up happen here.
`hf_dspark.generation.policy` builds one from a `generate` call's `dspark_*` options, the serving engine from its
arguments.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..ops.functional import prefix_survival
from ..profiling.step_curve import StepCurve
from ..transfer import HOST
from .acceptance import heldout_acceptance
from .base import missing_confidence_error
from .records import DraftPlan, PolicySettings, RoundRecord, ScheduleRecord
from .registry import available_policies, build_policy, canonical_policy_name, check_policy_options, get_policy

if TYPE_CHECKING:
    from ..model.modeling_outputs import DSparkProposal


def _check_curve(option: str, value: Any) -> None:
    if isinstance(value, (str, os.PathLike)):
        if not os.path.isfile(value):
            raise ValueError(f"{option}: no such file {os.fspath(value)!r} (save one with `hf-dspark profile`).")
    elif value is not None and not hasattr(value, "steps_per_second_at"):
        raise ValueError(f"{option} must be a StepCurve or the path of its JSON file, got {value!r}.")


def check_policy_settings(name: Any, verify_len: Any, threshold: Any, step_curve: Any = None,
                          draft_curve: Any = None) -> None:
    """Refuse a policy name, ℓ, threshold or curve that is out of range or of the wrong type, each error naming the
    `generate` option that sets it (`dspark_policy`, `dspark_verify_len`, ...) and what it takes (ℓ and the
    threshold by the policies that declare them, `registry.check_policy_options`)."""
    if not isinstance(name, str) or canonical_policy_name(name) not in available_policies():
        raise ValueError(f"dspark_policy must be one of {list(available_policies())} (or a name registered "
                         f"with hf_dspark.scheduling.register_policy), got {name!r}.")
    check_policy_options({"verify_len": verify_len, "threshold": threshold})
    _check_curve("dspark_step_curve", step_curve)
    _check_curve("dspark_draft_curve", draft_curve)


@dataclass
class VerificationPolicy:
    """Chooses each round's drafting rows (`plan`, before the drafter runs) and `verify_len` `[A]` (`__call__`,
    from the proposal; `cap` `[A]` bounds it, e.g. the remaining token budget − 1); `observe` feeds back what
    verification accepted. The rule itself is the registered policy `name` (`hf_dspark.scheduling.get_policy`).

    Args:
        name: a registered policy name (`hf_dspark.scheduling.available_policies()`).
        block_size: γ.
        verify_len: ℓ of `"fixed"` (None: its default, γ); a shorthand for `options={"verify_len": ...}`.
        threshold: the threshold of `"threshold"` / `"slot_threshold"` (None: their default); a shorthand for
            `options={"threshold": ...}`.
        options: the policy's own options by name (`registry.build_policy`), for a policy's `options_class`.
        step_curve: SPS(B) (`StepCurve` or JSON path), for the load-aware policies.
        draft_curve: the drafter's proposals per second against rows (`StepCurve` or path), for `"auto"`.
        memory_key: the drafter, whose held-out acceptance `"auto"` starts from (None: no drafter prior).
        greedy: the decoding mode of the requests (`not do_sample`).
        measured_costs: `"auto"` corrects its curves by the wall times of earlier rounds (`cost_correction`);
            False plans with the curves as given.
        acceptance_prior: γ conditional acceptance rates `"auto"` starts from. None: the held-out acceptance of
            `memory_key` for this mode when it is a calibrated drafter (`acceptance.heldout_acceptance`), else 0.5
            per position, weakly held.
        memory: a `hf_dspark.scheduling.PolicyMemory` the caller owns, through which `"auto"` learns across calls
            (None: this call only).
    """

    name: str = "fixed"
    block_size: int = 4
    verify_len: int | None = None
    threshold: float | None = None
    options: dict[str, Any] | None = None
    step_curve: Any = None
    draft_curve: Any = None
    memory_key: Any = field(default=None, repr=False)
    greedy: bool = True
    measured_costs: bool = True
    acceptance_prior: list[float] | None = None
    memory: Any = field(default=None, repr=False)
    last_schedule: ScheduleRecord = field(default_factory=ScheduleRecord, repr=False)
    rule: Any = field(default=None, repr=False)
    _confidence: torch.Tensor | None = field(default=None, repr=False)
    _verify_len: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(
                f"block_size (γ, the drafter's draft tokens per round) must be an int >= 1, got {self.block_size!r}."
            )
        check_policy_settings(self.name, self.verify_len, self.threshold, self.step_curve, self.draft_curve)
        self.name = canonical_policy_name(self.name)
        cls = get_policy(self.name)
        if cls.needs_step_curve and self.step_curve is None:
            raise ValueError(
                f"dspark_policy={self.name!r} needs a step curve: set generation_config.dspark_step_curve to a "
                "StepCurve or the path of one saved by `hf-dspark profile`."
            )
        if isinstance(self.step_curve, str):
            self.step_curve = StepCurve.load(self.step_curve)
        if isinstance(self.draft_curve, str):
            self.draft_curve = StepCurve.load(self.draft_curve)
        if self.acceptance_prior is None and self.memory_key is not None:
            self.acceptance_prior = heldout_acceptance(self.memory_key, self.greedy)
        options = {**(self.options or {}), "verify_len": self.verify_len, "threshold": self.threshold}
        self.rule = build_policy(self.name, self.settings(), options)

    @classmethod
    def from_settings(cls, name: str, settings: PolicySettings, memory_key: Any = None,
                      options: dict[str, Any] | None = None) -> VerificationPolicy:
        """The policy `name` built from `settings` (curves resolved by the caller; `memory_key`: the drafter whose
        held-out acceptance is the prior when `settings.acceptance_prior` is None) and its own `options`."""
        return cls(
            name=name,
            block_size=settings.block_size,
            options=options,
            step_curve=settings.step_curve,
            draft_curve=settings.draft_curve,
            memory_key=memory_key,
            greedy=settings.greedy,
            measured_costs=settings.measured_costs,
            acceptance_prior=settings.acceptance_prior,
            memory=settings.memory,
        )

    def settings(self) -> PolicySettings:
        """The `PolicySettings` the rule is built from (curves loaded, prior resolved)."""
        return PolicySettings(
            block_size=self.block_size,
            step_curve=self.step_curve,
            draft_curve=self.draft_curve,
            greedy=self.greedy,
            measured_costs=self.measured_costs,
            acceptance_prior=self.acceptance_prior,
            memory=self.memory,
        )

    @property
    def planner(self):
        """`"auto"`'s `CostAwarePlanner` (None for the other policies)."""
        return self.rule.planner

    def plan(self, rows: list[Any], cap, draft_costs: torch.Tensor | None = None,
             acceptance: list[list[float] | None] | None = None):
        """Which of the active `rows` (ids) draft this round (cap: host ints per row); uses earlier rounds only.
        Default: all of them. `draft_costs` `[A]`: each row's share of the drafter's per-row cost
        (`DraftModel.row_draft_costs`; passed on only when given, so a policy whose `plan` takes (rows, cap) keeps
        working). `acceptance`: the drafter's own per-row forecasts (`DraftModel.row_acceptance`), passed on only to
        a rule that declares `uses_row_acceptance`. A rule that does not declare `plans_rows` is not asked."""
        if not self.rule.plans_rows:
            return DraftPlan()
        if acceptance is not None and self.rule.uses_row_acceptance:
            return self.rule.plan(rows, cap, draft_costs, acceptance=acceptance)
        return self.rule.plan(rows, cap) if draft_costs is None else self.rule.plan(rows, cap, draft_costs)

    def observe(self, rows: list[Any], verify_len: torch.Tensor | Sequence[int],
                accepted: torch.Tensor | Sequence[int]) -> None:
        """What verification kept this round (all active rows, ℓ = 0 for those that did not draft): `[A]` tensors
        or host ints, given to the rule as tensors (not built for a rule that learns nothing)."""
        if not self.rule.learns:
            return
        if not self.rule.observes_host_ints:
            verify_len = torch.as_tensor(verify_len, dtype=torch.long)
            accepted = torch.as_tensor(accepted, dtype=torch.long)
        self.rule.observe(rows, verify_len, accepted)

    def observe_round(self, record: RoundRecord) -> None:
        """A finished round's wall times ("auto" corrects its cost curves with them)."""
        self.rule.observe_round(record)

    def forget(self, rows: list[Any]) -> None:
        """Rows (ids) that left the batch."""
        self.rule.forget(rows)

    def __call__(self, proposal: DSparkProposal, cap) -> torch.Tensor:
        """ℓ `[R]` as a host LongTensor, clipped to `cap` (host ints, or a tensor: read once). A rule whose ℓ does
        not depend on this round's confidences (`fixed`, `auto`) builds it on the host; the others compute it on
        the device and it is read here, once (the target forward's width depends on max ℓ)."""
        return torch.tensor(self.choose(proposal, cap), dtype=torch.long)

    def choose(self, proposal: DSparkProposal, cap) -> list[int]:
        """`__call__`'s ℓ as host ints (what the round kernel uses). The survivals are computed only for a rule
        that reads them (`reads_survival`); the confidences are kept for `schedule`. A rule that `needs_confidence`
        refuses a proposal without confidences."""
        rows = proposal.draft_ids.shape[0]
        confidence = proposal.confidence
        if confidence is None and self.rule.needs_confidence:
            raise missing_confidence_error(self.name)
        reads = confidence is not None and self.rule.reads_survival
        chosen = self.rule.lengths(prefix_survival(confidence) if reads else None, rows, HOST)
        lengths = chosen.tolist()
        caps = cap.tolist() if isinstance(cap, torch.Tensor) else list(cap)
        if chosen.dtype == torch.long and lengths and min(lengths) >= 0 and min(caps) >= max(lengths):
            verify_len = lengths  # no row's budget cuts it
        else:
            verify_len = [min(int(length), max(int(c), 0)) for length, c in zip(lengths, caps)]
        self._confidence, self._verify_len = confidence, verify_len
        return verify_len

    def schedule(self) -> ScheduleRecord:
        """`last_schedule`: τ̂ (and Θ̂ = τ̂·SPS(B), B = Σ_r (1 + ℓ_r), with a step curve) of the last decision, pending
        (`ScheduleRecord.pending`: computed when read, so a round neither computes nor reads it); empty without
        confidences."""
        if self._confidence is None:
            self.last_schedule = ScheduleRecord()
        else:
            self.last_schedule = ScheduleRecord.pending(self._confidence, self._verify_len, self.step_curve)
        return self.last_schedule
