"""Device check: DSpark on a randomly initialised target of realistic shape, on whatever device is at hand.

    python scripts/device_check.py                       # CUDA if present (Llama-3.2-1B shape, bf16), else CPU (tiny)
    python scripts/device_check.py --device cpu --shape tiny --new-tokens 16 --repeats 1   # the CI run
    python scripts/device_check.py --out device_check.json

Four checks, printed as they finish and collected in one JSON report:

1. Greedy equality: `generate(assistant_model=drafter)` against plain greedy `generate` at batch 1 and 8 (ragged,
   left-padded prompts), with the oracle drafter (every draft right: long accepted blocks) and an untrained DSpark
   drafter (its real forward on the device: context KV cache, Markov head, confidence head; drafts mostly wrong),
   in fp32 and in the speed dtype. A divergence is reported with the target's logit margin between the two
   tokens at that step in the plain run: a margin near zero is a floating-point tie (a batched verification
   forward and a one-token forward need not round alike), a large one is a bug. The script exits with status 1
   when an fp32 divergence has a margin above `--tie-margin`.
2. Speed at γ = 4/8/16 (oracle drafter, `dspark_policy="fixed"`: ℓ = γ) against plain greedy `generate`, batch 1
   and 8, median of `--repeats` runs with the device synchronised around each run. Every DSpark run here uses
   the fixed policy, so each round drafts (the default "auto" policy may decode plainly instead).
3. SPS(B): `hf_dspark.profiling.profile_step_curve` on the target (the curve the load-aware scheduler reads).
4. The environment: device name, torch / transformers versions, shapes, dtype.

Randomly initialised weights make greedy text meaningless but exercise every kernel at the real shapes; the
oracle's proposals come from plain `generate`, so its speed is the loop's ceiling on this device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.eval.oracle import oracle_for
from hf_dspark.profiling import profile_step_curve

# Llama-3.2-1B's published architecture (weights are random here).
LLAMA_3_2_1B = dict(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    head_dim=64, vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=True, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    bos_token_id=128000, eos_token_id=128001, pad_token_id=128004,
)
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=96, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
SHAPES = {"llama-3.2-1b": LLAMA_3_2_1B, "tiny": TINY}
DEFAULT_BATCH_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@dataclass
class Prompts:
    """Left-padded prompts `[B, L]` and their attention mask."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def first(self, batch: int) -> Prompts:
        ids, mask = self.input_ids[:batch], self.attention_mask[:batch]
        keep = int(mask.any(dim=0).nonzero().min())  # drop columns that are padding in every kept row
        return Prompts(ids[:, keep:], mask[:, keep:])


def build_target(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised Llama-family target, built directly on `device` (no CPU copy of a 1B model)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**SHAPES[shape]))
    return model.to(dtype).eval()


def ragged_prompts(batch: int, vocab: int, device: torch.device, seed: int = 0, lengths=(12, 48)) -> Prompts:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=gen).tolist()
    width = max(sizes)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, n in enumerate(sizes):
        ids[row, width - n :] = torch.randint(3, min(vocab, 32000), (n,), generator=gen)
        mask[row, width - n :] = 1
    return Prompts(ids.to(device), mask.to(device))


def synchronize(device: torch.device) -> None:
    if device.type != "cpu" and hasattr(torch, "accelerator") and torch.accelerator.is_available():
        torch.accelerator.synchronize()


def plain_greedy(target, prompts: Prompts, new_tokens: int, scores: bool = False):
    return target.generate(prompts.input_ids, attention_mask=prompts.attention_mask, do_sample=False,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, return_dict_in_generate=scores,
                           output_logits=scores)


def untrained_drafter(target, block_size: int, seed: int = 1) -> DSparkDrafter:
    torch.manual_seed(seed)
    config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=1, markov_rank=64)
    with torch.device(target.device):
        drafter = DSparkDrafter(config)
    return drafter.to(target.dtype).eval().bind_target(target)


def first_divergence(reference, output: torch.Tensor, prompt_width: int) -> dict | None:
    """None when identical; else the first differing (row, step) and the plain run's logit margin there."""
    if output.shape == reference.sequences.shape and torch.equal(output, reference.sequences):
        return None
    width = min(output.shape[1], reference.sequences.shape[1])
    differs = output[:, :width] != reference.sequences[:, :width]
    rows_steps = differs.nonzero()
    if rows_steps.numel() == 0:
        return {"row": None, "step": width - prompt_width, "margin": None, "note": "different lengths"}
    step_of = rows_steps[:, 1]
    row, column = (int(v) for v in rows_steps[int(step_of.argmin())])
    step = column - prompt_width
    logits = reference.logits[step][row].float()
    plain_token, dspark_token = int(reference.sequences[row, column]), int(output[row, column])
    return {"row": row, "step": step, "plain_token": plain_token, "dspark_token": dspark_token,
            "margin": float(logits[plain_token] - logits[dspark_token])}


