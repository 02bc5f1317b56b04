"""What this CPU's matmuls cost in the shapes DSpark uses: bf16 vs fp32, and fp32 with few rows.

Prints the processor signature the cost curves are keyed on, then (median of `--repeats`, 1 thread by default):
a 2048×576 by 576×8192 product (a training step's draft LM head) in fp32 and bf16, and the default target's tied
49,152-row LM head and a 576→1536 linear layer with M = 1, 2, 3, 4, 8, 16 rows in fp32 (a verification forward
with M tokens), each through PyTorch's kernel (MKL) and through oneDNN on a packed copy of the weight (what DSpark's
verification uses for float32 CPU targets, `hf_dspark.target.packed_linear`). On a CPU without native bf16 the
bf16 product falls back to a slow reference kernel; on some CPUs fp32 GEMMs with 2-3 rows cost several times a
single-row GEMV, which makes verifying a draft or two expensive unless the weights are packed.

    python benchmarks/cpu_matmul_costs.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_dspark.hardware import native_bf16, processor_signature
from hf_dspark.target.packed_linear import onednn_linear, onednn_linear_available, onednn_pack


def median_ms(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e3 * statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per shape (median)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"processor {processor_signature('cpu')}, native bf16: {native_bf16('cpu')}, {args.threads} thread(s)")
    rows, weight = torch.randn(2048, 576), torch.randn(8192, 576)
    fp32 = median_ms(lambda: rows @ weight.t(), args.repeats)
    rows_bf16, weight_bf16 = rows.bfloat16(), weight.bfloat16()
    bf16 = median_ms(lambda: rows_bf16 @ weight_bf16.t(), args.repeats)
    print(f"2048x576 @ 576x8192: fp32 {fp32:.1f} ms, bf16 {bf16:.1f} ms (bf16 / fp32 {bf16 / fp32:.2f})")
    head, linear = torch.randn(49152, 576), torch.randn(1536, 576)
    packed = onednn_linear_available()
    if packed:
        head_packed, linear_packed = onednn_pack(head), onednn_pack(linear)
    for m in (1, 2, 3, 4, 8, 16):
        x = torch.randn(m, 576)
        head_ms = median_ms(lambda x=x: torch.nn.functional.linear(x, head), args.repeats)
        linear_ms = median_ms(lambda x=x: torch.nn.functional.linear(x, linear), 10 * args.repeats)
        line = f"M = {m:2d}: LM head 49152x576 {head_ms:6.2f} ms, linear 1536x576 {linear_ms:.3f} ms (fp32)"
        if packed:
            head_ms = median_ms(lambda x=x: onednn_linear(x, head_packed, None), args.repeats)
            linear_ms = median_ms(lambda x=x: onednn_linear(x, linear_packed, None), 10 * args.repeats)
            line += f"; oneDNN packed: {head_ms:6.2f} ms, {linear_ms:.3f} ms"
        print(line)

if __name__ == "__main__":
    main()
