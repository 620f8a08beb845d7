"""Decoding: ranking scored candidates (deterministic tie-breaking), the true structure's rank under an explicit
tie policy, and the retrieval metrics built on it (hit@k, MRR, mean rank, bootstrap intervals). Pure functions.

Tie policies
------------
For one query let ``s`` be the true structure's score (the best score among candidates that match the true
InChIKey first block), ``g`` the number of *other* candidates scoring strictly more and ``t`` the number of
other candidates scoring exactly ``s``.

``worst``
    rank = 1 + g + t: every tie is resolved against the truth (the pessimistic, "no credit for ties" rank).
``average``
    the expectation under uniformly random tie-breaking: the rank is uniform on {g+1, ..., g+t+1}, so
    rank = 1 + g + t/2, hit@k = clip(k - g, 0, t + 1) / (t + 1) and the reciprocal rank is the mean of
    1/r over that range.

A query whose candidate set does not contain the true structure counts as a miss (hit@k = 0, reciprocal rank
0) with rank ``n_candidates + 1``.

Output rankings (``rank_candidates``) break ties by the candidate key (InChIKey) in ascending order, so the same
scores always give the same table.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = [
    "TIE_POLICIES",
    "rank_candidates",
    "margins",
    "true_rank_counts",
    "query_metrics",
    "topk_curve",
    "random_expectation",
    "bootstrap_ci",
    "group_means",
]

TIE_POLICIES = ("worst", "average")
_EULER_GAMMA = 0.5772156649015329


def rank_candidates(scores: np.ndarray, keys: Sequence[str], top_k: int | None = None) -> np.ndarray:
    """Candidate order for one query: score descending, ties by key ascending.

    Parameters
    ----------
    scores : ndarray of shape (n_candidates,)
    keys : sequence of str, length n_candidates
        Tie-breaking keys (InChIKeys).
    top_k : int, optional
        Keep only the first ``top_k`` positions.

    Returns
    -------
    ndarray of shape (min(top_k, n_candidates),), int64
        Indices into ``scores``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or len(keys) != scores.shape[0]:
        raise ValueError("scores must be 1-D and keys must have the same length")
    # NaN scores (a degenerate candidate) sort last rather than poisoning the order.
    primary = np.where(np.isnan(scores), np.inf, -scores)
    order = np.argsort(primary, kind="stable")
    ranked = primary[order]
    if ranked.size > 1 and np.any(ranked[1:] == ranked[:-1]):
        # Ties are rare with real scores: only then pay for comparing keys.
        key_array = np.asarray(keys, dtype=object).astype(str)
        order = np.lexsort((key_array, primary))
    return order if top_k is None else order[:top_k]


def margins(sorted_scores: np.ndarray) -> np.ndarray:
    """Confidence of each ranked candidate: its score minus the best score among the *other* candidates.

    For the top candidate this is its lead over the runner-up (>= 0); for every other candidate it is
    its gap to the top (<= 0). With a single candidate there is no alternative and the margin is NaN.

    Parameters
    ----------
    sorted_scores : ndarray of shape (n_candidates,)
        Scores in ranked (descending) order.

    Returns
    -------
    ndarray of shape (n_candidates,)
    """
    s = np.asarray(sorted_scores, dtype=np.float64)
    out = np.full(s.shape, np.nan)
    if s.size >= 2:
        out[0] = s[0] - s[1]
        out[1:] = s[1:] - s[0]
    return out


def true_rank_counts(scores: np.ndarray, is_true: np.ndarray) -> tuple[int, int, bool]:
    """How many other candidates beat or tie the true structure in one query.

    Parameters
    ----------
    scores : ndarray of shape (n_candidates,)
    is_true : ndarray of shape (n_candidates,), bool
        Candidates that are the true structure (same InChIKey first block); usually exactly one.

    Returns
    -------
    n_greater : int
        Other candidates with a strictly higher score than the best true candidate.
    n_ties : int
        Other candidates with exactly the same score.
    found : bool
        Whether any candidate is the true structure (if not, both counts are 0).
    """
    scores = np.asarray(scores, dtype=np.float64)
    is_true = np.asarray(is_true, dtype=bool)
    if not is_true.any():
        return 0, 0, False
    s_true = scores[is_true].max()
    others = scores[~is_true]
    return int(np.count_nonzero(others > s_true)), int(np.count_nonzero(others == s_true)), True


