"""Regression tests for generate-side inputs that used to give silent wrong results or unclear errors.

Where DSpark supports an input, its greedy fp32 output is compared with plain `generate` on the same call.
"""

import copy

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicCache
from transformers.generation.streamers import BaseStreamer

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.generation import oracle_for
from tests.helpers import make_drafter, make_target, ragged_prompts


@pytest.fixture(scope="module")
def pair():
    target = make_target("llama", seed=21)
    return target, make_drafter(target)


def _plain_and_dspark(target, drafter, ids, mask, **kwargs):
    reference = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    output = target.generate(ids, attention_mask=mask, do_sample=False, assistant_model=drafter, **kwargs)
    return reference, output


# ---------------------------------------------------------------- per-row processors (issue item 1)
class _Parity:
    """Row 0 may only emit even ids, row 1 only odd ids (3..95); records the batch ids it is called with."""

    def __init__(self):
        self.batch_ids = set()

    def __call__(self, batch_id, sent):
        self.batch_ids.add(batch_id)
        return list(range(4 if batch_id % 2 == 0 else 3, 96, 2))


def test_prefix_allowed_tokens_fn_gets_each_rows_batch_id(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(2, seed=5)
    parity = _Parity()
    reference, output = _plain_and_dspark(
        target, drafter, ids, mask, max_new_tokens=16, prefix_allowed_tokens_fn=parity
    )
    assert torch.equal(reference, output)
    generated = output[:, ids.shape[1] :]
    assert bool((generated[0] % 2 == 0).all()) and bool((generated[1] % 2 == 1).all())
    parity.batch_ids.clear()
    target.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        assistant_model=drafter,
        max_new_tokens=4,
        prefix_allowed_tokens_fn=parity,
    )
    assert parity.batch_ids == {0, 1}  # the user's own object is called, not a per-row copy


class _CountingProcessor(LogitsProcessor):
    """Keeps state across calls: plain generate calls it once per step, DSpark could not reproduce that."""

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        return scores


class _BanLastToken(LogitsProcessor):
    """Row-local and stateless (bans repeating the row's last token), declared so for DSpark."""

    dspark_row_local = True

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], -float("inf"))


def test_custom_stateful_processor_is_refused_before_generation(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(2, seed=5)
    counting = _CountingProcessor()
    with pytest.raises(ValueError, match=r"_CountingProcessor.*dspark_row_local"):
        target.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            max_new_tokens=4,
            logits_processor=LogitsProcessorList([counting]),
        )
    assert counting.calls == 0


def test_classifier_free_guidance_is_refused_naming_the_option(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(2, seed=5)
    with pytest.raises(ValueError, match="Generate adds it for `guidance_scale`: drop that option"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4, guidance_scale=1.5)


def test_declared_row_local_processor_matches_plain_generate(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(3, seed=6)
    processors = LogitsProcessorList([_BanLastToken()])
    reference, output = _plain_and_dspark(target, drafter, ids, mask, max_new_tokens=20, logits_processor=processors)
    assert torch.equal(reference, output)


# ---------------------------------------------------------------- prefix caches (item 2)
def _prefix_cache(target, ids, mask, cached):
    cache = DynamicCache(config=target.config)
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        target(
            ids[:, :cached],
            attention_mask=mask[:, :cached],
            position_ids=positions[:, :cached],
            cache=cache,
            use_cache=True,
        )
    return cache


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kwarg", ["cache", "past_key_values"])
def test_prefix_cache_feeds_only_uncached_tokens(pair, batch, kwarg):
    target, _ = pair
    ids, mask = ragged_prompts(batch, seed=8, min_len=9, max_len=14)
    cache = _prefix_cache(target, ids, mask, cached=ids.shape[1] - 4)
    kwargs = dict(max_new_tokens=24)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, **{kwarg: copy.deepcopy(cache)}, **kwargs)
    assert torch.equal(reference, target.generate(ids, attention_mask=mask, do_sample=False, **kwargs))
    for drafter in (make_drafter(target), oracle_for(target, 4, reference, mask)):
        output = target.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            assistant_model=drafter,
            **{kwarg: copy.deepcopy(cache)},
            **kwargs,
        )
        assert torch.equal(reference, output)


def test_prefix_cache_gives_the_drafter_the_prefix_features(pair):
    """The drafter's context covers the whole prompt, cached prefix included (oracle acceptance stays high)."""
    target, _ = pair
    ids, mask = ragged_prompts(1, seed=9, min_len=12, max_len=12)
    cache = _prefix_cache(target, ids, mask, cached=8)
    reference = target.generate(
        ids, attention_mask=mask, do_sample=False, cache=copy.deepcopy(cache), max_new_tokens=20
    )
    drafter = oracle_for(target, 4, reference, mask)
    target.generate(ids, attention_mask=mask, do_sample=False, cache=cache, assistant_model=drafter, max_new_tokens=20)
    assert drafter.last_generation_stats.mean_accepted_length >= 3.0


