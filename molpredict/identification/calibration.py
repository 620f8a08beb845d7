"""Calibrated confidence: the probability that a query's rank-1 candidate is right, and how to check it.

A :class:`Calibrator` is a Platt-style logistic regression fitted on validation queries. Its features describe
how decided a ranking is, from the fused scores of the query's candidate set alone:

- the logit of the rank-1 candidate's softmax probability (fused scores at the fusion's temperature),
- the margin between the two best fused scores (0 with one candidate),
- log(number of candidates).

The metrics of a calibrated confidence are :func:`expected_calibration_error` (ECE, equal-width bins) and
:func:`confident_at_fdr` (how many queries can be reported while the estimated false discovery rate, the mean of
1 - p over the reported ones, stays within a bound).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from molpredict.identification.fusion import set_index, softmax_within_sets

__all__ = ["ranking_features", "ranking_features_flat", "Calibrator", "expected_calibration_error",
           "confident_at_fdr", "reliability_curve"]

FEATURES = ("top1_logit", "margin", "log_n_candidates")


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1.0 - 1e-12)
    return np.log(p) - np.log1p(-p)


def ranking_features(fused: np.ndarray, temperature: float) -> np.ndarray:
    """Calibration features of one candidate set's fused scores, ndarray of shape (3,) (see the module doc)."""
    return ranking_features_flat(np.asarray(fused, dtype=np.float64), np.array([0, len(fused)]), temperature)[0]


def ranking_features_flat(fused: np.ndarray, offsets: np.ndarray, temperature: float) -> np.ndarray:
    """Calibration features of every set of flat fused scores, ndarray of shape (n_sets, 3)."""
    fused = np.asarray(fused, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    which = set_index(offsets)
    p = softmax_within_sets(fused, offsets, temperature)
    top_p = np.maximum.reduceat(p, offsets[:-1])
    top = np.maximum.reduceat(fused, offsets[:-1])
    # the second best: mask one copy of the maximum per set
    first_max = np.zeros(len(fused), dtype=bool)
    is_max = fused == top[which]
    positions = np.flatnonzero(is_max)
    _, first = np.unique(which[positions], return_index=True)
    first_max[positions[first]] = True
    second = np.maximum.reduceat(np.where(first_max, -np.inf, fused), offsets[:-1])
    margin = np.where(sizes > 1, top - second, 0.0)
    return np.column_stack([_logit(top_p), margin, np.log(sizes)])


@dataclass
class Calibrator:
    """P(rank 1 is right) = sigmoid(w . features + b), fitted on validation queries.

    Attributes
    ----------
    coef : list of float
        One weight per feature in :data:`FEATURES`.
    intercept : float
    validation : dict
        ECE and counts on the queries it was fitted on (JSON-ready).
    """

    coef: list[float] = field(default_factory=lambda: [1.0, 0.0, 0.0])
    intercept: float = 0.0
    validation: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fit(cls, features: np.ndarray, correct: np.ndarray, c: float = 1.0) -> "Calibrator":
        """Logistic regression of ``correct`` (n_queries,) on ``features`` (n_queries, 3), L2 penalty 1/c."""
        from sklearn.linear_model import LogisticRegression

        features = np.asarray(features, dtype=np.float64)
        correct = np.asarray(correct, dtype=bool)
        if features.ndim != 2 or features.shape[1] != len(FEATURES) or len(features) != len(correct):
            raise ValueError(f"Calibrator.fit: features must be (n, {len(FEATURES)}) aligned with correct")
        if correct.all() or not correct.any():
            # one class only: a constant probability (the observed rate, kept away from 0 and 1)
            rate = (correct.sum() + 0.5) / (len(correct) + 1.0)
            cal = cls(coef=[0.0] * len(FEATURES), intercept=float(_logit(np.array([rate]))[0]))
        else:
            model = LogisticRegression(C=c, max_iter=1000).fit(features, correct)
            cal = cls(coef=[float(v) for v in model.coef_[0]], intercept=float(model.intercept_[0]))
        p = cal.predict(features)
        cal.validation = {"n_queries": int(len(correct)), "accuracy": float(correct.mean()),
                          "mean_probability": float(p.mean()),
                          "ece": expected_calibration_error(p, correct)}
        return cal

    def predict(self, features: np.ndarray) -> np.ndarray:
        """P(rank 1 is right) for features of shape (n_queries, 3) or (3,); same leading shape, float64."""
        features = np.asarray(features, dtype=np.float64)
        z = features @ np.asarray(self.coef, dtype=np.float64) + self.intercept
        return 1.0 / (1.0 + np.exp(-z))

    def to_dict(self) -> dict[str, Any]:
        return {"method": "platt", "features": list(FEATURES), "coef": list(self.coef),
                "intercept": float(self.intercept), "validation": self.validation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Calibrator":
        if data.get("method", "platt") != "platt" or list(data.get("features", FEATURES)) != list(FEATURES):
            raise ValueError(f"calibration: unsupported method/features {data.get('method')!r} "
                             f"{data.get('features')!r} (this molpredict reads platt on {', '.join(FEATURES)})")
        coef = [float(v) for v in data["coef"]]
        intercept = float(data["intercept"])
        if len(coef) != len(FEATURES) or not all(math.isfinite(v) for v in coef + [intercept]):
            raise ValueError("calibration: coef must be three finite numbers and intercept a finite number")
        return cls(coef=coef, intercept=intercept, validation=dict(data.get("validation", {})))


def expected_calibration_error(probability: np.ndarray, correct: np.ndarray, n_bins: int = 10) -> float:
    """ECE: sum over equal-width probability bins of (bin share) x |mean probability - accuracy|.

    Bins are [0, 0.1), [0.1, 0.2), ..., [0.9, 1.0] for ``n_bins`` 10 (the last one closed).
    """
    probability = np.asarray(probability, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if probability.size == 0:
        return math.nan
    bins = np.minimum((probability * n_bins).astype(np.int64), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        mask = bins == b
        if mask.any():
            total += mask.mean() * abs(probability[mask].mean() - correct[mask].mean())
    return float(total)


def reliability_curve(probability: np.ndarray, correct: np.ndarray, n_bins: int = 10) -> list[dict[str, float]]:
    """Per non-empty bin: its range, query count, mean probability and observed accuracy (for a diagram)."""
    probability = np.asarray(probability, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    bins = np.minimum((probability * n_bins).astype(np.int64), n_bins - 1)
    out = []
    for b in range(n_bins):
        mask = bins == b
        if mask.any():
            out.append({"lo": b / n_bins, "hi": (b + 1) / n_bins, "n": int(mask.sum()),
                        "mean_probability": float(probability[mask].mean()),
                        "accuracy": float(correct[mask].mean())})
    return out


def confident_at_fdr(probability: np.ndarray, max_fdr: float = 0.1) -> tuple[int, float]:
    """How many queries can be reported at an estimated FDR <= ``max_fdr``, and the probability threshold.

    Queries are taken by decreasing probability; the estimated FDR of the top j is mean(1 - p) over them. The
    answer is the largest j whose estimate is within the bound (0 and threshold 1.0 when none is).
    """
    p = np.sort(np.asarray(probability, dtype=np.float64))[::-1]
    if p.size == 0:
        return 0, 1.0
    fdr = np.cumsum(1.0 - p) / np.arange(1, p.size + 1)
    ok = np.flatnonzero(fdr <= max_fdr)
    if ok.size == 0:
        return 0, 1.0
    j = int(ok[-1]) + 1
    return j, float(p[j - 1])
