"""MS/MS spectra: the ``Spectrum`` record, streaming readers (MGF, MSP, mzML), the MGF writer and cleaning."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Spectrum"]


@dataclass
class Spectrum:
    """One MS/MS spectrum.

    Attributes
    ----------
    id : str
        The record identifier (TITLE, else FEATURE_ID, else SCANS, else ``"<file stem>:<index>"``).
    mz : ndarray of shape (n_peaks,)
        Fragment m/z values, float64, sorted ascending.
    intensities : ndarray of shape (n_peaks,)
        Intensities as deposited (absolute or relative), float64, same order as ``mz``.
    precursor_mz : float or None
        Precursor m/z (PEPMASS).
    charge : int or None
        Signed precursor charge (``+1``, ``-1``, ``+2``...), None when absent.
    ion_mode : {"positive", "negative"} or None
    adduct : str or None
        Precursor type as written in the file (e.g. ``[M+H]+``); None when absent or empty.
    ms_level : int
        2 for MS/MS.
    mz_precision : float or None
        The finest m/z step the file reported for this spectrum's peaks (``10**-decimals``), e.g. 0.0001 for
        high-resolution data and 0.1 for some low-resolution instruments.
    metadata : dict
        Everything else, with matchms-style keys: ``smiles``, ``inchikey``, ``formula``, ``compound_name``,
        ``license``, ``instrument_type``, ``collision_energy``, ...
    """

    id: str
    mz: np.ndarray
    intensities: np.ndarray
    precursor_mz: float | None = None
    charge: int | None = None
    ion_mode: str | None = None
    adduct: str | None = None
    ms_level: int = 2
    mz_precision: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mz = np.asarray(self.mz, dtype=np.float64)
        self.intensities = np.asarray(self.intensities, dtype=np.float64)
        if self.mz.shape != self.intensities.shape or self.mz.ndim != 1:
            raise ValueError(f"spectrum {self.id}: mz and intensities must be 1-D arrays of the same length")

    @property
    def n_peaks(self) -> int:
        return int(self.mz.shape[0])

    @property
    def smiles(self) -> str | None:
        return self.metadata.get("smiles") or None

    @property
    def inchikey(self) -> str | None:
        return self.metadata.get("inchikey") or None

    @property
    def formula(self) -> str | None:
        return self.metadata.get("formula") or None
