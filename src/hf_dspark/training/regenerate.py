"""`hf-dspark prepare-data`: regenerate every assistant turn of prompt JSONL files with the target itself.

Input lines are `{"turns": [user_1, user_2, ...]}` (the `data/train` format). Turn i is answered by the target with
its chat template after the *regenerated* replies to turns < i. Output is a folder of JSONL shards (see
`training.data` for the format and why plain JSONL); each shard is written whole with `os.replace`, and a rerun
skips every prompt id already present, so an interrupted run resumes where the last finished shard ended.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from .data import expand_jsonl_paths, iter_jsonl, write_jsonl_atomic

logger = logging.get_logger(__name__)

SHARD_PATTERN = re.compile(r"shard-(\d+)\.jsonl$")


def parse_generate_kwargs(extra: str | dict | None) -> dict[str, Any]:
    """`extra_generate_kwargs` as a dict; a string must be a JSON object (the error names the option and problem)."""
    if not isinstance(extra, str):
        return dict(extra or {})
    try:
        parsed = json.loads(extra)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"extra_generate_kwargs is not valid JSON ({error.msg} at column {error.colno}): {extra!r}; "
            """pass a JSON object, e.g. '{"repetition_penalty": 1.1}'."""
        ) from None
    if not isinstance(parsed, dict):
        raise ValueError(f"extra_generate_kwargs must be a JSON object, got a {type(parsed).__name__}: {extra!r}.")
    return parsed


@dataclass
class PrepareDataConfig:
    """Settings of `prepare_data`.

    Args:
        inputs: prompt JSONL files or folders of them (`{"turns": [...]}` per line).
        output_dir: folder receiving `shard-NNNNN.jsonl` files (created if missing).
        target: model path or Hub id; `None` uses the embedded default target (SmolLM2-135M-Instruct GGUF).
        gguf_file: GGUF file name inside `target`, when the target is a GGUF folder.
        dtype: target dtype, `"bfloat16"`, `"float16"`, `"float32"` or `"auto"` (bf16 where the CPU computes it
            natively, else fp32: without native bf16 a bf16 target runs several times slower).
        temperature, top_p, top_k: sampling settings (default: SmolLM2's recommended T=0.7, top-p 0.9);
            `temperature=0` decodes greedily.
        max_new_tokens: reply length limit (a reply that hits it is marked `truncated`).
        max_prompt_tokens: user turns longer than this are cut to this many tokens before templating.
        system_prompt: optional system message (`None`: the chat template's own default).
        batch_size: prompts generated together (left padding).
        shard_size: conversations per output shard (work lost on interruption is at most one shard).
        max_prompts_per_file: take only the first n prompts of each input file (`None`: all).
        seed: base seed; batch b of a shard s is sampled with seed + 1_000_003·s + b.
        num_threads: torch CPU threads (`None`: leave torch's default).
        extra_generate_kwargs: more `generate` arguments as a JSON object string, e.g.
            `'{"repetition_penalty": 1.1}'` (a dict is accepted too from Python).
    """

    inputs: list[str] = field(
        metadata={"help": "Prompt JSONL files or folders of them (one {\"turns\": [...]} object per line)."}
    )
    output_dir: str = field(metadata={"help": "Folder receiving shard-NNNNN.jsonl files (created if missing)."})
    target: str | None = field(
        default=None,
        metadata={"help": "Target model path or Hub id (default: the embedded SmolLM2-135M-Instruct GGUF)."},
    )
    gguf_file: str | None = field(
        default=None, metadata={"help": "GGUF file name inside --target when it is a GGUF folder."}
    )
    dtype: str = field(default="auto", metadata={
        "help": "Target dtype: auto (bfloat16 where the CPU has it natively, else float32), bfloat16, float16 or "
                "float32."
    })
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature of the replies (0: greedy)."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling mass of the replies."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k sampling of the replies (default: off)."})
    max_new_tokens: int = field(
        default=256, metadata={"help": "Reply length limit (a reply that hits it is marked truncated)."}
    )
    max_prompt_tokens: int = field(
        default=512, metadata={"help": "User turns longer than this are cut to this many tokens."}
    )
    system_prompt: str | None = field(
        default=None, metadata={"help": "System message (default: the chat template's own)."}
    )
    batch_size: int = field(default=8, metadata={"help": "Prompts generated together (left padding)."})
    shard_size: int = field(
        default=256, metadata={"help": "Conversations per output shard (an interruption loses at most one shard)."}
    )
    max_prompts_per_file: int | None = field(
        default=None, metadata={"help": "Take only the first n prompts of each input file (default: all)."}
    )
    seed: int = field(
        default=0, metadata={"help": "Base seed; batch b of shard s samples with seed + 1_000_003·s + b."}
    )
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's own)."})
    extra_generate_kwargs: str | None = field(
        default=None,
        metadata={"help": "More generate() arguments as a JSON object, e.g. '{\"repetition_penalty\": 1.1}'."},
    )

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, Path)):
            self.inputs = [str(self.inputs)]
        self.generate_kwargs: dict[str, Any] = parse_generate_kwargs(self.extra_generate_kwargs)
        if not self.inputs:
            raise ValueError("inputs is empty; pass prompt JSONL files, e.g. data/train/gsm8k_train.jsonl.")
        if self.dtype not in ("auto", "bfloat16", "float32", "float16"):
            raise ValueError(f"dtype must be 'auto', 'bfloat16', 'float16' or 'float32', got {self.dtype!r}.")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}.")
        for name in ("max_new_tokens", "max_prompt_tokens", "batch_size", "shard_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.max_prompts_per_file is not None and self.max_prompts_per_file < 1:
            raise ValueError(f"max_prompts_per_file must be >= 1 (omit it for all), got {self.max_prompts_per_file}.")
        try:
            files = expand_jsonl_paths(self.inputs)  # before the target loads
        except FileNotFoundError as error:
            raise ValueError(f"inputs: {error}") from None
        check_prompt_files(files)


def check_prompt_files(files: list[Path]) -> None:
    """Refuse an input file without a single non-blank line: it holds no prompts, and a run over it would exit
    having written nothing; and one whose text is not valid Unicode (a lone surrogate escape such as \\ud800, which
    no tokenizer can encode). (Malformed lines are named by `read_prompts`.)"""
    for path in files:
        with open(path, encoding="utf-8") as handle:
            try:
                lines = list(handle)
            except UnicodeDecodeError as error:
                raise ValueError(f"inputs: {path} is not UTF-8 text ({error}); save it as UTF-8.") from None
        if not any(line.strip() for line in lines):
            raise ValueError(
                f"inputs: {path} holds no prompts (the file is empty or blank); fill it with one "
                '{"turns": [...]} object per line, or remove it from the inputs.'
            )
        bad = next((number for number, line in enumerate(lines, 1) if _lone_surrogate(line)), None)
        if bad is not None:
            raise ValueError(f"inputs: {path}:{bad} holds text that is not valid Unicode (an unpaired surrogate "
                             "escape such as \\ud800, which no tokenizer can encode); fix or drop that line.")


def _lone_surrogate(line: str) -> bool:
    """Whether a JSON line decodes to text UTF-8 cannot encode (malformed JSON is `read_prompts`' to name)."""
    try:
        json.dumps(json.loads(line), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except json.JSONDecodeError:
        pass
    return False


def load_target(target: str | None, gguf_file: str | None, dtype: torch.dtype):
    """(model, tokenizer) for a path/Hub id, or the embedded default target when `target` is None."""
    if target is None:
        from ..defaults import load_default_target

        return load_default_target(dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..hardware import warn_if_slow_dtype
    from ..interop.sources import resolve_model_source

    warn_if_slow_dtype(str(dtype).removeprefix("torch."), "cpu")
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    kwargs.update(resolve_model_source(target, what="target"))
    tokenizer = AutoTokenizer.from_pretrained(target, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, **kwargs).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def prompt_id(stem: str, index: int, turns: list[str]) -> str:
    """`<file stem>:<line index>:<digest of the turns>`: stable across reruns, distinct for two files that share a
    stem (or a file edited since), equal only for the same prompt at the same place."""
    digest = hashlib.sha256(json.dumps(turns, ensure_ascii=False).encode("utf-8")).hexdigest()[:12]
    return f"{stem}:{index}:{digest}"


def read_prompts(config: PrepareDataConfig) -> list[dict[str, Any]]:
    """All prompts as `{"id", "source", "turns", "legacy_id"}` (ids from `prompt_id` unless the line has its own
    `id`; `legacy_id` is the `<stem>:<index>` id of earlier versions). A repeated prompt is taken once; two
    different prompts under one explicit `id` are a `ValueError`."""
    prompts: dict[str, dict[str, Any]] = {}
    for path in expand_jsonl_paths(config.inputs):
        for index, record in enumerate(iter_jsonl(path)):
            if config.max_prompts_per_file is not None and index >= config.max_prompts_per_file:
                break
            turns = record.get("turns")
            if not turns or not all(isinstance(t, str) for t in turns):
                raise ValueError(f"{path} line {index + 1} needs a non-empty list of strings under 'turns'.")
            own = record.get("id")
            prompt = {"id": str(own) if own is not None else prompt_id(path.stem, index, turns), "source": path.stem,
                      "turns": turns, "legacy_id": None if own is not None else f"{path.stem}:{index}",
                      "where": f"{path} line {index + 1}"}
            seen = prompts.setdefault(prompt["id"], prompt)
            if seen is not prompt and seen["turns"] != turns:
                raise ValueError(f"{prompt['where']} reuses the id {own!r} of {seen['where']} for another prompt; "
                                 "give every line its own id (or none).")
    return [{k: v for k, v in p.items() if k != "where"} for p in prompts.values()]


def existing_shards(output_dir: Path) -> tuple[dict[str, list[str]], int]:
    """{id: user turns} of the conversations already written, and the next free shard number."""
    done: dict[str, list[str]] = {}
    next_shard = 0
    for path in sorted(output_dir.glob("shard-*.jsonl")):
        match = SHARD_PATTERN.search(path.name)
        if match:
            next_shard = max(next_shard, int(match.group(1)) + 1)
            done.update((record.get("id"), record.get("turns") or []) for record in iter_jsonl(path))
    return done, next_shard


def _check_output_dir(output_dir: Path, inputs: list[str]) -> None:
    """Refuse an output folder that is an input folder, or holds an input file: a rerun would read the shards back
    as prompts."""
    out = output_dir.resolve()
    for given in inputs:
        path = Path(given).resolve()
        if path == out or out in path.parents:
            raise ValueError(f"output_dir {output_dir} holds the input {given}; write the shards to another folder.")


def already_done(prompt: dict[str, Any], done: dict[str, list[str]]) -> bool:
    """Whether `prompt` is in the shards: by its id, or (shards of earlier versions) by its `<stem>:<index>` id
    with the same user turns (stored cut to `max_prompt_tokens`, so a stored turn may be a prefix of the input)."""
    if prompt["id"] in done:
        return True
    stored = done.get(prompt["legacy_id"]) if prompt["legacy_id"] else None
    if stored is None or len(stored) != len(prompt["turns"]):
        return False
    return all(turn.startswith(cut.rstrip("\ufffd")) for turn, cut in zip(prompt["turns"], stored))


def _cut_prompt(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


def _stop_ids(model, tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def generate_replies(
    model, tokenizer, conversations: list[list[dict[str, str]]], config: PrepareDataConfig, seed: int
) -> list[tuple[str, bool]]:
    """One batch: (reply text, truncated) for each message list (ending with a user turn), left padded."""
    texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in conversations]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    stop_ids = _stop_ids(model, tokenizer)
    sampling = {"do_sample": False}
    if config.temperature > 0:
        sampling = {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p}
        if config.top_k is not None:
            sampling["top_k"] = config.top_k
    torch.manual_seed(seed)
    output = model.generate(
        **batch, max_new_tokens=config.max_new_tokens, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id,
        **sampling, **config.generate_kwargs,
    )
    replies = []
    for row in output[:, batch["input_ids"].shape[1] :].tolist():
        stops = [i for i, token in enumerate(row) if token in stop_ids]
        end = stops[0] if stops else len(row)
        replies.append((tokenizer.decode(row[:end], skip_special_tokens=True), not stops))
    return replies


def regenerate_chunk(model, tokenizer, prompts: list[dict[str, Any]], config: PrepareDataConfig, seed: int, bar):
    """Regenerate all turns of a chunk of prompts, turn by turn, in length-sorted batches."""
    states = [{**p, "responses": [], "truncated": []} for p in prompts]
    cut = {id(s): [_cut_prompt(tokenizer, t, config.max_prompt_tokens) for t in s["turns"]] for s in states}
    max_turns = max(len(s["turns"]) for s in states)
    for turn in range(max_turns):
        active = sorted((s for s in states if len(s["turns"]) > turn), key=lambda s: len(cut[id(s)][turn]))
        for start in range(0, len(active), config.batch_size):
            group = active[start : start + config.batch_size]
            conversations = []
            for state in group:
                messages = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
                for user, reply in zip(cut[id(state)], state["responses"]):
                    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
                conversations.append([*messages, {"role": "user", "content": cut[id(state)][turn]}])
            for state, (reply, truncated) in zip(
                group, generate_replies(model, tokenizer, conversations, config, seed + start + 7919 * turn)
            ):
                state["responses"].append(reply)
                state["truncated"].append(truncated)
            bar.update(sum(1 for s in group if len(s["turns"]) == turn + 1))
    for state in states:
        state["turns"] = cut[id(state)]
    return states


def prepare_data(config: PrepareDataConfig, model=None, tokenizer=None) -> Path:
    """Regenerate replies for every prompt not yet in `config.output_dir`; returns the output folder.

    `model`/`tokenizer` may be passed to reuse an already loaded target (otherwise `config.target` is loaded).
    """
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    output_dir = Path(config.output_dir)
    _check_output_dir(output_dir, config.inputs)
    output_dir.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(config)
    done, shard = existing_shards(output_dir)
    pending = [p for p in prompts if not already_done(p, done)]
    logger.warning(f"prepare-data: {len(prompts)} prompts, {len(prompts) - len(pending)} already done")
    if not pending:
        return output_dir
    if model is None or tokenizer is None:
        from ..hardware import resolve_dtype

        dtype = resolve_dtype(config.dtype, "cpu")
        model, tokenizer = load_target(config.target, config.gguf_file, getattr(torch, dtype))
    model.eval()
    with tqdm(total=len(pending), desc="regenerating", unit="prompt") as bar:
        for start in range(0, len(pending), config.shard_size):
            chunk = pending[start : start + config.shard_size]
            records = regenerate_chunk(model, tokenizer, chunk, config, config.seed + 1_000_003 * shard, bar)
            order = {p["id"]: i for i, p in enumerate(chunk)}
            records.sort(key=lambda r: order[r["id"]])
            records = [{k: v for k, v in r.items() if k != "legacy_id"} for r in records]
            write_jsonl_atomic(output_dir / f"shard-{shard:05d}.jsonl", records)
            shard += 1
    return output_dir
