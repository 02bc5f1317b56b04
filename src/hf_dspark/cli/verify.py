"""`hf-dspark verify`: a losslessness certificate for a target and drafter (`hf_dspark.eval.verify.certify`).

Exit status: 0 when every check passes, 1 when one finds a difference, 3 when the result is inconclusive (too few
drafts accepted to test anything), 2 for a usage error.
"""

from __future__ import annotations

import argparse

from .bench import RESULTS_HELP, default_out
from .loaders import DEVICE_HELP, DRAFTER_SPEC_HELP, DTYPE_CHOICES, device_name, positive_int, probability
from .prompt_sets import add_sets_arguments, resolve_sets
from .validation import check_drafter_spec, check_output_parent

EXIT_STATUS = {"pass": 0, "pass (near-ties)": 0, "fail": 1, "inconclusive": 3}
DEFAULT_DRAFTER = "default"


def _prompt_ids(tokenizer, specs: list[str], count: int) -> list:
    """The first user turn of the first `count` prompts over the sets, tokenised (chat template when there is one)."""
    import torch

    from ..eval.prompts import chat_input_ids, load_prompt_set

    prompts = []
    for spec in specs:
        for item in load_prompt_set(spec)[: count - len(prompts)]:
            if getattr(tokenizer, "chat_template", None):
                prompts.append(chat_input_ids(tokenizer, item["turns"][:1])[0])
            else:
                prompts.append(torch.tensor(tokenizer(item["turns"][0])["input_ids"], dtype=torch.long))
    return prompts


def _load_drafter(target, spec: str):
    from ..drafter import load_default_drafter
    from .loaders import load_drafter_spec

    if spec == DEFAULT_DRAFTER:
        return load_default_drafter(target), "the default drafter (shipped DSpark drafter or prompt lookup per round)"
    return load_drafter_spec(target, spec), spec


def _config(args: argparse.Namespace):
    from ..eval.verify import VerifyConfig

    try:
        return VerifyConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, samples=args.samples,
                            sample_tokens=args.sample_tokens, sample_batch=args.sample_batch,
                            temperature=args.temperature, alpha=args.alpha, power=args.power,
                            min_accepted=args.min_accepted, min_position_samples=args.min_position_samples,
                            quality_samples=args.quality_samples,
                            quality_max_new_tokens=args.quality_max_new_tokens, policy=args.policy, seed=args.seed)
    except ValueError as error:
        args.parser.error(str(error))


def cmd_verify(args: argparse.Namespace) -> int:
    import torch

    from ..eval.verify import certify
    from ..eval.verify_report import plot_certificate, summary_lines
    from ..io_utils import write_json_atomic
    from ..provenance import with_provenance
    from .loaders import load_target

    args.out = args.out or default_out("verify", args.device)
    check_output_parent(args.parser, "--out", args.out)
    if args.drafter != DEFAULT_DRAFTER:
        check_drafter_spec(args.parser, "--drafter", args.drafter)
    specs = resolve_sets(args)
    config = _config(args)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, args.dtype, device=args.device)
    drafter, label = _load_drafter(target, args.drafter)
    prompts = _prompt_ids(tokenizer, specs, config.prompts)
    report = certify(target, drafter, prompts, config, tokenizer=tokenizer if config.quality_samples else None)
    report = {"target": args.target or "the embedded default target", "drafter": label, "sets": specs, **report}
    report = with_provenance(report, device=args.device if args.device != "auto" else "cpu")
    write_json_atomic(args.out, report)
    figure = plot_certificate(report, f"{args.out.rsplit('.', 1)[0]}.png")
    print("\n".join(summary_lines(report)))
    print(f"wrote {args.out} and {figure}")
    return EXIT_STATUS[report["verdict"]]


def add_verify_command(sub) -> None:
    """Register `verify` on the top-level subparsers."""
    verify = sub.add_parser(
        "verify", help="certify that speculative decoding with a drafter is lossless for a target",
        description="A losslessness certificate: greedy output token for token equal to plain generate (a "
        "divergence is reported with the target's top-2 logits and whether it is a near-tie in the dtype); the law "
        "of the first sampled tokens, speculative against plain (χ² test at a stated level, the shift it detects at "
        "a stated power, total variation); final-answer exact match through evaluate; 'inconclusive' when too "
        "few drafts were accepted. Exit status 0 pass, 1 fail, 3 inconclusive.")
    verify.add_argument("--target", default=None, help="causal LM path or Hub id (default: the embedded SmolLM2)")
    verify.add_argument("--drafter", default=DEFAULT_DRAFTER,
                        help=f"'{DEFAULT_DRAFTER}' (the shipped default drafter) or {DRAFTER_SPEC_HELP}")
    verify.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES, help="dtype the target is loaded in")
    verify.add_argument("--device", type=device_name, default="auto", help=DEVICE_HELP)
    verify.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads, pinned")
    add_sets_arguments(verify, ["gsm8k"], "the first user turn of the first --prompts items (the sampling check "
                       "uses the first prompt)")
    verify.add_argument("--prompts", type=positive_int, default=8, help="prompts of the greedy and quality checks")
    verify.add_argument("--max-new-tokens", type=positive_int, default=64, help="greedy tokens per prompt")
    verify.add_argument("--samples", type=positive_int, default=1000, help="sampled continuations per arm")
    verify.add_argument("--sample-tokens", type=positive_int, default=4, help="positions whose law is tested")
    verify.add_argument("--sample-batch", type=positive_int, default=250, help="rows per sampling generate call")
    verify.add_argument("--temperature", type=float, default=1.0, help="sampling check temperature (top-k/p off)")
    verify.add_argument("--alpha", type=probability, default=0.01, help="family-wise significance level")
    verify.add_argument("--power", type=probability, default=0.8, help="power at which the detectable shift is given")
    verify.add_argument("--min-accepted", type=int, default=20,
                        help="accepted drafts below which a check is inconclusive")
    verify.add_argument("--min-position-samples", type=positive_int, default=100,
                        help="samples per arm below which a position (given its prefix) is not tested")
    verify.add_argument("--quality-samples", type=int, default=4,
                        help="sampled answers per prompt and arm of the quality check (0 skips it)")
    verify.add_argument("--quality-max-new-tokens", type=positive_int, default=192, help="tokens per answer")
    verify.add_argument("--policy", default="fixed", help="dspark_policy of the speculative runs (fixed: ℓ = γ)")
    verify.add_argument("--seed", type=int, default=0, help="base seed")
    verify.add_argument("--out", default=None,
                        help=f"JSON report, a PNG beside it (default: {RESULTS_HELP.format(name='verify')})")
    verify.set_defaults(func=cmd_verify, parser=verify)
