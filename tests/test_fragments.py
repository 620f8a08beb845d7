"""In-silico fragmentation and peak explanation (molpredict.chem.fragments): hand-enumerated fragment sets,
hand-computed ion masses, the vectorised score against a naive loop, invariances, storage, bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
from rdkit import Chem

from molpredict.errors import InputError, SpecError
from molpredict.chem.fragments import (HYDROGEN_MASS, FragmentScorer, fragment_structure, ion_carriers,
                                  load_fragment_sets, save_fragment_sets)
from molpredict.chem.molecules import ELECTRON_MASS, Molecule, formula_mass
from molpredict.spectra.record import Spectrum

from conftest import require_shared

PROTON = HYDROGEN_MASS - ELECTRON_MASS


def fragment_table(smiles: str, max_depth: int) -> dict[frozenset, tuple[str, int, int]]:
    fs = fragment_structure(smiles, max_depth, keep_atoms=True)
    return {frozenset(np.flatnonzero(fs.atoms[i]).tolist()): (fs.formula(i), int(fs.depth[i]),
                                                               int(fs.bonds_broken[i]))
            for i in range(fs.n_fragments)}


def test_ethanol_fragments_by_hand():
    # C0-C1-O2: cutting C0-C1 gives CH3 + CH2OH, cutting C1-O2 gives C2H5 + OH (depth 1, one bond each);
    # cutting both leaves the middle CH2 (depth 2, two bonds).
    assert fragment_table("CCO", 1) == {
        frozenset({0, 1, 2}): ("C2H6O", 0, 0),
        frozenset({0}): ("CH3", 1, 1), frozenset({1, 2}): ("CH3O", 1, 1),
        frozenset({0, 1}): ("C2H5", 1, 1), frozenset({2}): ("HO", 1, 1),
    }
    table = fragment_table("CCO", 2)
    assert len(table) == 6 and table[frozenset({1})] == ("CH2", 2, 2)


def test_ring_needs_two_cuts():
    # Cyclopropanol: the ring opens only by two of its three bonds (one cleavage, two bonds broken); the
    # C-O chain bond is one cleavage of one bond.
    fs = fragment_structure("OC1CC1", 1, keep_atoms=True)
    table = {frozenset(np.flatnonzero(fs.atoms[i]).tolist()): (int(fs.depth[i]), int(fs.bonds_broken[i]))
             for i in range(fs.n_fragments)}
    # Atoms: O0, C1, C2, C3 (ring C1-C2-C3).
    assert table[frozenset({0})] == (1, 1)
    assert table[frozenset({1, 2, 3})] == (1, 1)
    # Ring pairs: {C1-C2, C2-C3} frees C2; {C1-C2, C1-C3} frees O0C1 from C2C3; {C2-C3, C1-C3} frees C3.
    assert table[frozenset({2})] == (1, 2)
    assert table[frozenset({3})] == (1, 2)
    assert table[frozenset({2, 3})] == (1, 2)
    assert table[frozenset({0, 1})] == (1, 2)
    assert table[frozenset({0, 1, 3})] == (1, 2) and table[frozenset({0, 1, 2})] == (1, 2)
    assert len(table) == 1 + 8
    # No single ring bond detaches anything: every depth-1 fragment with ring atoms broke two ring bonds.
    assert fragment_table("C1CC1", 1) == {
        frozenset({0, 1, 2}): ("C3H6", 0, 0),
        frozenset({0}): ("CH2", 1, 2), frozenset({1}): ("CH2", 1, 2), frozenset({2}): ("CH2", 1, 2),
        frozenset({1, 2}): ("C2H4", 1, 2), frozenset({0, 2}): ("C2H4", 1, 2), frozenset({0, 1}): ("C2H4", 1, 2),
    }


def test_broken_bond_kinds_by_hand():
    # Acetaldehyde oxime O-methyl ether CC=NOC: atoms C0 C1 N2 O3 C4; bonds C0-C1 (single C-C), C1=N2
    # (double), N2-O3 and O3-C4 (single to a heteroatom).
    fs = fragment_structure("CC=NOC", 1, keep_atoms=True)
    kinds = {frozenset(np.flatnonzero(fs.atoms[i]).tolist()): fs.broken_by_type[i].tolist()
             for i in range(fs.n_fragments)}
    assert kinds[frozenset({0})] == [0, 1, 0, 0]
    assert kinds[frozenset({0, 1})] == [0, 0, 0, 1]
    assert kinds[frozenset({0, 1, 2})] == [1, 0, 0, 0]
    assert kinds[frozenset({4})] == [1, 0, 0, 0]
    # Benzene ring opening: two aromatic bonds.
    phenol = fragment_structure("Oc1ccccc1", 1)
    assert {tuple(row) for row in phenol.broken_by_type.tolist()} == {(0, 0, 0, 0), (1, 0, 0, 0), (0, 0, 2, 0)}


def test_fused_rings_cut_only_where_they_separate():
    # Naphthalene: two bonds of one ring separate only if the fusion bond is not one of them and the arc cut
    # off is on the other side of the fusion; every fragment is connected and its formula adds up.
    fs = fragment_structure("c1ccc2ccccc2c1", 2, keep_atoms=True)
    mol = Molecule("c1ccc2ccccc2c1").rdkit_mol
    for i in range(fs.n_fragments):
        atoms = np.flatnonzero(fs.atoms[i]).tolist()
        pieces = Chem.MolFragmentToSmiles(mol, atoms)
        assert "." not in pieces, pieces
    assert fs.masses[0] == pytest.approx(Molecule("c1ccc2ccccc2c1").monoisotopic_mass, abs=1e-9)


def test_masses_and_formulas_agree():
    fs = fragment_structure("CC(=O)Nc1ccc(O)cc1", 2)
    for i in range(fs.n_fragments):
        assert fs.masses[i] == pytest.approx(formula_mass(fs.formula(i)), abs=1e-9)
    assert fs.depth[0] == 0 and np.all(np.diff(fs.masses[1:]) >= 0)
    assert fs.up_to_depth(1).n_fragments == int((fs.depth <= 1).sum())


def spectrum(mz, intensities, adduct="[M+H]+", precursor=None, ion_mode=None, precision=None, id="q1"):
    return Spectrum(id, np.asarray(mz, float), np.asarray(intensities, float), precursor_mz=precursor,
                    adduct=adduct, ion_mode=ion_mode, mz_precision=precision)


def test_ion_masses_by_hand():
    # CH3O (CH2OH from ethanol) = 12 + 3 * 1.00782503207 + 15.99491461956 = 31.01838971577
    ch3o = 12.0 + 3 * 1.00782503207 + 15.99491461956
    scorer = FragmentScorer(max_h_shift=0, max_depth=1, depth_penalty=1.0)
    positive = scorer.explain_peaks(spectrum([ch3o + 1.00727646688], [1.0]), "CCO")
    assert [(p["formula"], p["fragment_formula"], p["carrier"]) for p in positive] == [("CH4O+", "CH3O", "+H")]
    assert positive[0]["ion_mz"] == pytest.approx(32.02566618, abs=1e-7)
    negative = scorer.explain_peaks(spectrum([30.01111325], [1.0], adduct="[M-H]-"), "CCO")
    assert [(p["formula"], p["fragment_formula"], p["carrier"]) for p in negative] == [("CH2O-", "CH3O", "-H")]
    assert negative[0]["ion_mz"] == pytest.approx(ch3o - 1.00727646688, abs=1e-7)
    # Sodium stays on a fragment of [M+Na]+: CH3O + Na - e = 54.00061 (and the same peak is no +H ion).
    sodiated = scorer.explain_peaks(spectrum([ch3o + 22.98976928 - ELECTRON_MASS], [1.0], adduct="[M+Na]+"), "CCO")
    assert [(p["formula"], p["carrier"]) for p in sodiated] == [("CH3NaO+", "+Na")]
    assert scorer.explain_peaks(spectrum([ch3o + 22.98976928], [1.0], adduct="[M+H]+"), "CCO") == []


def test_carriers():
    assert [c.label for c in ion_carriers("[M+H]+")] == ["+H"]
    assert [c.label for c in ion_carriers("[M+Na]+")] == ["+H", "+Na"]
    assert [c.label for c in ion_carriers("[M+NH4]+")] == ["+H", "+NH4"]
    assert [c.label for c in ion_carriers("[M-H2O+H]+")] == ["+H"]
    assert [c.label for c in ion_carriers("[M]+")] == ["+H", ""]
    assert [c.label for c in ion_carriers("[M-H]-")] == ["-H"]
    assert [c.label for c in ion_carriers("[M+Cl]-")] == ["-H", "+Cl"]
    assert [c.label for c in ion_carriers(None, "negative")] == ["-H"]
    assert ion_carriers("[M+H]+")[0].mass_shift == pytest.approx(PROTON)
    with pytest.raises(InputError, match="ion mode"):
        ion_carriers(None, None)
    with pytest.raises(InputError, match="adduct"):
        ion_carriers("[M+Xx]+")


def naive_score(scorer: FragmentScorer, spec: Spectrum, smiles: str) -> float:
    """The score by loops: each peak's best explanation over every fragment, carrier and hydrogen shift."""
    fs = fragment_structure(smiles, scorer.max_depth)
    carriers = ion_carriers(spec.adduct, spec.ion_mode)
    floor = max(scorer.min_tolerance_da, spec.mz_precision or 0.0)
    total = explained = 0.0
    for mz, intensity in zip(spec.mz, spec.intensities):
        tol = max(mz * scorer.tolerance_ppm * 1e-6, floor)
        if intensity <= 0 or (spec.precursor_mz is not None and mz > spec.precursor_mz + tol):
            continue
        peak = mz ** scorer.mz_power * intensity ** scorer.intensity_power
        best = 0.0
        for f in range(fs.n_fragments):
            for carrier in carriers:
                for h in range(-scorer.max_h_shift, scorer.max_h_shift + 1):
                    ion = fs.masses[f] + h * HYDROGEN_MASS + carrier.mass_shift
                    if scorer.h_shift_per_bond and abs(h) > fs.bonds_broken[f]:
                        continue
                    if abs(ion - mz) <= tol:
                        kinds = fs.broken_by_type[f]
                        w = (scorer.depth_penalty ** fs.bonds_broken[f] * scorer.h_shift_penalty ** abs(h)
                             * scorer.carbon_bond_penalty ** kinds[1] * scorer.aromatic_bond_penalty ** kinds[2]
                             * scorer.multiple_bond_penalty ** kinds[3])
                        best = max(best, w)
        total += peak
        explained += best * peak
    return explained / total if total > 0 else 0.0


