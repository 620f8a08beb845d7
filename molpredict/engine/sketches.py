"""Sketch matrices R (m x n) that compress the n training points of a kernel method to m directions.

Every sketch is stored in a *decomposed* form ``R = A_ @ I_n[used_, :]``: ``used_`` lists the columns of R
that are not identically zero (the training points the sketch touches) and ``A_`` (m x n') holds their
weights. A model therefore only ever computes ``K[used_, :]`` (via :meth:`Kernel.gram`), never an n x n
kernel matrix, for the sub-sampling, p-sparsified and accumulation sketches.

=========================== ======================================================== ================
name                        R                                                        E[R^T R] = I_n
=========================== ======================================================== ================
``subsample``               m rows of I_n, scaled sqrt(n/m) (uniform, no replacement)  yes
                            or 1/sqrt(m p_i) (approximate ridge leverage scores)
                            or 1/sqrt(P_i) (one member of every group first)
``gaussian``                R_ij ~ N(0, 1/m)                                          yes
``p-sparsified-rademacher`` R_ij = B_ij G_ij / sqrt(m p), B ~ Bernoulli(p), G = +-1      yes
``p-sparsified-gaussian``   the same with G ~ N(0, 1)                                 yes
``accumulation``            (1/sqrt(M)) sum_t D_t S_t (signed sub-samplings)           yes
``adaptive``                G K^q (rows orthonormalised by default)                   no
(``None`` / ``identity``)   I_n, handled without any n x n product                    yes
=========================== ======================================================== ================

Examples
--------
>>> sketch = PSparsifiedRademacherSketch(m=50, seed=0).fit(1000)
>>> sketch.A_.shape[0], sketch.used_.ndim
(50, 1)
>>> bool(np.allclose(sketch.matrix()[:, sketch.used_], sketch.A_.toarray()))
True
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from molpredict.component import Component
from molpredict.errors import ResourceError, SpecError
from molpredict.specs import is_no_sketch
from molpredict.kernels.base import Kernel, component_result_error

__all__ = [
    "Sketch",
    "IdentitySketch",
    "SubsampleSketch",
    "GaussianSketch",
    "PSparsifiedRademacherSketch",
    "PSparsifiedGaussianSketch",
    "AccumulationSketch",
    "AdaptiveSketch",
    "make_sketch",
    "bernoulli_positions",
    "leverage_scores",
    "group_spread_draw",
    "draw_problem",
]

#: bytes of kernel rows held at once by :meth:`Sketch.sketch_rows` / :meth:`Sketch.sketch_gram`
_BLOCK_BYTES = 256 * 2**20


# ----------------------------------------------------------------------------------------------------------
# pure helpers
# ----------------------------------------------------------------------------------------------------------

def bernoulli_positions(size: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions of the successes in ``size`` independent Bernoulli(p) trials, drawn in O(#successes).

    The gaps between successive successes are geometric, so no array of length ``size`` is ever formed.

    Parameters
    ----------
    size : int
        Number of trials (e.g. m * n for an m x n matrix, in row-major order).
    p : float
        Success probability, in (0, 1].
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of shape (n_successes,), int64, strictly increasing, in [0, size).
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    if p == 1.0:
        return np.arange(size, dtype=np.int64)
    expected = size * p
    chunk = int(expected + 6.0 * math.sqrt(expected) + 16)
    parts = []
    last = -1
    while last < size:
        positions = last + np.cumsum(rng.geometric(p, size=chunk).astype(np.int64))
        parts.append(positions[positions < size])
        last = int(positions[-1])
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def leverage_scores(kernel: Kernel, lam: float, n_landmarks: int, rng: np.random.Generator) -> np.ndarray:
    """Approximate ridge leverage scores l_i = [K (K + n lam I)^-1]_ii (Alaoui & Mahoney, 2015).

    K is replaced by its Nystrom approximation on ``n_landmarks`` uniformly chosen points, so only
    ``n_landmarks`` rows of K are computed.

    Parameters
    ----------
    kernel : Kernel
        Fitted on the n points.
    lam : float
        The ridge (the scores use n * lam, like the models).
    n_landmarks : int
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of shape (n,), in [0, 1].
    """
    n = int(kernel.n_fit_)
    k = min(n, max(1, int(n_landmarks)))
    landmarks = np.sort(rng.choice(n, size=k, replace=False))
    K_ln = kernel.gram(landmarks)  # (k, n)
    from molpredict.engine.linalg import truncated_eigh
    s, V = truncated_eigh(K_ln[:, landmarks])
    features = K_ln.T @ (V / np.sqrt(s))  # (n, r): K ~= features @ features.T
    gram = features.T @ features
    gram[np.diag_indices_from(gram)] += n * lam
    solved = np.linalg.solve(gram, features.T)  # (r, n)
    return np.clip(np.einsum("ij,ji->i", features, solved), 0.0, 1.0)


def group_spread_draw(groups: np.ndarray, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``m`` distinct indices spread over groups: one random member of every group first (the groups in
    random order, so with fewer draws than groups a random subset of them), then the rest uniformly without
    replacement among the members not yet drawn.

    Parameters
    ----------
    groups : ndarray of shape (n,)
        Any hashable labels (e.g. the structure of each training spectrum); ``m < n``.
    m : int
    rng : numpy.random.Generator

    Returns
    -------
    used : ndarray of shape (m,), int64, sorted
    inclusion : ndarray of shape (m,), float64
        The probability that each drawn index is drawn: ``m / G / s_i`` with ``m < G`` groups, else
        ``1 / s_i + (1 - 1 / s_i) (m - G) / (n - G)`` (``s_i`` its group's size).
    """
    n = len(groups)
    _, label, sizes = np.unique(np.asarray(groups), return_inverse=True, return_counts=True)
    label = label.reshape(-1)
    n_groups = len(sizes)
    order = rng.permutation(n)
    _, first = np.unique(label[order], return_index=True)  # a uniform random member of every group
    picks = order[first]
    rng.shuffle(picks)
    if m <= n_groups:
        used = picks[:m]
    else:
        rest = np.setdiff1d(np.arange(n), picks, assume_unique=True)
        used = np.concatenate([picks, rng.choice(rest, size=m - n_groups, replace=False)])
    used = np.sort(used).astype(np.int64)
    size = sizes[label[used]].astype(np.float64)
    if m <= n_groups:
        inclusion = (m / n_groups) / size
    else:
        inclusion = 1.0 / size + (1.0 - 1.0 / size) * (m - n_groups) / (n - n_groups)
    return used, inclusion


