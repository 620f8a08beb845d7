"""The conformance suites of molpredict.testing run on every built-in component, and shown to catch broken ones."""
from __future__ import annotations

import numpy as np
import pytest

from molpredict.kernels.base import InputKernel
from molpredict.chem.molecules import Molecule
from molpredict.hookspecs import hookimpl
from molpredict.registry import Registry, get_registry, reset_registry
from molpredict.spectra.record import Spectrum
from molpredict.testing import check_kernel

# =========================================================================================================
# Kernels
# =========================================================================================================
SPECTRUM_KERNELS = ["ppk", "ppk-losses", "cosine", "ppk:mz_sigma=auto,ppm=10,int_sigma=0.3",
                    "ppk-losses:loss_weight=0.2,intensity_power=0", "formula-annotation",
                    "mkl:kernels=ppk-losses+formula-annotation+cosine,weights=uniform",
                    "ppk-pairs", "ppk-pairs:bin_width=none,top=5,min_diff=1,ppm=10",
                    "precursor", "precursor:width=none,defect_width=0.05", "mass-defect", "mass-defect:gamma=0.5",
                    "mkl:kernels=cosine+precursor+mass-defect:gamma=0.5+precursor:width=none&defect_width=0.05"]
MOLECULE_KERNELS = ["tanimoto", "gaussian-tanimoto", "tanimoto:counts=true,size=512",
                    "gaussian-tanimoto:fp=maccs", "fingerprint-cosine", "fingerprint-cosine:counts=false,chiral=true",
                    "wl-subtree", "nspd", "core-wl", "multi-fingerprint",
                    "multi-fingerprint:fps=morgan1c+morgan2c+morgan3c+maccs+rdkitc,gamma=0.5,size=512"]
CONFORMANCE_SMILES = [
    "CCO", "c1ccccc1O", "CC(=O)O", "CCN", "C", "O", "[Na+]", "CC", "CC(=O)[O-].[Na+]", "c1ccc2ccccc2c1",
    "OCC(O)C(O)C(O)C(O)CO", "CC(C)NCC(O)c1ccc(O)cc1", "C1CC1CC(C)N", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "CCO",
    "OC(=O)CCC(=O)O", "Nc1ncnc2[nH]cnc12", "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
]


def conformance_spectra(seed: int = 0, n: int = 16) -> list[Spectrum]:
    """Random spectra, perturbed copies of them (real matches), an empty one, one without precursor."""
    rng = np.random.default_rng(seed)
    base = []
    for i in range(n):
        k = int(rng.integers(1, 15))
        base.append(Spectrum(f"s{i}", np.sort(rng.uniform(50, 400, k)), rng.uniform(1, 1e4, k),
                             precursor_mz=None if i % 5 == 0 else 410.0 + i, mz_precision=1e-4))
    copies = [Spectrum(s.id + "'", s.mz + rng.normal(0, 0.003, s.n_peaks),
                       s.intensities * rng.uniform(0.5, 2, s.n_peaks), precursor_mz=s.precursor_mz, mz_precision=1e-4)
              for s in base]
    return base + copies + [Spectrum("empty", [], [], precursor_mz=300.0)]


def test_every_builtin_kernel_is_covered():
    """A new built-in kernel must be added to the conformance lists above."""
    registry = get_registry()
    covered = {spec.split(":")[0] for spec in SPECTRUM_KERNELS + MOLECULE_KERNELS}
    builtin = {e.name for e in registry.entries() if e.kind in ("input_kernel", "output_kernel")
               and e.provider == "molpredict" and isinstance(e.target, str)
               and e.target.startswith(("molpredict.kernels.spectra", "molpredict.kernels.fingerprints",
                                        "molpredict.kernels.graphs", "molpredict.kernels.formulas",
                                        "molpredict.kernels.mkl", "molpredict.kernels.multifingerprint",
                                        "molpredict.kernels.masses"))}
    assert builtin <= covered, f"not in the conformance suite: {sorted(builtin - covered)}"


@pytest.mark.parametrize("spec", SPECTRUM_KERNELS)
def test_spectrum_kernel_conformance(spec):
    check_kernel(get_registry().create("input_kernel", spec), conformance_spectra(), n_sample=20)


def test_greedy_cosine_conformance_without_psd():
    kernel = get_registry().create("input_kernel", "cosine:matching=greedy")
    assert kernel.psd is False
    check_kernel(kernel, conformance_spectra(), n_sample=20)


@pytest.mark.parametrize("spec", MOLECULE_KERNELS)
def test_molecule_kernel_conformance(spec):
    molecules = [Molecule.from_smiles(s) for s in CONFORMANCE_SMILES]
    check_kernel(get_registry().create("output_kernel", spec), molecules, n_sample=12)


# -- check_kernel catches broken kernels ------------------------------------------------------------------
class _Points(InputKernel):
    """A Gaussian kernel on numbers, with switches that break one property each."""

    def __init__(self, defect: str = "none") -> None:
        self.defect = defect

    def featurize(self, objects):
        return np.asarray(objects, dtype=np.float64)

    def pairwise(self, fa, fb):
        d = fa[:, None] - fb[None, :]
        k = np.exp(-d * d)
        if self.defect == "asymmetric":
            k = k * (1.0 + 0.1 * np.sign(d))
        elif self.defect == "not-psd":
            k = np.where(np.abs(d) < 1.5, 1.0, 0.0)  # a box kernel: not PSD in general
        elif self.defect == "random":
            k = k ** self.power_  # a valid kernel, but a different one after each fit
        elif self.defect == "blocks":
            k = k ** (1.0 + 0.01 * len(fa))  # depends on the block size
        elif self.defect == "hidden-state":
            k = k ** getattr(self, "_power", 1.0)
        return k

    def _fit_data_dependent(self, features):
        self.power_ = 1.0 + np.random.default_rng().uniform(0.0, 0.1)  # unseeded: not reproducible
        if self.defect == "hidden-state":
            self._power = 2.0  # fitted state outside the attributes ending in "_": lost in the saved state

    def self_similarity(self, features):
        if self.defect == "diagonal":
            return np.full(len(features), 4.0)
        return np.ones(len(features))


POINTS = [0.0, 0.3, 0.9, 1.4, 2.0, 2.2, 3.1, 4.0, 4.1, 5.5, 6.0, 7.2]


def test_check_kernel_passes_a_correct_kernel():
    check_kernel(_Points(), POINTS)


@pytest.mark.parametrize("defect,message", [
    ("asymmetric", "symmetry"),
    ("not-psd", "positive semi-definite"),
    ("random", "determinism"),
    ("blocks", "blocked computation"),
    ("diagonal", "unit diagonal"),
])
def test_check_kernel_catches(defect, message):
    with pytest.raises(AssertionError, match=message):
        check_kernel(_Points(defect), POINTS, n_sample=8)


class _PointsPlugin:
    __name__ = "conformance-points"

    @hookimpl
    def register_input_kernels(self, register):
        register("test-points", _Points)


def test_check_kernel_catches_fitted_state_that_is_not_saved():
    """A registered kernel is saved as its fitted attributes; state kept elsewhere is caught by the round trip."""
    reset_registry(Registry(load_external=False, extra_plugins=[_PointsPlugin()]))
    try:
        check_kernel(get_registry().create("input_kernel", "test-points"), POINTS)
        with pytest.raises(AssertionError, match="fitted state"):
            check_kernel(get_registry().create("input_kernel", "test-points:defect=hidden-state"), POINTS)
    finally:
        reset_registry()
