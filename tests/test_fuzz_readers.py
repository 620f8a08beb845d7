"""Property-based fuzzing (hypothesis) of every spectra reader and the candidate-library readers.

Three properties: a reader never raises anything but a one-line ``InputError`` (whatever the bytes); every
record of a file is either read or skipped, exactly once (``read + skipped = records``, and the record numbers
of both together are 1..n); writer -> reader round trips keep every field. The runs are bounded and
deterministic (``derandomize=True``, no example database) so that they belong to the default suite. At the end,
one example per damaged value or stream that QA found read silently or with a traceback.
"""
from __future__ import annotations

import gzip
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from molpredict.chem.candidates import CandidateLibrary, load_candidate_sets, read_library
from molpredict.errors import InputError
from molpredict.io.common import adduct_from_name
from molpredict.io import SkipReport, read_mgf, read_spectra, write_mgf
from molpredict.spectra.record import Spectrum

from conftest import FIXTURES

FUZZ = settings(max_examples=40, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# One-line text: no control characters (those make a file "binary"), no line breaks.
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\u2028\u2029\x85"),
               max_size=12)
NUMBER = st.one_of(st.integers(-5, 2000).map(str),
                   st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
                   st.floats(0.001, 2000).map(lambda v: f"{v:.4f}"),
                   st.sampled_from(["1e3", "6.0255e1", "1e999", "nan", "-0", "0", "abc", "", "1.2.3", "+5"]))


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def read_or_refuse(path: Path) -> tuple[list[Spectrum], SkipReport] | None:
    """The spectra and skip report, or None when the whole file is refused (with a one-line InputError)."""
    report = SkipReport()
    try:
        return list(read_spectra(path, report=report)), report
    except InputError as error:
        assert "\n" not in str(error) and str(path) in str(error)
        return None


def assert_sane(spectrum: Spectrum) -> None:
    assert spectrum.mz.ndim == 1 and spectrum.mz.shape == spectrum.intensities.shape
    assert np.isfinite(spectrum.mz).all() and np.isfinite(spectrum.intensities).all()
    assert (spectrum.mz > 0).all() and (spectrum.intensities >= 0).all()
    assert (np.diff(spectrum.mz) >= 0).all()
    assert isinstance(spectrum.ms_level, int) and spectrum.id
    assert spectrum.precursor_mz is None or (math.isfinite(spectrum.precursor_mz) and spectrum.precursor_mz > 0)
    assert spectrum.ion_mode in (None, "positive", "negative")


def assert_partition(path: Path, spectra: list[Spectrum], report: SkipReport, n_records: int) -> None:
    """Each record 1..n is read or skipped, once; skips name the file and a reason."""
    for s in spectra:
        assert_sane(s)
        assert s.file == str(path)
    assert all(e.path == str(path) and e.reason for e in report)
    numbers = sorted([s.record for s in spectra] + [e.record for e in report])
    assert numbers == list(range(1, n_records + 1))


# -- MGF ------------------------------------------------------------------------------------------------------

MGF_KEYS = ["TITLE", "PEPMASS", "PRECURSOR_MZ", "CHARGE", "IONMODE", "ADDUCT", "MSLEVEL", "MS_LEVEL", "NAME",
            "SPECTRUMID", "SCANS", "SMILES", "FORMULA", "precursor_type", "Custom"]
MGF_VALUES = st.one_of(TEXT, NUMBER, st.sampled_from(["1+", "2-", "+1", "0", "n/a", "Positive", "negative",
                                                      "[M+H]+", "M+H", "X M-H", "MS2", "ms/ms", "2+ and 3+"]))
