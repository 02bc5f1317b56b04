"""The target-family matrix: greedy DSpark is bit-identical to plain `generate` (fp32) for every supported family,
full-attention and sliding-window / hybrid alike; families DSpark cannot verify are refused before generation.

Sliding-window configs use a window of 8 with prompts of 4-14 tokens and 30 new tokens, so both prompts shorter
and longer than the window occur and every row generates past it.
"""

import copy

import pytest
import torch
import transformers
from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

from hf_dspark.generation import oracle_for
from hf_dspark.target.ragged_cache import attention_layout
from tests.helpers import holed_oracle, make_drafter, ragged_prompts

WINDOW = 8
HYBRID = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
BASE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=96, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {}),
    # sliding window on every layer
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    # hybrid: sliding and full layers (Gemma 2 runs eager attention, the others sdpa)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=WINDOW)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=WINDOW, layer_types=HYBRID)),
    "phi3_sliding": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW)),  # Phi-3-mini-4k style
    "qwen2_sliding": ("Qwen2Config", "Qwen2ForCausalLM",
                      dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(  # its default YaRN RoPE, attention sinks
        head_dim=16, sliding_window=WINDOW, layer_types=HYBRID, num_local_experts=4, num_experts_per_tok=2,
    )),
}
SLIDING = ["mistral", "gemma2", "gemma3", "phi3_sliding", "qwen2_sliding", "gpt_oss"]


def make_family(name: str, seed: int = 0, **overrides):
    config_name, model_name, fields = FAMILIES[name]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**{**BASE, **fields, **overrides})
    return getattr(transformers, model_name)(config).eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param, make_family(request.param)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("drafter_kind", ["learned", "oracle"])
def test_family_greedy_matches_plain_generate(family, batch, drafter_kind):
    name, target = family
    ids, mask = ragged_prompts(batch, seed=batch, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30)
    reference = target.generate(ids, **kwargs)
    drafter = make_drafter(target) if drafter_kind == "learned" else oracle_for(target, 4, reference, mask)
    assert torch.equal(reference, target.generate(ids, assistant_model=drafter, **kwargs)), name
    if drafter_kind == "oracle":
        assert drafter.last_generation_stats.mean_accepted_length >= 3.0


@pytest.mark.parametrize("name", SLIDING)
def test_the_window_shapes_the_reference(name):
    """Guard: with these lengths the window changes plain generate's output, so the matrix tests it."""
    ids, mask = ragged_prompts(3, seed=3, min_len=4, max_len=14)
    windowed = make_family(name).generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    wide = make_family(name, sliding_window=512).generate(ids, attention_mask=mask, do_sample=False,
                                                          max_new_tokens=30)
    assert not torch.equal(windowed, wide)


@pytest.mark.parametrize(("name", "implementation"), [("mistral", "eager"), ("gemma3", "sdpa"), ("gemma3", "eager")])
def test_sliding_long_generation_with_compaction(name, implementation):
    """Rejected drafts beside kept ones leave holes every round: compaction moves slots, positions and windows
    must follow."""
    target = make_family(name, attn_implementation=implementation)
    assert target.config._attn_implementation == implementation
    ids, mask = ragged_prompts(3, seed=5, min_len=4, max_len=14)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=120, min_new_tokens=120)
    reference = target.generate(ids, **kwargs)
    drafter = holed_oracle(target, 4, reference, mask)
    assert torch.equal(reference, target.generate(ids, assistant_model=drafter, **kwargs))
    assert drafter.last_generation_stats.compactions > 0


@pytest.mark.parametrize("batch", [1, 2])
def test_sliding_prefix_cache_longer_than_the_window(batch):
    """A cached prefix in transformers' own sliding cache (old entries dropped) is rebuilt for the ragged cache."""
    target = make_family("mistral")
    ids, mask = ragged_prompts(batch, seed=6, min_len=18, max_len=20)
    cached = ids.shape[1] - 3
    cache = DynamicCache(config=target.config)
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        target(ids[:, :cached], attention_mask=mask[:, :cached], position_ids=positions[:, :cached], cache=cache)
    assert isinstance(cache.layers[0], DynamicSlidingWindowLayer) and cache.layers[0].keys.shape[2] < cached
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=20)
    reference = target.generate(ids, cache=copy.deepcopy(cache), **kwargs)
    assert torch.equal(reference, target.generate(ids, **kwargs))
    output = target.generate(ids, cache=copy.deepcopy(cache), assistant_model=make_drafter(target), **kwargs)
    assert torch.equal(reference, output)


