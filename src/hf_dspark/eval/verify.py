"""`certify`: a losslessness certificate of one (target, drafter) pair, the library behind `hf-dspark verify`.

Four checks, each with its own verdict:

- greedy: token-for-token equality with plain `generate` on N prompts; a divergence reports its position, the
  target's two top logits there and whether the two runs' tokens were a near-tie in the target's dtype
  (`lossless.divergence_report`): bf16/fp16 verification of several positions at once may legitimately flip a tie;
- sampling: the law of the first `sample_tokens` tokens, position by position (later positions conditioned on the
  most frequent earlier prefix), speculative samples against plain samples (`lossless.chi_square_homogeneity`), at
  level α with a Bonferroni correction over the positions tested, with the shift each test detects at the stated power;
- quality: final-answer exact match (the `final_answer_match` evaluate metric) of sampled answers, plain and
  speculative, against plain greedy's answers, with a confidence interval of the difference;
- inconclusive: a check in which fewer than `min_accepted` drafts were accepted tested nothing and says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .lossless import (
    chi_square_homogeneity,
    conditioned_tokens,
    divergence_report,
    final_answer,
    first_divergence,
    two_proportion_interval,
)


@dataclass
class VerifyConfig:
    """Settings of `certify`.

    Args:
        prompts: prompts of the greedy and quality checks (the first N of the prompt sets).
        max_new_tokens: tokens generated per prompt by the greedy check.
        samples: sampled continuations per arm (plain, speculative) in the sampling check.
        sample_tokens: positions whose law the sampling check tests (the first n generated tokens).
        sample_batch: rows per `generate` call when sampling.
        temperature: sampling temperature (top-k and top-p off, so the whole law is tested).
        alpha: significance level of the sampling check (family-wise, over its positions).
        power: power at which the detectable shift is stated.
        min_accepted: drafts that must be accepted in a check for it to be conclusive.
        min_position_samples: samples per arm below which a conditioned position is not tested.
        quality_samples: sampled answers per prompt and arm in the quality check (0 skips it).
        quality_max_new_tokens: tokens per sampled answer.
        quality_temperature: sampling temperature of the quality check's answers.
        confidence: confidence level of the quality interval.
        policy: the `dspark_policy` of the speculative runs; "fixed" (ℓ = γ every round) verifies the most drafts,
            so it tests the verification rule hardest.
        seed: base seed of the sampling.
    """

    prompts: int = 8
    max_new_tokens: int = 64
    samples: int = 1000
    sample_tokens: int = 4
    sample_batch: int = 250
    temperature: float = 1.0
    alpha: float = 0.01
    power: float = 0.8
    min_accepted: int = 20
    min_position_samples: int = 100
    quality_samples: int = 4
    quality_max_new_tokens: int = 192
    quality_temperature: float = 0.7
    confidence: float = 0.95
    policy: str = "fixed"
    seed: int = 0

    def __post_init__(self) -> None:
        counts = ("prompts", "max_new_tokens", "samples", "sample_tokens", "sample_batch", "min_position_samples")
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.quality_samples < 0 or self.min_accepted < 0 or self.quality_max_new_tokens < 1:
            raise ValueError("quality_samples and min_accepted must be >= 0, quality_max_new_tokens >= 1")
        for name in ("alpha", "power", "confidence"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must lie in (0, 1), got {getattr(self, name)}")
        if min(self.temperature, self.quality_temperature) <= 0:
            raise ValueError("temperature and quality_temperature must be > 0 (those checks sample), got "
                             f"{self.temperature} and {self.quality_temperature}")


def _accepted(drafter) -> int:
    stats = drafter.last_generation_stats
    return 0 if stats is None else int(stats.draft_tokens_accepted)


@torch.no_grad()
def greedy_check(target, drafter, prompts: list[torch.Tensor], config: VerifyConfig):
    """(report, plain greedy continuations): equality with plain `generate`, prompt by prompt (batch 1)."""
    rows, continuations, accepted = [], [], 0
    for index, prompt in enumerate(prompts[: config.prompts]):
        ids = prompt[None].to(target.device)
        options = {"do_sample": False, "max_new_tokens": config.max_new_tokens, "attention_mask": torch.ones_like(ids)}
        plain = target.generate(ids, output_logits=True, return_dict_in_generate=True, **options)
        drafted = target.generate(ids, assistant_model=drafter, dspark_policy=config.policy, **options)
        accepted += _accepted(drafter)
        reference, output = plain.sequences[0, ids.shape[1]:], drafted[0, ids.shape[1]:]
        continuations.append(reference)
        row = {"prompt": index, "new_tokens": len(reference), "first_divergence": first_divergence(reference, output)}
        at = row["first_divergence"]
        if at is not None and at < min(len(reference), len(output)):
            row.update(divergence_report(plain.logits[at][0], int(reference[at]), int(output[at]), target.dtype))
        rows.append(row)
    diverged = [r for r in rows if r["first_divergence"] is not None]
    if diverged and not all(r.get("near_tie") for r in diverged):
        verdict = "fail"
    elif accepted < config.min_accepted:
        verdict = "inconclusive"
    else:
        verdict = "pass (near-ties)" if diverged else "pass"
    return {"verdict": verdict, "accepted_drafts": accepted, "prompts": rows,
            "identical": len(rows) - len(diverged)}, continuations


def _samples(target, prompt: torch.Tensor, config: VerifyConfig, seed: int, drafter=None):
    torch.manual_seed(seed)
    out, accepted = [], 0
    for start in range(0, config.samples, config.sample_batch):
        rows = min(config.sample_batch, config.samples - start)
        ids = prompt[None].expand(rows, -1).to(target.device)
        generated = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                                    temperature=config.temperature, max_new_tokens=config.sample_tokens,
                                    min_new_tokens=config.sample_tokens, assistant_model=drafter,
                                    **({} if drafter is None else {"dspark_policy": config.policy}))
        out.append(generated[:, ids.shape[1]:].cpu())
        accepted += 0 if drafter is None else _accepted(drafter)
    return torch.cat(out), accepted


@torch.no_grad()
def sampling_check(target, drafter, prompt: torch.Tensor, config: VerifyConfig) -> dict:
    """Plain vs speculative samples of one prompt, position by position (see the module docstring)."""
    plain, _ = _samples(target, prompt, config, config.seed)
    speculative, accepted = _samples(target, prompt, config, config.seed + 1, drafter)
    positions, pairs = [], []
    for k in range(config.sample_tokens):
        prefix, tokens_a, tokens_b = conditioned_tokens(plain, speculative, k)
        row = {"position": k + 1, "prefix": [int(t) for t in prefix]}
        if min(len(tokens_a), len(tokens_b)) < config.min_position_samples:
            row["skipped"] = (f"{len(tokens_a)} plain / {len(tokens_b)} speculative samples with this prefix "
                              f"(< {config.min_position_samples})")
        else:
            pairs.append((row, tokens_a, tokens_b))
        positions.append(row)
    level = config.alpha / max(len(pairs), 1)  # Bonferroni: family-wise level alpha over the tested positions
    for row, tokens_a, tokens_b in pairs:
        row.update(asdict(chi_square_homogeneity(tokens_a, tokens_b, level, config.power)))
    tested = [row for row, _, _ in pairs]
    if any(p["pvalue"] < level for p in tested):
        verdict = "fail"
    elif accepted < config.min_accepted or not tested:
        verdict = "inconclusive"
    else:
        verdict = "pass"
    return {"verdict": verdict, "accepted_drafts": accepted, "alpha": config.alpha, "per_position_level": level,
            "power": config.power, "temperature": config.temperature, "samples": config.samples,
            "positions": positions}


@torch.no_grad()
def quality_check(target, drafter, tokenizer, prompts: list[torch.Tensor], references: list[torch.Tensor],
                  config: VerifyConfig) -> dict:
    """Final-answer exact match of sampled answers, plain and speculative, against plain greedy's answers (the
    `final_answer_match` evaluate metric), with a `config.confidence` interval of the difference."""
    from .metrics import load_metric

    metric = load_metric("final_answer_match")
    texts = {"plain": [], "speculative": []}
    wanted, accepted = [], 0
    for index, (prompt, reference) in enumerate(zip(prompts[: config.prompts], references)):
        ids = prompt[None].expand(config.quality_samples, -1).to(target.device)
        options = {"attention_mask": torch.ones_like(ids), "do_sample": True, "top_k": 0, "top_p": 1.0,
                   "temperature": config.quality_temperature, "max_new_tokens": config.quality_max_new_tokens}
        speculative = {"assistant_model": drafter, "dspark_policy": config.policy}
        for arm, extra in (("plain", {}), ("speculative", speculative)):
            torch.manual_seed(config.seed + 7919 * index + bool(extra))
            out = target.generate(ids, **options, **extra)
            texts[arm] += tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        accepted += _accepted(drafter)
        wanted += [tokenizer.decode(reference, skip_special_tokens=True)] * config.quality_samples
    scores = {arm: metric.compute(predictions=found, references=wanted) for arm, found in texts.items()}
    hits = {arm: score["matches"] for arm, score in scores.items()}
    count = len(wanted)
    answered = sum(final_answer(text) is not None for text in wanted)
    difference, low, high = two_proportion_interval(hits["plain"], count, hits["speculative"], count,
                                                    config.confidence)
    if accepted < config.min_accepted or answered == 0 or hits["plain"] + hits["speculative"] == 0:
        verdict = "inconclusive"  # nothing accepted, no reference answer, or no answer matched in either arm
    else:
        verdict = "pass" if low <= 0 <= high else "fail"
    return {"verdict": verdict, "accepted_drafts": accepted, "metric": "final_answer_match (evaluate)",
            "reference": "plain greedy answer", "references_with_an_answer": answered, "samples_per_arm": count,
            "exact_match": {arm: score["exact_match"] for arm, score in scores.items()},
            "difference": difference, "interval": [low, high], "confidence": config.confidence,
            "temperature": config.quality_temperature}


def certify(target, drafter, prompts: list[torch.Tensor], config: VerifyConfig | None = None,
            tokenizer=None) -> dict:
    """Run the checks of the module docstring on `prompts` (1-D token ids; the sampling check uses the first) and
    return the report: one section per check and an overall `verdict` ("pass", "fail" or "inconclusive"). Without
    a `tokenizer` (or with `config.quality_samples == 0`) the quality check is skipped."""
    config = config or VerifyConfig()
    if not prompts:
        raise ValueError("certify needs at least one prompt")
    greedy, continuations = greedy_check(target, drafter, prompts, config)
    report = {"config": asdict(config), "dtype": str(target.dtype).removeprefix("torch."), "greedy": greedy,
              "sampling": sampling_check(target, drafter, prompts[0], config)}
    if tokenizer is not None and config.quality_samples:
        report["quality"] = quality_check(target, drafter, tokenizer, prompts, continuations, config)
    verdicts = [report[name]["verdict"] for name in ("greedy", "sampling", "quality") if name in report]
    if any(v == "fail" for v in verdicts):
        report["verdict"] = "fail"
    elif any(report[name]["verdict"] == "inconclusive" for name in ("greedy", "sampling")):
        report["verdict"] = "inconclusive"
    else:
        report["verdict"] = "pass (near-ties)" if greedy["verdict"] == "pass (near-ties)" else "pass"
    return report
