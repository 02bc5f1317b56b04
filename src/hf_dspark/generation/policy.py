"""How each round's verification lengths ℓ_r are chosen (the interface the scheduler plugs into).

Selected through `GenerationConfig` attributes (they survive transformers' kwarg validation):

- `dspark_policy`: a name registered in `hf_dspark.scheduling` (`available_policies()`): `"auto"` (cost-aware:
  drafts only when it is expected to pay, `cost_policy`), `"fixed"`,
  `"greedy"` (Algorithm 1), `"lagged"` (lagged-capacity top-K) or
  `"threshold"` (static confidence threshold), or `"greedy_padded"` / `"lagged_padded"`, the same two rules under
  the padded batch's real cost R·(1 + max ℓ_r) (one uniform ℓ for all rows; see `hf_dspark.scheduling.padded`),
  or one added with `register_policy` (docs/adding-a-policy.md).
  The load-aware policies need a drafter with a confidence head.
- `dspark_verify_len`: ℓ for `"fixed"` (default γ).
- `dspark_threshold`: survival threshold for `"threshold"` (default 0.5).
- `dspark_step_curve`: a `StepCurve` or a path to its JSON, for `"greedy"` and `"lagged"`. When unset, the curve
  of the target's (model, device, dtype, torch threads) is taken from the user cache or the curves shipped with
  the package, or profiled once (`hf_dspark.profiling.target_steps.load_or_profile_step_curve`).
- `dspark_draft_curve`: a `StepCurve` (proposals per second against rows R) or its JSON path, for `"auto"`.
  When unset, the drafter's curve (`hf_dspark.profiling.draft_steps.load_or_profile_draft_curve`); model-free drafters
  (oracle, prompt lookup) count as free.
- `dspark_measured_costs`: True (default) lets `"auto"` correct its cost curves by the measured wall time of earlier
  rounds (`cost_correction`); False plans with the curves as given.
- `dspark_policy_memory`: a `PolicyMemory` the caller owns, through which `"auto"` learns across calls (unset: each
  call starts afresh, so two identical seeded calls give identical output).
- `dspark_record_confidence`: when True, the statistics keep every round's raw confidence logits, so that
  `stats.calibration_pairs()` yields held-out (logits, prefix survival) pairs for STS (`hf-dspark calibrate`).

Every round the policy also records its own expectation for the admitted candidates (`last_schedule`): the
expected committed tokens τ̂ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}) and, with a step curve, Θ̂ = τ̂·SPS(B); the loop files
them in `DSparkGenerationStats.expected_tokens` / `expected_throughput`. They are computed when read, all rounds at
once (`ScheduleRecord.pending`), so no round spends time or a device read on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers.utils import logging

from ..ops.functional import prefix_survival
from ..profiling.curve_sources import CURVE_SOURCES
from ..profiling.step_curve import StepCurve
from ..scheduling.acceptance import heldout_acceptance
from ..scheduling.base import BasePolicy
from ..scheduling.records import PolicySettings, ScheduleRecord
from ..scheduling.registry import canonical_policy_name, get_policy
from ..transfer import HOST
from .options import DSparkGenerationOptions, validate_dspark_options

if TYPE_CHECKING:
    from ..model.modeling_outputs import DSparkProposal
    from .round import RoundRecord

logger = logging.get_logger(__name__)

DEFAULT_POLICY = "auto"


@dataclass
class VerificationPolicy:
    """Chooses each round's drafting rows (`plan`, before the drafter runs) and `verify_len` `[A]` (`__call__`,
    from the proposal; `cap` `[A]` bounds it, e.g. the remaining token budget − 1); `observe` feeds back what
    verification accepted. The rule itself is the registered policy `name` (`hf_dspark.scheduling.get_policy`).

    Args:
        name: a registered policy name (`hf_dspark.scheduling.available_policies()`).
        block_size: γ.
        verify_len: ℓ of `"fixed"` (default γ).
        threshold: survival threshold of `"threshold"`.
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
    threshold: float = 0.5
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
        self.name = canonical_policy_name(self.name)
        validate_dspark_options(
            {
                "dspark_policy": self.name,
                "dspark_verify_len": self.verify_len,
                "dspark_threshold": self.threshold,
                "dspark_step_curve": self.step_curve,
                "dspark_draft_curve": self.draft_curve,
            }
        )
        cls = get_policy(self.name)
        if self.verify_len is not None and not 0 <= self.verify_len <= self.block_size:
            raise ValueError(f"dspark_verify_len must be in 0..{self.block_size} (γ), got {self.verify_len}.")
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
        self.rule = cls(
            PolicySettings(
                block_size=self.block_size,
                verify_len=self.verify_len,
                threshold=self.threshold,
                step_curve=self.step_curve,
                draft_curve=self.draft_curve,
                greedy=self.greedy,
                measured_costs=self.measured_costs,
                acceptance_prior=self.acceptance_prior,
                memory=self.memory,
            )
        )

    @property
    def planner(self):
        """`"auto"`'s `CostAwarePlanner` (None for the other policies)."""
        return getattr(self.rule, "planner", None)

    def plan(self, rows: list[Any], cap, draft_costs: torch.Tensor | None = None,
             acceptance: list[list[float] | None] | None = None):
        """Which of the active `rows` (ids) draft this round (cap: host ints per row); uses earlier rounds only.
        Default: all of them. `draft_costs` `[A]`: each row's share of the drafter's per-row cost
        (`DraftModel.row_draft_costs`; passed on only when given, so a policy whose `plan` takes (rows, cap) keeps
        working). `acceptance`: the drafter's own per-row forecasts (`DraftModel.row_acceptance`), passed on only to
        a rule that declares `uses_row_acceptance`."""
        if acceptance is not None and getattr(self.rule, "uses_row_acceptance", False):
            return self.rule.plan(rows, cap, draft_costs, acceptance=acceptance)
        return self.rule.plan(rows, cap) if draft_costs is None else self.rule.plan(rows, cap, draft_costs)

    def observe(self, rows: list[Any], verify_len: torch.Tensor | Sequence[int],
                accepted: torch.Tensor | Sequence[int]) -> None:
        """What verification kept this round (all active rows, ℓ = 0 for those that did not draft): `[A]` tensors
        or host ints, given to the rule as tensors (not built for a rule that learns nothing)."""
        if type(self.rule).observe is BasePolicy.observe:
            return
        if not getattr(self.rule, "observes_host_ints", False):
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
        that reads them (`reads_survival`); the confidences are kept for `schedule`."""
        rows = proposal.draft_ids.shape[0]
        confidence = proposal.confidence
        reads = confidence is not None and getattr(self.rule, "reads_survival", True)
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


def policy_from_config(generation_config, block_size: int, target=None, drafter=None) -> VerificationPolicy:
    """Build the policy from `generation_config`'s `dspark_*` attributes (see the module docstring), parsed once
    into `DSparkGenerationOptions`; `policy_from_options` does the rest."""
    options = DSparkGenerationOptions.from_generation_config(generation_config)
    return policy_from_options(
        options, block_size, greedy=not generation_config.do_sample, target=target, drafter=drafter
    )


def policy_from_options(
    options: DSparkGenerationOptions, block_size: int, greedy: bool = True, target=None, drafter=None
) -> VerificationPolicy:
    """The policy of `options`, its curves resolved here (never inside the policy).

    target: the target model; when given, a load-aware policy without `dspark_step_curve` gets the curve of this
    target's (model, device, dtype, current torch threads) from `CURVE_SOURCES.step_curve`
    (`hf_dspark.profiling.target_steps.load_or_profile_step_curve`). drafter: for `"auto"`, whose cost curve is
    looked up the same way (`CURVE_SOURCES.draft_curve`,
    `hf_dspark.profiling.draft_steps.load_or_profile_draft_curve`) and whose held-out acceptance is its prior.
    greedy: the decoding mode (`not do_sample`).
    """
    name = canonical_policy_name(options.dspark_policy or DEFAULT_POLICY)
    step_curve, draft_curve = options.dspark_step_curve, options.dspark_draft_curve
    if get_policy(name).needs_step_curve and step_curve is None and target is not None:
        step_curve = CURVE_SOURCES.get("step_curve")(target, options.dspark_packed_weights)
    if name == "auto" and draft_curve is None and drafter is not None:
        draft_curve = CURVE_SOURCES.get("draft_curve")(drafter)
    return VerificationPolicy(
        name=name,
        block_size=block_size,
        verify_len=options.dspark_verify_len,
        threshold=0.5 if options.dspark_threshold is None else options.dspark_threshold,
        step_curve=step_curve,
        draft_curve=draft_curve,
        memory_key=drafter,
        greedy=greedy,
        measured_costs=options.dspark_measured_costs is not False,
        memory=options.dspark_policy_memory,
    )
