"""stop_strings at batch > 1 without an EOS id: a stopped row is padded (plain generate keeps decoding it)."""

import torch

from tests.helpers import char_tokenizer, make_drafter, make_target, ragged_prompts


def test_rows_stopped_by_a_stop_string_are_padded_without_eos():
    target = make_target("llama", seed=3)
    tokenizer = char_tokenizer()
    ids, mask = ragged_prompts(2, seed=2)
    start = ids.shape[1]
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    stop = tokenizer.decode(free[0, start + 6 : start + 8])
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=30, stop_strings=[stop], tokenizer=tokenizer,
                  eos_token_id=None, pad_token_id=0)
    plain = target.generate(ids, **kwargs)
    dspark = target.generate(ids, assistant_model=make_drafter(target), **kwargs)
    text = tokenizer.decode(free[0, start:])
    assert stop in text
    for row in range(2):
        generated = dspark[row, start:]
        # the row's tokens up to and including the one completing the stop string are plain generate's
        decoded = [tokenizer.decode(free[row, start : start + n + 1]) for n in range(free.shape[1] - start)]
        ends = [n for n, piece in enumerate(decoded) if stop in piece]
        end = ends[0] + 1 if ends else generated.shape[0]
        assert torch.equal(generated[:end], free[row, start : start + end])
        assert torch.equal(generated[:end], plain[row, start : start + end])
        assert (generated[end:] == 0).all()  # padded after its stop
        if row == 0:  # stopped first: plain generate has no pad step without an EOS id and keeps decoding it
            assert end < generated.shape[0] and (plain[row, start + end :] != 0).any()

