"""MGF (Mascot generic format) reading, streaming and tolerant of the usual quirks, and writing.

Reading is a hand-written line loop: peak lines (the vast majority) take one branch test each; the numbers
of a batch of records are converted in one pyarrow call and checked with vectorised numpy, so that
MassBank's 35 MB training file reads in about two seconds. ``_parse_peaks`` is the per-record reference
the fast path must agree with (and falls back to for odd records).
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from molpredict.errors import InputError
from molpredict.spectra.record import Spectrum, ion_mode_from
from molpredict.io.common import (NOT_UTF8, STREAM_ERRORS, SkipReport, _Skipper, adduct_from_name, file_stem,
                                  normalize_ion_mode, open_text, parse_charge, parse_ms_level, precursor_mz_problem,
                                  stream_error, written_decimals)

__all__ = ["read_mgf", "write_mgf", "MGF_KEY_MAP"]

#: MGF keys (upper case) -> matchms-style metadata keys; any other key is kept lower-cased.
MGF_KEY_MAP = {
    "NAME": "compound_name",
    "COMPOUND_NAME": "compound_name",
    "SMILES": "smiles",
    "INCHIKEY": "inchikey",
    "INCHI": "inchi",
    "FORMULA": "formula",
    "LICENSE": "license",
    "INSTRUMENT_TYPE": "instrument_type",
    "COLLISION_ENERGY": "collision_energy",
    "FEATURE_ID": "feature_id",
    "SCANS": "scans",
    "SPECTRUMID": "spectrum_id",
}
# Keys that become Spectrum fields rather than metadata.
_FIELD_KEYS = frozenset({"TITLE", "PEPMASS", "PRECURSOR_MZ", "PRECURSORMZ", "CHARGE", "IONMODE", "ADDUCT",
                         "PRECURSOR_TYPE", "PRECURSORTYPE", "MSLEVEL", "MS_LEVEL"})
#: where the precursor m/z comes from: PEPMASS, else matchms's names (a zero means unknown)
_PRECURSOR_KEYS = ("PEPMASS", "PRECURSOR_MZ", "PRECURSORMZ")
#: where the record id comes from, first present wins
_ID_KEYS = ("TITLE", "SPECTRUMID", "SPECTRUM_ID", "FEATURE_ID", "SCANS")
_METADATA_TO_MGF = {"compound_name": "NAME"}
_RESERVED_METADATA = frozenset(k.lower() for k in _FIELD_KEYS) | {"precursor_intensity"}

_PEAK_START = frozenset("0123456789.+-")
# Records converted together: bounds the memory held while streaming, amortises the numpy/arrow calls.
_BATCH_RECORDS = 512
_STRAY = "line(s) between END IONS and the next BEGIN IONS ignored"
# The fractional digits of a number, for the m/z precision a file reports.
_FRACTION = re.compile(r"\.(\d+)")


def read_mgf(path: str | os.PathLike, report: SkipReport | None = None) -> Iterator[Spectrum]:
    """Stream the spectra of an MGF file (optionally gzipped), skipping bad records.

    Parameters
    ----------
    path : str or path-like
        An ``.mgf`` or ``.mgf.gz`` file (gzip is detected from the content, not the name).
    report : SkipReport, optional
        Receives one ``(path, record, reason, spectrum_id)`` entry per skipped record (1-based record numbers,
        counting every ``BEGIN IONS``; ``spectrum_id`` the id the record would have had, by the rule below).
        Without a report, a one-line summary of skipped records is logged per file.

    Yields
    ------
    Spectrum
        With ``id`` from TITLE, else SPECTRUMID (GNPS), else FEATURE_ID, else SCANS, else
        ``"<file stem>:<record number>"`` (ids need not be unique: identification makes them so);
        ``precursor_mz`` from PEPMASS, else PRECURSOR_MZ / PRECURSORMZ (matchms exports) (PEPMASS's optional
        intensity goes to ``metadata["precursor_intensity"]``; ``precursor_mz_precision`` is ``10**-d`` with
        ``d`` its written decimals);
        signed ``charge`` from CHARGE (``1+``, ``+1``, ``1``, ``2-``, ``-1``; an unsigned charge takes the
        sign of a negative IONMODE); ``ion_mode`` from IONMODE, else the charge's sign, else the adduct's;
        ``adduct`` from ADDUCT or PRECURSOR_TYPE, else the compound name's last word when it is an adduct
        (GNPS: ``NAME=Caffeine M+H``, see :func:`~molpredict.io.common.adduct_from_name`); ``ms_level`` from
        MSLEVEL or MS_LEVEL (``2``, ``MS2``, ``MS/MS``; default 2); ``mz_precision`` as
        ``10**-d`` with ``d`` the most decimals among the peaks' m/z; peaks sorted by m/z. Other keys go to
        ``metadata``: NAME -> ``compound_name``, SMILES -> ``smiles`` (see :data:`MGF_KEY_MAP`), any other
        key lower-cased; empty values are dropped. Keys before the first ``BEGIN IONS`` are defaults for
        every record.

    Raises
    ------
    InputError
        When called: the file is missing or binary. While iterating: the file is not MGF (a line before the
        first record is neither ``BEGIN IONS``, ``KEY=VALUE`` nor a comment) or holds no record at all; or
        a gzipped file ends early or is corrupt (``"truncated gzip stream after record N"``: the N whole records
        before it have been yielded). Bad single records are skipped (no peaks, non-numeric or non-finite
        peak, negative m/z or intensity, non-numeric PEPMASS / CHARGE / MSLEVEL, a precursor m/z that is
        empty, negative or above :data:`~molpredict.io.common.MAX_PRECURSOR_MZ`, missing END IONS), never
        raised. ``PEPMASS=0`` means unknown (the next precursor key, else none).

    Notes
    -----
    Lines are read with universal newlines (CRLF is fine), a leading UTF-8 byte-order mark is dropped;
    ``IONMODE=n/a`` and ``CHARGE=0`` mean unknown; ``#`` and ``;`` lines are comments; peak lines
    are ``m/z intensity`` separated by spaces or tabs, further columns (annotations) ignored.
    """
    # Missing or binary files fail here, at the call; the generator opens the file again when iterated, so
    # that a generator never iterated holds no open file.
    open_text(path, "MGF").close()
    return _iter_mgf(str(path), report)


def _iter_mgf(path: str, report: SkipReport | None) -> Iterator[Spectrum]:
    skip = _Skipper(path, report)
    stem = file_stem(path)
    defaults: dict[str, str] = {}
    keys: dict[str, str] = {}
    peaks: list[str] = []
    # (record number, keys, peak lines), or (record number, keys, reason) for a record already known bad: its
    # keys are kept so that the skip names the record's id
    pending: list[tuple[int, dict[str, str], list[str] | str]] = []
    n_records = 0
    in_record = False
    line_no = 0  # counted only outside records, where it is needed for the "not MGF" message
    peak_start = _PEAK_START
    with open_text(path, "MGF") as handle:
        try:
            for line in handle:
                if in_record:
                    if line[:1] in peak_start:
                        peaks.append(line)
                        continue
                    s = line.strip()
                    if not s or s[0] == "#" or s[0] == ";":
                        continue
                    if "=" in s:
                        key, _, value = s.partition("=")
                        keys[key.strip().upper()] = value.strip()
                        if "\ufffd" in value:
                            skip.note(NOT_UTF8)
                        continue
                    upper = s.upper()
                    if upper == "END IONS":
                        in_record = False
                        pending.append((n_records, keys, peaks))
                        if len(pending) >= _BATCH_RECORDS:
                            yield from _finish_batch(pending, stem, skip, path)
                            pending = []
                    elif upper == "BEGIN IONS":
                        pending.append((n_records, keys, "missing END IONS"))
                        n_records += 1
                        keys = dict(defaults)
                        peaks = []
                    else:
                        # Indented or garbled peak lines: the numeric conversion decides.
                        peaks.append(line)
                    continue
                line_no += 1
                s = line.strip()
                if not s or s[0] == "#" or s[0] == ";":
                    continue
                if s.upper() == "BEGIN IONS":
                    in_record = True
                    n_records += 1
                    keys = dict(defaults)
                    peaks = []
                elif n_records:
                    skip.note(_STRAY)  # lines between records belong to no record: said once per file
                elif "=" in s:
                    key, _, value = s.partition("=")
                    defaults[key.strip().upper()] = value.strip()
                else:
                    raise InputError(f"not an MGF file (line {line_no} is neither BEGIN IONS nor KEY=VALUE)",
                                     path=path)
        except STREAM_ERRORS as exc:
            # A truncated download or a damaged .gz: the whole records before the damage are good and are
            # handed over (as a reader streams anyway), the partial one is dropped, and the read fails with
            # one line saying where the file stops, so that nobody mistakes the part for the whole file.
            yield from _finish_batch(pending, stem, skip, path)
            skip.close()
            raise stream_error(path, exc, n_records - 1 if in_record else n_records) from None
        if in_record:
            pending.append((n_records, keys, "missing END IONS"))
        yield from _finish_batch(pending, stem, skip, path)
    if n_records == 0:
        raise InputError("not an MGF file (no BEGIN IONS record)", path=path)
    skip.close()


def _finish_batch(pending: list, stem: str, skip: _Skipper, path: str | None = None) -> Iterator[Spectrum]:
    """Spectra from a batch of collected records, in file order; bad ones go to ``skip``."""
    parsed = _parse_batch([peaks for _, _, peaks in pending if not isinstance(peaks, str)])
    j = 0
    for record, keys, peaks in pending:
        if isinstance(peaks, str):  # known bad while reading (missing END IONS)
            skip(record, peaks, _record_id(keys, record, stem))
            continue
        result = parsed[j]
        j += 1
        if not isinstance(result, str):
            result = _build_spectrum(keys, result, record, stem)
        if isinstance(result, str):
            skip(record, result, _record_id(keys, record, stem))
        else:
            result.file = path
            result.record = record
            yield result


_NUMPY_TYPES = {"double": np.float64, "int32": np.int32, "int64": np.int64, "int8": np.int8}


def _numpy(array: pa.Array) -> np.ndarray:
    """A null-free numeric or boolean Arrow array as numpy, read from its data buffer (``to_numpy`` would make
    pyarrow import pandas). Booleans (bit-packed) go through int8."""
    boolean = pa.types.is_boolean(array.type)
    if boolean:
        array = pc.cast(array, pa.int8())
    if array.null_count:
        raise ValueError("nulls in a numeric array")
    dtype = np.dtype(_NUMPY_TYPES[str(array.type)])
    values = np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
    return values.astype(bool) if boolean else values


def _string_array(tokens: list[str]) -> pa.Array:
    """An Arrow string array of ``tokens``, built from their bytes when they are ASCII (peak lists are). ``pa.array``
    of a Python list would first make pyarrow import pandas, a second at start-up for reading one spectrum."""
    data = "".join(tokens).encode()
    offsets = np.zeros(len(tokens) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens)), out=offsets[1:])
    if len(data) != offsets[-1] or len(data) >= 2**31:  # non-ASCII (characters != bytes) or too long for int32
        return pa.array(tokens, type=pa.string())
    return pa.Array.from_buffers(pa.string(), len(tokens), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _parse_batch(batch: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray, float] | str]:
    """:func:`_parse_peaks` for many records at once: the same results, with one numeric conversion and
    vectorised checks for the whole batch instead of a dozen small numpy calls per record."""
    results: list = [None] * len(batch)
    fast: list[int] = []
    tokens: list[str] = []
    counts: list[int] = []
    for i, lines in enumerate(batch):
        if not lines:
            results[i] = "no peaks"
            continue
        toks = "".join(lines).split()
        if len(toks) != 2 * len(lines):  # extra columns or incomplete lines: the careful path
            results[i] = _parse_peaks(lines)
            continue
        fast.append(i)
        tokens += toks
        counts.append(len(lines))
    if not fast:
        return results
    strings = _string_array(tokens)
    try:
        values = _numpy(pc.cast(strings, pa.float64())).reshape(-1, 2)
    except pa.ArrowInvalid:  # some record has a non-number: let the reference path name it
        for i in fast:
            results[i] = _parse_peaks(batch[i])
        return results
    mz_all = np.ascontiguousarray(values[:, 0])
    intensity_all = np.ascontiguousarray(values[:, 1])
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    starts = offsets[:-1]
    # Per peak: 2 non-finite, 1 negative, 0 fine; a record gets its worst peak's code (as _parse_peaks).
    code = np.where(~np.isfinite(values).all(axis=1), 2, ((mz_all <= 0) | (intensity_all < 0)).astype(np.int64))
    record_code = np.maximum.reduceat(code, starts)
    descending = np.zeros(mz_all.shape[0], dtype=bool)
    descending[1:] = mz_all[1:] < mz_all[:-1]
    descending[starts] = False
    record_unsorted = np.logical_or.reduceat(descending, starts)
    # m/z precision from the m/z tokens (every other token): decimals = length - position of "." - 1.
    length = _numpy(pc.utf8_length(strings))[0::2]
    point = _numpy(pc.find_substring(strings, "."))[0::2]
    decimals = np.where(point >= 0, length - point - 1, 0)
    exponent = _numpy(pc.match_substring(strings, "e", ignore_case=True))[0::2]
    record_decimals = np.maximum.reduceat(decimals, starts)
    record_exponent = np.logical_or.reduceat(exponent, starts)
    for j, i in enumerate(fast):
        if record_code[j]:
            results[i] = "non-finite peak" if record_code[j] == 2 else "negative m/z or intensity"
            continue
        a, b = offsets[j], offsets[j + 1]
        mz = mz_all[a:b]
        intensities = intensity_all[a:b]
        if record_unsorted[j]:
            order = np.argsort(mz, kind="stable")
            mz, intensities = mz[order], intensities[order]
        if record_exponent[j]:
            d = max(written_decimals(t) for t in tokens[2 * a:2 * b:2])
        else:
            d = int(record_decimals[j])
        results[i] = (mz, intensities, 10.0 ** -d)
    return results


def _parse_peaks(peaks: list[str]) -> tuple[np.ndarray, np.ndarray, float] | str:
    """(mz, intensities, mz_precision) from peak lines, or the reason they are unusable (the reference
    implementation; :func:`_parse_batch` is the fast path)."""
    text = "".join(peaks)
    tokens = text.split()
    if len(tokens) != 2 * len(peaks):
        tokens = []
        for line in peaks:
            parts = line.split(None, 2)
            if len(parts) < 2:
                return "incomplete peak line"
            tokens += parts[:2]
    try:
        values = np.array(tokens, dtype=np.float64).reshape(-1, 2)
    except ValueError:
        return "non-numeric peak"
    mz = values[:, 0]
    intensities = values[:, 1]
    if not np.isfinite(values).all():
        return "non-finite peak"
    if (mz <= 0).any() or (intensities < 0).any():
        return "negative m/z or intensity"
    mz_text = " ".join(tokens[0::2])
    if "e" in mz_text or "E" in mz_text:
        decimals = max(written_decimals(t) for t in tokens[0::2])
    else:
        decimals = max(map(len, _FRACTION.findall(mz_text)), default=0)
    if mz.shape[0] > 1 and (mz[1:] < mz[:-1]).any():
        order = np.argsort(mz, kind="stable")
        mz = mz[order]
        intensities = intensities[order]
    else:
        mz = mz.copy()
        intensities = intensities.copy()
    return mz, intensities, 10.0 ** -decimals


def _build_spectrum(keys: dict[str, str], peaks: tuple[np.ndarray, np.ndarray, float], record: int,
                    stem: str) -> Spectrum | str:
    """A Spectrum from one record's keys and parsed peaks, or the reason the record is skipped."""
    mz, intensities, precision = peaks
    metadata: dict = {}
    precursor_mz = precursor_precision = None
    for key in _PRECURSOR_KEYS:  # the first given and non-zero one
        text = keys.get(key)
        if text is None:
            continue
        parts = text.split()
        if not parts:
            # A written but empty precursor is a broken export, not "unknown" (that is PEPMASS=0 or no key).
            return f"{key} is empty"
        try:
            value = float(parts[0])
            if len(parts) > 1 and key == "PEPMASS":
                metadata["precursor_intensity"] = float(parts[1])
        except ValueError:
            return f"non-numeric {key}"
        if value == 0:
            continue  # some exporters write PEPMASS=0 for "unknown": a later key may give it
        problem = precursor_mz_problem(value, key, parts[0])
        if problem:
            return problem
        precursor_mz = value
        precursor_precision = 10.0 ** -written_decimals(parts[0])
        break
    try:
        charge = parse_charge(keys.get("CHARGE", ""))
    except ValueError:
        return "non-numeric CHARGE"
    ms_level = 2
    level = keys.get("MSLEVEL") or keys.get("MS_LEVEL")
    if level:
        ms_level = parse_ms_level(level)  # type: ignore[assignment]
        if ms_level is None:
            return "non-numeric MSLEVEL"
    ion_mode = normalize_ion_mode(keys.get("IONMODE"))
    adduct = keys.get("ADDUCT") or keys.get("PRECURSOR_TYPE") or keys.get("PRECURSORTYPE") or None
    if adduct is None:
        # GNPS libraries give the adduct only as the name's last word ("NAME=Caffeine M+H").
        adduct = adduct_from_name(keys.get("NAME") or keys.get("COMPOUND_NAME"), ion_mode)
    if charge is not None and charge > 0 and ion_mode == "negative" and not _explicit_sign(keys["CHARGE"]):
        charge = -charge
    if ion_mode is None:
        ion_mode = ion_mode_from(charge, adduct)
    key_map = MGF_KEY_MAP
    for key, value in keys.items():
        if value and key not in _FIELD_KEYS:
            metadata[key_map.get(key) or key.lower()] = value
    spectrum_id = _record_id(keys, record, stem)
    return Spectrum(id=spectrum_id, mz=mz, intensities=intensities, precursor_mz=precursor_mz,
                    charge=charge, ion_mode=ion_mode, adduct=adduct, ms_level=ms_level,
                    mz_precision=precision, metadata=metadata, precursor_mz_precision=precursor_precision)


