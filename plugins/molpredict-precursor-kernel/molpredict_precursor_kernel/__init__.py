"""An example third-party molpredict plugin: ``precursor-gaussian``, a Gaussian kernel on precursor m/z.

On its own it is a weak kernel (it only sees the precursor mass); it shows the plugin mechanics and is a
useful term to add to a spectrum kernel when precursor masses are informative.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from molpredict.hookspecs import hookimpl
from molpredict.kernels import InputKernel

__version__ = "0.1.0"


class PrecursorGaussianKernel(InputKernel):
    """k(x, x') = exp(-(p - p')^2 / (2 width^2)), p the precursor m/z; spectra without one get k = 0.

    Parameters
    ----------
    width : float
        Width in Da.
    """

    def __init__(self, width: float = 0.5) -> None:
        self.width = width

    def featurize(self, objects: Sequence) -> np.ndarray:
        return np.array([np.nan if s.precursor_mz is None else s.precursor_mz for s in objects], dtype=np.float64)

    def pairwise(self, fa: np.ndarray, fb: np.ndarray) -> np.ndarray:
        diff = fa[:, None] - fb[None, :]
        return np.nan_to_num(np.exp(-diff**2 / (2.0 * self.width**2)), nan=0.0)

    def self_similarity(self, features: np.ndarray) -> np.ndarray:
        # 0 for a missing precursor: the base class then gives k = 0 with every other spectrum, 1 with itself.
        return (~np.isnan(features)).astype(np.float64)


@hookimpl
def register_input_kernels(register):
    register("precursor-gaussian", PrecursorGaussianKernel)
