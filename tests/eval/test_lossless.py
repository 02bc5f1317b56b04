"""The statistics of `hf_dspark.eval.lossless` on known answers."""

import itertools

import torch

from hf_dspark.eval.lossless import (
    chi_square_homogeneity,
    chi_square_pvalue,
    conditioned_tokens,
    divergence_report,
    exact_joint,
    final_answer,
    first_divergence,
    min_detectable_difference,
    sequence_codes,
    two_proportion_interval,
)
from tests.helpers import make_target


def test_first_divergence():
    a = torch.tensor([1, 2, 3, 4])
    assert first_divergence(a, a.clone()) is None
    assert first_divergence(a, torch.tensor([1, 2, 9, 4])) == 2
    assert first_divergence(a, a[:3]) == 3


def test_a_gap_within_rounding_of_the_dtype_is_a_near_tie():
    logits = torch.zeros(10)
    logits[3], logits[5] = 12.0, 12.0 - 0.03
    assert divergence_report(logits, 3, 5, torch.bfloat16)["near_tie"]  # 8 * 2^-7 * 12 ≈ 0.75
    fp32 = divergence_report(logits, 3, 5, torch.float32)
    assert not fp32["near_tie"] and fp32["top2_tokens"] == [3, 5] and abs(fp32["logit_gap"] - 0.03) < 1e-6


def test_exact_joint_is_the_product_of_the_step_laws():
    target = make_target("llama", seed=4, vocab_size=5, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    prompt = torch.tensor([[1, 2, 3]])
    joint = exact_joint(target, prompt, 2)
    assert torch.isclose(joint.sum(), torch.tensor(1.0), atol=1e-5)
    with torch.no_grad():
        for first, second in itertools.product(range(5), repeat=2):
            p1 = torch.softmax(target(prompt).logits[0, -1], -1)[first]
            p2 = torch.softmax(target(torch.cat([prompt, torch.tensor([[first]])], 1)).logits[0, -1], -1)[second]
            code = int(sequence_codes(torch.tensor([[first, second]]), 5))
            assert torch.isclose(joint[code], p1 * p2, atol=1e-6)


def test_chi_square_pvalue_accepts_the_law_and_rejects_another():
    joint = torch.tensor([0.5, 0.3, 0.2, 0.0])
    gen = torch.Generator().manual_seed(0)
    codes = torch.multinomial(joint, 5000, replacement=True, generator=gen)
    assert chi_square_pvalue(codes, joint) > 1e-3
    assert chi_square_pvalue(torch.multinomial(torch.tensor([0.4, 0.4, 0.2, 0.0]), 5000, True, generator=gen),
                             joint) < 1e-6
    assert chi_square_pvalue(torch.tensor([3, 0, 1]), joint) == 0.0  # a continuation of probability 0


def test_two_sample_test_power_and_size():
    gen = torch.Generator().manual_seed(1)
    law = torch.tensor([0.5, 0.25, 0.15, 0.1])
    a, b = (torch.multinomial(law, 2000, True, generator=gen) for _ in range(2))
    same = chi_square_homogeneity(a, b)
    assert same.pvalue > 1e-3 and same.total_variation < 0.05
    shifted = torch.multinomial(torch.tensor([0.42, 0.33, 0.15, 0.1]), 2000, True, generator=gen)
    assert chi_square_homogeneity(a, shifted).pvalue < 1e-4  # a shift of 0.08 > the detectable 0.05
    assert abs(min_detectable_difference(2000, 2000, 0.01, 0.8) - 0.0545) < 1e-3


def test_conditioned_tokens_take_the_most_frequent_prefix():
    plain = torch.tensor([[1, 2], [1, 3], [4, 2], [1, 2]])
    speculative = torch.tensor([[1, 5], [4, 4], [1, 2]])
    prefix, a, b = conditioned_tokens(plain, speculative, 1)
    assert prefix.tolist() == [1] and a.tolist() == [2, 3, 2] and b.tolist() == [5, 2]


def test_final_answer_and_interval():
    assert final_answer("so the total is \\boxed{1,200}.") == "1200"
    assert final_answer("3 apples and 4.0 pears") == "4" and final_answer("no number") is None
    difference, low, high = two_proportion_interval(50, 100, 50, 100)
    assert difference == 0 and low < 0 < high and abs(high - 0.1372) < 1e-3
    assert two_proportion_interval(0, 8, 0, 8)[1] < 0 < two_proportion_interval(0, 8, 0, 8)[2]  # never empty
