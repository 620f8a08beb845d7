"""The multi-fingerprint output kernel (``multi-fingerprint``): a Gaussian on the average Tanimoto / MinMax
similarity of several fingerprints of the molecules.

``k(y, y') = exp(-gamma (2 - 2 T(y, y')))`` with ``T = mean_f T_f`` over the fingerprints ``f`` listed in ``fps``
(Tanimoto on bits, MinMax on counts, as in :mod:`molpredict.kernels.fingerprints`). Each ``T_f`` is PSD with
``T_f(y, y) = 1``, so is their mean, and so is ``exp(-2 gamma) exp(2 gamma T)`` (the exponential of a PSD
kernel times a positive constant): PSD with unit diagonal. One fingerprint alone gives ``gaussian-tanimoto``.

Fingerprint names in ``fps`` (separated by ``+``; not ``;``, which a nested spec reads as ``,``): ``morgan<R>`` (Morgan bits of radius R, e.g. ``morgan2``),
``morgan<R>c`` (Morgan counts, MinMax), ``maccs`` (166 MACCS keys), ``rdkit`` (RDKit path bits), ``rdkitc``
(RDKit path counts). ``size`` is the length of the hashed fingerprints.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from molpredict.errors import SpecError
from molpredict.chem.molecules import Molecule
from molpredict.kernels.base import saveable
from molpredict.kernels.fingerprints import GaussianTanimotoKernel, TanimotoKernel

__all__ = ["parse_fingerprint_list", "MultiFingerprintKernel"]

_FP_NAME = re.compile(r"^(?:morgan(\d)(c?)|maccs|rdkit(c?))$")


def parse_fingerprint_list(text: str, size: int = 2048) -> list[TanimotoKernel]:
    """One :class:`TanimotoKernel` per fingerprint name of ``text`` (``"morgan2+maccs+rdkit"``).

    Raises
    ------
    SpecError
        An empty list, an unknown or a repeated name.
    """
    names = [part.strip() for part in str(text).split("+") if part.strip()]
    if not names:
        raise SpecError("multi-fingerprint: fps lists no fingerprint")
    if len(set(names)) != len(names):
        raise SpecError(f"multi-fingerprint: fps {text!r} repeats a fingerprint")
    kernels = []
    for name in names:
        match = _FP_NAME.match(name)
        if match is None:
            raise SpecError(f"multi-fingerprint: unknown fingerprint {name!r} (expected morgan<R>, morgan<R>c, "
                            f"maccs, rdkit or rdkitc)")
        if name.startswith("morgan"):
            kernels.append(TanimotoKernel("morgan", radius=int(match.group(1)), size=size,
                                          counts=bool(match.group(2))))
        elif name == "maccs":
            kernels.append(TanimotoKernel("maccs", size=size))
        else:
            kernels.append(TanimotoKernel("rdkit", size=size, counts=bool(match.group(3))))
    return kernels


@saveable
@dataclass
class _MultiFingerprints:
    """One fingerprint matrix per fingerprint kind, aligned on the same molecules."""

    parts: list

    def __len__(self) -> int:
        return len(self.parts[0])

    def __getitem__(self, index: np.ndarray | slice) -> "_MultiFingerprints":
        return _MultiFingerprints([p[index] for p in self.parts])


class MultiFingerprintKernel(GaussianTanimotoKernel):
    """Gaussian on the mean Tanimoto / MinMax similarity of several fingerprints (``multi-fingerprint``).

    Parameters
    ----------
    fps : str
        Fingerprint names separated by ``+`` (see the module docstring).
    gamma : float or "auto"
        ``"auto"``: ``1 / mean(2 - 2 T)`` over distinct pairs of (a sample of 2,000 of) the reference molecules.
    size : int
        Length of the hashed fingerprints (Morgan, RDKit paths).
    n_jobs : int
        Worker processes for the fingerprints of large batches.
    seed : int
        Seed of the sample for ``gamma="auto"``.

    Fitted attributes
    -----------------
    gamma_ : float
    """

    unit_diagonal: ClassVar[bool] = True

    def __init__(self, fps: str = "morgan2+maccs+rdkit", gamma: float | str = "auto", size: int = 2048,
                 n_jobs: int = 1, seed: int = 0) -> None:
        self.fps = fps
        self.gamma = gamma
        self.size = size
        self.n_jobs = n_jobs
        self.seed = seed
        if gamma != "auto" and (isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma > 0):
            raise SpecError(f"gamma must be a positive number or 'auto', not {gamma!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 8:
            raise SpecError(f"size must be an integer >= 8, not {size!r}")
        self._kernels = parse_fingerprint_list(fps, size)
        for kernel in self._kernels:
            kernel.n_jobs = n_jobs

    def featurize(self, objects: Sequence[Molecule]) -> _MultiFingerprints:
        objects = list(objects)
        return _MultiFingerprints([kernel.featurize(objects) for kernel in self._kernels])

    def similarity(self, fa: _MultiFingerprints, fb: _MultiFingerprints) -> np.ndarray:  # type: ignore[override]
        """Mean Tanimoto / MinMax similarity over the fingerprints, shape (len(fa), len(fb))."""
        total = self._kernels[0].similarity(fa.parts[0], fb.parts[0])
        for kernel, a, b in zip(self._kernels[1:], fa.parts[1:], fb.parts[1:]):
            total += kernel.similarity(a, b)
        total /= len(self._kernels)
        return total

