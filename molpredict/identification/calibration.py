"""Calibrated confidence: the probability that a query's rank-1 candidate is right, and how to check it.

A :class:`Calibrator` maps a feature row of a query to P(rank 1 is right) in two stages: a linear score
``z = w . x + b`` from a logistic regression on the features, then a monotone map of ``z``:

- ``platt``: ``sigmoid(z)``;
- ``beta``: beta calibration of ``q = sigmoid(z)``: ``sigmoid(a log q - b log(1 - q) + c)`` (a logistic regression
  on the features ``log q`` and ``log(1 - q)``; Kull et al., 2017);
- ``isotonic``: a non-decreasing step function of ``z`` (isotonic regression, linear between its breakpoints).

The state is numbers only (coefficients, the beta parameters, the isotonic breakpoints), kept in the bundle's JSON.

Features (:data:`ALL_FEATURES`; a calibrator names the columns it reads, so the set can grow). From the fused
scores of the candidate set alone (:func:`ranking_features_flat`):

- ``top1_logit``: the logit of the rank-1 candidate's softmax probability (fused scores at the fusion's
  temperature); ``top1_log_p`` / ``top1_log_1mp``: log p and log(1 - p) of it;
- ``margin``, ``margin3``, ``margin5``: the best fused score minus the 2nd, 3rd, 5th best (the last one in a
  smaller set; 0 with one candidate): how close the runner-up isomers score;
- ``entropy10``: the entropy of the softmax renormalised over the ten best candidates;
- ``log_n_candidates``: log(number of candidates).

Supplied by the caller per query (``extra``), from the other terms of the rank-1 candidate:

- ``rank1_known``: 1 when the rank-1 candidate is itself a structure the bundle's prior knows (its top
  similarity to the prior's reference structures, the training structures by default, is 1), else 0;
- ``rank1_prior``: the rank-1 candidate's raw prior score.

Fitting is by structure: spectra of one structure are not independent evidence, so each structure is weighted
once (:func:`structure_weights`: 1 / its number of queries) and out-of-fold data come from folds that never split
a structure (:func:`grouped_folds`).

The metrics of a calibrated confidence are :func:`expected_calibration_error` (ECE, equal-width bins; optionally
weighted, e.g. per structure), :func:`log_loss` and :func:`confident_at_fdr` (how many queries can be reported
while the estimated false discovery rate, the mean of 1 - p over the reported ones, stays within a bound).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from molpredict.identification.fusion import set_index, softmax_within_sets

__all__ = ["FEATURES", "ALL_FEATURES", "EXTRA_FEATURES", "METHODS", "ranking_features", "ranking_features_flat",
           "top_index_flat", "grouped_folds", "structure_weights", "Calibrator", "expected_calibration_error",
           "log_loss", "confident_at_fdr", "reliability_curve"]

#: the features of the original Platt calibrator (bundles without a ``features`` list read these)
FEATURES = ("top1_logit", "margin", "log_n_candidates")
#: features computed from the fused scores alone
SCORE_FEATURES = ("top1_logit", "top1_log_p", "top1_log_1mp", "margin", "margin3", "margin5", "entropy10",
                  "log_n_candidates")
#: features the caller supplies (``extra``), from the rank-1 candidate's other terms
EXTRA_FEATURES = ("rank1_known", "rank1_prior")
ALL_FEATURES = SCORE_FEATURES + EXTRA_FEATURES
METHODS = ("platt", "beta", "isotonic")
#: the range fitted calibrators keep their probabilities in: a finite validation set supports neither 0 nor 1
#: (an estimated FDR of exactly 0), and the output column would print them as certainties
PROBABILITY_RANGE = (1e-3, 1.0 - 1e-3)

_EPS = 1e-12


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp overflow is a probability of 0, as it should be
        return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


def top_index_flat(fused: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The flat position of each set's rank-1 candidate (the first of tied maxima), ndarray (n_sets,), int64."""
    order = _order_within_sets(np.asarray(fused, dtype=np.float64), np.asarray(offsets, dtype=np.int64))
    return order[np.asarray(offsets, dtype=np.int64)[:-1]]


