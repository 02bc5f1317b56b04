"""What kind of processor this is, and the dtype that runs fastest on it.

`processor_signature` names the kind of processor cost curves are measured on (curves only carry between machines
of one kind,
`hf_dspark.profiling.target_steps`); `native_bf16` / `default_dtype` / `resolve_dtype` pick bf16 where the CPU
computes it natively (AVX512-BF16 or AMX) and fp32 elsewhere; `warn_if_slow_dtype` says so once when a user asks
for half precision on a CPU without it, where it runs several times slower than fp32.
"""

from __future__ import annotations

import platform

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)


def processor_signature(device: str | torch.device = "cpu") -> str:
    """The kind of processor a curve is measured on: `"<arch>/<torch CPU capability>[+bf16][+amx]"` for a CPU (e.g.
    `"x86_64/AVX512+bf16+amx"`, `"x86_64/AVX512+bf16"`, `"x86_64/AVX2"`), the GPU's name for CUDA. Costs measured
    on one kind do not carry to another: without native bf16 a bf16 matmul runs ~7× slower than fp32, where with it
    bf16 is the faster one; with AMX tiles (Intel Sapphire Rapids and later) a few-row bf16 matmul costs far less
    than with AVX512-BF16 alone (AMD Zen 4), so the two are separate kinds."""
    kind = torch.device(device).type
    if kind == "cuda" and torch.cuda.is_available():
        return f"cuda/{torch.cuda.get_device_name(torch.device(device))}"
    if kind != "cpu":
        return f"{platform.machine()}/{kind}"
    bf16 = "+bf16" if native_bf16("cpu") else ""
    amx = "+amx" if bf16 and amx_bf16() else ""
    return f"{platform.machine()}/{torch.backends.cpu.get_cpu_capability()}{bf16}{amx}"


def amx_bf16() -> bool:
    """Whether this CPU has AMX bf16 tiles (`torch.cpu.get_capabilities()`; False where torch cannot say)."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    try:
        return bool(capabilities()["amx_bf16"]) if capabilities is not None else False
    except (KeyError, RuntimeError, TypeError):
        return False


def native_bf16(device: str = "cpu") -> bool:
    """Whether `device` computes bf16 natively (CPU: oneDNN's bf16 path, i.e. AVX512-BF16 or AMX; CUDA: bf16)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def default_dtype(device: str = "cpu") -> str:
    """The dtype `--dtype auto` picks (the benchmarks' default; the demo defaults to float32, where DSpark's greedy
    output is bit-identical to plain `generate`): "bfloat16" where it is native, else "float32".

    Measured on the development CPU (AVX512-BF16 and AMX, 1 thread, `benchmarks/results/cost_curves.json`): in
    bf16 an 8-token verification costs ≈ 1.4 single-token steps instead of ≈ 2.6, batched steps are about twice
    as fast and the drafter's forward less than half as long; only a lone plain decoding step is slightly slower.
    Lossless then means: the same distribution as plain bf16 `generate`; greedy text may differ from it at
    near-ties (a k-token forward rounds differently from a 1-token forward). fp32 stays bit-identical. On AVX512-BF16
    without AMX (AMD Zen 4) bf16 is still the faster dtype in absolute terms, though its few-token verification is
    relatively dearer than fp32's on packed weights (README, "dtype: fp32 or bf16").
    """
    return "bfloat16" if native_bf16(device) else "float32"


def resolve_dtype(choice: str, device: str = "auto") -> str:
    """`choice` unless it is "auto", which becomes `default_dtype` of `device` ("auto": CUDA when available). An
    explicit half-precision choice on a CPU without native bf16 is kept, with a warning (`warn_if_slow_dtype`)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if choice != "auto":
        warn_if_slow_dtype(choice, device)
        return choice
    return default_dtype(device)


def warn_if_slow_dtype(dtype: str, device: str = "cpu", fix: str = "use float32 (or dtype auto)") -> bool:
    """Warn once per process (and return True) when `dtype` is bf16/fp16 on a CPU without native bf16: there
    oneDNN's fast path is missing and half-precision matmuls fall back to a reference kernel ~7× slower than fp32
    (measured on an AVX2 CPU by benchmarks/cpu_matmul_costs.py: a 2048×576 by 576×8192 matmul 2.29 s vs 0.33 s), so
    a bf16 run or training job crawls."""
    if dtype not in ("bfloat16", "float16") or not str(device).startswith("cpu") or native_bf16("cpu"):
        return False
    logger.warning_once(f"{dtype} on this CPU ({processor_signature('cpu')}, no native bf16) runs matmuls several "
                        f"times slower than float32: {fix}.")
    return True
