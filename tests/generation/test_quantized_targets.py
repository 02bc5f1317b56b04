"""Targets quantized by quanto, torchao, bitsandbytes, GPTQ, AWQ or HQQ (or any transformers quantizer) are refused
before any work, with the library named and the fix.

None of those libraries is installed here, so the layers and weights below are small stand-ins: classes whose name
and `__module__` are the library's own (`bitsandbytes.nn.modules.Linear4bit`, ...). Detection reads only those
names, `model.hf_quantizer` and `config.quantization_config`, never importing the library, so a stand-in whose
names match is detected exactly as the real class would be; it computes like the `nn.Linear` it wraps.
"""

from types import SimpleNamespace

import pytest
import torch

from hf_dspark.generation import loop
from hf_dspark.serving.engine import DSparkEngine
from hf_dspark.target.checks import quantization_found
from tests.helpers import make_drafter, make_target, ragged_prompts

IDS, MASK = ragged_prompts(2, seed=5)
FIX = r"dequantize\(\).*quantization_config"


def _stand_in(name: str, module: str, base: type = torch.nn.Linear) -> type:
    return type(name, (base,), {"__module__": module})


LAYERS = {
    "bitsandbytes 4-bit": (_stand_in("Linear4bit", "bitsandbytes.nn.modules"), "bitsandbytes"),
    "bitsandbytes 8-bit": (_stand_in("Linear8bitLt", "bitsandbytes.nn.modules"), "bitsandbytes"),
    "quanto": (_stand_in("QLinear", "optimum.quanto.nn.qlinear"), "quanto"),
    "AutoGPTQ": (_stand_in("QuantLinear", "auto_gptq.nn_modules.qlinear.qlinear_exllamav2"), "GPTQ"),
    "GPTQModel": (_stand_in("MarlinQuantLinear", "gptqmodel.nn_modules.qlinear.marlin"), "GPTQ"),
    "AutoAWQ": (_stand_in("WQLinear_GEMM", "awq.modules.linear.gemm"), "AWQ"),
    "GPTQModel AWQ": (_stand_in("AwqGEMMQuantLinear", "gptqmodel.nn_modules.qlinear.gemm_awq"), "AWQ"),
    "HQQ": (_stand_in("HQQLinear", "hqq.core.quantize"), "HQQ"),
}


class AffineQuantizedTensor(torch.Tensor):
    """Stand-in for torchao's quantized weight tensor subclass (torchao swaps the weight, not the module)."""


AffineQuantizedTensor.__module__ = "torchao.dtypes.affine_quantized_tensor"


def _swap_layer(target, cls: type) -> None:
    old = target.model.layers[1].mlp.down_proj
    new = cls(old.in_features, old.out_features, bias=False)
    new.load_state_dict(old.state_dict())
    target.model.layers[1].mlp.down_proj = new


def _guard(target, monkeypatch):
    """Fail the test if the call reaches a target forward or builds its policy before the refusal."""
    target.register_forward_pre_hook(lambda *_: pytest.fail("the target ran a forward before the refusal"))
    monkeypatch.setattr(loop, "policy_from_options", lambda *a, **k: pytest.fail("policy built before the refusal"))


def _refused(target, drafter, library: str, monkeypatch) -> None:
    _guard(target, monkeypatch)
    with pytest.raises(ValueError, match=rf"quantized with {library}.*{FIX}"):
        target.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, assistant_model=drafter)
    with pytest.raises(ValueError, match=rf"quantized with {library}"):
        DSparkEngine(target, drafter, policy="fixed")


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_quantized_layers_are_refused_naming_the_library(kind, monkeypatch):
    cls, library = LAYERS[kind]
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    _swap_layer(target, cls)
    assert quantization_found(target)[0] == library
    _refused(target, drafter, library, monkeypatch)


def test_torchao_quantized_weights_are_refused(monkeypatch):
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    layer = target.model.layers[2].self_attn.q_proj
    layer._parameters["weight"] = layer.weight.detach().as_subclass(AffineQuantizedTensor)
    assert quantization_found(target)[0] == "torchao"
    _refused(target, drafter, "torchao", monkeypatch)


@pytest.mark.parametrize(
    ("method", "library"),
    [
        ("bitsandbytes", "bitsandbytes"),
        ("gptq", "GPTQ"),
        ("awq", "AWQ"),
        ("hqq", "HQQ"),
        ("quanto", "quanto"),
        ("torchao", "torchao"),
        ("fp8", "fp8"),
    ],
)
@pytest.mark.parametrize("where", ["hf_quantizer", "config"])
def test_transformers_quantized_targets_are_refused(method, library, where, monkeypatch):
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    if where == "hf_quantizer":  # what from_pretrained(..., quantization_config=...) leaves on the model
        monkeypatch.setattr(
            target,
            "hf_quantizer",
            SimpleNamespace(quantization_config=SimpleNamespace(quant_method=method)),
            raising=False,
        )
    else:  # a quantized checkpoint's config.json
        target.config.quantization_config = {"quant_method": method, "bits": 4}
    assert quantization_found(target)[0] == library
    _refused(target, drafter, library, monkeypatch)


def test_an_unquantized_target_is_not_flagged():
    target = make_target("llama", seed=21)
    assert quantization_found(target) is None


def _gguf_loaded(target, monkeypatch):
    """What from_pretrained(..., gguf_file=...) leaves on a model whose GGUF blocks it dequantized on load (the
    packaged default target): transformers' GGUF quantizer and config, and plain float weights."""
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    quantizer = GgufHfQuantizer(GgufConfig())
    monkeypatch.setattr(target, "hf_quantizer", quantizer, raising=False)
    monkeypatch.setattr(target.config, "quantization_config", quantizer.quantization_config, raising=False)


def test_a_gguf_checkpoint_dequantized_on_load_is_served_like_plain(monkeypatch):
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    _gguf_loaded(target, monkeypatch)
    assert quantization_found(target) is None
    options = dict(attention_mask=MASK, max_new_tokens=8, do_sample=False)
    assert torch.equal(target.generate(IDS, assistant_model=drafter, **options), target.generate(IDS, **options))


def test_a_gguf_checkpoint_that_kept_its_quantized_blocks_is_refused(monkeypatch):
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    _gguf_loaded(target, monkeypatch)
    _swap_layer(target, _stand_in("GgufLinear", "transformers.integrations.gguf.modules"))
    assert quantization_found(target)[0] == "GGUF"
    _refused(target, drafter, "GGUF", monkeypatch)


def test_packed_integer_weights_of_an_unknown_library_are_refused(monkeypatch):
    target = make_target("llama", seed=21)
    drafter = make_drafter(target)
    layer = target.model.layers[1].mlp.down_proj
    layer.register_parameter("qweight", torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.int32), requires_grad=False))
    assert quantization_found(target) == (
        "an unknown library",
        "model.layers.1.mlp.down_proj.qweight holds torch.int32 values, not floating-point weights",
    )
    _guard(target, monkeypatch)
    with pytest.raises(ValueError, match=r"qweight holds torch.int32 values"):
        target.generate(IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, assistant_model=drafter)