def draw_problem(used: Any, A: Any, n: int) -> str | None:
    """What breaks the contract R = A I_n[used, :] in a sketch's draw, or None.

    Parameters
    ----------
    used : array-like, expected of shape (n',), integers, distinct, in [0, n) (any order: :meth:`Sketch.fit`
        sorts them, with the columns of ``A``)
    A : ndarray or scipy.sparse matrix, expected of shape (m, n') with m >= 1, finite
    n : int
        Number of columns of R.

    Returns
    -------
    str or None
        E.g. ``"used indices out of [0, 40): min -3"``; duplicate indices are an error rather than merged, since a
        draw that repeats a point is a bug more often than a choice.
    """
    used = np.asarray(used)
    if used.ndim != 1 or not (used.dtype.kind in "iu" or (used.size == 0 and used.dtype.kind == "f")):
        return f"used indices of shape {used.shape} and dtype {used.dtype}, not a 1-D integer array"
    if used.size and (int(used.min()) < 0 or int(used.max()) >= n):
        return f"used indices out of [0, {n}): min {int(used.min())}, max {int(used.max())}"
    n_duplicates = int(np.count_nonzero(np.diff(np.sort(used)) == 0))
    if n_duplicates:
        return f"{n_duplicates} duplicate used indices"
    if not sp.issparse(A):
        A = np.asarray(A)
    if A.ndim != 2 or A.shape[1] != used.size or A.shape[0] < 1:
        return f"weights A of shape {A.shape} for {used.size} used indices, expected (m >= 1, {used.size})"
    try:
        finite = bool(np.isfinite(np.asarray(A.data if sp.issparse(A) else A, dtype=np.float64)).all())
    except (TypeError, ValueError):
        return f"weights A of dtype {A.dtype}, not numbers"
    return None if finite else "NaN or infinite weights in A"


