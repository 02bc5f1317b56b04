"""The engine tests' shared setup: a tiny Llama target, six ragged prompts and plain greedy's continuations."""

from tests.helpers import make_target, ragged_prompts


def engine_requests_and_references(new_tokens: int):
    """(target, prompts without padding, plain greedy's `new_tokens` continuation of each)."""
    target = make_target("llama", seed=11, eos_token_id=None)
    ids, mask = ragged_prompts(6, seed=3)
    prompts = [ids[r][mask[r].bool()] for r in range(len(ids))]
    references = [
        target.generate(p[None], do_sample=False, max_new_tokens=new_tokens)[0, p.numel() :].tolist()
        for p in prompts
    ]
    return target, prompts, references
