"""The built-in components, registered through the same hooks as any third-party plugin.

Targets are lazy ``"module:Class"`` references so that ``molpredict --help`` imports no numerical code.
"""
from __future__ import annotations

from molpredict.hookspecs import Register, hookimpl

INPUT_KERNELS = {
    "ppk": "molpredict.kernels.spectra:PPKernel",
    "ppk-losses": "molpredict.kernels.spectra:PPKLossesKernel",
    "ppk-pairs": "molpredict.kernels.spectra:PPKPairsKernel",
    "cosine": "molpredict.kernels.spectra:CosineKernel",
    "formula-annotation": "molpredict.kernels.formulas:FormulaAnnotationKernel",
    "mkl": "molpredict.kernels.mkl:MKLKernel",
    "precursor": "molpredict.kernels.masses:PrecursorKernel",
    "mass-defect": "molpredict.kernels.masses:MassDefectKernel",
    "text-embedding": "molpredict.kernels.text:TextEmbeddingKernel",
    "text-ngram": "molpredict.kernels.text:TextNgramKernel",
    "smiles-ngram": "molpredict.kernels.text:SmilesNgramKernel",
}
OUTPUT_KERNELS = {
    "tanimoto": "molpredict.kernels.fingerprints:TanimotoKernel",
    "gaussian-tanimoto": "molpredict.kernels.fingerprints:GaussianTanimotoKernel",
    "fingerprint-cosine": "molpredict.kernels.fingerprints:FingerprintCosineKernel",
    "multi-fingerprint": "molpredict.kernels.multifingerprint:MultiFingerprintKernel",
    "wl-subtree": "molpredict.kernels.graphs:WLSubtreeKernel",
    "nspd": "molpredict.kernels.graphs:NSPDKernel",
    "core-wl": "molpredict.kernels.graphs:CoreWLKernel",
}
SKETCHES = {
    "subsample": "molpredict.engine.sketches:SubsampleSketch",
    "gaussian": "molpredict.engine.sketches:GaussianSketch",
    "p-sparsified-rademacher": "molpredict.engine.sketches:PSparsifiedRademacherSketch",
    "p-sparsified-gaussian": "molpredict.engine.sketches:PSparsifiedGaussianSketch",
    "accumulation": "molpredict.engine.sketches:AccumulationSketch",
    "adaptive": "molpredict.engine.sketches:AdaptiveSketch",
}
MODELS = {
    "iokr": "molpredict.models.okr:IOKR",
    "siokr": "molpredict.models.okr:SIOKR",
    "isokr": "molpredict.models.okr:ISOKR",
    "sisokr": "molpredict.models.okr:SISOKR",
    "dsokr": "molpredict.models.dsokr:DSOKR",
    "okr-robust": "molpredict.models.robust:RobustOKR",
    "random": "molpredict.models.baselines:RandomBaseline",
    "prior": "molpredict.models.baselines:PriorBaseline",
    "fingerprint-ffn": "molpredict.models.baselines:FingerprintFFN",
    "library-knn": "molpredict.models.baselines:LibraryKNN",
}
ENCODERS = {
    "mlp": "molpredict.engine.encoders:MLPEncoder",
    "formula-transformer": "molpredict.engine.formula_transformer:FormulaTransformerEncoder",
    "kernel-mlp": "molpredict.engine.encoders:KernelMLPEncoder",
    "kernel-formula": "molpredict.engine.kernel_formula:KernelFormulaEncoder",
    "transformer": "molpredict.engine.encoders:TransformerEncoder",
    "text-embedding": "molpredict.engine.encoders:TextEmbeddingEncoder",
}

REGRESSORS = {
    "lipschitz": "molpredict.models.lipschitz:SketchedLipschitzRegressor",
}


def _register_all(register: Register, table: dict[str, str]) -> None:
    for name, target in table.items():
        register(name, target)


@hookimpl
def register_input_kernels(register: Register) -> None:
    _register_all(register, INPUT_KERNELS)


@hookimpl
def register_output_kernels(register: Register) -> None:
    _register_all(register, OUTPUT_KERNELS)


@hookimpl
def register_sketches(register: Register) -> None:
    _register_all(register, SKETCHES)


@hookimpl
def register_models(register: Register) -> None:
    _register_all(register, MODELS)


@hookimpl
def register_encoders(register: Register) -> None:
    _register_all(register, ENCODERS)


@hookimpl
def register_regressors(register: Register) -> None:
    _register_all(register, REGRESSORS)
