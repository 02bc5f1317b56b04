"""`hf-dspark demo`: DSpark on the embedded default target, then plain `generate` on the same prompt."""

from __future__ import annotations

import argparse
import statistics

from .loaders import (
    add_runtime_arguments,
    load_drafter,
    load_target,
    positive_int,
)
from .validation import check_drafter_path, check_nonempty

DEMO_PROMPT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)


DTYPE_HELP = ("target dtype (default float32: DSpark's greedy output is bit-identical to plain generate, which the "
              "demo checks; auto: bfloat16 where the CPU/GPU computes it natively, faster there in absolute terms, "
              "but a k-token verification rounds differently from a 1-token step, so greedy text may differ from "
              "plain generate after a near-tie)")


def cmd_demo(args: argparse.Namespace) -> int:
    """Validate the arguments, load the target (~20 s on CPU), generate with DSpark and compare with plain."""
    import torch

    from ..eval.prompts import chat_input_ids
    from ..eval.speed import timed

    check_nonempty(args.parser, "--prompt", args.prompt)
    check_drafter_path(args.parser, "--drafter", args.drafter)
    from ..hardware import native_bf16, resolve_dtype
    from ..scheduling import available_policies

    if args.policy not in available_policies():
        args.parser.error(f"--policy {args.policy!r} is not a dspark_policy; choose one of "
                          f"{list(available_policies())}")
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, args.device)
    print(f"Loading the embedded SmolLM2-135M-Instruct target ({dtype}, {args.threads} thread(s))...", flush=True)
    target, tokenizer = load_target(None, dtype, device=args.device)
    drafter, what = load_drafter(target, args.drafter, args.block_size)
    print(f"Drafting with {what}.")
    input_ids = chat_input_ids(tokenizer, [args.prompt]).to(target.device)
    sampling = dict(do_sample=True, temperature=0.7, top_p=0.9) if args.sample else dict(do_sample=False)
    kwargs = dict(max_new_tokens=args.max_new_tokens, **sampling)
    target.generate(input_ids, max_new_tokens=4, do_sample=False)  # warm-up
    dspark = dict(kwargs, dspark_policy=args.policy)
    target.generate(input_ids, assistant_model=drafter, max_new_tokens=4, do_sample=False,
                    dspark_policy=args.policy)  # and cost curves
    dspark_seconds, output = timed(lambda: target.generate(input_ids, assistant_model=drafter, **dspark))
    new_tokens = output.shape[1] - input_ids.shape[1]
    stats = drafter.last_generation_stats
    print("\n" + tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True).strip() + "\n")
    print(f"DSpark: {new_tokens} tokens in {dspark_seconds:.2f} s = {new_tokens / dspark_seconds:.1f} tokens/s; "
          f"accepted length τ = {stats.mean_accepted_length:.2f} tokens/round over {stats.rounds} rounds "
          f"(γ = {drafter.config.block_size}, {stats.draft_tokens_accepted}/{stats.draft_tokens_verified} drafts "
          f"accepted, policy {args.policy!r})")
    if args.policy == "auto":
        print(_auto_explained(target, drafter, stats, greedy=not args.sample))
    if args.compare:
        _compare(args, target, drafter, input_ids, kwargs, output, dspark_seconds)
    if args.dtype == "float32" and native_bf16(str(target.device)):
        print("This processor computes bf16 natively: `--dtype auto` runs the target (plain and DSpark alike) in "
              "bf16, faster here, but greedy text may then differ from plain generate after a near-tie.")
    return 0


def _auto_explained(target, drafter, stats, greedy: bool) -> str:
    """How many rounds "auto" drafted, and what drafting can give one request on this machine (its cost curves and
    the drafter's held-out acceptance), so that a speedup near 1× explains itself."""
    from ..draft_profiling import load_or_profile_draft_curve
    from ..hardware import processor_signature
    from ..profiling import load_or_profile_step_curve
    from ..scheduling.acceptance import heldout_acceptance
    from ..scheduling.padded import batch1_outlook, padded_verify_seconds

    drafted = f"'auto' drafted in {stats.rounds - stats.skipped_rounds} of {stats.rounds} rounds"
    acceptance = heldout_acceptance(drafter, greedy)
    if not acceptance:
        return drafted + " (this drafter has no held-out acceptance to forecast with)."
    verify = padded_verify_seconds(load_or_profile_step_curve(target), 1, len(acceptance)).tolist()
    draft_curve = load_or_profile_draft_curve(drafter)
    draft = 1.0 / float(draft_curve.steps_per_second_at(1)) if draft_curve is not None else 0.0
    length, ratio = batch1_outlook(acceptance, verify, draft)
    where = f"{processor_signature(target.device)}, {str(target.dtype).removeprefix('torch.')}"
    where += ", oneDNN-packed weights" if stats.packed_weights else ""
    verdict = "drafting pays here" if ratio > 1.0 else "drafting cannot pay here, so 'auto' decodes plainly and probes"
    return (f"{drafted}. On this machine ({where}) a round verifying {length} draft(s) costs "
            f"{(verify[length] + draft) / verify[0]:.2f} plain steps with the drafter, and this drafter's held-out "
            f"acceptance makes its best fixed length worth {ratio:.2f}x plain decoding at batch 1: {verdict}.")


