"""NIST / MassBank MSP reading (streaming, tolerant of the usual quirks)."""
from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np

from molpredict.errors import InputError
from molpredict.spectra.record import Spectrum, ion_mode_from
from molpredict.io.common import (NOT_UTF8, STREAM_ERRORS, SkipReport, _Skipper, adduct_from_name, file_stem,
                                  normalize_ion_mode, open_text, parse_charge, parse_ms_level, precursor_mz_problem,
                                  stream_error, written_decimals)

__all__ = ["read_msp", "MSP_KEY_MAP"]

#: MSP keys (lower case, spaces as underscores) -> matchms-style metadata keys; others are kept as they are.
MSP_KEY_MAP = {
    "name": "compound_name",
    "inchi_key": "inchikey",
    "instrument": "instrument",
    "collision_energy": "collision_energy",
}
_PRECURSOR_KEYS = ("precursormz", "precursor_mz", "pepmass", "precursor_m/z", "selected_ion_m/z")
#: how skip reasons name the precursor keys (the usual spelling, as the reader lower-cases keys)
_PRECURSOR_LABELS = {"precursormz": "PrecursorMZ", "precursor_mz": "Precursor_MZ", "pepmass": "PEPMASS",
                     "precursor_m/z": "Precursor m/z", "selected_ion_m/z": "Selected ion m/z"}
_ADDUCT_KEYS = ("precursor_type", "precursortype", "adduct")
_ION_MODE_KEYS = ("ion_mode", "ionmode", "polarity")
_ID_KEYS = ("title", "db#", "accession", "spectrumid", "spectrum_id", "id", "feature_id", "scans")
_FIELD_KEYS = frozenset(_PRECURSOR_KEYS + _ADDUCT_KEYS + _ION_MODE_KEYS + ("charge", "spectrum_type", "mslevel",
                                                                          "ms_level", "num_peaks"))
_NUM_PEAKS_KEYS = frozenset({"num_peaks", "numpeaks", "num peaks"})
_QUOTED = re.compile(r'"[^"]*"')
_PEAK_START = frozenset("0123456789.+-")
_STRAY = "line(s) outside any record ignored (peaks after a blank line, without a Name: header)"


