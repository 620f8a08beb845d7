"""Property-based fuzzing (hypothesis) of every spectra reader and the candidate-library readers.

Three properties: a reader never raises anything but a one-line ``InputError`` (whatever the bytes); every
record of a file is either read or skipped, exactly once (``read + skipped = records``, and the record numbers
of both together are 1..n); writer -> reader round trips keep every field. The runs are bounded and
deterministic (``derandomize=True``, no example database) so that they belong to the default suite.
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
