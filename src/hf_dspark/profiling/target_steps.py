"""SPS(B) profiling: time the target's verification forward across batch-token counts (docs/scheduling.md, section 7).

`profile_step_curve(target)` measures what one round of the DSpark loop costs on the target: a forward over new
tokens on top of a `DynamicCache` prefilled to `cache_length` tokens per row, with a 2D attention mask, explicit
`position_ids`, a few tapped hidden states (`output_hidden_states=[...]`) and logits for every position, exactly
the call `RaggedTargetCache.forward` makes. The result is a `StepCurve` (median steps per second per B).

How B tokens are laid out: `rows = min(B, max_rows)` rows of `ceil(B / rows)` slots, exactly B of them valid and the
rest masked padding, like the loop's ragged `[A, 1 + max ℓ]` block (`max_rows=1`: one row with B tokens).

Curves are cached per (model, device, dtype, threads) as JSON under `~/.cache/hf_dspark/step_curves/` (root:
`$HF_DSPARK_CACHE`) and trusted only on the kind of processor that measured them (`processor_signature`).
`load_or_profile_step_curve` looks in that cache, then among the package's curves for this kind of processor
(`resources/step_curves/<processor>/`, e.g. `x86_64--AVX2/`), and only then profiles, once, with a progress bar.

The drafter's cost curve is profiled the same way, in `profiling/draft_steps.py`.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.cache_utils import DynamicCache
from transformers.utils import logging

from ..hardware import processor_signature
from ..target.attention import packed_gqa_attention
from ..target.packed_linear import PackedLinears, linear_packs_for, packed_linears, verification_kernel
from .step_curve import StepCurve

logger = logging.get_logger(__name__)

# Dense below 8 (batch-1 rounds; fp32 CPU curves are jagged there); up to 32 rows × (1 + γ=7) so C = 32 is measured.
DEFAULT_BATCH_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SHIPPED_STEP_CURVES = Path(__file__).resolve().parents[1] / "resources" / "step_curves"
CACHE_ENV = "HF_DSPARK_CACHE"
_STATISTICS = {"median": statistics.median, "min": min}
# Version of the profiled code path (the verification forward and `propose`). Bump it when a change makes them
# faster or slower: cached and shipped curves of another version are then ignored and measured again.
PROFILER_VERSION = 2


# ---------------------------------------------------------------------------------------------- naming / paths
def model_name(target) -> str:
    """A stable name for `target`: its `name_or_path`, else `<model_type>-<layers>L-<hidden>d` (random models)."""
    name = getattr(target, "name_or_path", None) or getattr(target.config, "_name_or_path", None)
    if name:
        return str(name)
    config = target.config
    return f"{config.model_type}-{config.num_hidden_layers}L-{config.hidden_size}d"


def target_device(target) -> str:
    """Device type of the target's parameters ("cpu", "cuda", ...)."""
    return next(target.parameters()).device.type


def target_dtype(target) -> str:
    """dtype of the target's parameters without the "torch." prefix ("float32", "bfloat16", ...)."""
    return str(next(target.parameters()).dtype).removeprefix("torch.")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", text.strip("/")) or "model"


def step_curve_filename(model: str, device: str, dtype: str, threads: int) -> str:
    """`<model>__<device>__<dtype>__t<threads>.json`, with path separators in the model name replaced by `--`."""
    return f"{_slug(model)}__{_slug(device)}__{_slug(dtype)}__t{int(threads)}.json"


def cache_root() -> Path:
    """`$HF_DSPARK_CACHE` if set, else `~/.cache/hf_dspark`."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "hf_dspark"


def step_curve_path(model: str, device: str, dtype: str, threads: int | None = None) -> Path:
    """Where the user cache keeps the curve for (model, device, dtype, threads); threads default: torch's now."""
    threads = torch.get_num_threads() if threads is None else threads
    return cache_root() / "step_curves" / step_curve_filename(model, device, dtype, threads)


def shipped_curves_dir(device: str = "cpu", processor: str | None = None) -> Path:
    """The package's folder of curves measured on one kind of processor (default: this one, `processor_signature`),
    e.g. `resources/step_curves/x86_64--AVX2/`."""
    return SHIPPED_STEP_CURVES / _slug(processor or processor_signature(device))


def shipped_step_curve_path(model: str, device: str, dtype: str, threads: int, processor: str | None = None) -> Path:
    """Path a curve shipped with the package would have for this kind of processor (`shipped_curves_dir`); matched
    on the model's basename so that "HuggingFaceTB/SmolLM2-135M-Instruct" and the embedded "SmolLM2-135M-Instruct"
    share one file."""
    name = step_curve_filename(model.rstrip("/").rsplit("/", 1)[-1], device, dtype, threads)
    return shipped_curves_dir(device, processor) / name


