"""`hf-dspark`: a thin command line over the library. Run `hf-dspark <command> --help` for each command."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

DEMO_PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " \
    "How many clips did Natalia sell altogether in April and May?"


def _load_drafter(target, path: str | None, block_size: int):
    """The trained drafter at `path`, the shipped default, or (saying so) an untrained one."""
    from . import DSparkConfig, DSparkDrafter, load_default_drafter

    if path is not None:
        return DSparkDrafter.from_pretrained(path, target=target), f"drafter {path}"
    try:
        return load_default_drafter(target), "the shipped default DSpark drafter"
    except FileNotFoundError:
        config = DSparkConfig.from_target(target.config, block_size=block_size, num_hidden_layers=2,
                                          markov_rank=64)
        drafter = DSparkDrafter(config).bind_target(target)
        return drafter, "an UNTRAINED drafter (no trained default ships yet): expect about 1 token per round"


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from . import load_default_target
    from .eval.prompts import chat_input_ids

    torch.set_num_threads(args.threads)
    print(f"Loading the embedded SmolLM2-135M-Instruct target (fp32, {args.threads} thread(s))...", flush=True)
    target, tokenizer = load_default_target(dtype=torch.float32)
    drafter, what = _load_drafter(target, args.drafter, args.block_size)
    print(f"Drafting with {what}.")
    input_ids = chat_input_ids(tokenizer, [args.prompt])
    sampling = dict(do_sample=True, temperature=0.7, top_p=0.9) if args.sample else dict(do_sample=False)
    kwargs = dict(max_new_tokens=args.max_new_tokens, **sampling)
    target.generate(input_ids, max_new_tokens=4, do_sample=False)  # warm-up
    start = time.perf_counter()
    output = target.generate(input_ids, assistant_model=drafter, **kwargs)
    dspark_seconds = time.perf_counter() - start
    new_tokens = output.shape[1] - input_ids.shape[1]
    stats = drafter.last_generation_stats
    print("\n" + tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True).strip() + "\n")
    print(f"DSpark: {new_tokens} tokens in {dspark_seconds:.2f} s = {new_tokens / dspark_seconds:.1f} tokens/s; "
          f"accepted length τ = {stats.mean_accepted_length:.2f} tokens/round over {stats.rounds} rounds "
          f"(γ = {drafter.config.block_size}, {stats.draft_tokens_accepted}/{stats.draft_tokens_verified} drafts "
          "accepted)")
    if args.compare:
        start = time.perf_counter()
        plain = target.generate(input_ids, **kwargs)
        plain_seconds = time.perf_counter() - start
        plain_new = plain.shape[1] - input_ids.shape[1]
        same = "identical output" if torch.equal(plain, output) else "different samples (sampling)"
        print(f"plain generate: {plain_new / plain_seconds:.1f} tokens/s; DSpark speedup "
              f"{(new_tokens / dspark_seconds) / (plain_new / plain_seconds):.2f}x ({same})")
    return 0


def cmd_bench_speed(args: argparse.Namespace) -> int:
    import torch

    from . import load_default_target
    from .eval.speed import SpeedConfig, run_speed_benchmark

    config = SpeedConfig(prompt_files=args.sets, num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                         repeats=args.repeats, block_sizes=args.block_sizes, threads=args.threads,
                         drafter=args.drafter, out=args.out)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(dtype=torch.float32)
    drafter = None
    if not args.no_drafter:
        drafter, what = _load_drafter(target, args.drafter, max(args.block_sizes))
        print(f"dspark method uses {what}")
    report = run_speed_benchmark(config, target, tokenizer, drafter)
    for set_name, methods in report["results"].items():
        print(f"\n{set_name} (median tokens/s, median ratio to plain, τ):")
        for name, row in methods.items():
            tau = "" if row["mean_accepted_length"] is None else f"  τ={row['mean_accepted_length']:.2f}"
            print(f"  {name:16s} {row['median_tokens_per_second']:7.2f}  x{row['median_ratio_to_plain']:.2f}{tau}")
    print(f"\nwrote {args.out} and {args.out.rsplit('.', 1)[0]}.png")
    return 0


def _delegate(module: str, function: str = "main") -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        entry = getattr(importlib.import_module(module, __package__), function)
        return int(entry(args.rest) or 0)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-dspark", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="generate an answer with DSpark on the embedded default target")
    demo.add_argument("--prompt", default=DEMO_PROMPT)
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--block-size", type=int, default=7, help="γ of the untrained fallback drafter")
    demo.add_argument("--drafter", default=None, help="path of a trained drafter (default: the shipped one)")
    demo.add_argument("--threads", type=int, default=2)
    demo.add_argument("--sample", action="store_true", help="sample (T=0.7, top-p 0.9) instead of greedy")
    demo.add_argument("--no-compare", dest="compare", action="store_false", help="skip the plain-generate run")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    speed = bench.add_parser("speed", help="batch-1 tokens/s: plain vs prompt lookup vs DSpark vs oracle")
    speed.add_argument("--sets", nargs="+", default=["data/eval/gsm8k.jsonl", "data/eval/mt-bench.jsonl"])
    speed.add_argument("--prompts", type=int, default=3)
    speed.add_argument("--max-new-tokens", type=int, default=96)
    speed.add_argument("--repeats", type=int, default=3)
    speed.add_argument("--block-sizes", type=int, nargs="+", default=[4, 8, 16])
    speed.add_argument("--threads", type=int, default=1)
    speed.add_argument("--drafter", default=None)
    speed.add_argument("--no-drafter", action="store_true", help="only plain, prompt lookup and the oracle")
    speed.add_argument("--out", default="benchmarks/results/speed.json")
    speed.set_defaults(func=cmd_bench_speed)

    for name, module, helptext in (
        ("prepare-data", ".training.regenerate", "regenerate training replies with the target"),
        ("train", ".training.train", "train a drafter with transformers.Trainer"),
    ):
        delegated = sub.add_parser(name, help=helptext, add_help=False)
        delegated.add_argument("rest", nargs=argparse.REMAINDER)
        delegated.set_defaults(func=_delegate(module))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
