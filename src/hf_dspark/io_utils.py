"""Small file helpers shared by the package: every JSON artifact (and config file) is written atomically, and a
report is only written over an earlier report of its kind (`check_replaceable`)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _file_mode(path: str) -> int:
    """The permissions a replaced file keeps, or those of a new file under the current umask (mkstemp alone would
    make every report and config private to its writer)."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process umask, read from /proc where it can be (setting and restoring it is racy with threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def check_folder_path(path: str | os.PathLike, what: str) -> None:
    """Raise `NotADirectoryError` naming `path` when it is an existing file, or when a file stands where one of its
    parent folders would be created; a missing folder is fine (the writer creates it). `what` names the caller,
    e.g. "save_pretrained"."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(
            f"{what}: {os.fspath(path)} is an existing file, not a folder; pass a folder path (it is created if "
            "missing). Nothing was written."
        )
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(
            f"{what}: cannot create the folder {os.fspath(path)}: {parent} is a file, not a folder; pass a folder "
            "path. Nothing was written."
        )


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and `os.replace`, so a reader (or a
    resumed job) never sees half a file. Creates the folder; the file gets ordinary permissions (`_file_mode`)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    try:
        os.chmod(tmp, _file_mode(path))
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