CANDIDATES = ["CC(=O)Nc1ccc(O)cc1", "CC(=O)Nc1cccc(O)c1", "COC(=O)c1ccc(N)cc1", "CC(=O)Oc1ccc(N)cc1",
              "NCc1ccc(cc1)C(=O)O"]


@pytest.mark.parametrize("params", [
    {},
    {"max_depth": 1, "max_h_shift": 0, "depth_penalty": 1.0},
    {"max_h_shift": 1, "h_shift_penalty": 0.5, "intensity_power": 1.0, "mz_power": 1.0, "tolerance_ppm": 30.0},
    {"max_h_shift": 3, "h_shift_per_bond": True, "depth_penalty": 0.7},
    {"carbon_bond_penalty": 0.6, "aromatic_bond_penalty": 0.3, "multiple_bond_penalty": 0.2},
])
def test_score_matches_naive_loop(params):
    rng = np.random.default_rng(7)
    scorer = FragmentScorer(**params)
    # Paracetamol-like [M+H]+ fragment ions, a few near misses and random peaks.
    true_ions = [152.0706, 110.0600, 93.0335, 65.0386, 134.0600]
    mz = np.sort(np.concatenate([true_ions, np.array(true_ions[:2]) + 0.004, rng.uniform(40, 160, 12)]))
    spec = spectrum(mz, rng.uniform(1, 100, mz.shape[0]), precursor=152.0706, precision=0.0001)
    scores = scorer.score(spec, CANDIDATES)
    expected = [naive_score(scorer, spec, s) for s in CANDIDATES]
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-12)
    assert np.all((scores >= 0) & (scores <= 1))
    neg = spectrum(mz - 2 * PROTON, spec.intensities, adduct="[M-H]-")
    np.testing.assert_allclose(scorer.score(neg, CANDIDATES), [naive_score(scorer, neg, s) for s in CANDIDATES],
                               rtol=1e-12, atol=1e-12)