def _order_within_sets(fused: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Flat positions sorted by set, then by decreasing score (stable: ties keep their order)."""
    return np.lexsort((-fused, set_index(offsets)))


def ranking_features(fused: np.ndarray, temperature: float, names: Sequence[str] = FEATURES,
                     extra: Mapping[str, float] | None = None) -> np.ndarray:
    """Calibration features ``names`` of one candidate set's fused scores, ndarray of shape (len(names),)."""
    fused = np.asarray(fused, dtype=np.float64)
    flat_extra = {k: np.array([v], dtype=np.float64) for k, v in (extra or {}).items()}
    return ranking_features_flat(fused, np.array([0, len(fused)]), temperature, names, flat_extra)[0]


def ranking_features_flat(fused: np.ndarray, offsets: np.ndarray, temperature: float,
                          names: Sequence[str] = FEATURES, extra: Mapping[str, np.ndarray] | None = None
                          ) -> np.ndarray:
    """Calibration features of every set of flat fused scores.

    Parameters
    ----------
    fused : ndarray of shape (n_total,)
    offsets : ndarray of shape (n_sets + 1,)
        Set ``i`` is ``fused[offsets[i]:offsets[i+1]]`` (not empty).
    temperature : float
        The fusion's softmax temperature.
    names : sequence of str
        Columns to return, from :data:`ALL_FEATURES`.
    extra : mapping, optional
        Name -> ndarray of shape (n_sets,) for the :data:`EXTRA_FEATURES` among ``names``.

    Returns
    -------
    ndarray of shape (n_sets, len(names)), float64
    """
    fused = np.asarray(fused, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    extra = extra or {}
    unknown = [n for n in names if n not in ALL_FEATURES]
    if unknown:
        raise ValueError(f"calibration: unknown features {unknown}; valid: {', '.join(ALL_FEATURES)}")
    sizes = np.diff(offsets)
    starts = offsets[:-1]
    order = _order_within_sets(fused, offsets)
    ranked = fused[order]
    p = softmax_within_sets(fused, offsets, temperature)[order]
    top = ranked[starts]
    top_p = p[starts]

    def kth(k: int) -> np.ndarray:  # the k-th best score (the last one in a smaller set)
        return ranked[starts + np.minimum(k - 1, sizes - 1)]

    columns: dict[str, np.ndarray] = {}
    for name in names:
        if name in columns:
            continue
        if name == "top1_logit":
            columns[name] = _logit(top_p)
        elif name == "top1_log_p":
            columns[name] = np.log(np.clip(top_p, _EPS, 1.0 - _EPS))
        elif name == "top1_log_1mp":
            columns[name] = np.log1p(-np.clip(top_p, _EPS, 1.0 - _EPS))
        elif name in ("margin", "margin3", "margin5"):
            k = {"margin": 2, "margin3": 3, "margin5": 5}[name]
            columns[name] = top - kth(k)
        elif name == "entropy10":
            within = np.arange(len(fused)) - np.repeat(starts, sizes)
            q = np.where(within < 10, p, 0.0)
            q = q / np.repeat(np.add.reduceat(q, starts), sizes)
            columns[name] = -np.add.reduceat(np.where(q > 0, q * np.log(np.maximum(q, _EPS)), 0.0), starts)
        elif name == "log_n_candidates":
            columns[name] = np.log(sizes.astype(np.float64))
        else:
            if name not in extra:
                raise ValueError(f"calibration: feature {name!r} must be supplied per query (extra)")
            values = np.asarray(extra[name], dtype=np.float64)
            if values.shape != (len(sizes),):
                raise ValueError(f"calibration: extra feature {name!r} must have shape ({len(sizes)},)")
            columns[name] = values
    if not names:
        return np.zeros((len(sizes), 0), dtype=np.float64)
    return np.column_stack([columns[n] for n in names])


def grouped_folds(groups: Sequence[str], n_folds: int, seed: int = 0) -> np.ndarray:
    """A fold number per query, drawn by structure: every query of one group lands in the same fold.

    Parameters
    ----------
    groups : sequence of str
        The group (true InChIKey first block) of each query.
    n_folds : int
    seed : int

    Returns
    -------
    ndarray of shape (n_queries,), int64 in [0, n_folds)
    """
    distinct = sorted(set(groups))
    order = np.random.default_rng(seed).permutation(len(distinct))
    fold_of = {distinct[i]: int(rank % n_folds) for rank, i in enumerate(order)}
    return np.array([fold_of[g] for g in groups], dtype=np.int64)


def structure_weights(groups: Sequence[str]) -> np.ndarray:
    """1 / (number of queries of the query's group) per query: each group weighs 1 in total.

    Returns
    -------
    ndarray of shape (n_queries,), float64
    """
    _, inverse, counts = np.unique(np.asarray(list(groups), dtype=object).astype(str), return_inverse=True,
                                   return_counts=True)
    return 1.0 / counts[inverse].astype(np.float64)


def _logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    """Weighted L2 logistic regression (penalty 1/(2c) against the summed weighted loss); (coef, intercept)."""
    from sklearn.linear_model import LogisticRegression

    if y.all() or not y.any():
        rate = (float(np.sum(w * y)) + 0.5) / (float(np.sum(w)) + 1.0)
        return np.zeros(x.shape[1]), float(_logit(np.array([rate]))[0])
    # Newton steps with a Cholesky-solved Hessian: a handful of features and thousands of queries, so each step is
    # cheap and ~5 reach the optimum L-BFGS needs ~25 iterations for (the same solution, 17x less CPU: training
    # fits ~180 of these when it compares the calibrators)
    model = LogisticRegression(C=c, max_iter=5000, tol=1e-8, solver="newton-cholesky").fit(x, y, sample_weight=w)
    return model.coef_[0].astype(np.float64), float(model.intercept_[0])


def _beta_inputs(z: np.ndarray) -> np.ndarray:
    """Columns log q and -log(1 - q) of q = sigmoid(z), computed stably."""
    z = np.asarray(z, dtype=np.float64)
    return np.column_stack([-np.logaddexp(0.0, -z), np.logaddexp(0.0, z)])


@dataclass
class Calibrator:
    """P(rank 1 is right) from a query's feature row (see the module doc), fitted on validation queries.

    Attributes
    ----------
    coef : list of float
        One weight per feature in ``features``.
    intercept : float
    features : list of str
        The feature columns it reads, in order (from :data:`ALL_FEATURES`).
    method : {"platt", "beta", "isotonic"}
    beta : list of float
        ``[a, b, c]`` of the beta map (``method == "beta"``).
    isotonic_x, isotonic_y : list of float
        Breakpoints of the isotonic map of the linear score (``method == "isotonic"``): increasing x,
        non-decreasing y; linear in between, constant outside.
    clip : list of float
        ``[lo, hi]``: probabilities are clipped into it (fitted ones: :data:`PROBABILITY_RANGE`; ``[0, 1]`` for
        states saved before it existed, so they give identical probabilities).
    validation : dict
        Metrics on the queries it was fitted on (JSON-ready).
    """

    coef: list[float] = field(default_factory=lambda: [1.0, 0.0, 0.0])
    intercept: float = 0.0
    features: list[str] = field(default_factory=lambda: list(FEATURES))
    method: str = "platt"
    beta: list[float] = field(default_factory=list)
    isotonic_x: list[float] = field(default_factory=list)
    isotonic_y: list[float] = field(default_factory=list)
    clip: list[float] = field(default_factory=lambda: [0.0, 1.0])
    validation: dict[str, Any] = field(default_factory=dict)

    @property
    def needs(self) -> list[str]:
        """The :data:`EXTRA_FEATURES` the caller has to supply."""
        return [n for n in self.features if n in EXTRA_FEATURES]

    @classmethod
    def fit(cls, features: np.ndarray, correct: np.ndarray, weights: np.ndarray | None = None,
            method: str = "platt", names: Sequence[str] = FEATURES, c: float = 1.0) -> "Calibrator":
        """Fit on ``features`` (n_queries, len(names)) and ``correct`` (n_queries,), optionally weighted.

        Parameters
        ----------
        features : ndarray of shape (n_queries, n_features)
        correct : ndarray of shape (n_queries,), bool
            Whether each query's rank 1 was right.
        weights : ndarray of shape (n_queries,), optional
            Query weights (e.g. :func:`structure_weights`); default 1.
        method : {"platt", "beta", "isotonic"}
        names : sequence of str
            The feature names of the columns.
        c : float
            Inverse L2 penalty of the logistic regressions.
        """
        features = np.asarray(features, dtype=np.float64)
        correct = np.asarray(correct, dtype=bool)
        names = list(names)
        if method not in METHODS:
            raise ValueError(f"Calibrator.fit: unknown method {method!r}; valid: {', '.join(METHODS)}")
        if features.ndim != 2 or features.shape[1] != len(names) or len(features) != len(correct):
            raise ValueError(f"Calibrator.fit: features must be (n, {len(names)}) aligned with correct")
        w = np.ones(len(correct)) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != correct.shape or np.any(w < 0) or not np.any(w > 0):
            raise ValueError("Calibrator.fit: weights must be non-negative, one per query, not all 0")
        y = correct.astype(np.float64)
        coef, intercept = _logistic(features, correct, w, c)
        cal = cls(coef=[float(v) for v in coef], intercept=intercept, features=names, method=method,
                  clip=list(PROBABILITY_RANGE))
        z = cal.linear(features)
        if method == "beta":
            a, b = _logistic(_beta_inputs(z), correct, w, 1e6)
            cal.beta = [float(a[0]), float(a[1]), b]
        elif method == "isotonic":
            from sklearn.isotonic import IsotonicRegression

            iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(z, y, sample_weight=w)
            cal.isotonic_x = [float(v) for v in iso.X_thresholds_]
            cal.isotonic_y = [float(v) for v in iso.y_thresholds_]
        p = cal.predict(features)
        cal.validation = {"n_queries": int(len(correct)), "accuracy": float(np.average(y, weights=w)),
                          "mean_probability": float(np.average(p, weights=w)),
                          "ece": expected_calibration_error(p, correct, weights=w),
                          "log_loss": log_loss(p, correct, weights=w), "weighted": weights is not None}
        return cal

    def linear(self, features: np.ndarray) -> np.ndarray:
        """The linear score w . x + b for features of shape (n_queries, n_features) or (n_features,)."""
        features = np.asarray(features, dtype=np.float64)
        if features.shape[-1] != len(self.coef):
            raise ValueError(f"calibration: expected {len(self.coef)} feature columns ({', '.join(self.features)}),"
                             f" got {features.shape[-1]}")
        return features @ np.asarray(self.coef, dtype=np.float64) + self.intercept

    def predict(self, features: np.ndarray) -> np.ndarray:
        """P(rank 1 is right) for features of shape (n_queries, n_features) or (n_features,); same leading
        shape, float64."""
        z = self.linear(features)
        if self.method == "beta":
            a, b, c = self.beta
            cols = _beta_inputs(np.atleast_1d(z))
            out = _sigmoid(a * cols[:, 0] + b * cols[:, 1] + c).reshape(np.shape(z))
        elif self.method == "isotonic":
            out = np.interp(z, np.asarray(self.isotonic_x), np.asarray(self.isotonic_y))
        else:
            out = _sigmoid(z)
        lo, hi = self.clip
        return np.clip(out, lo, hi) if (lo > 0.0 or hi < 1.0) else out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "features": list(self.features), "coef": list(self.coef),
                               "intercept": float(self.intercept), "clip": list(self.clip),
                               "validation": self.validation}
        if self.method == "beta":
            out["beta"] = list(self.beta)
        if self.method == "isotonic":
            out["isotonic"] = {"x": list(self.isotonic_x), "y": list(self.isotonic_y)}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Calibrator":
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"calibration: malformed state ({type(exc).__name__}: {exc})") from None

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> "Calibrator":
        method = data.get("method", "platt")
        names = [str(n) for n in data.get("features", FEATURES)]
        if method not in METHODS or any(n not in ALL_FEATURES for n in names):
            raise ValueError(f"calibration: unsupported method/features {method!r} {names!r} (this molpredict "
                             f"reads {', '.join(METHODS)} on {', '.join(ALL_FEATURES)})")
        coef = [float(v) for v in data["coef"]]
        intercept = float(data["intercept"])
        if len(coef) != len(names) or not all(math.isfinite(v) for v in coef + [intercept]):
            raise ValueError(f"calibration: coef must be {len(names)} finite numbers (one per feature) and "
                             "intercept a finite number")
        clip = [float(v) for v in data.get("clip", [0.0, 1.0])]
        if len(clip) != 2 or not 0.0 <= clip[0] < clip[1] <= 1.0:
            raise ValueError("calibration: clip must be [lo, hi] with 0 <= lo < hi <= 1")
        cal = cls(coef=coef, intercept=intercept, features=names, method=method, clip=clip,
                  validation=dict(data.get("validation", {})))
        if method == "beta":
            cal.beta = [float(v) for v in data["beta"]]
            if len(cal.beta) != 3 or not all(math.isfinite(v) for v in cal.beta):
                raise ValueError("calibration: beta must be three finite numbers [a, b, c]")
        if method == "isotonic":
            x = np.asarray(data["isotonic"]["x"], dtype=np.float64)
            y = np.asarray(data["isotonic"]["y"], dtype=np.float64)
            if (x.ndim != 1 or x.shape != y.shape or not len(x) or not np.all(np.isfinite(x))
                    or not np.all(np.isfinite(y)) or np.any(np.diff(x) < 0) or np.any(np.diff(y) < 0)
                    or y.min() < 0 or y.max() > 1):
                raise ValueError("calibration: isotonic breakpoints must be finite, x increasing, y non-decreasing"
                                 " in [0, 1], of equal length")
            cal.isotonic_x, cal.isotonic_y = x.tolist(), y.tolist()
        return cal