def _harmonic(n: np.ndarray) -> np.ndarray:
    """H_n = sum_{r=1..n} 1/r for non-negative integer arrays (H_0 = 0)."""
    n = np.asarray(n, dtype=np.float64)
    from scipy.special import digamma  # here: scipy.special costs 0.1-0.2 s to import, identification never needs it

    return np.where(n > 0, digamma(n + 1.0) + _EULER_GAMMA, 0.0)


def query_metrics(n_greater: np.ndarray, n_ties: np.ndarray, found: np.ndarray, n_candidates: np.ndarray,
                  ks: Sequence[int] = (1, 5, 10, 20), policy: str = "worst") -> dict[str, np.ndarray]:
    """Per-query hit@k, reciprocal rank and rank under a tie policy.

    Parameters
    ----------
    n_greater, n_ties : ndarray of shape (n_queries,), int
        From :func:`true_rank_counts`.
    found : ndarray of shape (n_queries,), bool
    n_candidates : ndarray of shape (n_queries,), int
    ks : sequence of int
    policy : {"worst", "average"}

    Returns
    -------
    dict
        ``"hit@k"`` for each k, ``"rr"`` and ``"rank"``: ndarrays of shape (n_queries,), float64.
    """
    if policy not in TIE_POLICIES:
        raise ValueError(f"unknown tie policy {policy!r}; valid: {', '.join(TIE_POLICIES)}")
    g = np.asarray(n_greater, dtype=np.float64)
    t = np.asarray(n_ties, dtype=np.float64)
    found = np.asarray(found, dtype=bool)
    n_c = np.asarray(n_candidates, dtype=np.float64)
    out: dict[str, np.ndarray] = {}
    if policy == "worst":
        rank = 1.0 + g + t
        for k in ks:
            out[f"hit@{k}"] = np.where(found, (rank <= k).astype(np.float64), 0.0)
        rr = 1.0 / rank
    else:
        rank = 1.0 + g + t / 2.0
        for k in ks:
            out[f"hit@{k}"] = np.where(found, np.clip(k - g, 0.0, t + 1.0) / (t + 1.0), 0.0)
        rr = (_harmonic(g + t + 1.0) - _harmonic(g)) / (t + 1.0)
    out["rr"] = np.where(found, rr, 0.0)
    out["rank"] = np.where(found, rank, n_c + 1.0)
    return out


def topk_curve(n_greater: np.ndarray, n_ties: np.ndarray, found: np.ndarray, k_max: int = 20,
               policy: str = "worst") -> np.ndarray:
    """Mean hit@k for k = 1..k_max, ndarray of shape (k_max,)."""
    n_q = len(np.asarray(found))
    if n_q == 0:
        return np.zeros(k_max)
    per = query_metrics(n_greater, n_ties, found, np.zeros(n_q), ks=range(1, k_max + 1), policy=policy)
    return np.array([per[f"hit@{k}"].mean() for k in range(1, k_max + 1)])


