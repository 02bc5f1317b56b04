"""The target's verification forwards with oneDNN-packed linear weights (CPU, float32).

A verification forward multiplies every weight by a few rows (ℓ_r + 1 tokens per request). On x86 CPUs without
AVX-512, MKL's float32 GEMM streams a weight far less efficiently for 2-64 rows than its matrix-vector kernel does
for one row, so verifying 8 tokens costs about twice a decode step and speculation rarely pays (README, "Packed
weights"). oneDNN, given each weight once in its own blocked layout, keeps those few-row products close to the
one-row cost. `PackedLinears` holds the packed copies (one more copy of each packed weight in memory);
`packed_linears` routes the packed layers' calls with `min_rows..max_rows` rows of input to oneDNN inside it.
Single rows (plain decoding) and long inputs keep PyTorch's kernel.

The products are the same sums in another order: logits differ from MKL's in the last bits, as MKL's GEMM already
differs from its matrix-vector kernel, so greedy verification still accepts exactly the target's argmax of the
logits it computes (an argmax can only move at a near-exact tie, as with any change of batch shape).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.utils import logging

logger = logging.get_logger(__name__)

# The most memory packing may take, as a share of what is available, when the caller leaves the choice to us.
AUTO_MEMORY_SHARE = 0.5
# Command-line spellings of `dspark_packed_weights` (`--packed-weights`): None decides as `generate` does.
PACKED_WEIGHTS_CHOICES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Entries of each packed weight watched for the writes PyTorch does not track (at least one per output row; every
# entry of a weight with at most this many). Tracked writes are caught exactly by the version counter (PackedWeight).
PROBE_SAMPLES = 1024


def onednn_linear_available() -> bool:
    """Whether this PyTorch build has oneDNN's packed linear ops (`torch.ops.mkldnn`)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._reorder_linear_weight) and callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def _linear_modules(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """`model`'s plain `nn.Linear` layers: not subclasses (quantized or adapter layers compute otherwise), nor
    layers whose `forward` was already replaced on the instance (e.g. by accelerate's offloading hooks)."""
    return [module for module in model.modules() if type(module) is torch.nn.Linear and "forward" not in vars(module)]


def _linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The distinct weights of `model`'s plain `nn.Linear` layers (a tied LM head counts once)."""
    seen, weights = set(), []
    for module in _linear_modules(model):
        if id(module.weight) not in seen:
            seen.add(id(module.weight))
            weights.append(module.weight)
    return weights


def unpackable_reason(model: torch.nn.Module) -> str | None:
    """Why `model`'s linear weights cannot be packed (None: they can)."""
    if not onednn_linear_available():
        return "this PyTorch build has no oneDNN (torch.backends.mkldnn)"
    if is_compiled(model):
        return "the target's forward is compiled (torch.compile), and inductor cannot lower oneDNN's packed linear ops"
    weights = _linear_weights(model)
    if not weights:
        return "the model has no nn.Linear layers"
    if any(w.device.type != "cpu" for w in weights):
        return "packing is for models on the CPU"
    if any(w.dtype != torch.float32 for w in weights):
        return "packing is for float32 weights"
    return None


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether calls to `model` run compiled: `model.forward = torch.compile(model.forward)` or `model.compile()`."""
    forward = getattr(model, "forward", None)
    return (getattr(forward, "_torchdynamo_orig_callable", None) is not None
            or getattr(model, "_compiled_call_impl", None) is not None)


def available_memory_bytes() -> int | None:
    """Memory the OS reports as available now (Linux `SC_AVPHYS_PAGES`), or None where it does not say."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed (blocked-layout) copy of a linear weight `[out, in]`, for `onednn_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's x `[rows, in]` times a packed weight (`[out, in]` before packing) plus bias: `[rows, out]`."""
    return torch.ops.mkldnn._linear_pointwise.default(x, packed, bias, "none", [], "")


def _probe_indices(weight: torch.Tensor, samples: int = PROBE_SAMPLES) -> torch.Tensor:
    """Flat indices of the weight entries a `PackedWeight` watches: one in each of `n` equal chunks of the
    flattened `[out, in]` weight, at a spread offset, with n >= out (every row is watched) and n <= numel."""
    numel = weight.numel()
    count = min(numel, max(samples, weight.shape[0] if weight.dim() else 1))
    chunk = numel // count
    steps = torch.arange(count, dtype=torch.long)
    return steps * chunk + (steps * 7919) % max(chunk, 1)


@dataclass
class PackedWeight:
    """One weight's packed copy and what identifies the values it was packed from.

    PyTorch bumps a tensor's version counter on every in-place op on it, on any view of it or on `detach()` of it
    (an indexed write to one entry, `copy_`, `load_state_dict`, `nn.init`, optimizer steps), so `version` and
    `data_ptr` catch all of those exactly, whichever entries they touch, without reading a value. Writes PyTorch
    does not track move no counter: through `param.data` (a fresh version counter per access; e.g. adapter merges,
    `weight.data += delta`), through NumPy / DLPack aliases or raw storage. Only those rely on `probe`: a write that
    changes a watched entry (whole-weight writes always do) is caught, a sparse one elsewhere is not.

    Args:
        weight: the `nn.Parameter` packed (its identity: a layer given a new Parameter is no longer covered).
        data_ptr: where its values lived when packed (`param.data = ...` and `.to(...)` move them).
        version: its version counter when packed (every tracked in-place change moves it).
        probe: flat indices of the entries watched for untracked writes (see above).
        sample: the values at `probe` when packed.
        packed: oneDNN's blocked copy (`onednn_pack`).
    """

    weight: torch.Tensor
    data_ptr: int
    version: int
    probe: torch.Tensor
    sample: torch.Tensor
    packed: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> PackedWeight:
        """Pack `weight` and record what identifies its values now."""
        with torch.no_grad():
            probe = _probe_indices(weight)
            return cls(weight, weight.data_ptr(), weight._version, probe, torch.take(weight.detach(), probe).clone(),
                       onednn_pack(weight))

    def moved(self) -> bool:
        """Whether the weight left the packed values without touching a single value (cheap: no tensor op)."""
        weight = self.weight
        return weight._version != self.version or weight.data_ptr() != self.data_ptr


def _packed_linear(x: torch.Tensor, module: torch.nn.Linear, entry: PackedWeight, min_rows: int,
                   max_rows: int) -> torch.Tensor:
    """`module(x)`, through oneDNN's packed copy when x has `min_rows..max_rows` rows, is float32 and needs no
    gradient, and the layer still holds the weight packed, unchanged since (same Parameter, storage, version).
    x: `[..., in]`; weight: `[out, in]`; returns `[..., out]`."""
    features = x.shape[-1]
    rows = x.numel() // features if features else 0
    if (min_rows <= rows <= max_rows and x.dtype is torch.float32 and module.weight is entry.weight
            and not entry.moved() and not (x.requires_grad and torch.is_grad_enabled())):
        out = onednn_linear(x.reshape(rows, features), entry.packed, module.bias)
        return out.view(*x.shape[:-1], out.shape[-1])
    return F.linear(x, module.weight, module.bias)


class _Scope(threading.local):
    """Per thread: how many `packed_linears` blocks it is inside (a class default, so a thread that never entered
    one reads 0 without the failed look-up `getattr(local, name, default)` pays, several hundred ns a layer)."""

    depth = 0


@dataclass
class PackedLinears:
    """oneDNN-packed copies of a model's linear weights.

    The copies are used only by the thread inside a `packed_linears` block; other threads calling the same layers
    meanwhile run PyTorch's kernel on the live weights.

    Args:
        modules: the plain `nn.Linear` layers whose forwards `packed_linears` routes.
        packed: `id(weight)` → its `PackedWeight`; a tied weight is packed once.
        min_rows: the fewest input rows routed to oneDNN (one row: PyTorch's matrix-vector kernel is as fast).
        max_rows: the most input rows routed to oneDNN (prefill-sized inputs keep PyTorch's kernel).
    """

    modules: list[torch.nn.Linear] = field(default_factory=list)
    packed: dict[int, PackedWeight] = field(default_factory=dict)
    min_rows: int = 2
    max_rows: int = 64
    lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    active: int = field(default=0, init=False, repr=False, compare=False)
    forwards: list = field(default_factory=list, init=False, repr=False, compare=False)
    scope: _Scope = field(default_factory=_Scope, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_rows <= self.max_rows:
            raise ValueError(f"need 1 <= min_rows <= max_rows, got {self.min_rows} and {self.max_rows}.")
        self.forwards = [self.forward_for(module) for module in self.modules]  # built once: swapping is cheap

    @classmethod
    def build(cls, model: torch.nn.Module, min_rows: int = 2, max_rows: int = 64) -> PackedLinears:
        """Pack every plain `nn.Linear` weight of `model` (raises `ValueError` naming why it cannot)."""
        reason = unpackable_reason(model)
        if reason is not None:
            raise ValueError(f"cannot pack the linear weights of {type(model).__name__}: {reason}.")
        packed = {id(w): PackedWeight.of(w) for w in _linear_weights(model)}
        return cls(_linear_modules(model), packed, min_rows=min_rows, max_rows=max_rows)

    @staticmethod
    def nbytes_for(model: torch.nn.Module) -> int:
        """Bytes the packed copies of `model`'s linear weights take (the weights' own size)."""
        return sum(w.numel() * w.element_size() for w in _linear_weights(model))

    def stale(self) -> bool:
        """Whether a packed weight changed since packing: a layer holds another Parameter (assigned, or
        `load_state_dict(..., assign=True)`), a weight's storage moved (`param.data = ...`, `.to(...)`), it was
        changed in place (its version moved: exact, any entry), or a watched entry differs (writes PyTorch does not
        track, through `param.data` such as an adapter merge `weight.data += delta`, or a NumPy alias; see
        `PackedWeight`). The watched entries (at least one per output row) are compared in one tensor comparison,
        so this is cheap enough to run once per call."""
        entries = list(self.packed.values())
        if any(id(module.weight) not in self.packed for module in self.modules) or any(e.moved() for e in entries):
            return True  # an entry holds its weight, so a matching id is the same Parameter
        if not entries:
            return False
        with torch.no_grad():
            now = torch.cat([torch.take(entry.weight.detach(), entry.probe) for entry in entries])
            return not torch.equal(now, torch.cat([entry.sample for entry in entries]))

    def refresh(self, model: torch.nn.Module) -> bool:
        """Repack `model`'s linear weights in place when its layers or weights changed since packing (`stale`);
        returns whether it did. Skipped while a `packed_linears` block runs (the swapped forwards then fall back to
        PyTorch's kernel for a layer whose Parameter, storage or version changed). A model that can no longer be
        packed (moved off float32 or the CPU) keeps no copies: every call runs PyTorch's kernel."""
        with self.lock:
            if self.active or (self.modules == _linear_modules(model) and not self.stale()):
                return False
            fresh = PackedLinears.build(model) if unpackable_reason(model) is None else PackedLinears()
            self.modules, self.packed = fresh.modules, fresh.packed
            self.forwards = [self.forward_for(module) for module in self.modules]
            return True

    def forward_for(self, module: torch.nn.Linear):
        """`module`'s forward on the packed copy of its weight inside this thread's `packed_linears` block, and
        `nn.Linear.forward` anywhere else (another thread, or PyTorch's kernel when the call is not routed)."""
        entry, low, high, scope = self.packed[id(module.weight)], self.min_rows, self.max_rows, self.scope

        def forward(x: torch.Tensor) -> torch.Tensor:
            if scope.depth:
                return _packed_linear(x, module, entry, low, high)
            return F.linear(x, module.weight, module.bias)

        return forward


def _install(packs: PackedLinears) -> None:
    """One more block holds `packs`' forwards on its modules (the first block swaps them in)."""
    with packs.lock:
        packs.active += 1
        if packs.active == 1:
            for module, forward in zip(packs.modules, packs.forwards):
                object.__setattr__(module, "forward", forward)  # plain attribute: nn.Module's own setter is slow


def _uninstall(packs: PackedLinears) -> None:
    """One block holding `packs`' forwards ends (the last restores the modules)."""
    with packs.lock:
        packs.active -= 1
        if packs.active == 0:
            for module in packs.modules:
                vars(module).pop("forward", None)


@contextmanager
def installed_linears(packs: PackedLinears | None) -> Iterator[None]:
    """Keep `packs`' forwards on their modules for the whole block, without routing anything: forwards use the
    packed copies only inside `packed_linears` blocks, every other call runs PyTorch's kernel as before. A loop that
    runs many verification forwards holds it around them, so that each forward's own block only counts the
    thread's depth instead of swapping every layer's forward in and out (None: nothing changes)."""
    if packs is None:
        yield
        return
    _install(packs)
    try:
        yield
    finally:
        _uninstall(packs)


@contextmanager
def packed_linears(packs: PackedLinears | None) -> Iterator[None]:
    """Run this thread's forwards inside with `packs` (None: nothing changes).

    Each packed `nn.Linear` gets, while at least one such block (or `installed_linears` block) runs in any thread,
    the instance `forward` `packs.forward_for(module)` (built once, so a swap sets one attribute per layer); the
    modules are restored when the last block exits. The swapped forward uses the packed copy only in threads inside
    a `packed_linears` block (a thread-local depth), so plain forwards of the same model elsewhere meanwhile
    compute exactly what they would without it. (A `TorchFunctionMode` would route the same calls without touching
    the modules, but costs a Python dispatch on every op of the forward: a first version did, and was slower at
    one token than no packing.)
    """
    if packs is None:
        yield
        return
    _install(packs)
    packs.scope.depth += 1
    try:
        yield
    finally:
        packs.scope.depth -= 1
        _uninstall(packs)


def linear_packs_for(model: torch.nn.Module, setting: bool | None = None) -> PackedLinears | None:
    """The packed weights for `model`'s verification forwards, built once per model and reused (rebuilt when a
    layer or weight changed since: `PackedLinears.stale`), or None to run unpacked.

    setting: True packs (a `ValueError` names why it cannot); False never does; None (default) packs when it can
    and the copies fit in `AUTO_MEMORY_SHARE` of the memory available now (a model already packed stays packed).
    """
    if setting is False:
        return None
    packs = _PACKS.get(model)
    reason = unpackable_reason(model)
    if packs is not None and reason is None:
        packs.refresh(model)
        return packs
    if reason is not None:
        if setting:
            raise ValueError(f"dspark_packed_weights=True, but {reason}; pass dspark_packed_weights=False.")
        return None
    if setting is None and packs is None:
        available, needed = available_memory_bytes(), PackedLinears.nbytes_for(model)
        if available is None or needed > AUTO_MEMORY_SHARE * available:
            logger.info(f"Not packing the target's linear weights: {needed / 2**20:.0f} MiB would take more than "
                        f"{AUTO_MEMORY_SHARE:.0%} of the available memory (pass dspark_packed_weights=True to "
                        "pack anyway).")
            return None
    packs = PackedLinears.build(model)
    _PACKS[model] = packs
    return packs


def verification_kernel(packs: PackedLinears | None) -> str:
    """The name step curves record for the verification forward's linear kernel: "" (PyTorch's) or "onednn"."""
    return "" if packs is None else "onednn"
