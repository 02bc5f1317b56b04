"""Small file helpers shared by the package: every JSON artifact is written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_json_atomic(path: str | os.PathLike, payload: Any, indent: int = 2, **dump_kwargs: Any) -> None:
    """Write `payload` as JSON to `path` through a temporary file in the same folder and `os.replace`, so a reader
    (or a resumed job) never sees half a file. Creates the folder."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=indent, **dump_kwargs)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