def test_invariant_to_peak_order_and_intensity_scale():
    rng = np.random.default_rng(3)
    mz = np.sort(rng.uniform(40, 160, 30))
    intensity = rng.uniform(1, 100, 30)
    scorer = FragmentScorer()
    base = scorer.score(spectrum(mz, intensity), CANDIDATES)
    perm = rng.permutation(30)
    # Spectrum records keep peaks sorted, but the score must not rely on it.
    shuffled = spectrum(mz, intensity)
    shuffled.mz, shuffled.intensities = mz[perm], intensity[perm]
    np.testing.assert_allclose(scorer.score(shuffled, CANDIDATES), base, rtol=1e-12)
    np.testing.assert_allclose(scorer.score(spectrum(mz, intensity * 1234.5), CANDIDATES), base, rtol=1e-12)
    # Candidate order: scores follow their candidates.
    np.testing.assert_allclose(scorer.score(spectrum(mz, intensity), CANDIDATES[::-1]), base[::-1], rtol=1e-12)


def test_tolerance_floor_and_precursor():
    scorer = FragmentScorer(max_depth=0, max_h_shift=0, tolerance_ppm=10.0, min_tolerance_da=0.001)
    mh = Molecule("CCO").monoisotopic_mass + PROTON
    # The precursor ion is the intact structure (depth 0, weight 1).
    assert scorer.score(spectrum([mh], [5.0], precursor=mh), ["CCO"])[0] == pytest.approx(1.0)
    # 0.005 Da off: outside 10 ppm and the 0.001 floor, inside when the file reports 0.01 precision.
    assert scorer.score(spectrum([mh + 0.005], [5.0]), ["CCO"])[0] == 0.0
    assert scorer.score(spectrum([mh + 0.005], [5.0], precision=0.01), ["CCO"])[0] == pytest.approx(1.0)
    # Peaks above the precursor are not scored (neither explained nor counted).
    assert scorer.score(spectrum([mh, 300.0], [5.0, 50.0], precursor=mh), ["CCO"])[0] == pytest.approx(1.0)


