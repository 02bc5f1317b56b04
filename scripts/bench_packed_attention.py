"""What packing grouped-query heads saves in a verification forward (`hf_dspark.generation.attention`).

Two measurements, side by side in one process, threads pinned, medians of interleaved repeats:
1. one attention layer of the default target's shape (9 query heads, 3 KV heads, head dim 64): transformers'
   SDPA function (which copies K/V to every head for several query tokens) vs `packed_gqa_sdpa`;
2. the whole verification forward of the default target over a prefilled cache: plain vs `packed_gqa_attention`,
   with the logits compared bit for bit.

    python scripts/bench_packed_attention.py --threads 1 --dtype bfloat16 \
        --out benchmarks/results/packed_attention.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import types

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hf_dspark import load_default_target
from hf_dspark.generation.attention import packed_gqa_attention, packed_gqa_sdpa
from hf_dspark.io_utils import write_json_atomic

SHAPES = [(1, 8, 300), (4, 8, 237), (16, 4, 237), (16, 1, 237)]  # (rows, query tokens, cached slots)


def _median_ms(functions: dict, repeats: int) -> dict:
    """Median milliseconds per function, calls interleaved so that load drifts hit all alike."""
    times = {name: [] for name in functions}
    for fn in functions.values():
        fn()
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: round(1e3 * statistics.median(values), 3) for name, values in times.items()}


def _layer_row(dtype: torch.dtype, batch: int, steps: int, width: int, repeats: int) -> dict:
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    query = torch.randn(batch, 9, steps, 64).to(dtype)
    key, value = torch.randn(batch, 3, width, 64).to(dtype), torch.randn(batch, 3, width, 64).to(dtype)
    mask = torch.rand(batch, 1, steps, width) > 0.2
    mask[..., -1] = True
    ms = _median_ms({
        "transformers_sdpa": lambda: sdpa_attention_forward(module, query, key, value, mask),
        "packed": lambda: packed_gqa_sdpa(module, query, key, value, mask),
    }, repeats)
    return {"rows": batch, "query_tokens": steps, "cached_slots": width, **ms,
            "ratio": round(ms["transformers_sdpa"] / ms["packed"], 2)}


@torch.no_grad()
def _forward_row(target, batch: int, steps: int, width: int, repeats: int) -> dict:
    prefix = target(input_ids=torch.randint(100, 40000, (batch, width)), use_cache=True).cache
    new = torch.randint(100, 40000, (batch, steps))
    mask = torch.ones(batch, width + steps, dtype=torch.long)
    mask[: batch // 2, :7] = 0  # some left padding: the mask is not all ones

    def run(packed: bool) -> torch.Tensor:
        cache = copy.deepcopy(prefix)
        if packed:
            with packed_gqa_attention(target):
                return target(input_ids=new, attention_mask=mask, cache=cache, use_cache=True).logits
        return target(input_ids=new, attention_mask=mask, cache=cache, use_cache=True).logits

    identical = torch.equal(run(False), run(True))
    ms = _median_ms({"transformers_sdpa": lambda: run(False), "packed": lambda: run(True)}, repeats)
    return {"rows": batch, "query_tokens": steps, "cached_slots": width, **ms,
            "ratio": round(ms["transformers_sdpa"] / ms["packed"], 2), "identical_logits": identical}


def layer_rows(dtype: torch.dtype, repeats: int) -> list[dict]:
    rows = [_layer_row(dtype, *shape, repeats) for shape in SHAPES]
    print(*rows, sep="\n")
    return rows


def forward_rows(dtype: torch.dtype, repeats: int) -> list[dict]:
    target, _ = load_default_target(dtype=dtype)
    rows = [_forward_row(target, *shape, repeats) for shape in SHAPES]
    print(*rows, sep="\n")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, pinned")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16", help="compute dtype")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved timed repeats per measurement")
    parser.add_argument("--out", default="benchmarks/results/packed_attention.json", help="JSON report")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    report = {"threads": args.threads, "dtype": args.dtype, "statistic": "median ms", "repeats": args.repeats,
              "attention_layer": layer_rows(dtype, args.repeats),
              "verification_forward": forward_rows(dtype, max(3, args.repeats // 3))}
    write_json_atomic(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
