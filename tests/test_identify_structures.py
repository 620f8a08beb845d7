"""Identification: what a candidate is. The coordinates store keys a candidate by the SMILES it featurises (never
by a library's declared InChIKey), a structure is an InChIKey first block (ranked once, in libraries and candidate
sets), ``one_formula`` reads normalised formulas, and a formula hint the precursor m/z contradicts is refused."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from identification_helpers import SMILES, synthetic_spectra
from molpredict.chem.candidates import CandidateLibrary
from molpredict.identification.candidate_sources import LibrarySource, SetSource
from molpredict.identification.identify import Identifier, IdentifyOptions
from molpredict.identification.scoring import CandidateCoordinates
from test_identify import bundle  # noqa: F401 - the fixture: a fitted fake model over SMILES, positive mode

#: two C9H8O4 isomers (caffeic acid, aspirin) and caffeine (C8H10N4O2)
CAFFEIC, ASPIRIN, CAFFEINE = SMILES[1], SMILES[4], SMILES[2]


def declared_library(rows):
    """A library of ``(smiles, inchikey, formula, name)`` rows taken as declared: an Arrow table, as an entry cached by
    an older reader or a table built in memory hands them over (the TSV reader derives keys and formulas from the
    SMILES). The masses come from the SMILES."""
    import pyarrow as pa
    from molpredict.chem.molecules import Molecule

    masses = [Molecule.from_smiles(r[0]).monoisotopic_mass for r in rows]
    return CandidateLibrary(pa.table({"inchikey14": [r[1][:14] for r in rows], "inchikey": [r[1] for r in rows],
                                      "smiles": [r[0] for r in rows], "formula": [r[2] for r in rows],
                                      "monoisotopic_mass": masses, "name": [r[3] for r in rows]}))


def run(bundle, library, spectra, cache_root, **options):
    identifier = Identifier(bundle, LibrarySource(library, IdentifyOptions(**options)), IdentifyOptions(**options),
                            cache_root=cache_root)
    return list(identifier.run(spectra)), identifier


def query(smiles_index, seed=2):
    spectra, _ = synthetic_spectra(n_per=1, seed=seed)
    return spectra[smiles_index]


def test_a_wrong_declared_inchikey_does_not_poison_the_store_for_later_runs(bundle, tmp_path):
    """QA: a library row declaring caffeic acid's InChIKey for caffeine's SMILES, run first, gave caffeic acid
    caffeine's coordinates in every later run sharing the store."""
    good = CandidateLibrary.from_smiles([CAFFEIC, ASPIRIN, CAFFEINE], names=["caffeic", "aspirin", "caffeine"])
    caffeic_key = good.take("inchikey", np.array([0]))[0]
    poison = declared_library([(CAFFEINE, caffeic_key, "C8H10N4O2", "caffeine, wrong key")])
    run(bundle, poison, [query(2)], tmp_path / "shared")  # caffeine's spectrum: the poisoned row is featurised
    after, _ = run(bundle, good, [query(1)], tmp_path / "shared")
    fresh, _ = run(bundle, good, [query(1)], tmp_path / "fresh")
    assert [(r["smiles"], r["score"]) for r in after] == [(r["smiles"], r["score"]) for r in fresh]
    assert after[0]["smiles"] == CAFFEIC


def test_forms_sharing_an_inchikey_get_their_own_coordinates(bundle, tmp_path):
    """A zwitterion and its neutral form share an InChIKey but not a fingerprint: each is scored as itself, whichever
    was stored first."""
    zwitterion, neutral = "CC(C)C[C@H]([NH3+])C(=O)NCC(=O)NCC(=O)[O-]", "CC(C)C[C@H](N)C(=O)NCC(=O)NCC(=O)O"
    zw = CandidateLibrary.from_smiles([zwitterion])
    neu = CandidateLibrary.from_smiles([neutral])
    assert zw.inchikey[0] == neu.inchikey[0]
    sub = bundle.for_mode("positive")
    ids = np.array([0])
    for library in (zw, neu):
        got = CandidateCoordinates(LibrarySource(library, IdentifyOptions()), tmp_path)(sub, ids, Counter())
        np.testing.assert_allclose(got, sub.model.candidate_coordinates(library.molecules(ids)), rtol=1e-2, atol=1e-6)
    own = [sub.model.candidate_coordinates(lib.molecules(ids)) for lib in (zw, neu)]
    assert not np.allclose(own[0], own[1])  # the test means something: the forms differ


def test_stereoisomers_are_one_candidate_ranked_once_as_the_first_row(bundle, tmp_path):
    """R, S and racemic forms (one first block) took ranks 1-3 with confidence 0; now one row, the first in library
    order, and the rows merged are counted."""
    forms = ["C[C@H](N)C(=O)O", "C[C@@H](N)C(=O)O", "CC(N)C(=O)O"]
    library = CandidateLibrary.from_smiles(forms + [CAFFEIC], names=["L", "D", "rac", "caffeic"])
    from molpredict.spectra.record import Spectrum
    alanine = Spectrum("ala", mz=[44.05, 90.055], intensities=[100.0, 30.0], precursor_mz=90.0550, charge=1,
                       ion_mode="positive", adduct="[M+H]+", metadata={"formula": "C3H7NO2"})
    with pytest.warns(UserWarning, match="first block"):
        rows, identifier = run(bundle, library, [alanine], tmp_path, top_k=5)
    assert [(r["rank"], r["name"], r["n_candidates"]) for r in rows] == [(1, "L", 1)]
    assert identifier.summary()["candidates_merged"] == 2


