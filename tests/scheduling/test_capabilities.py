"""Policies declare what they need and do (class attributes the loop reads) and their own options (a `PolicyOptions`
dataclass built by the registry); no policy name is special, `auto` included."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import pytest
import torch

from hf_dspark.generation import oracle_for
from hf_dspark.generation import policy as generation_policy
from hf_dspark.generation.options import DSparkGenerationOptions
from hf_dspark.profiling.step_curve import StepCurve
from hf_dspark.scheduling import (
    AutoPolicy,
    BasePolicy,
    FixedOptions,
    PolicyOptions,
    PolicySettings,
    ThresholdOptions,
    available_policies,
    build_policy,
    check_policy_options,
    get_policy,
    policy_option_names,
    register_policy,
)
from hf_dspark.scheduling import base as scheduling_base
from hf_dspark.scheduling.registry import _REGISTRY
from hf_dspark.scheduling.verification_policy import VerificationPolicy
from hf_dspark.serving.engine import DSparkEngine
from tests.helpers import make_drafter, make_target, ragged_prompts

GAMMA = 4
FLAT = StepCurve([1, 4096], [1.0, 1.0])
DRAFT = StepCurve([1, 4096], [1 / 0.3, 1 / 0.3])
FLAGS = ("needs_confidence", "reads_survival", "needs_step_curve", "needs_draft_curve", "plans_rows",
         "uses_row_acceptance", "learns", "observes_host_ints", "per_decoding_mode", "uses_capacity_survival")


@pytest.fixture
def registry_snapshot():
    saved = dict(_REGISTRY)
    yield
    _REGISTRY.clear()
    _REGISTRY.update(saved)


def _declared(name: str) -> set[str]:
    cls = get_policy(name)
    return {flag for flag in FLAGS if getattr(cls, flag) != getattr(BasePolicy, flag)}


def test_the_builtins_declare_what_sets_them_apart():
    assert _declared("fixed") == {"reads_survival"}
    assert _declared("threshold") == _declared("slot_threshold") == {"needs_confidence"}
    assert _declared("greedy") == _declared("greedy_padded") == {"needs_confidence", "needs_step_curve"}
    assert _declared("lagged") == _declared("lagged_padded") == {
        "needs_confidence", "needs_step_curve", "uses_capacity_survival"
    }
    assert _declared("auto") == {"needs_step_curve", "needs_draft_curve", "plans_rows", "uses_row_acceptance",
                                 "learns", "observes_host_ints", "per_decoding_mode"}
    assert get_policy("fixed").options_class is FixedOptions
    assert get_policy("threshold").options_class is get_policy("slot_threshold").options_class is ThresholdOptions
    assert get_policy("auto").options_class is PolicyOptions


def test_every_capability_is_a_documented_class_attribute_of_the_base():
    source = inspect.getsource(scheduling_base.BasePolicy)
    for flag in ("options_class", *FLAGS):
        _, _, after = source.partition(f"\n    {flag}: ClassVar[")
        assert after, f"BasePolicy does not declare {flag}"
        assert after.split("\n", 2)[1].strip().startswith('"""'), f"{flag} has no docstring"


def test_the_threshold_default_lives_in_its_options_only():
    assert ThresholdOptions().threshold == 0.5
    policy = build_policy("threshold", PolicySettings(block_size=GAMMA), {"dspark_threshold": None})
    assert policy.options.threshold == 0.5
    assert build_policy("slot_threshold", PolicySettings(), {"threshold": 0.3}).options.threshold == 0.3
    assert VerificationPolicy("threshold", block_size=GAMMA).rule.options.threshold == 0.5
    assert "threshold" not in {f.name for f in dataclasses.fields(PolicySettings)}
    assert "verify_len" not in {f.name for f in dataclasses.fields(PolicySettings)}


def test_options_are_validated_by_the_policies_that_declare_them_whichever_is_chosen():
    with pytest.raises(ValueError, match=r"dspark_threshold must be a number in \[0, 1\]"):
        build_policy("fixed", PolicySettings(), {"threshold": 1.5})
    with pytest.raises(ValueError, match="dspark_verify_len must be a non-negative integer"):
        check_policy_options({"dspark_verify_len": 2.5})
    with pytest.raises(ValueError, match=r"dspark_verify_len must be in 0\.\.4 \(γ\), got 5"):
        build_policy("fixed", PolicySettings(block_size=4), {"verify_len": 5})
    with pytest.raises(ValueError, match=r"unknown policy option\(s\) \['dspark_verify_length'\].*'verify_len'"):
        build_policy("fixed", PolicySettings(), {"dspark_verify_length": 2})
    assert build_policy("fixed", PolicySettings(block_size=4), {"dspark_verify_len": 2}).options.verify_len == 2
    assert {"threshold", "verify_len"} <= set(policy_option_names())