def test_explain_peaks_shape():
    scorer = FragmentScorer()
    spec = spectrum([65.0386, 93.0335, 110.0600, 152.0706, 170.5], [10, 20, 100, 50, 7], precursor=152.0706)
    out = scorer.explain_peaks(spec, "CC(=O)Nc1ccc(O)cc1")
    assert [p["mz"] for p in out] == [65.0386, 93.0335, 110.0600, 152.0706]
    keys = {"mz", "intensity", "formula", "fragment_formula", "smiles", "bonds_broken", "depth", "h_shift",
            "carrier", "ion_mz", "error_ppm", "weight"}
    assert all(set(p) == keys for p in out)
    by_mz = {p["mz"]: p for p in out}
    assert by_mz[110.0600]["formula"] == "C6H8NO+" and by_mz[110.0600]["intensity"] == 100.0
    assert by_mz[152.0706]["formula"] == "C8H10NO2+" and by_mz[152.0706]["depth"] == 0
    assert all(abs(p["ion_mz"] - p["mz"]) <= max(scorer.tolerance_ppm * 1e-6 * p["mz"], scorer.min_tolerance_da)
               for p in out)
    assert all(p["error_ppm"] == pytest.approx((p["mz"] - p["ion_mz"]) / p["ion_mz"] * 1e6) for p in out)
    json.dumps(out)  # plain Python types, ready for a report


def test_bad_input():
    scorer = FragmentScorer()
    spec = spectrum([100.0], [1.0])
    with pytest.raises(InputError):
        scorer.score(spec, ["not a smiles"])
    with pytest.raises(InputError, match="record q7.*adduct"):
        scorer.score(spectrum([100.0], [1.0], adduct=None, id="q7"), ["CCO"])
    with pytest.raises(InputError, match="peaks"):
        scorer.score(spectrum([100.0], [-1.0]), ["CCO"])
    with pytest.raises(SpecError, match="depth_penalty"):
        FragmentScorer(depth_penalty=2.0).score(spec, ["CCO"])
    with pytest.raises(SpecError):
        fragment_structure("CCO", -1)
    with pytest.raises(TypeError):
        scorer.score({"mz": [100.0]}, ["CCO"])
    assert scorer.score(spec, []).shape == (0,)
    assert np.array_equal(scorer.score(spectrum([], []), ["CCO", "CCC"]), [0.0, 0.0])


