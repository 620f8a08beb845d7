"""Conformance checks for models: run :func:`check_model` on your own model in your plugin's tests.

Example
-------
A plugin author's test for a new model (any :class:`molpredict.models.base.Model` subclass), on a few dozen real
labelled spectra (a tiny set is enough: the checks are about behaviour, not accuracy)::

    from itertools import islice
    from molpredict.chem.molecules import Molecule
    from molpredict.spectra.cleaning import read_spectra
    from molpredict.testing import check_model
    from my_plugin import MyModel

    def test_conformance():
        spectra = [s for s in islice(read_spectra("train_pos.mgf"), 60) if s.smiles]
        check_model(MyModel(seed=0), spectra, [Molecule.from_smiles(s.smiles) for s in spectra])
"""
from __future__ import annotations

import copy
import json
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["check_model"]


def _fail(model: Any, check: str, detail: str) -> None:
    raise AssertionError(f"check_model({type(model).__name__}): {check}: {detail}")


def reload_state(fitted: Any, fail: Callable[[str, str], None]) -> Any:
    """``type(fitted).from_state`` of ``fitted.get_state()`` as a bundle stores it: the arrays must be numeric
    ndarrays and the metadata must survive a JSON round trip; ``fail(check, detail)`` is called otherwise."""
    arrays, metadata = fitted.get_state()
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
            fail("state", f"array {name!r} is not a numeric ndarray ({type(array).__name__})")
    try:
        metadata = json.loads(json.dumps(metadata))
    except (TypeError, ValueError) as exc:
        fail("state", f"metadata is not JSON: {exc}")
    return type(fitted).from_state({k: np.array(v) for k, v in arrays.items()}, metadata)


def _coordinates(model: Any, what: str, values: Any, n: int, d: int | None) -> np.ndarray:
    if not isinstance(values, np.ndarray) or values.dtype != np.float64:
        _fail(model, "shapes", f"{what} must be a float64 ndarray, got {type(values).__name__} "
                               f"{getattr(values, 'dtype', '')}")
    if values.ndim != 2 or values.shape[0] != n or (d is not None and values.shape[1] != d):
        _fail(model, "shapes", f"{what} has shape {values.shape}, expected ({n}, {'d' if d is None else d})")
    if not np.all(np.isfinite(values)):
        _fail(model, "shapes", f"{what} has non-finite values")
    return values


