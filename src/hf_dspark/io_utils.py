"""Small file helpers shared by the package: every JSON artifact (and config file) is written atomically."""

from __future__ import annotations

import json
import os
import tempfile
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
