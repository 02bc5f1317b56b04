"""Training data: regenerated conversations on disk, chat-template tokenisation with a loss mask, a torch Dataset.

Storage format: plain JSON Lines, one conversation per line::

    {"id": "gsm8k_train:17:5d41402abc4b", "source": "gsm8k_train", "turns": [user_1, ...],
     "responses": [reply_1, ...], "truncated": [false, ...]}

(`prepare-data` ids are `<file stem>:<line>:<digest of the turns>`; shards written before carry `<stem>:<line>`.)

`truncated[i]` is true when reply i was cut at the max-new-tokens limit (it then has no end-of-turn label). The
older `data/train_regenerated/*.jsonl` files (`source`, `turns`, `responses`, no `id`/`truncated`) load as-is; for
them truncation is inferred from the reply length. Lines may instead carry pre-tokenised `input_ids` and
`loss_mask` (used by tests and by callers that tokenise themselves).

Why plain JSONL rather than `datasets`: it needs no extra dependency, a shard is human-readable and diffable (the
generated text is small enough to commit with the repository), appending one finished shard at a time with
`os.replace` makes regeneration resumable and crash-safe, and reading 10⁴-10⁵ lines is instant. Any JSONL shard
folder also opens with `datasets.load_dataset("json", data_files=...)` for users who want Arrow tooling.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

logger = logging.get_logger(__name__)

# Replies whose re-tokenised length is within this many tokens of the generation limit are treated as truncated
# when the record does not say (retokenising decoded text rarely reproduces the generated count exactly).
TRUNCATION_MARGIN = 8


def expand_jsonl_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, folders expanded to their `*.jsonl` files (sorted). Raises if nothing is found."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(path.glob("*.jsonl")))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path} does not exist; pass JSONL files or folders of *.jsonl shards.")
    if not files:
        raise FileNotFoundError(f"no *.jsonl files in {[str(p) for p in paths]}.")
    return files


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield one dict per non-empty line, naming the file and line on malformed JSON."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not valid JSON ({err}).") from err


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write records to `path` through a temporary file and `os.replace`, so a reader never sees half a shard."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_conversations(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Load regenerated conversations (prepare-data shards or `data/train_regenerated/*.jsonl`).

    Every record gets an `id` (`<file stem>:<line index>` when absent). Records need `turns` and `responses` of
    equal length, or pre-tokenised `input_ids` + `loss_mask`.
    """
    records = []
    for path in expand_jsonl_paths(paths):
        for index, record in enumerate(iter_jsonl(path)):
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path} record {index} is a JSON {type(record).__name__}, not an object; each line must hold "
                    'one conversation object ({"turns": [...], "responses": [...]}).'
                )
            record.setdefault("id", f"{path.stem}:{index}")
            if "input_ids" in record:
                if len(record.get("loss_mask", ())) != len(record["input_ids"]):
                    raise ValueError(f"{path} record {index}: loss_mask must match input_ids in length.")
            elif len(record.get("turns", ())) != len(record.get("responses", ())) or not record.get("turns"):
                raise ValueError(
                    f"{path} record {index} needs non-empty 'turns' and 'responses' of equal length; run "
                    "`hf-dspark prepare-data` on prompt files first."
                )
            records.append(record)
    return records


def split_validation(
    records: list[dict[str, Any]], fraction: float, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Deterministic (train, validation) split; `fraction` of the records (at least one if > 0) go to validation."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}.")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    count = 0 if fraction == 0 else max(1, round(fraction * len(records)))
    val_ids = set(order[:count])
    train = [r for i, r in enumerate(records) if i not in val_ids]
    return train, [r for i, r in enumerate(records) if i in val_ids]


