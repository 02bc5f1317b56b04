"""`prepare-data` prompt ids: unique per input file (two files sharing a stem are both generated, in one run or two),
resumable, and compatible with shards written with the earlier `<stem>:<line>` ids."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_helpers import write_jsonl
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark.training.data import load_conversations
from hf_dspark.training.regenerate import PrepareDataConfig, prepare_data, prompt_id


@pytest.fixture
def generator(byte_tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=len(byte_tokenizer), max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = byte_tokenizer.eos_token_id
    return model


def _run(tmp_path, inputs, generator, tokenizer, **overrides):
    config = PrepareDataConfig(inputs=[str(p) for p in inputs], output_dir=str(tmp_path / "out"), max_new_tokens=3,
                               batch_size=4, dtype="float32", temperature=0, **overrides)
    prepare_data(config, model=generator, tokenizer=tokenizer)
    return load_conversations([tmp_path / "out"])


def _two_chat_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_jsonl(tmp_path / "a" / "chat.jsonl", [{"turns": ["alpha"]}, {"turns": ["beta"]}])
    second = write_jsonl(tmp_path / "b" / "chat.jsonl", [{"turns": ["gamma"]}])
    return first, second


def test_same_stem_files_in_two_runs_are_both_generated(tmp_path, generator, byte_tokenizer):
    first, second = _two_chat_files(tmp_path)
    _run(tmp_path, [first], generator, byte_tokenizer)
    records = _run(tmp_path, [second], generator, byte_tokenizer)
    assert [r["turns"] for r in records] == [["alpha"], ["beta"], ["gamma"]]
    assert len({r["id"] for r in records}) == 3


def test_same_stem_files_in_one_run_get_distinct_ids_and_resume(tmp_path, generator, byte_tokenizer):
    first, second = _two_chat_files(tmp_path)
    records = _run(tmp_path, [first, second], generator, byte_tokenizer)
    assert [r["id"] for r in records] == [prompt_id("chat", 0, ["alpha"]), prompt_id("chat", 1, ["beta"]),
                                          prompt_id("chat", 0, ["gamma"])]
    assert "legacy_id" not in records[0]
    shards = sorted((tmp_path / "out").glob("shard-*.jsonl"))
    _run(tmp_path, [first, second], generator, byte_tokenizer)  # nothing left to do
    assert sorted((tmp_path / "out").glob("shard-*.jsonl")) == shards


def test_shards_with_the_earlier_stem_line_ids_are_still_resumed(tmp_path, generator, byte_tokenizer):
    first, second = _two_chat_files(tmp_path)
    (tmp_path / "out").mkdir()
    legacy = [{"id": "chat:0", "source": "chat", "turns": ["alpha"], "responses": ["x"], "truncated": [False]},
              {"id": "chat:1", "source": "chat", "turns": ["beta"], "responses": ["y"], "truncated": [False]}]
    write_jsonl(tmp_path / "out" / "shard-00000.jsonl", legacy)
    records = _run(tmp_path, [first, second], generator, byte_tokenizer)
    # a/chat.jsonl's lines are done (same stem, line and turns); b/chat.jsonl's line 0 is another prompt
    assert [r["id"] for r in records] == ["chat:0", "chat:1", prompt_id("chat", 0, ["gamma"])]


def test_explicit_ids_must_not_clash(tmp_path, generator, byte_tokenizer):
    clash = write_jsonl(tmp_path / "p.jsonl", [{"id": "q1", "turns": ["one"]}, {"id": "q1", "turns": ["two"]}])
    with pytest.raises(ValueError, match=r"p.jsonl line 2 reuses the id 'q1' of .*p.jsonl line 1"):
        _run(tmp_path, [clash], generator, byte_tokenizer)


def test_output_dir_may_not_hold_the_inputs(tmp_path, generator, byte_tokenizer):
    (tmp_path / "out").mkdir()
    prompts = write_jsonl(tmp_path / "out" / "prompts.jsonl", [{"turns": ["hi"]}])
    with pytest.raises(ValueError, match="holds the input"):
        _run(tmp_path, [tmp_path / "out"], generator, byte_tokenizer)
    with pytest.raises(ValueError, match="holds the input"):
        _run(tmp_path, [prompts], generator, byte_tokenizer)
    assert json.loads(prompts.read_text()) == {"turns": ["hi"]}


def test_a_missing_target_folder_is_named(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"turns": ["hi"]}])
    config = PrepareDataConfig(inputs=[str(prompts)], output_dir=str(tmp_path / "out"),
                               target=str(tmp_path / "models" / "no-such-target"), dtype="float32")
    with pytest.raises(FileNotFoundError, match=r"target folder .*no-such-target does not exist"):
        prepare_data(config)


@pytest.mark.parametrize("count", [0, -1])
def test_max_prompts_per_file_below_one_is_refused(count):
    with pytest.raises(ValueError, match=rf"max_prompts_per_file must be >= 1 \(omit it for all\), got {count}"):
        PrepareDataConfig(inputs=["p.jsonl"], output_dir="out", max_prompts_per_file=count)


def test_a_folder_holding_an_empty_prompt_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "prompts").mkdir()
    write_jsonl(tmp_path / "prompts" / "a.jsonl", [{"turns": ["hi"]}])
    empty = tmp_path / "prompts" / "b.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=rf"inputs: {empty} holds no prompts"):
        PrepareDataConfig(inputs=[str(tmp_path / "prompts")], output_dir=str(tmp_path / "out"))
