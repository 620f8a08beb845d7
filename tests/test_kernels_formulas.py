"""Formula-annotation kernel, MKL and multi-fingerprint kernels against naive references: brute-force sub-formula
enumeration, dictionary bags, explicit weighted sums, a grid search for ALIGNF, element-wise fingerprint sums."""
from __future__ import annotations

import contextlib
import functools
import json
import itertools
import math
import warnings

import numpy as np
import pytest

from molpredict.errors import SpecError
from molpredict.chem.formulas import (element_key, explain_masses, formula_key, ion_formula, precursor_ion_formula,
                                 subformula_table)
from molpredict.kernels.base import DegenerateObjectWarning
from molpredict.kernels.formulas import FormulaAnnotationKernel
from molpredict.kernels.mkl import (MKLKernel, alignf_weights, centered_alignment, split_kernel_list)
from molpredict.kernels.multifingerprint import MultiFingerprintKernel
from molpredict.component import frozen_spec
from molpredict.chem.molecules import ELECTRON_MASS, Molecule, adduct_composition, fingerprint_matrix, formula_mass
from molpredict.registry import get_registry
from molpredict.spectra.record import Spectrum
from molpredict.testing import check_kernel

VALENCE = {"C": 4, "N": 3, "P": 3, "O": 2, "S": 2, "H": 1, "Cl": 1, "Na": 1}
FORMULAS = [("C8H10N4O2", "[M+H]+"), ("C13H18O2", "[M+Na]+"), ("C6H8N2O2S", "[M+H]+"), ("C6H5ClO", "[M-H]-"),
            ("C9H11NO3", None), ("C10H13N5O4", "[M-H2O+H]+")]


# ---------------------------------------------------------------------------------------------------------
# formula math
# ---------------------------------------------------------------------------------------------------------
def test_adduct_composition_and_ion_formula_by_hand():
    assert adduct_composition("[M+H]+") == (1, {"H": 1}, 1)
    assert adduct_composition("[M-H2O+H]+") == (1, {"H": -1, "O": -1}, 1)
    assert adduct_composition("[M+FA-H]-") == (1, {"C": 1, "H": 1, "O": 2}, -1)
    assert adduct_composition("[2M+Na]+") == (2, {"Na": 1}, 1)
    assert ion_formula("C8H10N4O2", "[M+H]+") == {"C": 8, "H": 11, "N": 4, "O": 2}
    assert ion_formula("C2H6O", "[2M+Na]+") == {"C": 4, "H": 12, "O": 2, "Na": 1}
    assert ion_formula("C6H6", "[M-H2O+H]+") is None  # no oxygen to lose


def test_formula_key_is_linear_and_distinguishes():
    a, b = {"C": 3, "H": 7, "O": 1}, {"C": 1, "H": 2}
    diff = {"C": 2, "H": 5, "O": 1}
    assert (int(formula_key(a)) - int(formula_key(b))) % 2 ** 64 == int(formula_key(diff))
    assert formula_key({"C": 1, "H": 4}) != formula_key({"C": 4, "H": 1})
    assert int(element_key("C")) % 2 == 1


def test_precursor_ion_formula_infers_the_adduct_from_the_precursor_mz():
    mass = formula_mass("C9H11NO3")
    sodium = Spectrum("s", [100.0], [1.0], precursor_mz=mass + formula_mass("Na") - ELECTRON_MASS,
                      ion_mode="positive", metadata={"formula": "C9H11NO3"})
    assert precursor_ion_formula(sodium) == ({"C": 9, "H": 11, "N": 1, "O": 3, "Na": 1}, 1)
    assert precursor_ion_formula(Spectrum("s", [100.0], [1.0], precursor_mz=200.0)) is None  # no formula


def _naive_subformulas(ion: dict[str, int]) -> list:
    return _naive_subformulas_of(tuple(sorted(ion.items())))


@functools.lru_cache(maxsize=None)
def _naive_subformulas_of(items: tuple) -> list:
    return list(_enumerate_subformulas(dict(items)))


