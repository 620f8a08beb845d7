"""check_model on every built-in model, fitted on a tiny real set (MassBank spectra, ChEBI-20 descriptions), and
shown to catch broken models."""
from __future__ import annotations

from itertools import islice

import numpy as np
import pytest

from molpredict.errors import InputError, ModelFileError
from molpredict.models.base import Model, check_pairs
from molpredict.registry import get_registry
from molpredict.testing import check_model

#: every built-in model with settings small enough for two fits in seconds
SPECTRUM_MODELS = [
    "iokr:lam=1e-3",
    "siokr:input_sketch=subsample:m=20,lam=1e-3|1e-2",
    "isokr:output_sketch=subsample:m=10,lam=1e-3",
    "sisokr:input_sketch=subsample:m=20,output_sketch=p-sparsified-rademacher:m=8,lam=1e-3",
    "dsokr:encoder=kernel-mlp:n_landmarks=20;layers=0;whiten=true,output_sketch=subsample:m=10,epochs=3",
    "okr-robust:input_sketch=subsample:m=20,output_sketch=subsample:m=10,max_iter=5",
    "random",
    "prior",
    "fingerprint-ffn:max_epochs=2,hidden=16",
    "fingerprint-ffn:max_epochs=2,hidden=16,scoring=likelihood",
    "library-knn:k=3",
]
TEXT_MODELS = [
    "sisokr:input_kernel=text-ngram,output_kernel=fingerprint-cosine:chiral=true,input_sketch=none,"
    "output_sketch=none,lam=1e-3",
    "dsokr:encoder=kernel-mlp:input_kernel=text-ngram;n_landmarks=20;layers=0;whiten=true,"
    "output_sketch=subsample:m=10,epochs=3",
]


def _model(spec: str) -> Model:
    from molpredict.training.pipeline import build_model
    return build_model(spec, {"device": "cpu", "seed": 0})


@pytest.fixture(scope="module")
def real_spectra():
    from conftest import require_shared
    from molpredict.chem.molecules import Molecule
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import read_spectra
    cleaning = CleaningPipeline()
    spectra, molecules = [], []
    for spectrum in islice(read_spectra(require_shared("massbank", "train_pos.mgf")), 400):
        cleaned = cleaning(spectrum)
        if cleaned is None or not cleaned.n_peaks or not spectrum.smiles:
            continue
        molecule = Molecule.from_smiles(spectrum.smiles)
        if len({m.inchikey for m in molecules} | {molecule.inchikey}) > 12 and molecule.inchikey not in \
                {m.inchikey for m in molecules}:
            continue  # a few spectra per structure, as in real training sets
        spectra.append(cleaned)
        molecules.append(molecule)
        if len(spectra) == 40:
            break
    return spectra, molecules


@pytest.fixture(scope="module")
def real_texts():
    from conftest import require_shared
    from molpredict.io.text_pairs import PairsReport, read_text_pairs
    path = require_shared("chebi20", "test.tsv")
    pairs = list(islice(read_text_pairs(path, PairsReport(), {}), 30))
    return [p.description for p in pairs], [p.molecule for p in pairs]


def test_every_builtin_model_is_covered():
    """A new built-in model must be added to the conformance lists above."""
    builtin = {e.name for e in get_registry().entries() if e.kind == "model" and e.provider == "molpredict"}
    covered = {spec.split(":")[0] for spec in SPECTRUM_MODELS + TEXT_MODELS}
    assert builtin <= covered, f"not in the model conformance suite: {sorted(builtin - covered)}"


@pytest.mark.shared
@pytest.mark.parametrize("spec", SPECTRUM_MODELS)
def test_spectrum_model_conformance(spec, real_spectra):
    check_model(_model(spec), *real_spectra)


@pytest.mark.shared
@pytest.mark.parametrize("spec", TEXT_MODELS)
def test_text_model_conformance(spec, real_texts):
    check_model(_model(spec), *real_texts)


# -- check_model catches broken models --------------------------------------------------------------------

class _Linear(Model):
    """A toy model on vectors: coordinates are the inputs themselves (scaled), candidates the molecules' vectors."""

    def __init__(self, defect: str = "", seed: int = 0) -> None:
        self.defect = defect
        self.seed = seed

    def fit(self, inputs, molecules, val=None):
        if self.defect != "accepts-unpaired":
            check_pairs(inputs, molecules)
        rng = np.random.default_rng(None if self.defect == "random" else self.seed)
        self.scale_ = float(rng.uniform(1, 2))
        return self

    def predict_coordinates(self, inputs):
        out = np.asarray(inputs, dtype=np.float64) * self.scale_
        return out[:, :1] if self.defect == "shape" else out

    def candidate_coordinates(self, molecules):
        return np.asarray(molecules, dtype=np.float64)

    def get_state(self):
        return {}, {"format": "linear", "scale": self.scale_ + (1.0 if self.defect == "state" else 0.0)}

    @classmethod
    def from_state(cls, arrays, metadata):
        if metadata.get("format") != "linear":
            raise ModelFileError("not a linear model state")
        model = cls()
        model.scale_ = metadata["scale"]
        return model


VECTORS = [np.array([1.0, float(i)]) for i in range(6)]


def test_check_model_passes_a_correct_model():
    check_model(_Linear(), VECTORS, VECTORS)


@pytest.mark.parametrize("defect, message", [("shape", "shapes"), ("random", "determinism"),
                                             ("state", "save -> load"), ("accepts-unpaired", "bad input")])
def test_check_model_catches(defect, message):
    with pytest.raises(AssertionError, match=message):
        check_model(_Linear(defect), VECTORS, VECTORS)


def test_check_pairs_is_an_input_error():
    with pytest.raises(InputError, match="pair one to one"):
        check_pairs([1, 2], [1])
    with pytest.raises(InputError, match="at least 2"):
        check_pairs([1], [1], minimum=2)
