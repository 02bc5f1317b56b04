"""transformers' own assisted-generation tests (`tests/generation/test_utils.py`, `GenerationTesterMixin`), ported
to DSpark drafters and prompt lookup on the tiny configs of every family DSpark supports
(`tests/generation/test_families.py`).

Upstream runs each test at batch 1 (its assisted loop takes one row); these also run a ragged left-padded batch of
3. The assertions are upstream's, re-expressed: `_check_similar_generate_outputs` becomes tokens exact (DSpark's
promise, stronger than upstream's "same tokens, or close scores at the first mismatch") with every step's scores and
logits within upstream's tolerance (atol = rtol = 1e-5); `_check_outputs` / `_check_scores` / `_check_logits` /
`_check_past_key_values_for_generate` become `check_outputs` below, which also asks the output to have plain
`generate`'s type, fields, layer types and shapes. Inputs DSpark documents as refused (docs/generation.md,
"Refused") are adapted where upstream uses them, each marked `# refused:`; the refusals themselves are tested in
`test_transformers_parity_refusals.py`. How close scores, logits and the returned cache are (not bit-identical)
is measured in `test_transformers_parity_rounding.py`.
"""

import pytest
import torch
from transformers.cache_utils import Cache, DynamicLayer, StaticCache
from transformers.generation import GenerateDecoderOnlyOutput

from hf_dspark.generation import oracle_for, prompt_lookup_for
from tests.generation.test_families import FAMILIES, make_family
from tests.helpers import holed_oracle, make_drafter, ragged_prompts

GAMMA = 4
# upstream's `_check_similar_generate_outputs` tolerance
ATOL = RTOL = 1e-5


def logits_processor_kwargs(do_sample: bool = False) -> dict:
    """Upstream's `_get_logits_processor_kwargs`."""
    kwargs = dict(bad_words_ids=[[1, 0]], repetition_penalty=1.2, remove_invalid_values=True)
    if do_sample:
        kwargs.update(top_k=10, top_p=0.7, temperature=0.7)
    return kwargs


def assisted_kwargs(do_sample: bool = False, max_new_tokens: int = 4) -> dict:
    """Upstream's `generation_kwargs` of the assisted tests: a) no EOS, c) at least two target forwards."""
    return dict(
        # refused: eos_token_id=-1 ("eos_token_id must be a token id (an int >= 0)", docs/generation.md "Refused");
        # None is the valid spelling of "no EOS"
        eos_token_id=None,
        max_new_tokens=max_new_tokens,
        num_beams=1,
        do_sample=do_sample,
        output_scores=True,
        output_logits=True,
        # refused: output_hidden_states / output_attentions ("not produced by the loop", docs/generation.md)
        return_dict_in_generate=True,
        use_cache=True,
        **logits_processor_kwargs(do_sample),
    )


# b) upstream sets `assistant_model.generation_config.num_assistant_tokens = 2` (schedule "constant") so that every
# round drafts two tokens. refused: num_assistant_tokens / num_assistant_tokens_schedule (docs/generation.md); the
# fix that refusal names is a fixed verification length, so every round verifies two drafts.
TWO_DRAFTS = dict(dspark_policy="fixed", dspark_verify_len=2)


def check_outputs(output, plain, target, batch: int, prompt_len: int) -> None:
    """Upstream's `_check_outputs(output, config, use_cache=True)` for a decoder-only target (scores, logits,
    cache; attentions and hidden states are refused), plus: plain `generate`'s output class (a DSpark output may
    subclass it to carry its statistics outside the fields), fields, cache layer types and shapes."""
    config = target.config
    assert isinstance(output, GenerateDecoderOnlyOutput) and type(plain) is GenerateDecoderOnlyOutput
    assert list(output.keys()) == list(plain.keys())
    assert output.sequences.shape == plain.sequences.shape
    gen_len = output.sequences.shape[-1] - prompt_len
    # _check_scores
    assert isinstance(output.scores, tuple) and len(output.scores) == gen_len
    assert [s.shape for s in output.scores] == [(batch, config.vocab_size)] * gen_len
    # _check_logits
    assert isinstance(output.logits, tuple) and len(output.logits) == gen_len
    assert [logits.shape[0] for logits in output.logits] == [batch] * gen_len
    assert [config.vocab_size - logits.shape[-1] for logits in output.logits] == [0] * gen_len
    # _check_past_key_values_for_generate: full-attention layers hold every position but the last
    assert isinstance(output.cache, Cache) and type(output.cache) is type(plain.cache)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    expected = (batch, config.num_key_value_heads, output.sequences.shape[-1] - 1, head_dim)
    assert len(output.cache.layers) == len(plain.cache.layers) == config.num_hidden_layers
    for ours, theirs in zip(output.cache.layers, plain.cache.layers):
        assert type(ours) is type(theirs)
        assert ours.keys.shape == theirs.keys.shape and ours.values.shape == theirs.values.shape
        if type(ours) is DynamicLayer:
            assert tuple(ours.keys.shape) == tuple(ours.values.shape) == expected


