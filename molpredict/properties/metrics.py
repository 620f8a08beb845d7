"""Metrics of predicted property quantiles: R^2 and MAE of the median, pinball loss, interval coverage and
quantile crossing (pure functions on arrays)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["r2_score", "mean_absolute_error", "pinball_score", "interval_coverage", "crossing_share",
           "property_metrics"]


def r2_score(y: np.ndarray, prediction: np.ndarray) -> float:
    """1 - SS_res / SS_tot of one property; nan (undefined) when the targets are constant, or fewer than two.

    Constant is tested on the targets themselves, not on SS_tot: the mean of equal floats can be off by a
    rounding error, which leaves SS_tot at ~1e-30 instead of 0 and R^2 at -1e29.
    """
    y, prediction = np.asarray(y, dtype=np.float64), np.asarray(prediction, dtype=np.float64)
    if y.size < 2 or np.ptp(y) <= 1e-12 * max(float(np.abs(y).max()), 1.0):
        return float("nan")
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - prediction) ** 2).sum()) / total


def mean_absolute_error(y: np.ndarray, prediction: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(y, dtype=np.float64) - np.asarray(prediction, dtype=np.float64))))


def pinball_score(y: np.ndarray, quantiles: np.ndarray, levels: Sequence[float]) -> float:
    """Mean pinball loss over spectra and levels; ``y`` (n,), ``quantiles`` (n, Q)."""
    r = np.asarray(y, dtype=np.float64)[:, None] - np.asarray(quantiles, dtype=np.float64)
    tau = np.asarray(levels, dtype=np.float64)[None, :]
    return float(np.mean(np.maximum(tau * r, (tau - 1.0) * r)))


def interval_coverage(y: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """Share of ``y`` inside [lower, upper]."""
    y = np.asarray(y, dtype=np.float64)
    return float(np.mean((y >= lower) & (y <= upper)))


def crossing_share(quantiles: np.ndarray) -> float:
    """Share of consecutive quantile pairs (q_k, q_k+1) with q_k > q_k+1; ``quantiles`` (n, Q), levels ascending."""
    F = np.asarray(quantiles, dtype=np.float64)
    if F.shape[-1] < 2 or F.size == 0:
        return 0.0
    return float(np.mean(F[..., :-1] > F[..., 1:]))


def property_metrics(y: np.ndarray, quantiles: np.ndarray, levels: Sequence[float]) -> dict[str, float]:
    """``r2``, ``mae`` (of the middle level), ``pinball``, ``coverage`` (outermost interval), ``crossing`` of one
    property: ``y`` (n,), ``quantiles`` (n, Q)."""
    middle = quantiles[:, quantiles.shape[1] // 2]
    return {"r2": r2_score(y, middle), "mae": mean_absolute_error(y, middle),
            "pinball": pinball_score(y, quantiles, levels),
            "coverage": interval_coverage(y, quantiles[:, 0], quantiles[:, -1]),
            "crossing": crossing_share(quantiles)}
