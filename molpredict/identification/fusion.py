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

A *learnt ranker* (:class:`LearntRanker`, :func:`fit_ranker`) may replace the fixed weights: a conditional logit
(a softmax over each candidate set, fitted by the likelihood of the truth with an L2 penalty) over the z-scored
terms and their products with features of the set (log candidate count, whether the formula was known), and
optionally the terms' pairwise products,

    score(c) = sum_j theta_j phi_j(c),

so that, e.g., the prior can count more in large same-formula sets than in small mass-window sets. Training keeps
it only when it beats the weights out of fold (folds drawn by structure; :mod:`molpredict.training.ranking_validation`).

A *second pass* (:class:`Rerank`, :func:`fit_rerank`) may re-rank the first pass's top ``k`` candidates with
evidence too costly to compute for every candidate (the fragmentation terms fragment each structure they score):
a learnt ranker over the first pass's score and those terms, fitted on the top ``k`` of validation sets. The
other candidates keep their first-pass order below the re-ranked ones. Terms of the second pass are computed for
the top ``k`` only; elsewhere they are NaN.

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

__all__ = ["SPECTRUM", "PRIOR", "FRAGMENTS", "FRAGMENT_MODEL", "FIRST_PASS", "RERANK_TERMS", "Rerank", "fit_rerank",
           "top_k_flat", "fill_missing", "second_pass_inputs", "LearntRanker", "fit_ranker", "fit_fusion_kind", "FUSION_KINDS", "SET_FEATURES", "standardize", "standardize_within_sets", "set_index",
           "softmax_within_sets", "true_ranks", "ranking_metrics", "ScoreFusion", "fit_fusion",
           "DEFAULT_WEIGHT_GRID"]

