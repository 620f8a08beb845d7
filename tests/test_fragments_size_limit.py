"""Structures too large to fragment (QA): enumeration memory grows with the cube of the atom count (an 800-carbon
chain peaked at 4.7 GB, a 3,000-carbon top hit got ``report`` killed). Above ``MAX_FRAGMENT_ATOMS`` heavy atoms a
structure is not fragmented: an empty fragment set, which explains no peak and never scores above a fragmented
candidate. And the enumeration's bounded-memory blocks give exactly what one block gives."""
from __future__ import annotations

import numpy as np
import pytest

import molpredict.chem.fragments as fragments_module
from molpredict.chem.fragment_cache import decode_arrays, encode_arrays
from molpredict.chem.fragment_model import fragment_features
from molpredict.chem.fragments import (BOND_KINDS, MAX_FRAGMENT_ATOMS, FragmentScorer, fragment_structure,
                                       load_fragment_sets, recent_fragments)
from molpredict.chem.molecules import Molecule
from molpredict.report.page import Report
from molpredict.spectra.record import Spectrum

from test_fragment_model import constant_model

TOO_LARGE = "C" * (MAX_FRAGMENT_ATOMS + 1)
# C3H7+, C4H9+, C5H11+, C6H13+: what any alkane chain explains, the intact C7 ion of heptane
ALKYL_PEAKS = np.array([43.0542, 57.0699, 71.0855, 85.1012, 101.1325])


def _spectrum(precursor: float = 101.1325) -> Spectrum:
    return Spectrum("q", ALKYL_PEAKS.copy(), np.array([100.0, 80.0, 50.0, 30.0, 10.0]), precursor_mz=precursor,
                    charge=1, ion_mode="positive", adduct="[M+H]+")


def test_the_limit_is_far_above_metabolites():
    assert MAX_FRAGMENT_ATOMS >= 200


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("keep_atoms", [False, True])
def test_a_structure_above_the_limit_gives_an_empty_fragment_set(depth, keep_atoms):
    for smiles in (TOO_LARGE, "C" * 800, "O" + "C" * MAX_FRAGMENT_ATOMS + "N"):
        fs = fragment_structure(Molecule.from_smiles(smiles), depth, keep_atoms=keep_atoms)
        n_atoms = len(smiles)
        assert fs.n_fragments == 0
        assert fs.masses.shape == (0,) and fs.depth.shape == (0,) and fs.bonds_broken.shape == (0,)
        assert fs.broken_by_type.shape == (0, len(BOND_KINDS)) and fs.counts.shape == (0, len(fs.elements))
        assert set(fs.elements) == set(smiles) | {"H"}
        assert (fs.atoms is None) if not keep_atoms else fs.atoms.shape == (0, n_atoms)
        assert fs.up_to_depth(1).n_fragments == 0


