"""Greedy DSpark output is bit-identical to plain `generate` (fp32), across batch shapes and generate features."""

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from hf_dspark.generation import oracle_for
from tests.helpers import char_tokenizer, holed_oracle, make_drafter, make_target, ragged_prompts


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=11)


def _both(target, drafter_factory, ids, mask, **kwargs):
    reference = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    drafter = drafter_factory(reference)
    output = target.generate(ids, attention_mask=mask, do_sample=False, assistant_model=drafter, **kwargs)
    return reference, output, drafter


def _learned(target):
    return lambda reference: make_drafter(target)


def _oracle(target, mask, gamma=4):
    return lambda reference: oracle_for(target, gamma, reference, mask)


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter_kind", ["learned", "oracle"])
def test_greedy_matches_plain_generate(target, batch, drafter_kind):
    ids, mask = ragged_prompts(batch, seed=batch)
    factory = _learned(target) if drafter_kind == "learned" else _oracle(target, mask)
    reference, output, drafter = _both(target, factory, ids, mask, max_new_tokens=40)
    assert torch.equal(reference, output)
    stats = drafter.last_generation_stats
    assert stats.rounds > 0 and stats.draft_tokens_verified > 0
    if drafter_kind == "oracle":
        assert stats.mean_accepted_length >= 3.0


@pytest.mark.parametrize("new_tokens", [300, pytest.param(2048, marks=pytest.mark.slow)])
def test_long_generation_keeps_cache_bounded(new_tokens):
    """A row whose drafts are all rejected beside one that keeps them gets γ holes a round; compaction keeps the
    target cache near the sequence length."""
    target = make_target("llama", seed=11, eos_token_id=None, max_position_embeddings=4096)
    ids, mask = ragged_prompts(2, seed=3)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    reference, output, drafter = _both(target, lambda ref: holed_oracle(target, 4, ref, mask), ids, mask, **kwargs)
    assert torch.equal(reference, output)
    stats = drafter.last_generation_stats
    assert stats.compactions > 0 and stats.rounds > new_tokens // 2  # the odd row commits one token a round
    # Holes never exceed a quarter of the width (+ the minimum before compacting + one round of slots).
    assert stats.max_cache_width <= output.shape[1] / 0.75 + 16 + drafter.config.block_size + 1


def test_per_row_eos_stops_each_row_and_pads(target):
    ids, mask = ragged_prompts(4, seed=7)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    eos = int(free[0, ids.shape[1] + 6])  # a token row 0 emits mid-way: make it the EOS
    for drafter_kind in ("learned", "oracle"):
        factory = _learned(target) if drafter_kind == "learned" else _oracle(target, mask)
        reference, output, _ = _both(target, factory, ids, mask, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
        assert torch.equal(reference, output), drafter_kind
        generated = output[0, ids.shape[1] :].tolist()
        stop = generated.index(eos)
        assert all(t == 0 for t in generated[stop + 1 :]) and stop < 29


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 17])
def test_max_new_tokens_exact(target, max_new_tokens):
    ids, mask = ragged_prompts(3, seed=5)
    reference, output, _ = _both(target, _oracle(target, mask, gamma=6), ids, mask, max_new_tokens=max_new_tokens)
    assert torch.equal(reference, output)
    assert output.shape[1] == ids.shape[1] + max_new_tokens


def test_stop_strings_checked_per_token(target):
    tokenizer = char_tokenizer()
    ids, mask = ragged_prompts(1, seed=2)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    stop = tokenizer.decode(free[0, ids.shape[1] + 8 : ids.shape[1] + 10])
    kwargs = dict(max_new_tokens=30, stop_strings=[stop], tokenizer=tokenizer)
    reference, output, _ = _both(target, _oracle(target, mask, gamma=8), ids, mask, **kwargs)
    assert torch.equal(reference, output)
    assert output.shape[1] < free.shape[1]  # the oracle's 8-token accepts did not overshoot the stop string


@pytest.mark.parametrize("processors", [{"repetition_penalty": 1.5}, {"no_repeat_ngram_size": 2},
                                        {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "min_new_tokens": 5}])
@pytest.mark.parametrize("batch", [1, 4])
def test_stateful_processors(target, processors, batch):
    ids, mask = ragged_prompts(batch, seed=9)
    kwargs = dict(max_new_tokens=30, **processors)
    ref_oracle = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    for factory in (_learned(target), _oracle(target, mask)):
        reference, output, _ = _both(target, factory, ids, mask, **kwargs)
        assert torch.equal(reference, output) and torch.equal(reference, ref_oracle)


class _Collect(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_batch_one(target):
    ids, mask = ragged_prompts(1, seed=4)
    plain, spec = _Collect(), _Collect()
    reference = target.generate(ids, do_sample=False, max_new_tokens=25, streamer=plain)
    drafter = oracle_for(target, 4, reference, mask)
    target.generate(ids, do_sample=False, max_new_tokens=25, streamer=spec, assistant_model=drafter)
    flat = lambda chunks: [t for c in chunks for t in c]  # noqa: E731
    assert flat(plain.chunks) == flat(spec.chunks) and spec.ended
    assert len(spec.chunks) < len(plain.chunks)  # several tokens per put


def test_return_dict_with_scores(target):
    ids, mask = ragged_prompts(1, seed=6)
    kwargs = dict(max_new_tokens=12, return_dict_in_generate=True, output_scores=True, output_logits=True)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    drafter = oracle_for(target, 4, reference.sequences, mask)
    output = target.generate(ids, attention_mask=mask, do_sample=False, assistant_model=drafter, **kwargs)
    assert torch.equal(reference.sequences, output.sequences)
    assert len(output.scores) == len(reference.scores) == 12
    for ref_step, out_step in zip(reference.scores, output.scores):
        torch.testing.assert_close(ref_step, out_step, rtol=1e-4, atol=1e-4)
    for ref_step, out_step in zip(reference.logits, output.logits):
        torch.testing.assert_close(ref_step, out_step, rtol=1e-4, atol=1e-4)


def test_custom_generate_entry_point(target):
    from hf_dspark import dspark_generate

    ids, mask = ragged_prompts(3, seed=8)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    drafter = oracle_for(target, 4, reference, mask)
    output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                             custom_generate=dspark_generate, drafter=drafter)
    assert torch.equal(reference, output)


def test_qwen3_target():
    target = make_target("qwen3", seed=2)
    ids, mask = ragged_prompts(3, seed=1)
    reference, output, _ = _both(target, _learned(target), ids, mask, max_new_tokens=20)
    assert torch.equal(reference, output)


@pytest.mark.parametrize("drafter_kind", ["learned", "oracle"])
def test_candidate_generator_hosted_by_the_stock_batch1_loop(target, drafter_kind):
    """DSparkCandidateGenerator also runs inside transformers' own `_assisted_decoding` (batch 1)."""
    from transformers import GenerationConfig

    ids, mask = ragged_prompts(1, seed=12)
    config = GenerationConfig(max_new_tokens=30, do_sample=False, dspark_stock_loop=True, pad_token_id=0)
    reference = target.generate(ids, max_new_tokens=30, do_sample=False)
    drafter = make_drafter(target) if drafter_kind == "learned" else oracle_for(target, 4, reference, mask)
    output = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(reference, output)
    assert drafter.last_generation_stats is None  # the stock loop ran, not the DSpark loop
