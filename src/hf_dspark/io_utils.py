"""Small file helpers shared by the package: every JSON artifact (and config file) is written atomically, and a
report is only written over an earlier report of its kind (`check_replaceable`)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and `os.replace`, so a reader (or a
    resumed job) never sees half a file. Creates the folder."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, payload: Any, indent: int = 2, **dump_kwargs: Any) -> None:
    """Write `payload` as JSON (plus a final newline) to `path` atomically (see `write_text_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=indent, **dump_kwargs) + "\n")


def is_json_report(path: str | os.PathLike, keys: Iterable[str]) -> bool:
    """Whether `path` is a file holding a JSON object with every key of `keys` (a report this package wrote).
    False for a missing or unreadable file, a folder, invalid JSON or any other JSON value."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(report, dict) and set(keys) <= set(report)


def check_replaceable(out: str | os.PathLike, keys: Iterable[str], what: str, overwrite: bool = False) -> None:
    """Refuse to write a report over anything but an earlier report of the same kind (`is_json_report` with
    `keys`): raise `ValueError` naming `out` when it is a folder, or an existing file that is not such a report and
    `overwrite` is False. `what` describes the expected file with its article, e.g. "an hf-dspark eval report"."""
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"--out {out} is a folder; give the report's file path.")
    if not overwrite and path.exists() and not is_json_report(path, keys):
        raise ValueError(
            f"--out {out} exists and is not {what}; choose another path or pass --overwrite to replace it."
        )
