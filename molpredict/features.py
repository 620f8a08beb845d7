"""Input featurisation for neural networks: binned spectra (peaks and neutral losses) and input-kernel features.

Binned spectra: each spectrum becomes a sparse row of ``ceil(max_mz / bin_width)`` bins (plus as many for
neutral losses, ``precursor_mz - mz``, when asked). Peaks with a non-finite m/z or intensity, an intensity <= 0,
or an m/z outside [0, max_mz) are dropped; intensities are divided by the spectrum's largest one and raised to
``intensity_power`` (0.5: square root, which keeps small fragments visible), then summed per bin.

Input-kernel features (:class:`LandmarkFeatures`): any registered input kernel's values against landmark
training inputs (spectra or text), raw or whitened into the kernel's Nystrom feature map.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from .errors import ModelFileError, SpecError

__all__ = ["LandmarkFeatures", "bin_spectra", "n_bins"]


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


class LandmarkFeatures:
    """Input-kernel values against landmark inputs, k(x, L), optionally whitened: K_LL^{-1/2} k(x, L).

    Whitened, the features are the Nystrom feature map of the kernel on the landmarks (a linear model on them is
    a kernel model with the landmarks as centres, as SIOKR's input side); K_LL^{+1/2} comes from ``eigh`` with a
    relative eigenvalue cut-off, so near-duplicate landmarks drop out instead of blowing up.

    Parameters
    ----------
    kernel : str
        Input kernel spec (registry name and parameters; inside another spec written with ``;``).
    n_landmarks : int
        Landmarks drawn uniformly without replacement from the training inputs (all of them when fewer).
    whiten : bool
    rel_cutoff : float
        Relative eigenvalue cut-off of the whitening.
    seed : int

    Fitted attributes
    -----------------
    landmarks_ : list, the landmark inputs
    kernel_ : Kernel, fitted on the landmarks
    projection_ : ndarray of shape (n_landmarks, dim_) or None, V diag(s^-1/2) of K_LL's kept eigenpairs
    dim_ : int, the number of features
    """

    def __init__(self, kernel: str, n_landmarks: int = 4000, whiten: bool = False, rel_cutoff: float = 1e-10,
                 seed: int = 0) -> None:
        self.kernel = kernel
        self.n_landmarks = n_landmarks
        self.whiten = whiten
        self.rel_cutoff = rel_cutoff
        self.seed = seed

    def fit(self, inputs: Sequence[Any]) -> "LandmarkFeatures":
        """Draw the landmarks from ``inputs`` (length n) and fit the kernel (and whitening) on them."""
        inputs = list(inputs)
        if not inputs:
            raise SpecError("input-kernel features: no training inputs to draw landmarks from")
        rng = np.random.default_rng(int(self.seed))
        size = min(int(self.n_landmarks), len(inputs))
        index = np.sort(rng.choice(len(inputs), size=size, replace=False))
        return self._fit_landmarks([inputs[i] for i in index])

    def _fit_landmarks(self, landmarks: list) -> "LandmarkFeatures":
        from .models.basis import _create
        self.landmarks_ = landmarks
        self.kernel_ = _create("input_kernel", self.kernel).fit(landmarks)
        self.projection_ = None
        if self.whiten:
            from .sketches import pinv_factor
            s, V = pinv_factor(self.kernel_.gram(), float(self.rel_cutoff))  # K_LL from the fit features
            self.projection_ = V / np.sqrt(s)
        self.dim_ = len(landmarks) if self.projection_ is None else self.projection_.shape[1]
        return self

    @property
    def input_type(self) -> str:
        """What the kernel takes (``spectrum``, ``text``, ...)."""
        from .registry import get_registry
        return get_registry().input_type("input_kernel", self.kernel) or "spectrum"

    def transform(self, inputs: Sequence[Any]) -> np.ndarray:
        """Features of ``inputs``, ndarray of shape (n, dim_), float32 (kernel values in float64 first)."""
        values = self.kernel_.transform(list(inputs))
        if self.projection_ is not None:
            values = values @ self.projection_
        return np.asarray(values, dtype=np.float32)

    def get_state(self, prefix: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Landmarks and kernel (arrays named ``prefix.*``, JSON metadata); the whitening is recomputed on load."""
        from .models.basis import frozen_spec, objects_to_state
        arrays, landmarks = objects_to_state(self.landmarks_, prefix)
        return arrays, {"landmarks": landmarks, "kernel": str(frozen_spec(self.kernel_)),
                        "whiten": bool(self.whiten), "rel_cutoff": float(self.rel_cutoff)}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any], prefix: str) -> "LandmarkFeatures":
        from .models.basis import objects_from_state
        try:
            features = cls(meta["kernel"], whiten=bool(meta.get("whiten", False)),
                           rel_cutoff=float(meta.get("rel_cutoff", 1e-10)))
            landmarks = objects_from_state(arrays, meta["landmarks"], prefix)
        except (KeyError, TypeError) as exc:
            raise ModelFileError(f"encoder state lacks its landmark features ({exc})") from None
        return features._fit_landmarks(landmarks)
