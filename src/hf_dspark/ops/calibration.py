"""Confidence-head calibration (docs/scheduling.md, section 8; paper §3.2 / Table 4).

The confidence head emits logits z_{n,k} (`confidence_logits`, `[N, γ]`); the scheduler consumes the survival
∏_{i≤k} σ(z_i / T_i). STS fits T_1..T_γ in order, each by a 1-D grid search minimising the expected calibration
error (ECE) of that cumulative product against the realised prefix survival (`survived[:, k]` = 1 iff positions
1..k were all accepted), earlier temperatures fixed. Dividing a logit by T > 0 is monotone, so the ranking of rows
at each position is unchanged (AUC of σ(z_k/T_k) is preserved). Pure functions apart from the file writers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers.utils import logging

from ..io_utils import write_json_atomic

logger = logging.get_logger(__name__)

_MAX_GRID_ELEMENTS = 1 << 22  # candidates × rows evaluated at once in fit_sts


def _as_float64(x: torch.Tensor | Any) -> torch.Tensor:
    return torch.as_tensor(x).detach().to(device="cpu", dtype=torch.float64)


def _batched_ece(pred: torch.Tensor, label: torch.Tensor, n_bins: int) -> torch.Tensor:
    """ECE of each row of pred `[G, N]` against label `[N]` or `[G, N]` (float64). Returns `[G]`.

    ECE = Σ_b (n_b / N)·|mean_b(pred) − mean_b(label)| = Σ_b |Σ_b pred − Σ_b label| / N, equal-width bins on [0, 1].
    """
    groups, count = pred.shape
    bins = (pred * n_bins).to(torch.long).clamp(0, n_bins - 1)
    index = (bins + n_bins * torch.arange(groups)[:, None]).reshape(-1)
    size = groups * n_bins
    sum_pred = torch.bincount(index, weights=pred.reshape(-1), minlength=size)
    sum_label = torch.bincount(index, weights=label.expand(groups, count).reshape(-1), minlength=size)
    return (sum_pred - sum_label).abs().reshape(groups, n_bins).sum(dim=-1) / count


def expected_calibration_error(pred: torch.Tensor, label: torch.Tensor, n_bins: int = 15) -> float:
    """ECE with `n_bins` equal-width bins: Σ_b (n_b/N)·|mean pred − mean label| in bin b.

    pred: any shape, probabilities in [0, 1]; label: same shape, binary or soft in [0, 1]. Returns a float.
    """
    pred, label = _as_float64(pred).reshape(-1), _as_float64(label).reshape(-1)
    if pred.shape != label.shape:
        raise ValueError(f"pred and label need the same number of elements, got {pred.numel()} and {label.numel()}.")
    if pred.numel() == 0:
        raise ValueError("expected_calibration_error needs at least one prediction.")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}.")
    return float(_batched_ece(pred[None], label, n_bins)[0])


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC-AUC by the Mann-Whitney U statistic with average ranks for tied scores.

    scores: any shape; labels: same shape, binary (bool or {0, 1}). Returns a float, NaN when one class is absent.
    """
    scores, labels = _as_float64(scores).reshape(-1), _as_float64(labels).reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(
            f"scores and labels need the same number of elements, got {scores.numel()}, {labels.numel()}."
        )
    if bool(((labels != 0) & (labels != 1)).any()):
        raise ValueError("roc_auc needs binary labels (0/1 or bool).")
    positive = labels.bool()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts  # ranks (1-based) of a tie group are starts+1 .. starts+counts
    average_rank = starts.to(torch.float64) + (counts.to(torch.float64) + 1.0) / 2.0
    rank_sum = average_rank[inverse][positive].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def default_temperature_grid() -> list[float]:
    """48 log-spaced temperatures in [0.05, 20] plus exactly 1.0."""
    grid = torch.logspace(math.log10(0.05), math.log10(20.0), 48, dtype=torch.float64).tolist()
    return sorted({*grid, 1.0})


