"""`hf-dspark demo`: the default drafter on the embedded default target, then plain `generate` on the same prompts.

The default drafter is the hybrid of the shipped DSpark drafter and prompt lookup (`load_default_drafter`). The
default prompts, a math and a code one, were chosen on data (`benchmarks/demo_prompts.py`: the accepted length τ
of the default drafter, greedy, float32) as prompts on which drafting pays; the speedup printed is the median of
interleaved drafted / plain pairs with its interquartile range, and a run in which no draft was accepted says so
instead of printing a ratio.
"""

from __future__ import annotations

import argparse
import statistics

from .loaders import DRAFTER_SPEC_HELP, add_runtime_arguments, load_drafter, load_target, positive_int
from .validation import check_drafter_spec, check_nonempty

# The default prompts: chosen on data with benchmarks/demo_prompts.py (the first 6 prompts of gsm8k, humaneval and
# mt-bench, 96 greedy tokens, float32 target): the highest accepted length τ of the default drafter (HumanEval #5,
# τ 4.52, 81% of the rounds copied) and the best of another domain (GSM8K test #2, τ 3.28). Texts as in data/eval/.
DEMO_PROMPTS = (
    (
        "code",
        (
            "Write a solution to the following problem and make sure that it passes the tests:\n"
            "```python\n"
            "from typing import List\n"
            "\n"
            "\n"
            "def intersperse(numbers: List[int], delimeter: int) -> List[int]:\n"
            '    """ Insert a number \'delimeter\' between every two consecutive elements of input list '
            "`numbers'\n"
            "    >>> intersperse([], 4)\n"
            "    []\n"
            "    >>> intersperse([1, 2, 3], 4)\n"
            "    [1, 4, 2, 4, 3]\n"
            '    """\n'
            "\n"
            "```"
        ),
    ),
    (
        "math",
        (
            "Josh decides to try flipping a house.  He buys a house for $80,000 and then puts in "
            "$50,000 in repairs.  This increased the value of the house by 150%.  How much profit did "
            "he make?\n"
            "Please reason step by step, and put your final answer within \\boxed{}."
        ),
    ),
)


DTYPE_HELP = (
    "target dtype (default float32: DSpark's greedy output is bit-identical to plain generate, which the "
    "demo checks; auto: bfloat16 where the CPU/GPU computes it natively, faster there in absolute terms, "
    "but a k-token verification rounds differently from a 1-token step, so greedy text may differ from "
    "plain generate after a near-tie)"
)


DEMO_DRAFTERS = ("hybrid", "dspark")  # the shipped default (DSpark drafter + prompt lookup), the DSpark drafter alone


def demo_drafter(target, spec: str, block_size: int = 7):
    """(drafter, description) for `--drafter`: "hybrid" (the default drafter: the shipped DSpark drafter combined
    with prompt lookup, the source chosen per round), "dspark" (the shipped DSpark drafter alone), or a drafter spec
    of `hf-dspark eval` (a trained drafter's folder or Hub id, `hybrid:FOLDER`, `prompt-lookup`, ...)."""
    from ..proposers import get_proposer
    from .loaders import load_drafter_spec

    if spec not in DEMO_DRAFTERS:
        return load_drafter_spec(target, spec), f"drafter {spec}"
    drafter, what = load_drafter(target, None, block_size)  # the shipped DSparkDrafter (or an untrained one)
    if spec == "dspark":
        return drafter, what
    return get_proposer("hybrid").factory(drafter), (
        f"the default drafter: per round, {what} or prompt lookup over the conversation, chosen from what is "
        "already committed (lossless)"
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """Validate the arguments, load the target (~20 s on CPU), then per prompt generate with the drafter and compare
    with plain `generate`."""
    import torch

    for prompt in args.prompt or ():
        check_nonempty(args.parser, "--prompt", prompt)
    if args.drafter not in DEMO_DRAFTERS:
        check_drafter_spec(args.parser, "--drafter", args.drafter)
    from ..hardware import native_bf16, resolve_dtype
    from ..scheduling import available_policies

    if args.policy not in available_policies():
        args.parser.error(
            f"--policy {args.policy!r} is not a dspark_policy; choose one of {list(available_policies())}"
        )
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, args.device)
    print(f"Loading the embedded SmolLM2-135M-Instruct target ({dtype}, {args.threads} thread(s))...", flush=True)
    target, tokenizer = load_target(None, dtype, device=args.device)
    drafter, what = demo_drafter(target, args.drafter, args.block_size)
    print(f"Drafting with {what}.")
    prompts = [(None, prompt) for prompt in args.prompt] if args.prompt else list(DEMO_PROMPTS)
    for domain, prompt in prompts:
        print(f"\n=== {domain} prompt ===" if domain else "\n=== prompt ===")
        _demo_prompt(args, target, tokenizer, drafter, prompt)
    if args.dtype == "float32" and native_bf16(str(target.device)):
        print(
            "\nThis processor computes bf16 natively: `--dtype auto` runs the target (plain and drafted alike) in "
            "bf16, faster here, but greedy text may then differ from plain generate after a near-tie."
        )
    return 0