#: names of the fused terms, as they appear in bundles and output columns (``<name>_score``)
SPECTRUM, PRIOR, FRAGMENTS = "spectrum", "prior", "fragments"
#: the learnt fragmentation model's term (:mod:`molpredict.chem.fragment_model`)
FRAGMENT_MODEL = "fragment_model"
#: the first pass's fused score, as the second pass (:class:`Rerank`) reads it
FIRST_PASS = "first_pass"
#: terms a second pass may read (computed for the first pass's top k only)
RERANK_TERMS = (FRAGMENTS, FRAGMENT_MODEL)
#: features of a candidate set a learnt ranker may interact with the terms: ``log_size`` (log of the number of
#: candidates) and ``formula_known`` (1 when the candidates share the query's formula, 0 for a mass window;
#: given by the caller in ``context``)
SET_FEATURES = ("log_size", "formula_known")
#: how the terms are combined: fixed weights on a grid (:func:`fit_fusion`) or a learnt ranker (:func:`fit_ranker`)
FUSION_KINDS = ("weights", "ranker")

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
    ranker : LearntRanker or None
        When set, it scores the candidates instead of the weights (which stay as the fallback's record); its
        terms are the ones computed.
    rerank : Rerank or None
        When set, a second pass re-ranks the top ``rerank.k`` candidates of the first (the weights or the ranker)
        with :attr:`rerank_terms` too; ``temperature`` is then the one of the final scores.
    """

    weights: dict[str, float] = field(default_factory=lambda: {SPECTRUM: 1.0})
    temperature: float = 1.0
    selected_by: str = "mrr"
    validation: dict[str, Any] = field(default_factory=dict)
    ranker: "LearntRanker | None" = None
    rerank: "Rerank | None" = None

    def active(self, available: Sequence[str] | None = None) -> dict[str, float]:
        """The first pass's terms: those with a non-zero weight, or the ranker's terms (weight 1) when there is a
        ranker (restricted to ``available`` when given). Every candidate needs them."""
        weights = self.weights if self.ranker is None else {t: 1.0 for t in self.ranker.terms}
        return {t: w for t, w in weights.items() if w != 0.0 and (available is None or t in available)}

    @property
    def rerank_terms(self) -> tuple[str, ...]:
        """The terms the second pass reads besides the first pass's score (only its top ``k`` need them)."""
        return self.rerank.terms if self.rerank is not None else ()

    def first_pass(self, terms: Mapping[str, np.ndarray], offsets: np.ndarray,
                   context: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """The first pass's fused scores of flat candidate sets, ndarray of shape (offsets[-1],)."""
        if self.ranker is not None:
            return self.ranker.score_flat(terms, offsets, context)
        out = np.zeros(int(np.asarray(offsets)[-1]), dtype=np.float64)
        for name, weight in self.active(list(terms)).items():
            out += weight * standardize_within_sets(terms[name], offsets)
        return out

    def rerank_candidates(self, terms: Mapping[str, np.ndarray], context: Mapping[str, float] | None = None
                          ) -> np.ndarray:
        """Positions (into one set's candidates) of the first pass's top ``k``, which the second pass re-ranks
        (its terms are needed there only); all positions without a second pass. ndarray of int64."""
        n = len(next(iter(terms.values()))) if terms else 0
        if self.rerank is None or n == 0:
            return np.arange(n, dtype=np.int64)
        offsets = np.array([0, n])
        ctx = {k: np.array([float(v)]) for k, v in (context or {}).items()}
        return top_k_flat(self.first_pass(terms, offsets, ctx), offsets, self.rerank.k)[0]

    def combine(self, terms: Mapping[str, np.ndarray], context: Mapping[str, float] | None = None) -> np.ndarray:
        """The fused scores of one candidate set.

        Parameters
        ----------
        terms : mapping
            Term name -> raw scores, each ndarray of shape (n_candidates,). Terms the fusion does not weigh are
            ignored; a weighted term that is missing counts as 0 (e.g. ``--prior off``).
        context : mapping, optional
            Set features a learnt ranker reads besides the set size (``formula_known``: 1 or 0).

        Returns
        -------
        ndarray of shape (n_candidates,), float64
        """
        n = len(next(iter(terms.values()))) if terms else 0
        if n == 0:
            return np.zeros(0, dtype=np.float64)
        ctx = {k: np.array([float(v)]) for k, v in (context or {}).items()}
        return self.combine_flat(terms, np.array([0, n]), ctx)

    def combine_flat(self, terms: Mapping[str, np.ndarray], offsets: np.ndarray,
                     context: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """:meth:`combine` over flat candidate sets (``offsets`` as in :func:`standardize_within_sets`;
        ``context`` values per set, ndarray of shape (n_sets,)). Without the second pass's terms in ``terms``,
        the first pass's scores."""
        first = self.first_pass(terms, offsets, context)
        if self.rerank is None or not all(t in terms for t in self.rerank.terms):
            return first
        return self.rerank.apply_flat(first, terms, offsets, context)

    def to_dict(self) -> dict[str, Any]:
        out = {"weights": {k: float(v) for k, v in self.weights.items()}, "temperature": float(self.temperature),
               "selected_by": self.selected_by, "validation": self.validation}
        if self.ranker is not None:
            out["ranker"] = self.ranker.to_dict()
        if self.rerank is not None:
            out["rerank"] = self.rerank.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ScoreFusion":
        weights = {str(k): float(v) for k, v in dict(data.get("weights", {})).items()}
        temperature = float(data.get("temperature", 1.0))
        if not weights or not all(math.isfinite(w) for w in weights.values()):
            raise ValueError("fusion: weights must be finite numbers")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"fusion: temperature must be positive, got {temperature}")
        ranker = data.get("ranker")
        rerank = data.get("rerank")
        return cls(weights=weights, temperature=temperature, selected_by=str(data.get("selected_by", "mrr")),
                   validation=dict(data.get("validation", {})),
                   ranker=LearntRanker.from_dict(ranker) if ranker is not None else None,
                   rerank=Rerank.from_dict(rerank) if rerank is not None else None)


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


# ----------------------------------------------------------------------------------------------------------
# The learnt ranker
# ----------------------------------------------------------------------------------------------------------

def set_feature_values(offsets: np.ndarray, context: Mapping[str, np.ndarray] | None = None
                       ) -> dict[str, np.ndarray]:
    """The :data:`SET_FEATURES` of every set that can be known: ``log_size`` always, the others when
    ``context`` gives them. Each ndarray of shape (n_sets,), float64."""
    offsets = np.asarray(offsets, dtype=np.int64)
    out = {"log_size": np.log(np.diff(offsets).astype(np.float64))}
    for name, values in (context or {}).items():
        if name in SET_FEATURES and name != "log_size":
            out[name] = np.broadcast_to(np.asarray(values, dtype=np.float64), (len(offsets) - 1,)).copy()
    return out


def ranker_features(terms: Mapping[str, np.ndarray], offsets: np.ndarray, names: Sequence[str],
                    set_names: Sequence[str], set_center: Sequence[float], set_scale: Sequence[float],
                    pairs: bool, context: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, list[str]]:
    """The ranker's inputs for every candidate (pure function).

    Columns: ``z_t`` for each term ``t`` of ``names`` (:func:`standardize_within_sets`; a missing term is 0),
    then ``z_t * (s - center_s) / scale_s`` for each set feature ``s`` of ``set_names`` and term ``t``, then,
    with ``pairs``, ``z_a * z_b`` for each pair ``a <= b`` of terms (``names`` order).

    Returns
    -------
    features : ndarray of shape (n_total, n_features), float64
    labels : list of str
        Column names (``t``, ``t*s``, ``a*b``).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n = int(offsets[-1])
    z = {t: (standardize_within_sets(terms[t], offsets) if t in terms else np.zeros(n)) for t in names}
    which = set_index(offsets)
    values = set_feature_values(offsets, context)
    cols, labels = [z[t] for t in names], list(names)
    for s, center, scale in zip(set_names, set_center, set_scale):
        if s not in values:
            raise ValueError(f"the ranker needs the set feature {s!r}, which was not given")
        v = ((values[s] - center) / scale)[which]
        for t in names:
            cols.append(z[t] * v)
            labels.append(f"{t}*{s}")
    if pairs:
        for i, a in enumerate(names):
            for b in names[i:]:
                cols.append(z[a] * z[b])
                labels.append(f"{a}*{b}")
    return np.stack(cols, axis=1) if cols else np.zeros((n, 0)), labels


def softmax_nll(theta: np.ndarray, features: np.ndarray, offsets: np.ndarray, is_true: np.ndarray,
                l2: float) -> tuple[float, np.ndarray]:
    """Mean negative log-probability of the truth under a softmax of ``features @ theta`` within each set
    (copies of the truth summed; sets without it left out), plus ``l2 / 2 * |theta|^2``, and its gradient."""
    offsets = np.asarray(offsets, dtype=np.int64)
    score = features @ theta
    which = set_index(offsets)
    e = np.exp(score - np.maximum.reduceat(score, offsets[:-1])[which])
    p = e / np.add.reduceat(e, offsets[:-1])[which]
    p_true = np.where(is_true, p, 0.0)
    mass = np.add.reduceat(p_true, offsets[:-1])
    has = mass > 0
    if not has.any():
        return 0.5 * l2 * float(theta @ theta), l2 * theta
    loss = -float(np.mean(np.log(mass[has]))) + 0.5 * l2 * float(theta @ theta)
    expected = np.add.reduceat(p[:, None] * features, offsets[:-1])
    observed = np.add.reduceat(p_true[:, None] * features, offsets[:-1]) / np.maximum(mass, 1e-300)[:, None]
    grad = (expected - observed)[has].mean(axis=0) + l2 * theta
    return loss, grad


@dataclass
class LearntRanker:
    """A conditional-logit ranker over the z-scored terms and their interactions (:func:`ranker_features`).

    Attributes
    ----------
    terms : tuple of str
        The terms it reads, in column order.
    set_names : tuple of str
        The set features it interacts with the terms (those that varied where it was fitted).
    set_center, set_scale : tuple of float
        Standardisation of each set feature.
    pairs : bool
        Whether products of terms are inputs.
    coef : ndarray of shape (n_features,)
    l2 : float
        The L2 strength it was fitted with.
    """

    terms: tuple[str, ...]
    set_names: tuple[str, ...]
    set_center: tuple[float, ...]
    set_scale: tuple[float, ...]
    pairs: bool
    coef: np.ndarray
    l2: float = 1e-2

    def features(self, terms: Mapping[str, np.ndarray], offsets: np.ndarray,
                 context: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, list[str]]:
        return ranker_features(terms, offsets, self.terms, self.set_names, self.set_center, self.set_scale,
                               self.pairs, context)

    def score_flat(self, terms: Mapping[str, np.ndarray], offsets: np.ndarray,
                   context: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Scores of flat candidate sets, ndarray of shape (offsets[-1],)."""
        return self.features(terms, offsets, context)[0] @ self.coef

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "softmax", "terms": list(self.terms), "set_features": list(self.set_names),
                "set_center": [float(v) for v in self.set_center], "set_scale": [float(v) for v in self.set_scale],
                "pairs": bool(self.pairs), "coef": [float(v) for v in self.coef], "l2": float(self.l2)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LearntRanker":
        if data.get("kind", "softmax") != "softmax":
            raise ValueError(f"fusion: unknown ranker kind {data.get('kind')!r}")
        terms = tuple(str(t) for t in data["terms"])
        set_names = tuple(str(s) for s in data.get("set_features", ()))
        if any(s not in SET_FEATURES for s in set_names):
            raise ValueError(f"fusion: unknown ranker set feature in {list(set_names)}")
        ranker = cls(terms, set_names, tuple(float(v) for v in data.get("set_center", ())),
                     tuple(float(v) for v in data.get("set_scale", ())), bool(data.get("pairs", False)),
                     np.asarray(data["coef"], dtype=np.float64), float(data.get("l2", 0.0)))
        n_terms = len(terms)
        expected = n_terms * (1 + len(set_names)) + (n_terms * (n_terms + 1) // 2 if ranker.pairs else 0)
        if (ranker.coef.shape != (expected,) or not np.all(np.isfinite(ranker.coef))
                or len(ranker.set_center) != len(set_names) or len(ranker.set_scale) != len(set_names)
                or not all(v > 0 for v in ranker.set_scale)):
            raise ValueError("fusion: the ranker's coefficients do not match its terms and set features")
        return ranker


def fit_ranker(terms: Mapping[str, np.ndarray], offsets: np.ndarray, is_true: np.ndarray,
               context: Mapping[str, np.ndarray] | None = None, l2: float = 1e-2, pairs: bool = False
               ) -> LearntRanker:
    """Fit a :class:`LearntRanker` on candidate sets by the softmax likelihood of the truth (L-BFGS).

    Set features that are constant over the sets (e.g. ``formula_known`` when every set is a formula set) are
    left out: their products would only duplicate the terms. Starts from weight 1 on every term.

    Parameters
    ----------
    terms : mapping
        Term name -> flat raw scores, each ndarray of shape (n_total,).
    offsets : ndarray of shape (n_sets + 1,)
    is_true : ndarray of shape (n_total,), bool
    context : mapping, optional
        Set feature name -> values per set, ndarray of shape (n_sets,).
    l2 : float
    pairs : bool
        Products of terms as inputs too. Off by default: on val_pos (formula256 + formula sets, spectrum and
        prior, 3 folds by structure) they raised hit@10 but lowered hit@1 and MRR out of fold.

    Returns
    -------
    LearntRanker
    """
    from scipy.optimize import minimize

    names = tuple(terms)
    if not names:
        raise ValueError("fit_ranker: no terms")
    offsets = np.asarray(offsets, dtype=np.int64)
    is_true = np.asarray(is_true, dtype=bool)
    values = set_feature_values(offsets, context)
    set_names = tuple(s for s in SET_FEATURES if s in values and np.std(values[s]) > 1e-9)
    center = tuple(float(np.mean(values[s])) for s in set_names)
    scale = tuple(float(np.std(values[s])) for s in set_names)
    features, _ = ranker_features(terms, offsets, names, set_names, center, scale, pairs, context)
    theta0 = np.zeros(features.shape[1])
    theta0[:len(names)] = 1.0
    result = minimize(softmax_nll, theta0, args=(features, offsets, is_true, l2), jac=True, method="L-BFGS-B")
    return LearntRanker(names, set_names, center, scale, pairs, np.asarray(result.x, dtype=np.float64), float(l2))


# ----------------------------------------------------------------------------------------------------------
# The second pass
# ----------------------------------------------------------------------------------------------------------

def top_k_flat(scores: np.ndarray, offsets: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best-scored candidates of every set (all of a smaller set), pure function.

    Ties are broken by position (the earlier candidate first), so the choice is deterministic. The order must
    then not depend on the label: the candidate-set sources order each set by candidate key
    (:func:`~molpredict.chem.candidates.in_key_order`), because the set files put the truth first.

    Parameters
    ----------
    scores : ndarray of shape (n_total,)
    offsets : ndarray of shape (n_sets + 1,)
    k : int

    Returns
    -------
    keep : ndarray of shape (n_kept,), int64
        Flat positions of the kept candidates, set by set, each set's best first.
    kept_offsets : ndarray of shape (n_sets + 1,), int64
        Set ``i``'s kept candidates are ``keep[kept_offsets[i]:kept_offsets[i+1]]``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    which = set_index(offsets)
    order = np.lexsort((np.arange(scores.size), -scores, which))
    rank = np.arange(scores.size) - offsets[which[order]]
    keep = order[rank < k].astype(np.int64)
    kept_sizes = np.minimum(np.diff(offsets), k)
    return keep, np.concatenate([[0], np.cumsum(kept_sizes)]).astype(np.int64)


def fill_missing(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Non-finite entries (a term not computed for a candidate, a structure that could not be scored) replaced by
    the lowest finite value of their set (0 in a set with none), ndarray of shape (n_total,)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    if finite.all():
        return values
    offsets = np.asarray(offsets, dtype=np.int64)
    lowest = np.minimum.reduceat(np.where(finite, values, np.inf), offsets[:-1])
    lowest = np.where(np.isfinite(lowest), lowest, 0.0)
    return np.where(finite, values, lowest[set_index(offsets)])


def second_pass_inputs(first: np.ndarray, terms: Mapping[str, np.ndarray], names: Sequence[str], keep: np.ndarray,
                       kept_offsets: np.ndarray) -> dict[str, np.ndarray]:
    """A second pass's ranker inputs on the kept candidates (:func:`top_k_flat`'s ``keep``, ``kept_offsets``):
    :data:`FIRST_PASS` from ``first`` and each term of ``names``, its missing values filled (:func:`fill_missing`).
    Term name -> ndarray of shape (len(keep),), pure function."""
    out = {FIRST_PASS: np.asarray(first, dtype=np.float64)[keep]}
    for name in names:
        out[name] = fill_missing(np.asarray(terms[name], dtype=np.float64)[keep], kept_offsets)
    return out


@dataclass
class Rerank:
    """The second pass: a learnt ranker over the first pass's top ``k`` of each set.

    Attributes
    ----------
    k : int
        Candidates re-ranked per set.
    ranker : LearntRanker
        Over :data:`FIRST_PASS` (the first pass's fused score) and some of :data:`RERANK_TERMS`, z-scored within
        the top ``k``; a term missing for a candidate counts as its set's lowest (:func:`fill_missing`).
    spacing : float
        The first pass's softmax temperature: the candidates below the top ``k`` keep their first-pass gaps in
        its units, under the lowest re-ranked one.
    validation : dict
        What the second pass did on validation (JSON-ready).
    """

    k: int
    ranker: LearntRanker
    spacing: float = 1.0
    validation: dict[str, Any] = field(default_factory=dict)

    @property
    def terms(self) -> tuple[str, ...]:
        """The terms it reads besides the first pass's score."""
        return tuple(t for t in self.ranker.terms if t != FIRST_PASS)

    def apply_flat(self, first: np.ndarray, terms: Mapping[str, np.ndarray], offsets: np.ndarray,
                   context: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Final scores of flat candidate sets from the first pass's scores ``first`` (n_total,) and the terms
        (their entries outside the top ``k`` are not read): each set's top ``k`` scored by the ranker, every
        other candidate below the lowest of them, in first-pass order. ndarray of shape (n_total,)."""
        first = np.asarray(first, dtype=np.float64)
        offsets = np.asarray(offsets, dtype=np.int64)
        keep, kept_offsets = top_k_flat(first, offsets, self.k)
        second = self.ranker.score_flat(second_pass_inputs(first, terms, self.terms, keep, kept_offsets), kept_offsets,
                                        context)
        which = set_index(offsets)
        lowest_second = np.minimum.reduceat(second, kept_offsets[:-1])
        lowest_first = np.minimum.reduceat(first[keep], kept_offsets[:-1])
        out = lowest_second[which] - 1.0 + (first - lowest_first[which]) / self.spacing
        out[keep] = second
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"k": int(self.k), "ranker": self.ranker.to_dict(), "spacing": float(self.spacing),
                "validation": self.validation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Rerank":
        k, spacing = int(data["k"]), float(data.get("spacing", 1.0))
        if k < 1 or not (math.isfinite(spacing) and spacing > 0):
            raise ValueError(f"fusion: the second pass needs k >= 1 and a positive spacing, got {k}, {spacing}")
        ranker = LearntRanker.from_dict(data["ranker"])
        if FIRST_PASS not in ranker.terms:
            raise ValueError(f"fusion: the second pass's ranker does not read {FIRST_PASS!r}")
        return cls(k, ranker, spacing, dict(data.get("validation", {})))


def fit_rerank(first: np.ndarray, terms: Mapping[str, np.ndarray], offsets: np.ndarray, is_true: np.ndarray,
               k: int, spacing: float = 1.0, context: Mapping[str, np.ndarray] | None = None,
               l2: float = 1e-2) -> Rerank:
    """Fit the second pass on validation sets: a :func:`fit_ranker` ranker over the first pass's top ``k``.

    Parameters
    ----------
    first : ndarray of shape (n_total,)
        The first pass's fused scores.
    terms : mapping
        The second pass's terms (some of :data:`RERANK_TERMS`), flat, each ndarray of shape (n_total,); only
        their entries in each set's top ``k`` are read.
    offsets : ndarray of shape (n_sets + 1,)
    is_true : ndarray of shape (n_total,), bool
    k : int
    spacing : float
        The first pass's temperature (:attr:`Rerank.spacing`).
    context : mapping, optional
    l2 : float

    Returns
    -------
    Rerank
    """
    names = [t for t in terms if t in RERANK_TERMS]
    if not names:
        raise ValueError(f"fit_rerank: none of the terms {', '.join(RERANK_TERMS)}")
    first = np.asarray(first, dtype=np.float64)
    keep, kept_offsets = top_k_flat(first, offsets, k)
    inputs = second_pass_inputs(first, terms, names, keep, kept_offsets)
    ranker = fit_ranker(inputs, kept_offsets, np.asarray(is_true, dtype=bool)[keep], context, l2=l2)
    return Rerank(int(k), ranker, float(spacing))


def fit_fusion_kind(kind: str, terms: Mapping[str, np.ndarray], offsets: np.ndarray, is_true: np.ndarray,
                    metric: str = "mrr", context: Mapping[str, np.ndarray] | None = None,
                    rerank_k: int | None = None) -> ScoreFusion:
    """:func:`fit_fusion` (``kind="weights"``), or the same with a :func:`fit_ranker` ranker on top
    (``kind="ranker"``: the weights stay as a record; the temperature and the validation metrics are the
    ranker's). With ``rerank_k``, the :data:`RERANK_TERMS` in ``terms`` are left to a second pass over the first
    pass's top ``rerank_k`` (:func:`fit_rerank`; the temperature and the metrics are then the final scores')."""
    if kind not in FUSION_KINDS:
        raise ValueError(f"unknown fusion kind {kind!r}; valid: {', '.join(FUSION_KINDS)}")
    later = {t: v for t, v in terms.items() if t in RERANK_TERMS} if rerank_k else {}
    if later:
        terms = {t: v for t, v in terms.items() if t not in later}
    fusion = fit_fusion(terms, offsets, is_true, metric=metric)
    offsets = np.asarray(offsets, dtype=np.int64)
    is_true = np.asarray(is_true, dtype=bool)
    if kind == "ranker":
        fusion.ranker = fit_ranker(terms, offsets, is_true, context)
        fused = fusion.combine_flat(terms, offsets, context)
        fusion.temperature = _fit_temperature(fused, offsets, is_true)
        fusion.validation = {**fusion.validation, "fused": ranking_metrics(fused, offsets, is_true),
                             "fused_weights": fusion.validation["fused"]}
    if later:
        first = fusion.combine_flat(terms, offsets, context)
        fusion.rerank = fit_rerank(first, later, offsets, is_true, int(rerank_k), fusion.temperature, context)
        fused = fusion.combine_flat({**terms, **later}, offsets, context)
        fusion.temperature = _fit_temperature(fused, offsets, is_true)
        fusion.validation = {**fusion.validation, "fused": ranking_metrics(fused, offsets, is_true),
                             "fused_first_pass": fusion.validation["fused"]}
    return fusion
