"""molpredict: identify molecules from MS/MS spectra (and text, and strings) by sketched output kernel regression."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import InputError, ModelFileError, MolpredictError, PluginError, ResourceError, SpecError
from .registry import create, get_registry
from .specs import ComponentSpec, parse_spec

__all__ = [
    "__version__",
    "MolpredictError",
    "InputError",
    "SpecError",
    "PluginError",
    "ModelFileError",
    "ResourceError",
    "ComponentSpec",
    "parse_spec",
    "get_registry",
    "create",
]
