"""What the XML scan formats (mzML, mzXML) share: the streaming loop over pyteomics' scans with its error and skip
handling, the peak checks, and the signed charge and ion mode of a precursor.

Each format module supplies only how to open its pyteomics reader and how to read its own fields.
"""
from __future__ import annotations

import binascii
import gzip
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from molpredict.errors import InputError
from molpredict.spectra.record import Spectrum, ion_mode_from
from molpredict.io.common import STREAM_ERRORS, SkipReport, _Skipper, stream_error

__all__ = ["iter_scans", "scan_peaks", "precursor_charge_and_mode"]


def iter_scans(path: Path, report: SkipReport | None, open_reader: Callable[[Any], Any],
               to_spectrum: Callable[[dict, int], Spectrum | str | None], kind: str, empty: str,
               scan_id: Callable[[dict, int], str]) -> Iterator[Spectrum]:
    """Stream the spectra of an XML scan file (optionally gzipped).

    Parameters
    ----------
    path : Path
    report : SkipReport, optional
        Receives one entry per skipped scan (record = 1-based position of the scan in the file, spectrum id =
        ``scan_id`` of the scan).
    open_reader : callable
        ``open_reader(binary handle)`` -> the pyteomics reader (a context manager iterating scan dicts), with
        ``decode_binary=False``: :func:`scan_peaks` decodes the arrays of MS/MS scans only.
    to_spectrum : callable
        ``to_spectrum(scan, 0-based position)`` -> a Spectrum, a skip reason, or None for a scan passed over.
    kind : str
        The format's name, for error messages (``mzML``).
    empty : str
        What a file without any scan lacks, for its error message (``spectrum``, ``scan``).
    scan_id : callable
        ``scan_id(scan, 0-based position)`` -> the id ``to_spectrum`` gives the scan's spectrum, for the skip
        entry of a scan skipped (so that it can be joined with the results of the scans read).

    Raises
    ------
    InputError
        pyteomics cannot parse the file, or it holds no scan; or a gzipped file ends early or is corrupt
        (``"truncated gzip stream after scan N"``: the scans before it have been yielded).
    """
    from lxml import etree
    from pyteomics.auxiliary import PyteomicsError

    skip = _Skipper(str(path), report)
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    # Our own handle, closed below: pyteomics leaks the one it opens when the constructor fails.
    source: Any = gzip.open(path, "rb") if compressed else open(path, "rb")
    n_scans = 0
    try:
        with open_reader(source) as reader:
            for scan in reader:
                n_scans += 1
                result = to_spectrum(scan, n_scans - 1)
                if result is None:
                    continue
                if isinstance(result, str):
                    skip(n_scans, result, scan_id(scan, n_scans - 1))
                else:
                    result.file = str(path)
                    result.record = n_scans
                    yield result
    except STREAM_ERRORS as exc:
        # A truncated or damaged .gz: the scans before it have been yielded; say where the file stops.
        raise stream_error(path, exc, n_scans, "scan") from None
    except (etree.LxmlError, PyteomicsError, UnicodeDecodeError, ValueError, KeyError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"not an {kind} file ({message})", path=str(path)) from None
    finally:
        source.close()
    if n_scans == 0:
        raise InputError(f"not an {kind} file (no {empty})", path=str(path))
    skip.close()


def scan_peaks(scan: dict, level_key: str, scan_name: str) -> tuple[int, np.ndarray, np.ndarray] | str | None:
    """``(MS level, mz, intensities)`` of an MS/MS scan, peaks sorted by m/z (float64); the reason they are
    unusable (a non-numeric MS level among them: the scan is skipped, not the file refused); or None for a scan
    below MS2 (passed over, not skipped).

    Parameters
    ----------
    scan : dict
        A pyteomics scan, its arrays still encoded (``decode_binary=False``): only MS/MS scans are decoded, so
        that a broken array in a scan passed over costs nothing, and one in an MS/MS scan skips that scan only.
    level_key : str
        The format's MS level field.
    scan_name : str
        How skip reasons name the scan (``"spectrum 'scan=12'"``, ``"scan 12"``).
    """
    level = scan.get(level_key)
    if level is None:
        return None
    try:
        level = int(level)
    except (TypeError, ValueError):
        return f"non-numeric {level_key}"
    if level < 2:
        return None
    mz = _decoded(scan, "m/z array", scan_name)
    if isinstance(mz, str):
        return mz
    intensities = _decoded(scan, "intensity array", scan_name)
    if isinstance(intensities, str):
        return intensities
    if mz is None or intensities is None or len(mz) == 0:
        return "no peaks"
    mz = np.asarray(mz, dtype=np.float64)
    intensities = np.asarray(intensities, dtype=np.float64)
    if mz.shape != intensities.shape:
        return "m/z and intensity arrays differ in length"
    if not (np.isfinite(mz).all() and np.isfinite(intensities).all()):
        return "non-finite peak"
    order = np.argsort(mz, kind="stable")
    return level, mz[order], intensities[order]


def _decoded(scan: dict, key: str, scan_name: str) -> np.ndarray | str | None:
    """Array ``key`` of ``scan`` decoded (None when absent), or the reason it cannot be."""
    record = scan.get(key)
    if not hasattr(record, "decode"):  # absent, or already an array
        return record
    if record.compression not in record.source.compression_type_map:
        # A file-wide choice of the writer (e.g. MS-Numpress without the pynumpress package): one category,
        # the skip entries' record numbers name the scans.
        return f"{key} compressed with {record.compression!r}, which this reader cannot decode"
    try:
        return record.decode()
    except (ValueError, zlib.error) as exc:  # binascii.Error and UnicodeError are ValueErrors
        if isinstance(exc, (binascii.Error, UnicodeError)):
            problem = "invalid base64"
        elif isinstance(exc, zlib.error):
            problem = f"cannot {record.compression.replace(' compression', '')}-decompress"
        else:
            problem = " ".join(str(exc).split())  # e.g. "buffer size must be a multiple of element size"
        return f"unreadable {key} in {scan_name} ({problem})"


def precursor_charge_and_mode(charge: Any, ion_mode: str | None) -> tuple[int | None, str | None]:
    """The precursor charge signed by the scan polarity, and the ion mode (from the charge when the scan has no
    polarity)."""
    charge = int(charge) if charge else None
    if charge is not None and ion_mode == "negative" and charge > 0:
        charge = -charge
    if ion_mode is None:
        ion_mode = ion_mode_from(charge, None)
    return charge, ion_mode
