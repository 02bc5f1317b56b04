"""Prompt sets from Hugging Face datasets: `hf://datasets/OWNER/NAME[:split[:field]]` -> a cached JSONL prompt file.

The `datasets` library is imported only when a dataset is first read; its rows are written once as a
`{"turns": [...]}` JSONL file under the user cache (`$HF_DSPARK_CACHE/prompts/`), so later runs read that file and
need neither the network nor `datasets`. A local dataset folder (data files `datasets.load_dataset` reads) works the
same way with `--dataset PATH`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

HF_DATASET_PREFIX = "hf://datasets/"
DEFAULT_SPLIT = "test"
# The first of these columns a dataset has is its prompt column when no field is named.
PROMPT_FIELDS = ("turns", "prompt", "question", "instruction", "problem", "input", "text")


@dataclass(frozen=True)
class DatasetSpec:
    """A prompt set read from a dataset.

    Args:
        path: a Hub dataset id (`OWNER/NAME`) or a local dataset folder.
        split: the split to read (default "test").
        field: the column holding the prompt (a string, or a list of strings for several user turns); None: the
            first of `PROMPT_FIELDS` the dataset has.
    """

    path: str
    split: str = DEFAULT_SPLIT
    field: str | None = None

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("the dataset name is empty; give OWNER/NAME, e.g. hf://datasets/openai/gsm8k")
        if not self.split:
            raise ValueError(f"dataset {self.path}: the split is empty; give one, e.g. {self.path}:test")

    @property
    def uri(self) -> str:
        """`hf://datasets/OWNER/NAME:split[:field]`."""
        return f"{HF_DATASET_PREFIX}{self.path}:{self.split}" + (f":{self.field}" if self.field else "")

    @property
    def name(self) -> str:
        """A file-name-safe name: `OWNER--NAME--split[--field]`."""
        parts = [Path(self.path).name if Path(self.path).is_dir() else self.path, self.split, self.field or ""]
        return re.sub(r"[^\w.-]+", "--", "--".join(p for p in parts if p))


def is_dataset_spec(spec: str) -> bool:
    return str(spec).startswith(HF_DATASET_PREFIX)


def parse_dataset_spec(spec: str) -> DatasetSpec:
    """`hf://datasets/OWNER/NAME[:split[:field]]` -> `DatasetSpec`."""
    rest = str(spec)[len(HF_DATASET_PREFIX):]
    path, _, tail = rest.partition(":")
    split, _, field = tail.partition(":")
    return DatasetSpec(path, split or DEFAULT_SPLIT, field or None)


def _cache_file(spec: DatasetSpec) -> Path:
    from ..profiling.target_steps import cache_root

    digest = hashlib.sha256(json.dumps([spec.path, spec.split, spec.field]).encode()).hexdigest()[:10]
    return cache_root() / "prompts" / f"{spec.name}-{digest}.jsonl"


def _load_rows(spec: DatasetSpec):
    try:
        import datasets
    except ImportError as error:
        raise ValueError(f"{spec.uri}: reading a Hugging Face dataset needs the `datasets` library; "
                         "`pip install datasets` (or `pip install hf-dspark[eval]`), or pass a JSONL file") from error
    try:
        return datasets.load_dataset(spec.path, split=spec.split)
    except Exception as error:  # datasets raises many kinds (offline, missing config, unknown split, no such repo)
        raise ValueError(f"{spec.uri}: the dataset could not be read ({type(error).__name__}: {error}). Offline "
                         "(HF_HUB_OFFLINE=1 or no network) it must already be in the datasets cache: read it once "
                         "online, or pass a JSONL file of {\"turns\": [...]} lines") from error


def _turns(value, spec: DatasetSpec, field: str, index: int) -> list[str]:
    turns = [value] if isinstance(value, str) else value
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise ValueError(f"{spec.uri}: row {index} of column {field!r} is not a non-empty string or list of "
                         "strings; name the prompt column with :FIELD (or --field)")
    return turns


def dataset_prompt_file(spec: DatasetSpec) -> Path:
    """The cached JSONL prompt file of `spec`, written from the dataset on first use (see the module docstring)."""
    from ..io_utils import write_text_atomic

    cached = _cache_file(spec)
    if cached.is_file():
        return cached
    rows = _load_rows(spec)
    columns = list(rows.column_names)
    field = spec.field or next((f for f in PROMPT_FIELDS if f in columns), None)
    if field not in columns:
        missing = repr(field) if field else "among " + ", ".join(PROMPT_FIELDS)
        raise ValueError(f"{spec.uri}: no column {missing}; this split has "
                         f"{columns}; name the prompt column, e.g. {HF_DATASET_PREFIX}{spec.path}:{spec.split}:"
                         f"{columns[0] if columns else 'question'}")
    lines = [json.dumps({"turns": _turns(v, spec, field, i)}, ensure_ascii=False) for i, v in enumerate(rows[field])]
    if not lines:
        raise ValueError(f"{spec.uri}: the split is empty")
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(cached, "\n".join(lines) + "\n")
    return cached