def test_store_round_trip(tmp_path):
    scorer = FragmentScorer(max_depth=2)
    molecules = [Molecule(s) for s in CANDIDATES]
    path = scorer.save_fragments(tmp_path / "fragments.npz", molecules)
    sets, depth = load_fragment_sets(path)
    assert depth == 2 and set(sets) == {m.inchikey14 for m in molecules}
    for m in molecules:
        fresh = fragment_structure(m, 2)
        np.testing.assert_array_equal(sets[m.inchikey14].masses, fresh.masses)
        np.testing.assert_array_equal(sets[m.inchikey14].broken_by_type, fresh.broken_by_type)
        assert [sets[m.inchikey14].formula(i) for i in range(fresh.n_fragments)] == [
            fresh.formula(i) for i in range(fresh.n_fragments)]
    spec = spectrum([65.0386, 93.0335, 110.0600, 152.0706], [10, 20, 100, 50])
    # A depth-1 scorer reads the depth-2 store and keeps its own depth.
    shallow = FragmentScorer(max_depth=1).load_fragments(path)
    assert shallow.fragments(molecules[0]).n_fragments == fragment_structure(molecules[0], 1).n_fragments
    np.testing.assert_allclose(shallow.score(spec, molecules), FragmentScorer(max_depth=1).score(spec, CANDIDATES))
    with pytest.raises(InputError, match="depth"):
        FragmentScorer(max_depth=3).load_fragments(path)
    (tmp_path / "junk.npz").write_bytes(b"not an npz")
    with pytest.raises(InputError, match="junk.npz"):
        load_fragment_sets(tmp_path / "junk.npz")
    save_fragment_sets(tmp_path / "empty.npz", {}, 1)
    assert load_fragment_sets(tmp_path / "empty.npz") == ({}, 1)


def test_cache_is_bounded():
    scorer = FragmentScorer(cache_size=2)
    for s in CANDIDATES:
        scorer.fragments(s)
    assert len(scorer.cache_) == 2
    assert scorer.fragments(CANDIDATES[-1]) is scorer.fragments(CANDIDATES[-1])


@pytest.mark.shared
def test_true_structure_ranks_above_chance_on_real_spectra():
    # Real MassBank validation spectra (every 100th [M+H]+ one below m/z 500 with >= 5 peaks and a set of >= 30
    # candidates, 12 of them) against the first 30 candidates of their formula256 sets: the true structure explains more intensity than
    # most of its same-formula isomers (mean percentile 0.5 would be chance).
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.io import read_spectra

    sets = load_candidate_sets(require_shared("candidates", "val_formula256.json"))
    spectra = [s for s in read_spectra(require_shared("massbank", "val_pos.mgf"))
               if s.inchikey and len(sets.get(s.inchikey[:14], ())) >= 30 and s.n_peaks >= 5
               and s.adduct == "[M+H]+" and s.precursor_mz < 500][::100][:12]
    assert len(spectra) == 12
    scorer = FragmentScorer()
    percentiles = []
    for s in spectra:
        entries = sets[s.inchikey[:14]][:30]
        scores = scorer.score(s, [Molecule(smi, inchikey14=k) for k, smi in entries])
        truth = scores[0]
        percentiles.append((np.sum(scores[1:] < truth) + 0.5 * np.sum(scores[1:] == truth)) / (len(scores) - 1))
    assert np.mean(percentiles) > 0.6


def test_the_scorer_and_the_fragment_model_share_one_fragmentation():
    # recent_fragments: one keep_atoms fragmentation per structure, reused; the scorer's copy drops the atom masks
    # and is otherwise what fragment_structure gives
    from molpredict.chem.fragments import FragmentScorer, fragment_structure, recent_fragments

    smiles = "CC(=O)Nc1ccc(O)cc1"
    shared = recent_fragments(smiles, 2)
    assert recent_fragments(smiles, 2) is shared and shared.atoms is not None
    scorer_set = FragmentScorer(max_depth=2, cache_size=0).fragments(smiles)
    plain = fragment_structure(smiles, 2)
    assert scorer_set.atoms is None
    for name in ("masses", "depth", "broken_by_type", "counts"):
        np.testing.assert_array_equal(getattr(scorer_set, name), getattr(plain, name))
        np.testing.assert_array_equal(getattr(shared, name), getattr(plain, name))
    assert scorer_set.elements == plain.elements
