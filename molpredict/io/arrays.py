"""Spectra as flat numeric arrays plus a JSON companion, for model bundles (safetensors / npz; no pickle)."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from molpredict.errors import ModelFileError
from molpredict.spectra.record import Spectrum

__all__ = ["spectra_to_arrays", "spectra_from_arrays", "ARRAYS_FORMAT_VERSION"]

ARRAYS_FORMAT_VERSION = 1
#: the format tag of the JSON companion (a file format name, not a module path: bundles written before the
#: layout move carry it)
SPECTRA_FORMAT = "molpredict.spectra"
#: also read: the tag the layout move wrote for a while
READABLE_SPECTRA_FORMATS = (SPECTRA_FORMAT, "molpredict.spectra.cleaning")
_ION_MODE_CODES = {"positive": 1, "negative": -1, None: 0}
_ION_MODES = {1: "positive", -1: "negative", 0: None}
_ARRAY_KEYS = ("mz", "intensities", "offsets", "precursor_mz", "charge", "ion_mode", "ms_level", "mz_precision")


def spectra_to_arrays(spectra: Iterable[Spectrum], metadata_keys: Sequence[str] | None = ()
                      ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Flatten spectra into numeric arrays and a JSON-serialisable companion.

    Parameters
    ----------
    spectra : iterable of Spectrum
        n spectra with N peaks in all.
    metadata_keys : sequence of str or None, default ()
        Metadata keys to keep (e.g. ``("smiles", "inchikey")``); None keeps all metadata. Values must be
        JSON-serialisable.

    Returns
    -------
    arrays : dict of str to ndarray
        ``mz`` (N,) float64, ``intensities`` (N,) float64 (spectrum i's peaks are
        ``offsets[i]:offsets[i + 1]``), ``offsets`` (n + 1,) int64, ``precursor_mz`` (n,) float64 (NaN for
        None), ``charge`` (n,) int64 (0 for None), ``ion_mode`` (n,) int8 (1 positive, -1 negative,
        0 unknown), ``ms_level`` (n,) int64, ``mz_precision`` (n,) float64 (NaN for None).
    meta : dict
        ``{"format": "molpredict.spectra", "version": 1, "ids": [n str], "adducts": [n str or None],
        "metadata": [n dict]}``; store it as JSON beside the arrays.
    """
    ids: list[str] = []
    adducts: list[str | None] = []
    metadata: list[dict] = []
    mz_parts: list[np.ndarray] = []
    intensity_parts: list[np.ndarray] = []
    counts: list[int] = []
    precursor: list[float] = []
    charge: list[int] = []
    ion_mode: list[int] = []
    ms_level: list[int] = []
    precision: list[float] = []
    for s in spectra:
        ids.append(str(s.id))
        adducts.append(s.adduct)
        if metadata_keys is None:
            metadata.append(dict(s.metadata))
        else:
            metadata.append({k: s.metadata[k] for k in metadata_keys if k in s.metadata})
        mz_parts.append(s.mz)
        intensity_parts.append(s.intensities)
        counts.append(s.n_peaks)
        precursor.append(math.nan if s.precursor_mz is None else float(s.precursor_mz))
        charge.append(int(s.charge or 0))
        if s.ion_mode not in _ION_MODE_CODES:
            raise ValueError(f"spectrum {s.id}: unknown ion mode {s.ion_mode!r}")
        ion_mode.append(_ION_MODE_CODES[s.ion_mode])
        ms_level.append(int(s.ms_level))
        precision.append(math.nan if s.mz_precision is None else float(s.mz_precision))
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    arrays = {
        "mz": np.concatenate(mz_parts) if mz_parts else np.zeros(0),
        "intensities": np.concatenate(intensity_parts) if intensity_parts else np.zeros(0),
        "offsets": offsets,
        "precursor_mz": np.asarray(precursor, dtype=np.float64),
        "charge": np.asarray(charge, dtype=np.int64),
        "ion_mode": np.asarray(ion_mode, dtype=np.int8),
        "ms_level": np.asarray(ms_level, dtype=np.int64),
        "mz_precision": np.asarray(precision, dtype=np.float64),
    }
    meta = {"format": SPECTRA_FORMAT, "version": ARRAYS_FORMAT_VERSION, "ids": ids, "adducts": adducts,
            "metadata": metadata}
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"spectra metadata is not JSON-serialisable: {exc}") from None
    return arrays, meta


def spectra_from_arrays(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> list[Spectrum]:
    """Rebuild the spectra written by :func:`spectra_to_arrays`.

    Parameters
    ----------
    arrays : dict of str to ndarray
    meta : dict
        The JSON companion.

    Returns
    -------
    list of Spectrum
        Peak arrays are copies (the spectra do not keep the flat arrays alive).

    Raises
    ------
    ModelFileError
        An array or companion field is missing or inconsistent (a truncated or foreign bundle).
    """
    missing = [k for k in _ARRAY_KEYS if k not in arrays]
    if missing:
        raise ModelFileError(f"spectra arrays lack {', '.join(missing)}")
    if meta.get("format") not in READABLE_SPECTRA_FORMATS or meta.get("version") != ARRAYS_FORMAT_VERSION:
        raise ModelFileError(f"unsupported spectra format {meta.get('format')!r} version {meta.get('version')!r}")
    offsets = np.asarray(arrays["offsets"], dtype=np.int64)
    n = offsets.shape[0] - 1
    mz = np.asarray(arrays["mz"], dtype=np.float64)
    intensities = np.asarray(arrays["intensities"], dtype=np.float64)
    per_spectrum = [np.asarray(arrays[k]) for k in _ARRAY_KEYS[3:]]
    ids, adducts = meta.get("ids", []), meta.get("adducts", [])
    metadata = meta.get("metadata") or [{} for _ in range(n)]
    if (n < 0 or offsets[0] != 0 or offsets[-1] != mz.shape[0] or intensities.shape != mz.shape
            or np.any(np.diff(offsets) < 0) or any(a.shape != (n,) for a in per_spectrum)
            or len(ids) != n or len(adducts) != n or len(metadata) != n):
        raise ModelFileError("spectra arrays are inconsistent (offsets, lengths or ids do not match)")
    precursor, charge, ion_mode, ms_level, precision = per_spectrum
    out = []
    for i in range(n):
        a, b = offsets[i], offsets[i + 1]
        out.append(Spectrum(
            id=ids[i], mz=mz[a:b].copy(), intensities=intensities[a:b].copy(),
            precursor_mz=None if np.isnan(precursor[i]) else float(precursor[i]),
            charge=int(charge[i]) or None, ion_mode=_ION_MODES[int(ion_mode[i])], adduct=adducts[i],
            ms_level=int(ms_level[i]), mz_precision=None if np.isnan(precision[i]) else float(precision[i]),
            metadata=dict(metadata[i])))
    return out
