"""The statistics of losslessness: greedy identity, exact and two-sample distribution tests, detectable effects.

The library's own tests and `hf-dspark verify` share these functions. Two regimes:

- a tiny vocabulary (the tests' random targets): the exact joint law of the first n tokens is enumerated
  (`exact_joint`) and samples are tested against it (`chi_square_pvalue`);
- a real vocabulary: plain samples and speculative samples are compared (`chi_square_homogeneity`,
  `total_variation`), position by position, later positions conditioned on a fixed prefix (`conditioned_tokens`).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import torch


# ----------------------------------------------------------------------------------------------- greedy identity
def first_divergence(reference: torch.Tensor, output: torch.Tensor) -> int | None:
    """First index t with reference[t] != output[t] of two 1-D token sequences (a length difference counts as a
    difference at the shorter length); None when they are equal."""
    width = min(len(reference), len(output))
    differs = (reference[:width] != output[:width]).nonzero()
    if len(differs):
        return int(differs[0, 0])
    return None if len(reference) == len(output) else width


def tie_tolerance(logits: torch.Tensor, dtype: torch.dtype) -> float:
    """tol = 8 · eps(dtype) · max(1, |max logit|): logit gaps below it can flip between two numerically valid
    forwards (one token at a time vs several positions at once) in `dtype`. logits: `[V]`."""
    return 8.0 * torch.finfo(dtype).eps * max(1.0, float(logits.abs().max()))


def divergence_report(logits: torch.Tensor, plain_token: int, drafted_token: int, dtype: torch.dtype) -> dict:
    """What the target's own logits `[V]` say at a diverging position: its two top logits, the gap between the
    tokens the two runs chose, and whether that gap is a near-tie in `dtype` (`tie_tolerance`)."""
    logits = logits.float()
    top = torch.topk(logits, 2)
    gap = float(logits[plain_token] - logits[drafted_token])
    tolerance = tie_tolerance(logits, dtype)
    return {
        "plain_token": int(plain_token),
        "speculative_token": int(drafted_token),
        "top2_tokens": [int(t) for t in top.indices],
        "top2_logits": [float(v) for v in top.values],
        "logit_gap": gap,
        "tie_tolerance": tolerance,
        "near_tie": abs(gap) <= tolerance,
    }


_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(text: str) -> str | None:
    """The content of the last `\\boxed{...}` of `text`, else its last number (commas dropped, a trailing `.0`
    removed), stripped; None when there is neither."""
    boxed = _BOXED.findall(text)
    if boxed:
        answer = boxed[-1].strip()
    else:
        numbers = _NUMBER.findall(text)
        if not numbers:
            return None
        answer = numbers[-1]
    answer = answer.replace(",", "").replace("$", "").strip()
    return answer[:-2] if answer.endswith(".0") else answer


# ------------------------------------------------------------------------------ exact law (tiny vocabularies)
def sequence_codes(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """code = Σ_k x_k · V^(n−1−k): one integer per row of `tokens [S, n]` (`[S]`), the index into `exact_joint`."""
    n = tokens.shape[1]
    weights = vocab_size ** torch.arange(n - 1, -1, -1, device=tokens.device)
    return (tokens * weights).sum(dim=1)


@torch.no_grad()
def exact_joint(target, prompt: torch.Tensor, new_tokens: int, processors=None) -> torch.Tensor:
    """P(x_1..x_n | prompt) for every continuation, `processors` (a `LogitsProcessorList` of warpers, or None)
    applied at each step. prompt: `[1, L]`; returns `[V**n]` indexed by `sequence_codes`. Only for tiny V."""
    vocab = target.config.get_text_config().vocab_size
    prefixes = torch.tensor(list(itertools.product(range(vocab), repeat=new_tokens - 1)), dtype=torch.long)
    prefixes = prefixes.reshape(vocab ** (new_tokens - 1), new_tokens - 1)
    seqs = torch.cat([prompt.expand(len(prefixes), -1), prefixes], dim=1)
    logits = target(seqs).logits[:, prompt.shape[1] - 1 :].float()  # [N, n, V]
    steps = [logits[:, k] if processors is None else processors(None, logits[:, k]) for k in range(new_tokens)]
    probs = torch.softmax(torch.stack(steps, dim=1), dim=-1)  # [N, n, V]
    prefix_prob = probs[:, :-1].gather(-1, prefixes[..., None]).squeeze(-1).prod(dim=1)  # [N]
    joint = prefix_prob[:, None] * probs[:, -1]  # [N, V]: prefix code * V + last token, row-major
    return joint.reshape(-1)


def sample_codes(target, prompt: torch.Tensor, new_tokens: int, samples: int, seed: int, assistant_model=None,
                 chunk: int = 4000, **generate_kwargs) -> torch.Tensor:
    """`sequence_codes` of `samples` sampled continuations of `prompt [1, L]` (`min_new_tokens = new_tokens`), in
    chunks of `chunk` rows, plain or with `assistant_model`; `generate_kwargs` reach `generate`."""
    torch.manual_seed(seed)
    vocab = target.config.get_text_config().vocab_size
    codes = []
    for start in range(0, samples, chunk):
        rows = min(chunk, samples - start)
        out = target.generate(prompt.expand(rows, -1), do_sample=True, max_new_tokens=new_tokens,
                              assistant_model=assistant_model, **generate_kwargs)
        codes.append(sequence_codes(out[:, prompt.shape[1] :], vocab))
    return torch.cat(codes)


def gamma_pvalue(statistic: float, dof: int) -> float:
    """P(χ²_dof ≥ statistic) = Q(dof/2, statistic/2); 1.0 when dof < 1."""
    if dof < 1:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(statistic / 2.0, dtype=torch.float64)))


def chi_square_pvalue(codes: torch.Tensor, joint: torch.Tensor, min_expected: float = 5.0) -> float:
    """Goodness of fit of sampled `codes [S]` to the exact law `joint [C]`: χ² = Σ (O − E)² / E over cells with
    E ≥ min_expected, the rest pooled into one cell; 0.0 when a continuation of probability 0 was sampled."""
    observed = torch.bincount(codes, minlength=joint.numel()).double()
    expected = joint.double() * codes.numel()
    if bool((observed[expected == 0] > 0).any()):
        return 0.0
    big = expected >= min_expected
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return gamma_pvalue(stat, int(keep.sum()) - 1)


# ------------------------------------------------------------------------------- two-sample (real vocabularies)
@dataclass
class TwoSampleTest:
    """χ² homogeneity test of two token samples (cells with a pooled expected count < 5 merged into one).

    Args:
        n_plain / n_speculative: sample sizes. statistic, dof, pvalue: the χ² test. total_variation: ½ Σ |f_a − f_b|
        of the empirical frequencies. detectable_difference: the smallest shift in one token's probability the test
        detects with the stated power at the stated level (`min_detectable_difference`).
    """

    n_plain: int
    n_speculative: int
    statistic: float
    dof: int
    pvalue: float
    total_variation: float
    detectable_difference: float


def total_variation(tokens_a: torch.Tensor, tokens_b: torch.Tensor) -> float:
    """TV = ½ Σ_x |f_a(x) − f_b(x)| between the empirical laws of two 1-D token samples."""
    size = int(max(tokens_a.max(), tokens_b.max())) + 1
    f_a = torch.bincount(tokens_a, minlength=size).double() / len(tokens_a)
    f_b = torch.bincount(tokens_b, minlength=size).double() / len(tokens_b)
    return 0.5 * float((f_a - f_b).abs().sum())


def min_detectable_difference(n_a: int, n_b: int, alpha: float, power: float) -> float:
    """δ = (z_{1−α/2} + z_{power}) · √(½·½ · (1/n_a + 1/n_b)): the shift in one token's probability (worst case
    p = ½) a two-sided two-proportion test at level α detects with probability `power`."""
    z = torch.special.ndtri(torch.tensor([1 - alpha / 2, power], dtype=torch.float64))
    return float(z.sum() * (0.25 * (1 / n_a + 1 / n_b)) ** 0.5)


def chi_square_homogeneity(tokens_a: torch.Tensor, tokens_b: torch.Tensor, alpha: float = 0.01,
                           power: float = 0.8, min_expected: float = 5.0) -> TwoSampleTest:
    """Whether two 1-D token samples `[N_a]`, `[N_b]` come from one law: χ² = Σ_cells Σ_arms (O − E)² / E with
    E = n_arm · (O_a + O_b) / (N_a + N_b), dof = cells − 1, cells of pooled count below min_expected merged."""
    size = int(max(tokens_a.max(), tokens_b.max())) + 1
    counts = torch.stack([torch.bincount(tokens_a, minlength=size), torch.bincount(tokens_b, minlength=size)]).double()
    total = counts.sum(dim=0)
    share = counts.sum(dim=1, keepdim=True) / total.sum()  # [2, 1]
    big = (share.min() * total) >= min_expected
    cells = torch.cat([counts[:, big], counts[:, ~big].sum(dim=1, keepdim=True)], dim=1)
    cells = cells[:, cells.sum(dim=0) > 0]
    expected = share * cells.sum(dim=0, keepdim=True)
    stat = float(((cells - expected) ** 2 / expected).sum())
    dof = cells.shape[1] - 1
    return TwoSampleTest(len(tokens_a), len(tokens_b), stat, dof, gamma_pvalue(stat, dof),
                         total_variation(tokens_a, tokens_b),
                         min_detectable_difference(len(tokens_a), len(tokens_b), alpha, power))


def conditioned_tokens(plain: torch.Tensor, speculative: torch.Tensor, position: int):
    """Token `position` (0-based) of the rows whose earlier tokens equal the most frequent such prefix among the
    plain rows: (prefix `[position]`, plain tokens, speculative tokens). plain, speculative: `[S, n]`."""
    if position == 0:
        return plain[:, :0][0], plain[:, 0], speculative[:, 0]
    prefixes, counts = torch.unique(plain[:, :position], dim=0, return_counts=True)
    prefix = prefixes[counts.argmax()]
    keep_a = (plain[:, :position] == prefix).all(dim=1)
    keep_b = (speculative[:, :position] == prefix).all(dim=1)
    return prefix, plain[keep_a, position], speculative[keep_b, position]


def two_proportion_interval(hits_a: int, n_a: int, hits_b: int, n_b: int, confidence: float = 0.95):
    """(p_b − p_a, low, high): the difference of two success rates and its Agresti–Caffo interval, centred on
    p̃_b − p̃_a with p̃ = (hits + 1) / (n + 2), half-width z·√(Σ p̃(1 − p̃) / (n + 2)) (never empty at 0 or n hits)."""
    z = float(torch.special.ndtri(torch.tensor(0.5 + confidence / 2, dtype=torch.float64)))
    t_a, t_b = (hits_a + 1) / (n_a + 2), (hits_b + 1) / (n_b + 2)
    half = z * (t_a * (1 - t_a) / (n_a + 2) + t_b * (1 - t_b) / (n_b + 2)) ** 0.5
    return hits_b / n_b - hits_a / n_a, t_b - t_a - half, t_b - t_a + half
