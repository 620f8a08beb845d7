"""NIST / MassBank MSP reading (streaming, tolerant of the usual quirks)."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator

import numpy as np

from ..errors import InputError
from ..spectra import Spectrum
from .common import SkipReport, _Skipper, file_stem, ion_mode_from, normalize_ion_mode, open_text, parse_charge

__all__ = ["read_msp", "MSP_KEY_MAP"]

#: MSP keys (lower case, spaces as underscores) -> matchms-style metadata keys; others are kept as they are.
MSP_KEY_MAP = {
    "name": "compound_name",
    "inchi_key": "inchikey",
    "instrument": "instrument",
    "collision_energy": "collision_energy",
}
_PRECURSOR_KEYS = ("precursormz", "precursor_mz", "pepmass", "precursor_m/z", "selected_ion_m/z")
_ADDUCT_KEYS = ("precursor_type", "precursortype", "adduct")
_ION_MODE_KEYS = ("ion_mode", "ionmode", "polarity")
_ID_KEYS = ("title", "db#", "accession", "spectrumid", "spectrum_id", "id", "feature_id", "scans")
_FIELD_KEYS = frozenset(_PRECURSOR_KEYS + _ADDUCT_KEYS + _ION_MODE_KEYS + ("charge", "spectrum_type", "mslevel",
                                                                          "ms_level", "num_peaks"))
_NUM_PEAKS_KEYS = frozenset({"num_peaks", "numpeaks", "num peaks"})
_QUOTED = re.compile(r'"[^"]*"')
_PEAK_START = frozenset("0123456789.+-")


def read_msp(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the spectra of an MSP file (NIST / MassBank style; optionally gzipped), skipping bad records.

    Parameters
    ----------
    path : str or path-like
    report : SkipReport, optional
        Receives one ``(path, record, reason)`` entry per skipped record (1-based record numbers).

    Yields
    ------
    Spectrum
        ``id`` from DB# (or TITLE, ACCESSION, ID, FEATURE_ID, SCANS), else ``"<file stem>:<record>"``;
        ``precursor_mz`` from PrecursorMZ; ``adduct`` from Precursor_type; ``ion_mode`` from Ion_mode
        (``P``/``N``/``Positive``...), else the charge's or adduct's sign; ``charge`` from Charge;
        ``ms_level`` from Spectrum_type (``MS2``) or MSLevel (default 2). Other keys go to ``metadata``
        lower-cased with spaces as underscores (Name -> ``compound_name``).

    Raises
    ------
    InputError
        The file is missing, binary, not MSP (its first line is not ``Key: value``) or holds no record.

    Notes
    -----
    A record is header lines ``Key: value``, a ``Num Peaks: n`` line, then peaks: ``m/z intensity`` pairs
    separated by spaces or tabs, possibly several per line separated by ``;``, possibly followed by a quoted
    annotation. Records end at a blank line or at the next header line. A record whose peak count differs
    from ``Num Peaks`` is skipped.
    """
    # Missing or binary files fail here, at the call; the generator opens the file again when iterated, so
    # that a generator never iterated holds no open file.
    open_text(path, "MSP").close()
    return _iter_msp(str(path), report)


def _iter_msp(path: str, report: SkipReport | None) -> Iterator[Spectrum]:
    skip = _Skipper(path, report)
    stem = file_stem(path)
    n_records = 0
    state = "between"  # "between" records, in a record's "header", or in its "peaks"
    keys: dict[str, str] = {}
    peaks: list[str] = []
    line_no = 0

    def finish() -> Spectrum | None:
        result = _build_spectrum(keys, peaks, n_records, stem)
        if isinstance(result, str):
            skip(n_records, result)
            return None
        return result

    with open_text(path, "MSP") as handle:
        for line in handle:
            line_no += 1
            s = line.strip()
            if state == "peaks":
                if s and (s[0] in _PEAK_START or s[0] == '"'):
                    peaks.append(s)
                    continue
                spectrum = finish()
                if spectrum is not None:
                    yield spectrum
                state = "between"
            if not s:
                if state == "header":
                    skip(n_records, "no peaks")
                    state = "between"
                continue
            if s[0] == "#":
                continue
            key, sep, value = s.partition(":")
            if not sep:
                if n_records == 0:
                    raise InputError(f"not an MSP file (line {line_no} is not 'Key: value')", path=path)
                if state == "header":
                    # Peaks without a "Num Peaks" line: take them, the count check is skipped.
                    keys.setdefault("num_peaks", "")
                    peaks.append(s)
                    state = "peaks"
                continue
            key = key.strip().lower().replace(" ", "_")
            if state == "between" or (key == "name" and "name" in keys):
                if state == "header":
                    skip(n_records, "no peaks")
                n_records += 1
                keys = {}
                peaks = []
                state = "header"
            if key in _NUM_PEAKS_KEYS:
                keys["num_peaks"] = value.strip()
                state = "peaks"
            else:
                keys[key] = value.strip()
        if state == "peaks":
            spectrum = finish()
            if spectrum is not None:
                yield spectrum
        elif state == "header":
            skip(n_records, "no peaks")
    if n_records == 0:
        raise InputError("not an MSP file (no record)", path=path)
    skip.close()