def random_expectation(n_candidates: np.ndarray, ks: Sequence[int] = (1, 5, 10, 20),
                       k_max: int | None = None) -> dict[str, float]:
    """Exact metrics of a uniformly random ranking, averaged over queries.

    For a query with n candidates (the truth among them): hit@k = min(k, n) / n, reciprocal rank
    E[1/r] = H_n / n, rank (n + 1) / 2.

    Parameters
    ----------
    n_candidates : ndarray of shape (n_queries,), int
    ks : sequence of int
    k_max : int, optional
        Also return ``"curve"``: mean hit@k for k = 1..k_max (as a list).

    Returns
    -------
    dict
        ``"hit@k"``, ``"mrr"``, ``"mean_rank"`` (and ``"curve"``).
    """
    n = np.asarray(n_candidates, dtype=np.float64)
    if n.size == 0:
        return {**{f"hit@{k}": float("nan") for k in ks}, "mrr": float("nan"), "mean_rank": float("nan")}
    out: dict = {f"hit@{k}": float(np.mean(np.minimum(k, n) / n)) for k in ks}
    out["mrr"] = float(np.mean(_harmonic(n) / n))
    out["mean_rank"] = float(np.mean((n + 1.0) / 2.0))
    if k_max is not None:
        out["curve"] = [float(np.mean(np.minimum(k, n) / n)) for k in range(1, k_max + 1)]
    return out


def group_means(values: np.ndarray, groups: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``values`` within each group (e.g. per structure), groups in order of first appearance.

    Parameters
    ----------
    values : ndarray of shape (n,)
    groups : sequence of hashable, length n

    Returns
    -------
    means : ndarray of shape (n_groups,)
    labels : ndarray of shape (n_groups,), object
    """
    values = np.asarray(values, dtype=np.float64)
    labels, first, inverse = np.unique(np.asarray(groups, dtype=object).astype(str), return_index=True,
                                       return_inverse=True)
    sums = np.bincount(inverse, weights=values, minlength=len(labels))
    counts = np.bincount(inverse, minlength=len(labels))
    order = np.argsort(first, kind="stable")
    return (sums / counts)[order], labels[order]


def bootstrap_ci(values: np.ndarray, n_boot: int = 1000, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean, resampling the entries of ``values`` (queries).

    Parameters
    ----------
    values : ndarray of shape (n,)
    n_boot : int
        Number of resamples.
    confidence : float
        Coverage of the interval (0.95: the 2.5% and 97.5% percentiles).
    seed : int
        The same seed and values always give the same interval.

    Returns
    -------
    (low, high) : tuple of float
        NaN when ``values`` is empty.
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    if n == 0 or n_boot <= 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    # Blocks of resamples keep memory at O(block * n) for large query sets.
    block = max(1, min(n_boot, 2_000_000 // max(n, 1)))
    for start in range(0, n_boot, block):
        stop = min(start + block, n_boot)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = values[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


# -- flat candidate sets: every set's scores back to back, set k at [offsets[k], offsets[k+1]) ----------------
def set_index(offsets: np.ndarray) -> np.ndarray:
    """The set number of every flat position, ndarray of shape (offsets[-1],), int64."""
    offsets = np.asarray(offsets, dtype=np.int64)
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def true_ranks(scores: np.ndarray, offsets: np.ndarray, is_true: np.ndarray) -> np.ndarray:
    """The rank of the truth in each set, ties counted against it (worst case), ndarray (n_sets,), int64.

    A set may hold the truth more than once (e.g. two stereo-SMILES of one InChIKey first block): its best-scored
    copy counts. A set without the truth gets rank ``size + 1``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    is_true = np.asarray(is_true, dtype=bool)
    which = set_index(offsets)
    best_true = np.maximum.reduceat(np.where(is_true, scores, -np.inf), offsets[:-1])
    beats = (~is_true) & (scores >= best_true[which])
    ranks = np.add.reduceat(beats.astype(np.int64), offsets[:-1]) + 1
    return np.where(np.isfinite(best_true), ranks, np.diff(offsets) + 1)


def ranking_metrics(scores: np.ndarray, offsets: np.ndarray, is_true: np.ndarray) -> dict[str, float]:
    """MRR and hit@1/5/10/20 (worst-case ties) of flat scores over candidate sets."""
    ranks = true_ranks(scores, offsets, is_true)
    out = {"mrr": float(np.mean(1.0 / ranks)) if ranks.size else math.nan}
    for k in (1, 5, 10, 20):
        out[f"hit@{k}"] = float(np.mean(ranks <= k)) if ranks.size else math.nan
    return out
