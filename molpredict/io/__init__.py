"""Spectra file formats: streaming readers (MGF, MSP, mzML, mzXML), the MGF writer, the skip report, array form.

The public names are re-exported by :mod:`molpredict.spectra.cleaning`, which is where users import them from.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from molpredict.errors import InputError
from molpredict.spectra.record import Spectrum
from molpredict.io.arrays import spectra_from_arrays, spectra_to_arrays
from molpredict.io.common import SkipEntry, SkipReport
from molpredict.io.mgf import read_mgf, write_mgf
from molpredict.io.msp import read_msp
from molpredict.io.mzml import read_mzml
from molpredict.io.mzxml import read_mzxml

__all__ = ["read_spectra", "read_mgf", "read_msp", "read_mzml", "read_mzxml", "write_mgf", "SkipReport", "SkipEntry",
           "spectra_to_arrays", "spectra_from_arrays", "SPECTRA_READERS", "spectra_format"]

#: file extension (lower case, without ``.gz``) -> reader
SPECTRA_READERS: dict[str, Callable[..., Iterator[Spectrum]]] = {
    ".mgf": read_mgf,
    ".msp": read_msp,
    ".mzml": read_mzml,
    ".mzxml": read_mzxml,
}


def spectra_format(path: str | os.PathLike) -> str:
    """The format extension of ``path`` (``".mgf"``, ``".msp"``, ``".mzml"``, ``".mzxml"``), ignoring a ``.gz``
    suffix.

    Raises
    ------
    InputError
        The extension is not a known spectra format.
    """
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    if suffix not in SPECTRA_READERS:
        known = ", ".join(SPECTRA_READERS)
        raise InputError(f"unknown spectra format {suffix or '(no extension)'!r} (expected {known}, "
                         "optionally .gz)", path=str(path))
    return suffix


def read_spectra(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the spectra of a file, choosing the reader by extension (``.mgf``, ``.msp``, ``.mzML``,
    ``.mzXML``, each optionally ``.gz``).

    Parameters
    ----------
    path : str or path-like
    report : SkipReport, optional
        Collects the records skipped as unreadable.

    Raises
    ------
    InputError
        Unknown extension, or a file that is not spectra (see the readers).
    """
    return SPECTRA_READERS[spectra_format(path)](path, report=report)
