"""The policy registry, and the docs' "Adding a policy" example registered and run end to end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hf_dspark.scheduling import BasePolicy, PolicySettings, available_policies, get_policy, register_policy
from hf_dspark.scheduling.registry import _REGISTRY
from tests.helpers import make_drafter, make_target, ragged_prompts

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-policy.md"
BUILTINS = ("auto", "fixed", "greedy", "lagged", "threshold", "greedy_padded", "lagged_padded")


def _docs_example() -> str:
    match = re.search(r"<!-- example-policy -->\n```python\n(.*?)```\n<!-- /example-policy -->", DOC.read_text(), re.S)
    assert match, "docs/adding-a-policy.md lost its example policy block"
    return match.group(1)


@pytest.fixture
def registry_snapshot():
    saved = dict(_REGISTRY)
    yield
    _REGISTRY.clear()
    _REGISTRY.update(saved)


def test_builtins_are_registered_and_lookups_name_the_known_policies():
    assert available_policies()[: len(BUILTINS)] == BUILTINS
    assert get_policy(" Fixed ") is get_policy("fixed")
    with pytest.raises(ValueError, match=r"Unknown policy 'fastest'; choose one of \['auto', 'fixed'"):
        get_policy("fastest")


def test_the_old_bench_spelling_is_deprecated_not_broken():
    with pytest.warns(FutureWarning, match="'scheduler' is deprecated; use 'lagged_padded'"):
        assert get_policy("scheduler") is get_policy("lagged_padded")


def test_register_policy_validates(registry_snapshot):
    class Mine(BasePolicy):
        pass

    with pytest.raises(ValueError, match="lower-case identifier"):
        register_policy("My Policy", Mine)
    with pytest.raises(ValueError, match="reserved"):
        register_policy("none", Mine)
    with pytest.raises(TypeError, match="needs a class"):
        register_policy("mine", Mine(PolicySettings()))
    with pytest.raises(TypeError, match="missing plan, lengths"):
        register_policy("mine", type("Bare", (), {}))
    with pytest.raises(ValueError, match="already registered"):
        register_policy("fixed", Mine)
    register_policy("mine", Mine)
    assert get_policy("mine") is Mine and "mine" in available_policies()


def test_the_docs_example_policy_runs_in_generate_and_matches_plain_greedy(registry_snapshot):
    namespace: dict = {}
    exec(compile(_docs_example(), str(DOC), "exec"), namespace)  # registers "half"
    assert get_policy("half") is namespace["HalfPolicy"]
    target = make_target("llama", seed=5, eos_token_id=None)
    drafter = make_drafter(target, block_size=4, seed=3)
    ids, mask = ragged_prompts(3, seed=4)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    verified = {}
    for min_len in (0, 2):
        output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                                 assistant_model=drafter, dspark_policy="half", dspark_min_len=min_len)
        assert torch.equal(output, reference)
        verify_lens = [length for lens in drafter.last_generation_stats.verify_lens for length in lens.values()]
        assert verify_lens and max(verify_lens) <= 2  # ⌈γ/2⌉ with γ = 4: the policy really ran
        verified[min_len] = verify_lens
    assert verified[2].count(2) > verified[0].count(2)  # its own option reached it through generate
    with pytest.raises(ValueError, match="dspark_min_len must be an integer >= 0"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter, dspark_policy="half",
                        dspark_min_len=-1)