def check_model(model: Any, inputs: Sequence[Any], molecules: Sequence[Any],
                candidates: Sequence[Any] | None = None, *, n_queries: int = 8, rtol: float = 1e-10) -> None:
    """Check that an unfitted ``model`` behaves as a molpredict model; raise ``AssertionError`` if not.

    The model is fitted (on deep copies, the argument is left unfitted) on ``inputs`` and their ``molecules``;
    the first ``n_queries`` inputs are the queries, ``candidates`` (default: the distinct training molecules,
    as given) the candidates. The checks:

    1. input type: ``model.input_type`` is ``"text"`` for string inputs, else ``"spectrum"``;
    2. shapes: ``predict_coordinates(queries)`` is (n_queries, d) and ``candidate_coordinates(candidates)``
       (n_candidates, d), float64, finite; ``score`` is (n_queries, n_candidates) and equals
       ``score_coordinates`` of the two (and their dot product when ``dot_product_scores``);
    3. determinism: a second fit of another copy (same parameters, so the same seed) gives the same scores
       (within ``rtol`` of the largest score);
    4. save -> load: ``get_state`` gives numeric ndarrays and JSON metadata; ``from_state`` on a JSON round trip
       of it gives identical scores and the same ``coordinates_key``;
    5. bad input is refused with the project's errors: unpaired inputs and molecules raise
       :class:`~molpredict.errors.InputError`, a foreign state raises
       :class:`~molpredict.errors.ModelFileError`.

    Parameters
    ----------
    model : Model
        Unfitted, with small settings (few epochs, small sketches) so the two fits take seconds.
    inputs : sequence of Spectrum or str
    molecules : sequence of Molecule, aligned with ``inputs``
    candidates : sequence of Molecule, optional
    n_queries : int
    rtol : float
    """
    from molpredict.errors import InputError, ModelFileError, MolpredictError

    inputs, molecules = list(inputs), list(molecules)
    if len(inputs) != len(molecules) or len(inputs) < 2:
        raise ValueError("check_model needs at least two inputs paired with molecules")
    if candidates is None:
        seen: dict[str, Any] = {}
        for m in molecules:
            seen.setdefault(getattr(m, "inchikey", None) or repr(m), m)
        candidates = list(seen.values())
    candidates = list(candidates)
    queries = inputs[:n_queries]

    # 1. input type
    expected = "text" if all(isinstance(x, str) for x in inputs) else "spectrum"
    if model.input_type != expected:
        _fail(model, "input type", f"input_type is {model.input_type!r} for {expected} inputs")

    # 2. shapes
    fitted = copy.deepcopy(model).fit(inputs, molecules)
    if fitted is None:
        _fail(model, "fit", "fit must return the fitted model (self)")
    predictions = _coordinates(model, "predict_coordinates", fitted.predict_coordinates(queries), len(queries),
                               None)
    d = predictions.shape[1]
    coords = _coordinates(model, "candidate_coordinates", fitted.candidate_coordinates(candidates),
                          len(candidates), d)
    scores = np.asarray(fitted.score(queries, candidates))
    if scores.shape != (len(queries), len(candidates)) or not np.all(np.isfinite(scores)):
        _fail(model, "shapes", f"score has shape {scores.shape} (or non-finite values), expected "
                               f"({len(queries)}, {len(candidates)})")
    scale = max(1.0, float(np.abs(scores).max()))
    if not np.allclose(fitted.score_coordinates(predictions, coords), scores, rtol=0, atol=rtol * scale):
        _fail(model, "shapes", "score differs from score_coordinates(predict_coordinates, candidate_coordinates)")
    if fitted.dot_product_scores and not np.allclose(predictions @ coords.T, scores, rtol=0, atol=1e-9 * scale):
        _fail(model, "shapes", "dot_product_scores is True but the scores are not the coordinates' dot product")

    # 3. determinism
    again = copy.deepcopy(model).fit(inputs, molecules).score(queries, candidates)
    if not np.allclose(again, scores, rtol=0, atol=rtol * scale):
        worst = float(np.abs(np.asarray(again) - scores).max())
        _fail(model, "determinism", f"a second fit with the same parameters changed the scores by {worst:.3g}")

    # 4. save -> load
    reloaded = reload_state(fitted, lambda check, detail: _fail(model, check, detail))
    if not np.array_equal(reloaded.score(queries, candidates), scores):
        _fail(model, "save -> load", "the reloaded model scores differently")
    if reloaded.coordinates_key() != fitted.coordinates_key():
        _fail(model, "save -> load", "the reloaded model has another coordinates_key (the cache would miss)")

    # 5. bad input
    try:
        copy.deepcopy(model).fit(inputs, molecules[:-1])
    except InputError:
        pass
    except Exception as exc:  # noqa: BLE001 - reporting which error it was is the point
        _fail(model, "bad input", f"unpaired inputs raised {type(exc).__name__}, not InputError: {exc}")
    else:
        _fail(model, "bad input", "unpaired inputs (one molecule fewer) were accepted")
    try:
        type(fitted).from_state({}, {"format": "not-a-model"})
    except ModelFileError:
        pass
    except MolpredictError as exc:
        _fail(model, "bad input", f"a foreign state raised {type(exc).__name__}, not ModelFileError")
    except Exception as exc:  # noqa: BLE001
        _fail(model, "bad input", f"a foreign state raised {type(exc).__name__}, not ModelFileError: {exc}")
    else:
        _fail(model, "bad input", "a foreign state was loaded")