def _enumerate_subformulas(ion: dict[str, int]):
    elements = sorted(ion)
    for combo in itertools.product(*[range(ion[e] + 1) for e in elements]):
        counts = {e: n for e, n in zip(elements, combo) if n}
        if not counts:
            continue
        mass = sum(n * formula_mass(e) for e, n in counts.items())
        rdbe = 1 + sum(n * (VALENCE[e] - 2) / 2 for e, n in counts.items())
        yield counts, mass, rdbe


@pytest.mark.parametrize("formula,adduct", [("C8H10N4O2", "[M+H]+"), ("C6H8N2O2S", "[M+H]+"),
                                            ("C13H18O2", "[M+Na]+")])
def test_explain_masses_matches_brute_force(formula, adduct):
    ion = ion_formula(formula, adduct)
    table = subformula_table(ion)
    rng = np.random.default_rng(1)
    subs = list(_naive_subformulas(ion))
    masses = np.concatenate([[subs[i][1] for i in rng.choice(len(subs), 15)], rng.uniform(20, 200, 10)])
    masses += rng.normal(0, 0.001, masses.size)
    tol = np.maximum(0.003, 10e-6 * masses)
    index, keys, error = explain_masses(table, masses, tol)
    got = set(zip(index.tolist(), keys.tolist()))
    want = set()
    for i, m in enumerate(masses):
        for counts, mass, rdbe in subs:
            if abs(mass - m) <= tol[i] and rdbe >= -0.5:
                want.add((i, int(formula_key(counts))))
    assert got == want and len(want) >= 10
    np.testing.assert_array_less(np.abs(error), tol[index] + 1e-9)


