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
- ``rank1_prior``: the rank-1 candidate's raw prior score;
- ``one_formula``: 1 when the candidates share one molecular formula (a known FORMULA's set), 0 when several
  formulas compete (a mass window): at equal scores the two kinds of sets are not equally often right (on
  validation the mass-window sets' probabilities came out too low without it).

And from the query spectrum itself (cleaned as the model cleans it; :func:`spectrum_features`):

- ``spectral_entropy``: the Shannon entropy of its normalised peak intensities. Spectra of a few dominant peaks
  and spectra of many comparable ones are not equally often identified at equal scores; with the feature the
  calibration holds better on validation structures ranked along it (negative mode, out of fold and fitted on
  one half of the structures, read on the other: ``docs/benchmarks/calibration_spectrum.md``).

Fitting is by structure: spectra of one structure are not independent evidence, so out-of-fold data come from
folds that never split a structure (:func:`grouped_folds`) and a structure's spectra share one weight: 1 / their
number (each structure once) or 1 / sqrt(their number) (:data:`WEIGHTINGS`; the weighting is chosen on validation
with the features and the method: per structure alone, the probabilities under-state the per-spectrum accuracy,
because structures measured many times are also the easier ones).

The metrics of a calibrated confidence are :func:`expected_calibration_error` (ECE, equal-width bins; optionally
weighted, e.g. per structure), :func:`log_loss` and :func:`confident_at_fdr` (how many queries can be reported
while the estimated false discovery rate of the reported ones stays within a bound).

The FDR estimate. The plain estimate of a list, mean(1 - p), is what calibrated probabilities promise on average;
a list dominated by a few structures' many spectra scatters far around it (on the validation formula256 sets, the
five structures with most confident wrong calls held 58-100% of them, and the structure-bootstrap 90% quantile of
the observed FDR at an estimated 10% was 20-24%). :func:`fdr_estimates` adds ``z`` standard deviations of the
number of wrong calls when the queries sharing a rank-1 structure are right or wrong together; ``z`` (:data:`FDR_Z`) was chosen on
validation with :func:`bootstrap_observed_fdr` and is kept in the calibration's JSON (:attr:`Calibrator.fdr`;
states without it keep the plain estimate).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from molpredict.identification.fusion import set_index, softmax_within_sets

__all__ = ["FEATURES", "ALL_FEATURES", "EXTRA_FEATURES", "SPECTRUM_FEATURES", "spectrum_features", "METHODS",
           "WEIGHTINGS", "FDR_Z", "ranking_features", "ranking_features_flat", "top_index_flat", "grouped_folds",
           "structure_weights", "Calibrator", "expected_calibration_error", "log_loss", "fdr_estimates",
           "confident_at_fdr", "bootstrap_observed_fdr", "reliability_curve", "log_loss_excess", "NEAR_TIE_SE",
           "MIN_STRATUM"]

#: the features of the original Platt calibrator (bundles without a ``features`` list read these)
FEATURES = ("top1_logit", "margin", "log_n_candidates")
#: features computed from the fused scores alone
SCORE_FEATURES = ("top1_logit", "top1_log_p", "top1_log_1mp", "margin", "margin3", "margin5", "entropy10",
                  "log_n_candidates")
#: features of the query spectrum itself (:func:`spectrum_features`)
SPECTRUM_FEATURES = ("spectral_entropy",)
#: features the caller supplies (``extra``): the rank-1 candidate's other terms, the set's kind, the query spectrum
EXTRA_FEATURES = ("rank1_known", "rank1_prior", "one_formula") + SPECTRUM_FEATURES
ALL_FEATURES = SCORE_FEATURES + EXTRA_FEATURES
METHODS = ("platt", "beta", "isotonic")
#: how the queries of a structure are weighted when a calibrator is fitted: the power of 1 / (its number of
#: queries) (:func:`structure_weights`). ``structure``: each structure once (a calibration per structure, which
#: under-states the accuracy per spectrum where well-measured structures are also the easier ones);
#: ``sqrt_structure``: a structure of n spectra weighs sqrt(n)
WEIGHTINGS = {"structure": 1.0, "sqrt_structure": 0.5}
#: the range fitted calibrators keep their probabilities in: a finite validation set supports neither 0 nor 1
#: (an estimated FDR of exactly 0), and the output column would print them as certainties
PROBABILITY_RANGE = (1e-3, 1.0 - 1e-3)

