"""Score fusion: the spectrum model's score, a structure prior and candidate-specific evidence, standardised within
each candidate set and combined with weights chosen on validation.

Raw scores of different terms live on different scales (a SISOKR score, a mean Tanimoto similarity, an explained
intensity fraction), and their spread changes from one candidate set to the next. Each term is therefore
z-scored within the set it ranks (mean 0, standard deviation 1; a constant term becomes 0), and the fused score is

    score(c) = sum_t w_t z_t(c),        w_spectrum = 1,

with the other weights picked on validation candidate sets by a ranking metric (MRR by default: the fusion exists
to rank, so it is chosen by how it ranks). A softmax of the fused scores at a fitted temperature gives each
candidate a probability within its set (fitted by the conditional likelihood of the truth); the calibrated
probability that rank 1 is right is :mod:`molpredict.identification.calibration`'s job.

Candidate sets are handled as flat arrays with ``offsets`` (set ``i`` is ``offsets[i]:offsets[i+1]``), so a whole
validation split is scored with a few vectorised passes.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from molpredict.engine.decoding import ranking_metrics, set_index, true_ranks

__all__ = ["SPECTRUM", "PRIOR", "FRAGMENTS", "standardize", "standardize_within_sets", "set_index",
           "softmax_within_sets", "true_ranks", "ranking_metrics", "ScoreFusion", "fit_fusion",
           "DEFAULT_WEIGHT_GRID"]

#: names of the fused terms, as they appear in bundles and output columns (``<name>_score``)
SPECTRUM, PRIOR, FRAGMENTS = "spectrum", "prior", "fragments"

#: weights tried for each non-spectrum term (the spectrum term's weight is fixed at 1)
DEFAULT_WEIGHT_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)


def standardize(scores: np.ndarray) -> np.ndarray:
    """The scores of one candidate set z-scored (population standard deviation); a constant set gives zeros.

    Parameters
    ----------
    scores : ndarray of shape (n_candidates,)

    Returns
    -------
    ndarray of shape (n_candidates,), float64
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores.copy()
    return standardize_within_sets(scores, np.array([0, scores.size]))