def test_a_candidate_set_counts_each_first_block_once(bundle, tmp_path):
    """evaluate: a decoy listed under 3 SMILES of one first block counted 3 times against the truth (and the random
    expectation counted the copies); the truth under two SMILES tied with itself."""
    from molpredict.chem.molecules import Molecule
    from molpredict.identification.evaluate import evaluate_block, labelled_queries

    truth = Molecule.from_smiles("C[C@H](N)C(=O)O")
    decoy = Molecule.from_smiles("NCC(=O)OC")
    entries = [(truth.inchikey14, "C[C@H](N)C(=O)O"), (truth.inchikey14, "C[C@@H](N)C(=O)O"),
               (decoy.inchikey14, "NCC(=O)OC"), (decoy.inchikey14, "COC(=O)CN"), (decoy.inchikey14, "O=C(OC)CN")]
    source = SetSource({truth.inchikey14: entries})
    identifier = Identifier(bundle, source, IdentifyOptions(), cache_root=tmp_path)
    from molpredict.spectra.record import Spectrum
    spectrum = Spectrum("ala", mz=[44.05, 90.055], intensities=[100.0, 30.0], precursor_mz=90.0550, charge=1,
                        ion_mode="positive", adduct="[M+H]+", metadata={"inchikey": truth.inchikey})
    [prepared] = labelled_queries(identifier, [(0, spectrum, truth.inchikey14)])
    assert sorted(source.inchikey14(prepared.ids)) == sorted([truth.inchikey14, decoy.inchikey14])
    block = evaluate_block(identifier, [(0, spectrum, truth.inchikey14)])
    assert block.n_candidates == [2] and block.n_ties == [0]


def test_one_formula_reads_formulas_as_selection_does(bundle, tmp_path):
    """QA: a decoy's formula written C9O4H8 instead of C9H8O4 turned a same-formula set into a mixed one (another
    calibrated probability for the same candidates and scores)."""
    keys = [CandidateLibrary.from_smiles([smiles]).inchikey[0] for smiles in (CAFFEIC, ASPIRIN, CAFFEINE)]
    plain = declared_library([(CAFFEIC, keys[0], "C9H8O4", "a"), (ASPIRIN, keys[1], "C9H8O4", "b")])
    odd = declared_library([(CAFFEIC, keys[0], "C9H8O4", "a"), (ASPIRIN, keys[1], "C9O4H8", "b")])
    ids = np.array([0, 1])
    assert LibrarySource(odd, IdentifyOptions()).one_formula(ids) is True
    assert LibrarySource(plain, IdentifyOptions()).one_formula(ids) is True
    mixed = declared_library([(CAFFEIC, keys[0], "C9H8O4", "a"), (CAFFEINE, keys[2], "C8H10N4O2", "c")])
    assert LibrarySource(mixed, IdentifyOptions()).one_formula(ids) is False
    a, _ = run(bundle, plain, [query(1)], tmp_path / "c")
    b, _ = run(bundle, odd, [query(1)], tmp_path / "c")
    assert a[0]["probability"] == b[0]["probability"] or np.isnan(a[0]["probability"])


def test_a_formula_hint_the_precursor_contradicts_skips_the_query_with_the_reason(bundle, tmp_path):
    """QA: a hint of another mass (C9H8O4 for a [M+H]+ of a C10H10O3 structure) was used silently; the query is now
    skipped, the reason naming the hint and the mismatch. A hint that fits is used."""
    library = CandidateLibrary.from_smiles(SMILES)
    spectrum = query(0)  # C10H10O3, [M+H]+ 179.0703
    rows, identifier = run(bundle, library, [spectrum], tmp_path, formulas={"s0-0": "C9H8O4"})
    assert rows == []
    [skip] = identifier.skipped
    assert skip.reason.startswith("formula hint C9H8O4 (M 180.0423) does not fit precursor m/z 179.07")
    assert "[M+H]+" in skip.reason and "10 ppm" in skip.reason and "\n" not in skip.reason
    rows, identifier = run(bundle, library, [spectrum], tmp_path, formulas={"s0-0": "C10H10O3"})
    assert rows and not identifier.skipped


def test_hints_with_by_mass_warn_that_they_are_ignored(bundle, tmp_path):
    library = CandidateLibrary.from_smiles(SMILES)
    with pytest.warns(UserWarning, match=r"formula hints \(formulas= / --formulas\) are ignored with "
                                         r"by=.mass. / --by mass"):
        rows, identifier = run(bundle, library, [query(0)], tmp_path, by="mass", formulas={"s0-0": "C9H8O4"})
    assert rows and not identifier.skipped  # by mass, the hint does not count, nor is it checked


def test_a_query_whose_candidates_the_source_filter_removed_says_so(bundle, tmp_path):
    library = CandidateLibrary.from_smiles(SMILES, source="here")
    spectrum = query(0)
    _, identifier = run(bundle, library, [spectrum], tmp_path, sources=["elsewhere"])
    assert identifier.skipped[0].reason == "no candidates from source elsewhere (formula C10H10O3)"
    _, identifier = run(bundle, library, [spectrum], tmp_path, sources=["elsewhere", "there"], by="mass")
    assert identifier.skipped[0].reason == "no candidates from sources elsewhere, there (mass within 10 ppm)"
    spectrum.metadata["formula"] = "C99H2"
    _, identifier = run(bundle, library, [spectrum], tmp_path, sources=["here"])
    assert identifier.skipped[0].reason == "no candidates in the library (formula C99H2)"