def _demo_prompt(args, target, tokenizer, drafter, prompt: str) -> None:
    """One prompt: warm-up, a timed drafted run (answer, tokens/s, τ, where the drafts came from), then the pairs."""
    from ..eval.prompts import chat_input_ids
    from ..scheduling import get_policy

    input_ids = chat_input_ids(tokenizer, [prompt]).to(target.device)
    sampling = dict(do_sample=True, temperature=0.7, top_p=0.9) if args.sample else dict(do_sample=False)
    kwargs = dict(max_new_tokens=args.max_new_tokens, **sampling)
    target.generate(input_ids, max_new_tokens=4, do_sample=False)  # warm-up
    target.generate(
        input_ids, assistant_model=drafter, max_new_tokens=4, do_sample=False, dspark_policy=args.policy
    )  # and cost curves
    dspark = dict(kwargs, dspark_policy=args.policy)
    seconds, output, sources = drafted_run(target, drafter, input_ids, dspark)
    new_tokens = output.shape[1] - input_ids.shape[1]
    stats = drafter.last_generation_stats
    print(
        prompt.strip()
        + "\n\n"
        + tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True).strip()
        + "\n"
    )
    print(
        f"Drafted: {new_tokens} tokens in {seconds:.2f} s = {new_tokens / seconds:.1f} tokens/s; accepted length "
        f"τ = {stats.mean_accepted_length:.2f} tokens/round over {stats.rounds} rounds (γ = "
        f"{drafter.config.block_size}, {stats.draft_tokens_accepted}/{stats.draft_tokens_verified} drafts accepted, "
        f"policy {args.policy!r}); {rounds_by_source(stats, sources)}"
    )
    if get_policy(args.policy).plans_rows:  # it may decode plainly: say why
        print(_auto_explained(target, drafter, stats, greedy=not args.sample, sources=sources))
    if args.compare:
        _compare(args, target, drafter, input_ids, kwargs, output, seconds)


def drafted_run(target, drafter, input_ids, options: dict):
    """(wall seconds, output, (DSpark, copied) row-proposals of this call or None) of one drafted `generate`."""
    from ..eval.speed import timed

    before = list(getattr(drafter, "source_counts", ()) or ())
    seconds, output = timed(lambda: target.generate(input_ids, assistant_model=drafter, **options))
    if not before:
        return seconds, output, None
    return seconds, output, tuple(after - was for after, was in zip(drafter.source_counts, before))


def rounds_by_source(stats, sources: tuple[int, int] | None) -> str:
    """Where one batch-1 call's rounds got their drafts: copied from the context, the DSpark drafter, or none
    (plain-decoding rounds); `sources`: the hybrid's (DSpark, copied) proposals in the call, None for one source."""
    plain = stats.skipped_rounds
    if sources is None:
        return f"{stats.rounds - plain} rounds drafted, {plain} decoded plainly"
    dspark, copied = sources
    return (
        f"drafts per round: copied from the context in {copied}, from the DSpark drafter in {dspark}, none "
        f"(plain decoding) in {plain}"
    )


def _auto_explained(target, drafter, stats, greedy: bool, sources: tuple[int, int] | None = None) -> str:
    """How many rounds "auto" drafted (with the hybrid: from which source), and what drafting can give one request on
    this machine (its cost curves and the DSpark drafter's held-out acceptance; copied drafts cost no drafter
    forward), so that a speedup near 1× explains itself."""
    from ..hardware import processor_signature
    from ..profiling.draft_steps import load_or_profile_draft_curve
    from ..profiling.target_steps import load_or_profile_step_curve
    from ..scheduling.acceptance import heldout_acceptance
    from ..scheduling.padded import batch1_outlook, padded_verify_seconds

    drafted = f"'auto' drafted in {stats.rounds - stats.skipped_rounds} of {stats.rounds} rounds"
    if sources is not None:
        drafted += f" ({sources[1]} copied from the context, {sources[0]} by the DSpark drafter)"
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
    if sources is not None and ratio <= 1.0:
        verdict = "its drafts alone cannot pay here"
    whose = "this drafter's" if sources is None else "the DSpark drafter's"
    line = (
        f"{drafted}. On this machine ({where}) a round verifying {length} draft(s) costs "
        f"{(verify[length] + draft) / verify[0]:.2f} plain steps with the drafter, and {whose} held-out "
        f"acceptance makes its best fixed length worth {ratio:.2f}x plain decoding at batch 1: {verdict}."
    )
    if sources is None:
        return line
    gamma = len(acceptance)
    return (
        line + f" Copied drafts need no drafter forward: a round verifying {gamma} of them costs "
        f"{verify[gamma] / verify[0]:.2f} plain steps, so it pays when it commits more tokens than that."
    )


