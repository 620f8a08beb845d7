"""Kernels on molecular fingerprints: Tanimoto (``tanimoto``), Gaussian-Tanimoto (``gaussian-tanimoto``) and
cosine (``fingerprint-cosine``).

Binary fingerprints: ``T(a, b) = |a & b| / |a | b|``; the intersections of a block are one GEMM on 0/1
matrices (float32 is exact: counts stay far below 2**24), or, for sparse fingerprints (Morgan bits: ~1% set),
a sparse-sparse product that skips the zeros (chosen per block by a cost estimate; both exact); the unions
follow as ``|a| + |b| - |a & b|``.
Count fingerprints (``counts=True``): the MinMax (weighted Tanimoto) similarity ``sum(min(a, b)) / sum(max(a,
b))``; for integer counts ``sum(min(a, b)) = sum_t <[a >= t], [b >= t]>`` over count levels t = 1, 2, ...,
again a GEMM, on the 0/1 level indicators of the bits that reach each level.
Both similarities are positive semi-definite kernels with k(y, y) = 1, and so is the Gaussian-Tanimoto
``exp(-gamma (2 - 2 T))`` (the exponential of a PSD kernel, times a constant). All-zero fingerprints (a molecule
RDKit could not parse, or one with no bit set): T = 1 between two of them, 0 with anything else.
Cosine (``fingerprint-cosine``, on Morgan counts by default): ``<a, b> / (|a| |b|)``, exact integer dot products
(float64, sparse when that is cheaper), with the same convention for all-zero fingerprints. It is the linear
kernel on the unit-length fingerprints, an all-zero one mapped to a unit vector of its own: PSD, k(y, y) = 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.errors import SpecError
from molpredict.chem.molecules import Molecule, fingerprint_matrix
from molpredict.kernels.base import OutputKernel, saveable

__all__ = ["tanimoto_bits", "minmax_counts", "cosine_fingerprints", "TanimotoKernel", "GaussianTanimotoKernel",
           "FingerprintCosineKernel"]

#: largest reference sample used to set gamma="auto"
GAMMA_SAMPLE = 2000
#: dense float32 columns a BLAS GEMM processes in the time of one sparse match (measured: ~25-40 on AVX2 cores)
SPARSE_SPEED_RATIO = 30.0


def _similarity_from_counts(inter: np.ndarray, na: np.ndarray, nb: np.ndarray) -> np.ndarray:
    """``inter / (na + nb - inter)`` in float64, 1 where both are empty (union 0)."""
    inter = inter.astype(np.float64, copy=False)
    union = na[:, None] + nb[None, :] - inter
    empty = union <= 0
    if empty.any():
        union[empty] = 1.0
        inter = inter.copy()
        inter[empty] = 1.0
    return np.divide(inter, union, out=union)


def _csr_bits(x: np.ndarray, values: bool = False) -> sp.csr_matrix:
    """0/1 matrix as float32 CSR (built from ``nonzero``: faster than scipy's dense conversion); with
    ``values``, the matrix's own values as float64 CSR instead (exact sums of integer products)."""
    x = np.ascontiguousarray(x)
    flat = np.flatnonzero(x.reshape(-1))
    cols = (flat % x.shape[1]).astype(np.int32)
    indptr = np.zeros(x.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.count_nonzero(x, axis=1), out=indptr[1:])
    data = x.reshape(-1)[flat].astype(np.float64) if values else np.ones(flat.size, dtype=np.float32)
    return sp.csr_matrix((data, cols, indptr), shape=x.shape)


def _bit_frequencies(x: np.ndarray) -> np.ndarray:
    """Fraction of rows with each bit set, shape (d,)."""
    return np.count_nonzero(x, axis=0) / max(x.shape[0], 1)


def _sparse_is_faster(freq_a: np.ndarray, freq_b: np.ndarray) -> bool:
    """A sparse product costs ~ the expected common bits per pair, ``freq_a @ freq_b``; BLAS processes
    ~``SPARSE_SPEED_RATIO`` dense columns in the time of one sparse match."""
    return float(freq_a @ freq_b) * SPARSE_SPEED_RATIO < freq_a.shape[0]


def _intersections(a: np.ndarray, b: np.ndarray, method: str, a_csr: sp.csr_matrix | None = None,
                   b_csr: sp.csr_matrix | None = None, b_f32: np.ndarray | None = None) -> np.ndarray:
    if method == "sparse":
        a_csr = _csr_bits(a) if a_csr is None else a_csr
        b_csr = _csr_bits(b) if b_csr is None else b_csr
        return (a_csr @ b_csr.T).toarray()
    if method == "gemm":
        b_f32 = np.asarray(b, dtype=np.float32) if b_f32 is None else b_f32
        return np.asarray(a, dtype=np.float32) @ b_f32.T
    raise ValueError(f"method must be 'auto', 'gemm' or 'sparse', not {method!r}")


def tanimoto_bits(a: np.ndarray, b: np.ndarray, method: str = "auto") -> np.ndarray:
    """Tanimoto similarity of binary fingerprints.

    Parameters
    ----------
    a : ndarray of shape (n_a, d), 0/1 (any numeric dtype)
    b : ndarray of shape (n_b, d)
    method : {"auto", "gemm", "sparse"}
        How the intersections are counted: a dense float32 GEMM, or a sparse-sparse product (several times
        faster for sparse fingerprints such as Morgan bits, ~1% set); ``auto`` estimates which is cheaper.
        Both are exact.

    Returns
    -------
    ndarray of shape (n_a, n_b), float64
    """
    if method == "auto":
        method = "sparse" if _sparse_is_faster(_bit_frequencies(a), _bit_frequencies(b)) else "gemm"
    inter = _intersections(a, b, method)
    return _similarity_from_counts(inter, np.count_nonzero(a, axis=1).astype(np.float64),
                                   np.count_nonzero(b, axis=1).astype(np.float64))


def _count_levels(a: np.ndarray, b: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """For each count level t, the columns where some row of ``a`` or ``b`` reaches t (t = 1, 2, ...)."""
    top = np.maximum(a.max(axis=0, initial=0), b.max(axis=0, initial=0))
    return [(t, np.flatnonzero(top >= t)) for t in range(1, int(top.max(initial=0)) + 1)]


def minmax_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinMax (weighted Tanimoto) similarity of count fingerprints, ``sum(min) / sum(max)``.

    Parameters
    ----------
    a : ndarray of shape (n_a, d), non-negative counts
    b : ndarray of shape (n_b, d)

    Returns
    -------
    ndarray of shape (n_a, n_b), float64
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if np.any(a < 0) or np.any(b < 0):
        raise ValueError("count fingerprints must be non-negative")
    na = a.sum(axis=1, dtype=np.float64)
    nb = b.sum(axis=1, dtype=np.float64)
    integer = np.array_equal(a, np.round(a)) and np.array_equal(b, np.round(b))
    if integer:
        levels = _count_levels(a, b)
        cols = np.concatenate([c for _, c in levels]) if levels else np.empty(0, np.int64)
        thresholds = np.concatenate([np.full(c.size, t) for t, c in levels]) if levels else np.empty(0)
        inter = np.zeros((a.shape[0], b.shape[0]), dtype=np.float64)
        # the level indicators can be wide: stack a bounded number of columns at a time
        step = 8192
        for c0 in range(0, cols.size, step):
            c, t = cols[c0:c0 + step], thresholds[c0:c0 + step]
            inter += (a[:, c] >= t).astype(np.float32) @ (b[:, c] >= t).astype(np.float32).T
    else:
        inter = np.empty((a.shape[0], b.shape[0]), dtype=np.float64)
        for i in range(a.shape[0]):
            inter[i] = np.minimum(a[i][None, :], b).sum(axis=1)
    return _similarity_from_counts(inter, na, nb)


def _cosine_from_dots(dots: np.ndarray, sq_a: np.ndarray, sq_b: np.ndarray) -> np.ndarray:
    """``dots / sqrt(sq_a sq_b)`` in float64 (in place on ``dots``); 1 between two all-zero rows, 0 between an
    all-zero row and any other."""
    dots = np.asarray(dots, dtype=np.float64)
    with np.errstate(divide="ignore"):
        inv_a = np.where(sq_a > 0, 1.0 / np.sqrt(sq_a), 0.0)
        inv_b = np.where(sq_b > 0, 1.0 / np.sqrt(sq_b), 0.0)
    dots *= inv_a[:, None]
    dots *= inv_b[None, :]
    empty_a, empty_b = sq_a <= 0, sq_b <= 0
    if empty_a.any() and empty_b.any():
        dots[np.ix_(empty_a, empty_b)] = 1.0
    return dots


def _dots(a: np.ndarray, b: np.ndarray, method: str, b_csr: sp.csr_matrix | None = None) -> np.ndarray:
    """``a @ b.T`` in float64 (exact for integer counts), by a sparse-sparse or a dense product."""
    if method == "sparse":
        b_csr = _csr_bits(b, values=True) if b_csr is None else b_csr
        return (_csr_bits(a, values=True) @ b_csr.T).toarray()
    if method == "gemm":
        return np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64).T
    raise ValueError(f"method must be 'auto', 'gemm' or 'sparse', not {method!r}")


def cosine_fingerprints(a: np.ndarray, b: np.ndarray, method: str = "auto") -> np.ndarray:
    """Cosine similarity of fingerprints (counts or bits), ``<a, b> / (|a| |b|)``.

    Parameters
    ----------
    a : ndarray of shape (n_a, d), non-negative
    b : ndarray of shape (n_b, d)
    method : {"auto", "gemm", "sparse"}
        How the dot products are computed (both exact for integer counts); see :func:`tanimoto_bits`.

    Returns
    -------
    ndarray of shape (n_a, n_b), float64
        1 between two all-zero rows, 0 between an all-zero row and any other.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if np.any(a < 0) or np.any(b < 0):
        raise ValueError("fingerprints must be non-negative")
    if method == "auto":
        method = "sparse" if _sparse_is_faster(_bit_frequencies(a), _bit_frequencies(b)) else "gemm"
    return _cosine_from_dots(_dots(a, b, method), _squared_norms(a), _squared_norms(b))


def _squared_norms(x: np.ndarray) -> np.ndarray:
    """Squared Euclidean norm of each row, float64 (exact for integer counts), shape (n,)."""
    x = np.asarray(x, dtype=np.float64)
    return np.einsum("ij,ij->i", x, x)


def _check_fingerprint_params(fp: str, counts: bool, chiral: bool) -> None:
    if fp not in ("morgan", "maccs", "rdkit"):
        raise SpecError(f"fp must be one of morgan, maccs, rdkit, not {fp!r}")
    if counts and fp == "maccs":
        raise SpecError("MACCS keys have no count version: use counts=false with fp=maccs")
    if chiral and fp != "morgan":
        raise SpecError(f"chiral=true applies to fp=morgan only, not fp={fp}")


#: a reference fingerprint matrix is kept as float32 for the GEMM when it is at most this many entries
CACHE_F32_ENTRIES = 64_000_000


@saveable
@dataclass
class _Fingerprints:
    """A fingerprint matrix (n, d): uint8 bits or float32 counts, with cached derived forms (for the
    reference set, which every block reuses)."""

    matrix: np.ndarray
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.matrix.shape[0])

    def __getitem__(self, index: np.ndarray | slice) -> "_Fingerprints":
        return _Fingerprints(self.matrix[index])

    def cached(self, key: str, make) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def bit_counts(self) -> np.ndarray:
        return self.cached("counts", lambda: np.count_nonzero(self.matrix, axis=1).astype(np.float64))

    def frequencies(self) -> np.ndarray:
        return self.cached("freq", lambda: _bit_frequencies(self.matrix))

    def csr(self) -> sp.csr_matrix:
        return self.cached("csr", lambda: _csr_bits(self.matrix))

    def f32(self) -> np.ndarray | None:
        if self.matrix.size > CACHE_F32_ENTRIES:
            return None
        return self.cached("f32", lambda: np.asarray(self.matrix, dtype=np.float32))


#: structures per call of :meth:`_FingerprintKernel.fingerprint_on_cores` (a 2048-bit block is 128 MB)
_ON_CORES_BLOCK = 65536


class _FingerprintKernel(OutputKernel):
    """An output kernel on one fingerprint setting of the molecules (the parameters and featurisation that
    ``tanimoto``, ``gaussian-tanimoto`` and ``fingerprint-cosine`` share)."""

    normalized: ClassVar[bool] = False
    unit_diagonal: ClassVar[bool] = True

    def __init__(self, fp: str = "morgan", radius: int = 2, size: int = 2048, counts: bool = False,
                 n_jobs: int = 1, chiral: bool = False) -> None:
        self.fp = fp
        self.radius = radius
        self.size = size
        self.counts = counts
        self.n_jobs = n_jobs
        self.chiral = chiral
        _check_fingerprint_params(fp, counts, chiral)

    def featurize(self, objects: Sequence[Molecule]) -> _Fingerprints:
        return _Fingerprints(fingerprint_matrix(list(objects), kind=self.fp, radius=self.radius, size=self.size,
                                                counts=self.counts, n_jobs=self.n_jobs, chiral=self.chiral))

    def fingerprints(self, matrix: np.ndarray) -> _Fingerprints:
        """Features from a fingerprint matrix (n, size) as :meth:`featurize` computes it (e.g. stored in a model
        file), for :meth:`fit_features`."""
        return _Fingerprints(np.asarray(matrix))

    def fingerprint_on_cores(self, objects: Sequence[Molecule], n_jobs: int = -1, chunk_size: int = 2000) -> None:
        """Compute the fingerprints this kernel reads for ``objects`` on ``n_jobs`` worker processes, for records
        that keep them (inside :func:`~molpredict.chem.molecules.remembered_fingerprints`): the kernel's own
        featurisation, and any other reader of the same setting, then take them from the records. ``chunk_size``:
        SMILES per worker task (:func:`~molpredict.chem.molecules.fingerprint_matrix`).

        Training's validation candidates (about 0.1-0.4 million transient structures) were parsed and
        fingerprinted on one core, the largest single-threaded stage of a GPU training
        (docs/benchmarks/train_speed_gpu.md)."""
        objects = list(objects)
        for start in range(0, len(objects), _ON_CORES_BLOCK):  # blocks: the matrices are dropped as they go
            fingerprint_matrix(objects[start:start + _ON_CORES_BLOCK], kind=self.fp, radius=self.radius,
                               size=self.size, counts=self.counts, n_jobs=n_jobs, chunk_size=chunk_size,
                               chiral=self.chiral)


class TanimotoKernel(_FingerprintKernel):
    """Tanimoto (bits) or MinMax (counts) similarity of fingerprints (registry name ``tanimoto``).

    Parameters
    ----------
    fp : {"morgan", "maccs", "rdkit"}
        Fingerprint kind (see :meth:`molpredict.chem.molecules.Molecule.fingerprint`).
    radius : int
        Morgan radius.
    size : int
        Fingerprint length (ignored for maccs).
    counts : bool
        Count fingerprint and MinMax similarity.
    n_jobs : int
        Worker processes for the fingerprints of large batches (``molecules.fingerprint_matrix``).
    chiral : bool
        Morgan only: chirality-aware atom environments, so that stereoisomers are told apart (needed where a
        hit is the same stereoisomer, e.g. text -> molecule on ChEBI-20).
    """

    def similarity(self, fa: _Fingerprints, fb: _Fingerprints) -> np.ndarray:
        """Tanimoto / MinMax similarity, shape (len(fa), len(fb))."""
        if self.counts:
            return minmax_counts(fa.matrix, fb.matrix)
        # fb is usually the reference set: its sparse / float32 forms and bit statistics are computed once
        method = "sparse" if _sparse_is_faster(_bit_frequencies(fa.matrix), fb.frequencies()) else "gemm"
        if method == "sparse":
            inter = _intersections(fa.matrix, fb.matrix, method, b_csr=fb.csr())
        else:
            inter = _intersections(fa.matrix, fb.matrix, method, b_f32=fb.f32())
        return _similarity_from_counts(inter, np.count_nonzero(fa.matrix, axis=1).astype(np.float64),
                                       fb.bit_counts())

    def pairwise(self, fa: _Fingerprints, fb: _Fingerprints) -> np.ndarray:
        return self.similarity(fa, fb)

    def self_similarity(self, features: _Fingerprints) -> np.ndarray:
        return np.ones(len(features), dtype=np.float64)


class GaussianTanimotoKernel(TanimotoKernel):
    """``k = exp(-gamma * (2 - 2 T))`` with T the Tanimoto / MinMax similarity (``gaussian-tanimoto``).

    Parameters
    ----------
    gamma : float or "auto"
        ``"auto"``: ``1 / mean(2 - 2 T)`` over the distinct pairs of the reference molecules (a sample of at most
        2,000 of them drawn with ``seed`` when there are more), resolved at fit into ``gamma_``; 1.0 when that
        mean is 0 (a single or only identical reference molecules).
    fp, radius, size, counts, n_jobs, chiral
        As in :class:`TanimotoKernel`.
    seed : int
        Seed of the reference sample for ``gamma="auto"``.

    Fitted attributes
    -----------------
    gamma_ : float
    """

    def __init__(self, gamma: float | str = "auto", fp: str = "morgan", radius: int = 2, size: int = 2048,
                 counts: bool = False, n_jobs: int = 1, seed: int = 0, chiral: bool = False) -> None:
        super().__init__(fp=fp, radius=radius, size=size, counts=counts, n_jobs=n_jobs, chiral=chiral)
        self.gamma = gamma
        self.seed = seed
        if gamma != "auto" and (isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma > 0):
            raise SpecError(f"gamma must be a positive number or 'auto', not {gamma!r}")

    def _fit_data_dependent(self, features: _Fingerprints) -> None:
        if self.gamma != "auto":
            self.gamma_ = float(self.gamma)
            return
        n = len(features)
        sample = features
        if n > GAMMA_SAMPLE:
            rows = np.sort(np.random.default_rng(self.seed).choice(n, GAMMA_SAMPLE, replace=False))
            sample = features[rows]
        m = len(sample)
        if m < 2:
            self.gamma_ = 1.0
            return
        dist = 2.0 - 2.0 * self.similarity(sample, sample)
        mean = (dist.sum() - np.trace(dist)) / (m * (m - 1))
        self.gamma_ = 1.0 / mean if mean > 0 else 1.0

    def _gamma(self) -> float:
        if hasattr(self, "gamma_"):
            return self.gamma_
        if self.gamma == "auto":
            raise RuntimeError("GaussianTanimotoKernel(gamma='auto') is not fitted: call fit(objects) first")
        return float(self.gamma)

    def pairwise(self, fa: _Fingerprints, fb: _Fingerprints) -> np.ndarray:
        t = self.similarity(fa, fb)
        # exp(-g (2 - 2t)) computed in place on the similarity block
        t -= 1.0
        t *= 2.0 * self._gamma()
        return np.exp(t, out=t)


class FingerprintCosineKernel(_FingerprintKernel):
    """Cosine similarity of fingerprints, by default Morgan counts (registry name ``fingerprint-cosine``).

    ``k(a, b) = <a, b> / (|a| |b|)``: the linear kernel on unit-length fingerprints, so a ridge regression with
    this output kernel regresses onto (normalised) fingerprint vectors. Unlike Tanimoto / MinMax it weighs a
    count by its size (a ring of six carbons counts six times its environment), and it is cheap: one sparse or
    dense product per block. Two all-zero fingerprints have k = 1, an all-zero one and any other k = 0.

    Parameters
    ----------
    counts : bool
        Count fingerprint (default) or bits (then the cosine is ``|a & b| / sqrt(|a| |b|)``).
    fp, radius, size, n_jobs, chiral
        As in :class:`TanimotoKernel`.
    """

    def __init__(self, fp: str = "morgan", radius: int = 2, size: int = 2048, counts: bool = True,
                 n_jobs: int = 1, chiral: bool = False) -> None:
        super().__init__(fp, radius, size, counts, n_jobs, chiral)  # counts by default, unlike Tanimoto

    def pairwise(self, fa: _Fingerprints, fb: _Fingerprints) -> np.ndarray:
        """Cosine similarity, shape (len(fa), len(fb))."""
        # the block norm of our normalisation is done here, not by the base class: the base class would give 0
        # between two distinct all-zero fingerprints, where Tanimoto (and this kernel) give 1
        # fb is usually the reference set: its sparse form and norms are computed once
        if _sparse_is_faster(_bit_frequencies(fa.matrix), fb.frequencies()):
            csr = fb.cached("csr64", lambda: _csr_bits(fb.matrix, values=True))
            dots = _dots(fa.matrix, fb.matrix, "sparse", b_csr=csr)
        else:
            dots = _dots(fa.matrix, fb.matrix, "gemm")
        return _cosine_from_dots(dots, _squared_norms(fa.matrix), fb.cached("sq", lambda: _squared_norms(fb.matrix)))

    def self_similarity(self, features: _Fingerprints) -> np.ndarray:
        return np.ones(len(features), dtype=np.float64)