#: the ``z`` of the FDR bound newly fitted calibrators carry (:func:`fdr_estimates`). Chosen on validation
#: (docs/benchmarks/calibration_fdr.md): the smallest z of the grid 0, 0.5, 1, 1.28, 1.64, 2, 2.5, 3, 4 at which
#: the structure-bootstrap 90% quantile of the out-of-fold observed FDR at an asked 10% is <= 12% on every
#: validation set kind (formula256, formula, mass) and ion mode where some z reaches it. With the fragmentation
#: second pass and the set's kind in the calibration (the default bundles, with the prior): positive formula256
#: needs 2.5, negative formula256 0.5, the real formula and mass sets 0 (3 before the set's kind; 1.28 without
#: the second pass)
FDR_Z = 2.5

#: :func:`select_calibrator`'s near-ties: calibrators whose out-of-fold log-loss exceeds the best one's by at most
#: this many standard errors over structures (the 2 of the second pass's rule, ``choose_rerank``). Chosen on
#: validation (positive, the fine-tuned model's terms): within 0.5% only, the best log-loss was kept at formula256
#: ECE 0.062 out of fold; at 2 standard errors the worst ECE over the set kinds fell to 0.045
NEAR_TIE_SE = 2.0
#: the fewest queries of a stratum whose ECE :func:`select_calibrator` checks on its own (10 bins: about 10 a bin)
MIN_STRATUM = 100

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


def structure_weights(groups: Sequence[str], power: float = 1.0) -> np.ndarray:
    """(1 / number of queries of the query's group) ** ``power`` per query.

    ``power`` 1: each group weighs 1 in total (per structure); 0: each query weighs 1 (per spectrum); 0.5 (the
    ``sqrt_structure`` weighting of :data:`WEIGHTINGS`): a group of n queries weighs sqrt(n), between the two.

    Returns
    -------
    ndarray of shape (n_queries,), float64
    """
    from molpredict.models.distinct import group_size_weights

    _, inverse = np.unique(np.asarray(list(groups), dtype=object).astype(str), return_inverse=True)
    return group_size_weights(inverse, power)


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
    fdr : dict
        How an FDR is estimated from these probabilities (JSON-ready): ``{"z": float, "clusters": "rank1"}``, the
        upper bound of :func:`fdr_estimates` over clusters of queries with one rank-1 structure; empty (states
        saved before it existed): the plain estimate mean(1 - p), as before.
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
    fdr: dict[str, Any] = field(default_factory=dict)

    @property
    def fdr_z(self) -> float:
        """The ``z`` of the FDR bound (:func:`fdr_estimates`); 0 (the plain estimate) when none is stored."""
        return float(self.fdr.get("z", 0.0))

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
        if self.fdr:
            out["fdr"] = dict(self.fdr)
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
        fdr = dict(data.get("fdr", {}))
        z = fdr.get("z", 0.0)
        if not isinstance(z, (int, float)) or isinstance(z, bool) or not math.isfinite(z) or z < 0 \
                or fdr.get("clusters", "rank1") != "rank1":
            raise ValueError("calibration: fdr must be {\"z\": a finite number >= 0, \"clusters\": \"rank1\"}")
        cal = cls(coef=coef, intercept=intercept, features=names, method=method, clip=clip,
                  validation=dict(data.get("validation", {})), fdr=fdr)
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


