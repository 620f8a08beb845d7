"""Conformance checks for kernels: run :func:`check_kernel` on your own kernel in your plugin's tests.

Example
-------
A plugin author's test for a new input kernel (any :class:`molpredict.kernels.base.Kernel` subclass)::

    import numpy as np
    from molpredict.spectra.cleaning import Spectrum
    from molpredict.testing import check_kernel
    from my_plugin import PrecursorGaussianKernel

    def test_conformance():
        rng = np.random.default_rng(0)
        spectra = [Spectrum(f"s{i}", np.sort(rng.uniform(50, 500, 8)), rng.uniform(1, 100, 8),
                            precursor_mz=float(rng.uniform(100, 600))) for i in range(30)]
        check_kernel(PrecursorGaussianKernel(sigma=5.0), spectra)

Include a few near-duplicates and edge cases (an empty spectrum, a one-atom molecule) among ``objects``: the
checks are only as strong as the objects they see.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Sequence

import numpy as np

__all__ = ["check_kernel"]


def _fail(kernel: Any, check: str, detail: str) -> None:
    raise AssertionError(f"check_kernel({type(kernel).__name__}): {check}: {detail}")


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> tuple[float, tuple[int, ...]]:
    diff = np.abs(a - b)
    where = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    return (float(diff.max()) if diff.size else 0.0), tuple(int(i) for i in where)


def check_kernel(kernel: Any, objects: Sequence[Any], *, n_sample: int = 60, atol: float = 1e-8,
                 seed: int = 0, psd: bool | None = None) -> None:
    """Check that ``kernel`` behaves as a molpredict kernel on ``objects``; raise ``AssertionError`` if not.

    The checks, on a seeded sample of at most ``n_sample`` objects (the reference set) and the remaining ones
    (queries, at most ``n_sample``):

    1. shapes: ``gram()`` is (n, n), ``transform(queries)`` is (n_queries, n), ``diagonal`` is (n,);
       all values finite;
    2. symmetry of the Gram matrix (``atol``);
    3. positive semi-definite: smallest eigenvalue of the Gram matrix >= ``-atol * max(1, largest)``, unless
       ``psd`` is False (default: the kernel's ``psd`` attribute);
    4. unit diagonal for normalised kernels (``normalized`` or ``unit_diagonal``): exactly 1 in ``gram``, ones
       from ``diagonal``, and ``transform(reference)`` ~ 1 on its self pairs for non-degenerate objects;
    5. ``diagonal(reference)`` equals the diagonal of ``gram()``;
    6. ``transform(reference)`` equals ``gram()`` off the diagonal (the fitted and the transform paths agree);
    7. determinism: a second fit of a deep copy of the unfitted kernel gives identical results;
    8. blocks: with ``block_rows`` forced to 3, ``gram``, ``gram(index)`` and ``transform`` give the same values;
    9. fitted state: unless the kernel says it cannot be saved (:class:`~molpredict.kernels.base.StateNotSaveable`),
       :meth:`~molpredict.kernels.base.Kernel.get_fitted_state` gives plain arrays and JSON, and the kernel
       :meth:`~molpredict.kernels.base.Kernel.from_fitted_state` rebuilds from them (after a JSON round trip,
       as a model file stores them) computes without error exactly the same ``gram`` and ``transform(queries)``.
       A kernel whose class is not registered (an instance of your class, not one the registry created) makes
       the same round trip through its class (:meth:`~molpredict.kernels.base.Kernel.get_fitted_attributes`).

    Parameters
    ----------
    kernel : Kernel
        An unfitted kernel instance (it is fitted here).
    objects : sequence
        Objects of the kernel's input type, at least 4.
    n_sample : int
        Size of the reference sample (and the largest number of queries).
    atol : float
        Absolute tolerance of the numerical comparisons.
    seed : int
        Seed of the sampling.
    psd : bool, optional
        Whether to check positive semi-definiteness (default: ``kernel.psd``, True when absent).
    """
    objects = list(objects)
    if len(objects) < 4:
        raise ValueError("check_kernel needs at least 4 objects")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(objects))
    n_ref = min(n_sample, len(objects) - len(objects) // 3)
    reference = [objects[i] for i in order[:n_ref]]
    queries = [objects[i] for i in order[n_ref:n_ref + n_sample]] or reference[:2]
    pristine = copy.deepcopy(kernel)
    unit = bool(getattr(kernel, "normalized", True) or getattr(kernel, "unit_diagonal", False))
    check_psd = bool(getattr(kernel, "psd", True)) if psd is None else psd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate-object warnings are expected on edge cases
        kernel.fit(reference)
        gram = kernel.gram()
        trans_ref = kernel.transform(reference)
        trans_q = kernel.transform(queries)
        diag = kernel.diagonal(reference)

    n = len(reference)
    # 1. shapes
    for name, value, shape in (("gram()", gram, (n, n)), ("transform(reference)", trans_ref, (n, n)),
                               ("transform(queries)", trans_q, (len(queries), n)), ("diagonal", diag, (n,))):
        value = np.asarray(value)
        if value.shape != shape:
            _fail(kernel, "shape", f"{name} has shape {value.shape}, expected {shape}")
        if not np.all(np.isfinite(value)):
            _fail(kernel, "finite values", f"{name} has {int(np.sum(~np.isfinite(value)))} non-finite entries")
    # 2. symmetry
    err, at = _max_abs_diff(gram, gram.T)
    if err > atol:
        _fail(kernel, "symmetry", f"|K - K^T| = {err:.3g} at {at} > atol {atol:g}")
    # 3. PSD
    if check_psd:
        eig = np.linalg.eigvalsh((gram + gram.T) / 2.0)
        if eig[0] < -atol * max(1.0, float(eig[-1])):
            _fail(kernel, "positive semi-definite",
                  f"smallest eigenvalue {eig[0]:.3g} (largest {eig[-1]:.3g}) on {n} objects; if the kernel is only "
                  "approximately PSD, set its psd attribute to False")
    # 4. unit diagonal
    if unit:
        if not np.all(np.diag(gram) == 1.0):
            bad = int(np.flatnonzero(np.diag(gram) != 1.0)[0])
            _fail(kernel, "unit diagonal", f"gram()[{bad}, {bad}] = {gram[bad, bad]!r}, expected exactly 1")
        if not np.allclose(diag, 1.0, rtol=0.0, atol=atol):
            _fail(kernel, "unit diagonal", f"diagonal() is not all ones (min {diag.min():.17g})")
        raw_diag = getattr(kernel, "fit_diag_", None)
        self_pairs = np.diag(trans_ref)
        proper = np.ones(n, bool) if raw_diag is None or not getattr(kernel, "normalized", False) \
            else np.asarray(raw_diag) > 0
        err = float(np.max(np.abs(self_pairs[proper] - 1.0), initial=0.0))
        if err > atol:
            _fail(kernel, "unit diagonal", f"transform(reference) differs from 1 on a self pair by {err:.3g}")
    # 5. diagonal vs gram
    err, at = _max_abs_diff(np.asarray(diag, dtype=np.float64), np.diag(gram))
    if err > atol:
        _fail(kernel, "diagonal", f"diagonal(reference) differs from diag(gram()) by {err:.3g} at {at}")
    # 6. transform path == gram path off the diagonal
    off = ~np.eye(n, dtype=bool)
    err = float(np.max(np.abs(trans_ref - gram)[off], initial=0.0))
    if err > atol:
        _fail(kernel, "transform vs gram", f"transform(reference) differs from gram() off the diagonal by {err:.3g}")

    # 7. determinism
    second = copy.deepcopy(pristine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        second.fit(reference)
        gram2 = second.gram()
        trans_q2 = second.transform(queries)
    if not (np.array_equal(gram, gram2) and np.array_equal(trans_q, trans_q2)):
        err = max(_max_abs_diff(gram, gram2)[0], _max_abs_diff(trans_q, trans_q2)[0])
        _fail(kernel, "determinism", f"a second fit gives different values (max difference {err:.3g})")

    # 8. blocked == full
    blocked = copy.deepcopy(pristine)
    blocked.block_rows = 3
    index = np.arange(n)[::-1][: max(1, n // 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blocked.fit(reference)
        gram_b = blocked.gram()
        gram_i = blocked.gram(index)
        trans_b = blocked.transform(queries)
    for name, got, want in (("gram()", gram_b, gram), ("gram(index)", gram_i, gram[index]),
                            ("transform(queries)", trans_b, trans_q)):
        err, at = _max_abs_diff(got, want)
        if err > atol:
            _fail(kernel, "blocked computation", f"{name} with block_rows=3 differs by {err:.3g} at {at}")

    # 9. fitted state
    _check_fitted_state(kernel, gram, trans_q, queries)


def _check_fitted_state(kernel: Any, gram: np.ndarray, trans_q: np.ndarray, queries: Sequence[Any]) -> None:
    """Check 9: the round trip of the fitted state, as a model file makes it. A registered kernel goes through the
    registry (:meth:`~molpredict.kernels.base.Kernel.get_fitted_state`); one that is not (a plugin's test calls
    ``check_kernel(MyKernel(...))``) is rebuilt through its own class from the same parameters and fitted attributes
    (:meth:`~molpredict.kernels.base.Kernel.get_fitted_attributes`), so that fitted state kept where a model file
    does not look (a private attribute) fails here, not when a saved model is used."""
    import json

    from molpredict.kernels.base import Kernel, NotRegistered, StateNotSaveable

    if not isinstance(kernel, Kernel):
        return
    try:
        try:
            arrays, meta = kernel.get_fitted_state("kernel")
            rebuild = Kernel.from_fitted_state
        except NotRegistered:
            arrays, meta = kernel.get_fitted_attributes("kernel")
            rebuild = type(kernel).from_fitted_attributes
    except StateNotSaveable:
        return
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray) or array.dtype == object or not name.startswith("kernel."):
            _fail(kernel, "fitted state", f"state array {name!r} is not a plain array named kernel.*")
    try:
        meta = json.loads(json.dumps(meta))
    except (TypeError, ValueError) as exc:
        _fail(kernel, "fitted state", f"the state's metadata is not JSON ({exc})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rebuilt = rebuild({k: v.copy() for k, v in arrays.items()}, meta)
            gram_r, trans_r = rebuilt.gram(), rebuilt.transform(queries)
    except Exception as exc:  # a rebuilt kernel that cannot compute: state kept outside the saved attributes
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        _fail(kernel, "fitted state", f"the kernel rebuilt from its fitted state raised {detail} (a model file keeps "
              "the parameters and the public attributes ending in '_'; keep fitted state there)")
    if not (np.array_equal(gram_r, gram) and np.array_equal(trans_r, trans_q)):
        err = max(_max_abs_diff(gram_r, gram)[0], _max_abs_diff(trans_r, trans_q)[0])
        _fail(kernel, "fitted state", f"the kernel rebuilt from its fitted state differs by {err:.3g}")