def test_a_structure_at_the_limit_is_still_fragmented():
    n = MAX_FRAGMENT_ATOMS
    fs = fragment_structure(Molecule.from_smiles("C" * n), 2, keep_atoms=True)
    # the intact chain, its 2 (n - 1) end pieces (one cleavage), its (n - 1)(n - 2) / 2 inner pieces (two)
    assert fs.n_fragments == 1 + 2 * (n - 1) + (n - 1) * (n - 2) // 2
    assert np.bincount(fs.depth).tolist() == [1, 2 * (n - 1), (n - 1) * (n - 2) // 2]
    assert fs.atoms[0].all() and fs.formula(0) == f"C{n}H{2 * n + 2}"
    # hydrogens do not count: an explicit-hydrogen SMILES of the same chain is fragmented alike
    with_h = fragment_structure(Molecule.from_smiles("[CH3]" + "[CH2]" * (n - 2) + "[CH3]"), 1)
    assert with_h.n_fragments == 1 + 2 * (n - 1)


def test_the_fragment_score_gives_a_structure_too_large_nothing():
    scorer = FragmentScorer()
    spectrum = _spectrum()
    scores = scorer.score(spectrum, ["CCCCCCC", TOO_LARGE, "CCCCC(C)C"])
    assert scores[1] == 0.0 and scores[0] > 0.0 and scores[2] > 0.0
    assert scorer.score(spectrum, [TOO_LARGE, TOO_LARGE]).tolist() == [0.0, 0.0]   # no fragment at all: no crash
    assert scorer.explain_peaks(spectrum, TOO_LARGE) == []
    assert [p["mz"] for p in scorer.explain_peaks(spectrum, "CCCCCCC")][-1] == pytest.approx(101.1325)


def test_the_report_annotates_no_peak_for_a_top_candidate_too_large():
    report = Report()
    report.add_spectrum(_spectrum())
    molecule = Molecule.from_smiles(TOO_LARGE)
    report.add_rows([{"query_id": "q", "rank": 1, "score": 1.0, "smiles": molecule.smiles,
                      "inchikey": molecule.inchikey, "formula": molecule.formula, "adduct": "[M+H]+",
                      "name": "a long chain", "n_candidates": 1}])
    assert report.data()["queries"][0]["ex"] == []


def test_the_learnt_model_ranks_a_structure_too_large_lowest():
    """Without ions the likelihood would be log(eps) with no absent-ion penalty: above a candidate whose
    confident ions no peak shows. It gets the lowest score of the candidates scored with it instead."""
    model = constant_model(0.99, absent_weight=1.0)
    spectrum = _spectrum()
    normal = ["CCCCCCC", "CCCCC(C)C", "CC(C)CC(C)C"]
    alone = model.score(spectrum, normal)
    assert alone.max() < np.log(model.eps)   # the case: every fragmented candidate below "explains nothing"
    scores = model.score(spectrum, normal[:1] + [TOO_LARGE] + normal[1:])
    np.testing.assert_allclose(np.delete(scores, 1), alone, rtol=1e-12)
    assert np.isfinite(scores[1]) and scores[1] == alone.min()
    # without peaks every fragmented candidate pays its absent ions; the one too large pays as much as the worst
    empty = Spectrum("e", np.zeros(0), np.zeros(0), precursor_mz=101.13, adduct="[M+H]+", ion_mode="positive")
    no_peaks = model.score(empty, normal + [TOO_LARGE])
    assert no_peaks[-1] == no_peaks[:-1].min() < 0
    # only structures too large: they are all alike, the score of explaining nothing
    assert model.score(spectrum, [TOO_LARGE, TOO_LARGE]).tolist() == pytest.approx([np.log(model.eps)] * 2)
    groups = model.ion_groups(TOO_LARGE)
    assert groups[0].shape == groups[1].shape == (0,)
    assert fragment_features(TOO_LARGE, recent_fragments(TOO_LARGE, 2)).shape[0] == 0


def test_an_empty_fragment_set_survives_the_stores_and_caches(tmp_path):
    scorer = FragmentScorer()
    big, small = Molecule.from_smiles(TOO_LARGE), Molecule.from_smiles("CCO")
    sets, depth = load_fragment_sets(scorer.save_fragments(tmp_path / "store.npz", [big, small]))
    assert depth == 2 and sets[big.inchikey14].n_fragments == 0 and sets[small.inchikey14].n_fragments > 1
    arrays = scorer.cached_arrays([big.smiles])
    again = FragmentScorer()
    assert again.remember_arrays({k: decode_arrays(encode_arrays(v)) for k, v in arrays.items()}) == {big.smiles}
    assert again.fragments(big).n_fragments == 0
    assert again.score(_spectrum(), [big]).tolist() == [0.0]


@pytest.mark.parametrize("smiles", [
    "CC(=O)Oc1ccccc1C(=O)O",
    "C1CCCCCCCCCCCCCCCCCCCCCCCC1",                         # a macrocycle: ring openings by the hundred
    "OCC1OC(OC2C(O)C(O)C(OC3C(O)C(O)C(O)OC3CO)OC2CO)C(O)C1O",
    "c1ccc2cc3ccccc3cc2c1",
    "C" * 60,
])
def test_blocked_enumeration_equals_one_block(monkeypatch, smiles):
    """The intersections are deduplicated as they come (bit-packed) and split into components block by block:
    with tiny blocks and a merge after every few rows, the result is exactly that of one block."""
    molecule = Molecule.from_smiles(smiles)
    whole = fragment_structure(molecule, 2, keep_atoms=True)
    monkeypatch.setattr(fragments_module, "_BLOCK_BOOLS", 500)
    monkeypatch.setattr(fragments_module, "_MERGE_ROWS", 3)
    blocked = fragment_structure(molecule, 2, keep_atoms=True)
    for name in ("masses", "depth", "broken_by_type", "counts", "atoms"):
        np.testing.assert_array_equal(getattr(blocked, name), getattr(whole, name), err_msg=name)
    assert blocked.elements == whole.elements
