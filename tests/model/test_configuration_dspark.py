import json

import pytest
from transformers import AutoConfig, GemmaConfig, MistralConfig, Qwen2Config

from hf_dspark import DSparkConfig
from hf_dspark.model.configuration_dspark import default_target_layer_ids
from tests.helpers import tiny_llama_config, tiny_qwen3_config


def test_round_trip(tmp_path):
    config = DSparkConfig.from_target(tiny_llama_config(), block_size=6, head_type="rnn", markov_rank=16)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, DSparkConfig)
    strip = lambda d: {k: v for k, v in d.items() if k != "_name_or_path"}  # noqa: E731
    assert strip(loaded.to_dict()) == strip(config.to_dict())
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "dspark" and raw["sample_from_anchor"] is True


def test_default_taps_evenly_spaced_and_never_last():
    assert default_target_layer_ids(30) == [1, 8, 14, 20, 27]
    assert default_target_layer_ids(36, 5)[-1] == 33
    for layers in range(3, 60):
        taps = default_target_layer_ids(layers)
        assert taps[0] == 1 or layers < 5
        assert max(taps) <= max(1, layers - 3) and (layers - 1) not in taps


@pytest.mark.parametrize(
    "make, qk_norm, multiplier",
    [
        (tiny_llama_config, False, 1.0),
        (tiny_qwen3_config, True, 1.0),
        (lambda: Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=100), False, 1.0),
        (lambda: MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=100), False, 1.0),
        (lambda: GemmaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                             num_key_value_heads=1, head_dim=16, vocab_size=100), False, 1.0),
    ],
)
def test_from_target_families(make, qk_norm, multiplier):
    target = make()
    config = DSparkConfig.from_target(target)
    assert config.hidden_size == target.hidden_size
    assert config.num_key_value_heads == target.num_key_value_heads
    assert config.vocab_size == target.vocab_size
    assert config.use_qk_norm is qk_norm
    assert config.embedding_multiplier == pytest.approx(multiplier)
    assert config.target_model_type == target.model_type
    assert config.num_target_layers - 1 not in config.target_layer_ids


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"target_layer_ids": [1, 4]}, "last layer"),
        ({"target_layer_ids": [9]}, "outside"),
        ({"target_layer_ids": [-2, 1]}, "-1, the embedding output"),
        ({"block_size": 0}, "block_size"),
        ({"markov_rank": 0}, "markov_rank"),
        ({"head_type": "lstm"}, "head_type"),
        ({"calibration_temperatures": [1.0, 1.0]}, "one temperature per position"),
        ({"calibration_temperatures": [1.0, -1.0, 1.0, 1.0], "block_size": 4}, "> 0"),
        ({"mask_token_id": 10_000}, "outside the vocabulary"),
        ({"sample_from_anchor": False}, "DFlash"),
        ({"block_size": 2.0}, "block_size must be an integer"),
        ({"block_size": True}, "block_size must be an integer"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be an integer >= 1"),
        ({"num_attention_heads": 0}, "num_attention_heads must be an integer >= 1"),
        ({"target_layer_ids": [1.5]}, "list of target layer indices"),
        ({"target_layer_ids": "0,2"}, "list of target layer indices"),
        ({"heldout_acceptance": [0.5]}, "heldout_acceptance must map a decoding mode"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers must be an integer"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be a number > 0"),
        ({"intermediate_size": 0}, "intermediate_size must be an integer >= 1"),
    ],
)
def test_invalid_combinations_name_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        DSparkConfig.from_target(tiny_llama_config(), **overrides)


def test_rank_zero_is_fine_without_a_head():
    config = DSparkConfig.from_target(tiny_llama_config(), head_type="none", markov_rank=0)
    assert config.confidence_with_markov is False


def test_greedy_temperatures_fall_back_to_sampling():
    config = DSparkConfig.from_target(tiny_llama_config(), block_size=3, calibration_temperatures=[1.0, 2.0, 3.0])
    assert config.temperatures_for(greedy=True) == [1.0, 2.0, 3.0]
    config.calibration_temperatures_greedy = [0.5, 0.5, 0.5]
    assert config.temperatures_for(greedy=True) == [0.5, 0.5, 0.5]


def test_the_embedding_output_can_be_tapped():
    """DeepSpec's tap -1 is the embedding output; the drafter then reads hidden_states[0]."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.generation.drafting import feature_layers

    config = DSparkConfig.from_target(tiny_llama_config(), target_layer_ids=[-1, 1])
    assert config.target_layer_ids == [-1, 1]
    assert feature_layers(DSparkDrafter(config)) == [0, 2]
