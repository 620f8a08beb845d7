"""Kernels on MS/MS spectra: the probability product kernel on peaks (``ppk``), on peaks plus neutral losses
(``ppk-losses``) and on the mass differences between fragments (``ppk-pairs``), and the spectral cosine
(``cosine``).

All of them work on a :class:`PeakSet`, the peaks of a batch of spectra flattened into a few arrays, and never
loop in Python over pairs of spectra: the reference peaks are sorted by m/z once, each query peak finds its
neighbours within a window by ``searchsorted``, the pair terms are computed vectorised and summed into the
(n_query, n_reference) block with ``np.bincount`` on flattened pair indices.

Peak clean-up done here (whatever the upstream cleaning did): peaks with a non-finite m/z or intensity, or an
intensity <= 0, are dropped; intensities are divided by the spectrum's largest one, so every kernel is
invariant to the intensity scale (absolute or relative intensities give the same kernel).

Probability product kernel (Heinonen et al., Bioinformatics 2012)
------------------------------------------------------------------
A spectrum is a mixture of Gaussians, one per peak i: centred at (m/z_i, I_i) (``I`` the relative intensity),
mixture weight ``w_i = I_i ** intensity_power``, width ``sigma`` in m/z and ``int_sigma`` in intensity. The
probability product kernel with rho = 1 is the L2 inner product of the two mixtures; up to a constant factor
that the normalisation removes, it is ::

    k(x, x') = sum_ij w_i w'_j exp(-(mz_i - mz'_j)^2 / (4 sigma^2)) exp(-(I_i - I'_j)^2 / (4 int_sigma^2))

and the base class cosine-normalises it to k(x, x) = 1. It is an inner product, hence positive semi-definite.

- The paper uses uniform mixture weights and the intensity Gaussian: ``intensity_power=0, int_sigma=<s>``.
  Our default is ``intensity_power=0.5, int_sigma=None`` (no intensity Gaussian; peaks weighted by the square
  root of their relative intensity): uniform weights let the many small noise peaks of uncleaned spectra count
  as much as the few that carry the signal, and an intensity Gaussian makes two spectra of one compound at
  different collision energies (same peaks, other heights) dissimilar. On MassBank train_pos (800 seeded
  queries, is the most similar other training spectrum of the same structure?) the default scored 0.820 on
  raw and 0.806 on cleaned spectra, uniform weights 0.821 / 0.776, uniform weights with ``int_sigma=0.2``
  0.801 / 0.769, ``intensity_power=1`` 0.745 / 0.789. The default cleaning pipeline of
  :mod:`molpredict.spectra.cleaning` already takes square roots, so there the default weight is the fourth root of the
  deposited intensity; ``intensity_power=1`` uses the cleaned intensities as they are.
- ``ppm``: the m/z width becomes relative, ``sigma_i = max(mz_sigma, ppm * 1e-6 * mz_i)``. With unequal widths
  the kernel uses the inner product of unit-L2 Gaussians, ``sqrt(2 s_i s_j / (s_i^2 + s_j^2)) exp(-d^2 /
  (2 (s_i^2 + s_j^2)))``, which equals the constant-width formula when s_i = s_j and stays an exact inner
  product (PSD). For neutral losses the relative width follows the precursor m/z (the error of a loss is that
  of the precursor).
- Pruning: pairs further apart than ``truncate`` widths (``|d| > truncate * sqrt((s_i^2 + s_j^2) / 2)``) are
  skipped. The default ``truncate=10`` drops terms below exp(-25) ~ 1.4e-11 of a perfect match, so the
  result equals the full double sum to ~1e-11 relative and remains PSD to that accuracy.

Low-resolution data
-------------------
The width is global. With the default ``mz_sigma=0.005`` Da, two peaks of a spectrum recorded at 0.1 Da
precision that should match can be 0.1 Da apart after rounding: exp(-0.01 / 1e-4) ~ 0 (they are beyond the
pruning window anyway), so a low-resolution spectrum scores ~0 with everything except identical roundings.
``mz_sigma="auto"`` sets the width at fit time from the reference spectra: ``sigma = max(0.005, q / 2)``
where ``q`` is the median m/z precision of the reference spectra (``Spectrum.mz_precision``, else inferred from
the decimals of the m/z values). Peaks rounded to opposite sides (|d| = q) then still score exp(-1). One width
for all pairs keeps the kernel PSD; a per-pair width depending on both spectra would not be in general.
The median follows the bulk of the reference data (mixed data with a minority of low-resolution spectra keeps
a high-resolution width; a low-resolution data set gets a low-resolution width).
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.errors import SpecError
from molpredict.spectra.record import Spectrum
from molpredict.kernels.base import InputKernel, normalize_block, saveable

__all__ = [
    "BLOCK_CELLS",
    "PeakSet",
    "peak_set",
    "pair_difference_set",
    "binned_differences",
    "estimate_mz_precision",
    "ppk_cross",
    "ppk_self",
    "greedy_cosine_cross",
    "binned_vectors",
    "PPKernel",
    "PPKLossesKernel",
    "PPKPairsKernel",
    "CosineKernel",
]

DEFAULT_MZ_SIGMA = 0.005
#: a fragment must lie this far below the precursor for its neutral loss to count (smallest real loss: H, 1 Da)
MIN_LOSS = 0.5
#: ``ppk-pairs``: the most intense peaks paired, and the range of differences kept (Da). Below 12 Da lie isotope
#: and noise spacings; the differences of the default width carry two peaks' errors (sqrt(2) x 0.005 Da)
DEFAULT_PAIR_TOP = 30
DEFAULT_PAIR_RANGE = (12.0, 200.0)
DEFAULT_PAIR_MZ_SIGMA = 0.007
#: ... compared in bins of this width (Da) by default: the same validation figures as the Gaussian windows, and
#: 28x faster against 4,000 landmarks (docs/benchmarks/spectrum_terms_refused.md, "Round four")
DEFAULT_PAIR_BIN_WIDTH = 0.01
#: bound on the number of peak pairs materialised at once (memory ~ 60 bytes per pair)
MAX_PAIRS = 500_000
#: bound on the entries of one bincount target (rows x n_reference)
MAX_CELLS = 4_000_000
#: bound on the kernel values of one block of rows (``Kernel.block_cells``): 250 rows against the 47,880 cleaned
#: spectra of train_pos, 1.7x faster than the 2,048 of ``block_rows`` there (docs/benchmarks/train_speed_rows.md)
BLOCK_CELLS = 12_000_000


# --------------------------------------------------------------------------------------------------------------
# Peak sets
# --------------------------------------------------------------------------------------------------------------
@saveable
@dataclass
class PeakSet:
    """The peaks of ``n`` spectra, flattened: spectrum ``s`` owns peaks ``offsets[s]:offsets[s + 1]``.

    Attributes
    ----------
    mz : ndarray of shape (n_peaks,)
        Peak positions (fragment m/z, or neutral-loss masses), ascending within each spectrum.
    rel_int : ndarray of shape (n_peaks,)
        Intensity relative to the spectrum's largest peak, in (0, 1].
    weight : ndarray of shape (n_peaks,)
        ``rel_int ** intensity_power``.
    scale : ndarray of shape (n_peaks,)
        The m/z a relative (ppm) width is taken of: the peak's m/z, or the precursor m/z for losses.
    offsets : ndarray of shape (n + 1,), int64
    """

    mz: np.ndarray
    rel_int: np.ndarray
    weight: np.ndarray
    scale: np.ndarray
    offsets: np.ndarray
    _sorted: tuple | None = field(default=None, repr=False, compare=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n(self) -> int:
        return len(self)

    @property
    def counts(self) -> np.ndarray:
        """Peaks per spectrum, shape (n,)."""
        return np.diff(self.offsets)

    @property
    def spec(self) -> np.ndarray:
        """Spectrum index of each peak, shape (n_peaks,), int64."""
        return np.repeat(np.arange(self.n, dtype=np.int64), self.counts)

    def take(self, index: np.ndarray | slice) -> "PeakSet":
        """The spectra ``index`` (a slice or an integer array) as a new :class:`PeakSet`."""
        rows = np.arange(self.n)[index] if isinstance(index, slice) else np.asarray(index, dtype=np.int64)
        counts = self.counts[rows]
        starts = self.offsets[:-1][rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        peaks = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        return PeakSet(self.mz[peaks], self.rel_int[peaks], self.weight[peaks], self.scale[peaks], offsets)

    __getitem__ = take

    def sorted_view(self) -> tuple[np.ndarray, ...]:
        """All peaks sorted by m/z (cached): ``(mz, rel_int, weight, scale, spec)``."""
        if self._sorted is None:
            order = np.argsort(self.mz, kind="stable")
            self._sorted = (self.mz[order], self.rel_int[order], self.weight[order], self.scale[order],
                            self.spec[order])
        return self._sorted


def estimate_mz_precision(mz: np.ndarray, max_decimals: int = 6) -> float:
    """The coarsest step ``10**-d`` (d <= max_decimals) on which all of ``mz`` lie; NaN for no peaks."""
    mz = np.asarray(mz, dtype=np.float64)
    if mz.size == 0:
        return math.nan
    for d in range(max_decimals + 1):
        scaled = mz * 10.0 ** d
        if np.all(np.abs(scaled - np.round(scaled)) <= 1e-5):
            return 10.0 ** -d
    return 10.0 ** -max_decimals


#: per thread: the memo of :func:`peaks_cleaned_once` while one is open, else None
_CLEANING = threading.local()


@contextmanager
def peaks_cleaned_once() -> Iterator[None]:
    """Within this block (on this thread), :func:`_clean_peaks` cleans each spectrum object once.

    The sub-kernels of a combined kernel (``mkl``) featurise the same spectra and each cleaned them again: the
    default input kernel cleaned every spectrum four times. A spectrum is known by its object and its peak arrays'
    objects, and the memo is dropped when the outermost block ends. Callers never write into the arrays it returns
    (without the block they may be the spectrum's own arrays)."""
    outer = getattr(_CLEANING, "memo", None)
    if outer is None:
        _CLEANING.memo = {}
    try:
        yield
    finally:
        if outer is None:
            _CLEANING.memo = None


def _clean_peaks(spectrum: Spectrum) -> tuple[np.ndarray, np.ndarray]:
    """Finite, positive-intensity peaks sorted by m/z, intensities divided by the largest (remembered inside
    :func:`peaks_cleaned_once`)."""
    memo = getattr(_CLEANING, "memo", None)
    if memo is None:
        return _cleaned(spectrum)
    known = memo.get(id(spectrum))
    if known is not None and known[0] is spectrum and known[1] is spectrum.mz and known[2] is spectrum.intensities:
        return known[3], known[4]
    mz, inten = _cleaned(spectrum)
    memo[id(spectrum)] = (spectrum, spectrum.mz, spectrum.intensities, mz, inten)  # holds the spectrum: ids stay
    return mz, inten


def _cleaned(spectrum: Spectrum) -> tuple[np.ndarray, np.ndarray]:
    mz = np.asarray(spectrum.mz, dtype=np.float64)
    inten = np.asarray(spectrum.intensities, dtype=np.float64)
    keep = np.isfinite(mz) & np.isfinite(inten) & (inten > 0)
    if not keep.all():
        mz, inten = mz[keep], inten[keep]
    if mz.size and np.any(np.diff(mz) < 0):
        order = np.argsort(mz, kind="stable")
        mz, inten = mz[order], inten[order]
    if inten.size:
        inten = inten / inten.max()
    return mz, inten


def peak_set(spectra: Sequence[Spectrum], intensity_power: float = 0.5, kind: str = "peaks") -> PeakSet:
    """Flatten cleaned spectra into a :class:`PeakSet`.

    Parameters
    ----------
    spectra : sequence of Spectrum, length n
    intensity_power : float
        Peak weight = relative intensity ** intensity_power (0: uniform weights).
    kind : {"peaks", "losses"}
        ``losses``: positions are ``precursor_mz - mz`` for fragments at least :data:`MIN_LOSS` below the
        precursor (ascending); a spectrum without precursor m/z has no losses.
    """
    if kind not in ("peaks", "losses"):
        raise ValueError(f"kind must be 'peaks' or 'losses', not {kind!r}")
    mzs, ints, scales = [], [], []
    for spectrum in spectra:
        mz, inten = _clean_peaks(spectrum)
        if kind == "losses":
            prec = spectrum.precursor_mz
            if prec is None or not np.isfinite(prec) or prec <= 0:
                mz, inten = mz[:0], inten[:0]
            else:
                keep = mz <= prec - MIN_LOSS
                mz, inten = (prec - mz[keep])[::-1], inten[keep][::-1]
            scale = np.full(mz.shape, 0.0 if prec is None else float(prec))
        else:
            scale = mz
        mzs.append(mz)
        ints.append(inten)
        scales.append(scale)
    return _flat_peak_set(mzs, ints, scales, intensity_power)


def _flat_peak_set(mzs: list[np.ndarray], ints: list[np.ndarray], scales: list[np.ndarray],
                   intensity_power: float) -> PeakSet:
    """One :class:`PeakSet` of per-spectrum arrays (positions, relative intensities, width scales)."""
    offsets = np.zeros(len(mzs) + 1, dtype=np.int64)
    np.cumsum([m.size for m in mzs], out=offsets[1:])
    cat = (lambda arrays: np.concatenate(arrays).astype(np.float64) if arrays else np.empty(0))
    mz, rel_int, scale = cat(mzs), cat(ints), cat(scales)
    weight = np.ones_like(rel_int) if intensity_power == 0 else rel_int ** float(intensity_power)
    return PeakSet(mz, rel_int, weight, scale, offsets)


# --------------------------------------------------------------------------------------------------------------
# Window search: all pairs (query peak, reference peak) with |mz_q - mz_r| <= half-width
# --------------------------------------------------------------------------------------------------------------
def _row_chunks(q: PeakSet, lo: np.ndarray, hi: np.ndarray, n_cols: int):
    """Split the query spectra into consecutive chunks bounded in pairs and in output cells."""
    per_spec = np.add.reduceat(np.append(hi - lo, 0), q.offsets[:-1]) if q.mz.size else np.zeros(q.n, int)
    per_spec = np.where(q.counts > 0, per_spec, 0)
    max_rows = max(1, MAX_CELLS // max(n_cols, 1))
    start = 0
    while start < q.n:
        cum = np.cumsum(per_spec[start:start + max_rows])
        stop = start + max(1, int(np.searchsorted(cum, MAX_PAIRS, side="right")))
        stop = min(stop, start + max_rows, q.n)
        yield start, stop
        start = stop


def _expand_pairs(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For query peaks with reference ranges [lo, hi): the flat (query peak, sorted reference peak) pairs."""
    counts = hi - lo
    total = int(counts.sum())
    qp = np.repeat(np.arange(lo.size, dtype=np.int64), counts)
    rp = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts - lo, counts)
    return qp, rp


def _sigmas(scale: np.ndarray, sigma: float, ppm: float | None) -> np.ndarray | float:
    if ppm is None:
        return sigma
    return np.maximum(sigma, ppm * 1e-6 * scale)


def _ppk_values(dmz: np.ndarray, w: np.ndarray, drel: np.ndarray | None, s_i: np.ndarray | None,
                s_j: np.ndarray | None, sigma: float, int_sigma: float | None) -> np.ndarray:
    """Pair terms ``w * exp(-dmz^2 / (4 sigma^2)) [* exp(-drel^2 / (4 int_sigma^2))]`` (in place on ``dmz``).

    With per-peak widths ``s_i, s_j`` (ppm mode) the m/z factor is the inner product of unit-L2 Gaussians,
    ``sqrt(2 s_i s_j / (s_i^2 + s_j^2)) exp(-dmz^2 / (2 (s_i^2 + s_j^2)))``.
    """
    arg = np.square(dmz, out=dmz)
    if s_i is None:
        arg *= -1.0 / (4.0 * sigma * sigma)
    else:
        s2 = s_i * s_i + s_j * s_j
        arg /= -2.0 * s2
        w = w * np.sqrt(2.0 * s_i * s_j / s2)
    if drel is not None:
        arg -= np.square(drel, out=drel) * (1.0 / (4.0 * int_sigma * int_sigma))
    np.exp(arg, out=arg)
    arg *= w
    return arg


def ppk_cross(q: PeakSet, r: PeakSet, sigma: float, *, ppm: float | None = None, int_sigma: float | None = None,
              truncate: float = 10.0) -> np.ndarray:
    """Raw probability product kernel between two peak sets.

    Parameters
    ----------
    q : PeakSet with n_q spectra
    r : PeakSet with n_r spectra (its sorted view is cached: pass the larger, reused set here)
    sigma : float
        m/z width in Da (the floor of the width when ``ppm`` is given).
    ppm : float, optional
        Relative width: ``sigma_i = max(sigma, ppm * 1e-6 * scale_i)``.
    int_sigma : float, optional
        Width of the Gaussian on relative intensities; None: no intensity factor.
    truncate : float
        Pairs further apart than ``truncate`` widths are skipped.

    Returns
    -------
    ndarray of shape (n_q, n_r), float64
    """
    out = np.zeros((q.n, r.n), dtype=np.float64)
    if q.mz.size == 0 or r.mz.size == 0:
        return out
    r_mz, r_rel, r_w, r_scale, r_spec = r.sorted_view()
    s_q = _sigmas(q.scale, sigma, ppm)
    if ppm is None:
        half = truncate * sigma
    else:
        s_r_max = float(np.max(_sigmas(r_scale, sigma, ppm)))
        half = truncate * np.sqrt((s_q * s_q + s_r_max * s_r_max) / 2.0)
    lo = np.searchsorted(r_mz, q.mz - half, side="left")
    hi = np.searchsorted(r_mz, q.mz + half, side="right")
    q_row = q.spec * r.n  # flat offset of each query peak's output row
    for s0, s1 in _row_chunks(q, lo, hi, r.n):
        p0, p1 = int(q.offsets[s0]), int(q.offsets[s1])
        counts = hi[p0:p1] - lo[p0:p1]
        total = int(counts.sum())
        if total == 0:
            continue
        # reference index of each pair: lo of its query peak + its rank within that query peak's window
        rp = np.arange(total, dtype=np.int64)
        rp += np.repeat(lo[p0:p1] - (np.cumsum(counts) - counts), counts)
        dmz = np.repeat(q.mz[p0:p1], counts)
        dmz -= r_mz[rp]
        w = np.repeat(q.weight[p0:p1], counts)
        w *= r_w[rp]
        drel = None
        if int_sigma is not None:
            drel = np.repeat(q.rel_int[p0:p1], counts)
            drel -= r_rel[rp]
        s_i = s_j = None
        if ppm is not None:
            s_i = np.repeat(s_q[p0:p1], counts)
            s_j = _sigmas(r_scale[rp], sigma, ppm)
        vals = _ppk_values(dmz, w, drel, s_i, s_j, sigma, int_sigma)
        flat = np.repeat(q_row[p0:p1] - s0 * r.n, counts)
        flat += r_spec[rp]
        out[s0:s1] = np.bincount(flat, weights=vals, minlength=(s1 - s0) * r.n).reshape(s1 - s0, r.n)
    return out


def ppk_self(p: PeakSet, sigma: float, *, ppm: float | None = None, int_sigma: float | None = None,
             truncate: float = 10.0) -> np.ndarray:
    """Raw k(x, x) of each spectrum of ``p``, shape (n,): the same sum as :func:`ppk_cross` within a spectrum."""
    out = np.zeros(p.n, dtype=np.float64)
    if p.mz.size == 0:
        return out
    s_all = _sigmas(p.scale, sigma, ppm)
    half = truncate * (sigma if ppm is None else float(np.max(s_all)))
    # Shift each spectrum to its own m/z range so one sorted search never pairs peaks of two spectra.
    span = float(np.max(p.mz) - np.min(p.mz)) + 4.0 * half + 1.0
    spec = p.spec
    key = (p.mz - np.min(p.mz)) + spec * span
    order = np.argsort(key, kind="stable")
    key_s = key[order]
    lo = np.searchsorted(key_s, key - half, side="left")
    hi = np.searchsorted(key_s, key + half, side="right")
    step = max(1, MAX_PAIRS // 64)
    for c0 in range(0, p.mz.size, step):
        c1 = min(p.mz.size, c0 + step)
        qp, rs = _expand_pairs(lo[c0:c1], hi[c0:c1])
        qp += c0
        rp = order[rs]
        dmz = p.mz[qp] - p.mz[rp]
        drel = None if int_sigma is None else p.rel_int[qp] - p.rel_int[rp]
        w = p.weight[qp] * p.weight[rp]
        s_i = s_j = None
        if ppm is not None:
            s_i, s_j = s_all[qp], s_all[rp]
        vals = _ppk_values(dmz, w, drel, s_i, s_j, sigma, int_sigma)
        out += np.bincount(spec[qp], weights=vals, minlength=p.n)
    return out


# --------------------------------------------------------------------------------------------------------------
# Cosine
# --------------------------------------------------------------------------------------------------------------
def greedy_cosine_cross(q: PeakSet, r: PeakSet, tolerance: float) -> np.ndarray:
    """Raw greedy-matched cosine numerators: for each spectrum pair, the sum of ``w_i w'_j`` over a one-to-one
    matching of peaks with ``|mz_i - mz'_j| <= tolerance``, chosen greedily by descending product (ties: lower
    query peak index, then lower reference peak index, in m/z order).

    The greedy matching is computed for all spectrum pairs at once by rounds of *locally dominant* edges (an
    edge better than every other edge at both of its peaks is taken by the sequential greedy algorithm too;
    take them all, drop the edges they block, repeat), which gives exactly the sequential greedy result.

    Returns
    -------
    ndarray of shape (q.n, r.n), float64
    """
    out = np.zeros((q.n, r.n), dtype=np.float64)
    if q.mz.size == 0 or r.mz.size == 0:
        return out
    r_mz, _, r_w, _, r_spec = r.sorted_view()
    # position of each sorted reference peak in r's own (spectrum, m/z) order, for the tie-break
    r_pos = np.argsort(r.mz, kind="stable")
    lo = np.searchsorted(r_mz, q.mz - tolerance, side="left")
    hi = np.searchsorted(r_mz, q.mz + tolerance, side="right")
    q_spec = q.spec
    for s0, s1 in _row_chunks(q, lo, hi, r.n):
        p0, p1 = int(q.offsets[s0]), int(q.offsets[s1])
        qp, rp = _expand_pairs(lo[p0:p1], hi[p0:p1])
        if qp.size == 0:
            continue
        qp += p0
        keep = np.abs(q.mz[qp] - r_mz[rp]) <= tolerance
        qp, rp = qp[keep], rp[keep]
        score = q.weight[qp] * r_w[rp]
        rank_order = np.lexsort((r_pos[rp], qp, -score))
        qp, rp, score = qp[rank_order], rp[rank_order], score[rank_order]
        # vertices: a query peak within one reference spectrum, a reference peak within one query spectrum
        left = np.unique(qp * r.n + r_spec[rp], return_inverse=True)[1]
        right = np.unique(rp * q.n + q_spec[qp], return_inverse=True)[1]
        alive = np.ones(qp.size, dtype=bool)
        chosen = np.zeros(qp.size, dtype=bool)
        while alive.any():
            idx = np.flatnonzero(alive)  # in rank order
            best_l = np.zeros(qp.size, dtype=bool)
            best_r = np.zeros(qp.size, dtype=bool)
            best_l[idx[np.unique(left[idx], return_index=True)[1]]] = True
            best_r[idx[np.unique(right[idx], return_index=True)[1]]] = True
            take = best_l & best_r
            chosen |= take
            used_l = np.zeros(left.max() + 1, dtype=bool)
            used_r = np.zeros(right.max() + 1, dtype=bool)
            used_l[left[take]] = True
            used_r[right[take]] = True
            alive &= ~(used_l[left] | used_r[right])
        flat = (q_spec[qp[chosen]] - s0) * r.n + r_spec[rp[chosen]]
        out[s0:s1] = np.bincount(flat, weights=score[chosen], minlength=(s1 - s0) * r.n).reshape(s1 - s0, r.n)
    return out


def binned_vectors(p: PeakSet, tolerance: float) -> sp.csr_matrix:
    """Peak weights summed in m/z bins of width ``tolerance`` (bin ``floor(mz / tolerance)``).

    Returns
    -------
    scipy.sparse.csr_matrix of shape (n, n_bins), float64 (columns up to the largest bin used)
    """
    bins = np.floor(p.mz / tolerance).astype(np.int64)
    n_bins = int(bins.max()) + 1 if bins.size else 1
    mat = sp.csr_matrix((p.weight, (p.spec, bins)), shape=(p.n, n_bins), dtype=np.float64)
    mat.sum_duplicates()
    return mat


def _same_width(a: sp.csr_matrix, b: sp.csr_matrix) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    n = max(a.shape[1], b.shape[1])
    if a.shape[1] < n:
        a = sp.csr_matrix((a.data, a.indices, a.indptr), shape=(a.shape[0], n))
    if b.shape[1] < n:
        b = sp.csr_matrix((b.data, b.indices, b.indptr), shape=(b.shape[0], n))
    return a, b


def pair_differences(mz: np.ndarray, rel_int: np.ndarray, top: int, min_diff: float, max_diff: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mass differences between the ``top`` most intense peaks of one spectrum.

    Parameters
    ----------
    mz, rel_int : ndarray of shape (k,)
        Clean peaks (finite, positive, ascending in m/z), intensities relative to the largest.
    top : int
    min_diff, max_diff : float
        Differences kept: ``min_diff <= mz_j - mz_i <= max_diff``.

    Returns
    -------
    diff : ndarray of shape (p,)
        ``mz_j - mz_i`` for the kept pairs (i below j), ascending.
    rel_int : ndarray of shape (p,)
        ``sqrt(I_i I_j)``, in (0, 1].
    scale : ndarray of shape (p,)
        ``mz_j``, the larger m/z of the pair (a relative width of a difference follows it).
    """
    if mz.size > top:
        keep = np.sort(np.argsort(-rel_int, kind="stable")[:top])
        mz, rel_int = mz[keep], rel_int[keep]
    i, j = np.triu_indices(mz.size, k=1)  # i < j: mz[j] >= mz[i] (the kept peaks stay in m/z order)
    diff = mz[j] - mz[i]
    kept = (diff >= min_diff) & (diff <= max_diff)
    i, j, diff = i[kept], j[kept], diff[kept]
    order = np.argsort(diff, kind="stable")
    return diff[order], np.sqrt(rel_int[i] * rel_int[j])[order], mz[j][order]


def pair_difference_set(spectra: Sequence[Spectrum], top: int = DEFAULT_PAIR_TOP,
                        min_diff: float = DEFAULT_PAIR_RANGE[0], max_diff: float = DEFAULT_PAIR_RANGE[1],
                        intensity_power: float = 1.0) -> PeakSet:
    """A :class:`PeakSet` of fragment-to-fragment mass differences (:func:`pair_differences`): each difference a
    "peak" at its mass, of relative intensity ``sqrt(I_i I_j)`` and weight that ``** intensity_power``.

    The differences between fragments are the losses of the fragmentation steps that lead from one fragment to
    another (H2O 18.011, CO 27.995, C2H4 28.031, CO2 43.990 ...). Unlike the fragments' m/z, they do not move when
    a whole spectrum is shifted (another adduct, a labelled or substituted part that every fragment keeps).
    """
    mzs, ints, scales = [], [], []
    for spectrum in spectra:
        mz, inten = _clean_peaks(spectrum)
        diff, rel, scale = pair_differences(mz, inten, int(top), float(min_diff), float(max_diff))
        mzs.append(diff)
        ints.append(rel)
        scales.append(scale)
    return _flat_peak_set(mzs, ints, scales, intensity_power)


def binned_differences(p: PeakSet, bin_width: float, min_diff: float, max_diff: float) -> sp.csr_matrix:
    """Differences as sparse vectors: each one's weight split linearly between its two nearest bins.

    A difference at ``x = (d - min_diff) / bin_width`` bins adds ``w (1 - f)`` to bin ``floor(x)`` and ``w f`` to the
    next (``f`` the fractional part), so two differences a fraction of a bin apart still meet. The inner product of
    these vectors is an explicit feature map, PSD by construction.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (n, ceil((max_diff - min_diff) / bin_width) + 2), float64
    """
    n_bins = int(math.ceil((max_diff - min_diff) / bin_width)) + 2
    x = (p.mz - min_diff) / bin_width
    low = np.floor(x).astype(np.int64)
    frac = x - low
    rows = np.concatenate([p.spec, p.spec])
    cols = np.concatenate([low, low + 1])
    vals = np.concatenate([p.weight * (1.0 - frac), p.weight * frac])
    mat = sp.csr_matrix((vals, (rows, cols)), shape=(p.n, n_bins), dtype=np.float64)
    mat.sum_duplicates()
    return mat


# --------------------------------------------------------------------------------------------------------------
# Kernel classes
# --------------------------------------------------------------------------------------------------------------
def _check_positive(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SpecError(f"{name} must be a positive number, not {value!r}")


class _PPKMixin:
    """Parameter handling shared by the PPK kernels."""

    #: rows per block are Python-bound numpy calls: large requests may run on worker processes
    rows_in_processes = True
    block_cells = BLOCK_CELLS

    mz_sigma: float | str
    ppm: float | None
    int_sigma: float | None
    truncate: float

    def _validate_ppk(self) -> None:
        if not (self.mz_sigma == "auto"):
            _check_positive("mz_sigma", self.mz_sigma)
        _check_positive("ppm", self.ppm, allow_none=True)
        _check_positive("int_sigma", self.int_sigma, allow_none=True)
        _check_positive("truncate", self.truncate)

    def _resolve_sigma(self, spectra: Sequence[Spectrum]) -> None:
        if self.mz_sigma == "auto":
            precision = np.array([_precision_of(s) for s in spectra], dtype=np.float64)
            known = precision[np.isfinite(precision)]
            q = float(np.median(known)) if known.size else 0.0
            self.mz_sigma_ = max(DEFAULT_MZ_SIGMA, q / 2.0)
        else:
            self.mz_sigma_ = float(self.mz_sigma)

    def _sigma(self) -> float:
        if self.mz_sigma == "auto":
            if not hasattr(self, "mz_sigma_"):
                raise RuntimeError(f"{type(self).__name__}(mz_sigma='auto') is not fitted: call fit(objects) first")
            return self.mz_sigma_
        return float(self.mz_sigma)

    def _cross(self, a: PeakSet, b: PeakSet) -> np.ndarray:
        return ppk_cross(a, b, self._sigma(), ppm=self.ppm, int_sigma=self.int_sigma, truncate=self.truncate)

    def _self(self, a: PeakSet) -> np.ndarray:
        key = ("ppk_self", self._sigma(), self.ppm, self.int_sigma, self.truncate)
        if key not in a._cache:
            a._cache[key] = ppk_self(a, self._sigma(), ppm=self.ppm, int_sigma=self.int_sigma,
                                     truncate=self.truncate)
        return a._cache[key]


class PPKernel(_PPKMixin, InputKernel):
    """Probability product kernel on fragment peaks (registry name ``ppk``); see the module docstring.

    Parameters
    ----------
    mz_sigma : float or "auto"
        Peak width in m/z (Da); ``"auto"``: ``max(0.005, median reference precision / 2)``, set at fit.
    ppm : float, optional
        Relative width in ppm; the width is then ``max(mz_sigma, ppm * 1e-6 * mz)``.
    int_sigma : float, optional
        Width of the Gaussian on relative intensities (max-normalised, in (0, 1]); None: no intensity factor.
    intensity_power : float
        Peak weight = relative intensity ** intensity_power (0 = uniform weights as in Heinonen et al.).
    truncate : float
        Pairs further apart than this many widths are skipped (10: dropped terms < 1.4e-11).

    Fitted attributes
    -----------------
    mz_sigma_ : float
        The width used (``mz_sigma`` resolved).
    """

    def __init__(self, mz_sigma: float | str = DEFAULT_MZ_SIGMA, ppm: float | None = None,
                 int_sigma: float | None = None, intensity_power: float = 0.5, truncate: float = 10.0) -> None:
        self.mz_sigma = mz_sigma
        self.ppm = ppm
        self.int_sigma = int_sigma
        self.intensity_power = intensity_power
        self.truncate = truncate
        self._validate_ppk()

    def fit(self, objects: Sequence[Spectrum]) -> "PPKernel":
        objects = list(objects)
        self._resolve_sigma(objects)
        return super().fit(objects)

    def featurize(self, objects: Sequence[Spectrum]) -> PeakSet:
        return peak_set(list(objects), self.intensity_power, "peaks")

    def pairwise(self, fa: PeakSet, fb: PeakSet) -> np.ndarray:
        return self._cross(fa, fb)

    def self_similarity(self, features: PeakSet) -> np.ndarray:
        return self._self(features)


def _precision_of(spectrum: Spectrum) -> float:
    if spectrum.mz_precision is not None and spectrum.mz_precision > 0:
        return float(spectrum.mz_precision)
    mz = np.asarray(spectrum.mz, dtype=np.float64)
    return estimate_mz_precision(mz[np.isfinite(mz)])


@saveable
@dataclass
class _LossFeatures:
    """Peaks and neutral losses of a batch of spectra, with their raw self-similarities."""

    peaks: PeakSet
    losses: PeakSet
    diag_peaks: np.ndarray
    diag_losses: np.ndarray

    def __len__(self) -> int:
        return len(self.peaks)

    def __getitem__(self, index: np.ndarray | slice) -> "_LossFeatures":
        return _LossFeatures(self.peaks.take(index), self.losses.take(index), self.diag_peaks[index],
                             self.diag_losses[index])


class PPKLossesKernel(_PPKMixin, InputKernel):
    """PPK on fragment peaks and on neutral losses (registry name ``ppk-losses``).

    ``k = (1 - loss_weight) * k_peaks + loss_weight * k_losses`` with both parts normalised. A spectrum
    without losses (no precursor m/z, or no fragment below it) has a zero loss part; the combination is then
    re-normalised by ``k(x, x) = (1 - loss_weight) + loss_weight * [x has losses]`` so that it stays a
    normalised PSD kernel (for two spectra with losses it is exactly the convex combination).

    Parameters
    ----------
    mz_sigma, ppm, int_sigma, intensity_power, truncate
        As in :class:`PPKernel`, shared by both parts (a relative width of a loss follows the precursor m/z).
    loss_weight : float in [0, 1]
    """

    def __init__(self, mz_sigma: float | str = DEFAULT_MZ_SIGMA, ppm: float | None = None,
                 int_sigma: float | None = None, intensity_power: float = 0.5, truncate: float = 10.0,
                 loss_weight: float = 0.5) -> None:
        self.mz_sigma = mz_sigma
        self.ppm = ppm
        self.int_sigma = int_sigma
        self.intensity_power = intensity_power
        self.truncate = truncate
        self.loss_weight = loss_weight
        self._validate_ppk()
        if isinstance(loss_weight, bool) or not isinstance(loss_weight, (int, float)) or not 0 <= loss_weight <= 1:
            raise SpecError(f"loss_weight must be a number in [0, 1], not {loss_weight!r}")

    def fit(self, objects: Sequence[Spectrum]) -> "PPKLossesKernel":
        objects = list(objects)
        self._resolve_sigma(objects)
        return super().fit(objects)

    def featurize(self, objects: Sequence[Spectrum]) -> _LossFeatures:
        objects = list(objects)
        peaks = peak_set(objects, self.intensity_power, "peaks")
        losses = peak_set(objects, self.intensity_power, "losses")
        return _LossFeatures(peaks, losses, self._self(peaks), self._self(losses))

    def pairwise(self, fa: _LossFeatures, fb: _LossFeatures) -> np.ndarray:
        a = float(self.loss_weight)
        out = normalize_block(self._cross(fa.peaks, fb.peaks), fa.diag_peaks, fb.diag_peaks)
        out *= 1.0 - a
        if a > 0:
            out += a * normalize_block(self._cross(fa.losses, fb.losses), fa.diag_losses, fb.diag_losses)
        return out

    def self_similarity(self, features: _LossFeatures) -> np.ndarray:
        a = float(self.loss_weight)
        return (1.0 - a) * (features.diag_peaks > 0) + a * (features.diag_losses > 0)


class PPKPairsKernel(_PPKMixin, InputKernel):
    """PPK on the mass differences between the fragments of a spectrum (registry name ``ppk-pairs``).

    Each spectrum becomes the set of differences ``mz_j - mz_i`` between its ``top`` most intense peaks that lie in
    ``[min_diff, max_diff]`` Da (:func:`pair_difference_set`), weighted by ``sqrt(I_i I_j) ** intensity_power``,
    and two such sets are compared in bins of ``bin_width`` Da (:func:`binned_differences`; the default), or, with
    ``bin_width=None``, like peaks by the probability product kernel's Gaussian windows. Either way it is
    cosine-normalised and PSD. It reads the steps between fragments, which neither the peaks nor the losses from the
    precursor show. Beside the default kernels on validation it adds about 1.6 points of hit@1 to the spectrum
    model (docs/benchmarks/spectrum_terms_refused.md, "Round four"), and it is part of the default input kernel,
    ``mkl:kernels=ppk-losses+formula-annotation+ppk-pairs``.

    Parameters
    ----------
    bin_width : float or None
        Width of the bins the differences are compared in; None: the PPK's Gaussian windows, which give the same
        validation figures at 28x the cost against 4,000 landmarks (a spectrum has up to 435 differences, crowded
        into ``[min_diff, max_diff]``).
    mz_sigma, ppm, int_sigma, truncate
        As in :class:`PPKernel`, for ``bin_width=None`` only. The default width is sqrt(2) times the peaks' (a
        difference has two peaks' errors); a relative width follows the larger m/z of the pair.
    intensity_power : float
        Difference weight = ``sqrt(I_i I_j) ** intensity_power``.
    top : int
        The most intense peaks paired (30: up to 435 differences per spectrum).
    min_diff, max_diff : float
        The differences kept, in Da.
    """

    def __init__(self, mz_sigma: float | str = DEFAULT_PAIR_MZ_SIGMA, ppm: float | None = None,
                 int_sigma: float | None = None, intensity_power: float = 1.0, truncate: float = 10.0,
                 top: int = DEFAULT_PAIR_TOP, min_diff: float = DEFAULT_PAIR_RANGE[0],
                 max_diff: float = DEFAULT_PAIR_RANGE[1], bin_width: float | None = DEFAULT_PAIR_BIN_WIDTH) -> None:
        self.bin_width = bin_width
        self.mz_sigma = mz_sigma
        self.ppm = ppm
        self.int_sigma = int_sigma
        self.intensity_power = intensity_power
        self.truncate = truncate
        self.top = top
        self.min_diff = min_diff
        self.max_diff = max_diff
        self._validate_ppk()
        if isinstance(top, bool) or not isinstance(top, int) or top < 2:
            raise SpecError(f"top must be an integer >= 2 (peaks paired), not {top!r}")
        _check_positive("min_diff", min_diff)
        _check_positive("max_diff", max_diff)
        if not min_diff < max_diff:
            raise SpecError(f"min_diff ({min_diff}) must be below max_diff ({max_diff})")
        _check_positive("bin_width", bin_width, allow_none=True)

    def fit(self, objects: Sequence[Spectrum]) -> "PPKPairsKernel":
        objects = list(objects)
        self._resolve_sigma(objects)
        return super().fit(objects)

    def featurize(self, objects: Sequence[Spectrum]) -> Any:
        pairs = pair_difference_set(list(objects), self.top, self.min_diff, self.max_diff, self.intensity_power)
        if self.bin_width is None:
            return pairs
        return _Binned(binned_differences(pairs, float(self.bin_width), float(self.min_diff), float(self.max_diff)))

    def pairwise(self, fa: Any, fb: Any) -> np.ndarray:
        return self._cross(fa, fb) if self.bin_width is None else fa.dots(fb)

    def self_similarity(self, features: Any) -> np.ndarray:
        return self._self(features) if self.bin_width is None else features.squared_norms()


@saveable
@dataclass
class _Binned:
    """Binned peak vectors, ``matrix`` of shape (n, n_bins) (a ``len``-able wrapper around the CSR matrix)."""

    matrix: sp.csr_matrix

    def __len__(self) -> int:
        return int(self.matrix.shape[0])

    def __getitem__(self, index: np.ndarray | slice) -> "_Binned":
        return _Binned(self.matrix[index])

    def dots(self, other: "_Binned") -> np.ndarray:
        """Inner products of every row with every row of ``other``, shape (n, other's n), float64."""
        a, b = _same_width(self.matrix, other.matrix)
        return np.asarray((a @ b.T).toarray(), dtype=np.float64)

    def squared_norms(self) -> np.ndarray:
        """Each row's squared norm, shape (n,), float64."""
        return np.asarray(self.matrix.multiply(self.matrix).sum(axis=1), dtype=np.float64).ravel()


class CosineKernel(InputKernel):
    """Spectral cosine with an m/z tolerance (registry name ``cosine``).

    Peaks weighted by ``relative intensity ** intensity_power``; the score is
    ``sum_matched w_i w'_j / (||w|| ||w'||)``.

    - ``matching="binned"`` (default): peaks summed into m/z bins of width ``tolerance``; the kernel is the
      cosine of the binned vectors, an exact inner product and therefore PSD. Two peaks closer than
      ``tolerance`` but on both sides of a bin edge do not match; several peaks in one bin add up.
    - ``matching="greedy"``: the usual spectral-library cosine, one-to-one peak matching within ``tolerance``
      chosen greedily by descending product. It is only approximately PSD (a maximum over matchings is not an
      inner product; small negative eigenvalues occur): use it for scoring, prefer ``binned`` inside kernel
      regression. ``psd`` is False for this variant.

    Parameters
    ----------
    tolerance : float
        m/z tolerance (Da), also the bin width.
    matching : {"binned", "greedy"}
    intensity_power : float
    """

    rows_in_processes = True  # Python-bound rows (see molpredict.kernels.workers)
    block_cells = BLOCK_CELLS

    def __init__(self, tolerance: float = 0.01, matching: str = "binned", intensity_power: float = 0.5) -> None:
        self.tolerance = tolerance
        self.matching = matching
        self.intensity_power = intensity_power
        _check_positive("tolerance", tolerance)
        if matching not in ("binned", "greedy"):
            raise SpecError(f"matching must be 'binned' or 'greedy', not {matching!r}")

    @property
    def psd(self) -> bool:  # type: ignore[override]
        return self.matching == "binned"

    def featurize(self, objects: Sequence[Spectrum]) -> Any:
        peaks = peak_set(list(objects), self.intensity_power, "peaks")
        return _Binned(binned_vectors(peaks, self.tolerance)) if self.matching == "binned" else peaks

    def pairwise(self, fa: Any, fb: Any) -> np.ndarray:
        if self.matching == "binned":
            return fa.dots(fb)
        return greedy_cosine_cross(fa, fb, self.tolerance)

    def self_similarity(self, features: Any) -> np.ndarray:
        if self.matching == "binned":
            return features.squared_norms()
        return np.bincount(features.spec, weights=features.weight ** 2, minlength=features.n)
