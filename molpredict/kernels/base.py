"""The ``Kernel`` ABC: fit on reference objects, transform new objects into a normalised, blocked kernel matrix.

A concrete kernel implements three small methods on *features* (whatever representation makes it fast:
sparse binned spectra, fingerprint matrices, graph lists):

- ``featurize(objects) -> features``   (``len(features) == len(objects)``)
- ``pairwise(fa, fb) -> ndarray (len(fa), len(fb))``   raw (unnormalised) kernel values
- ``self_similarity(f) -> ndarray (len(f),)``   raw k(x, x)

and the base class does the rest: remembering the reference features, computing in blocks so memory stays
bounded, and cosine normalisation ``k(a, b) / sqrt(k(a, a) k(b, b))`` when ``normalized`` is True.
Degenerate objects whose raw self-similarity is 0 (a spectrum with no peaks, an all-zero fingerprint) get
``k = 0`` with everything in :meth:`transform`, and ``k = 1`` on the diagonal of :meth:`gram` and in
:meth:`diagonal` (an object is always identical to itself). :meth:`fit`, :meth:`transform` and
:meth:`transform_features` each issue one :class:`DegenerateObjectWarning` giving how many such objects they met.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
import warnings
from typing import Any, ClassVar, Sequence

import numpy as np

from molpredict.component import Component

__all__ = ["Kernel", "InputKernel", "OutputKernel", "DegenerateObjectWarning", "normalize_block"]


def normalize_block(raw: np.ndarray, diag_rows: np.ndarray, diag_cols: np.ndarray) -> np.ndarray:
    """Cosine-normalise a raw kernel block in place; pairs involving a zero self-similarity become 0.

    Parameters
    ----------
    raw : ndarray of shape (n_rows, n_cols)
    diag_rows : ndarray of shape (n_rows,)
    diag_cols : ndarray of shape (n_cols,)
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_r = np.where(diag_rows > 0, 1.0 / np.sqrt(diag_rows), 0.0)
        inv_c = np.where(diag_cols > 0, 1.0 / np.sqrt(diag_cols), 0.0)
    raw *= inv_r[:, None]
    raw *= inv_c[None, :]
    return raw


class DegenerateObjectWarning(UserWarning):
    """Some objects have a zero raw self-similarity (e.g. spectra without peaks): k = 0 with all others."""


def _warn_degenerate(kernel: "Kernel", n_degenerate: int, n_total: int, where: str) -> None:
    if n_degenerate:
        warnings.warn(
            f"{type(kernel).__name__}.{where}: {n_degenerate} of {n_total} objects have zero self-similarity "
            f"(e.g. spectra without peaks); their kernel value is 0 with every other object",
            DegenerateObjectWarning, stacklevel=3)


