"""Count host-device synchronisation points without a GPU: `SyncCounter`.

On CUDA every read of device data by the host (`.item()`, `int()`, `bool()`, `float()`, `.tolist()`, `.cpu()`),
every operation whose output shape depends on device data (`nonzero`, `masked_select`, boolean-mask indexing,
`unique`, ...) and every blocking copy between host and device waits for the device's queue to drain. On a CPU
nothing waits, so `SyncCounter` emulates the split: it keeps track of which tensors would live on "the device"
and counts the operations that would stall on them.

Which tensors are device tensors. With `roots` (modules, whose parameters and buffers count, or tensors):
the roots, anything computed from a device tensor, tensors made by a factory (`torch.zeros`, `arange`, `full`,
`ones`, `empty`, `rand*`, `eye`, `linspace`, `tensor`, `as_tensor`, ...) given an explicit `device=` other than
the string `"cpu"`, and the targets of an upload (below). Every other tensor is a host tensor (factories without
a device, results of `.cpu()`), and nothing done with host tensors alone is counted. Without roots every tensor
is a device tensor except those created inside the counter by a factory without a device or by `.cpu()`:
the conservative proxy.

What is counted (`counts` by kind, `total` their sum, `events` one entry per sync point):

- `scalar`: `aten._local_scalar_dense` on a device tensor: `.item()`, `int(t)`, `float(t)`, `bool(t)`,
  `t.__index__()` (a tensor used as a slice bound or a `range` limit);
- `tolist`: `Tensor.tolist()` / `Tensor.numpy()` of a device tensor (one transfer however long);
- `shape`: data-dependent output shapes on device tensors: `nonzero` (`torch.where(cond)`), `masked_select`,
  `unique` / `unique_consecutive`, `repeat_interleave` with tensor repeats, `equal`;
- `bool_index`: `aten.index` / `index_put_` with a boolean (or uint8) index: `t[mask]`, `t[mask] = v`;
- `d2h`: `.cpu()`, `.to("cpu")` (the device spelled as the string "cpu") of a device tensor, and in-place writes
  of device data into a host tensor (`host[i] = device_tensor`);
- `h2d`: host data put on the device: `torch.tensor(data, device=d)`, `torch.as_tensor(data, device=d)` (d not
  the string "cpu"), `t.new_tensor(data)` on a device tensor, `.to(device)` / `.cuda()` of a host tensor without
  `non_blocking=True` (a `torch.device("cpu")` object counts as "the device": code passes `x.device` for it),
  and in-place writes of non-scalar host tensors into a device tensor.

Recorded but not in `total`: `h2d_async` (`.to(device, non_blocking=True)` of a host tensor, which does not
block from pinned memory) and `mixed` (an out-of-place op mixing a device tensor and a non-scalar host tensor,
which CUDA would refuse: it shows a tensor the roots missed, not a sync). 0-dim host tensors are CUDA scalars
and never count.

Not seen: device work that reads no data on the host (kernels, `.to(dtype)`, views), code that binds tensor
functions before the counter starts (`from torch import zeros`), and tensors created in C++ outside the
dispatcher. Use it as a context manager; `record_sites=True` keeps, per event, the innermost caller outside
torch (file:line), for finding where the points come from.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

COUNTED = ("scalar", "tolist", "shape", "bool_index", "d2h", "h2d")
_SHAPE_OPS = {"nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive", "equal", "_unique"}
_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}
_FACTORIES = (
    "zeros",
    "ones",
    "full",
    "empty",
    "arange",
    "rand",
    "randn",
    "randint",
    "randperm",
    "eye",
    "linspace",
    "tensor",
    "as_tensor",
    "asarray",
)
_UPLOADS = ("tensor", "as_tensor", "asarray")
_TORCH_DIR = os.path.dirname(torch.__file__)


@dataclass(frozen=True)
class SyncEvent:
    """One counted point: its kind (see the module docstring), the op or method, and the caller (or None)."""

    kind: str
    op: str
    site: str | None = None


def _is_host_string(value: Any) -> bool:
    return isinstance(value, str) and value.split(":")[0] == "cpu"


def _caller() -> str | None:
    here = os.path.abspath(__file__)
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = os.path.abspath(frame.filename)
        if path != here and not path.startswith(_TORCH_DIR):
            return f"{os.path.relpath(path)}:{frame.lineno} ({frame.name})"
    return None


class SyncCounter(TorchDispatchMode):
    """Counts host-device sync points of the code run inside it (see the module docstring for what counts).

    Args:
        *roots: modules (their parameters and buffers) and tensors that live on the device; none: every tensor
            not created on the host inside the counter.
        record_sites: keep each event's caller (file:line), slower.
    """

    def __init__(self, *roots: torch.nn.Module | torch.Tensor | Iterable[torch.Tensor], record_sites: bool = False):
        super().__init__()
        self.record_sites = record_sites
        self.everything = not roots
        self._device: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> True (device) / False (host)
        self.events: list[SyncEvent] = []
        self.mark_device(*roots)
        self._saved: list[tuple[Any, str, Any]] = []

    # ------------------------------------------------------------------ bookkeeping
    @property
    def counts(self) -> Counter:
        return Counter(event.kind for event in self.events)

    @property
    def total(self) -> int:
        """Counted sync points (`h2d_async` and `mixed` excluded)."""
        return sum(1 for event in self.events if event.kind in COUNTED)

    def reset(self) -> None:
        self.events = []

    def summary(self) -> dict[str, int]:
        """`{kind: count}` of every kind seen, plus `"total"`."""
        return {**dict(sorted(self.counts.items())), "total": self.total}

    def mark_device(self, *roots: torch.nn.Module | torch.Tensor | Iterable[torch.Tensor]) -> None:
        """Declare tensors (or modules' parameters and buffers) device tensors."""
        for root in roots:
            if isinstance(root, torch.nn.Module):
                tensors: Iterable[Any] = [*root.parameters(), *root.buffers()]
            elif isinstance(root, torch.Tensor):
                tensors = [root]
            else:
                tensors = root
            for tensor in tensors:
                self._device[tensor] = True

    def on_device(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` counts as a device tensor."""
        return self._device.get(tensor, self.everything)

    def _record(self, kind: str, op: str) -> None:
        self.events.append(SyncEvent(kind, op, _caller() if self.record_sites else None))

    def _set(self, tensor: Any, device: bool) -> None:
        if isinstance(tensor, torch.Tensor):
            self._device[tensor] = device

    # ------------------------------------------------------------------ the dispatcher's view
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        flat = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        device_in = [t for t in flat if self.on_device(t)]
        if device_in:
            self._count_reads(name, args, kwargs, flat)
        out = func(*args, **kwargs)
        written = self._written(func, args, kwargs)
        if written is not None:
            self._count_write(name, written, flat)
            return out
        if device_in and any(t.dim() > 0 and not self.on_device(t) for t in flat):
            self._record("mixed", name)
        for tensor in tree_flatten(out)[0]:  # made inside an op (no tensor inputs): on the device, except
            # 0-dim ones (Python scalars wrapped by an op such as `torch.where(cond, 0.5, 1.0)`: CUDA scalars)
            made_here = not flat and not (isinstance(tensor, torch.Tensor) and tensor.dim() == 0)
            self._set(tensor, bool(device_in) or made_here)
        return out

    def _count_reads(self, name: str, args, kwargs, flat: list[torch.Tensor]) -> None:
        if name == "_local_scalar_dense":
            self._record("scalar", name)
        elif name in _SHAPE_OPS or (name == "repeat_interleave" and kwargs.get("output_size") is None):
            self._record("shape", name)
        elif name in _INDEX_OPS and any(t.dtype in (torch.bool, torch.uint8) for t in flat[1:] if t.dim() > 0):
            self._record("bool_index", name)

    @staticmethod
    def _written(func, args, kwargs) -> torch.Tensor | None:
        if "out" in kwargs and isinstance(kwargs["out"], torch.Tensor):
            return kwargs["out"]
        if func._schema.is_mutable and func.overloadpacket.__name__.endswith("_") and args:
            return args[0] if isinstance(args[0], torch.Tensor) else None
        return None

    def _count_write(self, name: str, written: torch.Tensor, flat: list[torch.Tensor]) -> None:
        sources = [t for t in flat if t is not written and t.dim() > 0]
        if self.on_device(written):
            if any(not self.on_device(t) for t in sources):
                self._record("h2d", name)
        elif any(self.on_device(t) for t in sources):
            self._record("d2h", name)

    # ------------------------------------------------------------------ Python-level entry points
    def __enter__(self):
        self._patch()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._unpatch()

    def _replace(self, owner: Any, name: str, wrapper) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(wrapper(original)))

    def _unpatch(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def _patch(self) -> None:
        for name in ("tolist", "numpy"):
            self._replace(torch.Tensor, name, self._wrap_read)
        self._replace(torch.Tensor, "cpu", self._wrap_cpu)
        self._replace(torch.Tensor, "to", self._wrap_to)
        self._replace(torch.Tensor, "cuda", self._wrap_to)
        self._replace(torch.Tensor, "new_tensor", self._wrap_new_tensor)
        for name in _FACTORIES:
            if hasattr(torch, name):
                self._replace(torch, name, functools.partial(self._wrap_factory, upload=name in _UPLOADS))

    def _wrap_read(self, original):
        def read(tensor, *args, **kwargs):
            if self.on_device(tensor):
                self._record("tolist", original.__name__)
            return original(tensor, *args, **kwargs)

        return read

    def _wrap_cpu(self, original):
        def cpu(tensor, *args, **kwargs):
            out = original(tensor, *args, **kwargs)
            if self.on_device(tensor):
                self._record("d2h", "cpu")
                out = out.clone() if out is tensor else out
            self._set(out, False)
            return out

        return cpu

    def _wrap_to(self, original):
        def to(tensor, *args, **kwargs):
            out = original(tensor, *args, **kwargs)
            values = [*args, *kwargs.values()]
            if original.__name__ == "cuda":
                target_given, host = True, False
            else:
                target_given = any(
                    isinstance(v, (str, torch.device, torch.Tensor, int)) and not isinstance(v, bool) for v in values
                )
                host = any(_is_host_string(v) for v in values)
                host = host or any(isinstance(v, torch.Tensor) and not self.on_device(v) for v in values)
            if not target_given:
                return out
            if host and self.on_device(tensor):
                self._record("d2h", "to")
                out = out.clone() if out is tensor else out
                self._set(out, False)
            elif not host and not self.on_device(tensor):
                self._record("h2d_async" if kwargs.get("non_blocking") else "h2d", "to")
                out = out.clone() if out is tensor else out
                self._set(out, True)
            return out

        return to

    def _wrap_new_tensor(self, original):
        def new_tensor(tensor, *args, **kwargs):
            out = original(tensor, *args, **kwargs)
            device = self.on_device(tensor) if kwargs.get("device") is None else not _is_host_string(kwargs["device"])
            if device:
                self._record("h2d", "new_tensor")
            self._set(out, device)
            return out

        return new_tensor

    def _wrap_factory(self, original, upload: bool = False):
        def factory(*args, **kwargs):
            out = original(*args, **kwargs)
            device = kwargs.get("device")
            on_device = device is not None and not _is_host_string(device)
            if upload and on_device and not (isinstance(args[0], torch.Tensor) and self.on_device(args[0])):
                self._record("h2d", original.__name__)
            self._set(out, on_device)
            return out

        return factory
