"""molpredict: identify molecules from MS/MS spectra (and text, and strings) by sketched output kernel regression.

The API, one call per job (each returns what you already use)::

    import molpredict
    hits = molpredict.identify("queries.mgf", model="mymodel", library="library.tsv")   # a pandas DataFrame
    hits = molpredict.identify_text(["The molecule is a ..."], model="textmodel", library="molecules.tsv")
    bundle = molpredict.train("train_pos.mgf", "val_pos.mgf", output="mymodel")
    metrics = molpredict.evaluate("test_pos.mgf", "test_formula.json", model="mymodel")
    bundle = molpredict.load_model("mymodel")

``spectra`` may be paths, molpredict ``Spectrum`` records or ``matchms.Spectrum`` objects
(:mod:`molpredict.io.matchms` converts both ways). Stages (subpackages, lowest first): ``spectra``, ``chem``,
``io``, ``kernels``, ``engine``, ``models``, ``identification``, ``training``, ``report``, ``data``, ``cli``.
"""
from __future__ import annotations

__version__ = "0.1.0"

from molpredict import errors as _errors
from molpredict.errors import InputError, ModelFileError, MolpredictError, PluginError, ResourceError, SpecError
from molpredict.registry import create, get_registry, load_plugins
from molpredict.specs import ComponentSpec, parse_spec

# The data types and entry points most scripts need, imported on first use so that `import molpredict` (and the
# CLI's start-up) stays cheap.
_LAZY = {
    "identify": "api", "identify_text": "api", "train": "api", "evaluate": "api", "load_model": "api", "load_library": "api",
    "Spectrum": "spectra", "CleaningPipeline": "spectra", "read_spectra": "io", "write_mgf": "io",
    "Molecule": "chem.molecules", "CandidateLibrary": "chem.candidates", "ModelBundle": "modelfile",
    "Identifier": "identification.identify", "IdentifyOptions": "identification.identify",
    "Sketch": "engine.sketches", "predict_properties": "api",
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
    "load_plugins",
    "create",
    *_LAZY,
]
