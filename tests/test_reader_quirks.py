"""The quirk corpus: one small hand-written file per real-world quirk class (tests/fixtures/quirks/), each read
field by field, plain and gzipped; every record is either read or skipped with a reason naming the field."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from molpredict.chem.candidates import read_library
from molpredict.io.common import adduct_from_name, parse_ms_level
from molpredict.io import SkipReport, read_mzxml, read_spectra

from conftest import FIXTURES

QUIRKS = FIXTURES / "quirks"
SPECTRA = FIXTURES / "spectra"


def read_all(path: Path) -> tuple[list, SkipReport]:
    report = SkipReport()
    return list(read_spectra(path, report=report)), report


def by_id(spectra: list) -> dict:
    return {s.id: s for s in spectra}


# -- MGF ------------------------------------------------------------------------------------------------------

def test_mgf_with_byte_order_mark_and_crlf():
    assert QUIRKS.joinpath("bom.mgf").read_bytes()[:3] == b"\xef\xbb\xbf"
    spectra, report = read_all(QUIRKS / "bom.mgf")
    assert not report
    assert [s.id for s in spectra] == ["bom-1", "bom-2"]
    assert (spectra[0].precursor_mz, spectra[0].adduct, spectra[0].ion_mode) == (195.0877, "[M+H]+", "positive")
    np.testing.assert_array_equal(spectra[0].mz, [110.0713, 138.0662])
    assert spectra[0].metadata == {}  # no "\ufeffbegin ions" junk key


def test_mgf_ms_level_forms():
    spectra, report = read_all(QUIRKS / "ms_level_forms.mgf")
    levels = {s.id: s.ms_level for s in spectra}
    assert levels == {"level-MS2": 2, "level-ms2": 2, "level-MS/MS": 2, "level-3": 3, "level-MS1": 1}
    assert [(e.record, e.reason) for e in report] == [(6, "non-numeric MSLEVEL")]
    assert all("ms_level" not in s.metadata and "mslevel" not in s.metadata for s in spectra)


@pytest.mark.parametrize("text, level", [("2", 2), ("MS2", 2), ("ms2", 2), (" MS3 ", 3), ("MS/MS", 2),
                                         ("MSMS", 2), ("MS-MS", 2), ("MS", 1), ("MS1", 1), ("in-source", None),
                                         ("GC-MS", None), ("two", None), ("MSn", None), ("", None)])
def test_parse_ms_level(text, level):
    assert parse_ms_level(text) == level


def test_mgf_matchms_export():
    spectra, report = read_all(QUIRKS / "matchms_export.mgf")
    assert not report
    a, b, c = spectra
    assert (a.id, a.precursor_mz, a.charge, a.ion_mode, a.adduct) == ("spectrum-a", 195.0877, 1, "positive",
                                                                      "[M+H]+")
    assert a.metadata["compound_name"] == "Caffeine" and a.metadata["spectrum_id"] == "spectrum-a"
    assert "precursor_mz" not in a.metadata
    assert (b.id, b.precursor_mz, b.ion_mode) == ("spectrum-b", 193.0506, "negative")
    assert c.precursor_mz == 250.25


def test_mgf_gnps_library_records():
    spectra, report = read_all(QUIRKS / "gnps.mgf")
    assert not report
    assert [s.id for s in spectra] == ["CCMSLIB00000001547", "CCMSLIB00000001548", "CCMSLIB00000001549", "1"]
    caffeine, ferulic, sodium, unknown = spectra
    # IONMODE=n/a and CHARGE=0 are "unknown"; the adduct comes from the name, the ion mode from the adduct
    assert (caffeine.adduct, caffeine.ion_mode, caffeine.charge) == ("[M+H]+", "positive", None)
    assert caffeine.metadata["compound_name"] == "Caffeine M+H"
    assert caffeine.metadata["scans"] == "1" and caffeine.metadata["spectrum_id"] == "CCMSLIB00000001547"
    assert "ionmode" not in caffeine.metadata and "charge" not in caffeine.metadata
    assert (ferulic.adduct, ferulic.ion_mode) == ("[M-H]-", "negative")
    assert (sodium.adduct, sodium.ion_mode) == ("[M+Na]+", "positive")
    # no SPECTRUMID and no adduct in the name: the id is SCANS (identification makes repeated ids unique)
    assert (unknown.adduct, unknown.ion_mode) == (None, None)


@pytest.mark.parametrize("name, ion_mode, adduct", [
    ("Caffeine M+H", None, "[M+H]+"), ("X [M-H]-", None, "[M-H]-"), ("Vitamin E", None, None),
    ("Compound M", None, None), ("B M+Cl", None, "[M+Cl]-"), ("D 2M+H", None, "[2M+H]+"),
    ("H M+FA-H", "negative", "[M+HCOO]-"), ("F [M]+", None, "[M]+"), ("J [M+2H]2+", None, "[M+2H]2+"),
    # charge unknown and [M+2H]+ is no common adduct: nothing is guessed
    ("I M+2H", "positive", None), ("", None, None), (None, None, None), ("Ethyl-M-2", None, None)])
def test_adduct_from_name(name, ion_mode, adduct):
    assert adduct_from_name(name, ion_mode) == adduct


# -- MSP ------------------------------------------------------------------------------------------------------

def test_msp_with_byte_order_mark():
    spectra, report = read_all(QUIRKS / "bom.msp")
    assert not report
    (s,) = spectra
    assert s.id == "BOM-1" and s.metadata["compound_name"] == "Caffeine"
    assert not any(k.startswith("\ufeff") for k in s.metadata)


def test_msp_colon_pairs():
    spectra, report = read_all(QUIRKS / "pairs_colon.msp")
    assert not report
    a, b = spectra
    np.testing.assert_array_equal(a.mz, [42.0, 55.0, 110.0713, 138.0662, 139.07, 195.0877])
    np.testing.assert_array_equal(a.intensities, [100, 15.5, 20, 100, 8.1, 40.25])
    assert a.mz_precision == pytest.approx(1e-4)
    # a MoNA spectrum string as the only peak line, no Num Peaks
    np.testing.assert_array_equal(b.mz, [134.0363, 178.0266, 193.0506])
    np.testing.assert_array_equal(b.intensities, [100, 12.5, 30])
    assert (b.id, b.ion_mode) == ("COLON-2", "negative")


def test_msp_semicolon_groups_and_space_runs():
    spectra, report = read_all(QUIRKS / "pairs_semicolon.msp")
    assert not report
    semi, run = spectra
    np.testing.assert_array_equal(semi.mz, [42, 55, 110.0713, 138.0662, 195.0877])
    np.testing.assert_array_equal(semi.intensities, [100, 15, 20, 999, 40])
    # "42 100 55 15": two pairs on a line, recognised because Num Peaks says 4
    np.testing.assert_array_equal(run.mz, [42, 55, 110.0713, 138.0662])
    np.testing.assert_array_equal(run.intensities, [100, 15, 20, 999])


def test_msp_comments_inside_peak_lists():
    spectra, report = read_all(QUIRKS / "comments_in_peaks.msp")
    assert not report
    a, b = spectra
    np.testing.assert_array_equal(a.mz, [110.0713, 138.0662, 195.0877])
    np.testing.assert_array_equal(a.intensities, [20, 100, 40])
    assert (b.id, b.n_peaks) == ("COMMENT-2", 1)


def test_msp_spectrum_types():
    spectra, report = read_all(QUIRKS / "spectrum_types.msp")
    got = {s.id: (s.ms_level, s.metadata.get("spectrum_type")) for s in spectra}
    assert got == {"TYPE-MS2": (2, None), "TYPE-MSMS": (2, None), "TYPE-INSOURCE": (1, "in-source"),
                   "TYPE-GCMS": (1, "GC-MS"), "TYPE-MSLEVEL": (3, None)}
    assert [(e.record, e.reason) for e in report] == [(6, "non-numeric MS level")]
    gcms = by_id(spectra)["TYPE-GCMS"]
    np.testing.assert_array_equal(gcms.mz, [109, 194])
    assert (gcms.precursor_mz, gcms.ion_mode) == (None, "positive")


def test_msp_mixed_separators():
    spectra, report = read_all(QUIRKS / "mixed_separators.msp")
    assert not report
    a, b = spectra
    np.testing.assert_array_equal(a.mz, [42, 55, 110.0713, 138.0662, 139.07, 195.0877])
    np.testing.assert_array_equal(a.intensities, [100, 15, 20, 100, 8, 40])
    assert (b.id, b.precursor_mz, b.adduct) == ("MIXED-2", 195.0877, "[M+H]+")


# -- mzXML ----------------------------------------------------------------------------------------------------

def test_read_mzxml(tmp_path):
    path = SPECTRA / "small.mzXML"
    spectra, report = read_all(path)
    assert [s.id for s in spectra] == ["2", "3"]
    pos, neg = spectra
    np.testing.assert_allclose(pos.mz, [133.065, 151.075, 161.06], rtol=1e-7)  # 32-bit floats, sorted
    np.testing.assert_allclose(pos.intensities, [21905.3, 9239.9, 96508.4], rtol=1e-7)
    assert (pos.precursor_mz, pos.charge, pos.ion_mode, pos.ms_level) == (179.0697, 1, "positive", 2)
    assert pos.metadata["retention_time"] == pytest.approx(2.5 / 60)
    assert (neg.precursor_mz, neg.charge, neg.ion_mode) == (133.014, -1, "negative")
    assert [(e.record, e.reason) for e in report] == [(4, "no precursor m/z"), (5, "no peaks")]
    assert [e.spectrum_id for e in report] == ["4", "5"]   # the scan numbers, as the spectra read are named
    assert [s.id for s in read_mzxml(path)] == ["2", "3"]


def test_mzxml_refuses_other_files(tmp_path):
    from molpredict.errors import InputError

    bad = tmp_path / "bad.mzXML"
    bad.write_text("smiles\tname\nCCO\tethanol\n")
    with pytest.raises(InputError, match="not an mzXML file") as info:
        list(read_spectra(bad))
    assert str(bad) in str(info.value)
    with pytest.raises(InputError, match="no such file"):
        read_spectra(tmp_path / "missing.mzXML")


# -- every format gzipped ---------------------------------------------------------------------------------------

SPECTRA_CORPUS = sorted(p.name for p in QUIRKS.iterdir() if p.suffix in (".mgf", ".msp")) + \
    ["../spectra/small.mzXML", "../spectra/small.mzML", "../spectra/library.msp", "../spectra/quirks.mgf"]


@pytest.mark.parametrize("name", SPECTRA_CORPUS)
def test_every_spectra_format_reads_the_same_gzipped(name, tmp_path):
    path = (QUIRKS / name).resolve()
    plain, plain_report = read_all(path)
    gz = tmp_path / (path.name + ".gz")
    gz.write_bytes(gzip.compress(path.read_bytes()))
    packed, packed_report = read_all(gz)
    assert [s.id for s in packed] == [s.id for s in plain] and plain
    for a, b in zip(plain, packed):
        np.testing.assert_array_equal(a.mz, b.mz)
        assert (a.precursor_mz, a.adduct, a.ion_mode, a.ms_level, a.metadata) == \
               (b.precursor_mz, b.adduct, b.ion_mode, b.ms_level, b.metadata)
    assert [(e.record, e.reason) for e in packed_report] == [(e.record, e.reason) for e in plain_report]


# -- candidate libraries ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, rows", [("bom_complete.tsv", 2), ("bom_smiles_only.tsv", 2), ("bom.smi", 2)])
@pytest.mark.parametrize("packed", [False, True])
def test_candidate_libraries_with_byte_order_mark(name, rows, packed, tmp_path, monkeypatch):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    path = QUIRKS / name
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"
    if packed:
        path = tmp_path / (name + ".gz")
        path.write_bytes(gzip.compress((QUIRKS / name).read_bytes()))
    library = read_library(path, cache=False)
    assert len(library) == rows
    assert list(library.column("smiles"))[1] == "CCO"
    assert library.column("inchikey")[1] == "LFQSCWFLJHTTHZ-UHFFFAOYSA-N"
    if "complete" in name:
        assert list(library.column("source")) == ["a", "b"]
    else:
        assert library.column("name")[0] == "caffeine"


def test_sdf_library_gzipped(tmp_path):
    path = tmp_path / "small.sdf.gz"
    path.write_bytes(gzip.compress((FIXTURES / "molecules" / "small.sdf").read_bytes()))
    with pytest.warns(UserWarning):
        packed = read_library(path)
    with pytest.warns(UserWarning):
        plain = read_library(FIXTURES / "molecules" / "small.sdf")
    assert list(packed.column("inchikey")) == list(plain.column("inchikey")) and len(plain) == 2


def test_candidate_sets_gzipped_and_with_byte_order_mark(tmp_path):
    import json

    from molpredict.chem.candidates import load_candidate_sets

    sets = {"RYYVLZVUVIJVGH": [["RYYVLZVUVIJVGH", "Cn1c(=O)c2c(ncn2C)n(C)c1=O"], ["LFQSCWFLJHTTHZ", "CCO"]]}
    text = json.dumps(sets).encode()
    plain = tmp_path / "sets.json"
    plain.write_bytes(text)
    packed = tmp_path / "sets.json.gz"
    packed.write_bytes(gzip.compress(text))
    expected = {k: [tuple(p) for p in v] for k, v in sets.items()}
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + text)
    assert load_candidate_sets(plain) == load_candidate_sets(packed) == load_candidate_sets(bom) == expected