def _parse_peaks(peaks: list[str]) -> tuple[np.ndarray, np.ndarray, float] | str:
    tokens: list[str] = []
    for line in peaks:
        for chunk in _QUOTED.sub(" ", line).split(";"):
            parts = chunk.split()
            if not parts:
                continue
            if len(parts) < 2:
                return "incomplete peak"
            tokens += parts[:2]
    if not tokens:
        return "no peaks"
    try:
        values = np.array(tokens, dtype=np.float64).reshape(-1, 2)
    except ValueError:
        return "non-numeric peak"
    if not np.isfinite(values).all():
        return "non-finite peak"
    mz, intensities = values[:, 0].copy(), values[:, 1].copy()
    if (mz <= 0).any() or (intensities < 0).any():
        return "negative m/z or intensity"
    decimals = max(_decimals(t) for t in tokens[0::2])
    if mz.shape[0] > 1 and (mz[1:] < mz[:-1]).any():
        order = np.argsort(mz, kind="stable")
        mz, intensities = mz[order], intensities[order]
    return mz, intensities, 10.0 ** -decimals


def _decimals(token: str) -> int:
    mantissa, _, exponent = token.lower().partition("e")
    fraction = mantissa.partition(".")[2]
    return max(0, len(fraction) - (int(exponent) if exponent else 0))


def _first(keys: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if keys.get(name):
            return keys[name]
    return None


def _build_spectrum(keys: dict[str, str], peaks: list[str], record: int, stem: str) -> Spectrum | str:
    if not peaks:
        return "no peaks"
    parsed = _parse_peaks(peaks)
    if isinstance(parsed, str):
        return parsed
    mz, intensities, precision = parsed
    declared = keys.get("num_peaks", "")
    if declared:
        try:
            n_declared = int(declared)
        except ValueError:
            return "non-numeric Num Peaks"
        if n_declared != mz.shape[0]:
            return "Num Peaks differs from the peaks found"
    precursor_mz = None
    text = _first(keys, _PRECURSOR_KEYS)
    if text:
        try:
            precursor_mz = float(text.split()[0])
        except ValueError:
            return "non-numeric PrecursorMZ"
        if not math.isfinite(precursor_mz):
            return "non-numeric PrecursorMZ"
        if precursor_mz <= 0:
            precursor_mz = None
    try:
        charge = parse_charge(keys.get("charge", ""))
    except ValueError:
        return "non-numeric Charge"
    ms_level = 2
    level = keys.get("spectrum_type") or keys.get("mslevel") or keys.get("ms_level")
    if level:
        digits = level.strip().upper().removeprefix("MS")
        if not digits:
            ms_level = 1  # "MS" alone means a full scan
        else:
            try:
                ms_level = int(digits)
            except ValueError:
                return "non-numeric MS level"
    adduct = _first(keys, _ADDUCT_KEYS)
    ion_mode = normalize_ion_mode(_first(keys, _ION_MODE_KEYS))
    if charge is not None and charge > 0 and ion_mode == "negative" and "+" not in keys.get("charge", ""):
        charge = -charge
    if ion_mode is None:
        ion_mode = ion_mode_from(charge, adduct)
    metadata: dict = {}
    for key, value in keys.items():
        if value and key not in _FIELD_KEYS:
            metadata[MSP_KEY_MAP.get(key, key)] = value
    spectrum_id = _first(keys, _ID_KEYS) or f"{stem}:{record}"
    return Spectrum(id=spectrum_id, mz=mz, intensities=intensities, precursor_mz=precursor_mz, charge=charge,
                    ion_mode=ion_mode, adduct=adduct, ms_level=ms_level, mz_precision=precision,
                    metadata=metadata)
