"""The ``Spectrum`` record (what the readers produce and every model takes) and its ion mode."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Spectrum", "ION_MODES", "ion_mode_from", "spectrum_ion_mode"]

#: the ion modes a spectrum can have
ION_MODES = ("positive", "negative")


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
    precursor_mz_precision : float or None
        The precursor m/z's written precision (``10**-decimals``: 0.1 for ``PEPMASS=224.1``); None when
        unknown (binary formats). Candidate selection by mass widens its window to what it allows.
    file : str or None
        The file the spectrum was read from (set by the readers; None for spectra built in code).
    record : int or None
        Its 1-based record number in that file (the same numbering as skip reports); with ``file``, what tells
        spectra apart when their ids repeat.
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
    precursor_mz_precision: float | None = None
    file: str | None = None
    record: int | None = None

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

    def with_peaks(self, mz: np.ndarray, intensities: np.ndarray) -> "Spectrum":
        """A copy with other peaks (same id, precursor and metadata; the metadata dict is shared, not copied).

        Parameters
        ----------
        mz : ndarray of shape (n,)
            Sorted ascending.
        intensities : ndarray of shape (n,)
        """
        if type(self) is not Spectrum:
            return dataclasses.replace(self, mz=mz, intensities=intensities)
        # Direct construction: dataclasses.replace costs more than the cleaning step itself.
        return Spectrum(self.id, mz, intensities, self.precursor_mz, self.charge, self.ion_mode, self.adduct,
                        self.ms_level, self.mz_precision, self.metadata, self.precursor_mz_precision, self.file,
                        self.record)


def ion_mode_from(charge: int | None, adduct: str | None) -> str | None:
    """Infer the ion mode from the charge's sign, else from the adduct's trailing sign (``[M+H]+``)."""
    if charge:
        return "positive" if charge > 0 else "negative"
    if adduct:
        tail = adduct.rstrip().rstrip("*")
        if tail.endswith("+"):
            return "positive"
        if tail.endswith("-"):
            return "negative"
    return None


def spectrum_ion_mode(spectrum: Spectrum) -> str | None:
    """The spectrum's ion mode (``"positive"`` / ``"negative"``), else inferred from its charge or adduct."""
    if spectrum.ion_mode in ION_MODES:
        return spectrum.ion_mode
    return ion_mode_from(spectrum.charge, spectrum.adduct)
