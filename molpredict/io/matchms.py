"""matchms interoperability: ``matchms.Spectrum`` <-> molpredict :class:`~molpredict.spectra.record.Spectrum`, and
identifications written into matchms metadata (so matchms's own exporters save them).

matchms is an optional dependency (``pip install molpredict[matchms]``); it is imported only when a conversion to
matchms is asked for. Metadata are read with matchms's own key conventions (``precursor_mz``, ``charge``,
``ionmode``, ``adduct``, ``compound_name``, ``smiles``, ``inchikey``, ``formula``, ``ms_level``, ``title``,
``spectrum_id``, ``feature_id``, ``scans``), which are also the keys of molpredict's ``Spectrum.metadata``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from molpredict.errors import InputError, ResourceError
from molpredict.io.common import adduct_from_name, normalize_ion_mode, parse_charge, written_decimals
from molpredict.spectra.record import Spectrum, ion_mode_from

__all__ = ["from_matchms", "to_matchms", "is_matchms_spectrum", "matchms_id", "with_identifications",
           "IDENTIFICATION_KEYS"]

#: matchms metadata keys that become Spectrum fields rather than metadata
_FIELD_KEYS = frozenset({"precursor_mz", "pepmass", "charge", "ionmode", "adduct", "ms_level", "title"})
#: where the record id comes from, first present wins (the MGF reader's order, in matchms's names)
_ID_KEYS = ("title", "spectrum_id", "spectrumid", "feature_id", "scans")
#: the metadata keys :func:`with_identifications` writes (prefixed)
IDENTIFICATION_KEYS = ("smiles", "inchikey", "name", "score", "probability", "confidence", "n_candidates")


def _matchms():
    try:
        import matchms
    except ImportError:
        raise ResourceError("matchms is not installed: pip install 'molpredict[matchms]'") from None
    return matchms


def is_matchms_spectrum(obj: Any) -> bool:
    """Whether ``obj`` is a ``matchms.Spectrum`` (checked without importing matchms)."""
    return type(obj).__module__.startswith("matchms") and hasattr(obj, "peaks") and hasattr(obj, "metadata")


def _decimals(value: Any) -> int:
    """Decimal places of ``value`` as a text file would show it (``224.1`` -> 1): a string as written (the file
    readers' count), a number in the shortest form of its own type. A numpy ``float32`` counts in float32: widened
    to float64 first, ``224.1`` becomes ``224.10000610351562`` and a unit-resolution precursor would get a
    precision of 1e-13, never the 0.5 m/z window its two written decimals allow."""
    if isinstance(value, str):
        text = value.strip()
    else:  # numpy's shortest round-trip form in the value's own precision, without trailing zeros (a float's ".0")
        text = (str(value) if isinstance(value, np.floating) else repr(float(value))).lower()
        mantissa, e, exponent = text.partition("e")
        text = (mantissa.rstrip("0") if "." in mantissa else mantissa) + e + exponent
    try:
        return written_decimals(text)
    except ValueError:
        return 0


def matchms_id(spectrum: Any, index: int | None = None) -> str:
    """The id :func:`from_matchms` gives ``spectrum`` (its title, spectrum id, feature id or scans, else
    ``matchms:<index>``), also for a spectrum it refuses, so that a skipped one is named as its rows would be."""
    metadata = spectrum.metadata
    found = next((str(metadata[k]) for k in _ID_KEYS if metadata.get(k) not in (None, "")), None)
    return found if found is not None else f"matchms:{index if index is not None else 1}"


def _one(value: Any) -> Any:
    """The element of a one-element list or tuple (matchms filters write ``charge=[1]``), else ``value``."""
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) == 1:
        return value[0]
    return value


def from_matchms(spectrum: Any, index: int | None = None) -> Spectrum:
    """A molpredict :class:`Spectrum` from a ``matchms.Spectrum``.

    Parameters
    ----------
    spectrum : matchms.Spectrum
    index : int, optional
        Its 1-based position in the caller's list: the ``record`` of the result (rows of
        :func:`molpredict.identify` say which input they answer) and the id ``matchms:<index>`` when the metadata
        have none.

    Returns
    -------
    Spectrum
        Peaks sorted by m/z; ``mz_precision`` and ``precursor_mz_precision`` from the values' shortest decimal
        form (what a text file would have shown), so mass windows match those of the same spectra read from MGF.

    Raises
    ------
    InputError
        Peaks that are not finite, or a negative m/z or intensity, or a non-numeric precursor m/z, charge or MS
        level (naming the record and field). :func:`molpredict.identify` and the other API calls skip such a
        spectrum into their skip report, as the file readers skip an unreadable record, and go on.
    """
    metadata = dict(spectrum.metadata)
    written_mz = np.asarray(spectrum.peaks.mz)
    mz = written_mz.astype(np.float64)
    intensities = np.asarray(spectrum.peaks.intensities, dtype=np.float64)
    if mz.size and (not np.isfinite(mz).all() or not np.isfinite(intensities).all()):
        raise InputError("non-finite peak", path="matchms spectra", record=index, field="peaks")
    if mz.size and ((mz <= 0).any() or (intensities < 0).any()):
        raise InputError("negative m/z or intensity", path="matchms spectra", record=index, field="peaks")
    order = np.argsort(mz, kind="stable")
    mz, intensities = mz[order], intensities[order]
    written = metadata.get("precursor_mz", metadata.get("pepmass"))
    if isinstance(written, (tuple, list)):
        written = written[0] if written else None
    try:
        precursor = float(written) if written is not None and not (isinstance(written, str) and
                                                                   not written.strip()) else None
    except (TypeError, ValueError):
        raise InputError(f"non-numeric precursor m/z {written!r}", path="matchms spectra", record=index, field="precursor_mz") from None
    if precursor is not None and (not math.isfinite(precursor) or precursor <= 0):
        precursor = None
    charge_value = _one(metadata.get("charge"))
    try:
        charge = int(charge_value) if isinstance(charge_value, (int, np.integer, float, np.floating)) else \
            parse_charge(str(charge_value or ""))
    except ValueError:
        raise InputError(f"non-numeric charge {charge_value!r}", path="matchms spectra", record=index, field="charge") from None
    if charge == 0:
        charge = None
    ion_mode = normalize_ion_mode(metadata.get("ionmode"))
    adduct = metadata.get("adduct") or None
    if adduct is None:
        adduct = adduct_from_name(metadata.get("compound_name"), ion_mode)
    if charge is not None and charge > 0 and ion_mode == "negative":
        charge = -charge
    if ion_mode is None:
        ion_mode = ion_mode_from(charge, adduct)
    ms_level = metadata.get("ms_level")
    try:
        ms_level = int(str(ms_level).lower().removeprefix("ms")) if ms_level not in (None, "") else 2
    except ValueError:
        raise InputError(f"non-numeric MS level {ms_level!r}", path="matchms spectra", record=index, field="ms_level") from None
    spectrum_id = matchms_id(spectrum, index)
    kept = {k: v for k, v in metadata.items() if k not in _FIELD_KEYS and v not in (None, "")}
    return Spectrum(id=spectrum_id, mz=mz, intensities=intensities, precursor_mz=precursor, charge=charge,
                    ion_mode=ion_mode, adduct=adduct, ms_level=ms_level,
                    mz_precision=10.0 ** -max((_decimals(v) for v in written_mz), default=0) if mz.size else None,
                    metadata=kept,
                    precursor_mz_precision=10.0 ** -_decimals(written) if precursor is not None else None,
                    record=index)


def to_matchms(spectrum: Spectrum) -> Any:
    """A ``matchms.Spectrum`` with the same peaks and metadata (matchms's keys; the id as ``title``)."""
    matchms = _matchms()
    order = np.argsort(np.asarray(spectrum.mz), kind="stable")  # matchms requires sorted peaks
    metadata = dict(spectrum.metadata)
    metadata["title"] = spectrum.id
    if spectrum.precursor_mz is not None:
        metadata["precursor_mz"] = float(spectrum.precursor_mz)
    if spectrum.charge is not None:
        metadata["charge"] = int(spectrum.charge)
    if spectrum.ion_mode is not None:
        metadata["ionmode"] = spectrum.ion_mode
    if spectrum.adduct is not None:
        metadata["adduct"] = spectrum.adduct
    metadata["ms_level"] = int(spectrum.ms_level)
    return matchms.Spectrum(mz=np.asarray(spectrum.mz, dtype=np.float64)[order],
                            intensities=np.asarray(spectrum.intensities, dtype=np.float64)[order],
                            metadata=metadata, metadata_harmonization=False)


def with_identifications(spectra: Sequence[Any], results: Any, prefix: str = "molpredict_") -> list[Any]:
    """Copies of matchms spectra with their rank-1 identification in the metadata.

    Parameters
    ----------
    spectra : sequence of matchms.Spectrum
        The spectra as given to :func:`molpredict.identify` (same order).
    results : pandas.DataFrame
        What :func:`molpredict.identify` returned for them (its ``record`` column is the 1-based position of
        each row's spectrum in ``spectra``).
    prefix : str
        Prefix of the metadata keys written (:data:`IDENTIFICATION_KEYS`).

    Returns
    -------
    list of matchms.Spectrum
        A spectrum without an identification (skipped, see ``results.attrs["skipped"]``) is copied unchanged.
    """
    top = results[results["rank"] == 1] if len(results) else results
    by_record = {int(r["record"]): r for r in top.to_dict("records") if r.get("record") not in (None, "")}
    out = []
    for index, spectrum in enumerate(spectra, start=1):
        copy = spectrum.clone()
        row = by_record.get(index)
        if row is not None:
            for key in IDENTIFICATION_KEYS:
                value = row.get(key)
                if value is not None and not (isinstance(value, float) and math.isnan(value)) and value != "":
                    copy.set(prefix + key, value)
        out.append(copy)
    return out


def iter_from_matchms(spectra: Iterable[Any], report: Any = None) -> Iterable[Spectrum]:
    """:func:`from_matchms` over a sequence, each spectrum's record its 1-based position; with a
    :class:`~molpredict.io.common.SkipReport`, a spectrum it refuses is added there (file ``""``, its position, the
    reason, its id) and skipped rather than raised."""
    for index, spectrum in enumerate(spectra, start=1):
        converted = convert_or_skip(spectrum, index, report)
        if converted is not None:
            yield converted


def convert_or_skip(spectrum: Any, index: int, report: Any = None) -> Spectrum | None:
    """:func:`from_matchms`, or None with a skip entry in ``report`` when the spectrum is unusable (without a
    report the :class:`InputError` is raised). The entry's file is ``""``, as the rows of in-memory spectra have
    it, and its record the spectrum's position: the same keys as the rows of the spectra that were read."""
    try:
        return from_matchms(spectrum, index)
    except InputError as exc:
        if report is None:
            raise
        report.add("", index, exc.message, matchms_id(spectrum, index))
        return None
