"""Input featurisation for neural networks: binned spectra (peaks and neutral losses).

Each spectrum becomes a sparse row of ``ceil(max_mz / bin_width)`` bins (plus as many for
neutral losses, ``precursor_mz - mz``, when asked). Peaks with a non-finite m/z or intensity, an intensity <= 0,
or an m/z outside [0, max_mz) are dropped; intensities are divided by the spectrum's largest one and raised to
``intensity_power`` (0.5: square root, which keeps small fragments visible), then summed per bin.

Input-kernel features (raw or whitened against landmark inputs) are the Nystrom map of :mod:`molpredict.engine.nystrom`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.errors import SpecError

__all__ = ["bin_spectra", "n_bins"]


def n_bins(max_mz: float, bin_width: float) -> int:
    """Number of bins covering [0, max_mz)."""
    if bin_width <= 0 or max_mz <= 0:
        raise SpecError(f"binning: bin_width and max_mz must be > 0, got {bin_width} and {max_mz}")
    return int(math.ceil(max_mz / bin_width))


def bin_spectra(spectra: Sequence[Any], bin_width: float = 1.0, max_mz: float = 1000.0,
                intensity_power: float = 0.5, losses: bool = False, max_loss: float = 500.0) -> sp.csr_matrix:
    """Binned spectra as a sparse matrix.

    Parameters
    ----------
    spectra : sequence of Spectrum, length n
    bin_width : float
        Bin width in Da (0.1 to 1 are typical).
    max_mz : float
        Fragments at or beyond this m/z are dropped.
    intensity_power : float
        Relative intensities are raised to this power (0.5: square root; 0: peak presence).
    losses : bool
        Append neutral-loss bins (``precursor_mz - mz`` in (0, max_loss)); spectra without a precursor m/z get
        none.
    max_loss : float

    Returns
    -------
    scipy.sparse.csr_matrix of shape (n, n_bins(max_mz, bin_width) [+ n_bins(max_loss, bin_width)]), float32
    """
    n_peak_bins = n_bins(max_mz, bin_width)
    n_loss_bins = n_bins(max_loss, bin_width) if losses else 0
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for i, spectrum in enumerate(spectra):
        mz = np.asarray(spectrum.mz, dtype=np.float64)
        inten = np.asarray(spectrum.intensities, dtype=np.float64)
        ok = np.isfinite(mz) & np.isfinite(inten) & (inten > 0)
        mz, inten = mz[ok], inten[ok]
        if mz.size == 0:
            continue
        weight = (inten / inten.max()) ** intensity_power
        inside = (mz >= 0) & (mz < max_mz)
        rows.append(np.full(int(inside.sum()), i))
        cols.append(np.minimum((mz[inside] / bin_width).astype(np.int64), n_peak_bins - 1))
        vals.append(weight[inside])
        precursor = getattr(spectrum, "precursor_mz", None)
        if losses and precursor is not None and np.isfinite(precursor):
            loss = float(precursor) - mz
            keep = (loss > 0) & (loss < max_loss)
            rows.append(np.full(int(keep.sum()), i))
            cols.append(n_peak_bins + np.minimum((loss[keep] / bin_width).astype(np.int64), n_loss_bins - 1))
            vals.append(weight[keep])
    n = len(spectra)
    shape = (n, n_peak_bins + n_loss_bins)
    if not rows:
        return sp.csr_matrix(shape, dtype=np.float32)
    matrix = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape)
    out = matrix.tocsr()  # sums peaks falling into one bin
    out.sum_duplicates()
    return out.astype(np.float32)
