"""Tests for data loading, chat tokenisation with the loss mask, and prepare-data regeneration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_helpers import write_jsonl
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark.training.data import (
    build_dataset,
    infer_truncation,
    load_conversations,
    split_validation,
    tokenize_conversation,
)
from hf_dspark.training.regenerate import PrepareDataConfig, prepare_data

REPO = Path(__file__).resolve().parents[2]


def _loss_text(tokenizer, encoded):
    return tokenizer.decode([t for t, m in zip(encoded["input_ids"], encoded["loss_mask"]) if m])


def test_loss_mask_covers_replies_and_end_of_turn(byte_tokenizer):
    encoded = tokenize_conversation(byte_tokenizer, ["hi", "more"], ["Hello", "ok é"], [False, False])
    assert _loss_text(byte_tokenizer, encoded) == "Hello<|im_end|>ok é<|im_end|>"
    # the user turns and the template scaffolding carry no loss
    assert encoded["loss_mask"][0] == 0 and len(encoded["loss_mask"]) == len(encoded["input_ids"])


def test_truncated_reply_has_no_end_of_turn_label(byte_tokenizer):
    encoded = tokenize_conversation(byte_tokenizer, ["q"], ["cut mid"], [True])
    assert _loss_text(byte_tokenizer, encoded) == "cut mid"


def test_max_length_cuts_from_the_right(byte_tokenizer):
    encoded = tokenize_conversation(byte_tokenizer, ["q"], ["abcdef"], max_length=10)
    assert len(encoded["input_ids"]) == 10 == len(encoded["loss_mask"])


def test_infer_truncation_by_length(byte_tokenizer):
    assert infer_truncation(byte_tokenizer, ["a" * 30, "b" * 5], max_new_tokens=32) == [True, False]
    assert infer_truncation(byte_tokenizer, ["a" * 30], max_new_tokens=None) == [False]


def test_loads_existing_regenerated_format(tmp_path, byte_tokenizer):
    source = REPO / "data" / "train_regenerated" / "smollm2_135m_instruct.jsonl"
    if not source.is_file():
        pytest.skip("data/train_regenerated is not present")
    lines = source.read_text().splitlines()[:3]
    (tmp_path / "regen.jsonl").write_text("\n".join(lines) + "\n")
    records = load_conversations([tmp_path])
    assert [r["id"] for r in records] == ["regen:0", "regen:1", "regen:2"]
    dataset = build_dataset(records, byte_tokenizer, max_length=4096, max_new_tokens=256)
    assert len(dataset) == 3
    example = dataset[0]
    assert sum(example["loss_mask"]) > 0 and example["sample_index"] == 0


def test_pretokenized_records_and_validation_split(tmp_path):
    write_jsonl(tmp_path / "tok.jsonl", [{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]}] * 10)
    records = load_conversations([tmp_path / "tok.jsonl"])
    train, val = split_validation(records, 0.2, seed=0)
    assert len(train) == 8 and len(val) == 2
    assert split_validation(records, 0.2, seed=0)[1] == val
    assert len(build_dataset(records)) == 10
    with pytest.raises(ValueError, match="loss_mask"):
        write_jsonl(tmp_path / "bad.jsonl", [{"input_ids": [1, 2], "loss_mask": [1]}])
        load_conversations([tmp_path / "bad.jsonl"])


def _tiny_generator(tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=len(tokenizer), max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def test_prepare_data_regenerates_all_turns_and_resumes(tmp_path, byte_tokenizer):
    prompts = tmp_path / "prompts.jsonl"
    write_jsonl(prompts, [{"turns": ["hello"]}, {"turns": ["a", "b"]}, {"turns": ["xyz"]}])
    model = _tiny_generator(byte_tokenizer)
    config = PrepareDataConfig(inputs=[str(prompts)], output_dir=str(tmp_path / "out"), max_new_tokens=4,
                               batch_size=2, shard_size=2, dtype="float32")
    out = prepare_data(config, model=model, tokenizer=byte_tokenizer)
    shards = sorted(out.glob("shard-*.jsonl"))
    assert [p.name for p in shards] == ["shard-00000.jsonl", "shard-00001.jsonl"]
    records = [json.loads(line) for p in shards for line in p.read_text().splitlines()]
    assert [r["id"].rsplit(":", 1)[0] for r in records] == ["prompts:0", "prompts:1", "prompts:2"]
    two_turns = records[1]
    assert len(two_turns["responses"]) == 2 == len(two_turns["truncated"])
    assert not list(out.glob(".*tmp*"))
    # rerun: nothing new; more prompts: only the new ones, in a new shard
    prepare_data(config, model=model, tokenizer=byte_tokenizer)
    assert len(list(out.glob("shard-*.jsonl"))) == 2
    write_jsonl(prompts, [{"turns": ["hello"]}, {"turns": ["a", "b"]}, {"turns": ["xyz"]}, {"turns": ["new"]}])
    prepare_data(config, model=model, tokenizer=byte_tokenizer)
    newest = json.loads((out / "shard-00002.jsonl").read_text())
    assert newest["id"].startswith("prompts:3:")
    dataset = build_dataset(load_conversations([out]), byte_tokenizer, max_new_tokens=4, min_loss_tokens=0)
    assert len(dataset) == 4


def test_prepare_data_config_validation(tmp_path):
    with pytest.raises(ValueError, match="inputs"):
        PrepareDataConfig(inputs=[], output_dir="x")
    with pytest.raises(ValueError, match="top_p"):
        PrepareDataConfig(inputs=["a"], output_dir="x", top_p=0)
    with pytest.raises(ValueError, match=r"inputs: .*missing\.jsonl does not exist"):  # before any model loads
        PrepareDataConfig(inputs=[str(tmp_path / "missing.jsonl")], output_dir="x")


def test_prepare_data_command_line(tmp_path, byte_tokenizer):
    from hf_dspark.cli.training import run_prepare_data as main

    target_dir = tmp_path / "target"
    _tiny_generator(byte_tokenizer).save_pretrained(target_dir)
    byte_tokenizer.save_pretrained(target_dir)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"turns": ["hi"]}, {"turns": ["yo"]}])
    argv = ["--inputs", str(prompts), "--output_dir", str(tmp_path / "out"), "--target", str(target_dir),
            "--dtype", "float32", "--max_new_tokens", "3", "--temperature", "0",
            "--extra_generate_kwargs", '{"repetition_penalty": 1.1}']
    assert main(argv) == 0
    records = load_conversations([tmp_path / "out"])
    assert [r["id"][:4] for r in records] == ["p:0:", "p:1:"] and all(len(r["responses"]) == 1 for r in records)