def _bins(probability: np.ndarray, n_bins: int) -> np.ndarray:
    return np.minimum((probability * n_bins).astype(np.int64), n_bins - 1)


def expected_calibration_error(probability: np.ndarray, correct: np.ndarray, n_bins: int = 10,
                               weights: np.ndarray | None = None) -> float:
    """ECE: sum over equal-width probability bins of (bin share) x |mean probability - accuracy|.

    Bins are [0, 0.1), [0.1, 0.2), ..., [0.9, 1.0] for ``n_bins`` 10 (the last one closed). With ``weights``
    (n_queries,), shares, means and accuracies are weighted (e.g. :func:`structure_weights`: per structure).
    """
    probability = np.asarray(probability, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if probability.size == 0:
        return math.nan
    w = np.ones_like(probability) if weights is None else np.asarray(weights, dtype=np.float64)
    bins = _bins(probability, n_bins)
    total_w = w.sum()
    total = 0.0
    for b in range(n_bins):
        mask = bins == b
        wb = w[mask].sum()
        if wb > 0:
            total += wb / total_w * abs(np.average(probability[mask], weights=w[mask])
                                        - np.average(correct[mask], weights=w[mask]))
    return float(total)


def log_loss(probability: np.ndarray, correct: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Mean (optionally weighted) negative log-likelihood of ``correct`` under ``probability`` (clipped at 1e-12)."""
    p = np.clip(np.asarray(probability, dtype=np.float64), _EPS, 1.0 - _EPS)
    y = np.asarray(correct, dtype=bool)
    if p.size == 0:
        return math.nan
    ll = -np.where(y, np.log(p), np.log1p(-p))
    return float(np.average(ll, weights=weights))


def reliability_curve(probability: np.ndarray, correct: np.ndarray, n_bins: int = 10,
                      weights: np.ndarray | None = None) -> list[dict[str, float]]:
    """Per non-empty bin: its range, query count, (weighted) mean probability and observed accuracy, and with
    ``weights`` the bin's total weight (``weight``: structures, for :func:`structure_weights`)."""
    probability = np.asarray(probability, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    w = np.ones_like(probability) if weights is None else np.asarray(weights, dtype=np.float64)
    bins = _bins(probability, n_bins)
    out = []
    for b in range(n_bins):
        mask = bins == b
        if mask.any() and w[mask].sum() > 0:
            row = {"lo": b / n_bins, "hi": (b + 1) / n_bins, "n": int(mask.sum()),
                   "mean_probability": float(np.average(probability[mask], weights=w[mask])),
                   "accuracy": float(np.average(correct[mask], weights=w[mask]))}
            if weights is not None:
                row["weight"] = float(w[mask].sum())
            out.append(row)
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


#: the feature sets :func:`select_calibrator` compares (each with every method); sets needing an unavailable
#: extra feature are left out
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "base": FEATURES,
    "runner_up": FEATURES + ("margin3", "margin5", "entropy10"),
    "known": FEATURES + ("rank1_known",),
    "runner_up+known": FEATURES + ("margin3", "margin5", "entropy10", "rank1_known"),
    "runner_up+known+prior": FEATURES + ("margin3", "margin5", "entropy10", "rank1_known", "rank1_prior"),
}


def out_of_fold_probabilities(features: np.ndarray, correct: np.ndarray, groups: Sequence[str],
                              method: str = "platt", names: Sequence[str] = FEATURES, n_folds: int = 5,
                              seed: int = 0) -> np.ndarray:
    """Probabilities of each query from a calibrator fitted, structure-weighted, on the other folds (folds by
    structure, :func:`grouped_folds`), ndarray of shape (n_queries,)."""
    features = np.asarray(features, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    groups = np.asarray(list(groups), dtype=object)
    folds = grouped_folds(list(groups), n_folds, seed)
    out = np.full(len(correct), np.nan)
    for k in range(n_folds):
        train = folds != k
        if not train.any() or train.all():
            continue
        cal = Calibrator.fit(features[train], correct[train], structure_weights(groups[train]), method, names)
        out[~train] = cal.predict(features[~train])
    left = np.isnan(out)
    if left.any():  # too few structures for every fold: those queries get the in-sample fit
        cal = Calibrator.fit(features, correct, structure_weights(groups), method, names)
        out[left] = cal.predict(features[left])
    return out


def select_calibrator(features: np.ndarray, correct: np.ndarray, groups: Sequence[str],
                      names: Sequence[str] = ALL_FEATURES, available: Sequence[str] | None = None,
                      methods: Sequence[str] = METHODS, feature_sets: Mapping[str, Sequence[str]] | None = None,
                      n_folds: int = 5, seed: int = 0, tolerance: float = 0.005) -> tuple[Calibrator, dict[str, Any]]:
    """Compare calibrators by grouped out-of-fold log-loss and ECE; refit the best one on all queries.

    The candidates whose structure-weighted out-of-fold log-loss is within ``tolerance`` (relative) of the best
    one are near-ties (their differences are below the noise of a few hundred structures); among them the one
    whose out-of-fold ECE is lowest both per spectrum and per structure (the larger of the two) is kept.

    Parameters
    ----------
    features : ndarray of shape (n_queries, len(names))
        Every candidate feature of each query (out-of-fold fused scores, see
        :func:`molpredict.training.ranking_validation.fit_scoring`).
    correct : ndarray of shape (n_queries,), bool
    groups : sequence of str
        The structure of each query: folds never split one, and each one weighs 1 (:func:`structure_weights`).
    names : sequence of str
        The columns of ``features``.
    available : sequence of str, optional
        The features usable at prediction time (default: ``names``); feature sets needing others are skipped.
    methods : sequence of str
    feature_sets : mapping, optional
        Name -> feature names (default :data:`FEATURE_SETS`).
    n_folds, seed : int
        The grouped folds of the comparison.
    tolerance : float
        Relative log-loss margin of the near-ties decided by ECE.

    Returns
    -------
    calibrator : Calibrator
        The chosen candidate refitted on every query (structure-weighted); its ``validation`` holds its
        out-of-fold metrics.
    table : dict
        ``{"<feature set>/<method>": {"log_loss", "ece", "ece_per_structure", ...}}`` (JSON-ready).
    """
    names = list(names)
    available = set(names if available is None else available)
    feature_sets = FEATURE_SETS if feature_sets is None else feature_sets
    correct = np.asarray(correct, dtype=bool)
    weights = structure_weights(groups)
    table: dict[str, Any] = {}
    candidates: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for set_name, chosen in feature_sets.items():
        if not set(chosen) <= available:
            continue
        columns = features[:, [names.index(n) for n in chosen]]
        for method in methods:
            p = out_of_fold_probabilities(columns, correct, groups, method, chosen, n_folds, seed)
            loss = log_loss(p, correct, weights)
            n_confident, threshold = confident_at_fdr(p, 0.1)
            table[f"{set_name}/{method}"] = {
                "log_loss": loss, "ece": expected_calibration_error(p, correct),
                "ece_per_structure": expected_calibration_error(p, correct, weights=weights),
                "confident_at_fdr_0.1": n_confident,
                "observed_fdr": float(1 - correct[p >= threshold].mean()) if n_confident else None}
            candidates[f"{set_name}/{method}"] = (set_name, method, tuple(chosen))
    if not candidates:
        raise ValueError("select_calibrator: no feature set is available")
    finite = {k: v for k, v in table.items() if math.isfinite(v["log_loss"])} or table
    best_loss = min(v["log_loss"] for v in finite.values())
    near = [k for k, v in finite.items() if v["log_loss"] <= best_loss * (1 + tolerance) + 1e-12]
    key = min(near, key=lambda k: (max(finite[k]["ece"], finite[k]["ece_per_structure"]), finite[k]["log_loss"]))
    set_name, method, chosen = candidates[key]
    columns = features[:, [names.index(n) for n in chosen]]
    calibrator = Calibrator.fit(columns, correct, weights, method, chosen)
    calibrator.validation = {**calibrator.validation, "in_sample_ece": calibrator.validation.get("ece"),
                             "feature_set": set_name, **{k: v for k, v in table[f"{set_name}/{method}"].items()},
                             "selected_by": f"structure-weighted out-of-fold log-loss ({n_folds} folds by "
                                            f"structure), near-ties (within {tolerance:.1%}) by the larger of the "
                                            "ECEs per spectrum and per structure"}
    return calibrator, table
