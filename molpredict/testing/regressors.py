"""Conformance checks for regressors (vector targets): run :func:`check_regressor` on your own regressor.

A :class:`molpredict.models.regression.Regressor` predicts real targets, not candidate scores, so
:func:`molpredict.testing.check_model` (coordinates, dot products, a candidate cache key) does not apply; this
check asks the same of it where it has meaning: shapes, determinism, a pickle-free save -> load and the
project's errors.

Example
-------
A plugin author's test, on a few dozen real spectra with any numeric targets::

    from itertools import islice
    import numpy as np
    from molpredict.spectra import read_spectra
    from molpredict.testing import check_regressor
    from my_plugin import MyRegressor

    def test_conformance():
        spectra = [s for s in islice(read_spectra("train_pos.mgf"), 60) if s.precursor_mz]
        targets = np.array([[s.precursor_mz, len(s.mz)] for s in spectra])
        check_regressor(MyRegressor(seed=0), spectra, targets)
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from molpredict.testing.models import reload_state

__all__ = ["check_regressor"]


def _fail(regressor: Any, check: str, detail: str) -> None:
    raise AssertionError(f"check_regressor({type(regressor).__name__}): {check}: {detail}")


def check_regressor(regressor: Any, inputs: Sequence[Any], targets: Any, *, n_queries: int = 8,
                    rtol: float = 1e-10) -> None:
    """Check that an unfitted ``regressor`` behaves as a molpredict regressor; raise ``AssertionError`` if not.

    The regressor is fitted (on deep copies; the argument stays unfitted) on ``inputs`` and ``targets``
    (n, T); the first ``n_queries`` inputs are the queries. The checks:

    1. input type: ``input_type`` is ``"text"`` for string inputs, else ``"spectrum"``;
    2. shapes: ``predict(queries)`` is a finite float64 ndarray (n_queries, T, Q) with Q = ``len(quantiles)``
       (1 when ``quantiles`` is empty), ``quantiles`` ascending in (0, 1); an empty query list gives (0, T, Q);
    3. determinism: a second fit of another copy gives the same predictions (within ``rtol`` of their scale);
    4. save -> load: ``get_state`` gives numeric ndarrays and JSON metadata; ``from_state`` on a JSON round trip
       of it predicts identically;
    5. bad input is refused with the project's errors: targets with one row fewer and non-finite targets raise
       :class:`~molpredict.errors.InputError`, a foreign state :class:`~molpredict.errors.ModelFileError`.

    Parameters
    ----------
    regressor : Regressor
        Unfitted, with small settings so that two fits take seconds.
    inputs : sequence of Spectrum or str
    targets : array-like of shape (n, T)
    n_queries : int
    rtol : float
    """
    from ..errors import InputError, ModelFileError

    inputs = list(inputs)
    Y = np.asarray(targets, dtype=np.float64)
    if Y.ndim != 2 or Y.shape[0] != len(inputs) or len(inputs) < 2:
        raise ValueError("check_regressor needs at least two inputs paired with the rows of a (n, T) target matrix")
    queries = inputs[:n_queries]
    T = Y.shape[1]

    # 1. input type
    expected = "text" if all(isinstance(x, str) for x in inputs) else "spectrum"
    if regressor.input_type != expected:
        _fail(regressor, "input type", f"input_type is {regressor.input_type!r} for {expected} inputs")

    # 2. shapes
    fitted = copy.deepcopy(regressor).fit(inputs, Y)
    if fitted is None:
        _fail(regressor, "fit", "fit must return the fitted regressor (self)")
    quantiles = tuple(fitted.quantiles)
    if any(not 0.0 < q < 1.0 for q in quantiles) or any(b <= a for a, b in zip(quantiles, quantiles[1:])):
        _fail(regressor, "shapes", f"quantiles {quantiles} are not ascending levels in (0, 1)")
    Q = len(quantiles) or 1
    predictions = fitted.predict(queries)
    if not isinstance(predictions, np.ndarray) or predictions.dtype != np.float64:
        _fail(regressor, "shapes", f"predict must return a float64 ndarray, got {type(predictions).__name__} "
                                   f"{getattr(predictions, 'dtype', '')}")
    if predictions.shape != (len(queries), T, Q):
        _fail(regressor, "shapes", f"predict returned shape {predictions.shape}, expected {(len(queries), T, Q)}")
    if not np.all(np.isfinite(predictions)):
        _fail(regressor, "shapes", "predict returned non-finite values")
    empty = np.asarray(fitted.predict([]))
    if empty.shape != (0, T, Q):
        _fail(regressor, "shapes", f"predict([]) returned shape {empty.shape}, expected {(0, T, Q)}")
    scale = max(1.0, float(np.abs(predictions).max()))

    # 3. determinism
    again = copy.deepcopy(regressor).fit(inputs, Y).predict(queries)
    if not np.allclose(again, predictions, rtol=0, atol=rtol * scale):
        worst = float(np.abs(np.asarray(again) - predictions).max())
        _fail(regressor, "determinism", f"a second fit with the same parameters changed predictions by {worst:.3g}")

    # 4. save -> load
    reloaded = reload_state(fitted, lambda check, detail: _fail(regressor, check, detail))
    if not np.allclose(reloaded.predict(queries), predictions, rtol=0, atol=1e-12 * scale):
        _fail(regressor, "save -> load", "the reloaded regressor predicts differently")

    # 5. bad input
    for what, bad in (("targets with one row fewer", Y[:-1]),
                      ("non-finite targets", np.where(np.arange(Y.size).reshape(Y.shape) == 0, np.nan, Y))):
        try:
            copy.deepcopy(regressor).fit(inputs, bad)
        except InputError:
            pass
        except Exception as exc:  # noqa: BLE001 - reporting which error it was is the point
            _fail(regressor, "bad input", f"{what} raised {type(exc).__name__}, not InputError: {exc}")
        else:
            _fail(regressor, "bad input", f"{what} were accepted")
    try:
        type(fitted).from_state({}, {"format": "not-a-regressor"})
    except ModelFileError:
        pass
    except Exception as exc:  # noqa: BLE001
        _fail(regressor, "bad input", f"a foreign state raised {type(exc).__name__}, not ModelFileError: {exc}")
    else:
        _fail(regressor, "bad input", "a foreign state was loaded")
