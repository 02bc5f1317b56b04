"""The processor kind and the fastest dtype on it (hf_dspark.hardware)."""

from __future__ import annotations

import pytest
import torch

from hf_dspark import hardware


def test_processor_signature_names_the_architecture_and_capability():
    signature = hardware.processor_signature("cpu")
    assert signature.split("/")[1].removesuffix("+bf16") == torch.backends.cpu.get_cpu_capability()
    assert signature.endswith("+bf16") == hardware.native_bf16("cpu")


@pytest.mark.parametrize("native", [True, False])
def test_half_precision_on_a_cpu_without_native_bf16_is_warned(monkeypatch, caplog, native):
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": native)
    type(hardware.logger).warning_once.cache_clear()  # once per process: forget earlier tests' warnings
    with caplog.at_level("WARNING"):
        assert hardware.resolve_dtype("bfloat16", "cpu") == "bfloat16"  # kept: the user asked for it
        assert hardware.resolve_dtype("auto", "cpu") == ("bfloat16" if native else "float32")
        assert not hardware.warn_if_slow_dtype("float32", "cpu")
    assert ("slower than float32" in caplog.text) == (not native)
