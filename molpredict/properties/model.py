"""The property predictor of one ion mode: a quantile regressor on spectra plus the conformal widening of its
outermost interval, and the bundle that holds one predictor per ion mode (safetensors + JSON, never pickle).

Intervals. Quantiles fitted on training spectra are too narrow on new structures (the kernel machine fits its
own training spectra better than unseen ones). The predictor therefore widens the outermost interval
[q_lo, q_hi] per property by conformalised quantile regression (Romano, Patterson & Candes, NeurIPS 2019): on the
validation spectra (structures disjoint from training) the scores e_i = max(q_lo(x_i) - y_i, y_i - q_hi(x_i)) are
computed, and c is their ceil((n + 1)(tau_hi - tau_lo)) / n empirical quantile; predictions are then
[q_lo - c, q_hi + c] (kept on the right side of the median). With validation and test spectra exchangeable the
interval covers a new spectrum's true value with probability at least tau_hi - tau_lo (0.8 for 0.1/0.9).
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from molpredict.errors import InputError, ModelFileError
from molpredict.modelfile import check_output_folder, folder_written, save_tensors

__all__ = ["PropertyPredictor", "PropertyBundle", "conformal_offsets", "apply_offsets", "check_output_dir",
           "BUNDLE_FILE"]

BUNDLE_FILE = "properties.json"
TENSORS_FILE = "tensors.safetensors"
METADATA_FILE = "metadata.json"
FORMAT_NAME = "molpredict-properties"
FORMAT_VERSION = 1
MODES = ("positive", "negative")


def conformal_offsets(Y: np.ndarray, lower: np.ndarray, upper: np.ndarray, coverage: float) -> np.ndarray:
    """Per column, the widening c that makes [lower - c, upper + c] cover ``coverage`` of the rows (CQR).

    Parameters
    ----------
    Y, lower, upper : ndarray of shape (n, T)
    coverage : float in (0, 1)

    Returns
    -------
    ndarray of shape (T,): the ceil((n + 1) coverage) / n empirical quantile of max(lower - y, y - upper)
    (may be negative: the interval then shrinks).
    """
    scores = np.maximum(lower - Y, Y - upper)
    n = scores.shape[0]
    level = min(1.0, math.ceil((n + 1) * coverage) / n)
    return np.quantile(scores, level, axis=0, method="higher")


def apply_offsets(F: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Widen the outermost levels of quantile predictions F (n, T, Q) by ``offsets`` (T,), keeping each outer
    quantile on its side of the middle one (no crossing introduced). Returns a new array."""
    F = np.array(F, dtype=np.float64, copy=True)
    if F.shape[-1] < 2:
        return F
    middle = F[..., F.shape[-1] // 2]
    F[..., 0] = np.minimum(F[..., 0] - offsets[None, :], middle if F.shape[-1] > 2 else np.inf)
    F[..., -1] = np.maximum(F[..., -1] + offsets[None, :], middle if F.shape[-1] > 2 else -np.inf)
    return F


class PropertyPredictor:
    """One ion mode's property model: a fitted quantile regressor and its conformal offsets.

    Parameters
    ----------
    regressor : Regressor
        Unfitted (``fit``) or fitted (``from_state``), with quantile levels (``quantiles``).
    names : sequence of str
        The property names, one per target column.

    Fitted attributes
    -----------------
    offsets_ : ndarray of shape (T,)
        The conformal widening of the outermost interval (zeros when fitted without validation spectra;
        :func:`~molpredict.properties.pipeline.train_properties` always gives some, held out if need be).
    n_train_, n_val_ : int
    """

    def __init__(self, regressor: Any, names: Sequence[str]) -> None:
        self.regressor = regressor
        self.names = list(names)

    @property
    def quantiles(self) -> tuple[float, ...]:
        return tuple(self.regressor.quantiles)

    def fit(self, spectra: Sequence[Any], targets: np.ndarray, val_spectra: Sequence[Any] | None = None,
            val_targets: np.ndarray | None = None) -> "PropertyPredictor":
        """Fit the regressor (hyperparameters chosen on the validation spectra when given) and the offsets."""
        if len(self.regressor.quantiles) < 2:
            raise InputError("the property predictor needs a quantile regressor with at least two levels")
        val = None if val_spectra is None or not len(val_spectra) else (list(val_spectra), val_targets)
        self.regressor.fit(list(spectra), targets, val=val)
        self.n_train_ = len(spectra)
        self.n_val_ = 0 if val is None else len(val[0])
        self.offsets_ = np.zeros(len(self.names))
        if val is not None:
            F = self.regressor.predict(val[0])
            q = self.quantiles
            self.offsets_ = conformal_offsets(np.asarray(val_targets, dtype=np.float64), F[..., 0], F[..., -1],
                                              q[-1] - q[0])
        return self

    def predict(self, spectra: Sequence[Any]) -> np.ndarray:
        """Quantiles per spectrum and property, shape (n, T, Q): the outermost ones widened by the offsets, all
        clipped to each property's range (counts >= 0, fractions in [0, 1])."""
        from molpredict.properties.targets import clip_to_ranges
        return clip_to_ranges(apply_offsets(self.regressor.predict(list(spectra)), self.offsets_), self.names)

    # -- state -----------------------------------------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, state = self.regressor.get_state()
        arrays = dict(arrays)
        arrays["properties.offsets"] = np.asarray(self.offsets_, dtype=np.float64)
        meta = {"regressor": getattr(self.regressor, "registry_name", None) or type(self.regressor).__name__,
                "state": state, "names": self.names, "quantiles": list(self.quantiles),
                "n_train": int(self.n_train_), "n_val": int(self.n_val_)}
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> "PropertyPredictor":
        from molpredict.registry import get_registry
        try:
            target = get_registry().get("regressor", meta["regressor"])
            regressor = target.from_state({k: v for k, v in arrays.items() if not k.startswith("properties.")},
                                          meta["state"])
            predictor = cls(regressor, meta["names"])
            predictor.offsets_ = np.asarray(arrays["properties.offsets"], dtype=np.float64)
            predictor.n_train_, predictor.n_val_ = int(meta["n_train"]), int(meta["n_val"])
        except KeyError as exc:
            raise ModelFileError(f"property model state lacks {exc}") from None
        if predictor.offsets_.shape != (len(predictor.names),):
            raise ModelFileError(f"property model state: {predictor.offsets_.shape[0]} offsets for "
                                 f"{len(predictor.names)} properties")
        return predictor


def _is_property_model(folder: Path) -> bool:
    try:
        return json.loads((folder / BUNDLE_FILE).read_text()).get("format") == FORMAT_NAME
    except (OSError, ValueError, AttributeError):
        return False


def check_output_dir(path: str | os.PathLike) -> None:
    """Raise ModelFileError unless ``path`` may receive a property model
    (:func:`~molpredict.modelfile.check_output_folder`): files of yours or an identification bundle are never
    deleted to make room."""
    check_output_folder(path, _is_property_model, "a property model")


class PropertyBundle:
    """One :class:`PropertyPredictor` per ion mode, saved as a directory::

        MODEL/properties.json            format, version, ion modes, property names
        MODEL/<mode>/tensors.safetensors the arrays of the predictor
        MODEL/<mode>/metadata.json       its JSON state
    """

    def __init__(self, predictors: dict[str, PropertyPredictor], path: Path | None = None) -> None:
        self.predictors = dict(predictors)
        self.path = path

    @property
    def ion_modes(self) -> list[str]:
        return [m for m in MODES if m in self.predictors]

    @property
    def names(self) -> list[str]:
        return next(iter(self.predictors.values())).names

    @property
    def quantiles(self) -> tuple[float, ...]:
        return next(iter(self.predictors.values())).quantiles

    def predictor(self, ion_mode: str | None) -> PropertyPredictor | None:
        """The predictor for an ion mode; a spectrum without one uses the only mode of a single-mode bundle."""
        if ion_mode in self.predictors:
            return self.predictors[ion_mode]
        if ion_mode is None and len(self.predictors) == 1:
            return next(iter(self.predictors.values()))
        return None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the bundle, atomically replacing a property model at ``path``.

        Raises
        ------
        ModelFileError
            ``path`` exists and is not a property model (it is never overwritten: see :func:`check_output_dir`),
            or writing failed.
        """
        path = Path(path)
        check_output_dir(path)
        with folder_written(path, "property model") as tmp:
            for mode, predictor in self.predictors.items():
                arrays, meta = predictor.get_state()
                (tmp / mode).mkdir()
                save_tensors({k: np.ascontiguousarray(v) for k, v in arrays.items()}, tmp / mode / TENSORS_FILE)
                (tmp / mode / METADATA_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
            head = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "ion_modes": self.ion_modes,
                    "properties": self.names, "quantiles": list(self.quantiles),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (tmp / BUNDLE_FILE).write_text(json.dumps(head, indent=1))
        self.path = path
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PropertyBundle":
        """Read a bundle written by :meth:`save`; ModelFileError (naming the file and field) otherwise."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        path = Path(path)
        head_path = path / BUNDLE_FILE
        if not head_path.is_file():
            raise ModelFileError(f"{path}: not a property model (expected a directory containing {BUNDLE_FILE})")
        head = _read_json(head_path)
        if head.get("format") != FORMAT_NAME:
            raise ModelFileError(f"{head_path}: field format is {head.get('format')!r}, not {FORMAT_NAME!r}")
        if head.get("format_version") != FORMAT_VERSION:
            raise ModelFileError(f"{head_path}: field format_version {head.get('format_version')!r} is not "
                                 f"supported (expected {FORMAT_VERSION})")
        modes = head.get("ion_modes")
        if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes):
            raise ModelFileError(f"{head_path}: field ion_modes is missing or invalid")
        predictors = {}
        for mode in modes:
            meta = _read_json(path / mode / METADATA_FILE)
            try:
                arrays = load_file(str(path / mode / TENSORS_FILE))
            except (OSError, SafetensorError) as exc:
                raise ModelFileError(f"{path / mode / TENSORS_FILE}: cannot read the tensors: {exc}") from None
            predictors[mode] = PropertyPredictor.from_state(arrays, meta)
        return cls(predictors, path)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: expected a JSON object")
    return data
