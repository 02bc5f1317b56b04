"""The drafter's cost curve: time a drafting round's drafter work against rows R (docs/scheduling.md).

`profile_draft_curve` measures, at each row count R, the context update with `DRAFT_COMMITTED` committed tokens per
row followed by one greedy `propose` at the drafter's γ over a `context`-token cache, as a drafting round runs them,
and returns a `StepCurve` of rounds per second. Curves are cached per (drafter architecture, device, dtype, threads)
under `draft_curves/` of the step-curve cache root (`load_or_profile_draft_curve`); the shipped ones sit beside
the step curves as `draft__<architecture>__<device>__<dtype>__t<threads>.json`. Trained and untrained drafters of
one architecture share a curve: the cost does not depend on the weights.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..hardware import processor_signature
from ..model.heads import get_head
from .step_curve import StepCurve
from .target_steps import (
    _STATISTICS,
    _current_curve,
    cache_root,
    device_sync,
    pinned_threads,
    shipped_curves_dir,
    step_curve_filename,
)

logger = logging.get_logger(__name__)

DEFAULT_DRAFT_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Version of the drafter's profiled round. 3: the context update of `DRAFT_COMMITTED` committed tokens per row
# before `propose`, as a drafting round runs them (version 2 timed `propose` alone: ≈ 20% under a real round).
DRAFT_PROFILER_VERSION = 3
DRAFT_COMMITTED = 2


def drafter_architecture(drafter) -> str:
    """A name for the drafter's cost: `dspark-<layers>L-<hidden>d-<head><rank>-g<γ>-v<draft vocab>`."""
    config = drafter.config
    vocab = getattr(config, "draft_vocab_size", None) or config.vocab_size
    head = f"{config.head_type}{config.markov_rank if get_head(config.head_type).module is not None else ''}"
    return f"dspark-{config.num_hidden_layers}L-{config.hidden_size}d-{head}-g{config.block_size}-v{vocab}"


def draft_curve_path(architecture: str, device: str, dtype: str, threads: int | None = None,
                     shipped: bool = False, processor: str | None = None) -> Path:
    """Where the user cache (or, with `shipped`, the package's folder for this kind of processor, or `processor`)
    keeps the drafter's cost curve."""
    threads = torch.get_num_threads() if threads is None else threads
    name = "draft__" + step_curve_filename(architecture, device, dtype, threads)
    return shipped_curves_dir(device, processor) / name if shipped else cache_root() / "draft_curves" / name


def _context_features(drafter, rows: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tapped features `[rows, tokens, n_taps·d]` and an all-valid mask, as `extend_context` takes them."""
    generator = torch.Generator().manual_seed(seed + rows)
    width = drafter.config.num_taps * drafter.config.hidden_size
    ref = drafter.fc.weight
    features = torch.randn(rows, tokens, width, generator=generator).to(device=ref.device, dtype=ref.dtype)
    return features, torch.ones(rows, tokens, dtype=torch.bool, device=ref.device)


def _context_cache(drafter, rows: int, context: int, seed: int, room: int = 0):
    """A draft cache of `rows` rows holding `context` random context tokens each, with `room` more slots."""
    cache = drafter.init_cache(rows, capacity=context + room + 2 * drafter.config.block_size)
    drafter.extend_context(cache, *_context_features(drafter, rows, context, seed))
    return cache


def time_draft_round(drafter, cache, anchors: torch.Tensor, committed: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Seconds of one drafting round's drafter work: the context update with the last round's committed tokens
    (`committed`: features `[R, n, ·]` and valid `[R, n]`), then a greedy `propose` from `anchors` `[R]`."""
    device = anchors.device
    device_sync(device)
    start = time.perf_counter()
    drafter.extend_context(cache, *committed)
    drafter.propose(anchors, cache, do_sample=False)
    device_sync(device)  # the draft curve is compared with the synchronised step curve
    return time.perf_counter() - start


def profile_draft_curve(
    drafter,
    rows: Sequence[int] = DEFAULT_DRAFT_ROWS,
    context: int = 200,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = None,
    progress: bool = True,
    seed: int = 0,
    statistic: str = "median",
) -> StepCurve:
    """Measure the drafter's rounds per second at each row count R in `rows`: the context update with
    `DRAFT_COMMITTED` committed tokens per row, then a greedy `propose` (its γ), as a drafting round runs them.

    Each row starts with `context` committed tokens in its cache (random features); sweeps are interleaved over R
    like `profile_step_curve`. Returns a `StepCurve` whose `batch_tokens` are row counts.
    """
    points = sorted({int(r) for r in rows})
    if not points or points[0] < 1 or repeats < 1 or warmup < 0 or context < 1:
        raise ValueError("rows must be positive integers, repeats and context >= 1, warmup >= 0.")
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(_STATISTICS)}, got {statistic!r}.")
    samples: dict[int, list[float]] = {r: [] for r in points}
    device = drafter.fc.weight.device
    vocab = int(drafter.config.vocab_size)
    with pinned_threads(threads), torch.inference_mode():
        used_threads = torch.get_num_threads()
        room = DRAFT_COMMITTED * (warmup + repeats)
        caches = {r: _context_cache(drafter, r, context, seed, room) for r in points}
        committed = {r: _context_features(drafter, r, DRAFT_COMMITTED, seed + 1) for r in points}
        bar = tqdm(total=(warmup + repeats) * len(points), desc="profiling the drafter's rounds", unit="call",
                   disable=not progress)
        for sweep in range(warmup + repeats):
            for r in points:
                anchors = torch.randint(min(20, vocab - 1), vocab, (r,), generator=torch.Generator().manual_seed(r))
                elapsed = time_draft_round(drafter, caches[r], anchors.to(device), committed[r])
                if sweep >= warmup:
                    samples[r].append(elapsed)
                bar.update(1)
        bar.close()
    return StepCurve(
        batch_tokens=points,
        steps_per_second=[1.0 / max(_STATISTICS[statistic](samples[r]), 1e-9) for r in points],
        model=drafter_architecture(drafter), device=device.type, dtype=str(drafter.fc.weight.dtype).removeprefix(
            "torch."), threads=used_threads, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        profiler=DRAFT_PROFILER_VERSION, processor=processor_signature(device),
    )


def load_or_profile_draft_curve(drafter, threads: int | None = None, progress: bool = True,
                                **profile_kwargs) -> StepCurve | None:
    """The drafter's cost curve: user cache, then shipped, else profiled once and cached.

    A drafter that is no `torch.nn.Module` with a context projection (the oracle, prompt lookup) returns its own
    `draft_curve` attribute (None: its cost is negligible).
    """
    if not hasattr(drafter, "fc") or not hasattr(drafter, "parameters"):
        return getattr(drafter, "draft_curve", None)
    threads = torch.get_num_threads() if threads is None else int(threads)
    weight = drafter.fc.weight
    key = (drafter_architecture(drafter), weight.device.type, str(weight.dtype).removeprefix("torch."), threads)
    curve = _current_curve((draft_curve_path(*key), draft_curve_path(*key, shipped=True)), "draft curve", key[1],
                           DRAFT_PROFILER_VERSION)
    if curve is not None:
        return curve
    path = draft_curve_path(*key)
    logger.warning(f"No cost curve for drafter {key[0]} ({key[1]}, {key[2]}, {threads} threads): profiling its "
                   f"rounds once (saved to {path}).")
    curve = profile_draft_curve(drafter, threads=threads, progress=progress, **profile_kwargs)
    curve.save(path)
    return curve
