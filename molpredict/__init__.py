"""molpredict: identify molecules from MS/MS spectra (and text, and strings) by sketched output kernel regression."""
from __future__ import annotations

__version__ = "0.1.0"

from molpredict import errors as _errors
from molpredict.errors import InputError, ModelFileError, MolpredictError, PluginError, ResourceError, SpecError
from molpredict.registry import create, get_registry
from molpredict.specs import ComponentSpec, parse_spec

# The data types and entry points most scripts need, imported on first use so that `import molpredict` (and the
# CLI's start-up) stays cheap.
_LAZY = {
    "Spectrum": "spectra", "read_spectra": "spectra", "write_mgf": "spectra", "CleaningPipeline": "spectra",
    "Molecule": "molecules", "CandidateLibrary": "candidates", "ModelBundle": "modelfile",
    "Identifier": "identify", "IdentifyOptions": "identify",
    "predict_properties": "properties",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'molpredict' has no attribute {name!r}")

__all__ = [
    "__version__",
    *_errors.__all__,
    "ComponentSpec",
    "parse_spec",
    "get_registry",
    "create",
    *_LAZY,
]
