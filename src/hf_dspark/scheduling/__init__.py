"""Verification-length scheduling, read top-down (docs/scheduling.md).

- `records`: `ScheduleRecord`, `DraftPlan`, `PolicySettings` (what a policy is built from).
- `base`: the `Policy` protocol, `BasePolicy` (the declared capabilities the loop reads) and `PolicyOptions` (a
  policy's own settings); `registry`: `register_policy` / `get_policy` / `available_policies` / `build_policy`,
  read by `generate`, `DSparkEngine`, the CLI and the benchmarks.
- One module per policy: `fixed`, `threshold`, `greedy` (Algorithm 1), `lagged` (§5.2), `padded` (both under the
  padded batch's cost), `auto` (cost-aware); `expectation`: the one τ̂ / Θ̂; `memory`: `auto`'s caller-owned memory.
"""

from .auto import AutoPolicy
from .base import BasePolicy, Policy, PolicyOptions
from .expectation import expected_throughput, expected_tokens
from .fixed import FixedOptions, FixedPolicy
from .greedy import GreedyPolicy
from .lagged import LaggedPolicy
from .memory import PolicyMemory
from .padded import PaddedGreedyPolicy, PaddedLaggedPolicy
from .records import DraftPlan, PolicySettings, ScheduleRecord
from .registry import (
    DEFAULT_POLICY,
    NO_SPECULATION,
    available_policies,
    build_policy,
    canonical_policy_name,
    check_policy_options,
    get_policy,
    policy_option_names,
    register_policy,
)
from .slot_threshold import SlotThresholdPolicy
from .threshold import ThresholdOptions, ThresholdPolicy

register_policy("auto", AutoPolicy)
register_policy("fixed", FixedPolicy)
register_policy("greedy", GreedyPolicy)
register_policy("lagged", LaggedPolicy)
register_policy("threshold", ThresholdPolicy)
register_policy("greedy_padded", PaddedGreedyPolicy)
register_policy("lagged_padded", PaddedLaggedPolicy)
register_policy("slot_threshold", SlotThresholdPolicy)

__all__ = [
    "DEFAULT_POLICY",
    "NO_SPECULATION",
    "AutoPolicy",
    "BasePolicy",
    "DraftPlan",
    "FixedOptions",
    "FixedPolicy",
    "GreedyPolicy",
    "LaggedPolicy",
    "PaddedGreedyPolicy",
    "PaddedLaggedPolicy",
    "Policy",
    "PolicyMemory",
    "PolicyOptions",
    "PolicySettings",
    "ScheduleRecord",
    "SlotThresholdPolicy",
    "ThresholdOptions",
    "ThresholdPolicy",
    "available_policies",
    "build_policy",
    "canonical_policy_name",
    "check_policy_options",
    "expected_throughput",
    "expected_tokens",
    "get_policy",
    "policy_option_names",
    "register_policy",
]
