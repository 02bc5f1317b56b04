"""`DSparkGenerationOptions`: parsed once from a GenerationConfig, validated per field (a policy's own options by
that policy), rendered for the README."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest
from transformers import GenerationConfig

from hf_dspark.generation.options import (
    DSparkGenerationOptions,
    check_option_names,
    option_help,
    option_names,
    options_markdown_table,
    own_option_names,
)
from hf_dspark.generation.policy import policy_from_config
from hf_dspark.scheduling.threshold import ThresholdOptions


def test_parsed_from_a_generation_config():
    config = GenerationConfig(do_sample=False, dspark_policy="fixed", dspark_verify_len=2, temperature=None)
    options = DSparkGenerationOptions.from_generation_config(config)
    assert (options.dspark_policy, options.policy_options) == ("fixed", {"dspark_verify_len": 2})
    policy = policy_from_config(config, block_size=4)
    assert (policy.name, policy.rule.options.verify_len, policy.greedy) == ("fixed", 2, True)


def test_overrides_replace_what_the_config_holds():
    config = GenerationConfig(dspark_policy="fixed", dspark_record_confidence=False)
    options = DSparkGenerationOptions.from_generation_config(config, dspark_record_confidence=True)
    assert (options.dspark_policy, options.dspark_record_confidence) == ("fixed", True)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("dspark_policy", "fastest", r"dspark_policy must be one of \['auto'"),
        ("dspark_measured_costs", "yes", "dspark_measured_costs must be True or False"),
        ("dspark_policy_memory", object(), "dspark_policy_memory must be a hf_dspark.scheduling.PolicyMemory"),
        ("dspark_step_curve", "/no/such/curve.json", "dspark_step_curve: no such file '/no/such/curve.json'"),
        ("dspark_observers", "rounds", "dspark_observers must be a list of round observers"),
    ],
)
def test_each_field_is_validated_with_its_name(field, value, match):
    with pytest.raises(ValueError, match=match):
        DSparkGenerationOptions(**{field: value})
    with pytest.raises(ValueError, match=match):  # as generate parses them
        DSparkGenerationOptions.from_generation_config(GenerationConfig(**{field: value}))


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("dspark_threshold", 1.5, r"dspark_threshold must be a number in \[0, 1\]"),
        ("dspark_verify_len", -1, "dspark_verify_len must be a non-negative integer"),
    ],
)
def test_a_policys_own_options_are_validated_by_that_policy(option, value, match):
    """`dspark_threshold` / `dspark_verify_len` are the policies' own settings: checked by their options classes,
    whichever policy the call chooses."""
    with pytest.raises(ValueError, match=match):
        DSparkGenerationOptions.from_generation_config(GenerationConfig(dspark_policy="auto", **{option: value}))


def test_the_threshold_default_lives_in_the_threshold_policy_only():
    """No default for a policy's own option outside its options class: unset, the policy gets the class default."""
    assert "threshold" not in {item.name.removeprefix("dspark_") for item in fields(DSparkGenerationOptions)}
    policy = policy_from_config(GenerationConfig(dspark_policy="threshold"), block_size=4)
    assert policy.rule.options.threshold == ThresholdOptions().threshold
    source = OPTIONS_MODULE.read_text(encoding="utf-8")
    assert not re.search(r"\b0\.5\b", source), "a policy default restated in generation/options.py"


def test_one_description_per_option_and_the_table_lists_them():
    names = option_names()
    assert names[: len(own_option_names())] == own_option_names()
    assert {"dspark_verify_len", "dspark_threshold"} <= set(names)
    help_texts = option_help()
    assert list(help_texts) == names and all(help_texts.values())
    assert "'threshold'" in help_texts["dspark_threshold"] and "'slot_threshold'" in help_texts["dspark_threshold"]
    table = options_markdown_table().splitlines()
    assert table[0] == "| option | what it takes |" and len(table) == 2 + len(names)
    assert all(f"`{name}`" in line for name, line in zip(names, table[2:]))
    with pytest.raises(ValueError, match="did you mean 'dspark_threshold'"):
        check_option_names({"dspark_treshold": 0.5})
    with pytest.raises(ValueError, match="did you mean 'dspark_threshold'"):
        DSparkGenerationOptions.from_generation_config(GenerationConfig(dspark_treshold=0.5))


SRC = Path(__file__).resolve().parents[2] / "src" / "hf_dspark"
OPTIONS_MODULE = SRC / "generation" / "options.py"


def option_reads(source: str, names: set[str]) -> list[str]:
    """Reads of the runtime options `names` that bypass `DSparkGenerationOptions`: `getattr(x, "dspark_...")` and
    `x.dspark_...` loads whose owner is not an options object (its source text names no `options`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        by_name = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in names
        )
        by_attribute = (
            isinstance(node, ast.Attribute)
            and node.attr in names
            and isinstance(node.ctx, ast.Load)
            and "options" not in ast.unparse(node.value)
        )
        if by_name or by_attribute:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_option_read_finder_finds_both_spellings():
    names = {"dspark_policy"}
    source = "a = getattr(config, 'dspark_policy', None)\nb = config.dspark_policy\nc = options.dspark_policy\n"
    assert option_reads(source, names) == ["1: getattr(config, 'dspark_policy', None)", "2: config.dspark_policy"]


def test_runtime_options_are_read_only_through_the_options_object():
    """Outside `options.py`, no module reads a `dspark_*` runtime option off a GenerationConfig or a namespace."""
    names = set(option_names())
    reads = {
        str(path.relative_to(SRC)): found
        for path in sorted(SRC.rglob("*.py"))
        if path != OPTIONS_MODULE and (found := option_reads(path.read_text(encoding="utf-8"), names))
    }
    assert reads == {}, f"read DSparkGenerationOptions.from_generation_config(...) instead: {reads}"
