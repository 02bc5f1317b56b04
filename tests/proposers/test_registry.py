"""The proposer registry: the built-ins by name, specs parsed and refused with the fix, the command line reading
the registry, and the docs' "Adding a proposer" example registered and run end to end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hf_dspark.cli import build_parser, main
from hf_dspark.cli.loaders import load_drafter_spec
from hf_dspark.proposers import (
    HybridDrafter,
    OracleDrafter,
    PromptLookupProposer,
    SuffixProposer,
    available_proposers,
    build_proposer,
    get_proposer,
    register_proposer,
    split_proposer_spec,
)
from hf_dspark.proposers import registry as proposer_registry
from tests.helpers import make_target, ragged_prompts

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-proposer.md"
BUILTINS = ("prompt-lookup", "suffix", "hybrid", "hybrid-suffix", "oracle")


def _docs_example() -> str:
    match = re.search(r"<!-- example-proposer -->\n```python\n(.*?)```\n<!-- /example-proposer -->", DOC.read_text(),
                      re.S)
    assert match, "docs/adding-a-proposer.md lost its example proposer block"
    return match.group(1)


@pytest.fixture
def registry_snapshot():
    saved = dict(proposer_registry._REGISTRY)
    yield
    proposer_registry._REGISTRY.clear()
    proposer_registry._REGISTRY.update(saved)


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=5, eos_token_id=None)


def test_the_builtins_are_registered_and_an_unknown_name_lists_them():
    assert available_proposers()[: len(BUILTINS)] == BUILTINS
    assert get_proposer("hybrid").argument == "drafter" and get_proposer("oracle").needs_reference
    assert split_proposer_spec("prompt-lookup:5")[1] == "5" and split_proposer_spec("some/folder") is None
    with pytest.raises(ValueError, match=r"unknown proposer 'lookup'; choose one of \['prompt-lookup', 'suffix'"):
        get_proposer("lookup")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prompt-lookup:x", r"γ after 'prompt-lookup:' must be an integer >= 1, e.g. prompt-lookup:7"),
        ("suffix:0", r"γ after 'suffix:' must be an integer >= 1"),
        ("hybrid", r"name the DSpark drafter after 'hybrid:', e.g. hybrid:untrained:7"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(target, spec, message):
    with pytest.raises(ValueError, match=message):
        build_proposer(target, spec, lambda inner: pytest.fail("no drafter should load"))


def test_register_proposer_validates(registry_snapshot):
    with pytest.raises(ValueError, match="lower-case letters"):
        register_proposer("My Proposer", lambda target, gamma: None)
    with pytest.raises(ValueError, match="not 'untrained'"):
        register_proposer("untrained", lambda target, gamma: None)
    with pytest.raises(TypeError, match="needs a callable factory"):
        register_proposer("mine", "not callable")
    with pytest.raises(ValueError, match="argument must be one of"):
        register_proposer("mine", lambda target, gamma: None, argument="path")
    with pytest.raises(ValueError, match="already registered"):
        register_proposer("suffix", lambda target, gamma: None)


def test_command_line_specs_build_the_registered_proposers(target):
    lookup = load_drafter_spec(target, "prompt-lookup:5")
    assert isinstance(lookup, PromptLookupProposer) and lookup.config.block_size == 5
    assert lookup.eval_source == "prompt-lookup:5"
    assert isinstance(load_drafter_spec(target, "suffix"), SuffixProposer)
    hybrid = load_drafter_spec(target, "hybrid-suffix:untrained:4")
    assert isinstance(hybrid, HybridDrafter) and hybrid.config.block_size == 4
    oracle = build_proposer(target, "oracle:3", load_drafter_spec)
    assert isinstance(oracle, OracleDrafter) and oracle.config.block_size == 3 and oracle.reference == []


def test_eval_refuses_a_proposer_that_needs_references_and_its_help_lists_the_registered(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--drafters", "o=oracle:4", "--out", str(tmp_path / "eval.json")])
    assert exit_info.value.code == 2
    assert "the 'oracle' proposer drafts from reference continuations" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--drafters", "p=prompt-lookup:x", "--out", str(tmp_path / "eval.json")])
    assert "γ after 'prompt-lookup:' must be an integer >= 1" in capsys.readouterr().err
    eval_parser = build_parser()._subparsers._group_actions[0].choices["eval"]
    help_text = " ".join(eval_parser.format_help().split())
    assert all(f"`{name}" in help_text for name in BUILTINS)


def test_the_docs_example_proposer_runs_by_name_and_matches_plain_greedy(target, registry_snapshot):
    namespace: dict = {}
    exec(compile(_docs_example(), str(DOC), "exec"), namespace)  # registers "repeat"
    assert get_proposer("repeat").factory is namespace["repeat_proposer"]
    drafter = load_drafter_spec(target, "repeat:3")
    assert isinstance(drafter, namespace["RepeatProposer"]) and drafter.eval_source == "repeat:3"
    ids, mask = ragged_prompts(3, seed=4)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                             dspark_policy="fixed")
    assert torch.equal(output, reference)
    verify_lens = [length for lens in drafter.last_generation_stats.verify_lens for length in lens.values()]
    assert verify_lens and max(verify_lens) == 3  # γ = 3 from the spec: the proposer really drafted
    eval_parser = build_parser()._subparsers._group_actions[0].choices["eval"]
    assert "`repeat[:γ]`" in " ".join(eval_parser.format_help().split())
