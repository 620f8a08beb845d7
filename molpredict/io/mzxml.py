"""mzXML reading of MS/MS scans through pyteomics (streaming)."""
from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..spectrum import Spectrum, ion_mode_from
from .common import SkipReport, _Skipper

__all__ = ["read_mzxml"]


def read_mzxml(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the MS/MS scans (MS level >= 2) of an mzXML file (optionally gzipped).

    Parameters
    ----------
    path : str or path-like
    report : SkipReport, optional
        Receives one entry per skipped scan (record = 1-based position of the scan in the file).

    Yields
    ------
    Spectrum
        ``id`` the scan number (``num``); ``precursor_mz`` and ``charge`` from the first ``precursorMz``
        element (the charge signed by the scan polarity); ``ion_mode`` from ``polarity``;
        ``metadata["scan_index"]`` the 0-based position of the scan and ``metadata["retention_time"]`` (in
        minutes, ``metadata["retention_time_unit"]``) when present. MS1 scans are passed over (not reported
        as skipped); a scan without precursor m/z or peaks is skipped.

    Raises
    ------
    InputError
        The file is missing or is not mzXML (pyteomics cannot parse it, or it holds no scan).
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file", path=str(path))
    if path.is_dir():
        raise InputError("is a directory, not an mzXML file", path=str(path))
    return _iter_mzxml(path, report)


def _iter_mzxml(path: Path, report: SkipReport | None) -> Iterator[Spectrum]:
    from lxml import etree
    from pyteomics import mzxml
    from pyteomics.auxiliary import PyteomicsError

    skip = _Skipper(str(path), report)
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    # Our own handle, closed below: pyteomics leaks the one it opens when the constructor fails.
    source: Any = gzip.open(path, "rb") if compressed else open(path, "rb")
    n_scans = 0
    try:
        reader = mzxml.MzXML(source, use_index=False, decode_binary=True)
        with reader:
            for scan in reader:
                n_scans += 1
                result = _to_spectrum(scan, n_scans - 1)
                if result is None:
                    continue
                if isinstance(result, str):
                    skip(n_scans, result)
                else:
                    result.file = str(path)
                    result.record = n_scans
                    yield result
    except (etree.LxmlError, PyteomicsError, UnicodeDecodeError, OSError, EOFError, ValueError,
            KeyError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"not an mzXML file ({message})", path=str(path)) from None
    finally:
        source.close()
    if n_scans == 0:
        raise InputError("not an mzXML file (no scan)", path=str(path))
    skip.close()


def _to_spectrum(scan: dict, index: int) -> Spectrum | str | None:
    level = scan.get("msLevel")
    if level is None or int(level) < 2:
        return None
    mz = scan.get("m/z array")
    intensities = scan.get("intensity array")
    if mz is None or intensities is None or len(mz) == 0:
        return "no peaks"
    mz = np.asarray(mz, dtype=np.float64)
    intensities = np.asarray(intensities, dtype=np.float64)
    if mz.shape != intensities.shape:
        return "m/z and intensity arrays differ in length"
    if not (np.isfinite(mz).all() and np.isfinite(intensities).all()):
        return "non-finite peak"
    order = np.argsort(mz, kind="stable")
    mz, intensities = mz[order], intensities[order]
    try:
        precursor = scan["precursorMz"][0]
        precursor_mz = float(precursor["precursorMz"])
    except (KeyError, IndexError, TypeError, ValueError):
        return "no precursor m/z"
    polarity = scan.get("polarity")
    ion_mode = "positive" if polarity == "+" else "negative" if polarity == "-" else None
    charge = precursor.get("precursorCharge")
    charge = int(charge) if charge else None
    if charge is not None and ion_mode == "negative" and charge > 0:
        charge = -charge
    if ion_mode is None:
        ion_mode = ion_mode_from(charge, None)
    metadata: dict = {"scan_index": index}
    if scan.get("retentionTime") is not None:
        metadata["retention_time"] = float(scan["retentionTime"])
        metadata["retention_time_unit"] = "minute"
    return Spectrum(id=str(scan.get("num", scan.get("id", index + 1))), mz=mz, intensities=intensities,
                    precursor_mz=precursor_mz, charge=charge, ion_mode=ion_mode, adduct=None,
                    ms_level=int(level), mz_precision=None, metadata=metadata)
