"""The Python API's boundary (QA as a notebook user): formula hints checked as the hints file is, unusable matchms
spectra skipped into the skip report, argument types named before anything is loaded, warnings worded for both
callers and attributed to the caller's line, matchms metadata as matchms filters write it."""
from __future__ import annotations

import dataclasses
import logging
import warnings

import numpy as np
import pytest

import molpredict
from molpredict.api import identify_options, spectra_files
from molpredict.errors import InputError
from molpredict.io import read_spectra, write_mgf
from test_api import workdir  # noqa: F401  (the fixture: a small model, library.tsv, queries.mgf)

import matchms  # noqa: E402  (a test extra: `make test` installs it)

CALL = dict(model="mymodel", library="library.tsv", cache_dir=False)


def test_formula_hints_given_as_a_dict_are_checked_and_normalised_as_the_file_is():
    for hints, message in [({"q1": "not a formula"}, "unparsable formula 'not a formula'"),
                           ({"q1": "c19h18cln3o4"}, "unparsable formula 'c19h18cln3o4'"),
                           ({"q1": 5}, "a formula must be a string, not int 5")]:
        with pytest.raises(InputError, match=f"^formulas, record q1, field formula: {message}$"):
            identify_options(formulas=hints)
    with pytest.raises(InputError, match="^formulas: query ids must be strings"):
        identify_options(formulas={7: "C2H6O"})
    assert identify_options(formulas={"q1": " OH2 ", "q2": "C19H18ClN3O4"}).formulas == \
        {"q1": "H2O", "q2": "C19H18ClN3O4"}


def test_a_spectrum_formula_that_does_not_parse_is_selected_by_mass_and_said_once(workdir):  # noqa: F811
    spectra = list(read_spectra("queries.mgf"))[:6]
    for i in (1, 3):
        spectra[i] = dataclasses.replace(spectra[i], metadata={**spectra[i].metadata, "formula": "XyZ"})
    write_mgf(spectra, "bad_formula.mgf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hits = molpredict.identify("bad_formula.mgf", **CALL)
    said = [w for w in caught if "FORMULA that does not parse" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert str(said[0].message).startswith(f"2 spectra with a FORMULA that does not parse ({spectra[1].id} with "
                                           f"FORMULA='XyZ'; 1 more) selected candidates by precursor mass")
    assert said[0].filename == __file__  # the caller's line, not molpredict's
    assert hits.attrs["summary"]["formula_unparsed"] == 2
    assert set(hits["query_id"]) >= {spectra[1].id, spectra[3].id}  # still answered, by mass
    assert hits[hits["query_id"] == spectra[1].id]["mass_window"].iloc[0] != ""


def test_an_unusable_matchms_spectrum_is_skipped_and_reported_not_raised(workdir, caplog):  # noqa: F811
    from matchms.importing import load_from_mgf

    spectra = list(load_from_mgf("queries.mgf"))[:4]
    good = spectra[1]
    intensities = good.peaks.intensities.copy()
    intensities[0] = np.inf
    spectra[1] = matchms.Spectrum(mz=good.peaks.mz, intensities=intensities, metadata=good.metadata,
                                  metadata_harmonization=False)
    hits = molpredict.identify(spectra, **CALL)
    assert hits.attrs["skipped"] == [{"query_id": good.get("title"), "reason": "unreadable record: non-finite peak",
                                      "file": "", "record": 2}]
    assert sorted(set(hits["record"])) == [1, 3, 4]
    # the jobs that read files (evaluate, train) leave it out of the temporary MGF, with one warning
    with caplog.at_level(logging.WARNING, logger="molpredict.io"), spectra_files(spectra) as paths:
        assert [s.id for p in paths for s in read_spectra(p)] == [spectra[i].get("title") for i in (0, 2, 3)]
    assert "matchms spectra: skipped 1 unusable spectrum (1 non-finite peak; first: record 2" in caplog.text


def test_wrong_argument_types_are_one_line_errors_naming_the_argument(workdir):  # noqa: F811
    for wrong, message in [(dict(sources=[1, 2]), r"sources must be source names \(strings\), not int 1"),
                           (dict(sources=5), "sources must be a source name or a list of them, not int"),
                           (dict(cache_dir=5), "cache_dir must be a path, a URL, None .* or False .*, not int 5"),
                           (dict(cache_dir=True), "cache_dir must be .*, not bool True"),
                           (dict(cluster=2), "cluster must be 'local:N', a scheduler address or None, not int 2"),
                           (dict(progress="yes"), "progress must be True or False, not 'yes'"),
                           (dict(properties=3), "properties must be a property model's path or a PropertyBundle, "
                                                "not int")]:
        with pytest.raises(InputError, match=f"^{message}$"):
            molpredict.identify("queries.mgf", **{**CALL, **wrong})
    with pytest.raises(InputError, match="^kernel_loss must be True or False, not 'no'$"):
        molpredict.evaluate("queries.mgf", {}, model="mymodel", kernel_loss="no")
    with pytest.raises(InputError, match="^cache_dir must be"):
        molpredict.evaluate("queries.mgf", {}, model="mymodel", cache_dir=3.5)
    with pytest.raises(InputError, match="^log must be a function"):
        molpredict.train("queries.mgf", log="train.log")
    with pytest.raises(InputError, match="^cache must be True or False"):
        molpredict.load_library("library.tsv", cache="yes")


def test_empty_input_and_a_directory_are_said_as_such(workdir):  # noqa: F811
    with pytest.raises(InputError, match=r"^no spectra given \(spectra is empty\)$"):
        molpredict.identify([], **CALL)
    (workdir / "runs").mkdir()
    with pytest.raises(InputError, match="^runs: is a directory, not a spectra file"):
        molpredict.identify("runs", **CALL)


def test_ignored_hints_warning_names_both_spellings_and_the_callers_line(workdir):  # noqa: F811
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        molpredict.identify("queries.mgf", by="mass", formulas={"x": "C2H6O"}, **CALL)
    said = [w for w in caught if "formula hints" in str(w.message)]
    assert len(said) == 1
    assert str(said[0].message).startswith("formula hints (formulas= / --formulas) are ignored with by='mass' / "
                                           "--by mass")
    assert said[0].filename == __file__


def test_matchms_metadata_as_filters_write_it():
    from molpredict.io.matchms import from_matchms

    peaks = dict(mz=np.array([50.1, 60.25]), intensities=np.array([1.0, 2.0]))
    listed = matchms.Spectrum(**peaks, metadata={"precursor_mz": 224.1, "charge": [1], "ionmode": "positive"},
                              metadata_harmonization=False)
    assert from_matchms(listed, 1).charge == 1
    # a float32 precursor keeps its written precision (not float64's 1e-13): the 0.5 m/z window applies
    single = matchms.Spectrum(**peaks, metadata={"precursor_mz": np.float32(224.1), "ionmode": "positive"},
                              metadata_harmonization=False)
    assert from_matchms(single, 1).precursor_mz_precision == pytest.approx(0.1)
    written = matchms.Spectrum(**peaks, metadata={"precursor_mz": "224.10", "ionmode": "positive"},
                               metadata_harmonization=False)
    assert from_matchms(written, 1).precursor_mz_precision == pytest.approx(0.01)  # as an MGF's PEPMASS=224.10
    float32_peaks = matchms.Spectrum(mz=np.array([50.1, 60.25], dtype=np.float32), intensities=peaks["intensities"],
                                     metadata={"precursor_mz": 224.1}, metadata_harmonization=False)
    assert from_matchms(float32_peaks, 1).mz_precision == pytest.approx(0.01)