def check_equality(target, prompts: Prompts, batches: list[int], new_tokens: int, block_size: int) -> list[dict]:
    """Greedy DSpark (oracle and untrained drafters) vs plain `generate`, per batch size."""
    results = []
    for batch in batches:
        part = prompts.first(batch)
        reference = plain_greedy(target, part, new_tokens, scores=True)
        drafters = {"oracle": oracle_for(target, block_size, reference.sequences, part.attention_mask),
                    "untrained": untrained_drafter(target, block_size)}
        for name, drafter in drafters.items():
            output = target.generate(part.input_ids, attention_mask=part.attention_mask, assistant_model=drafter,
                                     do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                     dspark_policy="fixed")  # every round drafts and verifies γ tokens
            stats = drafter.last_generation_stats
            divergence = first_divergence(reference, output, part.input_ids.shape[1])
            results.append({"dtype": str(target.dtype).removeprefix("torch."), "batch": batch, "drafter": name,
                            "identical": divergence is None, "divergence": divergence,
                            "tau": stats.mean_accepted_length, "drafts_verified": stats.draft_tokens_verified})
            verdict = "identical" if divergence is None else f"DIFFERS {divergence}"
            print(f"  equality  {results[-1]['dtype']:8s} batch {batch}  {name:9s} {verdict}  "
                  f"τ = {stats.mean_accepted_length:.2f}", flush=True)
    return results


def timed(fn, device: torch.device, repeats: int) -> tuple[float, torch.Tensor]:
    """(median seconds, last output) of `repeats` calls, synchronised around each."""
    seconds, out = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        out = fn()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def check_speed(target, prompts: Prompts, batches: list[int], gammas: list[int], new_tokens: int,
                repeats: int) -> list[dict]:
    """Tokens/s of plain greedy `generate` and of DSpark with the oracle drafter at each γ (ℓ = γ)."""
    device, results = target.device, []
    for batch in batches:
        part = prompts.first(batch)
        plain_generate(target, part, 4)  # warm-up (kernels, allocator)
        plain_s, reference = timed(lambda p=part: plain_generate(target, p, new_tokens), device, repeats)
        produced = batch * new_tokens
        for gamma in gammas:
            oracle = oracle_for(target, gamma, reference, part.attention_mask)
            run = lambda p=part, o=oracle: target.generate(  # noqa: E731
                p.input_ids, attention_mask=p.attention_mask, assistant_model=o, do_sample=False,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens, dspark_policy="fixed")
            run()  # warm-up
            dspark_s, _ = timed(run, device, repeats)
            tau = oracle.last_generation_stats.mean_accepted_length
            results.append({"batch": batch, "gamma": gamma, "plain_tokens_per_second": produced / plain_s,
                            "dspark_tokens_per_second": produced / dspark_s, "speedup": plain_s / dspark_s,
                            "tau": tau})
            print(f"  speed     batch {batch}  γ = {gamma:2d}  plain {produced / plain_s:8.1f} tok/s  "
                  f"DSpark {produced / dspark_s:8.1f} tok/s  ×{plain_s / dspark_s:.2f}  τ = {tau:.2f}", flush=True)
    return results


def plain_generate(target, prompts: Prompts, new_tokens: int) -> torch.Tensor:
    return plain_greedy(target, prompts, new_tokens)


def check_step_curve(target, batch_tokens: list[int], repeats: int, cache_length: int) -> dict:
    curve = profile_step_curve(target, batch_tokens=batch_tokens, rows=8, cache_length=cache_length,
                               repeats=repeats, warmup=1, progress=False)
    for b, sps in zip(curve.batch_tokens, curve.steps_per_second):
        print(f"  SPS(B)    B = {b:4d}  {1e3 / sps:8.2f} ms  {sps:8.1f} steps/s  {b * sps:10.1f} tokens/s", flush=True)
    return curve.to_dict()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None,
                        help="target shape (default: llama-3.2-1b on an accelerator, tiny on cpu)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                        help="dtype of the speed and profile runs (default: bfloat16 on an accelerator, else float32)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row in every run")
    parser.add_argument("--gammas", type=int, nargs="+", default=[4, 8, 16], help="γ of the speed runs")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes of equality and speed")
    parser.add_argument("--block-size", type=int, default=8, help="γ of the equality runs")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per speed point and profile sweep")
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=DEFAULT_BATCH_TOKENS, help="B of SPS(B)")
    parser.add_argument("--cache-length", type=int, default=512, help="cached tokens per row while profiling")
    parser.add_argument("--tie-margin", type=float, default=1e-3,
                        help="fp32 divergences with a plain-run logit margin above this fail the check")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    accelerated = args.device.type != "cpu"
    args.shape = args.shape or ("llama-3.2-1b" if accelerated else "tiny")
    args.dtype = args.dtype or ("bfloat16" if accelerated else "float32")
    return args


def environment(args: argparse.Namespace) -> dict:
    name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else args.device.type
    return {"device": str(args.device), "device_name": name, "torch": torch.__version__,
            "transformers": transformers.__version__, "shape": args.shape, "dtype": args.dtype,
            "new_tokens": args.new_tokens}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = {"environment": environment(args)}
    print(f"device check: {report['environment']}", flush=True)
    prompts = ragged_prompts(max(args.batches), SHAPES[args.shape]["vocab_size"], args.device)
    with torch.no_grad():
        target = build_target(args.shape, args.device, torch.float32)
        report["equality"] = check_equality(target, prompts, args.batches, args.new_tokens, args.block_size)
        if args.dtype != "float32":
            target = target.to(getattr(torch, args.dtype))
            report["equality"] += check_equality(target, prompts, args.batches, args.new_tokens, args.block_size)
        report["speed"] = check_speed(target, prompts, args.batches, args.gammas, args.new_tokens, args.repeats)
    report["step_curve"] = check_step_curve(target, args.batch_tokens, args.repeats, args.cache_length)
    failures = [r for r in report["equality"] if r["dtype"] == "float32" and not r["identical"]
                and (r["divergence"]["margin"] is None or abs(r["divergence"]["margin"]) > args.tie_margin)]
    report["passed"] = not failures
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        print(f"wrote {args.out}")
    print("PASSED" if report["passed"] else f"FAILED: {failures}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
