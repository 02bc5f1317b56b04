"""The processor kind and the fastest dtype on it (hf_dspark.hardware)."""

from __future__ import annotations

import platform

import pytest
import torch

from hf_dspark import hardware


def test_processor_signature_names_the_architecture_and_capability():
    signature = hardware.processor_signature("cpu")
    capability, *features = signature.split("/")[1].split("+")
    assert capability == torch.backends.cpu.get_cpu_capability()
    assert ("bf16" in features) == hardware.native_bf16("cpu")
    assert ("amx" in features) == (hardware.native_bf16("cpu") and hardware.amx_bf16())


@pytest.mark.parametrize(("bf16", "amx", "suffix"), [(True, True, "+bf16+amx"), (True, False, "+bf16"),
                                                     (False, False, ""), (False, True, "")])
def test_amx_tiles_make_a_separate_kind_of_processor(monkeypatch, bf16, amx, suffix):
    """Intel AMX and AMD Zen 4 both report AVX512 with native bf16, but few-row bf16 matmuls cost far less on AMX
    tiles: curves measured on one must not be used on the other."""
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": bf16)
    monkeypatch.setattr(hardware, "amx_bf16", lambda: amx)
    capability = torch.backends.cpu.get_cpu_capability()
    assert hardware.processor_signature("cpu") == f"{platform.machine()}/{capability}{suffix}"


def test_amx_detection_reads_torch_capabilities(monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": True})
    assert hardware.amx_bf16()
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": False})
    assert not hardware.amx_bf16()
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {})  # a torch that does not report it
    assert not hardware.amx_bf16()


@pytest.mark.parametrize("native", [True, False])
def test_half_precision_on_a_cpu_without_native_bf16_is_warned(monkeypatch, caplog, native):
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": native)
    type(hardware.logger).warning_once.cache_clear()  # once per process: forget earlier tests' warnings
    with caplog.at_level("WARNING"):
        assert hardware.resolve_dtype("bfloat16", "cpu") == "bfloat16"  # kept: the user asked for it
        assert hardware.resolve_dtype("auto", "cpu") == ("bfloat16" if native else "float32")
        assert not hardware.warn_if_slow_dtype("float32", "cpu")
    assert ("slower than float32" in caplog.text) == (not native)
