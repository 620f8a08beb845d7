"""The pluggy hook specifications: what a plugin can provide to molpredict."""
from __future__ import annotations

from typing import Any, Callable

import pluggy

PROJECT_NAME = "molpredict"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: ``register(name, component)``: ``component`` is a class or a lazy ``"package.module:ClassName"`` string.
Register = Callable[[str, Any], None]


@hookspec
def register_input_kernels(register: Register) -> None:
    """Register input kernels (on ``Spectrum`` records or strings)."""


@hookspec
def register_output_kernels(register: Register) -> None:
    """Register output kernels (on ``Molecule`` records)."""


@hookspec
def register_sketches(register: Register) -> None:
    """Register sketch types (random projections R, m x n)."""


@hookspec
def register_models(register: Register) -> None:
    """Register models (IOKR family, DSOKR, baselines)."""


@hookspec
def register_encoders(register: Register) -> None:
    """Register neural input encoders for DSOKR."""


@hookspec
def register_regressors(register: Register) -> None:
    """Register regressors: models of real-valued vector targets (molecular properties), see
    :class:`molpredict.models.regression.Regressor`."""


@hookspec
def register_commands(cli: Any) -> None:
    """Add click commands to the ``molpredict`` command group ``cli``."""
