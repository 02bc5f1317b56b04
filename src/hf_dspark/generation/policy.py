"""The `VerificationPolicy` (`hf_dspark.scheduling.verification_policy`) of a `generate` call, built from its options.

Selected through `GenerationConfig` attributes (they survive transformers' kwarg validation):

- `dspark_policy`: a name registered in `hf_dspark.scheduling` (`available_policies()`): `"auto"` (cost-aware:
  drafts only when it is expected to pay, `cost_policy`), `"fixed"`,
  `"greedy"` (Algorithm 1), `"lagged"` (lagged-capacity top-K) or
  `"threshold"` (static confidence threshold), or `"greedy_padded"` / `"lagged_padded"`, the same two rules under
  the padded batch's real cost R·(1 + max ℓ_r) (one uniform ℓ for all rows; see `hf_dspark.scheduling.padded`),
  or one added with `register_policy` (docs/adding-a-policy.md).
  The load-aware policies need a drafter with a confidence head.
- a policy's own options, `dspark_verify_len` (ℓ of `"fixed"`), `dspark_threshold` (the cut of `"threshold"` and
  `"slot_threshold"`), ...: declared, defaulted and checked by that policy's `options_class`
  (`DSparkGenerationOptions.policy_options` carries the ones a call sets).
- `dspark_step_curve`: a `StepCurve` or a path to its JSON, for `"greedy"` and `"lagged"`. When unset, the curve
  of the target's (model, device, dtype, torch threads) is taken from the user cache or the curves shipped with
  the package, or profiled once (`hf_dspark.profiling.target_steps.load_or_profile_step_curve`, called here).
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

The missing curves are resolved here, by calling `hf_dspark.profiling` (which sits below generation), never inside
the policy: to refuse profiling in a service, pass the curves (`dspark_step_curve`, `dspark_draft_curve`).
"""

from __future__ import annotations

from ..profiling.draft_steps import load_or_profile_draft_curve
from ..profiling.target_steps import load_or_profile_step_curve
from ..scheduling.records import PolicySettings
from ..scheduling.registry import DEFAULT_POLICY, canonical_policy_name, get_policy
from ..scheduling.verification_policy import VerificationPolicy
from .options import DSparkGenerationOptions


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
    target's (model, device, dtype, current torch threads): `load_or_profile_step_curve` (user cache, shipped
    curves, else profiled once). drafter: for `"auto"`, whose cost curve is looked up the same way
    (`load_or_profile_draft_curve`) and whose held-out acceptance is its prior. greedy: the decoding mode
    (`not do_sample`).
    """
    name = canonical_policy_name(options.dspark_policy or DEFAULT_POLICY)
    step_curve, draft_curve = options.dspark_step_curve, options.dspark_draft_curve
    if get_policy(name).needs_step_curve and step_curve is None and target is not None:
        step_curve = load_or_profile_step_curve(target, packed_weights=options.dspark_packed_weights)
    if get_policy(name).needs_draft_curve and draft_curve is None and drafter is not None:
        draft_curve = load_or_profile_draft_curve(drafter)
    settings = PolicySettings(
        block_size=block_size,
        step_curve=step_curve,
        draft_curve=draft_curve,
        greedy=greedy,
        measured_costs=options.dspark_measured_costs is not False,
        memory=options.dspark_policy_memory,
    )
    return VerificationPolicy.from_settings(name, settings, memory_key=drafter, options=options.policy_options)
