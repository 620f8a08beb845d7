"""mzML reading of MS/MS scans through pyteomics (streaming)."""
from __future__ import annotations

import gzip
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, MolpredictError
from ..spectrum import Spectrum, ion_mode_from
from .common import SkipReport, _Skipper

__all__ = ["read_mzml"]


def read_mzml(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the MS/MS scans (MS level >= 2) of an mzML file (optionally gzipped).

    Parameters
    ----------
    path : str or path-like
    report : SkipReport, optional
        Receives one entry per skipped scan (record = 1-based position of the scan in the file).

    Yields
    ------
    Spectrum
        ``id`` the scan's native id (e.g. ``"controllerType=0 controllerNumber=1 scan=12"``);
        ``precursor_mz`` and ``charge`` from the first selected ion (the charge signed by the scan polarity);
        ``ion_mode`` from the scan polarity; ``metadata["scan_index"]`` the 0-based scan index and
        ``metadata["retention_time"]`` the scan start time when present. MS1 scans are passed over (not
        reported as skipped); a scan without precursor m/z or peaks is skipped.

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
    from lxml import etree
    from pyteomics import mzml
    from pyteomics.auxiliary import PyteomicsError

    skip = _Skipper(str(path), report)
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    # Our own handle, closed below: pyteomics leaks the one it opens when the constructor fails.
    source: Any = gzip.open(path, "rb") if compressed else open(path, "rb")
    n_scans = 0
    try:
        reader = mzml.MzML(source, use_index=False, decode_binary=True)
        with reader:
            for scan in reader:
                n_scans += 1
                result = _to_spectrum(scan)
                if result is None:
                    continue
                if isinstance(result, str):
                    skip(n_scans, result)
                else:
                    result.file = str(path)
                    result.record = n_scans
                    yield result
    except (etree.LxmlError, PyteomicsError, UnicodeDecodeError, OSError, EOFError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"not an mzML file ({message})", path=str(path)) from None
    finally:
        source.close()
    if n_scans == 0:
        raise InputError("not an mzML file (no spectrum)", path=str(path))
    skip.close()


def _to_spectrum(scan: dict) -> Spectrum | str | None:
    level = scan.get("ms level")
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
        ion = scan["precursorList"]["precursor"][0]["selectedIonList"]["selectedIon"][0]
        precursor_mz = float(ion["selected ion m/z"])
    except (KeyError, IndexError, TypeError, ValueError):
        return "no precursor m/z"
    ion_mode = "positive" if "positive scan" in scan else "negative" if "negative scan" in scan else None
    charge = ion.get("charge state")
    charge = int(charge) if charge else None
    if charge is not None and ion_mode == "negative" and charge > 0:
        charge = -charge
    if ion_mode is None:
        ion_mode = ion_mode_from(charge, None)
    metadata: dict = {"scan_index": int(scan.get("index", 0))}
    try:
        rt = scan["scanList"]["scan"][0]["scan start time"]
        metadata["retention_time"] = float(rt)
        unit = getattr(rt, "unit_info", None)
        if unit:
            metadata["retention_time_unit"] = str(unit)
    except (KeyError, IndexError, TypeError, ValueError):
        pass
    return Spectrum(id=str(scan.get("id", scan.get("index"))), mz=mz, intensities=intensities,
                    precursor_mz=precursor_mz, charge=charge, ion_mode=ion_mode, adduct=None,
                    ms_level=int(level), mz_precision=None, metadata=metadata)
