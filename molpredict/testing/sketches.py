"""Conformance checks for sketches: run :func:`check_sketch` on your own ``Sketch`` subclass.

Example
-------
>>> from molpredict.engine.sketches import PSparsifiedRademacherSketch
>>> from molpredict.testing import check_sketch
>>> report = check_sketch(PSparsifiedRademacherSketch(m=10, seed=0), n=40, n_draws=100)
>>> sorted(report)[:3]
['isometry_z', 'm', 'n']

A plugin's test suite can simply call ``check_sketch(MySketch(m=20))`` (or a factory
``lambda seed: MySketch(m=20, seed=seed)``); it raises ``AssertionError`` naming the property that fails.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.errors import PluginError
from molpredict.kernels.base import Kernel
from molpredict.engine.sketches import Sketch

__all__ = ["check_sketch", "RBFKernel"]


class RBFKernel(Kernel):
    """A Gaussian RBF kernel on numpy vectors, exp(-gamma ||a - b||^2) (already normalised).

    Small and dependency-free: the reference kernel of the sketch conformance checks.
    """

    input_type = "vector"
    normalized = False

    def __init__(self, gamma: float = 0.5) -> None:
        self.gamma = gamma

    def featurize(self, objects: Sequence[Any]) -> np.ndarray:
        return np.atleast_2d(np.asarray(objects, dtype=np.float64)).reshape(len(objects), -1)

    def pairwise(self, fa: np.ndarray, fb: np.ndarray) -> np.ndarray:
        sq = (fa ** 2).sum(1)[:, None] + (fb ** 2).sum(1)[None, :] - 2.0 * fa @ fb.T
        return np.exp(-self.gamma * np.maximum(sq, 0.0))

    def self_similarity(self, features: np.ndarray) -> np.ndarray:
        return np.ones(len(features))


def _factory(sketch: "Sketch | Callable[[int], Sketch]") -> Callable[[int], Sketch]:
    """``seed -> unfitted sketch``: an instance is re-created through its class from ``get_params()`` (as a model's
    spec re-creates it), and a failure to do so is the named check failure ``re-creation``, not a traceback."""
    if isinstance(sketch, Sketch):
        cls = type(sketch)

        def make(seed: int) -> Sketch:
            try:
                params = sketch.get_params()
                return cls(**params) if "seed" not in params else cls(**{**params, "seed": seed})
            except Exception as exc:
                detail = " ".join(f"{type(exc).__name__}: {exc}".split())
                raise AssertionError(f"{cls.__name__}: re-creation: {cls.__name__}(**get_params()) raised {detail} "
                                     "(__init__ must store each parameter under its own name)") from None
        return make
    if callable(sketch):
        return sketch
    raise TypeError("check_sketch takes a Sketch instance or a factory seed -> Sketch")


def check_sketch(sketch: "Sketch | Callable[[int], Sketch]", n: int = 60, n_draws: int = 200, seed: int = 0,
                 z_max: float = 5.0) -> dict[str, Any]:
    """Check a sketch type against the ``Sketch`` contract.

    Checks: ``matrix()`` has shape (m_, n); ``used_`` is sorted, unique, int64 and in range; ``A_`` has shape
    (m_, len(used_)) and equals ``matrix()[:, used_]``, and the other columns are zero; the same seed gives the
    same matrix; ``apply``, ``apply_right``, ``apply_transpose``, ``sketch_rows`` and ``sketch_gram`` equal the
    dense R K, K R^T, R^T X, R K, R K R^T on a small RBF kernel; and, for types with ``isometric = True``,
    E[R^T R] = I_n by Monte Carlo over ``n_draws`` seeds: the trace / n, and the quadratic forms v^T R^T R w for a
    few fixed random vectors, must lie within ``z_max`` standard errors of their expected values (a scaling
    error such as p/m instead of 1/(m p) fails by hundreds of standard errors).

    Parameters
    ----------
    sketch : Sketch or callable
        An instance (re-created with other seeds through its parameters) or a factory ``seed -> Sketch``.
    n : int
        Number of columns.
    n_draws : int
        Monte Carlo draws for the isometry check.
    seed : int
    z_max : float

    Returns
    -------
    dict
        ``n``, ``m``, ``n_used`` and, for isometric types, ``isometry_z`` (the largest z-score seen).

    Raises
    ------
    AssertionError
        Naming the property that fails.
    """
    make = _factory(sketch)
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(n, 3))
    kernel = RBFKernel(gamma=0.3).fit(points)
    K = kernel.gram()

    first = make(seed)
    name = type(first).__name__
    try:
        first.fit(n, kernel)
    except PluginError as exc:  # Sketch.fit's own check of the draw (used_, A_), as training would stop on it
        raise AssertionError(f"{name}: draw: {exc}") from None
    R = first.matrix()
    m = first.m_
    assert R.shape == (m, n), f"{name}: matrix() has shape {R.shape}, expected ({m}, {n})"
    used = first.used_
    assert isinstance(used, np.ndarray) and used.dtype == np.int64 and used.ndim == 1, \
        f"{name}: used_ must be a 1-D int64 array"
    assert np.all(np.diff(used) > 0), f"{name}: used_ must be sorted and unique"
    assert used.size == 0 or (used[0] >= 0 and used[-1] < n), f"{name}: used_ out of range"
    A = first.A_.toarray() if sp.issparse(first.A_) else np.asarray(first.A_)
    assert A.shape == (m, used.size), f"{name}: A_ has shape {A.shape}, expected ({m}, {used.size})"
    assert np.array_equal(R[:, used], A), f"{name}: matrix()[:, used_] differs from A_"
    unused = np.setdiff1d(np.arange(n), used)
    assert not np.any(R[:, unused]), f"{name}: columns outside used_ are not zero"

    again = make(seed).fit(n, kernel).matrix()
    assert np.array_equal(R, again), f"{name}: the same seed gave a different matrix"

    scale = max(1.0, float(np.abs(R).max()) ** 2 * n)
    tol = 1e-10 * scale
    assert np.allclose(first.apply(K[used]), R @ K, rtol=1e-10, atol=tol), f"{name}: apply(K[used_]) != R K"
    assert np.allclose(first.apply_right(K[:, used]), K @ R.T, rtol=1e-10, atol=tol), \
        f"{name}: apply_right(K[:, used_]) != K R^T"
    X = rng.normal(size=(m, 3))
    assert np.allclose(first.apply_transpose(X), (R.T @ X)[used], rtol=1e-10, atol=tol), \
        f"{name}: apply_transpose(X) != (R^T X)[used_]"
    assert np.allclose(first.sketch_rows(kernel), R @ K, rtol=1e-10, atol=tol), f"{name}: sketch_rows != R K"
    assert np.allclose(first.sketch_gram(kernel), R @ K @ R.T, rtol=1e-10, atol=tol), \
        f"{name}: sketch_gram != R K R^T"

    report: dict[str, Any] = {"n": n, "m": m, "n_used": int(used.size)}
    if not getattr(first, "isometric", True):
        return report

    vectors = rng.normal(size=(n, 4))
    pairs = [(0, 0), (1, 1), (2, 2), (0, 1), (2, 3)]
    stats = np.empty((n_draws, 1 + len(pairs)))
    for d in range(n_draws):
        Rd = make(seed + 1 + d).fit(n, kernel).matrix()
        RV = Rd @ vectors
        stats[d, 0] = np.sum(Rd * Rd) / n
        stats[d, 1:] = [RV[:, i] @ RV[:, j] for i, j in pairs]
    expected = np.array([1.0] + [vectors[:, i] @ vectors[:, j] for i, j in pairs])
    mean = stats.mean(0)
    stderr = stats.std(0, ddof=1) / np.sqrt(n_draws)
    floor = 1e-12 * np.maximum(1.0, np.abs(expected))
    z = np.abs(mean - expected) / np.maximum(stderr, floor)
    report["isometry_z"] = float(z.max())
    assert z.max() <= z_max, (f"{name}: E[R^T R] != I_n: statistics {np.round(mean, 4).tolist()} vs expected "
                              f"{np.round(expected, 4).tolist()} (max z = {z.max():.1f})")
    return report
