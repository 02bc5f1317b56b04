"""configs/recipe.yaml: every key is a training option whose library default is the recipe's value, so
`hf-dspark train --data ... --output_dir ...` trains the recipe. The exceptions are target-specific and listed here."""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml
from transformers import HfArgumentParser

from hf_dspark import DSparkConfig
from hf_dspark.training.train import DSparkTrainConfig
from hf_dspark.training.trainer import DSparkTrainingArguments

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "recipe.yaml"
DATA = str(REPO / "data" / "train_regenerated")
SHAPE = ("block_size", "num_hidden_layers", "head_type", "markov_rank")
# Recipe keys that may differ from the library default, with the reason.
TARGET_SPECIFIC = {
    "mask_token_id": "a token of the embedded target's tokenizer (SmolLM2's <empty_output>); the default, a learned "
    "mask embedding, suits every target",
}


def _recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text(encoding="utf-8"))


def _library_defaults() -> dict:
    defaults = {}
    for config_class in (DSparkTrainConfig, DSparkTrainingArguments):
        for f in fields(config_class):
            if f.default is not MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not MISSING:
                defaults[f.name] = f.default_factory()
    return defaults


def test_every_recipe_key_is_a_training_option(tmp_path):
    parser = HfArgumentParser((DSparkTrainConfig, DSparkTrainingArguments))
    recipe = _recipe()
    config, _ = parser.parse_dict({**recipe, "data": [DATA], "output_dir": str(tmp_path)})
    own = {key: value for key, value in recipe.items() if hasattr(config, key)}  # unknown keys raise above
    assert own and all(getattr(config, key) == value for key, value in own.items())


@pytest.mark.parametrize("key", sorted(_recipe()))
def test_every_recipe_value_is_the_library_default(key):
    value, default = _recipe()[key], _library_defaults()[key]
    if key in TARGET_SPECIFIC:
        assert value != default, f"{key} now equals the default; drop it from TARGET_SPECIFIC"
    else:
        assert value == default, f"configs/recipe.yaml sets {key}: {value!r}, the library default is {default!r}"


def test_training_without_flags_is_training_with_the_recipe(tmp_path):
    """`hf-dspark train --data ... --output_dir ...` builds the configs the recipe's flags build (compared after the
    configs' own conversions, e.g. `report_to: none` becoming `[]`)."""
    parser = HfArgumentParser((DSparkTrainConfig, DSparkTrainingArguments))
    required = {"data": [DATA], "output_dir": str(tmp_path)}
    with_recipe = parser.parse_dict({**_recipe(), **required})
    without = parser.parse_dict(required)
    for key in _recipe():
        if key not in TARGET_SPECIFIC:
            assert [getattr(c, key) for c in with_recipe if hasattr(c, key)] == [
                getattr(c, key) for c in without if hasattr(c, key)
            ], key


def test_the_recipe_trains_the_library_default_drafter_shape():
    recipe = _recipe()
    config_defaults = {name: p.default for name, p in inspect.signature(DSparkConfig.__init__).parameters.items()}
    train_defaults = {f.name: f.default for f in fields(DSparkTrainConfig)}
    for key in SHAPE:
        assert recipe[key] == train_defaults[key] == config_defaults[key], key