def check_similar_outputs(plain, assisted) -> None:
    """Upstream's `_check_similar_generate_outputs`, as DSpark promises it: tokens exact; every step's scores and
    logits within upstream's tolerance."""
    assert torch.equal(assisted.sequences, plain.sequences)
    for field in ("scores", "logits"):
        ours, theirs = getattr(assisted, field), getattr(plain, field)
        assert (ours is None) == (theirs is None), field
        for step_ours, step_theirs in zip(ours or (), theirs or ()):
            torch.testing.assert_close(step_ours, step_theirs, atol=ATOL, rtol=RTOL)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param, make_family(request.param)


def _prompts(batch: int):
    return ragged_prompts(batch, seed=batch, min_len=4, max_len=14)


@pytest.mark.parametrize(("assistant_type", "batch"), [("random", 1), ("same", 1), ("random", 3), ("same", 3),
                                                       ("mixed", 3)])
def test_assisted_decoding_matches_greedy_search(family, assistant_type, batch):
    """Port of `test_assisted_decoding_matches_greedy_search` ("random" / "same" assistant). "random" is an
    untrained DSpark drafter (drafts rejected), "same" drafts the target's own greedy tokens (all accepted), and
    "mixed", which upstream finds "hard to reproduce", accepts every draft in even rows and rejects the first in odd
    rows, in the same rounds (so it needs a batch)."""
    name, target = family
    ids, mask = _prompts(batch)
    kwargs = assisted_kwargs()
    plain = target.generate(ids, attention_mask=mask, **kwargs)
    drafter = {
        "random": lambda: make_drafter(target),
        "same": lambda: oracle_for(target, GAMMA, plain.sequences, mask),
        "mixed": lambda: holed_oracle(target, GAMMA, plain.sequences, mask),
    }[assistant_type]()
    assisted = target.generate(ids, attention_mask=mask, assistant_model=drafter, **TWO_DRAFTS, **kwargs)
    check_similar_outputs(plain, assisted)
    for output in (plain, assisted):
        check_outputs(output, plain, target, batch, ids.shape[1])
    if assistant_type == "same":  # b) and c): two rounds verified two drafts each and kept them
        assert drafter.last_generation_stats.mean_accepted_length > 1.0, name


@pytest.mark.parametrize("batch", [1, 3])
def test_prompt_lookup_decoding_matches_greedy_search(family, batch):
    """Port of `test_prompt_lookup_decoding_matches_greedy_search`."""
    _, target = family
    ids, mask = _prompts(batch)
    kwargs = assisted_kwargs()
    plain = target.generate(ids, attention_mask=mask, **kwargs)
    # refused: prompt_lookup_num_tokens=2 with a DSpark drafter (docs/generation.md); its fix is the DSpark loop's
    # own prompt lookup, proposing two tokens per round
    lookup = prompt_lookup_for(target, 2)
    assisted = target.generate(ids, attention_mask=mask, assistant_model=lookup, **kwargs)
    check_similar_outputs(plain, assisted)
    for output in (plain, assisted):
        check_outputs(output, plain, target, batch, ids.shape[1])


