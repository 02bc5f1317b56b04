"""Prompt sets (`{"turns": [...]}` JSON Lines) and chat-template tokenisation shared by eval and benchmarks."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch

from .hf_prompts import dataset_prompt_file, is_dataset_spec, parse_dataset_spec

# The prompt sets shipped in the package (resources/prompts/, PROVENANCE.md there): name -> domain.
PROMPT_SETS = {
    "gsm8k": "math",
    "math500": "math",
    "humaneval": "code",
    "mbpp": "code",
    "mt-bench": "chat",
    "calibration-gsm8k": "math (held-out training prompts, for calibrate)",
}
PROMPT_SPEC_HELP = (
    "a shipped set by name (" + ", ".join(PROMPT_SETS) + "), a JSONL file of {\"turns\": [...]} lines, or a "
    "Hugging Face dataset hf://datasets/OWNER/NAME[:split[:field]]"
)


def shipped_prompt_set(name: str) -> Path:
    """The packaged JSONL file of the shipped set `name` (a key of `PROMPT_SETS`)."""
    if name not in PROMPT_SETS:
        raise ValueError(f"no shipped prompt set {name!r}; the shipped ones are {', '.join(PROMPT_SETS)}")
    return Path(str(resources.files("hf_dspark") / "resources" / "prompts" / f"{name}.jsonl"))


def resolve_prompt_set(spec: str | Path) -> Path:
    """The JSONL file behind a prompt-set spec: a shipped name (`gsm8k`), an existing file, or
    `hf://datasets/OWNER/NAME[:split[:field]]` (read through `datasets` once, then cached). `ValueError` otherwise.

    A file in the current folder wins over a shipped set of the same name."""
    text = str(spec)
    if is_dataset_spec(text):
        return dataset_prompt_file(parse_dataset_spec(text))
    if Path(text).is_file():
        return Path(text)
    if text in PROMPT_SETS:
        return shipped_prompt_set(text)
    raise ValueError(f"prompt set {text}: no such file, and not a shipped set name ({', '.join(PROMPT_SETS)}) or "
                     "hf://datasets/OWNER/NAME[:split[:field]]")


def check_prompt_files(paths: list[str]) -> None:
    """Raise `ValueError` unless `paths` names at least one prompt set (`resolve_prompt_set`) and each reads as a
    prompt set (checked before any model is loaded)."""
    if not paths:
        raise ValueError("give at least one prompt set (a shipped name such as gsm8k, or a JSONL file)")
    for path in paths:
        load_prompt_set(path)


def set_names(paths: list[str]) -> list[str]:
    """One name per prompt set: a shipped set's name, a file's stem (`gsm8k`), or, where two files share a stem, as
    many parent folders as tell them apart (`a/chat`, `b/chat`). The same file given twice is a `ValueError`."""
    resolved = [resolve_prompt_set(p).resolve() for p in paths]
    twice = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if twice:
        raise ValueError(f"prompt file(s) {twice} given more than once")

    def name(path: Path, depth: int) -> str:
        return "/".join(path.with_suffix("").parts[-depth:])

    names = []
    for path in resolved:
        depth = 1
        while depth <= len(path.parts) and sum(name(other, depth) == name(path, depth) for other in resolved) > 1:
            depth += 1
        names.append(name(path, depth) if depth <= len(path.parts) else str(path))  # e.g. a/chat.jsonl, a/chat.json
    return names


def check_output_path(out: str | Path, inputs: list[str], what: str = "--out") -> None:
    """`ValueError` when `out` would overwrite one of the `inputs` (e.g. `--out data/eval/gsm8k.jsonl`)."""
    target = Path(out).resolve()
    for path in inputs:
        if Path(path).resolve() == target:
            raise ValueError(f"{what} {out} is the input file {path}; writing there would destroy it. Choose another "
                             "path.")


def _unencodable_turn(turns: list[str]) -> int | None:
    """Index of the first turn that is not valid Unicode text (a lone surrogate, as JSON's `"\\ud800"` gives),
    which no tokenizer can encode; None when every turn is."""
    for index, turn in enumerate(turns):
        try:
            turn.encode("utf-8")
        except UnicodeEncodeError:
            return index
    return None


def load_prompt_set(path: str | Path) -> list[dict]:
    """Read a JSONL prompt set, given as a file, a shipped name or a dataset (`resolve_prompt_set`): UTF-8, a leading
    byte-order mark allowed; every line must be an object with a non-empty list `turns` of strings that are valid
    Unicode text, and there must be at least one."""
    path = resolve_prompt_set(path)
    items = []
    with open(path, encoding="utf-8-sig") as handle:
        try:
            lines = list(handle)
        except UnicodeDecodeError as err:
            raise ValueError(f"prompt file {path} is not UTF-8 text ({err}); save it as UTF-8") from err
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number} is not valid JSON ({err})") from err
        turns = item.get("turns") if isinstance(item, dict) else None
        if not turns or not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise ValueError(f'{path}:{number} needs a non-empty "turns" list of strings')
        bad = _unencodable_turn(turns)
        if bad is not None:
            raise ValueError(f"{path}:{number}: turn {bad} is not valid Unicode text (an unpaired surrogate escape "
                             "such as \\ud800, which no tokenizer can encode); fix or drop that line")
        items.append(item)
    if not items:
        raise ValueError(f"prompt file {path} holds no prompts (one {{\"turns\": [...]}} object per line expected)")
    return items


def chat_input_ids(tokenizer, user_turns: list[str], replies: list[str] | None = None) -> torch.Tensor:
    """`[1, L]` ids of a conversation (user turns interleaved with earlier replies) ready for the next reply."""
    replies = replies or []
    messages = []
    for i, turn in enumerate(user_turns):
        messages.append({"role": "user", "content": turn})
        if i < len(replies):
            messages.append({"role": "assistant", "content": replies[i]})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return torch.as_tensor(ids).reshape(1, -1)