def _memory_check(n_bytes: float, max_memory_gb: float, what: str) -> None:
    if max_memory_gb is not None and n_bytes > float(max_memory_gb) * 2**30:
        raise ResourceError(f"{what} needs {n_bytes / 2**30:.1f} GB, over the budget max_memory_gb="
                            f"{max_memory_gb}; use a sub-sampling or p-sparsified sketch, or raise the budget")


# ----------------------------------------------------------------------------------------------------------
# the ABC
# ----------------------------------------------------------------------------------------------------------

class Sketch(Component, ABC):
    """A random m x n sketch matrix R, stored as ``R = A_ @ I_n[used_, :]``.

    Subclasses implement :meth:`_draw`; everything else (dense form, products with kernel rows) is here.

    Parameters
    ----------
    m : int
        Number of rows (sketch size).
    seed : int or None
        Seed of the random draw (None: fresh entropy, not reproducible).

    Fitted attributes
    -----------------
    n_ : int
        Number of columns (training points).
    m_ : int
        Number of rows actually drawn (``min(m, n)`` for sub-sampling).
    used_ : ndarray of shape (n',), int64
        Sorted indices of the columns of R that are not identically zero.
    A_ : ndarray or scipy.sparse.csr_matrix of shape (m_, n')
        ``R[:, used_]``.
    """

    #: E[R^T R] = I_n (the conformance check tests it by Monte Carlo)
    isometric: ClassVar[bool] = True
    #: fit needs the fitted kernel
    needs_kernel: ClassVar[bool] = False
    #: R is the identity (models skip the products)
    is_identity: ClassVar[bool] = False
    #: the draw reads the groups of the n points (``fit(n, groups=...)``); the others ignore them
    uses_groups: ClassVar[bool] = False

    def __init__(self, m: int = 100, seed: int | None = None) -> None:
        self.m = m
        self.seed = seed

    # -- to implement ------------------------------------------------------------------------------------
    @abstractmethod
    def _draw(self, n: int, rng: np.random.Generator,
              kernel: Kernel | None) -> tuple[np.ndarray, "np.ndarray | sp.csr_matrix"]:
        """Return (used, A) for n columns."""

    # -- provided ----------------------------------------------------------------------------------------
    def fit(self, n: int, kernel: Kernel | None = None, groups: np.ndarray | None = None) -> "Sketch":
        """Draw R for ``n`` columns.

        Parameters
        ----------
        n : int
            Number of training points (columns of R).
        kernel : Kernel, optional
            The kernel fitted on those n points; required by data-adaptive sketches (``needs_kernel``).
        groups : ndarray of shape (n,), optional
            A label per point (e.g. the structure of each training spectrum), read by the sketches that
            ``uses_groups``; without it every point is its own group.

        Raises
        ------
        PluginError (RuntimeError for a built-in sketch)
            The draw breaks the contract (:func:`draw_problem`); the message names the sketch and its plugin. Indices
            drawn in another order are sorted, with the columns of ``A_``.
        """
        n = int(n)
        if n < 1:
            raise ValueError(f"{type(self).__name__}.fit: n must be positive, got {n}")
        if groups is not None and np.shape(groups) != (n,):
            raise ValueError(f"{type(self).__name__}.fit: groups must have shape ({n},), got {np.shape(groups)}")
        if self.needs_kernel:
            if kernel is None:
                raise ValueError(f"{type(self).__name__}.fit needs the fitted kernel (fit(n, kernel))")
            self._check_kernel(kernel, n)
        if not self.is_identity and (self.m is None or int(self.m) < 1):
            raise SpecError(f"{type(self).__name__}: m must be a positive integer, got {self.m!r}")
        rng = np.random.default_rng(self.seed)
        used, A = (self._draw(n, rng, kernel, groups) if self.uses_groups else self._draw(n, rng, kernel))
        problem = draw_problem(used, A, n)
        if problem is not None:
            raise component_result_error(self, "sketch", f"_draw returned {problem}")
        used = np.asarray(used, dtype=np.int64)
        if sp.issparse(A):
            A = sp.csr_matrix(A, dtype=np.float64)
            A.sort_indices()
        else:
            A = np.ascontiguousarray(A, dtype=np.float64)
        if used.size > 1 and (used[1:] < used[:-1]).any():
            # R = A I[used] does not depend on the order of the pairs (column of A, index): sort them together
            order = np.argsort(used, kind="stable")
            used, A = used[order], A[:, order]
            if sp.issparse(A):
                A = sp.csr_matrix(A)
                A.sort_indices()
        self.n_ = n
        self.m_ = int(A.shape[0])
        self.used_ = used
        self.A_ = A
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "A_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(n) first")

    @staticmethod
    def _check_kernel(kernel: Kernel, n: int) -> int:
        n_fit = getattr(kernel, "n_fit_", None)
        if n_fit is None:
            raise RuntimeError(f"{type(kernel).__name__} is not fitted: call kernel.fit(objects) first")
        if int(n_fit) != n:
            raise ValueError(f"the sketch has {n} columns but the kernel was fitted on {n_fit} objects")
        return int(n_fit)

    def matrix(self) -> np.ndarray:
        """The dense sketch matrix R, shape (m_, n_) (for tests and small n)."""
        self._check_fitted()
        R = np.zeros((self.m_, self.n_), dtype=np.float64)
        R[:, self.used_] = self.A_.toarray() if sp.issparse(self.A_) else self.A_
        return R

    def apply(self, K_used: np.ndarray) -> np.ndarray:
        """``A_ @ K_used``: R times a matrix whose rows are given only at ``used_``.

        Parameters
        ----------
        K_used : ndarray of shape (n', k)

        Returns
        -------
        ndarray of shape (m_, k)
        """
        self._check_fitted()
        return np.asarray(self.A_ @ np.asarray(K_used, dtype=np.float64))

    def apply_transpose(self, X: np.ndarray) -> np.ndarray:
        """``A_.T @ X``: R^T times a matrix, returned only at the ``used_`` rows (the others are zero).

        Parameters
        ----------
        X : ndarray of shape (m_, k)

        Returns
        -------
        ndarray of shape (n', k)
        """
        self._check_fitted()
        return np.ascontiguousarray(np.asarray(self.A_.T @ np.asarray(X, dtype=np.float64)))

    def apply_right(self, X_used: np.ndarray) -> np.ndarray:
        """``X_used @ A_.T``: a matrix times R^T, with its columns given only at ``used_``.

        Parameters
        ----------
        X_used : ndarray of shape (k, n')

        Returns
        -------
        ndarray of shape (k, m_)
        """
        self._check_fitted()
        X_used = np.asarray(X_used, dtype=np.float64)
        if sp.issparse(self.A_):
            return np.ascontiguousarray(np.asarray(self.A_ @ X_used.T).T)
        return X_used @ self.A_.T

    def _row_blocks(self, n: int):
        step = max(1, _BLOCK_BYTES // (8 * max(n, 1)))
        A = self.A_.tocsc() if sp.issparse(self.A_) else self.A_
        for start in range(0, self.used_.shape[0], step):
            stop = min(start + step, self.used_.shape[0])
            if sp.issparse(A):
                block = A[:, start:stop].tocsr()
                rows = np.flatnonzero(np.diff(block.indptr))
                yield start, stop, rows, block[rows]
            else:
                yield start, stop, None, A[:, start:stop]

    def sketch_rows(self, kernel: Kernel) -> np.ndarray:
        """R K: the sketched kernel rows, computed from ``K[used_, :]`` in blocks (never n x n).

        Parameters
        ----------
        kernel : Kernel
            Fitted on the n_ training points.

        Returns
        -------
        ndarray of shape (m_, n_)
        """
        self._check_fitted()
        n = self._check_kernel(kernel, self.n_)
        out = np.zeros((self.m_, n), dtype=np.float64)
        for start, stop, rows, weights in self._row_blocks(n):
            block = kernel.gram(self.used_[start:stop])  # (b, n)
            if rows is None:
                out += weights @ block
            elif rows.size:
                out[rows] += np.asarray(weights @ block)
        return out

    def sketch_gram(self, kernel: Kernel) -> np.ndarray:
        """R K R^T, shape (m_, m_), from ``K[used_, used_]`` computed in blocks."""
        self._check_fitted()
        n = self._check_kernel(kernel, self.n_)
        partial = np.zeros((self.m_, self.used_.shape[0]), dtype=np.float64)
        for start, stop, rows, weights in self._row_blocks(n):
            block = kernel.gram(self.used_[start:stop])[:, self.used_]
            if rows is None:
                partial += weights @ block
            elif rows.size:
                partial[rows] += np.asarray(weights @ block)
        out = self.apply_right(partial)
        return (out + out.T) / 2.0


# ----------------------------------------------------------------------------------------------------------
# built-in sketches
# ----------------------------------------------------------------------------------------------------------

class IdentitySketch(Sketch):
    """No sketch: R = I_n. ``used_ = arange(n)``, ``A_`` a sparse identity; products skip it entirely.

    Models use it for ``sketch=None`` (IOKR, and the un-sketched side of SIOKR / ISOKR).
    """

    is_identity: ClassVar[bool] = True

    def __init__(self) -> None:
        self.m = None
        self.seed = None

    @classmethod
    def param_names(cls) -> list[str]:
        return []

    def _draw(self, n, rng, kernel):
        return np.arange(n, dtype=np.int64), sp.identity(n, format="csr", dtype=np.float64)

    def matrix(self) -> np.ndarray:
        self._check_fitted()
        return np.eye(self.n_)

    def apply(self, K_used: np.ndarray) -> np.ndarray:
        self._check_fitted()
        return np.asarray(K_used, dtype=np.float64)

    def apply_right(self, X_used: np.ndarray) -> np.ndarray:
        self._check_fitted()
        return np.asarray(X_used, dtype=np.float64)

    def apply_transpose(self, X: np.ndarray) -> np.ndarray:
        self._check_fitted()
        return np.asarray(X, dtype=np.float64)

    def sketch_rows(self, kernel: Kernel) -> np.ndarray:
        self._check_fitted()
        self._check_kernel(kernel, self.n_)
        return kernel.gram()

    def sketch_gram(self, kernel: Kernel) -> np.ndarray:
        return self.sketch_rows(kernel)


class SubsampleSketch(Sketch):
    """Sub-sampling (Nystrom): m rows of I_n.

    ``probs="uniform"``: m distinct indices drawn uniformly without replacement, every row scaled by
    sqrt(n/m), so that E[R^T R] = (n/m) P(i drawn) I = I_n. ``probs="leverage"``: m indices drawn i.i.d. (with
    replacement) with probabilities p_i proportional to approximate ridge leverage scores (Alaoui & Mahoney,
    2015; computed from a uniform Nystrom approximation on m points, so the fit needs the kernel), row j
    scaled 1/sqrt(m p_{i_j}); E[R^T R] = I_n again, and an index drawn twice gives two identical rows
    (``used_`` lists it once). ``probs="groups"``: m distinct indices spread over the groups given to ``fit``
    (:func:`group_spread_draw`: one member of every group before any group gets a second), row j scaled
    1/sqrt(P_{i_j}) by its inclusion probability, so E[R^T R] = I_n; without groups it is the uniform draw.
    SISOKR's input side passes the structure of each training spectrum, so ``input_sketch="subsample:m=4000,
    probs=groups"`` draws a landmark per training structure instead of crowding them on the structures with many
    spectra (an option: docs/benchmarks/input_landmarks.md).
    The scaling does not change SISOKR's estimator (only the row space of R matters) but it does change DSOKR's
    basis. With ``m >= n`` the sketch keeps all n columns, unscaled.

    Parameters
    ----------
    m : int
    probs : {"uniform", "leverage", "groups"}
    leverage_lam : float
        The ridge of the leverage scores (the scores use n * leverage_lam).
    seed : int or None
    """

    def __init__(self, m: int = 2000, probs: str = "uniform", leverage_lam: float = 1e-3,
                 seed: int | None = None) -> None:
        self.m = m
        self.probs = probs
        self.leverage_lam = leverage_lam
        self.seed = seed

    @property
    def needs_kernel(self) -> bool:  # type: ignore[override]
        return self.probs == "leverage"

    @property
    def uses_groups(self) -> bool:  # type: ignore[override]
        return self.probs == "groups"

    def _draw(self, n, rng, kernel, groups=None):
        if self.probs not in ("uniform", "leverage", "groups"):
            raise SpecError(f"subsample: probs must be 'uniform', 'leverage' or 'groups', got {self.probs!r}")
        m = int(self.m)
        if m >= n:
            return np.arange(n, dtype=np.int64), sp.identity(n, format="csr", dtype=np.float64)
        if self.probs == "groups":
            used, inclusion = group_spread_draw(np.arange(n) if groups is None else groups, m, rng)
            return used, sp.diags(1.0 / np.sqrt(inclusion), format="csr")
        if self.probs == "uniform":
            used = np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)
            return used, sp.diags(np.full(m, math.sqrt(n / m)), format="csr")
        scores = leverage_scores(kernel, float(self.leverage_lam), m, rng)
        probs = scores / scores.sum() if scores.sum() > 0 else np.full(n, 1.0 / n)
        drawn = rng.choice(n, size=m, replace=True, p=probs)
        used, position = np.unique(drawn, return_inverse=True)
        A = sp.csr_matrix((1.0 / np.sqrt(m * probs[drawn]), (np.arange(m), position)), shape=(m, used.size))
        return used.astype(np.int64), A


