"""Where a result came from: the record every benchmark writes into its JSON.

`result_provenance()` returns `{command, git_commit, dirty, versions, processor, threads, created}`: the command line
that produced the result, the commit of the checkout it ran from (None outside a git checkout) and whether that
checkout had uncommitted changes, the versions of the packages that set the numbers, the kind of processor
(`hardware.processor_signature`, the same name the shipped cost curves are filed under), torch's intra-op threads and
the UTC time. `with_provenance(payload)` adds it to a result under the key `"provenance"`.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

import torch

from .hardware import processor_signature

PACKAGES = ("hf-dspark", "torch", "transformers", "accelerate", "numpy")
PROVENANCE_KEYS = ("command", "git_commit", "dirty", "versions", "processor", "threads", "created")


def _git(args: Sequence[str], cwd: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(cwd: str | os.PathLike | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout at `cwd` (default: the one this package was imported from, else the
    working directory); (None, None) outside a checkout or without git."""
    folder = os.fspath(cwd) if cwd is not None else os.path.dirname(os.path.abspath(__file__))
    commit = _git(["rev-parse", "HEAD"], folder)
    if commit is None and cwd is None:
        folder = os.getcwd()
        commit = _git(["rev-parse", "HEAD"], folder)
    if commit is None:
        return None, None
    status = _git(["status", "--porcelain", "--untracked-files=no"], folder)
    return commit, bool(status) if status is not None else None


def package_versions(packages: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of `packages` (None for one that is not installed), plus Python's."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def processor_kind(device: str | torch.device = "cpu") -> str:
    """`processor_signature(device)` as a folder name (`x86_64/AVX512+bf16` -> `x86_64--AVX512--bf16`): the name the
    shipped cost curves and the benchmark results (`benchmarks/results/<kind>/`) are filed under."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", processor_signature(device).strip("/"))


def result_provenance(command: str | Sequence[str] | None = None, device: str | torch.device = "cpu",
                      cwd: str | os.PathLike | None = None) -> dict[str, Any]:
    """The provenance record of a result measured now (see the module docstring).

    command: the command line (a string, or argv to be shell-quoted); None: this process's own `sys.argv`.
    device: the device whose processor kind is recorded. cwd: the checkout whose commit is recorded.
    """
    if command is None:
        command = [os.path.basename(sys.argv[0]) or "python", *sys.argv[1:]]
    if not isinstance(command, str):
        command = shlex.join(str(part) for part in command)
    commit, dirty = git_state(cwd)
    return {
        "command": command,
        "git_commit": commit,
        "dirty": dirty,
        "versions": package_versions(),
        "processor": processor_signature(device),
        "threads": torch.get_num_threads(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def with_provenance(payload: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """`payload` with `"provenance": result_provenance(**kwargs)` added (an existing record is kept)."""
    out = dict(payload)
    out.setdefault("provenance", result_provenance(**kwargs))
    return out