def test_prompt_lookup_decoding_accepts_repeated_text():
    """`test_prompt_lookup_decoding_matches_greedy_search` on a prompt lookup that drafts: the prompt is a prefix of
    the target's own greedy text, which repeats, so lookups match and are accepted."""
    target = make_family("llama")
    ids, mask = _prompts(1)
    long = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=None)
    prompt = long[:, :-12]
    kwargs = {**assisted_kwargs(max_new_tokens=12), "repetition_penalty": None, "bad_words_ids": None}
    plain = target.generate(prompt, **kwargs)
    lookup = prompt_lookup_for(target, GAMMA)
    assisted = target.generate(prompt, assistant_model=lookup, **kwargs)
    check_similar_outputs(plain, assisted)
    check_outputs(assisted, plain, target, 1, prompt.shape[1])
    assert lookup.last_generation_stats.mean_accepted_length > 1.0


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral", "gemma3"])
def test_assisted_decoding_sample(name, batch):
    """Port of `test_assisted_decoding_sample`: sampling with upstream's warpers and processors returns plain's
    output structure (upstream compares no values: a seeded assisted draw differs from a seeded plain one, for
    transformers and for DSpark; the distribution is tested in test_sampling_lossless.py). Added: every drawn
    token has a finite processed score, i.e. lies inside the top-k / top-p set it was drawn from."""
    target = make_family(name)
    ids, mask = _prompts(batch)
    kwargs = assisted_kwargs(do_sample=True)
    torch.manual_seed(0)
    plain = target.generate(ids, attention_mask=mask, **kwargs)
    torch.manual_seed(0)
    assisted = target.generate(ids, attention_mask=mask, assistant_model=make_drafter(target), **TWO_DRAFTS,
                               **kwargs)
    check_outputs(assisted, plain, target, batch, ids.shape[1])
    drawn = assisted.sequences[:, ids.shape[1] :]
    for step, scores in enumerate(assisted.scores):
        assert torch.isfinite(scores.gather(1, drawn[:, step, None])).all()


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma3"])
def test_assisted_decoding_with_logits_to_keep(name):
    """Port of `test_assisted_decoding_with_logits_to_keep`: `logits_to_keep=0` (all logits) and the default give
    the same assisted output."""
    target = make_family(name)
    ids, mask = _prompts(1)
    drafter = oracle_for(target, GAMMA, target.generate(ids, attention_mask=mask, max_new_tokens=10), mask)
    kwargs = dict(max_new_tokens=10, do_sample=False, assistant_model=drafter, return_dict_in_generate=True,
                  output_scores=True)
    with_all_logits = target.generate(ids, attention_mask=mask, logits_to_keep=0, **kwargs)
    without_all_logits = target.generate(ids, attention_mask=mask, **kwargs)
    check_similar_outputs(with_all_logits, without_all_logits)


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral", "gemma3"])
def test_generate_with_static_cache(name):
    """Port of `test_generate_with_static_cache`, assisted: with `cache_implementation="static"` the returned cache
    is a `StaticCache` of plain's shapes (full-attention layers: prompt + max_new_tokens - 1 slots), and the output is
    plain dynamic-cache `generate`'s. Upstream also runs float16: greedy identity is an fp32 property
    (docs/generation.md), so this runs float32 only."""
    target = make_family(name)
    ids, mask = _prompts(2)
    kwargs = dict(max_new_tokens=20, do_sample=False, return_dict_in_generate=True, output_scores=True,
                  use_cache=True)
    plain_static = target.generate(ids, attention_mask=mask, cache_implementation="static", **kwargs)
    assisted = target.generate(ids, attention_mask=mask, cache_implementation="static",
                               assistant_model=make_drafter(target), **kwargs)
    # Check 2: the outputs are those of the dynamic cache
    plain_dynamic = target.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(plain_static.sequences, plain_dynamic.sequences)
    check_similar_outputs(plain_dynamic, assisted)
    # Check 1: the cache shapes are plain's
    assert isinstance(plain_static.cache, StaticCache)
    assert isinstance(assisted.cache, StaticCache)
    config = target.config
    assert len(assisted.cache.layers) == len(plain_static.cache.layers) == config.num_hidden_layers
    for ours, theirs in zip(assisted.cache.layers, plain_static.cache.layers):
        assert type(ours) is type(theirs) and ours.keys.shape == theirs.keys.shape
    if name != "mistral":  # sliding layers hold a window; the others prompt + max_new_tokens - 1 slots
        full_shape = (2, config.num_key_value_heads, ids.shape[1] + 20 - 1, config.head_dim)  # the last token has none
        assert full_shape in [tuple(layer.keys.shape) for layer in assisted.cache.layers]


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_generate_continue_from_past_key_values(name):
    """Port of `test_generate_continue_from_past_key_values`, assisted in both calls: 4 tokens at once equal 3
    tokens, then 1 more from the returned cache, and the two final caches agree. Upstream compares two plain caches
    with `torch.allclose`'s default atol of 1e-8 (they are bit-identical); a DSpark call's returned cache is rebuilt
    by one forward over the sequences, equal to plain's within float rounding (docs/generation.md), so this
    compares at float32's default tolerance."""
    target = make_family(name)
    target.generation_config.forced_eos_token_id = None
    ids, mask = _prompts(2)
    kwargs = dict(do_sample=False, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=4, **kwargs)
    drafter = oracle_for(target, GAMMA, plain.sequences, mask)
    outputs = target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=drafter, **kwargs)
    cached = target.generate(ids, attention_mask=mask, max_new_tokens=3, assistant_model=drafter, **kwargs)
    grown = torch.nn.functional.pad(mask, (0, cached.sequences.shape[1] - mask.shape[1]), value=1)
    continued = target.generate(cached.sequences, attention_mask=grown, cache=cached.cache, max_new_tokens=1,
                                assistant_model=drafter, **kwargs)
    assert outputs.sequences.tolist() == continued.sequences.tolist() == plain.sequences.tolist()
    for ours, theirs in zip(outputs.cache.layers, continued.cache.layers):
        torch.testing.assert_close(ours.keys, theirs.keys)
        torch.testing.assert_close(ours.values, theirs.values)