def _check_pair(confidence_logits: torch.Tensor, survived: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits, labels = _as_float64(confidence_logits), _as_float64(survived)
    if logits.dim() != 2 or logits.shape != labels.shape or logits.shape[0] == 0:
        raise ValueError(
            f"confidence_logits and survived must both be [N, block_size] with N > 0, got {tuple(logits.shape)} "
            f"and {tuple(labels.shape)}."
        )
    if bool(((labels < 0) | (labels > 1)).any()) or bool(torch.isnan(logits).any()):
        raise ValueError("survived must lie in [0, 1] and confidence_logits must be free of NaN.")
    return logits, labels


def fit_sts(
    confidence_logits: torch.Tensor,
    survived: torch.Tensor,
    grid: list[float] | torch.Tensor | None = None,
    n_bins: int = 15,
) -> list[float]:
    """STS (docs/scheduling.md, section 8): T_k = argmin_T ECE(∏_{i<k} σ(z_i/T_i)·σ(z_k/T), s_k).

    confidence_logits: `[N, γ]` raw head logits z; survived: `[N, γ]` realised prefix survival (bool or float;
    survived[:, k] = every position ≤ k accepted, so rows whose prefix died earlier count with label 0).
    grid: candidate temperatures (default `default_temperature_grid()`). Positions are fitted in order 1..γ with
    earlier temperatures fixed; ECE ties go to the temperature closest to 1. Returns [T_1, ..., T_γ].
    """
    logits, labels = _check_pair(confidence_logits, survived)
    temps = _as_float64(default_temperature_grid() if grid is None else grid).reshape(-1)
    if temps.numel() == 0 or bool(~torch.isfinite(temps).all()) or bool((temps <= 0).any()):
        raise ValueError("The temperature grid must be non-empty, finite and > 0.")
    temps = temps[torch.argsort(temps.log().abs(), stable=True)]  # first argmin = closest to T = 1
    rows, gamma = logits.shape
    chunk = max(1, _MAX_GRID_ELEMENTS // rows)
    prefix = torch.ones(rows, dtype=torch.float64)
    fitted: list[float] = []
    for k in range(gamma):
        errors = torch.cat(
            [
                _batched_ece(prefix * torch.sigmoid(logits[:, k] / part[:, None]), labels[:, k], n_bins)
                for part in temps.split(chunk)
            ]
        )
        best = float(temps[int(torch.argmin(errors))])
        fitted.append(best)
        prefix = prefix * torch.sigmoid(logits[:, k] / best)
    return fitted


def cumulative_survival(confidence_logits: torch.Tensor, temperatures: list[float] | torch.Tensor | None = None):
    """Eq. (7) with STS, accumulated: a_{n,k} = ∏_{i≤k} σ(z_{n,i}/T_i). `[N, γ]` -> `[N, γ]` float64."""
    logits = _as_float64(confidence_logits)
    temps = torch.ones(logits.shape[-1], dtype=torch.float64) if temperatures is None else _as_float64(temperatures)
    return torch.cumprod(torch.sigmoid(logits / temps), dim=-1)


def conditional_acceptance(survived: torch.Tensor) -> list[float]:
    """q_k = P(draft k accepted | drafts 1..k−1 accepted) ≈ (Σ_n s_{n,k} + ½) / (Σ_n s_{n,k−1} + 1) (s_{n,0} = 1).

    survived: `[N, γ]` realised prefix survival of fully verified rounds. Returns γ floats in (0, 1): the
    Jeffreys-smoothed rate, so a position reached by few rounds is never estimated as exactly 0 or 1 (a prior of
    0 would stop the "auto" policy from ever verifying it); a position no round reached inherits the rate
    before it.
    """
    labels = _as_float64(survived)
    if labels.dim() != 2 or labels.shape[0] == 0:
        raise ValueError(f"survived must be a non-empty [N, γ] tensor, got shape {tuple(labels.shape)}.")
    reached = torch.cat([torch.full((1,), float(labels.shape[0]), dtype=torch.float64), labels.sum(dim=0)[:-1]])
    kept, rates = labels.sum(dim=0), []
    for k in range(labels.shape[1]):
        rates.append(float((kept[k] + 0.5) / (reached[k] + 1.0)) if reached[k] > 0 else rates[-1])
    return rates


@dataclass
class CalibrationReport:
    """Per-position ECE of the survival before (T = 1) and after STS, AUC, the fitted temperatures and the
    measured conditional acceptance per position (`conditional_acceptance`; None in reports written before it)."""

    temperatures: list[float]
    ece_before: list[float]
    ece_after: list[float]
    auc_before: list[float]
    auc_after: list[float]
    n_samples: int
    n_bins: int = 15
    mode: str | None = None
    acceptance: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN AUCs become None)."""

        def clean(value: Any) -> Any:
            if isinstance(value, float) and math.isnan(value):
                return None
            return [clean(v) for v in value] if isinstance(value, list) else value

        return {key: clean(value) for key, value in asdict(self).items()}

    def save(self, path: str | os.PathLike) -> None:
        """Write the report as JSON (atomically: temp file + os.replace)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CalibrationReport:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
        for key in ("auc_before", "auc_after"):
            payload[key] = [float("nan") if v is None else v for v in payload[key]]
        return cls(**payload)


def evaluate_calibration(
    confidence_logits: torch.Tensor,
    survived: torch.Tensor,
    temperatures: list[float],
    n_bins: int = 15,
    mode: str | None = None,
) -> CalibrationReport:
    """Per-position ECE and AUC of ∏_{i≤k} σ(z_i/T_i) against survived[:, k], at T = 1 and at `temperatures`.

    confidence_logits, survived: `[N, γ]`; temperatures: γ floats. AUC uses survived ≥ 0.5 as the binary label.
    """
    logits, labels = _check_pair(confidence_logits, survived)
    if len(temperatures) != logits.shape[1]:
        raise ValueError(f"Need {logits.shape[1]} temperatures, got {len(temperatures)}.")
    before, after = cumulative_survival(logits), cumulative_survival(logits, temperatures)
    binary = labels >= 0.5
    columns = range(logits.shape[1])
    return CalibrationReport(
        temperatures=[float(t) for t in temperatures],
        ece_before=[expected_calibration_error(before[:, k], labels[:, k], n_bins) for k in columns],
        ece_after=[expected_calibration_error(after[:, k], labels[:, k], n_bins) for k in columns],
        auc_before=[roc_auc(before[:, k], binary[:, k]) for k in columns],
        auc_after=[roc_auc(after[:, k], binary[:, k]) for k in columns],
        n_samples=int(logits.shape[0]),
        n_bins=n_bins,
        mode=mode,
        acceptance=conditional_acceptance(labels),
    )


def _bin_curve(pred: torch.Tensor, label: torch.Tensor, n_bins: int) -> tuple[list[float], list[float], list[int]]:
    bins = (pred * n_bins).to(torch.long).clamp(0, n_bins - 1)
    counts = torch.bincount(bins, minlength=n_bins)
    mean_pred = torch.bincount(bins, weights=pred, minlength=n_bins) / counts.clamp_min(1)
    mean_label = torch.bincount(bins, weights=label, minlength=n_bins) / counts.clamp_min(1)
    keep = counts > 0
    return mean_pred[keep].tolist(), mean_label[keep].tolist(), counts.tolist()


def reliability_diagram(
    pred_before: torch.Tensor,
    pred_after: torch.Tensor,
    labels: torch.Tensor,
    path: str | os.PathLike,
    title: str | None = None,
    n_bins: int = 15,
) -> None:
    """Write a PNG reliability diagram (bin mean prediction vs. observed rate) before/after calibration.

    pred_before, pred_after, labels: same shape (e.g. `[N, γ]`), flattened and pooled over positions.
    The right panel shows how many predictions fall in each bin.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    label = _as_float64(labels).reshape(-1)
    fig = Figure(figsize=(9.0, 4.0))
    FigureCanvasAgg(fig)
    curve_ax, count_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    curve_ax.plot([0, 1], [0, 1], ":", color="gray", label="perfect")
    edges = [(b + 0.5) / n_bins for b in range(n_bins)]
    for name, pred, style in (("before", pred_before, "o-"), ("after", pred_after, "s-")):
        pred = _as_float64(pred).reshape(-1)
        mean_pred, mean_label, counts = _bin_curve(pred, label, n_bins)
        ece = expected_calibration_error(pred, label, n_bins)
        curve_ax.plot(mean_pred, mean_label, style, label=f"{name} (ECE {100 * ece:.1f}%)")
        count_ax.step(edges, counts, where="mid", label=name)
    curve_ax.set(xlabel="predicted survival", ylabel="observed survival", xlim=(0, 1), ylim=(0, 1))
    curve_ax.legend(loc="upper left", fontsize=8)
    count_ax.set(xlabel="predicted survival", ylabel="count", yscale="log", xlim=(0, 1))
    count_ax.legend(fontsize=8)
    fig.suptitle(title or "Confidence calibration", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=120)
