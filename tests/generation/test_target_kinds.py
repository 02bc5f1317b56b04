"""Targets as users hand them over (PEFT adapters, accelerate device maps and offloading, quantization,
`torch.compile`, training mode, gradient checkpointing, generation-config overrides, bf16): greedy fp32 DSpark
equals plain `generate`, or the target is refused before any work with a message naming the fix."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from hf_dspark.target.packed_linear import linear_packs_for
from tests.helpers import make_drafter, make_target, ragged_prompts

IDS, MASK = ragged_prompts(2, seed=5)
NEW = 16


def _both(target, drafter, generator=None, **kwargs):
    generator = target if generator is None else generator
    kwargs = {"max_new_tokens": NEW, "do_sample": False, **kwargs}
    reference = generator.generate(IDS, attention_mask=MASK, **kwargs)
    output = generator.generate(IDS, attention_mask=MASK, assistant_model=drafter, **kwargs)
    return reference, output


def _no_forward(target):
    """Make every target forward fail, so a refusal is shown to come before any work."""
    target.register_forward_pre_hook(lambda *_: pytest.fail("the target ran a forward before the refusal"))


# ---------------------------------------------------------------- PEFT
def test_peft_lora_adapters_unmerged_switched_disabled_and_merged():
    from peft import LoraConfig, get_peft_model

    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    base, _ = _both(target, drafter)
    model = get_peft_model(
        target,
        LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False),
        adapter_name="a",
    )
    model.add_adapter("b", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.eval()
    seen = []
    for step in ("a", "b", "disabled", "merged", "unmerged"):
        if step == "b":
            model.set_adapter("b")
        elif step == "merged":
            model.set_adapter("a")
            model.merge_adapter()
        elif step == "unmerged":
            model.unmerge_adapter()
        if step == "disabled":
            with model.disable_adapter():
                reference, output = _both(target, drafter, generator=model)
        else:
            reference, output = _both(target, drafter, generator=model)
        assert torch.equal(reference, output), step
        seen.append(reference)
    assert torch.equal(seen[2], base) and not torch.equal(seen[0], base) and not torch.equal(seen[0], seen[1])
    assert torch.equal(seen[3], seen[0]) or (seen[3] - seen[0]).abs().sum() < 4  # merging rounds differently
    merged = model.merge_and_unload()
    reference, output = _both(merged, drafter)
    assert torch.equal(reference, output)


# ---------------------------------------------------------------- accelerate
@pytest.fixture(scope="module")
def saved_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    make_target("llama", seed=21).save_pretrained(folder)
    return folder


DEVICE_MAPS = {
    "cpu": "cpu",
    "dict": {
        "model.embed_tokens": "cpu",
        "model.layers": "cpu",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    },
    "disk-offloaded layers": {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.layers.2": "disk",
        "model.layers.3": "cpu",
        "model.layers.4": "cpu",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    },
}


@pytest.mark.parametrize("name", list(DEVICE_MAPS))
def test_device_maps_match_plain_generate(saved_target, tmp_path, name):
    target = AutoModelForCausalLM.from_pretrained(
        saved_target, device_map=DEVICE_MAPS[name], dtype=torch.float32, offload_folder=str(tmp_path)
    ).eval()
    reference, output = _both(target, make_drafter(target))
    assert torch.equal(reference, output)


def test_offloaded_embedding_and_lm_head_are_refused_before_any_work(saved_target):
    from accelerate import cpu_offload

    target = AutoModelForCausalLM.from_pretrained(saved_target, dtype=torch.float32).eval()
    drafter = make_drafter(target)
    cpu_offload(target, execution_device="cpu")
    _no_forward(target)
    with pytest.raises(ValueError, match=r"input embedding weight is on the meta device.*'model\.embed_tokens'"):
        target.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, assistant_model=drafter)


# ---------------------------------------------------------------- quantization
@pytest.mark.parametrize("scope", ["layers", "layers and lm_head"])
def test_dynamic_int8_quantization_is_refused(scope):
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    quantize = torch.ao.quantization.quantize_dynamic
    if scope == "layers":
        target.model = quantize(target.model, {torch.nn.Linear}, dtype=torch.qint8)
    else:
        target = quantize(target, {torch.nn.Linear}, dtype=torch.qint8)
    _no_forward(target)
    with pytest.raises(ValueError, match=r"torch\.ao quantization.*unquantized target"):
        target.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, assistant_model=drafter)


# ---------------------------------------------------------------- torch.compile
def test_compiled_forward_matches_plain_and_runs_unpacked():
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    target.forward = torch.compile(target.forward, backend="eager")
    assert linear_packs_for(target, None) is None
    with pytest.raises(ValueError, match="compiled"):
        linear_packs_for(target, True)
    reference, output = _both(target, drafter, max_new_tokens=8)
    assert torch.equal(reference, output)


def test_compiled_module_wrapper_matches_plain():
    target = make_target("llama", seed=21)
    reference, output = _both(target, make_drafter(target), generator=torch.compile(target, backend="eager"))
    assert torch.equal(reference, output)


@pytest.mark.slow
def test_inductor_compiled_forward_matches_plain():
    """Inductor cannot lower the packed oneDNN linears; the loop runs unpacked (minutes: it recompiles)."""
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    target.forward = torch.compile(target.forward)
    reference, output = _both(target, drafter, max_new_tokens=8)
    assert torch.equal(reference, output)


# ---------------------------------------------------------------- training mode
def test_training_mode_with_dropout_is_refused_before_any_work():
    target = make_target("llama", seed=21, attention_dropout=0.3)
    drafter = make_drafter(target)
    target.train()
    _no_forward(target)
    with pytest.raises(
        ValueError,
        match=r"training mode with dropout active \(config\.attention_dropout=0\.3\).*"
        r"target\.eval\(\)",
    ):
        target.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, assistant_model=drafter)


def test_lora_dropout_in_training_mode_is_named():
    from peft import LoraConfig, get_peft_model

    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    model = get_peft_model(target, LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.1))
    model.train()
    with pytest.raises(ValueError, match=r"lora_dropout.*p=0\.1"):
        model.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, assistant_model=drafter)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_dropout_free_target_in_any_mode_with_gradient_checkpointing(mode):
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    target.gradient_checkpointing_enable()
    target.train(mode == "train")
    reference, output = _both(target, drafter)
    assert torch.equal(reference, output)


# ---------------------------------------------------------------- generation config, dtype
def test_generation_config_overrides_match_plain():
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    target.generation_config.max_new_tokens = 7
    target.generation_config.repetition_penalty = 1.3
    reference = target.generate(IDS, attention_mask=MASK)
    output = target.generate(IDS, attention_mask=MASK, assistant_model=drafter)
    assert torch.equal(reference, output) and output.shape[1] == IDS.shape[1] + 7
    config = GenerationConfig(
        max_new_tokens=9, no_repeat_ngram_size=2, do_sample=False, eos_token_id=2, pad_token_id=0
    )
    reference = target.generate(IDS, attention_mask=MASK, generation_config=copy.deepcopy(config))
    output = target.generate(
        IDS, attention_mask=MASK, generation_config=copy.deepcopy(config), assistant_model=drafter
    )
    assert torch.equal(reference, output)


def test_bf16_target_generates_with_a_bf16_drafter():
    """bf16 greedy identity is not promised (docs/generation.md); the call runs and the drafter follows."""
    target = make_target("llama", seed=21).to(torch.bfloat16)
    drafter = make_drafter(target)
    reference, output = _both(target, drafter)
    first = IDS.shape[1] + 1  # the prefill's token: the same forward as plain's
    assert output.shape == reference.shape and torch.equal(output[:, :first], reference[:, :first])
    assert next(drafter.parameters()).dtype == torch.bfloat16


# ---------------------------------------------------------------- binding to a wrapper
def test_drafter_bound_to_a_peft_or_compile_wrapper_serves_it():
    """`bind_target(wrapper)` binds the model whose `generate` runs (the PEFT base model, the compiled original);
    it used to bind the wrapper and send `wrapper.generate` to transformers' stock loop with an AttributeError."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        make_target("llama", seed=21), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    ).eval()
    drafter = make_drafter(model)
    assert drafter.bound_to(model) and drafter.bound_to(model.get_base_model())
    reference, output = _both(model, drafter)
    assert torch.equal(reference, output)
    target = make_target("llama", seed=22)
    wrapper = torch.compile(target, backend="eager")
    drafter = make_drafter(wrapper)
    assert drafter.bound_to(target)
    reference, output = _both(target, drafter, generator=wrapper)
    assert torch.equal(reference, output)