def read_msp(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the spectra of an MSP file (NIST / MassBank style; optionally gzipped), skipping bad records.

    Parameters
    ----------
    path : str or path-like
    report : SkipReport, optional
        Receives one ``(path, record, reason, spectrum_id)`` entry per skipped record (1-based record numbers;
        ``spectrum_id`` the id the record would have had, by the rule below).

    Yields
    ------
    Spectrum
        ``id`` from DB# (or TITLE, ACCESSION, ID, FEATURE_ID, SCANS), else ``"<file stem>:<record>"``;
        ``precursor_mz`` from PrecursorMZ; ``adduct`` from Precursor_type; ``ion_mode`` from Ion_mode
        (``P``/``N``/``Positive``...), else the charge's or adduct's sign; ``charge`` from Charge;
        ``ms_level`` from MSLevel, else Spectrum_type (``MS2``, ``MS/MS``; default 2); a textual spectrum type
        (``in-source``, ``GC-MS``) gives level 1 and is kept as ``metadata["spectrum_type"]``; ``adduct`` from
        Precursor_type, else the name's last word when it is an adduct (``Name: Caffeine M+H``). Other keys go
        to ``metadata`` lower-cased with spaces as underscores (Name -> ``compound_name``).

    Raises
    ------
    InputError
        The file is missing, binary, not MSP (its first line is not ``Key: value``) or holds no record; or a
        gzipped file ends early or is corrupt (``"truncated gzip stream after record N"``: the records before
        it have been yielded). Bad single records are skipped, never raised: among them a precursor m/z that
        is empty, non-numeric, negative or above :data:`~molpredict.io.common.MAX_PRECURSOR_MZ`
        (``PrecursorMZ: 0`` means unknown).

    Notes
    -----
    A record is header lines ``Key: value``, a ``Num Peaks: n`` line, then peaks: ``m/z intensity`` pairs
    separated by spaces or tabs, possibly several per line as ``m/z intensity;`` groups (NIST) or
    ``m/z:intensity`` pairs (Golm, MoNA) or plain ``m/z intensity m/z intensity`` runs (recognised by the
    ``Num Peaks`` count), possibly followed by a quoted annotation; ``#`` lines inside the peak list are
    comments. Records end at a blank line or at the next header line. A record whose peak count differs
    from ``Num Peaks`` is skipped. A leading UTF-8 byte-order mark is dropped.
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
            skip(n_records, result, _record_id(keys, n_records, stem))
            return None
        result.file = path
        result.record = n_records
        return result

    with open_text(path, "MSP") as handle:
        try:
            for line in handle:
                line_no += 1
                s = line.strip()
                if state == "peaks":
                    if s and (s[0] in _PEAK_START or s[0] == '"'):
                        peaks.append(s)
                        continue
                    if s[:1] == "#":  # a comment inside the peak list
                        continue
                    spectrum = finish()
                    if spectrum is not None:
                        yield spectrum
                    state = "between"
                if not s:
                    if state == "header":
                        skip(n_records, "no peaks", _record_id(keys, n_records, stem))
                        state = "between"
                    continue
                if s[0] == "#":
                    continue
                key, sep, value = s.partition(":")
                if sep and s[0] in _PEAK_START and _is_number(key):
                    sep = ""  # an "m/z:intensity" peak line, not a header
                if not sep:
                    if n_records == 0:
                        raise InputError(f"not an MSP file (line {line_no} is not 'Key: value')", path=path)
                    if state == "header":
                        # Peaks without a "Num Peaks" line: take them, the count check is skipped.
                        keys.setdefault("num_peaks", "")
                        peaks.append(s)
                        state = "peaks"
                    else:
                        skip.note(_STRAY)  # e.g. peaks after a blank line: belong to no record
                    continue
                key = key.strip().lower().replace(" ", "_")
                if state == "between" or (key == "name" and "name" in keys):
                    if state == "header":
                        skip(n_records, "no peaks", _record_id(keys, n_records, stem))
                    n_records += 1
                    keys = {}
                    peaks = []
                    state = "header"
                if key in _NUM_PEAKS_KEYS:
                    keys["num_peaks"] = value.strip()
                    state = "peaks"
                else:
                    keys[key] = value.strip()
                    if "\ufffd" in value:
                        skip.note(NOT_UTF8)
        except STREAM_ERRORS as exc:
            # A truncated download or a damaged .gz: the records before the damage have been yielded, the one
            # being read is dropped (its peaks may be cut), and the read fails with one line saying where the
            # file stops, so that nobody mistakes the part for the whole file.
            skip.close()
            raise stream_error(path, exc, n_records - 1 if state != "between" else n_records) from None
        if state == "peaks":
            spectrum = finish()
            if spectrum is not None:
                yield spectrum
        elif state == "header":
            skip(n_records, "no peaks", _record_id(keys, n_records, stem))
    if n_records == 0:
        raise InputError("not an MSP file (no record)", path=path)
    skip.close()


def _peak_tokens(peaks: list[str]) -> list[str] | str:
    """The m/z, intensity tokens of peak lines, alternating, or the reason they are unusable.

    A line holds one ``m/z intensity`` pair (further columns are annotations), or several: ``;``-separated
    groups ``m/z intensity;`` (NIST), or ``m/z:intensity`` pairs (Golm, MoNA); quoted annotations are dropped.
    """
    tokens: list[str] = []
    for line in peaks:
        line = _QUOTED.sub(" ", line)
        if ":" in line:
            for pair in line.replace(";", " ").replace(",", " ").split():
                mz, sep, intensity = pair.partition(":")
                if not sep or not mz or not intensity:
                    return "incomplete peak"
                tokens += (mz, intensity)
            continue
        for chunk in line.split(";"):
            parts = chunk.split()
            if not parts:
                continue
            if len(parts) < 2:
                return "incomplete peak"
            tokens += parts[:2]
    return tokens or "no peaks"


def _all_pairs(peaks: list[str]) -> list[str]:
    """Every whitespace-separated number of the peak lines, read as consecutive ``m/z intensity`` pairs."""
    return " ".join(_QUOTED.sub(" ", line).replace(";", " ") for line in peaks).split()


def _parse_peaks(peaks: list[str], n_declared: int | None = None) -> tuple[np.ndarray, np.ndarray, float] | str:
    """(mz, intensities, mz_precision) from peak lines, or the reason they are unusable. When one pair per line
    does not give the declared count, lines of several space-separated pairs (``85 100 86 50``) are tried."""
    tokens = _peak_tokens(peaks)
    if n_declared is not None and (isinstance(tokens, str) or len(tokens) != 2 * n_declared):
        flat = _all_pairs(peaks)
        if len(flat) == 2 * n_declared:
            tokens = flat
    if isinstance(tokens, str):
        return tokens
    try:
        values = np.array(tokens, dtype=np.float64).reshape(-1, 2)
    except ValueError:
        return "non-numeric peak"
    if not np.isfinite(values).all():
        return "non-finite peak"
    mz, intensities = values[:, 0].copy(), values[:, 1].copy()
    if (mz <= 0).any() or (intensities < 0).any():
        return "negative m/z or intensity"
    decimals = max(written_decimals(t) for t in tokens[0::2])
    if mz.shape[0] > 1 and (mz[1:] < mz[:-1]).any():
        order = np.argsort(mz, kind="stable")
        mz, intensities = mz[order], intensities[order]
    return mz, intensities, 10.0 ** -decimals


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first(keys: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if keys.get(name):
            return keys[name]
    return None


def _record_id(keys: dict[str, str], record: int, stem: str) -> str:
    """The id of a record's spectrum: the first of :data:`_ID_KEYS` given, else ``"<file stem>:<record>"``. One
    rule for the spectra read and the records skipped, so that a skipped record can be joined with the results."""
    return _first(keys, _ID_KEYS) or f"{stem}:{record}"


def _build_spectrum(keys: dict[str, str], peaks: list[str], record: int, stem: str) -> Spectrum | str:
    if not peaks:
        return "no peaks"
    declared = keys.get("num_peaks", "")
    n_declared = None
    if declared:
        try:
            n_declared = int(declared)
        except ValueError:
            return "non-numeric Num Peaks"
    parsed = _parse_peaks(peaks, n_declared)
    if isinstance(parsed, str):
        return parsed
    mz, intensities, precision = parsed
    if n_declared is not None and n_declared != mz.shape[0]:
        return "Num Peaks differs from the peaks found"
    precursor_mz = precursor_precision = None
    key = next((name for name in _PRECURSOR_KEYS if name in keys), None)
    if key is not None:
        field = _PRECURSOR_LABELS[key]
        words = keys[key].split()
        if not words:
            # A written but empty precursor is a broken export, not "unknown" (that is 0 or no line).
            return f"{field} is empty"
        try:
            value = float(words[0])
        except ValueError:
            return f"non-numeric {field}"
        if value != 0:  # 0 means unknown, as in MGF
            problem = precursor_mz_problem(value, field, words[0])
            if problem:
                return problem
            precursor_mz = value
            precursor_precision = 10.0 ** -written_decimals(words[0])
    try:
        charge = parse_charge(keys.get("charge", ""))
    except ValueError:
        return "non-numeric Charge"
    metadata: dict = {}
    ms_level = 2
    level = keys.get("mslevel") or keys.get("ms_level")
    if level:
        ms_level = parse_ms_level(level)  # type: ignore[assignment]
        if ms_level is None:
            return "non-numeric MS level"
    spectrum_type = keys.get("spectrum_type")
    if spectrum_type:
        typed = parse_ms_level(spectrum_type)
        if typed is not None:
            if not level:
                ms_level = typed
        else:
            # GC-MS (EI) and in-source spectra: no isolated precursor, so MS1; the type is kept so that
            # identification can name it when it skips the spectrum.
            metadata["spectrum_type"] = spectrum_type
            if not level:
                ms_level = 1
    ion_mode = normalize_ion_mode(_first(keys, _ION_MODE_KEYS))
    adduct = _first(keys, _ADDUCT_KEYS) or adduct_from_name(keys.get("name"), ion_mode)
    if charge is not None and charge > 0 and ion_mode == "negative" and "+" not in keys.get("charge", ""):
        charge = -charge
    if ion_mode is None:
        ion_mode = ion_mode_from(charge, adduct)
    for key, value in keys.items():
        if value and key not in _FIELD_KEYS:
            metadata[MSP_KEY_MAP.get(key, key)] = value
    spectrum_id = _record_id(keys, record, stem)
    return Spectrum(id=spectrum_id, mz=mz, intensities=intensities, precursor_mz=precursor_mz, charge=charge,
                    ion_mode=ion_mode, adduct=adduct, ms_level=ms_level, mz_precision=precision,
                    metadata=metadata, precursor_mz_precision=precursor_precision if precursor_mz else None)
