"""Test helpers for the identification pipeline: a small, real (if crude) model registered by a throw-away plugin.

``FingerprintRidge`` regresses folded Morgan fingerprints on binned spectra (ridge, closed form). It is cheap,
deterministic and learns something, so the train -> save -> load -> identify -> evaluate path can be tested
independently of the kernel models. It counts ``candidate_coordinates`` calls (the cache test needs that).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from molpredict.hookspecs import hookimpl
from molpredict.models.base import Model
from molpredict.registry import Registry, reset_registry

FAKE_MODEL = "fake-fp-ridge"


def binned(spectra: Sequence[Any], n_bins: int, max_mz: float) -> np.ndarray:
    """sqrt-intensity histograms of peak m/z, rows L2-normalised, shape (n, n_bins)."""
    out = np.zeros((len(spectra), n_bins))
    for i, s in enumerate(spectra):
        mz = np.asarray(s.mz, dtype=float)
        inten = np.sqrt(np.clip(np.asarray(s.intensities, dtype=float), 0, None))
        keep = (mz >= 0) & (mz < max_mz)
        np.add.at(out[i], (mz[keep] / max_mz * n_bins).astype(int), inten[keep])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms > 0, norms, 1.0)


class FingerprintRidge(Model):
    """Ridge regression from binned spectra to normalised folded Morgan fingerprints (a test model)."""

    calls: list[int] = []  # sizes of candidate_coordinates calls, across instances

    def __init__(self, dim: int = 128, n_bins: int = 200, max_mz: float = 1000.0, lam: Any = 1.0,
                 input_kernel: str | None = None, output_kernel: str | None = None,
                 input_sketch: str | None = None, output_sketch: str | None = None,
                 device: str = "cpu", seed: int = 0) -> None:
        self.dim = dim
        self.n_bins = n_bins
        self.max_mz = max_mz
        self.lam = lam
        self.input_kernel = input_kernel
        self.output_kernel = output_kernel
        self.input_sketch = input_sketch
        self.output_sketch = output_sketch
        self.device = device
        self.seed = seed

    def _targets(self, molecules: Sequence[Any]) -> np.ndarray:
        fps = np.stack([np.asarray(m.fingerprint("morgan", radius=2, size=self.dim), dtype=float)
                        for m in molecules]) if len(molecules) else np.zeros((0, self.dim))
        norms = np.linalg.norm(fps, axis=1, keepdims=True)
        return fps / np.where(norms > 0, norms, 1.0)

    def _solve(self, X: np.ndarray, Y: np.ndarray, lam: float) -> np.ndarray:
        return np.linalg.solve(X.T @ X + lam * len(X) * np.eye(X.shape[1]), X.T @ Y)

    def fit(self, inputs, molecules, val=None):
        X = binned(inputs, self.n_bins, self.max_mz)
        Y = self._targets(molecules)
        grid = [float(v) for v in str(self.lam).split("|")]
        self.selection_ = []
        best = None
        for lam in grid:
            W = self._solve(X, Y, lam)
            if val is not None:
                loss = float(np.mean(np.sum((binned(val[0], self.n_bins, self.max_mz) @ W
                                             - self._targets(val[1])) ** 2, axis=1)))
            else:
                loss = float(np.mean(np.sum((X @ W - Y) ** 2, axis=1)))
            self.selection_.append({"lam": lam, "loss": loss})
            if best is None or loss < best[0]:
                best = (loss, lam, W)
        self.lam_ = best[1]
        self.W_ = best[2]
        return self

    def predict_coordinates(self, inputs):
        return binned(inputs, self.n_bins, self.max_mz) @ self.W_

    def candidate_coordinates(self, molecules):
        FingerprintRidge.calls.append(len(molecules))
        return self._targets(list(molecules))

    def kernel_loss(self, inputs, molecules) -> float:
        return float(np.mean(np.sum((self.predict_coordinates(inputs) - self._targets(molecules)) ** 2, axis=1)))

    def get_state(self):
        return ({"input_W": self.W_, "output_dim": np.array([self.dim])},
                {"params": {"dim": self.dim, "n_bins": self.n_bins, "max_mz": self.max_mz, "lam": self.lam,
                            "seed": self.seed},
                 "lam_": self.lam_, "output": {"fingerprint": "morgan", "radius": 2, "dim": self.dim}})

    @classmethod
    def from_state(cls, arrays, metadata):
        model = cls(**metadata["params"])
        model.W_ = np.asarray(arrays["input_W"], dtype=float)
        model.lam_ = metadata["lam_"]
        if model.W_.shape != (model.n_bins, model.dim):
            raise ValueError(f"input_W has shape {model.W_.shape}")
        return model


class _Plugin:
    __name__ = "identification-test-plugin"

    @hookimpl
    def register_models(self, register):
        register(FAKE_MODEL, FingerprintRidge)


def install_fake_model() -> Registry:
    """Make the process-wide registry the built-ins plus :class:`FingerprintRidge` (conftest resets it)."""
    registry = Registry(load_external=False, extra_plugins=[_Plugin()])
    reset_registry(registry)
    FingerprintRidge.calls = []
    return registry


SMILES = [
    "CC1Cc2cccc(O)c2C(=O)O1", "O=C(O)/C=C/c1ccc(O)c(O)c1", "Cn1c(=O)c2c(ncn2C)n(C)c1=O", "NCCCNCCCCNCCCN",
    "CC(=O)Oc1ccccc1C(=O)O", "OC[C@H]1OC(O)[C@H](O)[C@@H](O)[C@@H]1O", "c1ccc2c(c1)[nH]c1ccccc12",
    "CC(C)Cc1ccc(C(C)C(=O)O)cc1", "O=c1cc(-c2ccc(O)cc2)oc2cc(O)cc(O)c12", "NC(Cc1ccccc1)C(=O)O",
    "CC(=O)Nc1ccc(O)cc1", "CCN(CC)CC",
]


def synthetic_spectra(n_per: int = 3, seed: int = 0, ion_mode: str = "positive"):
    """Spectra whose peaks are a deterministic function of the structure (plus noise), with SMILES metadata.

    Returns (spectra, molecules): one ``Molecule`` per spectrum.
    """
    from molpredict.chem.molecules import Molecule
    from molpredict.spectra.record import Spectrum

    rng = np.random.default_rng(seed)
    spectra, molecules = [], []
    for j, smi in enumerate(SMILES):
        mol = Molecule.from_smiles(smi)
        bits = np.flatnonzero(mol.fingerprint("morgan", radius=2, size=256))
        # fragments below the precursor (cleaning drops anything above it)
        base = 20.0 + bits[:12] / 256.0 * (mol.monoisotopic_mass - 25.0)
        for r in range(n_per):
            mz = np.sort(base + rng.normal(0, 0.001, size=len(base)))
            inten = 100 * rng.random(len(base)) + 10
            adduct = "[M+H]+" if ion_mode == "positive" else "[M-H]-"
            spectra.append(Spectrum(id=f"s{j}-{r}", mz=mz, intensities=inten,
                                    precursor_mz=mol.monoisotopic_mass + (1.007276 if ion_mode == "positive"
                                                                          else -1.007276),
                                    charge=1 if ion_mode == "positive" else -1, ion_mode=ion_mode, adduct=adduct,
                                    metadata={"smiles": mol.smiles, "inchikey": mol.inchikey,
                                              "formula": mol.formula, "compound_name": f"cmpd{j}",
                                              "license": "CC BY" if r % 2 == 0 else "CC BY-NC"}))
            molecules.append(mol)
    return spectra, molecules
