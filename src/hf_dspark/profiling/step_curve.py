"""Cost curves: SPS(B) of the target's verification forward and the drafter's proposals per second at R rows.

`StepCurve` is a piecewise-linear table x -> steps per second (x: batch tokens B for the target's curve, rows R for
the drafter's). It is its own module so that the policies (`hf_dspark.scheduling`) and the profiler
import it without importing each other. `check_survival` validates a `[R, γ]` prefix-survival tensor.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers.utils import logging

from ..io_utils import write_json_atomic

logger = logging.get_logger(__name__)

_STEP_CURVE_FORMAT = 1


@dataclass
class StepCurve:
    """SPS(B): profiled target verification forwards per second at `batch_tokens` B (docs/scheduling.md, section 7).

    batch_tokens: strictly ascending positive ints; steps_per_second: positive floats, one per point. Between points
    SPS is interpolated linearly; below the first point it is clamped to the first value; beyond the last point it is
    extrapolated conservatively as SPS(B) = SPS(B_max)·B_max / B (constant token throughput, never better).
    The metadata fields (model, device, dtype, threads, created, profiler, processor, kernel) are optional and only
    describe the measurement; `profiler` is the version of the profiled code path (`profiling.PROFILER_VERSION`), so
    that a cached curve measured by an older release can be told apart and measured again; `processor` is the kind
    of processor it was measured on (`hardware.processor_signature`), so that a curve from another kind of machine is
    measured again rather than trusted; `kernel` names the forwards' linear kernel when it is not PyTorch's own
    ("onednn": packed weights, `generation.packed_linear`).
    """

    batch_tokens: list[int]
    steps_per_second: list[float]
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    created: str | None = None
    profiler: int | None = None
    processor: str | None = None
    kernel: str | None = None
    _tables: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        tokens, sps = list(self.batch_tokens), list(self.steps_per_second)
        if not tokens:
            raise ValueError("StepCurve needs at least one (batch_tokens, steps_per_second) point.")
        if len(tokens) != len(sps):
            raise ValueError(
                f"batch_tokens has {len(tokens)} points but steps_per_second has {len(sps)}; they must match."
            )
        if any(int(b) != b or b < 1 for b in tokens):
            raise ValueError(f"batch_tokens must be positive integers, got {tokens}.")
        if any(b1 <= b0 for b0, b1 in itertools.pairwise(tokens)):
            raise ValueError(f"batch_tokens must be strictly ascending, got {tokens}.")
        if any(not math.isfinite(s) or s <= 0 for s in sps):
            raise ValueError(f"steps_per_second must be finite and > 0, got {sps}.")
        self.batch_tokens = [int(b) for b in tokens]
        self.steps_per_second = [float(s) for s in sps]
        if self.threads is not None:
            self.threads = int(self.threads)

    def _table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The curve as float64 tensors on `device`: uploaded once per device (host and accelerator tables are
        kept side by side; a changed curve drops them)."""
        device = "cpu" if torch.device(device).type == "cpu" else device  # the host's tables stay host tensors
        values = (tuple(self.batch_tokens), tuple(self.steps_per_second))
        if any(k[1:] != values for k in self._tables):
            self._tables.clear()
        key = (str(device), *values)
        if key not in self._tables:
            self._tables[key] = (
                torch.tensor(self.batch_tokens, dtype=torch.float64, device=device),
                torch.tensor(self.steps_per_second, dtype=torch.float64, device=device),
            )
        return self._tables[key]

    def steps_per_second_at(self, batch_tokens: int | torch.Tensor) -> float | torch.Tensor:
        """SPS(B) for an int (returns float) or an integer tensor of any shape (returns float64 tensor)."""
        if not isinstance(batch_tokens, torch.Tensor):
            return self._steps_per_second_scalar(float(int(batch_tokens)))
        xs, ys = self._table(batch_tokens.device)
        b = batch_tokens.to(torch.float64)
        if xs.numel() == 1:
            inside = ys[0].expand_as(b)
        else:
            hi = torch.searchsorted(xs, b.contiguous(), right=True).clamp(1, xs.numel() - 1)
            x0, x1, y0, y1 = xs[hi - 1], xs[hi], ys[hi - 1], ys[hi]
            weight = ((b - x0) / (x1 - x0)).clamp(0.0, 1.0)
            inside = torch.lerp(y0, y1, weight)  # exact at the measured points
        beyond = ys[-1] * xs[-1] / b.clamp_min(1.0)
        return torch.where(b > xs[-1], beyond, inside)

    def _steps_per_second_scalar(self, b: float) -> float:
        """The tensor path's arithmetic for one B in plain Python (called once per round: no tensor ops)."""
        xs, ys = self.batch_tokens, self.steps_per_second
        if b > xs[-1]:
            return ys[-1] * xs[-1] / max(b, 1.0)
        if len(xs) == 1:
            return ys[0]
        hi = min(max(bisect.bisect_right(xs, b), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[hi - 1], xs[hi], ys[hi - 1], ys[hi]
        weight = min(max((b - x0) / (x1 - x0), 0.0), 1.0)
        # torch.lerp's two-sided form: agrees with the tensor path to within one rounding
        return y0 + weight * (y1 - y0) if weight < 0.5 else y1 - (y1 - y0) * (1.0 - weight)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the points, the metadata and a format version."""
        payload = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return {"format_version": _STEP_CURVE_FORMAT, **payload}

    def save(self, path: str | os.PathLike) -> None:
        """Write the curve as JSON (atomically: temp file + os.replace)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> StepCurve:
        """A curve from `to_dict`'s JSON object; ValueError for anything else."""
        if not isinstance(payload, dict):
            raise ValueError(f"A step curve is a JSON object, got {type(payload).__name__}.")
        version = payload.get("format_version", _STEP_CURVE_FORMAT)
        if version != _STEP_CURVE_FORMAT:
            raise ValueError(f"Step-curve format_version {version!r} is not {_STEP_CURVE_FORMAT}, the one this "
                             "release reads; profile the curve again with `hf-dspark profile`.")
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(payload) - known - {"format_version"}
        if unknown:
            logger.warning(f"Ignoring unknown step-curve fields: {sorted(unknown)}")
        if "batch_tokens" not in payload or "steps_per_second" not in payload:
            raise ValueError("A step curve needs 'batch_tokens' and 'steps_per_second'.")
        points = (payload["batch_tokens"], payload["steps_per_second"])
        if not all(isinstance(v, list) and all(_is_number(x) for x in v) for v in points):
            raise ValueError("A step curve's 'batch_tokens' and 'steps_per_second' must be lists of numbers.")
        threads = payload.get("threads")
        if threads is not None and not (isinstance(threads, int) and not isinstance(threads, bool)):
            raise ValueError(f"A step curve's 'threads' must be an integer or null, got {threads!r}.")
        return cls(**{k: v for k, v in payload.items() if k in known})

    @classmethod
    def load(cls, path: str | os.PathLike) -> StepCurve:
        """Read a curve written by `save`; ValueError naming `path` when it is not one."""
        try:
            with open(path, encoding="utf-8") as handle:
                return cls.from_dict(json.load(handle))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not a step-curve JSON file ({error}).") from error
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from error

    def plot(self, path: str | os.PathLike, title: str | None = None, drafter: bool = False) -> None:
        """Write a PNG of SPS(B) and of the token throughput B·SPS(B) (matplotlib Agg canvas, no pyplot); with
        `drafter`, label it as a drafter's cost curve (proposals per second and rows per second against rows R)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        x, calls, amount, kind = ("rows R", "proposals", "rows", "Drafter cost") if drafter else (
            "batch tokens B", "verification forwards", "batch tokens", "Step curve")
        fig = Figure(figsize=(6.4, 4.0))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        ax.plot(self.batch_tokens, self.steps_per_second, "o-", color="tab:blue", label=f"{calls} / s")
        ax.set_xlabel(x)
        ax.set_ylabel(f"{calls} / s", color="tab:blue")
        ax.set_xscale("log", base=2)
        twin = ax.twinx()
        per_second = [b * s for b, s in zip(self.batch_tokens, self.steps_per_second)]
        twin.plot(self.batch_tokens, per_second, "s--", color="tab:orange", label=f"{amount} / s")
        twin.set_ylabel(f"{amount} / s", color="tab:orange")
        meta = ", ".join(str(v) for v in (self.model, self.device, self.dtype) if v)
        threads = f", {self.threads} threads" if self.threads else ""
        ax.set_title(title or f"{kind}{': ' + meta if meta else ''}{threads}", fontsize=9)
        fig.tight_layout()
        fig.savefig(os.fspath(path), dpi=120)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_survival(survival: torch.Tensor) -> torch.Tensor:
    """Validate `[R, γ]` survival and return it with a running minimum along j (a no-op for a cumprod)."""
    if survival.dim() != 2:
        raise ValueError(f"survival must be [R, block_size], got shape {tuple(survival.shape)}.")
    if not survival.is_floating_point():
        survival = survival.to(torch.float32)
    if survival.shape[1] > 1 and bool((survival[:, 1:] > survival[:, :-1] + 1e-6).any()):
        raise ValueError("survival must be non-increasing along positions (a_{r,j} = prod_{i<=j} c_{r,i}).")
    if bool(torch.isnan(survival).any()):
        raise ValueError("survival contains NaN.")
    return survival.cummin(dim=-1).values if survival.shape[1] > 1 else survival