@pytest.mark.parametrize(("config_name", "model_name", "fields", "reason"), [
    ("Lfm2Config", "Lfm2ForCausalLM", dict(layer_types=["conv", "conv", "full_attention", "conv", "full_attention"]),
     "'conv' layers.*cannot hide rejected tokens"),
    ("Llama4TextConfig", "Llama4ForCausalLM", dict(head_dim=16, attention_chunk_size=8),
     "'chunked_attention' layers.*do not implement"),
])
def test_families_that_cannot_be_verified_are_refused_before_generation(config_name, model_name, fields, reason):
    torch.manual_seed(0)
    target = getattr(transformers, model_name)(getattr(transformers, config_name)(**{**BASE, **fields})).eval()
    drafter = make_drafter(target)
    ids, mask = ragged_prompts(2)
    calls = []
    target.register_forward_hook(lambda *args: calls.append(1))
    with pytest.raises(ValueError, match=reason):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4)
    assert not calls  # no forward ran


def test_sliding_target_without_4d_masks_is_refused():
    target = make_family("mistral")
    target.config._attn_implementation = "flash_attention_2"  # only the name is read; nothing is loaded
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        attention_layout(target)
    assert attention_layout(make_family("llama")).needs_masks is False


def test_step_curve_profiling_on_a_sliding_target():
    """Load-aware policies profile SPS(B) on the loop's cache layout; a cache longer than the window used to
    fail in transformers' sliding-layer crop."""
    from hf_dspark.profiling.target_steps import profile_step_curve

    curve = profile_step_curve(make_family("mistral"), batch_tokens=[1, 4], rows=2, cache_length=3 * WINDOW,
                               repeats=1, warmup=0, progress=False)
    assert curve.batch_tokens == [1, 4] and all(sps > 0 for sps in curve.steps_per_second)


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_engine_serves_sliding_targets_like_plain_generate(name):
    """`DSparkEngine` admits requests through the same prefill, so sliding targets work there too."""
    from hf_dspark.scheduling.verification_policy import VerificationPolicy
    from hf_dspark.serving.engine import DSparkEngine

    target = make_family(name, eos_token_id=None)
    ids, mask = ragged_prompts(3, seed=7, min_len=4, max_len=14)
    prompts = [ids[r][mask[r].bool()] for r in range(len(ids))]
    references = [target.generate(p[None], do_sample=False, max_new_tokens=24, min_new_tokens=24)[0]
                  for p in prompts]
    engine = DSparkEngine(target, make_drafter(target), policy=VerificationPolicy("fixed", block_size=4))
    rids = [engine.add_request(p, max_new_tokens=24) for p in prompts[:2]]
    engine.step()
    rids.append(engine.add_request(prompts[2], max_new_tokens=24))  # joins a running batch
    while engine.has_work():
        engine.step()
    for rid, prompt, reference in zip(rids, prompts, references):
        assert engine.result(rid).generated == reference[prompt.numel() :].tolist()


def test_drafter_rope_matches_a_yarn_target():
    """The drafter copies the target's RoPE; YaRN (gpt-oss's default) used to fail building the tables."""
    target = make_family("gpt_oss")
    assert target.config.rope_parameters["rope_type"] == "yarn"
    positions = torch.arange(40)[None]
    cos_drafter, sin_drafter = make_drafter(target).rotary(positions, torch.float32)
    cos_target, sin_target = target.model.rotary_emb(torch.zeros(1, 40, 64), positions)  # half width (gpt-oss)
    torch.testing.assert_close(cos_drafter, torch.cat([cos_target, cos_target], dim=-1))
    torch.testing.assert_close(sin_drafter, torch.cat([sin_target, sin_target], dim=-1))


@pytest.mark.parametrize("rope", [
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 128},  # Llama 3.x
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
])
def test_drafter_rope_matches_scaled_rope_targets(rope):
    target = make_family("llama", rope_parameters=rope)
    positions = torch.arange(40)[None]
    cos_drafter, sin_drafter = make_drafter(target).rotary(positions, torch.float32)
    cos_target, sin_target = target.model.rotary_emb(torch.zeros(1, 40, 64), positions)
    torch.testing.assert_close(cos_drafter, cos_target)
    torch.testing.assert_close(sin_drafter, sin_target)