# ---------------------------------------------------------------------------------------------------------
# formula-annotation kernel
# ---------------------------------------------------------------------------------------------------------
def formula_spectra(seed: int = 0) -> list[Spectrum]:
    """Spectra whose peaks are exact sub-formula masses (+/- 2 ppm) of their ion, plus noise peaks; perturbed
    copies; one spectrum without formula."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (formula, adduct) in enumerate(FORMULAS * 2):
        spectrum0 = Spectrum("tmp", [1.0], [1.0], ion_mode="negative" if adduct and adduct.endswith("-") else
                             "positive", adduct=adduct, metadata={"formula": formula})
        mass = formula_mass(formula)
        spectrum0.precursor_mz = mass + 1.007276
        ion, sign = precursor_ion_formula(spectrum0)
        subs = [s for s in _naive_subformulas(ion) if s[2] >= -0.5 and s[1] > 30]
        pick = rng.choice(len(subs), 6, replace=False)
        mz = np.array([subs[j][1] - sign * ELECTRON_MASS for j in pick]) * (1 + rng.normal(0, 2e-6, 6))
        mz = np.sort(np.concatenate([mz, rng.uniform(30, mass, 2)]))
        inten = rng.uniform(1, 100, mz.size)
        for copy in range(2):
            jitter = 1 + rng.normal(0, 1e-6, mz.size) if copy else 1.0
            out.append(Spectrum(f"s{i}-{copy}", mz * jitter, inten * rng.uniform(0.5, 2, mz.size),
                                precursor_mz=spectrum0.precursor_mz, ion_mode=spectrum0.ion_mode,
                                adduct=adduct, mz_precision=1e-4, metadata={"formula": formula}))
    out.append(Spectrum("no-formula", [50.0, 80.0], [1.0, 2.0], precursor_mz=200.0, ion_mode="positive"))
    return out


def _naive_formula_string(counts: dict[str, int]) -> str:
    return "".join(f"{e}{counts[e]}" for e in sorted(counts) if counts[e])


def naive_bags(spectrum: Spectrum, ppm=10.0, tol=0.005, power=0.5, closest=True):
    frags, losses = {}, {}
    ion_sign = precursor_ion_formula(spectrum)
    if ion_sign is None:
        return frags, losses
    ion, sign = ion_sign
    mz = spectrum.mz
    rel = spectrum.intensities / spectrum.intensities.max()
    subs = [s for s in _naive_subformulas(ion) if s[2] >= -0.5]
    for m, r in zip(mz, rel):
        target = m + sign * ELECTRON_MASS
        width = max(tol, ppm * 1e-6 * m)
        hits = [(abs(mass - target), counts) for counts, mass, _ in subs if abs(mass - target) <= width]
        if not hits:
            continue
        chosen = [min(hits, key=lambda h: h[0])[1]] if closest else [h[1] for h in hits]
        for counts in chosen:
            w = r ** power / len(chosen)
            f = _naive_formula_string(counts)
            frags[f] = frags.get(f, 0.0) + w
            loss = {e: ion[e] - counts.get(e, 0) for e in ion}
            if any(loss.values()):
                lf = _naive_formula_string(loss)
                losses[lf] = losses.get(lf, 0.0) + w
    return frags, losses


def _cos(a: dict, b: dict) -> float:
    na, nb = math.sqrt(sum(v * v for v in a.values())), math.sqrt(sum(v * v for v in b.values()))
    if na == 0 or nb == 0:
        return 0.0
    return sum(v * b.get(k, 0.0) for k, v in a.items()) / (na * nb)


def naive_formula_gram(spectra: list[Spectrum], loss_weight=0.5, closest=True) -> np.ndarray:
    bags = [naive_bags(s, closest=closest) for s in spectra]
    n = len(spectra)
    out = np.eye(n)
    for i, j in itertools.permutations(range(n), 2):
        (fa, la), (fb, lb) = bags[i], bags[j]
        da = (1 - loss_weight) * bool(fa) + loss_weight * bool(la)
        db = (1 - loss_weight) * bool(fb) + loss_weight * bool(lb)
        if da > 0 and db > 0:
            out[i, j] = ((1 - loss_weight) * _cos(fa, fb) + loss_weight * _cos(la, lb)) / math.sqrt(da * db)
    return out


@pytest.mark.parametrize("explanations,loss_weight", [("closest", 0.5), ("all", 0.5), ("closest", 0.0)])
def test_formula_kernel_matches_naive(explanations, loss_weight):
    spectra = formula_spectra()
    kernel = FormulaAnnotationKernel(explanations=explanations, loss_weight=loss_weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        gram = kernel.fit(spectra).gram()
    naive = naive_formula_gram(spectra, loss_weight, explanations == "closest")
    np.testing.assert_allclose(gram, naive, atol=1e-12)
    # the copies (same peaks, other intensities) are alike, different formulas much less so
    assert gram[0, 1] > 0.9 and gram[0, 2] < 0.5


def test_formula_kernel_without_formula_is_degenerate():
    spectra = formula_spectra()
    kernel = FormulaAnnotationKernel().fit(spectra[:-1])
    with pytest.warns(DegenerateObjectWarning, match="1 of 1"):
        row = kernel.transform(spectra[-1:])
    assert np.all(row == 0)


def test_formula_kernel_conformance():
    check_kernel(FormulaAnnotationKernel(), formula_spectra(), n_sample=14)
    check_kernel(FormulaAnnotationKernel(explanations="all", intensity_power=0), formula_spectra(1), n_sample=14)


@pytest.mark.parametrize("bad", ["ppm=0", "explanations=best", "loss_weight=2", "intensity_power=-1"])
def test_formula_kernel_rejects_bad_parameters(bad):
    with pytest.raises(SpecError):
        get_registry().create("input_kernel", f"formula-annotation:{bad}")


# ---------------------------------------------------------------------------------------------------------
# MKL
# ---------------------------------------------------------------------------------------------------------
def test_split_kernel_list():
    assert split_kernel_list("ppk-losses:loss_weight=0.3&ppm=5+formula-annotation+cosine:tolerance=0.02") == [
        "ppk-losses:loss_weight=0.3,ppm=5", "formula-annotation", "cosine:tolerance=0.02"]
    with pytest.raises(SpecError):
        split_kernel_list("ppk++cosine")
    with pytest.raises(SpecError):
        get_registry().create("input_kernel", "mkl:kernels=ppk+cosine,weights=1+2+3")


def test_mkl_and_multi_fingerprint_specs_survive_nested_spec():
    """Models create kernels through nystrom.create_component, which reads every ';' of a spec as ','."""
    from molpredict.engine.nystrom import create_component

    kernel = create_component("input_kernel", "mkl:kernels=ppk-losses:loss_weight=0.3&ppm=5+formula-annotation,"
                              "weights=0.25+0.75")
    assert kernel._specs == ["ppk-losses:loss_weight=0.3,ppm=5", "formula-annotation"]
    np.testing.assert_allclose(kernel._fixed, [0.25, 0.75])
    assert len(create_component("output_kernel", "multi-fingerprint:fps=morgan2+maccs")._kernels) == 2


def _labelled(spectra: list[Spectrum]) -> list[Spectrum]:
    smiles = {"C8H10N4O2": "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "C13H18O2": "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
              "C6H8N2O2S": "Nc1ccc(cc1)S(N)(=O)=O", "C6H5ClO": "Oc1ccc(Cl)cc1", "C9H11NO3": "NC(Cc1ccc(O)cc1)C(O)=O",
              "C10H13N5O4": "Nc1ncnc2n(cnc12)C1OC(CO)C(O)C1O"}
    for s in spectra:
        if s.formula:
            s.metadata["smiles"] = smiles[s.formula]
    return spectra


def test_mkl_is_the_renormalised_weighted_sum():
    spectra = formula_spectra()
    kernel = MKLKernel("ppk-losses+formula-annotation+cosine:tolerance=0.02", weights="1+2+1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        gram = kernel.fit(spectra).gram()
        parts = [get_registry().create("input_kernel", s).fit(spectra).gram()
                 for s in ("ppk-losses", "formula-annotation", "cosine:tolerance=0.02")]
    w = np.array([0.25, 0.5, 0.25])
    # every spectrum is described by each kernel except the last one (no formula) by formula-annotation
    d = np.full(len(spectra), 1.0)
    d[-1] = 0.5
    naive = sum(wi * p for wi, p in zip(w, parts))
    naive = naive / np.sqrt(d[:, None] * d[None, :])
    np.fill_diagonal(naive, 1.0)
    np.testing.assert_allclose(gram, naive, atol=1e-12)
    # the spectrum without a formula is compared by ppk-losses and cosine alone
    np.testing.assert_allclose(gram[-1, :-1], (0.25 * parts[0][-1, :-1] + 0.25 * parts[2][-1, :-1]) / 0.5 ** 0.5 /
                               np.sqrt(d[:-1]), atol=1e-12)


def test_centered_alignment_and_alignf_by_hand():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    Y = X[:, :1] @ X[:, :1].T
    K1, K2 = X @ X.T, np.eye(12)
    n = 12
    H = np.eye(n) - np.ones((n, n)) / n
    naive = np.sum((H @ K1 @ H) * (H @ Y @ H)) / (np.linalg.norm(H @ K1 @ H) * np.linalg.norm(H @ Y @ H))
    assert centered_alignment(K1, Y) == pytest.approx(naive)
    # ALIGNF maximises the alignment of the combination over the simplex: check on a fine grid
    w = alignf_weights([K1, K2], Y)
    grid = np.linspace(0, 1, 2001)
    best = grid[np.argmax([centered_alignment(t * K1 + (1 - t) * K2, Y) for t in grid])]
    assert w.sum() == pytest.approx(1.0) and w[0] == pytest.approx(best, abs=1e-3)


@pytest.mark.parametrize("weights", ["alignment", "alignf"])
def test_mkl_learnt_weights_freeze_into_the_spec(weights):
    spectra = _labelled(formula_spectra())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        kernel = MKLKernel("ppk-losses+formula-annotation", weights=weights).fit(spectra)
        w = np.array([float(x) for x in kernel.weights_.split("+")])
        assert w.sum() == pytest.approx(1.0) and np.all(w >= 0)
        if weights == "alignment":
            a = np.maximum(kernel.alignments_, 0)
            np.testing.assert_allclose(w, a / a.sum())
        spec = str(frozen_spec(kernel))
        rebuilt = get_registry().create("input_kernel", spec).fit(spectra[:10])
        np.testing.assert_allclose(rebuilt.transform(spectra[10:]), kernel.transform(spectra[10:])[:, :10],
                                   atol=1e-12)
    with pytest.raises(SpecError, match="structure"):
        MKLKernel("ppk+cosine", weights=weights).fit(formula_spectra())  # no smiles: nothing to align with


def test_mkl_conformance():
    check_kernel(MKLKernel("ppk-losses+formula-annotation+cosine"), formula_spectra(), n_sample=14)


# ---------------------------------------------------------------------------------------------------------
# multi-fingerprint
# ---------------------------------------------------------------------------------------------------------
SMILES = ["CCO", "c1ccccc1O", "CC(=O)O", "CCN", "CC", "c1ccc2ccccc2c1", "OCC(O)C(O)C(O)C(O)CO",
          "CC(C)NCC(O)c1ccc(O)cc1", "C1CC1CC(C)N", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "OC(=O)CCC(=O)O", "[Na+]"]


def _naive_t(a: np.ndarray, b: np.ndarray) -> float:
    union = np.maximum(a, b).sum()
    return 1.0 if union == 0 else float(np.minimum(a, b).sum() / union)


def test_multi_fingerprint_matches_naive():
    mols = [Molecule.from_smiles(s) for s in SMILES]
    kernel = MultiFingerprintKernel("morgan1c+morgan2+maccs+rdkit", gamma=0.7, size=1024).fit(mols)
    fps = [fingerprint_matrix(mols, "morgan", radius=1, size=1024, counts=True),
           fingerprint_matrix(mols, "morgan", radius=2, size=1024), fingerprint_matrix(mols, "maccs"),
           fingerprint_matrix(mols, "rdkit", size=1024)]
    n = len(mols)
    naive = np.array([[math.exp(-0.7 * (2 - 2 * np.mean([_naive_t(f[i], f[j]) for f in fps]))) for j in range(n)]
                      for i in range(n)])
    np.testing.assert_allclose(kernel.gram(), naive, atol=1e-12)
    assert np.linalg.eigvalsh(naive).min() > -1e-10  # PSD


def test_multi_fingerprint_of_one_fingerprint_is_gaussian_tanimoto():
    mols = [Molecule.from_smiles(s) for s in SMILES]
    one = MultiFingerprintKernel("morgan2").fit(mols)
    ref = get_registry().create("output_kernel", "gaussian-tanimoto").fit(mols)
    assert one.gamma_ == pytest.approx(ref.gamma_)
    np.testing.assert_allclose(one.gram(), ref.gram(), atol=1e-12)


@pytest.mark.parametrize("fps", ["", "morgan2+morgan2", "ecfp4", "maccsc", "morgan2;maccs"])
def test_multi_fingerprint_rejects_bad_lists(fps):
    with pytest.raises(SpecError):
        MultiFingerprintKernel(fps)


def test_training_fills_in_the_formula_from_the_label(tmp_path):
    from molpredict.io import write_mgf
    from molpredict.training.pipeline import TrainOptions, load_labelled

    spectra = [Spectrum("a", [58.07, 100.0], [1.0, 2.0], precursor_mz=196.1, charge=1, ion_mode="positive",
                        metadata={"smiles": "CN1C=NC2=C1C(=O)N(C(=O)N2C)C"}),
               Spectrum("b", [58.07, 100.0], [1.0, 2.0], precursor_mz=196.1, charge=1, ion_mode="positive",
                        metadata={"smiles": "CCO", "formula": "C2H6O"})]
    write_mgf(spectra, tmp_path / "t.mgf")
    data = load_labelled([tmp_path / "t.mgf"], TrainOptions())
    assert [s.formula for s in data.spectra["positive"]] == ["C8H10N4O2", "C2H6O"]


def test_sisokr_with_mkl_and_multi_fingerprint_round_trips():
    """The kernels work inside SISOKR and a reloaded model (kernels rebuilt from their frozen specs on the
    landmarks) predicts the same coordinates."""
    from molpredict.models.okr import SISOKR

    spectra = _labelled(formula_spectra())[:-1]
    molecules = [Molecule.from_smiles(s.smiles) for s in spectra]
    model = SISOKR(input_kernel="mkl:kernels=ppk-losses+formula-annotation,weights=alignf",
                   output_kernel="multi-fingerprint:fps=morgan2+morgan1c", input_sketch="subsample:m=10",
                   output_sketch=None, lam=1e-3, device="cpu")
    model.fit(spectra, molecules)
    arrays, meta = model.get_state()
    reloaded = SISOKR.from_state(arrays, json.loads(json.dumps(meta)))
    np.testing.assert_allclose(reloaded.predict_coordinates(spectra), model.predict_coordinates(spectra), atol=1e-8)
    assert "weights=" in reloaded.input_kernel_spec_ and "alignf" not in reloaded.input_kernel_spec_


def test_mkl_cleans_each_spectrum_once_and_its_rows_are_those_cleaned_per_kernel(monkeypatch):
    """The default kernel's three sub-kernels read the same spectra: MKL featurisation cleans each once (the memo of
    ``peaks_cleaned_once``), and the rows equal those computed with a fresh cleaning per sub-kernel."""
    import molpredict.kernels.spectra as spectra_module

    spectra = formula_spectra()
    # an unsorted spectrum with a zero and a NaN peak: cleaning changes its arrays, so the memo must give the cleaned
    unsorted = Spectrum("u", np.array([150.0, 60.0, 91.05, 120.0]), np.array([5.0, 0.0, 20.0, np.nan]),
                        precursor_mz=195.087, ion_mode="positive", adduct="[M+H]+",
                        metadata={"formula": "C8H10N4O2"})
    spectra.append(unsorted)
    kernel = MKLKernel("ppk-losses+formula-annotation+ppk-pairs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        calls = []
        original = spectra_module._cleaned
        monkeypatch.setattr(spectra_module, "_cleaned", lambda s: calls.append(s.id) or original(s))
        kernel.fit(spectra[:4])  # the fit too: each landmark cleaned once
        assert sorted(calls) == sorted(s.id for s in spectra[:4])
        calls.clear()
        shared = kernel.transform(spectra)
        assert sorted(calls) == sorted(s.id for s in spectra)  # once each (four times each without the memo)
        monkeypatch.setattr(spectra_module, "peaks_cleaned_once", contextlib.nullcontext)
        monkeypatch.setattr("molpredict.kernels.mkl.peaks_cleaned_once", contextlib.nullcontext)
        calls.clear()
        separate = kernel.transform(spectra)
        assert len(calls) >= 3 * len(spectra)  # peaks, losses, pairs (and the formula bags of those with one)
    np.testing.assert_array_equal(shared, separate)
    # the memo lives for the block only, and knows a spectrum by its arrays: new arrays are cleaned anew
    monkeypatch.undo()
    assert spectra_module._CLEANING.memo is None
    with spectra_module.peaks_cleaned_once():
        first = spectra_module._clean_peaks(unsorted)
        np.testing.assert_array_equal(first[0], [91.05, 150.0])
        np.testing.assert_array_equal(first[1], [1.0, 0.25])
        assert spectra_module._clean_peaks(unsorted)[0] is first[0]
        unsorted.mz = np.array([10.0, 20.0, 30.0, 40.0])
        np.testing.assert_array_equal(spectra_module._clean_peaks(unsorted)[0], [10.0, 30.0])


@pytest.mark.parametrize("explanations", ["all", "closest"])
def test_formula_bags_of_a_batch_are_each_spectrums_own_bags(explanations):
    """formula_bags explains the spectra of one ion formula in one call (here the same formulas come back
    interleaved with others, and one spectrum has no formula): each spectrum's bags equal those of the spectrum
    alone, bit for bit."""
    from molpredict.kernels.formulas import formula_bags

    spectra = formula_spectra(seed=3)
    order = np.random.default_rng(5).permutation(len(spectra))
    batch = [spectra[i] for i in order]
    fragments, losses = formula_bags(batch, explanations=explanations)
    for row, spectrum in enumerate(batch):
        alone_fragments, alone_losses = formula_bags([spectrum], explanations=explanations)
        for together, alone in ((fragments, alone_fragments), (losses, alone_losses)):
            lo, hi = together.offsets[row], together.offsets[row + 1]
            np.testing.assert_array_equal(together.keys[lo:hi], alone.keys)
            np.testing.assert_array_equal(together.values[lo:hi], alone.values)
    assert fragments.offsets[-1] > 0 and losses.offsets[-1] > 0