class Kernel(Component, ABC):
    """A positive semi-definite kernel between objects of one type.

    Fitted attributes
    -----------------
    fit_features_ : features of the reference objects
    fit_diag_ : ndarray of shape (n_fit,), raw self-similarities of the reference objects
    n_fit_ : int
    """

    #: what the kernel takes: "spectrum", "molecule" or "text"
    input_type: ClassVar[str] = "object"
    #: cosine-normalise by the raw self-similarities
    normalized: ClassVar[bool] = True
    #: rows per block in transform/gram (memory stays O(block_rows * n_fit)); an instance may override it
    block_rows: ClassVar[int] = 2048
    #: False for kernels that are only approximately positive semi-definite (the conformance suite then
    #: skips the eigenvalue check); may be a property when it depends on the parameters
    psd: ClassVar[bool] = True
    #: k(x, x) = 1 for every x although ``normalized`` is False (the raw kernel is normalised by construction,
    #: e.g. Tanimoto): gram's self pairs are set to exactly 1 and :meth:`diagonal` gives ones
    unit_diagonal: ClassVar[bool] = False

    # -- to implement ------------------------------------------------------------------------------------
    @abstractmethod
    def featurize(self, objects: Sequence[Any]) -> Any:
        """Features of ``objects`` (supports ``len`` and :meth:`take`)."""

    @abstractmethod
    def pairwise(self, fa: Any, fb: Any) -> np.ndarray:
        """Raw kernel values, ndarray of shape (len(fa), len(fb)), float64."""

    @abstractmethod
    def self_similarity(self, features: Any) -> np.ndarray:
        """Raw k(x, x) for each object, ndarray of shape (len(features),)."""

    def take(self, features: Any, index: np.ndarray | slice) -> Any:
        """Rows ``index`` of ``features`` (default: numpy / scipy.sparse indexing)."""
        return features[index]

    def _fit_data_dependent(self, features: Any) -> None:
        """Resolve data-dependent parameters (e.g. ``gamma='auto'``) from the reference features."""

    # -- provided ----------------------------------------------------------------------------------------
    def fit(self, objects: Sequence[Any]) -> "Kernel":
        """Remember the reference objects (as features)."""
        self.fit_features(self.featurize(list(objects)))
        if self.normalized:
            _warn_degenerate(self, int(np.count_nonzero(self.fit_diag_ <= 0)), self.n_fit_, "fit")
        return self

    def fit_features(self, features: Any) -> "Kernel":
        """Remember reference objects given as features (what :meth:`featurize` returns, e.g. stored ones)."""
        self.fit_features_ = features
        self.fit_diag_ = np.asarray(self.self_similarity(self.fit_features_), dtype=np.float64)
        self.n_fit_ = len(features)
        self._fit_data_dependent(self.fit_features_)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "fit_features_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(objects) first")

    def _block(self, fa: Any, diag_a: np.ndarray, fb: Any, diag_b: np.ndarray) -> np.ndarray:
        raw = np.asarray(self.pairwise(fa, fb), dtype=np.float64)
        return normalize_block(raw, diag_a, diag_b) if self.normalized else raw

    def _transform_features(self, features: Any, out: np.ndarray) -> int:
        """Fill ``out`` (len(features), n_fit) block by block; returns the number of degenerate rows."""
        n = len(features)
        n_degenerate = 0
        for start in range(0, n, self.block_rows):
            stop = min(start + self.block_rows, n)
            block = self.take(features, slice(start, stop))
            diag = np.asarray(self.self_similarity(block), dtype=np.float64)
            n_degenerate += int(np.count_nonzero(diag <= 0))
            out[start:stop] = self._block(block, diag, self.fit_features_, self.fit_diag_)
        return n_degenerate if self.normalized else 0

    def transform_features(self, features: Any) -> np.ndarray:
        """Kernel between already-featurised objects and the reference objects, shape (len(features), n_fit)."""
        self._check_fitted()
        out = np.empty((len(features), self.n_fit_), dtype=np.float64)
        _warn_degenerate(self, self._transform_features(features, out), len(features), "transform_features")
        return out

    def transform(self, objects: Sequence[Any]) -> np.ndarray:
        """Kernel between ``objects`` and the reference objects.

        Returns
        -------
        ndarray of shape (len(objects), n_fit), float64
        """
        self._check_fitted()
        objects = list(objects)
        out = np.empty((len(objects), self.n_fit_), dtype=np.float64)
        n_degenerate = 0
        for start in range(0, len(objects), self.block_rows):
            stop = min(start + self.block_rows, len(objects))
            n_degenerate += self._transform_features(self.featurize(objects[start:stop]), out[start:stop])
        _warn_degenerate(self, n_degenerate, len(objects), "transform")
        return out

    def gram(self, index: np.ndarray | None = None) -> np.ndarray:
        """Kernel among the reference objects: rows ``index`` (default all) against all of them.

        Returns
        -------
        ndarray of shape (len(index), n_fit), float64, with exact 1 on the self pairs when normalised (or
        ``unit_diagonal``).
        """
        self._check_fitted()
        rows = np.arange(self.n_fit_) if index is None else np.asarray(index, dtype=np.int64)
        out = np.empty((len(rows), self.n_fit_), dtype=np.float64)
        self._transform_features(self.take(self.fit_features_, rows), out)  # fit already warned
        if self.normalized or self.unit_diagonal:
            out[np.arange(len(rows)), rows] = 1.0
        return out

    def fit_transform(self, objects: Sequence[Any]) -> np.ndarray:
        """``fit(objects)`` then the full Gram matrix, shape (n, n)."""
        return self.fit(objects).gram()

    def diagonal(self, objects: Sequence[Any]) -> np.ndarray:
        """k(x, x) for each object, shape (len(objects),): all ones for a normalised kernel."""
        if self.normalized or self.unit_diagonal:
            return np.ones(len(objects), dtype=np.float64)
        return np.asarray(self.self_similarity(self.featurize(list(objects))), dtype=np.float64)


class InputKernel(Kernel, ABC):
    """A kernel on inputs: ``Spectrum`` records (or strings for text kernels)."""

    input_type: ClassVar[str] = "spectrum"


class OutputKernel(Kernel, ABC):
    """A kernel on ``Molecule`` records. Fingerprint settings are parameters of the kernel."""

    input_type: ClassVar[str] = "molecule"
