"""Generate options holding token-id lists as long as the batch are shared by every row, not cut per row."""

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from hf_dspark.generation import oracle_for
from tests.helpers import make_target, ragged_prompts


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=11)


@pytest.mark.parametrize(
    ("batch", "options"),
    [
        (4, dict(suppress_tokens=[1, 3, 8, 9])),
        (2, dict(eos_token_id=[39, 44], min_new_tokens=10)),
        (2, dict(eos_token_id=[39, 44], min_length=14)),
        (3, dict(begin_suppress_tokens=[5, 6, 7])),
        (2, dict(eos_token_id=[39, 44], forced_eos_token_id=[39, 44], max_length=20)),
        (2, dict(eos_token_id=[39, 44], exponential_decay_length_penalty=(4, 1.5))),
    ],
)
def test_list_options_as_long_as_the_batch_match_plain_generate(target, batch, options):
    ids, mask = ragged_prompts(batch, seed=batch + 40)
    kwargs = dict(attention_mask=mask, do_sample=False, **{"max_new_tokens": 16, **options})
    if "max_length" in options:
        kwargs.pop("max_new_tokens")
    reference = target.generate(ids, **kwargs)
    drafter = oracle_for(target, 4, reference, mask)
    output = target.generate(ids, assistant_model=drafter, **kwargs)
    assert torch.equal(output, reference)


class _PerRowBudget(StoppingCriteria):
    """Stops row r once it generated budgets[r] tokens (batch semantics: one verdict per row)."""

    def __init__(self, prompt_width: int, budgets: list[int]) -> None:
        self.prompt_width, self.budgets = prompt_width, torch.tensor(budgets)

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.prompt_width) >= self.budgets[: input_ids.shape[0]]


def test_stopping_criteria_with_per_row_state_match_plain_generate(target):
    ids, mask = ragged_prompts(4, seed=44)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=16, eos_token_id=None)
    criteria = StoppingCriteriaList([_PerRowBudget(ids.shape[1], [3, 12, 6, 9])])
    reference = target.generate(ids, stopping_criteria=criteria, **kwargs)
    drafter = oracle_for(target, 4, target.generate(ids, **kwargs), mask)
    output = target.generate(ids, assistant_model=drafter, stopping_criteria=criteria, **kwargs)
    generated = (output[:, ids.shape[1] :] != 0).sum(dim=1).tolist()
    assert generated == [3, 12, 6, 9]
    for row, budget in enumerate(generated):  # without EOS plain generate keeps going for stopped rows
        end = ids.shape[1] + budget
        assert torch.equal(output[row, :end], reference[row, :end])


GENERATION_CONFIG_EOS = {2: [39, 44], 3: [39, 44, 77]}  # Llama-3-style: several EOS ids in the model's own config


@pytest.mark.parametrize("batch", sorted(GENERATION_CONFIG_EOS))
@pytest.mark.parametrize(
    "options",
    [
        dict(min_new_tokens=10),
        dict(exponential_decay_length_penalty=(4, 1.5)),
        dict(forced_eos_token_id=True, max_length=20),  # True: force the EOS list itself
    ],
)
def test_an_eos_list_on_the_models_generation_config_matches_plain_generate(target, batch, options):
    eos = GENERATION_CONFIG_EOS[batch]
    ids, mask = ragged_prompts(batch, seed=batch + 40)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=16, **options)
    if "max_length" in options:
        kwargs.pop("max_new_tokens")
        kwargs["forced_eos_token_id"] = eos
    saved = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        reference = target.generate(ids, **kwargs)
        output = target.generate(ids, assistant_model=oracle_for(target, 4, reference, mask), **kwargs)
    finally:
        target.generation_config.eos_token_id = saved
    assert torch.equal(output, reference)


def test_sampled_rows_never_end_before_min_new_tokens_with_an_eos_list_on_the_generation_config(target):
    eos = GENERATION_CONFIG_EOS[3]
    ids, mask = ragged_prompts(3, seed=43)
    kwargs = dict(attention_mask=mask, max_new_tokens=14, min_new_tokens=10)
    saved = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        drafter = oracle_for(target, 4, target.generate(ids, do_sample=False, **kwargs), mask)
        for seed in range(8):
            torch.manual_seed(seed)
            new = target.generate(ids, assistant_model=drafter, do_sample=True, **kwargs)[:, ids.shape[1] :]
            ends = [next((i for i, token in enumerate(row) if token in eos), None) for row in new.tolist()]
            assert all(end is None or end >= 9 for end in ends), (seed, ends)
    finally:
        target.generation_config.eos_token_id = saved
