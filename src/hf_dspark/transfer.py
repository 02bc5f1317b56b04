"""Host-device transfers of the round: one packed download, asynchronous uploads of host decisions.

On CUDA the download goes through pinned memory with `non_blocking=True` and one event wait, so the host waits
exactly once per round for the device's queue; the uploads copy from pinned memory without blocking. On other
devices (and on the CPU) the same calls fall back to a plain copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_NUMPY_INTS = {torch.long: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.uint8: np.uint8}
HOST = "cpu"  # where host tensors live (the string: `SyncCounter` treats `torch.device("cpu")` as "the device")


def download(packed: torch.Tensor) -> list:
    """`packed` as nested Python lists: the one device-to-host copy of a round (pinned, non-blocking, one wait)."""
    if packed.device.type != "cuda":
        return packed.tolist()
    host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
    host.copy_(packed, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(packed.device))
    event.synchronize()
    return host.tolist()


def upload(values: Sequence[int] | Sequence[Sequence[int]], device: torch.device, dtype=torch.long) -> torch.Tensor:
    """Host ints on `device` without blocking the host (pinned staging on CUDA). Lists of ints become a tensor
    through numpy, several times faster than `torch.tensor` on lists of a few hundred ints."""
    numpy_dtype = _NUMPY_INTS.get(dtype)
    if numpy_dtype is None:
        host = torch.tensor(values, dtype=dtype)
    else:
        host = torch.from_numpy(np.array(values, numpy_dtype))
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