def test_module_compile_runs_unpacked_and_matches_plain():
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    target.compile(backend="eager")
    assert linear_packs_for(target, None) is None
    reference, output = _both(target, drafter, max_new_tokens=8)
    assert torch.equal(reference, output)


@pytest.mark.parametrize("policy", ["none", "fixed"])
def test_engine_refuses_the_same_targets(policy):
    from hf_dspark.serving.engine import DSparkEngine

    target = make_target("llama", seed=21, attention_dropout=0.2)
    drafter = make_drafter(target) if policy != "none" else None
    target.train()
    with pytest.raises(ValueError, match=r"target\.eval\(\)"):
        DSparkEngine(target, drafter, policy=policy)
    target.eval()
    target.model = torch.ao.quantization.quantize_dynamic(target.model, {torch.nn.Linear}, dtype=torch.qint8)
    with pytest.raises(ValueError, match=r"torch\.ao quantization"):
        DSparkEngine(target, drafter, policy=policy)


def test_lora_on_the_embedding_and_lm_head_matches_plain():
    """The drafter shares the base embedding and head (drafts only); verification runs the adapted target."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules=["q_proj", "lm_head", "embed_tokens"], init_lora_weights=False)
    model = get_peft_model(make_target("llama", seed=21), config).eval()
    reference, output = _both(model, make_drafter(model))
    assert torch.equal(reference, output)


def test_mixed_adapter_batches_are_refused_before_any_work():
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(make_target("llama", seed=21), config, adapter_name="a")
    model.add_adapter("b", config)
    model.eval()
    drafter = make_drafter(model)
    _no_forward(model.get_base_model())
    with pytest.raises(ValueError, match=r"per-row adapter_names.*set_adapter"):
        model.generate(
            input_ids=IDS,
            attention_mask=MASK,
            max_new_tokens=4,
            do_sample=False,
            assistant_model=drafter,
            adapter_names=["a", "b"],
        )


def _perturbed_peft(config):
    from peft import get_peft_model

    model = get_peft_model(make_target("llama", seed=21), config).eval()
    with torch.no_grad():  # IA3 / LoHa / prompt tuning start close to the identity
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


@pytest.mark.parametrize("kind", ["ia3", "loha"])
def test_other_weight_adapters_match_plain(kind):
    from peft import IA3Config, LoHaConfig, TaskType

    if kind == "ia3":
        config = IA3Config(
            task_type=TaskType.CAUSAL_LM,
            target_modules=["k_proj", "v_proj", "down_proj"],
            feedforward_modules=["down_proj"],
        )
    else:
        config = LoHaConfig(target_modules=["q_proj", "v_proj"], r=4)
    model = _perturbed_peft(config)
    reference, output = _both(model, make_drafter(model))
    assert torch.equal(reference, output)


def test_prompt_tuning_is_refused_before_any_work():
    """PEFT prompt learning adds virtual tokens in prepare_inputs_for_generation, which the loop never calls:
    DSpark used to return plain decoding without them."""
    from peft import PromptTuningConfig, TaskType

    model = _perturbed_peft(PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4))
    drafter = make_drafter(model)
    _no_forward(model.get_base_model())
    with pytest.raises(ValueError, match=r"prepare_inputs_for_generation is replaced by PeftModelForCausalLM's"):
        model.generate(input_ids=IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, assistant_model=drafter)
