"""Train, predict and evaluate property models on spectra files: what ``molpredict properties`` and
:func:`molpredict.api.predict_properties` call.

Spectra are split by ion mode (one predictor per mode); a record that cannot be used (unreadable, no SMILES
where targets are needed, a SMILES RDKit cannot parse, an ion mode the model lacks) is skipped and reported
(:class:`Skipped`: file, record, reason), never silently dropped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from molpredict.errors import InputError
from molpredict.io.results import json_safe
from molpredict.properties.metrics import property_metrics
from molpredict.properties.model import MODES, PropertyBundle, PropertyPredictor
from molpredict.properties.targets import PROPERTY_NAMES, compute_properties

__all__ = ["Skipped", "DEFAULT_LEVELS", "DEFAULT_REGRESSOR", "load_spectra", "label_spectra", "train_properties",
           "predict_table", "evaluate_properties", "column_names", "output_columns", "property_columns",
           "COLUMN_PREFIX", "structure_key",
           "CALIBRATION_FRACTION"]

#: the quantile levels of ``properties train`` (median and an 80% interval)
DEFAULT_LEVELS = (0.1, 0.5, 0.9)
#: the regressor of ``properties train``: the sketched pinball machine, lam chosen on val (see the README's
#: "Properties of unknowns" for the choice)
DEFAULT_REGRESSOR = "lipschitz"
#: without validation spectra, the share of the training structures held out to calibrate the intervals
CALIBRATION_FRACTION = 0.2


@dataclass
class Skipped:
    """A record left out, and why."""

    file: str
    record: int | None
    reason: str

    def __str__(self) -> str:
        where = self.file + (f" record {self.record}" if self.record is not None else "")
        return f"{where}: {self.reason}"


def load_spectra(source: Any, skipped: list[Skipped]) -> list[Any]:
    """Spectra from a path (any format ``read_spectra`` reads), a list of paths or a sequence of ``Spectrum`` records;
    unreadable records are appended to ``skipped``.

    Raises
    ------
    InputError
        The file cannot be read at all.
    """
    if isinstance(source, (list, tuple)) and source and all(isinstance(x, (str, os.PathLike)) for x in source):
        return [s for path in source for s in load_spectra(path, skipped)]
    if isinstance(source, (str, os.PathLike)):
        from molpredict.io import SkipReport, read_spectra
        report = SkipReport()
        spectra = list(read_spectra(source, report=report))
        skipped.extend(Skipped(str(e.path), e.record, f"unreadable record: {e.reason}") for e in report)
        return spectra
    return list(source)


def _where(spectrum: Any, position: int) -> tuple[str, int | None]:
    file = getattr(spectrum, "file", None) or "spectra"
    record = getattr(spectrum, "record", None)
    return str(file), (record if record is not None else position + 1)


def label_spectra(spectra: Sequence[Any], skipped: list[Skipped]) -> tuple[list[Any], np.ndarray]:
    """The spectra with a usable SMILES and their property matrix (n, len(PROPERTY_NAMES)); the others are
    appended to ``skipped`` (field SMILES missing or not parsable)."""
    kept, rows = [], []
    for i, s in enumerate(spectra):
        smiles = (getattr(s, "metadata", {}) or {}).get("smiles")
        file, record = _where(s, i)
        if not smiles:
            skipped.append(Skipped(file, record, "field SMILES is missing (no property targets)"))
            continue
        try:
            rows.append(compute_properties([smiles], where=[f"{file} record {record}"])[0])
        except InputError as exc:
            skipped.append(Skipped(file, record, str(exc).split(": ", 1)[-1]))
            continue
        kept.append(s)
    Y = np.array(rows, dtype=np.float64).reshape(len(rows), len(PROPERTY_NAMES))
    return kept, Y


def _by_mode(spectra: Sequence[Any]) -> dict[str, np.ndarray]:
    modes = np.array([getattr(s, "ion_mode", None) or "" for s in spectra], dtype=object)
    return {mode: np.flatnonzero(modes == mode) for mode in MODES}


def train_properties(train: Any, val: Any = None, *, levels: Sequence[float] = DEFAULT_LEVELS,
                     regressor: str = DEFAULT_REGRESSOR, params: dict[str, Any] | None = None,
                     ion_modes: Sequence[str] | None = None, max_train: int | None = None, seed: int = 0,
                     min_spectra: int = 20, calibration_fraction: float = CALIBRATION_FRACTION,
                     log: Any = None) -> tuple[PropertyBundle, list[Skipped]]:
    """Train one property predictor per ion mode.

    Parameters
    ----------
    train, val : path, list of paths or sequence of Spectrum
        Labelled spectra (SMILES); val (structures disjoint from train) chooses the hyperparameter grid and
        calibrates the intervals. Without val, a seeded ``calibration_fraction`` of each mode's training
        structures is held out for that (split conformal): the raw quantiles of a model that has seen its own
        training spectra are far too narrow (on 30 spectra the 80% intervals covered none of the validation
        values).
    levels : sequence of float
        Quantile levels, ascending; the outermost pair is the reported interval.
    regressor : str
        Registered regressor name (``molpredict plugins list``).
    params : dict, optional
        Regressor parameters (e.g. ``{"lam": "1e-3+1e-4", "sketch": "subsample:m=2000"}``).
    ion_modes : sequence of str, optional
        Restrict to these modes (default: every mode with at least ``min_spectra`` training spectra).
    max_train : int, optional
        Use a seeded random subset of at most this many training spectra per mode.
    seed : int
    min_spectra : int
    calibration_fraction : float in (0, 1)
        Without val: the share of each mode's training structures held out to calibrate.
    log : callable, optional
        Receives one message per mode calibrated on held-out training structures.

    Returns
    -------
    (PropertyBundle, list of Skipped)

    Raises
    ------
    InputError
        No ion mode has enough labelled training spectra.
    """
    from molpredict.registry import create

    skipped: list[Skipped] = []
    train_spectra, Y = label_spectra(load_spectra(train, skipped), skipped)
    val_spectra, Yv = label_spectra(load_spectra(val, skipped), skipped) if val is not None else ([], None)
    params = dict(params or {})
    params["levels"] = "+".join(f"{float(t):g}" for t in sorted(levels))
    parsed: dict[str, str | None] = {}  # spectra of one structure share their SMILES: parse it once

    def key(spectrum: Any) -> str:
        return structure_key(spectrum, parsed)

    # the intervals would be calibrated on structures the model has seen: too narrow
    from molpredict.models.distinct import refuse_shared_structures

    refuse_shared_structures({key(x) for x in train_spectra}, {key(x) for x in val_spectra})
    train_modes, val_modes = _by_mode(train_spectra), _by_mode(val_spectra)
    predictors = {}
    rng = np.random.default_rng(seed)
    for mode in MODES:
        index = train_modes[mode]
        if (ion_modes is not None and mode not in ion_modes) or index.size < min_spectra:
            continue
        if max_train is not None and index.size > max_train:
            index = np.sort(rng.choice(index, size=int(max_train), replace=False))
        v = val_modes[mode] if val_spectra else np.zeros(0, dtype=np.int64)
        predictor = PropertyPredictor(create("regressor", regressor, **params), PROPERTY_NAMES)
        if v.size:
            predictor.fit([train_spectra[i] for i in index], Y[index], [val_spectra[i] for i in v], Yv[v])
        else:
            index, held = _calibration_split(train_spectra, index, calibration_fraction, seed, key)
            if log is not None:
                log(f"{mode}: no validation spectra: {held.size} training spectra of "
                    f"{len({key(train_spectra[i]) for i in held})} structures held out to calibrate "
                    f"the intervals")
            predictor.fit([train_spectra[i] for i in index], Y[index], [train_spectra[i] for i in held], Y[held])
        predictors[mode] = predictor
    if not predictors:
        raise InputError(f"no ion mode has {min_spectra} or more training spectra with a usable SMILES "
                         f"({len(train_spectra)} labelled spectra in all)")
    return PropertyBundle(predictors), skipped


def structure_key(spectrum: Any, parsed: dict[str, str | None] | None = None) -> str:
    """A labelled spectrum's structure: :func:`~molpredict.chem.molecules.spectrum_structure_key` (so that one
    structure written as two SMILES is one structure, as evaluation counts it), else its SMILES text."""
    from molpredict.chem.molecules import spectrum_structure_key

    return spectrum_structure_key(spectrum, parsed) or f"smiles:{spectrum.smiles}"


def _calibration_split(spectra: Sequence[Any], index: np.ndarray, fraction: float, seed: int,
                       key: Any = structure_key) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``index`` of ``spectra`` split into (fit, held out) by
    :func:`~molpredict.models.distinct.split_by_structure`: a seeded ``fraction`` of the structures held out, so
    the held-out spectra are of new structures, as unknowns are."""
    from molpredict.models.distinct import split_by_structure

    if not 0.0 < float(fraction) < 1.0:
        raise InputError(f"calibration fraction must be in (0, 1), not {fraction}")
    fit, held = split_by_structure([spectra[i] for i in index], fraction, seed, key=key)
    if not held.size:
        raise InputError("the training spectra hold one structure only: give --val spectra to calibrate the "
                         "intervals")
    return index[fit], index[held]