# ---------------------------------------------------------------------------------------------- measurement
@contextmanager
def pinned_threads(threads: int | None):
    """Run the block with `torch.set_num_threads(threads)` (no-op for None) and restore the previous count."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def default_taps(num_layers: int, count: int = 3) -> list[int]:
    """`count` evenly spaced `output_hidden_states` indices in 1..num_layers (a drafter's usual taps)."""
    count = max(1, min(count, num_layers))
    return sorted({1 + round(i * (num_layers - 1) / max(count - 1, 1)) for i in range(count)})


def block_layout(batch_tokens: int, max_rows: int) -> tuple[int, int]:
    """(rows, slots per row) used to place `batch_tokens` tokens: rows = min(B, max_rows), slots = ceil(B/rows)."""
    rows = max(1, min(batch_tokens, max_rows))
    return rows, math.ceil(batch_tokens / rows)


def _prefill(target, rows: int, cache_length: int, seed: int) -> DynamicCache:
    generator = torch.Generator().manual_seed(seed)
    device = next(target.parameters()).device
    vocab = int(target.config.vocab_size)
    ids = torch.randint(min(20, vocab - 1), vocab, (rows, cache_length), generator=generator).to(device)
    from ..target.ragged_cache import new_target_cache  # the loop's layout: full layers, windows as masks

    cache = new_target_cache(target)
    target(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def _select_rows(target, cache: DynamicCache, rows: int) -> DynamicCache:
    """A fresh cache holding copies of the first `rows` rows of `cache`."""
    out = DynamicCache()  # full layers, like `_prefill`'s
    for index, layer in enumerate(cache.layers):
        out.update(layer.keys[:rows], layer.values[:rows], index)
    return out


def _verification_inputs(target, batch_tokens: int, cache_length: int, max_rows: int, seed: int) -> dict:
    """The loop's forward arguments for `batch_tokens` tokens laid out by `block_layout` (valid slots spread
    evenly over the rows, the rest masked like ragged padding)."""
    rows, slots = block_layout(batch_tokens, max_rows)
    device = next(target.parameters()).device
    generator = torch.Generator().manual_seed(seed + batch_tokens)
    vocab = int(target.config.vocab_size)
    ids = torch.randint(min(20, vocab - 1), vocab, (rows, slots), generator=generator).to(device)
    valid = (torch.arange(rows * slots, device=device) < batch_tokens).reshape(slots, rows).T
    mask = torch.cat([torch.ones(rows, cache_length, dtype=torch.long, device=device), valid.long()], dim=1)
    positions = cache_length + torch.arange(slots, device=device)[None, :].expand(rows, -1)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def device_sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA launches are asynchronous; timing without this measures the
    launch, not the work). A no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_forward(target, cache: DynamicCache, inputs: dict, taps: list[int], packs: PackedLinears | None = None
                  ) -> float:
    """Seconds of one verification forward on `cache` (the appended slots are cropped off again)."""
    device = inputs["input_ids"].device
    device_sync(device)
    start = time.perf_counter()
    single = inputs["input_ids"].numel() == 1  # as the loop's forward (target_cache): one token skips the swap
    with packed_gqa_attention(target), packed_linears(None if single else packs):
        out = target(**inputs, cache=cache, use_cache=True, output_hidden_states=taps, logits_to_keep=0)
    out.logits.float()  # the loop converts verification logits to fp32
    device_sync(device)
    elapsed = time.perf_counter() - start
    cache.crop(-inputs["input_ids"].shape[1])
    return elapsed


def profile_step_curve(
    target,
    batch_tokens: Sequence[int] = DEFAULT_BATCH_TOKENS,
    rows: int = 8,
    cache_length: int = 200,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = None,
    taps: Sequence[int] | None = None,
    progress: bool = True,
    seed: int = 0,
    statistic: str = "median",
    packs: PackedLinears | None = None,
) -> StepCurve:
    """Measure SPS(B) of `target`'s verification forward at each B in `batch_tokens` (positive ints).

    rows: the most rows the B tokens are spread over (`block_layout`); cache_length: tokens already in each row's
    KV cache; repeats: timed sweeps over all B (interleaved, so a burst of load on a shared machine hits every B
    alike); warmup: untimed sweeps first; threads: torch threads pinned while profiling (None: keep the current
    count, which is recorded); taps: hidden-state indices requested (default 3 evenly spaced layers); statistic:
    "median" (default) or "min" of the timed forwards per B ("min" estimates the uncontended cost on a machine
    shared with other jobs); packs: the target's packed linear weights, as verification uses them
    (`generation.packed_linear`; None: unpacked). Returns a `StepCurve` with model/device/dtype/threads/kernel set.
    """
    points = sorted({int(b) for b in batch_tokens})
    if not points or points[0] < 1:
        raise ValueError(f"batch_tokens must be positive integers, got {list(batch_tokens)}.")
    if rows < 1 or cache_length < 1 or repeats < 1 or warmup < 0:
        raise ValueError("rows, cache_length and repeats must be >= 1 and warmup >= 0.")
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(_STATISTICS)}, got {statistic!r}.")
    taps = list(taps) if taps is not None else default_taps(int(target.config.num_hidden_layers))
    max_rows = min(rows, points[-1])
    samples: dict[int, list[float]] = {b: [] for b in points}
    with pinned_threads(threads), torch.inference_mode():
        used_threads = torch.get_num_threads()
        cache = _prefill(target, max_rows, cache_length, seed)
        inputs = {b: _verification_inputs(target, b, cache_length, max_rows, seed) for b in points}
        bar = tqdm(total=(warmup + repeats) * len(points), desc=f"profiling SPS(B) of {model_name(target)}",
                   unit="fwd", disable=not progress)
        for sweep in range(warmup + repeats):
            for b in points:
                row_cache = _select_rows(target, cache, inputs[b]["input_ids"].shape[0])
                elapsed = _time_forward(target, row_cache, inputs[b], taps, packs)
                if sweep >= warmup:
                    samples[b].append(elapsed)
                bar.update(1)
                bar.set_postfix(B=b, ms=f"{1e3 * elapsed:.1f}")
        bar.close()
    return StepCurve(
        batch_tokens=points,
        steps_per_second=[1.0 / max(_STATISTICS[statistic](samples[b]), 1e-9) for b in points],
        model=model_name(target),
        device=target_device(target),
        dtype=target_dtype(target),
        threads=used_threads,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        profiler=PROFILER_VERSION, processor=processor_signature(next(target.parameters()).device),
        kernel=verification_kernel(packs) or None,
    )