def _compare(args, target, drafter, input_ids, kwargs, output, dspark_seconds: float) -> None:
    """Plain `generate` right after each drafted run, `--repeats` pairs; prints the median of the paired ratios and
    their spread, or that drafting did not help when no run accepted a draft."""
    import torch

    from ..eval.speed import timed

    ratios, plain_rates, identical = [], [], 0
    accepted = drafter.last_generation_stats.draft_tokens_accepted
    for pair in range(args.repeats):
        if pair:
            dspark_seconds, output, _ = drafted_run(
                target, drafter, input_ids, dict(kwargs, dspark_policy=args.policy)
            )
            accepted += drafter.last_generation_stats.draft_tokens_accepted
        plain_seconds, plain = timed(lambda: target.generate(input_ids, **kwargs))
        dspark_rate = (output.shape[1] - input_ids.shape[1]) / dspark_seconds
        plain_rates.append((plain.shape[1] - input_ids.shape[1]) / plain_seconds)
        ratios.append(dspark_rate / plain_rates[-1])
        identical += int(torch.equal(plain, output))
    verdict = (
        "identical output"
        if identical == len(ratios)
        else (
            "different samples (sampling)"
            if args.sample
            else f"identical output in {identical} of {len(ratios)} "
            "runs; the others differ at a near-tie: bf16 rounds a k-token verification differently from a 1-token "
            "step; use --dtype float32 for bit-identical output"
        )
    )
    print(
        f"plain generate: {statistics.median(plain_rates):.1f} tokens/s; "
        + speedup_summary(ratios, accepted, args.sample)
        + f"; {verdict}"
    )


def speedup_summary(ratios: list[float], accepted_drafts: int, sampled: bool = False) -> str:
    """The demo's speedup line from the paired drafted/plain tokens-per-second ratios: the median and interquartile
    range (wall clock, `time.perf_counter`; on a shared machine other jobs widen the spread), or, when the drafted
    runs accepted no draft at all, that drafting did not help (a ratio then measures noise, not drafting)."""
    if accepted_drafts == 0:
        return (
            f"no draft was accepted, so drafting did not help on this prompt (the {len(ratios)} paired "
            f"timings differ by noise, median ratio {statistics.median(ratios):.2f})"
        )
    if len(ratios) < 4:
        return f"speedup {statistics.median(ratios):.2f}x over plain generate (median of {len(ratios)} paired run(s))"
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return (
        f"speedup {statistics.median(ratios):.2f}x over plain generate, interquartile range {q1:.2f}-{q3:.2f}x "
        f"over {len(ratios)} interleaved pairs (time.perf_counter wall clock; other jobs on a shared machine "
        "widen the spread)"
    )


def add_demo_command(sub) -> None:
    """Register `demo` on the top-level subparsers."""
    from ..proposers import proposers_help

    demo = sub.add_parser(
        "demo",
        help="generate answers with the default drafter on the embedded default target",
        description="Generate with the default drafter (the shipped DSpark drafter or prompt "
        "lookup, chosen per round) on the embedded SmolLM2-135M-Instruct target, print tokens/s, "
        "the accepted length τ and where each round's drafts came from, then compare with plain "
        "generate in interleaved pairs.",
    )
    demo.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="user message (repeat for several; default: a math and a code prompt on which the default "
        "drafter pays, chosen with benchmarks/demo_prompts.py)",
    )
    demo.add_argument("--max-new-tokens", type=positive_int, default=96, help="tokens to generate per prompt")
    demo.add_argument(
        "--block-size",
        type=positive_int,
        default=7,
        help="γ of the untrained fallback drafter (used only when no trained drafter ships)",
    )
    demo.add_argument(
        "--drafter",
        default="hybrid",
        help="hybrid (default: the shipped DSpark drafter or prompt lookup, chosen per round), dspark "
        f"(the shipped DSpark drafter alone), or a drafter spec: {DRAFTER_SPEC_HELP} (registered: "
        f"{proposers_help()})",
    )
    add_runtime_arguments(demo, threads=2, dtype_default="float32", dtype_help=DTYPE_HELP)
    demo.add_argument(
        "--policy",
        default="auto",
        help="dspark_policy of the drafted runs (default auto: cost-aware; fixed: verify all γ drafts)",
    )
    demo.add_argument("--sample", action="store_true", help="sample (T=0.7, top-p 0.9) instead of greedy decoding")
    demo.add_argument("--no-compare", dest="compare", action="store_false", help="skip the plain-generate runs")
    demo.add_argument(
        "--repeats",
        type=positive_int,
        default=9,
        help="drafted / plain pairs per prompt, run alternately; the speedup printed is the median of "
        "their ratios and their interquartile range (nine: single pairs on a shared machine spread)",
    )
    demo.set_defaults(func=cmd_demo, parser=demo)