def test_register_policy_refuses_undeclared_overrides_and_non_policies(registry_snapshot):
    class Planner(BasePolicy):
        def plan(self, rows, cap, draft_costs=None):
            raise AssertionError

    class Learner(BasePolicy):
        def observe(self, rows, verify_len, accepted):
            raise AssertionError

    class BadOptions(BasePolicy):
        options_class = dict

    with pytest.raises(TypeError, match=r"overrides plan\(\) but does not declare plans_rows = True"):
        register_policy("planner", Planner)
    with pytest.raises(TypeError, match=r"overrides observe\(\) but does not declare learns = True"):
        register_policy("learner", Learner)
    with pytest.raises(TypeError, match="options_class must be a dataclass subclassing"):
        register_policy("bad_options", BadOptions)
    with pytest.raises(TypeError, match=r"subclass hf_dspark\.scheduling\.BasePolicy"):
        register_policy("duck", type("Duck", (), {"plan": None, "lengths": None}))
    assert not {"planner", "learner", "bad_options", "duck"} & set(available_policies())


def test_undeclared_methods_are_not_called_and_declared_ones_are(registry_snapshot):
    calls = []

    @dataclass(frozen=True)
    class CountOptions(PolicyOptions):
        length: int = 1

    class Counting(BasePolicy):
        options_class = CountOptions
        plans_rows = learns = True

        def plan(self, rows, cap, draft_costs=None):
            calls.append("plan")
            return super().plan(rows, cap, draft_costs)

        def lengths(self, survival, rows, device):
            return torch.full((rows,), self.options.length, dtype=torch.long, device=device)

        def observe(self, rows, verify_len, accepted):
            calls.append(("observe", type(verify_len).__name__))

    register_policy("counting", Counting)
    target = make_target("llama", seed=5, eos_token_id=None)
    drafter = make_drafter(target, block_size=GAMMA, seed=3)
    ids, mask = ragged_prompts(2, seed=4)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                             dspark_policy="counting", dspark_length=2)
    assert torch.equal(output, reference)
    rounds = drafter.last_generation_stats.rounds
    assert calls.count("plan") == rounds and calls.count(("observe", "Tensor")) == rounds  # tensors: no host ints
    assert max(v for lens in drafter.last_generation_stats.verify_lens for v in lens.values()) == 2

    calls.clear()
    Counting.plans_rows = Counting.learns = False  # now undeclared: the loop must not call them
    target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                    dspark_policy="counting")
    assert calls == []


def test_auto_is_one_registered_policy_like_the_others(registry_snapshot, monkeypatch):
    register_policy("auto_copy", AutoPolicy)
    resolved = []
    monkeypatch.setattr(generation_policy, "load_or_profile_draft_curve", lambda drafter: resolved.append(drafter)
                        or DRAFT)
    target = make_target("llama", seed=21, eos_token_id=None)
    drafter = make_drafter(target, block_size=GAMMA)
    for name in ("auto_copy", "greedy"):
        options = DSparkGenerationOptions(dspark_policy=name, dspark_step_curve=FLAT)
        policy = generation_policy.policy_from_options(options, GAMMA, target=target, drafter=drafter)
        assert policy.draft_curve is (DRAFT if name == "auto_copy" else None)
    assert resolved == [drafter]  # looked up for the policy that declares needs_draft_curve only

    ids, mask = ragged_prompts(2, seed=31)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    runs = {}
    for name in ("auto", "auto_copy"):
        oracle = oracle_for(target, GAMMA, reference, mask)
        output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, assistant_model=oracle,
                                 dspark_policy=name, dspark_step_curve=FLAT, dspark_draft_curve=DRAFT,
                                 dspark_measured_costs=False)
        assert torch.equal(output, reference)
        runs[name] = oracle.last_generation_stats.verify_lens
    assert runs["auto_copy"] == runs["auto"]

    wrong_mode = VerificationPolicy("auto_copy", block_size=GAMMA, step_curve=FLAT, draft_curve=DRAFT, greedy=True)
    with pytest.raises(ValueError, match=r"the 'auto_copy' policy was built for greedy"):
        DSparkEngine(target, drafter, policy=wrong_mode, do_sample=True)