def _compare(args, target, drafter, input_ids, kwargs, output, dspark_seconds: float) -> None:
    """Plain `generate` right after each DSpark run, `--repeats` pairs; prints the median of the paired ratios."""
    import torch

    from ..eval.speed import timed

    ratios, plain_rates, identical = [], [], 0
    for pair in range(args.repeats):
        if pair:
            dspark_seconds, output = timed(lambda: target.generate(input_ids, assistant_model=drafter,
                                                                   dspark_policy=args.policy, **kwargs))
        plain_seconds, plain = timed(lambda: target.generate(input_ids, **kwargs))
        dspark_rate = (output.shape[1] - input_ids.shape[1]) / dspark_seconds
        plain_rates.append((plain.shape[1] - input_ids.shape[1]) / plain_seconds)
        ratios.append(dspark_rate / plain_rates[-1])
        identical += int(torch.equal(plain, output))
    verdict = "identical output" if identical == len(ratios) else (
        "different samples (sampling)" if args.sample else f"identical output in {identical} of {len(ratios)} "
        "runs; the others differ at a near-tie: bf16 rounds a k-token verification differently from a 1-token "
        "step; use --dtype float32 for bit-identical output")
    accepted = drafter.last_generation_stats.draft_tokens_accepted
    print(f"plain generate: {statistics.median(plain_rates):.1f} tokens/s; "
          + speedup_summary(ratios, accepted, args.sample) + f"; {verdict}")


def speedup_summary(ratios: list[float], accepted_drafts: int, sampled: bool = False) -> str:
    """The demo's speedup line from the paired DSpark/plain tokens-per-second ratios: the median and interquartile
    range (wall clock, `time.perf_counter`; on a shared machine other jobs widen the spread), or, when the last
    DSpark run accepted no draft, that drafting did not help (a ratio then measures noise, not drafting)."""
    if accepted_drafts == 0:
        return (f"no draft was accepted, so drafting did not help on this prompt (the {len(ratios)} paired "
                f"timings differ by noise, median ratio {statistics.median(ratios):.2f})")
    if len(ratios) < 4:
        return f"DSpark speedup {statistics.median(ratios):.2f}x (median of {len(ratios)} paired run(s))"
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return (f"DSpark speedup {statistics.median(ratios):.2f}x, interquartile range {q1:.2f}-{q3:.2f}x over "
            f"{len(ratios)} interleaved pairs (time.perf_counter wall clock; other jobs on a shared machine widen "
            "the spread)")


def add_demo_command(sub) -> None:
    """Register `demo` on the top-level subparsers."""
    demo = sub.add_parser("demo", help="generate an answer with DSpark on the embedded default target",
                          description="Generate with DSpark on the embedded SmolLM2-135M-Instruct target, print "
                          "tokens/s and the accepted length τ, then compare with plain generate.")
    demo.add_argument("--prompt", default=DEMO_PROMPT, help="user message (default: a GSM8K-style question)")
    demo.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens to generate")
    demo.add_argument("--block-size", type=positive_int, default=7,
                      help="γ of the untrained fallback drafter (used only when no trained drafter ships)")
    demo.add_argument("--drafter", default=None,
                      help="folder or Hub id of a trained drafter (default: the shipped one)")
    add_runtime_arguments(demo, threads=2, dtype_default="float32", dtype_help=DTYPE_HELP)
    demo.add_argument("--policy", default="auto",
                      help="dspark_policy of the DSpark runs (default auto: cost-aware; fixed: verify all γ drafts)")
    demo.add_argument("--sample", action="store_true", help="sample (T=0.7, top-p 0.9) instead of greedy decoding")
    demo.add_argument("--no-compare", dest="compare", action="store_false", help="skip the plain-generate runs")
    demo.add_argument("--repeats", type=positive_int, default=9,
                      help="DSpark / plain pairs, run alternately; the speedup printed is the median of their ratios "
                      "and their interquartile range (nine: single pairs on a shared machine spread)")
    demo.set_defaults(func=cmd_demo, parser=demo)
