"""mzML reading of MS/MS scans through pyteomics (streaming)."""
from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

from molpredict.errors import InputError, MolpredictError
from molpredict.spectra.record import Spectrum
from molpredict.io.common import SkipReport, precursor_mz_problem
from molpredict.io.scans import iter_scans, precursor_charge_and_mode, scan_peaks

__all__ = ["read_mzml"]


def read_mzml(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the MS/MS scans (MS level >= 2) of an mzML file (optionally gzipped).

    Parameters
    ----------
    path : str or path-like
    report : SkipReport, optional
        Receives one entry per skipped scan (record = 1-based position of the scan in the file, spectrum id the
        scan's native id, as for the spectra read).

    Yields
    ------
    Spectrum
        ``id`` the scan's native id (e.g. ``"controllerType=0 controllerNumber=1 scan=12"``);
        ``precursor_mz`` and ``charge`` from the first selected ion (the charge signed by the scan polarity);
        ``ion_mode`` from the scan polarity; ``metadata["scan_index"]`` the 0-based scan index and
        ``metadata["retention_time"]`` the scan start time when present. MS1 scans are passed over (not
        reported as skipped, their arrays not even decoded); a scan is skipped when its ms level is not a number,
        it has no precursor m/z or peaks, a selected ion m/z that is not positive or is above
        :data:`~molpredict.io.common.MAX_PRECURSOR_MZ`, or an array that cannot be decoded (bad base64 or
        compressed data, or a compression pyteomics cannot decode, such as MS-Numpress without pynumpress).

    Raises
    ------
    InputError
        The file is missing or is not mzML (pyteomics cannot parse it).
    MolpredictError
        The ``psims`` package, which pyteomics needs for mzML, is not installed.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file", path=str(path))
    if importlib.util.find_spec("psims") is None:  # pyteomics needs it for mzML's controlled vocabulary
        raise MolpredictError(f"{path}: reading mzML needs the psims package (pip install psims)")
    return _iter_mzml(path, report)


def _iter_mzml(path: Path, report: SkipReport | None) -> Iterator[Spectrum]:
    reader = _reader_class()
    return iter_scans(path, report, lambda source: reader(source, use_index=False, decode_binary=False),
                      _to_spectrum, "mzML", "spectrum", _scan_id)


@functools.cache
def _reader_class() -> type:
    """pyteomics' MzML, except that an array compressed in a way it does not know keeps that compression's name.

    pyteomics takes such an array (MS-Numpress without the pynumpress package, a newer CV term) for an
    uncompressed one and decodes bytes of another encoding as numbers; with the name kept, :func:`scan_peaks`
    skips the scan instead.
    """
    from pyteomics import mzml

    class MzML(mzml.MzML):
        def _determine_compression(self, info: dict) -> str | None:
            names = [k for k in info if isinstance(k, str)]
            if isinstance(info.get("name"), (list, dict)):
                names += [k for k in info["name"] if isinstance(k, str)]
            unknown = [n for n in names if "compression" in n.lower() and n not in self.compression_type_map]
            found = super()._determine_compression(info)
            if unknown and found in (None, "no compression"):
                return unknown[0]
            return found

    return MzML


def _scan_id(scan: dict, position: int) -> str:
    """The id of a scan's spectrum (its native id), for the spectra read and the scans skipped alike."""
    return str(scan.get("id", scan.get("index")))


def _to_spectrum(scan: dict, position: int) -> Spectrum | str | None:
    peaks = scan_peaks(scan, "ms level", f"spectrum {str(scan.get('id', position))!r}")
    if peaks is None or isinstance(peaks, str):
        return peaks
    level, mz, intensities = peaks
    try:
        ion = scan["precursorList"]["precursor"][0]["selectedIonList"]["selectedIon"][0]
        precursor_mz = float(ion["selected ion m/z"])
    except (KeyError, IndexError, TypeError, ValueError):
        return "no precursor m/z"
    problem = precursor_mz_problem(precursor_mz, "selected ion m/z", repr(precursor_mz))
    if problem:
        return problem
    ion_mode = "positive" if "positive scan" in scan else "negative" if "negative scan" in scan else None
    charge, ion_mode = precursor_charge_and_mode(ion.get("charge state"), ion_mode)
    metadata: dict = {"scan_index": int(scan.get("index", 0))}
    try:
        rt = scan["scanList"]["scan"][0]["scan start time"]
        metadata["retention_time"] = float(rt)
        unit = getattr(rt, "unit_info", None)
        if unit:
            metadata["retention_time_unit"] = str(unit)
    except (KeyError, IndexError, TypeError, ValueError):
        pass
    return Spectrum(id=_scan_id(scan, position), mz=mz, intensities=intensities,
                    precursor_mz=precursor_mz, charge=charge, ion_mode=ion_mode, adduct=None,
                    ms_level=int(level), mz_precision=None, metadata=metadata)