def test_cache_holding_the_whole_prompt_is_refused(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(1, seed=9, min_len=6, max_len=6)
    cache = _prefix_cache(target, ids, mask, cached=6)
    with pytest.raises(ValueError, match="at least one new token"):
        target.generate(ids, attention_mask=mask, cache=cache, assistant_model=drafter, max_new_tokens=4)


def test_inputs_embeds_without_input_ids_is_refused(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(2, seed=5)
    embeds = target.get_input_embeddings()(ids)
    with pytest.raises(ValueError, match="Pass the prompt as input_ids only"):
        target.generate(inputs_embeds=embeds, attention_mask=mask, assistant_model=drafter, max_new_tokens=4)


# ---------------------------------------------------------------- unbound drafter (item 8)
def test_unbound_drafter_on_a_plain_target_names_bind_target():
    target = make_target("llama", seed=5)  # never enabled: transformers' own assisted loop runs
    drafter = DSparkDrafter(DSparkConfig.from_target(target.config, block_size=3, target_layer_ids=[0]))
    ids, mask = ragged_prompts(1)
    with pytest.raises(AttributeError, match=r"bind_target\(target\).*from_pretrained\(path, target=target\)"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4)
    assert not hasattr(drafter, "generation_config")


# ---------------------------------------------------------------- dspark_* options (item 10)
def test_misspelt_dspark_option_is_rejected(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match=r"dspark_polcy.*did you mean 'dspark_policy'.*dspark_verify_len"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4, dspark_polcy="lagged")
    config = GenerationConfig(max_new_tokens=4, dspark_verfy_len=2)
    with pytest.raises(ValueError, match="dspark_verfy_len"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, generation_config=config)


@pytest.mark.parametrize("threshold", ["high", 5, -0.1, True])
def test_bad_threshold_is_rejected_with_the_range(pair, threshold):
    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match=r"dspark_threshold must be a number in \[0, 1\]"):
        target.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            max_new_tokens=4,
            dspark_policy="threshold",
            dspark_threshold=threshold,
        )


@pytest.mark.parametrize(
    ("curve", "message"), [("missing.json", "no such file 'missing.json'"), (5, "must be a StepCurve or the path")]
)
def test_bad_step_curve_is_rejected_up_front(pair, curve, message):
    target, drafter = pair
    ids, mask = ragged_prompts(1)
    with pytest.raises(ValueError, match=message):
        target.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            max_new_tokens=4,
            dspark_policy="greedy",
            dspark_step_curve=curve,
        )


def test_valid_options_still_pass(pair):
    target, drafter = pair
    ids, mask = ragged_prompts(2, seed=2)
    reference, output = _plain_and_dspark(target, drafter, ids, mask, max_new_tokens=8, dspark_verify_len=2)
    assert torch.equal(reference, output)


# ---------------------------------------------------------------- right padding and streamers (item 12)
def test_right_padding_is_refused_with_the_fix(pair):
    target, drafter = pair
    ids, left = ragged_prompts(2, seed=3)
    right = left.flip(1)
    with pytest.raises(ValueError, match=r"right padding.*padding_side = \"left\""):
        target.generate(ids.flip(1), attention_mask=right, assistant_model=drafter, max_new_tokens=4)


class _Record(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("drafter_kind", ["learned", "oracle"])
def test_batched_streamer_sees_every_row_like_plain_generate(pair, drafter_kind):
    target, drafter = pair
    ids, mask = ragged_prompts(3, seed=4)
    plain, spec = _Record(), _Record()
    kwargs = dict(max_new_tokens=18, eos_token_id=[2, 7, 11])  # rows finish at different steps
    reference = target.generate(ids, attention_mask=mask, do_sample=False, streamer=plain, **kwargs)
    if drafter_kind == "oracle":
        drafter = oracle_for(target, 4, reference, mask)
    output = target.generate(
        ids, attention_mask=mask, do_sample=False, streamer=spec, assistant_model=drafter, **kwargs
    )
    assert torch.equal(reference, output)
    assert spec.puts == plain.puts and spec.ended


# ---------------------------------------------------------------- output dtype
@pytest.mark.parametrize("return_dict", [False, True])
def test_int32_prompt_returns_plain_generates_int64_sequences(pair, return_dict):
    target, drafter = pair
    ids, mask = ragged_prompts(2, seed=5)
    ids, mask = ids.int(), mask.int()
    kwargs = dict(max_new_tokens=8, return_dict_in_generate=return_dict)
    reference, output = _plain_and_dspark(target, drafter, ids, mask, **kwargs)
    if return_dict:
        reference, output = reference.sequences, output.sequences
    assert reference.dtype == torch.int64
    assert output.dtype == reference.dtype
    assert torch.equal(reference, output)
