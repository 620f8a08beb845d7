"""mzXML reading of MS/MS scans through pyteomics (streaming)."""
from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from molpredict.errors import InputError
from molpredict.spectra.record import Spectrum
from molpredict.io.common import SkipReport, precursor_mz_problem
from molpredict.io.scans import iter_scans, precursor_charge_and_mode, scan_peaks

__all__ = ["read_mzxml"]


def read_mzxml(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the MS/MS scans (MS level >= 2) of an mzXML file (optionally gzipped).

    Parameters
    ----------
    path : str or path-like
    report : SkipReport, optional
        Receives one entry per skipped scan (record = 1-based position of the scan in the file, spectrum id the
        scan number, as for the spectra read).

    Yields
    ------
    Spectrum
        ``id`` the scan number (``num``); ``precursor_mz`` and ``charge`` from the first ``precursorMz``
        element (the charge signed by the scan polarity); ``ion_mode`` from ``polarity``;
        ``metadata["scan_index"]`` the 0-based position of the scan and ``metadata["retention_time"]`` (in
        minutes, ``metadata["retention_time_unit"]``) when present and a number. MS1 scans are passed over (not reported
        as skipped, their peaks not even decoded); a scan is skipped when it has no precursor m/z or peaks, a
        precursor m/z that is not positive or is above :data:`~molpredict.io.common.MAX_PRECURSOR_MZ`, or peaks
        that cannot be decoded (bad base64 or compressed data, an unknown ``compressionType``).

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
    reader = _reader_class()
    return iter_scans(path, report, lambda source: reader(source, use_index=False, decode_binary=False),
                      _to_spectrum, "mzXML", "scan", _scan_id)


@functools.cache
def _reader_class() -> type:
    """pyteomics' MzXML with two fixes for reading arrays lazily (``decode_binary=False``).

    An empty ``<peaks/>`` gives empty arrays (pyteomics' lazy path raises KeyError on it), and a
    ``compressionType`` other than ``none`` or ``zlib`` keeps its name (pyteomics would decode the compressed
    bytes as numbers) so that :func:`scan_peaks` skips the scan.
    """
    from pyteomics import mzxml

    class MzXML(mzxml.MzXML):
        def _decode_peaks(self, info: dict) -> None:
            peaks = info.get("peaks")
            if isinstance(peaks, list) and peaks and not any(k in peaks[0] for k in self._array_keys):
                info.pop("peaks")
                for key in self._array_keys:
                    info[key] = np.array([], dtype=np.float64)
                return
            super()._decode_peaks(info)

        def _determine_compression(self, info: dict) -> str:
            kind = info.get("compressionType")
            if kind not in (None, "none", "zlib"):
                return str(kind)
            return super()._determine_compression(info)

    return MzXML


def _scan_id(scan: dict, index: int) -> str:
    """The id of a scan's spectrum (its number), for the spectra read and the scans skipped alike."""
    return str(scan.get("num", scan.get("id", index + 1)))


def _to_spectrum(scan: dict, index: int) -> Spectrum | str | None:
    peaks = scan_peaks(scan, "msLevel", f"scan {scan.get('num', index + 1)}")
    if peaks is None or isinstance(peaks, str):
        return peaks
    level, mz, intensities = peaks
    try:
        precursor = scan["precursorMz"][0]
        precursor_mz = float(precursor["precursorMz"])
    except (KeyError, IndexError, TypeError, ValueError):
        return "no precursor m/z"
    problem = precursor_mz_problem(precursor_mz, "precursorMz", repr(precursor_mz))
    if problem:
        return problem
    polarity = scan.get("polarity")
    ion_mode = "positive" if polarity == "+" else "negative" if polarity == "-" else None
    charge, ion_mode = precursor_charge_and_mode(precursor.get("precursorCharge"), ion_mode)
    metadata: dict = {"scan_index": index}
    try:  # an unreadable retention time is left out (as in mzML), not the file refused
        if scan.get("retentionTime") is not None:
            metadata["retention_time"] = float(scan["retentionTime"])
            metadata["retention_time_unit"] = "minute"
    except (TypeError, ValueError):
        pass
    return Spectrum(id=_scan_id(scan, index), mz=mz, intensities=intensities,
                    precursor_mz=precursor_mz, charge=charge, ion_mode=ion_mode, adduct=None,
                    ms_level=int(level), mz_precision=None, metadata=metadata)
