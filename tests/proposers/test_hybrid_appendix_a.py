"""Appendix A for the hybrid: choosing the source from this round's sampled drafts is biased; the lagged rule is not.

Chains of single-request rounds through the real `verify_sampling`, V = {A, B}, γ = 1: the DSpark drafter
samples x ~ q = (0.5, 0.5), the lookup proposes A (one-hot), the target is p = (0.7, 0.3). A leaky rule that
switches to the lookup when the DSpark draft came out B gives P(A) = 0.5 + 0.5·0.7 = 0.85; `choose_sources`
(lagged per-chain scores, updated from what each source's proposal agreed with) keeps P(A) = 0.7.
"""

import math

import torch

from hf_dspark.ops.verification import verify_sampling
from hf_dspark.proposers.scoring import DSPARK, LOOKUP, choose_sources

TOKEN_A, CHAINS, ROUNDS = 0, 40_000, 5
Q = torch.tensor([0.5, 0.5], dtype=torch.float64)
P = torch.tensor([0.7, 0.3], dtype=torch.float64)


def _first_token_rate(leaky: bool, seed: int = 0) -> tuple[float, float, torch.Tensor]:
    """(P̂(emitted token = A) over every chain and round, its standard error, how often each source was used)."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.tensor([1.0, 1.5], dtype=torch.float64).repeat(CHAINS, 1)  # (DSpark, lookup) priors
    hits, used = 0, torch.zeros(2)
    for _ in range(ROUNDS):
        dspark_draft = torch.multinomial(Q.expand(CHAINS, 2), 1, generator=gen).squeeze(1)
        if leaky:  # THE WRONG RULE: looks at this round's sampled DSpark draft
            sources = torch.where(dspark_draft == 1, LOOKUP, DSPARK)
        else:
            sources = choose_sources(torch.ones(CHAINS, dtype=torch.long), scores[:, LOOKUP], scores[:, DSPARK])
        lookup = sources == LOOKUP
        drafts = torch.where(lookup, TOKEN_A, dspark_draft)
        draft_probs = torch.where(lookup[:, None], torch.nn.functional.one_hot(drafts, 2).double(), Q)
        result = verify_sampling(
            drafts[:, None],
            draft_probs[:, None],
            P.expand(CHAINS, 2, 2).contiguous(),
            torch.ones(CHAINS, dtype=torch.long),
            generator=gen,
        )
        emitted = torch.where(result.num_accepted >= 1, drafts, result.next_token)
        hits += int((emitted == TOKEN_A).sum())
        used += torch.bincount(sources, minlength=2)
        lookup_agrees = (emitted == TOKEN_A).double()  # scored every round (its proposal needs no sampling)
        scores[:, LOOKUP] = 0.5 * scores[:, LOOKUP] + 0.5 * lookup_agrees
        dspark_agrees = (emitted == dspark_draft).double()
        scores[:, DSPARK] = torch.where(lookup, scores[:, DSPARK], 0.5 * scores[:, DSPARK] + 0.5 * dspark_agrees)
    total = CHAINS * ROUNDS
    rate = hits / total
    return rate, math.sqrt(rate * (1 - rate) / total), used


def test_leaky_source_choice_is_biased():
    rate, sigma, _ = _first_token_rate(leaky=True)
    assert abs(rate - 0.85) < 4 * sigma, rate


def test_lagged_source_choice_is_lossless():
    rate, sigma, used = _first_token_rate(leaky=False)
    assert used.min() > 0.1 * used.sum(), used  # both sources are really chosen
    assert abs(rate - 0.7) < 4 * sigma, rate


def test_choose_sources_needs_a_match_and_a_better_lagged_score():
    match = torch.tensor([0, 2, 2, 1])
    out = choose_sources(match, torch.tensor([3.0, 3.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 2.0, 1.0]), min_match=1)
    assert out.tolist() == [DSPARK, LOOKUP, DSPARK, LOOKUP]