def standardize_within_sets(scores: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """:func:`standardize` applied to every set of a flat array, vectorised.

    Parameters
    ----------
    scores : ndarray of shape (n_total,)
    offsets : ndarray of shape (n_sets + 1,)
        Set ``i`` is ``scores[offsets[i]:offsets[i+1]]``; sets may not be empty.

    Returns
    -------
    ndarray of shape (n_total,), float64
    """
    scores = np.asarray(scores, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    if np.any(sizes <= 0):
        raise ValueError("standardize_within_sets: every candidate set needs at least one candidate")
    which = set_index(offsets)
    mean = np.add.reduceat(scores, offsets[:-1]) / sizes
    centred = scores - mean[which]
    sd = np.sqrt(np.add.reduceat(centred * centred, offsets[:-1]) / sizes)
    scale = np.maximum.reduceat(np.abs(scores), offsets[:-1])
    flat = ~np.isfinite(sd) | (sd <= 1e-12 * np.maximum(1.0, scale))
    sd = np.where(flat, 1.0, sd)
    out = centred / sd[which]
    out[flat[which]] = 0.0
    return out


def softmax_within_sets(scores: np.ndarray, offsets: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """exp(s / T) normalised within each set, ndarray of shape (n_total,)."""
    scores = np.asarray(scores, dtype=np.float64) / float(temperature)
    offsets = np.asarray(offsets, dtype=np.int64)
    which = set_index(offsets)
    e = np.exp(scores - np.maximum.reduceat(scores, offsets[:-1])[which])
    return e / np.add.reduceat(e, offsets[:-1])[which]


def _metric(name: str, ranks: np.ndarray) -> float:
    if name == "mrr":
        return float(np.mean(1.0 / ranks))
    if name.startswith("hit@"):
        return float(np.mean(ranks <= int(name[4:])))
    raise ValueError(f"unknown ranking metric {name!r}; valid: mrr, hit@K")


@dataclass
class ScoreFusion:
    """Weights of the z-scored terms and the softmax temperature of the fused score.

    Attributes
    ----------
    weights : dict
        Term name -> weight; ``spectrum`` is 1 when present. Terms with weight 0 are not computed at all.
    temperature : float
        Softmax temperature of the fused scores (candidate probabilities within a set).
    selected_by : str
        The validation metric the weights maximised.
    validation : dict
        Metrics of the fused and of each single term on the validation sets (JSON-ready).
    """

    weights: dict[str, float] = field(default_factory=lambda: {SPECTRUM: 1.0})
    temperature: float = 1.0
    selected_by: str = "mrr"
    validation: dict[str, Any] = field(default_factory=dict)

    def active(self, available: Sequence[str] | None = None) -> dict[str, float]:
        """The terms with a non-zero weight (restricted to ``available`` when given)."""
        return {t: w for t, w in self.weights.items() if w != 0.0 and (available is None or t in available)}

    def combine(self, terms: Mapping[str, np.ndarray]) -> np.ndarray:
        """The fused scores of one candidate set.

        Parameters
        ----------
        terms : mapping
            Term name -> raw scores, each ndarray of shape (n_candidates,). Terms the fusion does not weigh are
            ignored; a weighted term that is missing counts as 0 (e.g. ``--prior off``).

        Returns
        -------
        ndarray of shape (n_candidates,), float64
        """
        out: np.ndarray | None = None
        for name, weight in self.active(list(terms)).items():
            z = weight * standardize(terms[name])
            out = z if out is None else out + z
        if out is None:
            n = len(next(iter(terms.values()))) if terms else 0
            return np.zeros(n, dtype=np.float64)
        return out

    def combine_flat(self, terms: Mapping[str, np.ndarray], offsets: np.ndarray) -> np.ndarray:
        """:meth:`combine` over flat candidate sets (``offsets`` as in :func:`standardize_within_sets`)."""
        out = np.zeros(int(np.asarray(offsets)[-1]), dtype=np.float64)
        for name, weight in self.active(list(terms)).items():
            out += weight * standardize_within_sets(terms[name], offsets)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"weights": {k: float(v) for k, v in self.weights.items()}, "temperature": float(self.temperature),
                "selected_by": self.selected_by, "validation": self.validation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ScoreFusion":
        weights = {str(k): float(v) for k, v in dict(data.get("weights", {})).items()}
        temperature = float(data.get("temperature", 1.0))
        if not weights or not all(math.isfinite(w) for w in weights.values()):
            raise ValueError("fusion: weights must be finite numbers")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"fusion: temperature must be positive, got {temperature}")
        return cls(weights=weights, temperature=temperature, selected_by=str(data.get("selected_by", "mrr")),
                   validation=dict(data.get("validation", {})))


def _fit_temperature(fused: np.ndarray, offsets: np.ndarray, is_true: np.ndarray) -> float:
    """The softmax temperature maximising the mean log-probability of the truth (first true entry per set)."""
    from scipy.optimize import minimize_scalar

    has_true = np.add.reduceat(is_true.astype(np.int64), offsets[:-1]) > 0

    def nll(log_t: float) -> float:
        p = softmax_within_sets(fused, offsets, math.exp(log_t))
        # probability of the structure = summed over its copies in the set
        p_true = np.add.reduceat(np.where(is_true, p, 0.0), offsets[:-1])[has_true]
        return -float(np.mean(np.log(np.maximum(p_true, 1e-300))))

    result = minimize_scalar(nll, bounds=(math.log(1e-2), math.log(1e2)), method="bounded")
    return float(math.exp(result.x))


def fit_fusion(terms: Mapping[str, np.ndarray], offsets: np.ndarray, is_true: np.ndarray, metric: str = "mrr",
               grid: Sequence[float] = DEFAULT_WEIGHT_GRID) -> ScoreFusion:
    """Choose the weights of the non-spectrum terms on validation candidate sets.

    Every combination of ``grid`` values is tried (the spectrum term fixed at 1; with no spectrum term, the first
    term is fixed at 1), and the one with the best ``metric`` is kept; ties go to the smaller weights (the
    simpler model). Then the softmax temperature is fitted by likelihood.

    Parameters
    ----------
    terms : mapping
        Term name -> flat raw scores, each ndarray of shape (n_total,).
    offsets : ndarray of shape (n_sets + 1,)
    is_true : ndarray of shape (n_total,), bool
        Which candidates are the true structure of their set.
    metric : {"mrr", "hit@1", "hit@5", ...}
    grid : sequence of float

    Returns
    -------
    ScoreFusion
        With ``validation`` holding the metrics of the fused score and of each term alone.
    """
    names = list(terms)
    if not names:
        raise ValueError("fit_fusion: no terms")
    offsets = np.asarray(offsets, dtype=np.int64)
    is_true = np.asarray(is_true, dtype=bool)
    z = {name: standardize_within_sets(terms[name], offsets) for name in names}
    anchor = SPECTRUM if SPECTRUM in names else names[0]
    others = [n for n in names if n != anchor]
    _metric(metric, np.ones(1))  # validates the name
    best_value, best_weights = -math.inf, None
    for combo in itertools.product(sorted(grid), repeat=len(others)):
        fused = z[anchor].copy()
        for name, weight in zip(others, combo):
            if weight:
                fused += weight * z[name]
        value = _metric(metric, true_ranks(fused, offsets, is_true))
        if value > best_value + 1e-12:
            best_value, best_weights = value, dict(zip(others, combo))
    weights = {anchor: 1.0, **{k: float(v) for k, v in best_weights.items()}}
    fusion = ScoreFusion(weights=weights, selected_by=metric)
    fused = fusion.combine_flat(terms, offsets)
    fusion.temperature = _fit_temperature(fused, offsets, is_true)
    fusion.validation = {"n_sets": int(len(offsets) - 1), "fused": ranking_metrics(fused, offsets, is_true),
                         **{f"{name}_alone": ranking_metrics(z[name], offsets, is_true) for name in names}}
    return fusion