def _messages(turns: list[str], responses: list[str], system_prompt: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for user, reply in zip(turns, responses):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return messages


def _reply_spans(tokenizer, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """Full chat text and the character span of every assistant reply in it."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = tokenizer.apply_chat_template(messages[:index], tokenize=False, add_generation_prompt=True)
        start = len(prefix)
        if not full.startswith(prefix) or full[start : start + len(message["content"])] != message["content"]:
            raise ValueError(
                "the chat template does not render assistant replies verbatim after the generation prompt; "
                "tokenise this target's data yourself and pass `input_ids`/`loss_mask` records."
            )
        spans.append((start, start + len(message["content"])))
    return full, spans


def tokenize_conversation(
    tokenizer,
    turns: list[str],
    responses: list[str],
    truncated: list[bool] | None = None,
    max_length: int | None = None,
    system_prompt: str | None = None,
) -> dict[str, list[int]]:
    """Chat-template tokenisation with the DSpark loss region (docs/method.md, section 6).

    Returns `input_ids` and `loss_mask` (1 on every assistant token plus the end-of-turn token that follows a
    complete reply, e.g. `<|im_end|>` for ChatML; a truncated reply gets no end-of-turn label). Needs a fast
    tokenizer (character offsets). `max_length` cuts from the right.
    """
    truncated = list(truncated) if truncated is not None else [False] * len(responses)
    full, spans = _reply_spans(tokenizer, _messages(turns, responses, system_prompt))
    encoding = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    loss_mask = [0] * len(ids)
    cursor = 0
    for (start, end), cut in zip(spans, truncated):
        while cursor < len(ids) and offsets[cursor][1] <= start:
            cursor += 1
        while cursor < len(ids) and offsets[cursor][0] < end:
            loss_mask[cursor] = 1
            cursor += 1
        if not cut and cursor < len(ids):
            loss_mask[cursor] = 1  # the end-of-turn token
            cursor += 1
    if max_length is not None:
        ids, loss_mask = ids[:max_length], loss_mask[:max_length]
    return {"input_ids": list(ids), "loss_mask": loss_mask}


def infer_truncation(tokenizer, responses: list[str], max_new_tokens: int | None) -> list[bool]:
    """For records without a `truncated` field: a reply that re-tokenises to ≥ limit − margin tokens was cut."""
    if max_new_tokens is None:
        return [False] * len(responses)
    lengths = [len(tokenizer(reply, add_special_tokens=False)["input_ids"]) for reply in responses]
    return [n >= max_new_tokens - TRUNCATION_MARGIN for n in lengths]


class DSparkDataset(torch.utils.data.Dataset):
    """Tokenised conversations: items are `{"input_ids", "loss_mask", "sample_index"}` (lists of ints)."""

    def __init__(self, examples: list[dict[str, Any]]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.examples[index]

    def num_loss_tokens(self) -> int:
        return sum(sum(example["loss_mask"]) for example in self.examples)


def build_dataset(
    records: list[dict[str, Any]],
    tokenizer=None,
    max_length: int | None = 1024,
    max_new_tokens: int | None = 256,
    system_prompt: str | None = None,
    min_loss_tokens: int = 2,
) -> DSparkDataset:
    """Tokenise records into a `DSparkDataset`, dropping examples with fewer than `min_loss_tokens` loss tokens.

    `max_new_tokens` is the generation limit used to infer truncation for records without `truncated`.
    `sample_index` is the position in `records` (the key of an offline feature cache).
    """
    examples = []
    for index, record in enumerate(tqdm(records, desc="tokenising", disable=len(records) < 500)):
        if "input_ids" in record:
            item = {"input_ids": list(record["input_ids"]), "loss_mask": list(record["loss_mask"])}
            if max_length is not None:
                item = {key: value[:max_length] for key, value in item.items()}
        else:
            if tokenizer is None:
                raise ValueError("these records hold text; pass the target's tokenizer to build_dataset.")
            truncated = record.get("truncated")
            if truncated is None:
                truncated = infer_truncation(tokenizer, record["responses"], max_new_tokens)
            item = tokenize_conversation(
                tokenizer, record["turns"], record["responses"], truncated, max_length, system_prompt
            )
        if sum(item["loss_mask"][1:]) >= min_loss_tokens:
            examples.append({**item, "sample_index": index})
    dropped = len(records) - len(examples)
    if dropped:
        logger.info(f"dropped {dropped} of {len(records)} examples with fewer than {min_loss_tokens} loss tokens")
    return DSparkDataset(examples)