def _log_losses(probability: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Each query's negative log-likelihood of ``correct`` under ``probability`` (clipped at 1e-12), (n_queries,)."""
    p = np.clip(np.asarray(probability, dtype=np.float64), _EPS, 1.0 - _EPS)
    return -np.where(np.asarray(correct, dtype=bool), np.log(p), np.log1p(-p))


def log_loss(probability: np.ndarray, correct: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Mean (optionally weighted) negative log-likelihood of ``correct`` under ``probability`` (clipped at 1e-12)."""
    if np.size(probability) == 0:
        return math.nan
    return float(np.average(_log_losses(probability, correct), weights=weights))


def log_loss_excess(probability: np.ndarray, reference: np.ndarray, correct: np.ndarray,
                    groups: Sequence[str]) -> tuple[float, float]:
    """How much worse ``probability`` is than ``reference`` in structure-weighted log-loss, and the standard error
    of that excess over structures.

    Each structure's mean log-loss difference is one observation (its spectra move together); the excess is their
    mean (equal to the difference of :func:`log_loss` with :func:`structure_weights`), the standard error their
    standard deviation / sqrt(number of structures); 0 with one structure.

    Returns
    -------
    excess, standard_error : float
    """
    difference = _log_losses(probability, correct) - _log_losses(reference, correct)
    _, inverse, counts = np.unique(np.asarray(list(groups), dtype=object).astype(str), return_inverse=True,
                                   return_counts=True)
    per_structure = np.bincount(inverse.reshape(-1), difference) / counts
    if len(per_structure) < 2:
        return float(per_structure.mean()) if len(per_structure) else 0.0, 0.0
    return float(per_structure.mean()), float(per_structure.std(ddof=1) / math.sqrt(len(per_structure)))


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


def fdr_estimates(probability: np.ndarray, clusters: Sequence[Any] | None = None, z: float = 0.0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The estimated FDR of every top-j list of queries (by decreasing probability), optionally an upper bound.

    The plain estimate of the top j is the expected share of wrong calls among them, ``mean(1 - p)``. It is what
    a calibrated probability promises *on average*; the realised FDR of one list scatters around it, and far more
    than independent queries would suggest when the list holds many spectra of few structures: the spectra of one
    structure are right or wrong together (on the validation formula256 sets, five structures held 58-100% of the
    confident wrong calls). With ``z > 0`` the estimate is the upper bound ``mean(1 - p) + z sd / j``, where ``sd``
    is the standard deviation of the number of wrong calls when each cluster of queries (``clusters``: the rank-1
    structure, known at prediction time) is wholly right or wholly wrong: a cluster of ``n_c`` queries expecting
    ``E_c = sum(1 - p)`` wrong calls contributes ``E_c (n_c - E_c)`` to the variance (``p (1 - p)`` for a query
    alone). ``z`` is a one-sided normal quantile (1.28: the realised FDR exceeds the bound about one time in ten
    over new sets of structures, if the probabilities are calibrated); the one used (:data:`FDR_Z`) was chosen on
    validation with :func:`bootstrap_observed_fdr` and is kept in the calibration (:attr:`Calibrator.fdr`).

    Parameters
    ----------
    probability : ndarray of shape (n_queries,)
    clusters : sequence of shape (n_queries,), optional
        A hashable label per query (e.g. the rank-1 candidate's InChIKey first block); default: every query its own.
    z : float
        Non-negative; 0 gives the plain estimate.

    Returns
    -------
    order : ndarray of shape (n_queries,), int64
        Query positions by decreasing probability (stable).
    fdr : ndarray of shape (n_queries,), float64
        ``fdr[j - 1]``: the estimate for the top ``j`` of ``order``.
    """
    p = np.asarray(probability, dtype=np.float64)
    if z < 0 or not math.isfinite(z):
        raise ValueError(f"fdr_estimates: z must be a finite number >= 0, got {z!r}")
    order = np.argsort(-p, kind="stable")
    e = 1.0 - p[order]
    j = np.arange(1, p.size + 1, dtype=np.float64)
    fdr = np.cumsum(e) / j
    if z == 0.0 or p.size == 0:
        return order, fdr
    if clusters is None:
        variance = np.cumsum(e * (1.0 - e))
    else:
        labels = np.asarray(list(clusters), dtype=object)
        if labels.shape != p.shape:
            raise ValueError("fdr_estimates: one cluster label per query")
        _, ids = np.unique(labels[order].astype(str), return_inverse=True)
        # each cluster's running (n_c, E_c) after each of its queries; query k changes the variance only by the
        # cluster it joins: delta_k = E_c (n_c - E_c) after it minus the same before it
        by_cluster = np.argsort(ids, kind="stable")
        sorted_ids = ids[by_cluster]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        lengths = np.diff(np.r_[starts, len(ids)])
        e_sorted = e[by_cluster]
        cum = np.cumsum(e_sorted)
        e_after = np.empty_like(e)
        n_after = np.empty_like(e)
        e_after[by_cluster] = cum - np.repeat(cum[starts] - e_sorted[starts], lengths)
        n_after[by_cluster] = np.arange(len(ids)) - np.repeat(starts, lengths) + 1.0
        e_before, n_before = e_after - e, n_after - 1.0
        variance = np.cumsum(e_after * (n_after - e_after) - e_before * (n_before - e_before))
    return order, fdr + z * np.sqrt(np.maximum(variance, 0.0)) / j


def confident_at_fdr(probability: np.ndarray, max_fdr: float = 0.1, clusters: Sequence[Any] | None = None,
                     z: float = 0.0) -> tuple[int, float]:
    """How many queries can be reported at an estimated FDR <= ``max_fdr``, and the probability threshold.

    Queries are taken by decreasing probability; the estimated FDR of the top j is mean(1 - p) over them, or with
    ``z > 0`` its upper bound over correlated ``clusters`` (:func:`fdr_estimates`). The answer is the largest j
    whose estimate is within the bound (0 and threshold 1.0 when none is), among the j that a threshold can
    report: calibrated probabilities tie often (a step function, rounded scores), and ``p >= threshold`` takes
    every query tied at it, so a list cut inside a run of ties is not one anybody can be given.

    Returns
    -------
    (int, float)
        ``j`` and the threshold: ``p >= threshold`` selects exactly those ``j`` queries.
    """
    p = np.asarray(probability, dtype=np.float64)
    if p.size == 0:
        return 0, 1.0
    order, fdr = fdr_estimates(p, clusters, z)
    ranked = p[order]
    cuttable = np.r_[ranked[1:] < ranked[:-1], True]  # the top j ends where the next probability is lower
    ok = np.flatnonzero((fdr <= max_fdr) & cuttable)
    if ok.size == 0:
        return 0, 1.0
    j = int(ok[-1]) + 1
    return j, float(ranked[j - 1])


def bootstrap_observed_fdr(probability: np.ndarray, correct: np.ndarray, groups: Sequence[str],
                           clusters: Sequence[Any] | None = None, z: float = 0.0, max_fdr: float = 0.1,
                           n_boot: int = 200, seed: int = 0) -> dict[str, Any]:
    """What a new set of structures would see: the observed FDR of the queries :func:`confident_at_fdr` reports,
    over resamples of the structures (``groups``, drawn with replacement, all spectra of a drawn structure kept).

    A structure drawn twice is two structures: its copies are separate ``clusters`` (the label gets the copy's
    number). The realised FDR of a list dominated by few structures scatters widely; the quantiles say how far.

    Parameters
    ----------
    probability, correct : ndarray of shape (n_queries,)
        Out-of-fold probabilities and whether each rank 1 was right.
    groups : sequence of str, shape (n_queries,)
        The true structure of each query (what is resampled).
    clusters : sequence, shape (n_queries,), optional
        The labels of :func:`fdr_estimates` (the rank-1 structure); default: each query its own.
    z, max_fdr : float
        As in :func:`confident_at_fdr`.
    n_boot, seed : int

    Returns
    -------
    dict
        JSON-ready: ``observed`` (per resample, list of float; 0 when nothing is reported), ``n_reported`` (per
        resample), quantiles ``q10``, ``q50``, ``q90``, ``q95`` and ``p_above`` (the share of resamples whose
        observed FDR exceeds ``1.2 * max_fdr``, the issue's tolerance: 12% at an asked 10%).
    """
    p = np.asarray(probability, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    labels = np.asarray(list(groups), dtype=object).astype(str)
    cl = labels if clusters is None else np.asarray(list(clusters), dtype=object).astype(str)
    if clusters is None:
        cl = np.char.add(cl, np.char.add("#", np.arange(len(cl)).astype(str)))  # each query its own
    if not (p.shape == correct.shape == labels.shape == cl.shape):
        raise ValueError("bootstrap_observed_fdr: probability, correct, groups and clusters must align")
    distinct, inverse = np.unique(labels, return_inverse=True)
    members = np.argsort(inverse, kind="stable")
    starts = np.r_[0, np.cumsum(np.bincount(inverse, minlength=len(distinct)))]
    rng = np.random.default_rng(seed)
    observed, reported = [], []
    for _ in range(n_boot):
        pick = rng.integers(0, len(distinct), len(distinct))
        index = np.concatenate([members[starts[g]:starts[g + 1]] for g in pick])
        copy = np.repeat(np.arange(len(pick)), starts[pick + 1] - starts[pick])
        n, threshold = confident_at_fdr(p[index], max_fdr, np.char.add(cl[index], np.char.add("@", copy.astype(str))),
                                        z)
        chosen = p[index] >= threshold if n else np.zeros(len(index), dtype=bool)
        observed.append(float(1.0 - correct[index][chosen].mean()) if chosen.any() else 0.0)
        reported.append(int(chosen.sum()))
    q = np.quantile(observed, [0.1, 0.5, 0.9, 0.95]) if observed else [math.nan] * 4
    return {"observed": observed, "n_reported": reported, "q10": float(q[0]), "q50": float(q[1]),
            "q90": float(q[2]), "q95": float(q[3]),
            "p_above": float(np.mean(np.asarray(observed) > 1.2 * max_fdr)) if observed else math.nan}


#: the feature sets :func:`select_calibrator` compares (each with every method); sets needing an unavailable
#: extra feature are left out
_SCORE_AND_TERM_SETS: dict[str, tuple[str, ...]] = {
    "base": FEATURES,
    "runner_up": FEATURES + ("margin3", "margin5", "entropy10"),
    "known": FEATURES + ("rank1_known",),
    "runner_up+known": FEATURES + ("margin3", "margin5", "entropy10", "rank1_known"),
    "runner_up+known+prior": FEATURES + ("margin3", "margin5", "entropy10", "rank1_known", "rank1_prior"),
}
_WITH_SET_KIND: dict[str, tuple[str, ...]] = {  # each of them alone and with the set's kind
    **_SCORE_AND_TERM_SETS,
    **{f"{name}+one_formula": names + ("one_formula",) for name, names in _SCORE_AND_TERM_SETS.items()}}
FEATURE_SETS: dict[str, tuple[str, ...]] = {  # each of them alone and with the query spectrum's entropy
    **_WITH_SET_KIND,
    **{f"{name}+entropy": names + SPECTRUM_FEATURES for name, names in _WITH_SET_KIND.items()}}


def spectrum_features(spectra: Sequence[Any]) -> dict[str, np.ndarray]:
    """The :data:`SPECTRUM_FEATURES` of each query spectrum, name -> ndarray of shape (n_spectra,), float64.

    ``spectral_entropy``: ``-sum_i q_i log q_i`` over the peaks of positive intensity, ``q = I / sum(I)``
    (natural log; 0 for one peak or none). Inputs that are not spectra (text queries) get 0.
    """
    entropy = np.zeros(len(spectra), dtype=np.float64)
    for i, spectrum in enumerate(spectra):
        intensities = np.asarray(getattr(spectrum, "intensities", ()), dtype=np.float64)
        intensities = intensities[np.isfinite(intensities) & (intensities > 0)]
        if len(intensities) > 1:
            q = intensities / intensities.sum()
            entropy[i] = float(-(q * np.log(q)).sum())
    return {"spectral_entropy": entropy}


def out_of_fold_probabilities(features: np.ndarray, correct: np.ndarray, groups: Sequence[str],
                              method: str = "platt", names: Sequence[str] = FEATURES, n_folds: int = 5,
                              seed: int = 0, power: float = 1.0) -> np.ndarray:
    """Probabilities of each query from a calibrator fitted on the other folds (folds by structure,
    :func:`grouped_folds`; weights :func:`structure_weights` with ``power``), ndarray of shape (n_queries,)."""
    features = np.asarray(features, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    groups = np.asarray(list(groups), dtype=object)
    folds = grouped_folds(list(groups), n_folds, seed)
    out = np.full(len(correct), np.nan)
    for k in range(n_folds):
        train = folds != k
        if not train.any() or train.all():
            continue
        cal = Calibrator.fit(features[train], correct[train], structure_weights(groups[train], power), method,
                             names)
        out[~train] = cal.predict(features[~train])
    left = np.isnan(out)
    if left.any():  # too few structures for every fold: those queries get the in-sample fit
        cal = Calibrator.fit(features, correct, structure_weights(groups, power), method, names)
        out[left] = cal.predict(features[left])
    return out


def select_calibrator(features: np.ndarray, correct: np.ndarray, groups: Sequence[str],
                      names: Sequence[str] = ALL_FEATURES, available: Sequence[str] | None = None,
                      methods: Sequence[str] = METHODS, feature_sets: Mapping[str, Sequence[str]] | None = None,
                      n_folds: int = 5, seed: int = 0, tolerance: float = 0.005,
                      weightings: Sequence[str] = tuple(WEIGHTINGS), strata: Sequence[Any] | None = None,
                      near_tie_se: float = NEAR_TIE_SE, min_stratum: int = MIN_STRATUM
                      ) -> tuple[Calibrator, dict[str, Any]]:
    """Compare calibrators by grouped out-of-fold log-loss and ECE; refit the best one on all queries.

    A candidate is a feature set, a method and a weighting of the queries it is fitted with (:data:`WEIGHTINGS`).
    The candidates whose structure-weighted out-of-fold log-loss is not significantly worse than the best one's
    are near-ties: the excess is within ``tolerance`` (relative) or within ``near_tie_se`` standard errors of its
    mean over structures (:func:`log_loss_excess`; each structure's queries move together, so the noise is that
    of a few hundred structures, not of thousands of spectra). Among them the one whose worst out-of-fold ECE is
    lowest is kept: the ECE per structure over all queries, and the ECE per spectrum within each stratum
    (``strata``: e.g. the collection of candidate sets a query was ranked in, formula256, real same-formula or
    mass-window sets; a probability that is right on average but not on each kind of set is not one to trust).

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
    weightings : sequence of str
        Names from :data:`WEIGHTINGS`.
    strata : sequence, optional
        A label per query (n_queries,); the ECE is checked within each (default: one stratum, all queries).
    near_tie_se : float
        Standard errors (over structures) of the log-loss excess still counted as a near-tie.
    min_stratum : int
        Strata with fewer queries are not checked on their own (their ECE is noise); they still count in the ECE
        per structure over all queries.

    Returns
    -------
    calibrator : Calibrator
        The chosen candidate refitted on every query (with its weighting); its ``validation`` holds its
        out-of-fold metrics and its ``weighting``.
    table : dict
        ``{"<feature set>/<method>[/<weighting>]": {"log_loss", "ece", "ece_per_structure", ...}}`` (JSON-ready;
        the weighting is named when it is not ``structure``).
    """
    names = list(names)
    available = set(names if available is None else available)
    feature_sets = FEATURE_SETS if feature_sets is None else feature_sets
    correct = np.asarray(correct, dtype=bool)
    weights = structure_weights(groups)
    unknown = [w for w in weightings if w not in WEIGHTINGS]
    if unknown or not weightings:
        raise ValueError(f"select_calibrator: unknown weightings {unknown}; valid: {', '.join(WEIGHTINGS)}")
    labels = np.zeros(len(correct), dtype=np.int64) if strata is None \
        else np.unique(np.asarray(list(strata)).astype(str), return_inverse=True)[1].reshape(-1)
    if labels.shape != correct.shape:
        raise ValueError("select_calibrator: one stratum per query")
    table: dict[str, Any] = {}
    probabilities: dict[str, np.ndarray] = {}
    candidates: dict[str, tuple[str, str, tuple[str, ...], str]] = {}
    for set_name, chosen in feature_sets.items():
        if not set(chosen) <= available:
            continue
        columns = features[:, [names.index(n) for n in chosen]]
        for method in methods:
            for weighting in weightings:
                p = out_of_fold_probabilities(columns, correct, groups, method, chosen, n_folds, seed,
                                              WEIGHTINGS[weighting])
                loss = log_loss(p, correct, weights)
                n_confident, threshold = confident_at_fdr(p, 0.1)
                key = f"{set_name}/{method}" + ("" if weighting == "structure" else f"/{weighting}")
                table[key] = {
                    "log_loss": loss, "ece": expected_calibration_error(p, correct),
                    "ece_per_structure": expected_calibration_error(p, correct, weights=weights),
                    "ece_per_stratum": [expected_calibration_error(p[labels == k], correct[labels == k])
                                        for k in range(labels.max() + 1)],
                    "confident_at_fdr_0.1": n_confident,
                    "observed_fdr": float(1 - correct[p >= threshold].mean()) if n_confident else None}
                candidates[key] = (set_name, method, tuple(chosen), weighting)
                probabilities[key] = p
    if not candidates:
        raise ValueError("select_calibrator: no feature set is available")
    finite = {k: v for k, v in table.items() if math.isfinite(v["log_loss"])} or table
    best = min(finite, key=lambda k: finite[k]["log_loss"])
    for k in finite:
        excess, se = log_loss_excess(probabilities[k], probabilities[best], correct, groups)
        finite[k]["log_loss_excess_se"] = se
        finite[k]["near_tie"] = bool(excess <= max(tolerance * finite[best]["log_loss"], near_tie_se * se) + 1e-12)
    near = [k for k, v in finite.items() if v["near_tie"]]

    checked = np.bincount(labels, minlength=labels.max() + 1) >= min_stratum

    def worst_ece(k: str) -> float:
        return max([finite[k]["ece_per_structure"],
                    *(e for e, c in zip(finite[k]["ece_per_stratum"], checked) if c and math.isfinite(e))])

    key = min(near, key=lambda k: (worst_ece(k), finite[k]["log_loss"]))
    set_name, method, chosen, weighting = candidates[key]
    columns = features[:, [names.index(n) for n in chosen]]
    calibrator = Calibrator.fit(columns, correct, structure_weights(groups, WEIGHTINGS[weighting]), method, chosen)
    calibrator.validation = {**calibrator.validation, "in_sample_ece": calibrator.validation.get("ece"),
                             "feature_set": set_name, "weighting": weighting, **table[key],
                             "selected_by": f"structure-weighted out-of-fold log-loss ({n_folds} folds by "
                                            f"structure), near-ties (within {tolerance:.1%} or "
                                            f"{near_tie_se:g} standard errors over structures) by the worst of "
                                            "the ECE per structure and the ECEs per spectrum within each "
                                            f"stratum ({labels.max() + 1})"}
    return calibrator, table