def _record_id(keys: dict[str, str], record: int, stem: str) -> str:
    """The id of a record's spectrum: the first of :data:`_ID_KEYS` given, else ``"<file stem>:<record>"``. One
    rule for the spectra read and the records skipped, so that a skipped record can be joined with the results."""
    return next((keys[k] for k in _ID_KEYS if keys.get(k)), None) or f"{stem}:{record}"


def _explicit_sign(text: str) -> bool:
    return "+" in text or "-" in text


# -- writing -------------------------------------------------------------------------------------------------

def write_mgf(spectra: Iterable[Spectrum], path_or_file: str | os.PathLike | IO[str]) -> int:
    """Write spectra as MGF so that :func:`read_mgf` gives them back.

    Parameters
    ----------
    spectra : iterable of Spectrum
        Streamed: written one at a time.
    path_or_file : str, path-like or text file object
        A path (``.gz`` suffix -> gzip-compressed; written to a temporary file renamed when complete) or an
        open text stream.

    Returns
    -------
    int
        The number of spectra written.

    Notes
    -----
    Every field is written: TITLE (``id``), PEPMASS (with ``metadata["precursor_intensity"]`` when present),
    CHARGE (``1+``/``1-``), IONMODE, ADDUCT, MSLEVEL, then metadata (``compound_name`` as NAME, other keys
    upper-cased; values on one line). Numbers are written in Python's shortest round-trip form, so
    ``read_mgf(write_mgf(x))`` restores m/z and intensities bit for bit; m/z values are padded with zeros to
    the spectrum's ``mz_precision`` (PEPMASS to ``precursor_mz_precision``) so that it survives too. Metadata values come back as strings (except
    ``precursor_intensity``), and an absent ion mode comes back inferred from the charge or adduct.
    """
    if isinstance(path_or_file, (str, os.PathLike)):
        from molpredict.atomic import atomic_text

        with atomic_text(path_or_file, newline="\n") as handle:  # a failed write leaves no half file
            return _write_mgf(spectra, handle)
    return _write_mgf(spectra, path_or_file)


