"""The ``Regressor`` ABC: models that map inputs to real-valued vector targets (molecular properties), with or
without quantile levels.

The ``Model`` ABC (:mod:`molpredict.models.base`) scores candidates by a dot product of coordinates, which has no
meaning for properties of an unknown molecule: a regressor instead predicts, for each input, T targets at Q
levels, ``predict(inputs) -> (n, T, Q)``; Q is the number of quantile levels (:attr:`Regressor.quantiles`) for
a quantile regressor, 1 for a point regressor (``quantiles == ()``). Plugin authors check theirs with
:func:`molpredict.testing.check_regressor`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

import numpy as np

from molpredict.component import Component
from molpredict.errors import InputError
from molpredict.specs import ComponentSpec

__all__ = ["Regressor", "check_targets"]


def check_targets(inputs: Sequence[Any], targets: Any, what: str = "training") -> np.ndarray:
    """Targets as a finite float64 matrix paired with ``inputs``; InputError otherwise.

    Parameters
    ----------
    inputs : sequence
    targets : array-like of shape (n,) or (n, T)

    Returns
    -------
    ndarray of shape (n, T), float64
    """
    Y = np.asarray(targets, dtype=np.float64)
    if Y.ndim == 1:
        Y = Y[:, None]
    if Y.ndim != 2:
        raise InputError(f"{what} targets must be a matrix (n, T), got shape {Y.shape}")
    if Y.shape[0] != len(inputs):
        raise InputError(f"{len(inputs)} {what} inputs but {Y.shape[0]} target rows: they must pair one to one")
    if Y.shape[0] < 2:
        raise InputError(f"{Y.shape[0]} {what} pairs: at least 2 needed")
    bad = np.argwhere(~np.isfinite(Y))
    if bad.size:
        raise InputError(f"{what} targets: non-finite value at row {int(bad[0, 0])}, column {int(bad[0, 1])}")
    return Y


class Regressor(Component, ABC):
    """A fitted mapping from inputs to T real targets at Q levels.

    Fitted attributes every regressor sets: ``n_targets_`` (T).
    """

    #: what the regressor takes when no ``input_kernel`` parameter says otherwise
    default_input_type: ClassVar[str] = "spectrum"

    @property
    def input_type(self) -> str:
        """What the regressor takes: the input type of the registered kernel its ``input_kernel`` parameter names,
        else :attr:`default_input_type`."""
        from molpredict.registry import get_registry
        value = self.get_params().get("input_kernel")
        if isinstance(value, (str, ComponentSpec)):
            found = get_registry().input_type("input_kernel", value)
            if found is not None:
                return str(found)
        return self.default_input_type

    @property
    def quantiles(self) -> tuple[float, ...]:
        """The quantile levels of the last axis of :meth:`predict`, ascending; ``()`` for point predictions."""
        return ()

    @abstractmethod
    def fit(self, inputs: Sequence[Any], targets: np.ndarray,
            val: tuple[Sequence[Any], np.ndarray] | None = None) -> "Regressor":
        """Train on inputs and their targets, shape (n, T); ``val = (inputs, targets)`` selects hyperparameters."""

    @abstractmethod
    def predict(self, inputs: Sequence[Any]) -> np.ndarray:
        """ndarray of shape (n_inputs, T, Q), float64 (Q = len(quantiles), or 1 when it is empty)."""

    @abstractmethod
    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The fitted state: (named arrays, JSON-serialisable metadata). No pickled objects."""

    @classmethod
    @abstractmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "Regressor":
        """Rebuild a fitted regressor from :meth:`get_state`'s output (ModelFileError for a foreign state)."""