# ---------------------------------------------------------------------------------------------- cache
def _current_curve(paths: Sequence[Path], what: str, device: str = "cpu", version: int = PROFILER_VERSION
                   ) -> StepCurve | None:
    """The first readable curve of `paths` measured by profiler `version` on this kind of processor (None:
    profile it). Unreadable curves, curves of an older or newer profiler and curves measured on another kind of
    processor (`processor_signature`) are skipped with a warning naming the file; a curve that does not say where
    it was measured (written before curves recorded it) is trusted."""
    here = processor_signature(device)
    for path in paths:
        if not path.is_file():
            continue
        try:
            curve = StepCurve.load(path)
        except (OSError, ValueError, TypeError) as err:
            logger.warning(f"Ignoring unreadable {what} {path}: {err}")
            continue
        if curve.profiler != version:
            logger.warning(f"Ignoring {what} {path}: measured by profiler version {curve.profiler}, this hf-dspark "
                           f"measures with version {version} (its costs may have changed).")
        elif curve.processor is not None and curve.processor != here:
            logger.warning(f"Ignoring {what} {path}: measured on a {curve.processor} processor, this one is {here} "
                           "(costs differ between kinds of processor).")
        else:
            return curve
    return None


def step_curve_key(target, threads: int | None = None, packs: PackedLinears | None = None
                   ) -> tuple[str, str, str, int]:
    """(model, device, dtype, threads) the step curve of `target` is kept under (`step_curve_path`); the dtype reads
    "<dtype>-onednn" when verification runs on the packed linear weights `packs`. threads default: torch's now."""
    threads = torch.get_num_threads() if threads is None else int(threads)
    kernel = verification_kernel(packs)
    dtype = target_dtype(target) + (f"-{kernel}" if kernel else "")
    return model_name(target), target_device(target), dtype, threads


def load_or_profile_step_curve(target, threads: int | None = None, progress: bool = True,
                               packed_weights: bool | None = None, **profile_kwargs) -> StepCurve:
    """The step curve for (model, device, dtype, threads) of `target`, profiling it once if none exists.

    Looks in the user cache (`step_curve_path`), then in the package's curves for this kind of processor
    (`shipped_step_curve_path`), else runs `profile_step_curve(target, threads=threads, **profile_kwargs)` with a
    progress bar and saves the result atomically to the user cache.
    threads: the thread count the curve must match (default: torch's current count); packed_weights: whether
    verification packs the target's linear weights (`generation.packed_linear.linear_packs_for`: None decides as
    `generate` does); a packed curve is kept under the dtype "<dtype>-onednn".
    """
    threads = torch.get_num_threads() if threads is None else int(threads)
    packs = linear_packs_for(target, packed_weights)
    key = step_curve_key(target, threads, packs)
    curve = _current_curve((step_curve_path(*key), shipped_step_curve_path(*key)), "step curve", key[1])
    if curve is not None:
        return curve
    path = step_curve_path(*key)
    logger.warning(
        f"No step curve for {key[0]} ({key[1]}, {key[2]}, {threads} threads): profiling the target's verification "
        f"forward once (saved to {path}; run `hf-dspark profile` to redo it)."
    )
    curve = profile_step_curve(target, threads=threads, progress=progress, packs=packs, **profile_kwargs)
    curve.save(path)
    return curve