def _one_line(value: object) -> str:
    return " ".join(str(value).splitlines()).strip()


def _format_mz(value: float, decimals: int | None) -> str:
    text = repr(value)
    if "e" in text or "n" in text:  # exponent notation (or inf/nan, which no reader accepts anyway)
        text = np.format_float_positional(value, trim="-")
    if decimals is None:
        return text
    point = text.find(".")
    have = 0 if point < 0 else len(text) - point - 1
    if decimals == 0 and text.endswith(".0"):
        return text[:-2]
    if have < decimals:
        text = (text if point >= 0 else text + ".") + "0" * (decimals - have)
    return text


def _decimals_of(precision: float | None) -> int | None:
    return None if not precision else max(0, round(-math.log10(precision)))


def _write_mgf(spectra: Iterable[Spectrum], handle: IO[str]) -> int:
    n = 0
    for spectrum in spectra:
        lines = ["BEGIN IONS", f"TITLE={_one_line(spectrum.id)}"]
        if spectrum.precursor_mz is not None:
            pepmass = _format_mz(float(spectrum.precursor_mz), _decimals_of(spectrum.precursor_mz_precision))
            if spectrum.metadata.get("precursor_intensity") is not None:
                pepmass += f" {float(spectrum.metadata['precursor_intensity'])!r}"
            lines.append(f"PEPMASS={pepmass}")
        if spectrum.charge:
            lines.append(f"CHARGE={abs(spectrum.charge)}{'-' if spectrum.charge < 0 else '+'}")
        if spectrum.ion_mode:
            lines.append(f"IONMODE={spectrum.ion_mode}")
        if spectrum.adduct:
            lines.append(f"ADDUCT={_one_line(spectrum.adduct)}")
        lines.append(f"MSLEVEL={int(spectrum.ms_level)}")
        for key, value in spectrum.metadata.items():
            if key in _RESERVED_METADATA or value is None:
                continue
            text = _one_line(value)
            if text:
                mgf_key = _METADATA_TO_MGF.get(key) or key.upper()
                lines.append(f"{mgf_key}={text}")
        decimals = _decimals_of(spectrum.mz_precision)
        for m, i in zip(spectrum.mz.tolist(), spectrum.intensities.tolist()):
            lines.append(f"{_format_mz(m, decimals)} {i!r}")
        lines.append("END IONS\n")
        handle.write("\n".join(lines))
        handle.write("\n")
        n += 1
    return n