def column_names(names: Sequence[str]) -> list[str]:
    """The prediction columns: per property its median and interval, ``logp``, ``logp_low``, ``logp_high``."""
    return [c for name in names for c in (name, f"{name}_low", f"{name}_high")]


def _predict(spectra: Sequence[Any], bundle: PropertyBundle, skipped: list[Skipped]
             ) -> tuple[list[int], np.ndarray]:
    """Positions of the spectra the bundle can predict and their quantiles (n_kept, T, Q), input order."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(spectra):
        mode = getattr(s, "ion_mode", None)
        predictor = bundle.predictor(mode)
        if predictor is None:
            file, record = _where(s, i)
            skipped.append(Skipped(file, record, f"ion mode {mode or 'unknown'}: the property model has "
                                                 f"{', '.join(bundle.ion_modes)} only"))
            continue
        key = mode if mode in bundle.predictors else bundle.ion_modes[0]
        groups.setdefault(key, []).append(i)
    T, Q = len(bundle.names), len(bundle.quantiles)
    out = np.zeros((len(spectra), T, Q))
    for mode, positions in groups.items():
        out[positions] = bundle.predictors[mode].predict([spectra[i] for i in positions])
    kept = sorted(i for positions in groups.values() for i in positions)
    return kept, out[kept]


def predict_table(spectra: Any, bundle: PropertyBundle) -> tuple[Any, list[Skipped]]:
    """Medians and intervals per spectrum as a pandas DataFrame.

    Columns: ``id``, ``file``, ``record``, ``ion_mode``, then per property its middle quantile (the median for
    the default levels) and the outermost interval (``<name>_low``, ``<name>_high``). Spectra the model cannot
    take are skipped and returned in the list.
    """
    import pandas as pd

    skipped: list[Skipped] = []
    spectra = load_spectra(spectra, skipped)
    kept, F = _predict(spectra, bundle, skipped)
    rows = []
    for j, i in enumerate(kept):
        s = spectra[i]
        file, record = _where(s, i)
        row: dict[str, Any] = {"id": s.id, "file": file, "record": record, "ion_mode": s.ion_mode}
        for t, name in enumerate(bundle.names):
            row[name] = F[j, t, F.shape[2] // 2]
            row[f"{name}_low"] = F[j, t, 0]
            row[f"{name}_high"] = F[j, t, -1]
        rows.append(row)
    columns = ["id", "file", "record", "ion_mode"] + column_names(bundle.names)
    return pd.DataFrame(rows, columns=columns), skipped


def evaluate_properties(spectra: Any, bundle: PropertyBundle) -> tuple[dict[str, Any], list[Skipped]]:
    """Metrics per property on labelled spectra:
    ``{"properties": {name: {"r2", "mae", "pinball", "coverage", "crossing"}}, "n_spectra": n}``; an undefined
    metric (R^2 of constant targets) is None, so that the result is strict JSON (no NaN).

    Raises
    ------
    InputError
        No spectrum has both a usable SMILES and an ion mode the model has.
    """
    skipped: list[Skipped] = []
    labelled, Y = label_spectra(load_spectra(spectra, skipped), skipped)
    kept, F = _predict(labelled, bundle, skipped)
    if not kept:
        raise InputError("no spectrum to evaluate: none has a usable SMILES and an ion mode the model has")
    Y = Y[kept]
    levels = bundle.quantiles
    result = json_safe({"properties": {name: {k: round(v, 6) for k, v in
                                              property_metrics(Y[:, t], F[:, t, :], levels).items()}
                                       for t, name in enumerate(bundle.names)},
                        "n_spectra": len(kept)})
    return result, skipped


#: the prefix of the property columns ``identify --properties`` adds to its rows
COLUMN_PREFIX = "prop_"


def output_columns(names: Sequence[str]) -> list[str]:
    """The columns ``identify --properties`` appends: ``prop_<name>``, ``prop_<name>_low``, ``prop_<name>_high``."""
    return [COLUMN_PREFIX + c for c in column_names(names)]


def property_columns(bundle: PropertyBundle, spectra: Sequence[Any]) -> list[dict[str, float]]:
    """Per spectrum, its :func:`output_columns` values (median and interval per property); an empty dict for a
    spectrum the model cannot take (an ion mode it lacks)."""
    spectra = list(spectra)
    kept, F = _predict(spectra, bundle, [])
    out: list[dict[str, float]] = [{} for _ in spectra]
    for j, i in enumerate(kept):
        for t, name in enumerate(bundle.names):
            out[i][f"{COLUMN_PREFIX}{name}"] = float(F[j, t, F.shape[2] // 2])
            out[i][f"{COLUMN_PREFIX}{name}_low"] = float(F[j, t, 0])
            out[i][f"{COLUMN_PREFIX}{name}_high"] = float(F[j, t, -1])
    return out


def iter_messages(skipped: Iterable[Skipped]) -> list[str]:
    """One line per skipped record."""
    return [str(s) for s in skipped]