GOOD_PEAK = st.tuples(st.floats(0.001, 2000).map(lambda v: f"{v:.4f}"), st.floats(0, 1e6).map(lambda v: f"{v:g}"))
MGF_LINE = st.one_of(
    GOOD_PEAK.map(" ".join), GOOD_PEAK.map("\t".join), GOOD_PEAK.map(lambda p: f"  {p[0]} {p[1]} annotation"),
    st.tuples(st.sampled_from(MGF_KEYS), MGF_VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.tuples(NUMBER, NUMBER).map(" ".join),
    st.tuples(NUMBER, NUMBER, TEXT).map(lambda t: f"{t[0]}\t{t[1]}\t{t[2]}"),
    NUMBER, st.just(""), st.just("# comment"), TEXT.map(lambda t: "; " + t),
    TEXT.filter(lambda t: t.strip().upper() not in ("BEGIN IONS", "END IONS")),
)
MGF_RECORD = st.tuples(st.one_of(st.lists(GOOD_PEAK.map(" ".join), min_size=1, max_size=4),
                                 st.lists(MGF_LINE, max_size=8)),
                       st.sampled_from([True, True, True, False]))


@FUZZ
@given(globals_=st.lists(st.tuples(st.sampled_from(MGF_KEYS), MGF_VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"),
                         max_size=2),
       records=st.lists(MGF_RECORD, min_size=1, max_size=6), bom=st.booleans(), crlf=st.booleans(),
       packed=st.booleans())
def test_fuzz_mgf_records_are_read_or_skipped(tmp_path, globals_, records, bom, crlf, packed):
    lines = list(globals_)
    for body, closed in records:
        lines += ["BEGIN IONS", *body] + (["END IONS"] if closed else [])
    text = "\n".join(lines) + "\n"
    if crlf:
        text = text.replace("\n", "\r\n")
    data = ("\ufeff" if bom else "").encode() + text.encode("utf-8")
    path = write(tmp_path, "fuzz.mgf.gz" if packed else "fuzz.mgf", gzip.compress(data) if packed else data)
    result = read_or_refuse(path)
    n_records = sum(1 for line in lines if line.strip().upper() == "BEGIN IONS")
    if result is None:  # only a whole file with a bad line before its first record may be refused
        assert any("=" not in g for g in globals_)
        return
    assert_partition(path, *result, n_records)


# -- MSP ------------------------------------------------------------------------------------------------------

MSP_KEYS = ["DB#", "PrecursorMZ", "Precursor_type", "Ion_mode", "Charge", "Spectrum_type", "MSLevel",
            "Formula", "Comments", "SPECTRUMID", "Collision_energy"]
MSP_VALUES = st.one_of(TEXT, NUMBER, st.sampled_from(["P", "N", "Positive", "[M+H]+", "MS2", "in-source", "MS/MS",
                                                      "GC-MS", "1", "-1", "0"]))
# Peak lines start like a number (a line that does not ends the peak list, and what follows belongs to no
# record: the generator keeps to lines that a record can hold).
MSP_PEAK = st.one_of(
    GOOD_PEAK.map(" ".join), GOOD_PEAK.map("\t".join),
    st.lists(st.tuples(st.integers(1, 999), st.integers(0, 999)), min_size=1, max_size=4)
      .map(lambda ps: " ".join(f"{a}:{b}" for a, b in ps)),
    st.lists(st.tuples(st.integers(1, 999), st.integers(0, 999)), min_size=1, max_size=4)
      .map(lambda ps: "; ".join(f"{a} {b}" for a, b in ps) + ";"),
    st.tuples(st.integers(1, 999), NUMBER, TEXT).map(lambda t: f'{t[0]}\t{t[1]}\t"{t[2]}"'),
    st.sampled_from(["5", "1e999 5", "-3 4", "7:", "12 abc", "3:4:5", "1 2 3", "# comment in the peak list"]),
)
MSP_RECORD = st.tuples(TEXT, st.lists(st.tuples(st.sampled_from(MSP_KEYS), MSP_VALUES), max_size=5),
                       st.sampled_from([None, None, None, "1", "2", "x"]),
                       st.one_of(st.lists(GOOD_PEAK.map(" ".join), min_size=1, max_size=3),
                                 st.lists(MSP_PEAK, max_size=5)))


def _msp_record(name: str, headers: list, num_peaks: str | None, peaks: list[str]) -> list[str]:
    lines = [f"Name: {name}"] + [f"{k}: {v}" for k, v in headers]
    if num_peaks is not None:
        lines.append(f"Num Peaks: {num_peaks}")
    return lines + peaks + [""]


@FUZZ
@given(records=st.lists(MSP_RECORD, min_size=1, max_size=5), bom=st.booleans(), packed=st.booleans())
def test_fuzz_msp_records_are_read_or_skipped(tmp_path, records, bom, packed):
    lines = [line for record in records for line in _msp_record(*record)]
    data = ("\ufeff" if bom else "").encode() + "\n".join(lines).encode("utf-8")
    path = write(tmp_path, "fuzz.msp.gz" if packed else "fuzz.msp", gzip.compress(data) if packed else data)
    result = read_or_refuse(path)
    assert result is not None
    assert_partition(path, *result, len(records))


# -- any bytes, and damaged copies of real files, for every reader ----------------------------------------------

SEEDS = {".mgf": FIXTURES / "spectra" / "quirks.mgf", ".msp": FIXTURES / "spectra" / "library.msp",
         ".mzML": FIXTURES / "spectra" / "small.mzML", ".mzXML": FIXTURES / "spectra" / "small.mzXML"}


@st.composite
def damaged(draw, original: bytes) -> bytes:
    """A copy of ``original`` cut short, with bytes overwritten, a range deleted or a range repeated."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        kind = draw(st.sampled_from(["cut", "overwrite", "delete", "repeat", "insert"]))
        i = draw(st.integers(0, len(data) - 1))
        j = min(len(data), i + draw(st.integers(1, 64)))
        if kind == "cut":
            del data[i:]
        elif kind == "overwrite":
            data[i:j] = draw(st.binary(min_size=j - i, max_size=j - i))
        elif kind == "delete":
            del data[i:j]
        elif kind == "repeat":
            data[j:j] = data[i:j]
        else:
            data[i:i] = draw(st.sampled_from([b"<", b">", b"\"", b"=", b"\n", b"&amp;", b"]]>", b"\xff\xfe",
                                              b"<scan num=\"x\">", b"</spectrum>", b"BEGIN IONS\n", b"\t"]))
    return bytes(data)


@pytest.mark.parametrize("suffix", list(SEEDS))
def test_fuzz_damaged_files_never_traceback(tmp_path, suffix):
    original = SEEDS[suffix].read_bytes()

    @FUZZ
    @given(data=damaged(original), packed=st.booleans())
    def check(data, packed):
        path = write(tmp_path, f"damaged{suffix}" + (".gz" if packed else ""),
                     gzip.compress(data) if packed else data)
        result = read_or_refuse(path)
        if result is not None:
            for s in result[0]:
                assert_sane(s)

    check()


@pytest.mark.parametrize("suffix", list(SEEDS))
def test_fuzz_random_bytes_never_traceback(tmp_path, suffix):
    @FUZZ
    @given(data=st.binary(max_size=300))
    def check(data):
        read_or_refuse(write(tmp_path, f"random{suffix}", data))

    check()


# -- round trips ----------------------------------------------------------------------------------------------

METADATA_KEYS = ["smiles", "inchikey", "formula", "compound_name", "instrument_type", "collision_energy",
                 "scans", "feature_id", "spectrum_id", "retention_time", "custom_note"]
VALUE = TEXT.map(lambda t: " ".join(t.split())).filter(bool)


@st.composite
def spectra(draw) -> Spectrum:
    decimals = draw(st.integers(0, 5))
    scale = 10 ** decimals
    ints = draw(st.lists(st.integers(1, 2000 * scale), min_size=1, max_size=20, unique=True))
    mz = np.sort(np.asarray(ints, dtype=np.float64)) / scale
    intensities = np.asarray(draw(st.lists(st.floats(0, 1e12), min_size=len(mz), max_size=len(mz))))
    ion_mode = draw(st.sampled_from(["positive", "negative", None]))
    charge = draw(st.sampled_from([None, 1, 2, 3])) if ion_mode else None
    if charge and ion_mode == "negative":
        charge = -charge
    adduct = draw(st.sampled_from([None, "[M+H]+", "[M+Na]+", "M+H weird"])) if ion_mode == "positive" else \
        draw(st.sampled_from([None, "[M-H]-"])) if ion_mode == "negative" else None
    metadata = draw(st.dictionaries(st.sampled_from(METADATA_KEYS), VALUE, max_size=4))
    precursor_decimals = draw(st.integers(0, 6))
    precursor = draw(st.one_of(st.none(), st.integers(1, 5000 * 10 ** precursor_decimals)))
    if precursor is not None:
        precursor /= 10 ** precursor_decimals
    if precursor is not None and draw(st.booleans()):
        metadata["precursor_intensity"] = draw(st.floats(0, 1e9))
    return Spectrum(id=draw(VALUE), mz=mz, intensities=intensities, precursor_mz=precursor, charge=charge,
                    ion_mode=ion_mode, adduct=adduct, ms_level=draw(st.integers(1, 5)),
                    mz_precision=10.0 ** -decimals, metadata=metadata,
                    precursor_mz_precision=None if precursor is None else 10.0 ** -precursor_decimals)


@FUZZ
@given(originals=st.lists(spectra(), min_size=1, max_size=5), packed=st.booleans())
def test_fuzz_mgf_round_trip_keeps_every_field(tmp_path, originals, packed):
    path = tmp_path / ("round.mgf.gz" if packed else "round.mgf")
    assert write_mgf(originals, path) == len(originals)
    report = SkipReport()
    again = list(read_mgf(path, report=report))
    assert not report and len(again) == len(originals)
    for record, (x, y) in enumerate(zip(originals, again), start=1):
        assert y.id == x.id and (y.file, y.record) == (str(path), record)
        np.testing.assert_array_equal(y.mz, x.mz)
        np.testing.assert_array_equal(y.intensities, x.intensities)
        assert (y.precursor_mz, y.charge, y.ion_mode, y.ms_level) == \
               (x.precursor_mz, x.charge, x.ion_mode, x.ms_level)
        # documented: an adduct the file lacks may come from the compound name's last word
        assert y.adduct == (x.adduct or adduct_from_name(x.metadata.get("compound_name"), x.ion_mode))
        assert y.mz_precision == pytest.approx(x.mz_precision)
        assert y.precursor_mz_precision == pytest.approx(x.precursor_mz_precision)
        assert y.metadata == x.metadata


# -- candidate libraries ------------------------------------------------------------------------------------

CELL = st.one_of(TEXT.map(lambda t: t.replace("\t", " ")), NUMBER,
                 st.sampled_from(["CCO", "c1ccccc1", "C1CC", "CC(=O)O", "[Na+].[Cl-]", "", "nan", "-1"]))
HEADERS = [["smiles", "name"], ["inchikey", "smiles", "formula", "monoisotopic_mass", "source"],
           ["smiles", "monoisotopic_mass", "id"], ["cid", "smiles"]]


@FUZZ
@given(header=st.sampled_from(HEADERS), rows=st.lists(st.lists(CELL, min_size=1, max_size=6), max_size=6),
       bom=st.booleans(), packed=st.booleans())
def test_fuzz_library_tsv_rows_are_kept_or_skipped(tmp_path, monkeypatch, header, rows, bom, packed):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    lines = ["\t".join(header)] + ["\t".join(r) for r in rows]
    data = ("\ufeff" if bom else "").encode() + "\n".join(lines).encode("utf-8")
    path = write(tmp_path, "lib.tsv.gz" if packed else "lib.tsv", gzip.compress(data) if packed else data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            library = read_library(path, cache=False)
        except InputError as error:
            assert "\n" not in str(error)
            return
    report = library.report
    records = sum(1 for line in lines[1:] if line.strip() and not line.startswith("#"))
    if report is not None:  # the fast reader (every column given, all valid) keeps every row
        assert report.n_read == records and len(library) + report.n_skipped == records
        assert all(s.line is not None and 2 <= s.line <= len(lines) for s in report)
    else:
        assert len(library) == records


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".tsv", ".smi", ".sdf", ".json"]))
def test_fuzz_library_readers_refuse_random_bytes_in_one_line(tmp_path, monkeypatch, data, suffix):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    path = write(tmp_path, f"random{suffix}", data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if suffix == ".json":
                load_candidate_sets(path)
            else:
                read_library(path, cache=False)
        except InputError as error:
            assert "\n" not in str(error)


@pytest.mark.parametrize("name", ["small.sdf", "small.smi", "complete.tsv"])
def test_fuzz_damaged_library_files(tmp_path, monkeypatch, name):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    original = (FIXTURES / "molecules" / name).read_bytes()

    @FUZZ
    @given(data=damaged(original))
    def check(data):
        path = write(tmp_path, name, data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                library = read_library(path, cache=False)
            except InputError as error:
                assert "\n" not in str(error)
                return
        if library.report is not None:
            assert len(library) + library.report.n_skipped == library.report.n_read

    check()


SMILES = ["CCO", "c1ccccc1", "CC(=O)O", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "OC1CCCCC1", "N#Cc1ccccc1"]


@FUZZ
@given(picks=st.lists(st.sampled_from(SMILES), min_size=1, max_size=6, unique=True),
       names=st.lists(st.one_of(st.none(), VALUE), min_size=6, max_size=6),
       ids=st.lists(st.one_of(st.none(), VALUE), min_size=6, max_size=6), packed=st.booleans())
def test_fuzz_library_tsv_round_trip_keeps_every_field(tmp_path, monkeypatch, picks, names, ids, packed):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    base = CandidateLibrary.from_smiles(picks, names=names[:len(picks)], source="fuzz")
    columns = {name: list(base.column(name)) for name in base.columns}
    columns["id"] = ids[:len(picks)]
    library = CandidateLibrary(columns)
    path = tmp_path / ("lib.tsv.gz" if packed else "lib.tsv")
    library.to_tsv(path)
    again = read_library(path, cache=False)
    assert again.columns == library.columns
    for column in library.columns:
        if column == "monoisotopic_mass":
            np.testing.assert_allclose(again.column(column), library.column(column), atol=5e-7)
        else:
            assert list(again.column(column)) == list(library.column(column)), column


# -- truncated gzip streams -----------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", list(SEEDS))
def test_fuzz_truncated_gzip_never_traceback(tmp_path, suffix):
    packed = gzip.compress(SEEDS[suffix].read_bytes())

    @FUZZ
    @given(keep=st.integers(0, len(packed) - 1))
    def check(keep):
        read_or_refuse(write(tmp_path, f"cut{suffix}.gz", packed[:keep]))

    check()


# -- regressions: one damaged value or stream at a time, each named in one line ----------------------------------
# Each record or scan with a bad value is skipped with a reason naming the field (and the value, or the scan
# and the array); the others are kept; a cut .gz stops the read with one line saying where.

SPECTRA = FIXTURES / "spectra"
QUERIES = FIXTURES / "bundles" / "sisokr_v0.2_queries.mgf"
MZML_FIRST_MS1_MZ = "AAAAAAAAWUAK16NwPWJmQAAAAAAAUG9A"   # scan=1 (MS1)
MZML_FIRST_MS2_MZ = "UrgeheshZECuR+F6FKJgQGZmZmZm4mJA"   # scan=2 (MS2)
MZXML_MS1_PEAKS = "QsgAAECgAABDMxHsQsgAAA=="            # num 1 (MS1)
MZXML_MS2_PEAKS = "QyEPXEe8fjNDBRCkRqsimkMXEzNGEF+a"    # num 2 (MS2)


def edited(tmp_path: Path, source: Path, name: str, old: str, new: str, count: int = 1) -> Path:
    text = source.read_text()
    assert old in text
    return write(tmp_path, name, text.replace(old, new, count))


def read_with_report(path: Path) -> tuple[list[Spectrum], list[tuple[int, str]]]:
    report = SkipReport()
    spectra = list(read_spectra(path, report=report))
    return spectra, [(e.record, e.reason) for e in report]


@pytest.mark.parametrize("value, reason", [
    ("-377.0861", "PEPMASS -377.0861 is not a positive m/z"),
    ("1e300", "PEPMASS 1e300 is above 100000, not a small-molecule precursor m/z"),
    ("100000.5", "PEPMASS 100000.5 is above 100000, not a small-molecule precursor m/z"),
    ("", "PEPMASS is empty"),
])
def test_mgf_precursor_that_is_not_a_positive_mz_is_skipped(tmp_path, value, reason):
    text = QUERIES.read_text()
    first = text.index("PEPMASS=")
    end = text.index("\n", first)
    path = write(tmp_path, "p.mgf", text[:first] + f"PEPMASS={value}" + text[end:])
    spectra, skips = read_with_report(path)
    assert skips == [(1, reason)]
    assert [s.id for s in spectra] == [s.id for s in read_mgf(QUERIES)][1:]


def test_mgf_pepmass_zero_still_means_unknown(tmp_path):
    path = write(tmp_path, "z.mgf", "BEGIN IONS\nTITLE=a\nPEPMASS=0\n100 1\nEND IONS\n"
                                    "BEGIN IONS\nTITLE=b\nPEPMASS=0\nPRECURSOR_MZ=-5\n100 1\nEND IONS\n")
    spectra, skips = read_with_report(path)
    assert [(s.id, s.precursor_mz) for s in spectra] == [("a", None)]
    assert skips == [(2, "PRECURSOR_MZ -5 is not a positive m/z")]


@pytest.mark.parametrize("value, reason", [
    ("-179.0697", "PrecursorMZ -179.0697 is not a positive m/z"),
    ("1e300", "PrecursorMZ 1e300 is above 100000, not a small-molecule precursor m/z"),
    ("", "PrecursorMZ is empty"),
])
def test_msp_precursor_that_is_not_a_positive_mz_is_skipped(tmp_path, value, reason):
    path = edited(tmp_path, SPECTRA / "library.msp", "library.msp", "PrecursorMZ: 179.0697", f"PrecursorMZ: {value}")
    spectra, skips = read_with_report(path)
    original, original_skips = read_with_report(SPECTRA / "library.msp")
    assert skips == sorted([(1, reason)] + original_skips)
    assert [s.id for s in spectra] == [s.id for s in original][1:]


@pytest.mark.parametrize("value, reason", [
    ("-377.0861", "selected ion m/z -377.0861 is not a positive m/z"),
    ("0", "selected ion m/z 0.0 is not a positive m/z"),
    ("NaN", "non-numeric selected ion m/z"),
    ("1e300", "selected ion m/z 1e+300 is above 100000, not a small-molecule precursor m/z"),
])
def test_mzml_selected_ion_that_is_not_a_positive_mz_is_skipped(tmp_path, value, reason):
    path = edited(tmp_path, SPECTRA / "small.mzML", "bad.mzML", 'name="selected ion m/z" value="179.0697"',
                  f'name="selected ion m/z" value="{value}"')
    spectra, skips = read_with_report(path)
    assert skips == [(2, reason), (4, "no precursor m/z")]
    assert [s.id for s in spectra] == ["scan=3"]


def test_mzxml_precursor_that_is_not_a_positive_mz_is_skipped(tmp_path):
    path = edited(tmp_path, SPECTRA / "small.mzXML", "bad.mzXML", ">179.0697<", ">-179.0697<")
    spectra, skips = read_with_report(path)
    assert skips == [(2, "precursorMz -179.0697 is not a positive m/z"), (4, "no precursor m/z"),
                     (5, "no peaks")]
    assert [s.id for s in spectra] == ["3"]


@pytest.mark.parametrize("binary, problem", [("!!!notbase64@@@", "invalid base64"),
                                             ("UrgeheshZECuR+F6", "buffer size must be a multiple of element size")])
def test_mzml_broken_array_skips_only_its_spectrum(tmp_path, binary, problem):
    path = edited(tmp_path, SPECTRA / "small.mzML", "bad.mzML", MZML_FIRST_MS2_MZ, binary)
    spectra, skips = read_with_report(path)
    assert skips == [(2, f"unreadable m/z array in spectrum 'scan=2' ({problem})"), (4, "no precursor m/z")]
    assert [s.id for s in spectra] == ["scan=3"]


def test_mzml_broken_array_of_an_ms1_scan_does_not_matter(tmp_path):
    path = edited(tmp_path, SPECTRA / "small.mzML", "bad.mzML", MZML_FIRST_MS1_MZ, "!!!notbase64@@@")
    spectra, skips = read_with_report(path)
    original, original_skips = read_with_report(SPECTRA / "small.mzML")
    assert skips == original_skips and [s.id for s in spectra] == [s.id for s in original] == ["scan=2", "scan=3"]
    for a, b in zip(spectra, original):
        np.testing.assert_array_equal(a.mz, b.mz)


def test_mzml_array_that_is_not_in_its_compression_is_skipped(tmp_path):
    path = edited(tmp_path, SPECTRA / "small.mzML", "bad.mzML", 'accession="MS:1000576" name="no compression"',
                  'accession="MS:1000574" name="zlib compression"', count=-1)
    spectra, skips = read_with_report(path)
    assert spectra == []
    assert skips == [(2, "unreadable m/z array in spectrum 'scan=2' (cannot zlib-decompress)"),
                     (3, "unreadable m/z array in spectrum 'scan=3' (cannot zlib-decompress)"),
                     (4, "unreadable m/z array in spectrum 'scan=4' (cannot zlib-decompress)")]


def test_mzml_unknown_compression_is_not_read_as_raw_numbers(tmp_path):
    """pyteomics reads an array in a compression it does not know (MS-Numpress without pynumpress) as
    uncompressed numbers: a silent wrong answer."""
    path = edited(tmp_path, SPECTRA / "small.mzML", "bad.mzML", 'accession="MS:1000576" name="no compression"',
                  'accession="MS:1002312" name="MS-Numpress linear prediction compression"', count=-1)
    spectra, skips = read_with_report(path)
    assert spectra == []
    reason = ("m/z array compressed with 'MS-Numpress linear prediction compression', which this reader cannot "
              "decode")
    assert skips == [(2, reason), (3, reason), (4, reason)]


def test_mzxml_broken_peaks_skip_only_their_scan(tmp_path):
    path = edited(tmp_path, SPECTRA / "small.mzXML", "bad.mzXML", MZXML_MS2_PEAKS, "!!!notbase64@@@")
    spectra, skips = read_with_report(path)
    assert skips == [(2, "unreadable m/z array in scan 2 (invalid base64)"), (4, "no precursor m/z"),
                     (5, "no peaks")]
    assert [s.id for s in spectra] == ["3"]
    path = edited(tmp_path, SPECTRA / "small.mzXML", "ms1.mzXML", MZXML_MS1_PEAKS, "!!!bad")
    assert [s.id for s in read_with_report(path)[0]] == ["2", "3"]
    path = edited(tmp_path, SPECTRA / "small.mzXML", "bzip.mzXML", f'compressionType="none" compressedLen="0">'
                  f'{MZXML_MS2_PEAKS}', f'compressionType="bzip" compressedLen="0">{MZXML_MS2_PEAKS}')
    spectra, skips = read_with_report(path)
    assert skips[0] == (2, "m/z array compressed with 'bzip', which this reader cannot decode")
    assert [s.id for s in spectra] == ["3"]


def _cut_gzip(tmp_path: Path, source: Path, name: str, fraction: float) -> Path:
    packed = gzip.compress(source.read_bytes())
    return write(tmp_path, name, packed[:int(len(packed) * fraction)])


@pytest.mark.parametrize("source, name", [(QUERIES, "t.mgf.gz"), (SPECTRA / "library.msp", "t.msp.gz"),
                                          (SPECTRA / "small.mzML", "t.mzML.gz"),
                                          (SPECTRA / "small.mzXML", "t.mzXML.gz")])
def test_truncated_gzip_is_one_line_naming_the_file(tmp_path, source, name):
    path = _cut_gzip(tmp_path, source, name, 0.5)
    with pytest.raises(InputError, match=r"truncated gzip stream (after (record|scan) \d+|before the first)") as info:
        list(read_spectra(path))
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_truncated_gzip_keeps_the_records_before_it(tmp_path):
    path = _cut_gzip(tmp_path, QUERIES, "t.mgf.gz", 0.75)
    report = SkipReport()
    reader = read_mgf(path, report=report)
    read = []
    with pytest.raises(InputError) as info:
        for spectrum in reader:
            read.append(spectrum.id)
    n = len(read) + len(report)
    assert n > 0 and f"truncated gzip stream after record {n} " in str(info.value)
    assert read == [s.id for s in read_mgf(QUERIES)][:n]


def test_cli_truncated_gzip_is_one_line_and_no_abort(tmp_path):
    from click.testing import CliRunner

    from molpredict.cli import cli

    path = _cut_gzip(tmp_path, QUERIES, "t.mgf.gz", 0.5)
    result = CliRunner().invoke(cli, ["spectra", "info", str(path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and "Aborted" not in result.output
    assert len(lines) == 1 and lines[0].startswith(f"molpredict: error: {path}: truncated gzip stream")


def test_lines_outside_records_are_warned_about_once_per_file(tmp_path, caplog):
    mgf = write(tmp_path, "stray.mgf", "BEGIN IONS\nTITLE=a\n100 1\nEND IONS\n# a comment\n\n200 2\nTITLE=lost\n"
                                       "BEGIN IONS\nTITLE=b\n100 1\nEND IONS\n")
    msp = write(tmp_path, "stray.msp", "Name: a\nNum Peaks: 1\n100 1\n\n200 2\n300 3\n\nName: b\nNum Peaks: 1\n100 1\n")
    with caplog.at_level("WARNING", logger="molpredict.io"):
        assert [s.id for s in read_spectra(mgf, report=SkipReport())] == ["a", "b"]
        assert [s.id for s in read_spectra(msp, report=SkipReport())] == ["stray:1", "stray:2"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{mgf}: 2 line(s) between END IONS and the next BEGIN IONS ignored",
        f"{msp}: 2 line(s) outside any record ignored (peaks after a blank line, without a Name: header)"]


@pytest.mark.parametrize("name, text", [("latin1.mgf", "BEGIN IONS\nTITLE=Äpfelsäure\n100 1\nEND IONS\n"),
                                        ("latin1.msp", "Name: Äpfelsäure\nNum Peaks: 1\n100 1\n")])
def test_latin1_text_is_not_replaced_silently(tmp_path, caplog, name, text):
    path = write(tmp_path, name, text.encode("latin-1"))
    with caplog.at_level("WARNING", logger="molpredict.io"):
        spectra = list(read_spectra(path, report=SkipReport()))
    assert len(spectra) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 1 line(s) with bytes that are not UTF-8, read as U+FFFD (is the file Latin-1?)"]
