"""Fixtures of the eval tests: a char-level chat tokenizer and two tiny prompt sets (one multi-turn)."""

import json

import pytest

from tests.helpers import char_tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}|{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


@pytest.fixture
def chat_tokenizer():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture
def prompt_sets(tmp_path):
    """Paths of `gsm8k.jsonl` (3 single-turn items) and `mt-bench.jsonl` (2 two-turn items)."""
    single = tmp_path / "gsm8k.jsonl"
    single.write_text("\n".join(json.dumps({"turns": [t]}) for t in ["abc+def=?", "x*y*z", "hello!"]) + "\n")
    multi = tmp_path / "mt-bench.jsonl"
    multi.write_text("\n".join(json.dumps({"turns": list(t)}) for t in [("tell", "more"), ("why?", "again")]))
    return [str(single), str(multi)]
