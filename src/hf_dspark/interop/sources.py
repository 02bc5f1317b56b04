"""Where a model path points, decided before any download: a local folder, a cached Hub repo, or the Hub.

Transformers treats every path that is not an existing folder as a Hub repo id, so a mistyped local path fails with
"Repo id must be in the form ..." and a bare name spends ~45 s on download retries when the Hub is unreachable.
`resolve_model_source` answers both up front with a message that names the path, and `check_finite_weights`
refuses checkpoints whose tensors hold NaN or Inf (a corrupt file that would only crash later, inside sampling).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

# Hub repo ids: `name` or `namespace/name`, alphanumerics plus - _ . (not leading / trailing, no "--" or "..").
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
HUB_PROBE_TIMEOUT_S = 3.0


def looks_like_repo_id(name: str) -> bool:
    """Whether `name` could be a Hub repo id (`gpt2`, `org/model`) rather than only a filesystem path."""
    return bool(_REPO_ID.match(name)) and ".." not in name and "--" not in name and not name.endswith((".", "-"))


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` as huggingface_hub reads it (set before import) or as the environment says now."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or value.upper() in ("1", "ON", "YES", "TRUE")


def cached_on_hub(repo_id: str, filename: str = "config.json") -> bool:
    """Whether `repo_id` has `filename` in the local Hugging Face cache (no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename)
    except (ValueError, OSError):  # a malformed id or an unreadable cache: not cached
        return False
    return isinstance(found, str)


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """One TCP connection attempt to the Hub endpoint (no retries): DNS failures return at once."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def resolve_model_source(path: str | os.PathLike, what: str = "model") -> dict[str, Any]:
    """Check `path` before `from_pretrained`; returns extra keyword arguments for it (`local_files_only` when the
    Hub copy must come from the cache).

    Raises `FileNotFoundError` for a missing local folder (any path that cannot be a Hub repo id, or a file), and
    `OSError` when a repo id is neither cached nor reachable (offline), each naming the path and the fix.
    """
    name = os.fspath(path)
    local = Path(name).expanduser()
    if local.is_dir():
        return {}
    if local.exists():
        raise FileNotFoundError(f"{what} path {name} is a file; pass the folder that holds config.json.")
    if not looks_like_repo_id(name):
        raise FileNotFoundError(
            f"{what} folder {name} does not exist (resolved: {local.resolve()}); check the path, or pass a Hub repo "
            "id such as 'org/model'."
        )
    if cached_on_hub(name):
        return {} if not hub_offline() and hub_reachable() else {"local_files_only": True}
    if hub_offline():
        raise OSError(
            f"{what} {name!r} is not a local folder and is not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
            "pass an existing folder, or download the repo first with network access."
        )
    if not hub_reachable():
        raise OSError(
            f"{what} {name!r} is not a local folder (no such folder in {Path.cwd()}) and the Hugging Face Hub is "
            "unreachable from here; pass an existing folder, or connect and retry (set HF_HUB_OFFLINE=1 to use only "
            "cached repos)."
        )
    return {}


def check_finite_weights(model: nn.Module, source: str | os.PathLike) -> None:
    """Raise `ValueError` naming the first floating-point tensor of `model` that holds NaN or Inf."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(
                f"{source}: tensor {name} holds {bad} NaN/Inf value(s) in {str(tensor.dtype).removeprefix('torch.')}; "
                "the checkpoint is corrupt (a diverged run or a damaged file?), or its values overflow this dtype. "
                "Re-export or re-download it; drafting with it would fail inside sampling."
            )
