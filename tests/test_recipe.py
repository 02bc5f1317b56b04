"""configs/recipe.yaml: every key is a training option, and the drafter shape it trains is the library's default."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from hf_dspark import DSparkConfig
from hf_dspark.training.train import DSparkTrainConfig
from hf_dspark.training.trainer import DSparkTrainingArguments

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "recipe.yaml"
SHAPE = ("block_size", "num_hidden_layers", "head_type", "markov_rank")


def _recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text(encoding="utf-8"))


def test_every_recipe_key_is_a_training_option(tmp_path):
    parser = HfArgumentParser((DSparkTrainConfig, DSparkTrainingArguments))
    recipe = _recipe()
    config, _ = parser.parse_dict({**recipe, "data": ["data/train_regenerated"], "output_dir": str(tmp_path)})
    own = {key: value for key, value in recipe.items() if hasattr(config, key)}  # unknown keys raise above
    assert own and all(getattr(config, key) == value for key, value in own.items())


def test_the_recipe_trains_the_library_default_drafter_shape():
    recipe = _recipe()
    config_defaults = {name: p.default for name, p in inspect.signature(DSparkConfig.__init__).parameters.items()}
    train_defaults = {f.name: f.default for f in fields(DSparkTrainConfig)}
    for key in SHAPE:
        assert recipe[key] == train_defaults[key] == config_defaults[key], key
