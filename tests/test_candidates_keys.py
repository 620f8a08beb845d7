"""Candidate-set keys: normalised to the upper-case first InChIKey block (as queries look them up), refused when
they are not InChIKey-like, and a truth entry whose SMILES gives another key is warned about once."""
from __future__ import annotations

import json
import warnings

import pytest

from molpredict.chem.candidates import candidate_sets_from, load_candidate_sets
from molpredict.chem.molecules import Molecule
from molpredict.errors import InputError

ETHANOL, PHENOL, PROPANOL = (Molecule.from_smiles(s) for s in ("CCO", "Oc1ccccc1", "CCCO"))


def _set(query: Molecule, *candidates: Molecule, key=lambda m: m.inchikey14) -> dict:
    return {key(query): [[key(c), c.smiles] for c in (query, *candidates)]}


@pytest.mark.parametrize("key", [lambda m: m.inchikey, lambda m: m.inchikey14.lower(), lambda m: m.inchikey.lower(),
                                 lambda m: f" {m.inchikey14} "])
def test_full_and_lowercase_keys_are_the_first_block(key, tmp_path):
    data = {**_set(ETHANOL, PHENOL, key=key), **_set(PHENOL, PROPANOL, key=key)}
    (tmp_path / "sets.json").write_text(json.dumps(data))
    sets = load_candidate_sets(tmp_path / "sets.json")
    assert sets == {ETHANOL.inchikey14: [(ETHANOL.inchikey14, "CCO"), (PHENOL.inchikey14, PHENOL.smiles)],
                    PHENOL.inchikey14: [(PHENOL.inchikey14, PHENOL.smiles), (PROPANOL.inchikey14, "CCCO")]}


def test_evaluation_finds_the_truth_in_sets_keyed_by_full_inchikeys():
    from molpredict.identification.evaluate import SetSource as Source, collect_queries
    from molpredict.spectra.record import Spectrum

    sets = candidate_sets_from({**_set(ETHANOL, PHENOL, key=lambda m: m.inchikey),
                                **_set(PHENOL, PROPANOL, key=lambda m: m.inchikey.lower())})
    spectra = [Spectrum(f"q{i}", mz=[30.0], intensities=[1.0], precursor_mz=m.monoisotopic_mass + 1.007,
                        charge=1, ion_mode="positive", metadata={"smiles": m.smiles, "inchikey": m.inchikey})
               for i, m in enumerate((ETHANOL, PHENOL))]
    queries, skipped = collect_queries(spectra, Source(sets))
    assert len(queries) == 2 and not skipped


@pytest.mark.parametrize("bad", ["KEY1", "", "XLYOFNOQVPJJNP-UHFFFAOYSA", "XLYOFNOQVPJJN", "XLYOFNOQVPJJNP1", "XLYOFNOQVPJJN-"])
def test_keys_that_are_not_inchikey_like_are_refused(bad, tmp_path):
    (tmp_path / "sets.json").write_text(json.dumps({bad: [[ETHANOL.inchikey14, "CCO"]]}))
    with pytest.raises(InputError) as info:
        load_candidate_sets(tmp_path / "sets.json")
    assert str(info.value) == f"{tmp_path / 'sets.json'}: key {bad!r} is not an InChIKey or its first block " \
                              f"(14 characters)"
    with pytest.raises(InputError, match=rf"sets.json, record {ETHANOL.inchikey14}: key 'x' is not an InChIKey"):
        candidate_sets_from({ETHANOL.inchikey14: [["x", "CCO"]]}, tmp_path / "sets.json")


def test_a_truth_whose_smiles_gives_another_key_is_warned_once():
    wrong = {PHENOL.inchikey14: [[PHENOL.inchikey14, "CCCO"]], PROPANOL.inchikey14: [[PROPANOL.inchikey14, "CC("]],
             **_set(ETHANOL, PHENOL)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        candidate_sets_from(wrong, "sets.json")
    assert [str(w.message) for w in caught] == [
        f"sets.json: 2 of 3 candidate sets list their true structure with a SMILES that does not give its key "
        f"(first: set {PHENOL.inchikey14}); hits are decided by the key"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        candidate_sets_from(_set(ETHANOL, PHENOL), "sets.json")  # right truths: silent