class GaussianSketch(Sketch):
    """Gaussian sketch: R_ij ~ N(0, 1/m), dense; every column is used, so products need all of K (O(m n^2)).

    Parameters
    ----------
    m : int
    seed : int or None
    max_memory_gb : float
        Refuse (ResourceError) when the dense m x n matrix would exceed this many GB.
    """

    def __init__(self, m: int = 100, seed: int | None = None, max_memory_gb: float = 4.0) -> None:
        self.m = m
        self.seed = seed
        self.max_memory_gb = max_memory_gb

    def _draw(self, n, rng, kernel):
        m = int(self.m)
        _memory_check(8.0 * m * n, self.max_memory_gb, f"gaussian sketch ({m} x {n} dense)")
        return np.arange(n, dtype=np.int64), rng.standard_normal((m, n)) / math.sqrt(m)


class _PSparsifiedSketch(Sketch):
    """p-sparsified sketch (El Ahmad et al., TMLR 2023): R_ij = B_ij G_ij / sqrt(m p), B_ij ~ Bernoulli(p).

    The Bernoulli mask is generated sparsely (geometric gaps between successes: O(m n p) time and memory, never
    an m x n array). Columns that are all zero are dropped: R = A_ I_n[used_, :] with n' ~ n (1 - (1 - p)^m)
    used columns, so only ``K[used_, :]`` is ever computed. E[R^T R] = I_n; products R K R^T carry the factor
    1/(m p) (not p/m).

    Parameters
    ----------
    m : int
    p : float or None
        Probability of a non-zero; None means 20 / n (about 20 non-zeros per row). Capped at 1.
    seed : int or None
    """

    def __init__(self, m: int = 800, p: float | None = None, seed: int | None = None) -> None:
        self.m = m
        self.p = p
        self.seed = seed

    @abstractmethod
    def _values(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """The G_ij at the non-zeros, shape (size,)."""

    def probability(self, n: int) -> float:
        """The Bernoulli probability used for n columns."""
        p = 20.0 / n if self.p is None else float(self.p)
        if not p > 0:
            raise SpecError(f"{type(self).__name__}: p must be positive, got {self.p!r}")
        return min(p, 1.0)

    def _draw(self, n, rng, kernel):
        m = int(self.m)
        p = self.probability(n)
        flat = bernoulli_positions(m * n, p, rng)
        rows, cols = np.divmod(flat, n)
        values = self._values(flat.size, rng) / math.sqrt(m * p)
        used = np.unique(cols)
        A = sp.csr_matrix((values, (rows, np.searchsorted(used, cols))), shape=(m, used.size))
        return used.astype(np.int64), A


class PSparsifiedRademacherSketch(_PSparsifiedSketch):
    __doc__ = _PSparsifiedSketch.__doc__.replace("G_ij / sqrt(m p)", "G_ij / sqrt(m p), G_ij = +-1 (Rademacher)", 1)

    def _values(self, size, rng):
        return rng.integers(0, 2, size=size).astype(np.float64) * 2.0 - 1.0


class PSparsifiedGaussianSketch(_PSparsifiedSketch):
    __doc__ = _PSparsifiedSketch.__doc__.replace("G_ij / sqrt(m p)", "G_ij / sqrt(m p), G_ij ~ N(0, 1)", 1)

    def _values(self, size, rng):
        return rng.standard_normal(size)


class AccumulationSketch(Sketch):
    """Accumulation sketch (Chen & Yang, AISTATS 2021): R = (1/sqrt(M)) sum_{t=1..M} D_t S_t.

    Each S_t is an m x n sub-sampling matrix whose rows are i.i.d. uniform rows of I_n scaled sqrt(n/m), each
    D_t a diagonal of random signs. M = 1 is (signed) Nystrom, M -> infinity tends to a Gaussian sketch, at
    the cost of sub-sampling: at most m M columns are used. E[R^T R] = I_n.

    Parameters
    ----------
    m : int
    M : int
        Number of accumulated sub-samplings.
    seed : int or None
    """

    def __init__(self, m: int = 800, M: int = 8, seed: int | None = None) -> None:
        self.m = m
        self.M = M
        self.seed = seed

    def _draw(self, n, rng, kernel):
        m, M = int(self.m), int(self.M)
        if M < 1:
            raise SpecError(f"accumulation: M must be a positive integer, got {self.M!r}")
        cols = rng.integers(0, n, size=(M, m))
        signs = rng.integers(0, 2, size=(M, m)).astype(np.float64) * 2.0 - 1.0
        rows = np.broadcast_to(np.arange(m), (M, m))
        R = sp.csr_matrix((signs.ravel() * math.sqrt(n / m) / math.sqrt(M), (rows.ravel(), cols.ravel())),
                          shape=(m, n))  # duplicates are summed
        R.eliminate_zeros()  # opposite signs on one entry cancel
        used = np.flatnonzero(np.diff(R.tocsc().indptr))
        return used.astype(np.int64), R[:, used]


class AdaptiveSketch(Sketch):
    """Adaptive sketch (Lacotte, Pilanci & Pavone, NeurIPS 2019): R = G K^q, G Gaussian (m x n).

    Its rows span a data-adapted subspace (the range of K's top eigenvectors), so fits are better
    conditioned, but the fit needs **all of K**: the n x n Gram matrix is computed and held during
    :meth:`fit` (ResourceError past ``max_memory_gb``), and :meth:`sketch_rows` multiplies by all of K again.
    It is not an isometry in expectation: only the spanned subspace matters (SISOKR depends only on the row
    space of R). With ``orthonormalize`` the rows are replaced by an orthonormal basis of that row space
    (same estimator, better conditioned numbers).

    Parameters
    ----------
    m : int
    q : int
        Number of power steps.
    orthonormalize : bool
    seed : int or None
    max_memory_gb : float
    """

    isometric: ClassVar[bool] = False
    needs_kernel: ClassVar[bool] = True

    def __init__(self, m: int = 100, q: int = 1, orthonormalize: bool = True, seed: int | None = None,
                 max_memory_gb: float = 4.0) -> None:
        self.m = m
        self.q = q
        self.orthonormalize = orthonormalize
        self.seed = seed
        self.max_memory_gb = max_memory_gb

    def _draw(self, n, rng, kernel):
        m, q = int(self.m), int(self.q)
        if q < 0:
            raise SpecError(f"adaptive: q must be a non-negative integer, got {self.q!r}")
        _memory_check(8.0 * (n * n + 2 * m * n), self.max_memory_gb, f"adaptive sketch (all of K: {n} x {n})")
        R = rng.standard_normal((m, n)) / math.sqrt(m)
        if q:
            K = kernel.gram()
            for _ in range(q):
                R = R @ K
            del K
        if self.orthonormalize:
            Q, _ = np.linalg.qr(R.T)
            R = Q.T
        return np.arange(n, dtype=np.int64), R


# ----------------------------------------------------------------------------------------------------------

def make_sketch(spec: "str | Sketch | None", **overrides: Any) -> Sketch:
    """A sketch from a spec string (``"p-sparsified-rademacher:m=800"``); None, ``"none"`` or ``"identity"``
    give :class:`IdentitySketch`. ``overrides`` (e.g. ``seed``) fill parameters the spec does not set."""
    if isinstance(spec, Sketch):
        return spec
    if is_no_sketch(spec):
        return IdentitySketch()
    from molpredict.registry import create
    return create("sketch", spec, **overrides)
