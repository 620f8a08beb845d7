"""Spectra I/O and cleaning: reader quirks, skip reports, refusing non-spectra files, the MGF writer's round trip,
cleaning steps against hand-computed values, array serialisation, the ``spectra info`` command, real data."""
from __future__ import annotations

import gzip
import json
import random
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import molpredict.io.mgf as mgf_module
from molpredict.cli import cli
from molpredict.errors import InputError, ModelFileError, SpecError
from molpredict.spectra.cleaning import CleaningPipeline, count_empty, filter_ms_level, filter_relative_intensity, keep_top_peaks, merge_close_peaks, normalize_intensities, remove_precursor_peak, select_mz_range, transform_intensities
from molpredict.io import SkipReport, read_mgf, read_msp, read_mzml, read_spectra, spectra_from_arrays, spectra_to_arrays, write_mgf
from molpredict.spectra.record import Spectrum

from conftest import FIXTURES, require_shared

SPECTRA = FIXTURES / "spectra"

# A PNG header (signature + IHDR chunk of a 1x1 image): what a user passes by mistake.
PNG_BYTES = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489")


def assert_same_spectra(a: list[Spectrum], b: list[Spectrum]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.id == y.id
        np.testing.assert_array_equal(x.mz, y.mz)
        np.testing.assert_array_equal(x.intensities, y.intensities)
        assert (x.precursor_mz, x.charge, x.ion_mode, x.adduct, x.ms_level) == \
               (y.precursor_mz, y.charge, y.ion_mode, y.adduct, y.ms_level)
        assert x.mz_precision == pytest.approx(y.mz_precision) if x.mz_precision else y.mz_precision is None
        assert x.metadata == y.metadata


# -- MGF quirks -------------------------------------------------------------------------------------------------

@pytest.fixture(params=["lf", "crlf", "gz"])
def quirks_path(request, tmp_path) -> Path:
    """The quirks fixture with LF line ends, CRLF line ends, and gzipped (the record ids use the file stem)."""
    data = (SPECTRA / "quirks.mgf").read_bytes().replace(b"\r\n", b"\n")
    path = tmp_path / "quirks.mgf"
    if request.param == "crlf":
        data = data.replace(b"\n", b"\r\n")
        assert data.count(b"\r\n") == data.count(b"\n") > 50
    if request.param == "gz":
        path = tmp_path / "quirks.mgf.gz"
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_read_mgf_quirks(quirks_path):
    report = SkipReport()
    spectra = list(read_mgf(quirks_path, report=report))
    assert report.count == 0, list(report)
    assert [s.id for s in spectra] == ["rec-1", "rec-2 lower-case keys", "feat-3", "4", "quirks:5",
                                       "rec-6 unknown ion mode, charge decides", "rec-7 no PEPMASS, adduct decides"]
    s1, s2, s3, s4, s5, s6, s7 = spectra

    # PEPMASS with intensity; all the matchms-style keys; a global key inherited; tab-separated peak
    assert s1.precursor_mz == 179.07 and s1.metadata["precursor_intensity"] == 12345.0
    assert (s1.charge, s1.ion_mode, s1.adduct, s1.ms_level) == (1, "positive", "[M+H]+", 2)
    assert s1.metadata == {
        "precursor_intensity": 12345.0, "mass": "Monoisotopic", "compound_name": "Mellein",
        "smiles": "CC1Cc2cccc(O)c2C(=O)O1", "inchikey": "KWILGNNWGSNMPA-UHFFFAOYSA-N",
        "inchi": "InChI=1S/C10H10O3/c1-6-5-7-3-2-4-8(11)9(7)10(12)13-6/h2-4,6,11H,5H2,1H3",
        "formula": "C10H10O3", "license": "CC BY-SA", "instrument_type": "LC-ESI-ITFT",
        "collision_energy": "10(NCE)"}
    assert s1.smiles == "CC1Cc2cccc(O)c2C(=O)O1" and s1.formula == "C10H10O3"
    np.testing.assert_array_equal(s1.mz, [133.065, 151.0751, 161.06])
    np.testing.assert_array_equal(s1.intensities, [21905.3, 9239.9, 96508.4])
    assert s1.mz_precision == pytest.approx(1e-4)

    # lower-case keys, "+1", PRECURSOR_TYPE, comment inside a record, indented peak line, a third
    # column, unsorted peaks
    assert (s2.precursor_mz, s2.charge, s2.ion_mode, s2.adduct) == (250.5, 1, "positive", "[M+Na]+")
    np.testing.assert_array_equal(s2.mz, [100.1, 150.125, 200.25])
    np.testing.assert_array_equal(s2.intensities, [10, 30, 20])
    assert s2.mz_precision == pytest.approx(1e-3)
    assert s2.metadata == {"mass": "Monoisotopic"}

    # id from FEATURE_ID (SCANS kept), unsigned charge takes the negative ion mode's sign
    assert (s3.charge, s3.ion_mode) == (-1, "negative")
    assert s3.metadata["feature_id"] == "feat-3" and s3.metadata["scans"] == "77"
    assert s3.mz_precision == pytest.approx(0.1)

    # id from SCANS; "2-"; ion mode from the charge; intensities in exponent notation
    assert (s4.charge, s4.ion_mode, s4.precursor_mz) == (-2, "negative", 400.2)
    np.testing.assert_array_equal(s4.intensities, [1500.0, 250.0])
    assert s4.mz_precision == pytest.approx(0.1)

    # id "<stem>:<record>"; "-1"; MSLEVEL; unknown keys kept lower-cased
    assert (s5.charge, s5.ion_mode, s5.ms_level) == (-1, "negative", 3)
    assert s5.metadata["rtinseconds"] == "12.5" and s5.metadata["custom_key"] == "some value"
    assert s5.mz_precision == pytest.approx(0.01)

    # an unreadable IONMODE is dropped and inferred from the charge
    assert (s6.charge, s6.ion_mode) == (2, "positive") and "ionmode" not in s6.metadata

    # no PEPMASS, no CHARGE: ion mode from the adduct; m/z in exponent notation (6.0255e1: 3 decimals)
    assert (s7.precursor_mz, s7.charge, s7.ion_mode) == (None, None, "negative")
    np.testing.assert_array_equal(s7.mz, [60.255])
    assert s7.mz_precision == pytest.approx(1e-3)


def test_readers_stream(tmp_path):
    """Generators that hold at most a batch of records: the first spectrum comes before the file is read."""
    path = tmp_path / "stream.mgf"
    path.write_text("".join(f"BEGIN IONS\nTITLE=s{i}\n100 1\nEND IONS\n" for i in range(3000)))
    reader = read_mgf(path)
    assert isinstance(reader, types.GeneratorType)
    assert next(reader).id == "s0"
    assert sum(1 for _ in reader) == 2999
    assert isinstance(read_msp(SPECTRA / "library.msp"), types.GeneratorType)


# -- skip report ----------------------------------------------------------------------------------------------

# (record, reason, the record's TITLE: each skip names the id the record was read with)
BAD_EXPECTED_SKIPS = [
    (2, "no peaks", "no-peaks"),
    (3, "non-numeric peak", "non-numeric-peak"),
    (4, "non-numeric PEPMASS", "bad-pepmass"),
    (5, "non-numeric CHARGE", "bad-charge"),
    (6, "missing END IONS", "unterminated"),
    (8, "incomplete peak line", "incomplete"),
    (9, "non-finite peak", "nan-peak"),
    (10, "negative m/z or intensity", "negative"),
    (11, "non-numeric MSLEVEL", "bad-mslevel"),
    (13, "missing END IONS", "eof"),
]


@pytest.mark.parametrize("batch", [1, 3, 512])
def test_bad_records_are_skipped_and_reported(monkeypatch, batch):
    """Batch sizes 1 and 3 put bad records at batch edges and next to good ones in the fast path."""
    monkeypatch.setattr(mgf_module, "_BATCH_RECORDS", batch)
    path = SPECTRA / "bad.mgf"
    report = SkipReport()
    spectra = list(read_mgf(path, report=report))
    assert [s.id for s in spectra] == ["good-1", "good-7", "good-12"]
    assert list(report) == [(str(path), record, reason, title) for record, reason, title in BAD_EXPECTED_SKIPS]
    assert report.count == len(report) == 10
    assert report.by_reason()["missing END IONS"] == 2
    lines = report.summary().splitlines()
    assert len(lines) == 9
    assert lines[0] == "2 records skipped: missing END IONS"
    assert "1 record skipped: no peaks" in lines


def test_skips_are_logged_without_a_report(caplog):
    spectra = list(read_mgf(SPECTRA / "bad.mgf"))
    assert len(spectra) == 3
    assert "skipped 10 record(s)" in caplog.text and "bad.mgf" in caplog.text


def _read_ids(path: Path, text: str) -> tuple[list[str], list[str | None]]:
    """The ids of the spectra read from ``text`` written to ``path``, and those of its skipped records."""
    path.write_text(text)
    report = SkipReport()
    return [s.id for s in read_spectra(path, report=report)], [e.spectrum_id for e in report]


@pytest.mark.parametrize("fmt", ["mgf", "msp"])
def test_a_skipped_record_names_the_id_it_would_have_been_read_with(tmp_path, fmt):
    """A record skipped after its id was read carries that id (or the reader's ``<stem>:<record>`` fallback), the
    very id the same record gets once repaired, so that the skipped table joins with the results."""
    if fmt == "mgf":
        record = "BEGIN IONS\n{title}PEPMASS=100.5\n{peak}\nEND IONS\n"
        titles = ["TITLE=titled\n", ""]
    else:
        record = "Name: compound\n{title}PrecursorMZ: 100.5\nNum Peaks: 1\n{peak}\n\n"
        titles = ["DB#: titled\n", ""]
    path = tmp_path / f"queries.{fmt}"
    read, skipped = _read_ids(path, "".join(record.format(title=t, peak="50.0 abc") for t in titles))
    assert read == [] and skipped == ["titled", "queries:2"]
    read, skipped = _read_ids(path, "".join(record.format(title=t, peak="50.0 10.0") for t in titles))
    assert read == ["titled", "queries:2"] and skipped == []
    if fmt == "mgf":  # a record cut short by the next BEGIN IONS, or by the end of the file, keeps its TITLE too
        _, skipped = _read_ids(path, "BEGIN IONS\nTITLE=cut\n50.0 10.0\nBEGIN IONS\nTITLE=last\n50.0 10.0\n")
        assert skipped == ["cut", "last"]


def test_fast_path_agrees_with_reference_parser(monkeypatch):
    """The batched conversion gives exactly what the per-record reference parser gives."""
    fast = list(read_mgf(SPECTRA / "quirks.mgf"))
    monkeypatch.setattr(mgf_module, "_parse_batch",
                        lambda batch: [mgf_module._parse_peaks(lines) if lines else "no peaks" for lines in batch])
    reference = list(read_mgf(SPECTRA / "quirks.mgf"))
    assert_same_spectra(fast, reference)


# -- files that are not spectra -------------------------------------------------------------------------------

def _not_spectra_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "png": (".mgf", PNG_BYTES),
        "tsv": (".mgf", b"smiles\tname\nCCO\tethanol\n"),
        "empty": (".mgf", b""),
        "blank": (".mgf", b"\n\n# only a comment\n"),
        "garbage": (".mgf", random.Random(0).randbytes(4096)),
        "tsv_msp": (".msp", b"smiles\tname\nCCO\tethanol\n"),
        "empty_msp": (".msp", b""),
        "png_msp": (".msp", PNG_BYTES),
        "tsv_mzml": (".mzML", b"smiles\tname\nCCO\tethanol\n"),
    }
    out = {}
    for name, (suffix, data) in files.items():
        path = tmp_path / f"{name}{suffix}"
        path.write_bytes(data)
        out[name] = path
    return out


def test_non_spectra_files_raise_input_error(tmp_path):
    for name, path in _not_spectra_files(tmp_path).items():
        with pytest.raises(InputError) as info:
            list(read_spectra(path))
        message = str(info.value)
        assert str(path) in message and "\n" not in message, name
    for name in ("table.tsv", "image.png", "noext"):
        (tmp_path / name).write_text("x")
        with pytest.raises(InputError, match="unknown spectra format"):
            read_spectra(tmp_path / name)
    with pytest.raises(InputError, match="no such file"):
        read_mgf(tmp_path / "missing.mgf")


def test_cli_refuses_non_spectra_file_in_one_line(tmp_path):
    runner = CliRunner()
    for name, path in _not_spectra_files(tmp_path).items():
        result = runner.invoke(cli, ["spectra", "info", str(path)])
        assert result.exit_code == 2, (name, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("molpredict: error:") and str(path) in lines[0], name


# -- CLI ------------------------------------------------------------------------------------------------------

def test_cli_spectra_info():
    runner = CliRunner()
    result = runner.invoke(cli, ["spectra", "info", str(SPECTRA / "bad.mgf"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["spectra"] == 3 and info["skipped"] == 10
    assert info["skipped_by_reason"]["missing END IONS"] == 2
    assert info["skipped_examples"]["missing END IONS"] == [6, 13]
    assert info["peaks_per_spectrum"] == {"min": 1, "median": 1.0, "mean": 1.0, "max": 1, "total": 3}

    result = runner.invoke(cli, ["spectra", "info", str(SPECTRA / "quirks.mgf"), "--json"])
    info = json.loads(result.output)
    assert info["spectra"] == 7 and info["skipped"] == 0
    assert info["ion_modes"] == {"negative": 4, "positive": 3}
    assert info["adducts"] == {"(none)": 4, "[M+H]+": 1, "[M+Na]+": 1, "[M-H]-": 1}
    assert info["with_structure"] == 2 and info["with_smiles"] == 2 and info["with_inchikey"] == 1
    assert info["ms_levels"] == {"2": 6, "3": 1}
    assert info["peaks_per_spectrum"]["total"] == 3 + 3 + 1 + 2 + 1 + 1 + 1

    result = runner.invoke(cli, ["spectra", "info", str(SPECTRA / "bad.mgf")])
    assert result.exit_code == 0
    assert "spectra: 3" in result.output
    assert "missing END IONS: 2 (records 6, 13)" in result.output


def test_cli_spectra_info_says_what_the_default_cleaning_would_skip():
    """What `train` and `identify` would skip after the reader, with the same cleaning: here record 5 (its only
    peak is removed) and the MS3 record of quirks.mgf."""
    from molpredict.spectra.cleaning import CleaningPipeline

    runner = CliRunner()
    edge = Path(__file__).parent / "fixtures" / "identification" / "edge_cases.mgf"
    info = json.loads(runner.invoke(cli, ["spectra", "info", str(edge), "--json"]).output)
    cleaned = [CleaningPipeline()(s) for s in read_mgf(edge)]
    assert [s.record for s, c in zip(read_mgf(edge), cleaned) if c is not None and c.n_peaks == 0] == [5]
    assert info["cleaning_would_skip"] == {"no peaks after cleaning": 1}
    assert info["cleaning_examples"] == {"no peaks after cleaning": [5]}
    text = runner.invoke(cli, ["spectra", "info", str(edge)]).output
    assert "cleaning would skip: 1 " in text and "  no peaks after cleaning: 1 (record 5)" in text
    quirks = json.loads(runner.invoke(cli, ["spectra", "info", str(SPECTRA / "quirks.mgf"), "--json"]).output)
    assert quirks["cleaning_would_skip"].get("MS level 3 (not 2)") == 1


# -- MSP and mzML ---------------------------------------------------------------------------------------------

def test_read_msp():
    path = SPECTRA / "library.msp"
    report = SkipReport()
    spectra = list(read_spectra(path, report=report))
    assert [s.id for s in spectra] == ["MSBNK-TEST-0001", "library:2", "T3"]
    s1, s2, s3 = spectra
    # several peaks per line separated by ";", tabs, quoted annotations (one holding a ";")
    np.testing.assert_array_equal(s1.mz, [133.065, 151.075, 155.974, 161.06, 179.07])
    np.testing.assert_array_equal(s1.intensities, [21905.3, 9239.9, 10980.9, 96508.4, 72563.9])
    assert (s1.precursor_mz, s1.adduct, s1.ion_mode, s1.ms_level, s1.charge) == \
           (179.0697, "[M+H]+", "positive", 2, None)
    assert s1.mz_precision == pytest.approx(1e-3)
    assert s1.metadata["compound_name"] == "Mellein"
    assert s1.inchikey == "KWILGNNWGSNMPA-UHFFFAOYSA-N" and s1.smiles == "CC1Cc2cccc(O)c2C(=O)O1"
    assert s1.metadata["collision_energy"] == "10(NCE)" and s1.metadata["formula"] == "C10H10O3"
    assert s1.metadata["synon"].startswith("8-hydroxy")
    # unsorted peaks, ion mode "Negative"; the next record follows without a blank line
    np.testing.assert_array_equal(s2.mz, [90.25, 100.5])
    np.testing.assert_array_equal(s2.intensities, [20, 10])
    assert (s2.ion_mode, s2.adduct, s2.precursor_mz) == ("negative", "[M-H]-", 301.1)
    # "Ion_mode: N" signs an unsigned charge
    assert (s3.ion_mode, s3.charge, s3.precursor_mz) == ("negative", -1, 200.0)
    assert s3.mz_precision == 1.0
    assert list(report) == [(str(path), 4, "Num Peaks differs from the peaks found", "T4"),
                            (str(path), 5, "no peaks", "T5"), (str(path), 6, "non-numeric peak", "T6"),
                            (str(path), 7, "non-numeric PrecursorMZ", "T7")]


def test_read_mzml(tmp_path):
    path = SPECTRA / "small.mzML"
    report = SkipReport()
    spectra = list(read_spectra(path, report=report))
    assert [s.id for s in spectra] == ["scan=2", "scan=3"]
    s2, s3 = spectra
    np.testing.assert_array_equal(s2.mz, [133.065, 151.075, 161.06])  # sorted
    np.testing.assert_array_equal(s2.intensities, [21905.3, 9239.9, 96508.4])
    assert (s2.precursor_mz, s2.charge, s2.ion_mode, s2.ms_level) == (179.0697, 1, "positive", 2)
    assert s2.metadata["retention_time"] == 2.0
    assert (s3.precursor_mz, s3.charge, s3.ion_mode) == (133.014, -1, "negative")
    assert list(report) == [(str(path), 4, "no precursor m/z", "scan=4")]
    assert_same_spectra(spectra, list(read_mzml(path)))
    gz = tmp_path / "small.mzML.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert [s.id for s in read_spectra(gz)] == ["scan=2", "scan=3"]


# -- writer -----------------------------------------------------------------------------------------------------

def test_write_mgf_round_trip(tmp_path, quirks_path):
    original = list(read_mgf(quirks_path))
    out = tmp_path / "out.mgf"
    assert write_mgf(original, out) == len(original)
    again = list(read_mgf(out))
    # ids that came from the file stem are written as TITLE, so they survive under another file name
    assert_same_spectra(original, again)
    # and into an open stream, gzipped
    gz = tmp_path / "out.mgf.gz"
    with gzip.open(gz, "wt") as handle:
        write_mgf(original, handle)
    assert_same_spectra(original, list(read_mgf(gz)))


def test_write_mgf_round_trip_of_arbitrary_values(tmp_path):
    rng = np.random.default_rng(0)
    spectra = []
    for i in range(20):
        n = int(rng.integers(1, 30))
        precision = None if i % 4 else 1e-4
        mz = np.sort(rng.uniform(1e-3, 2000, n))
        if precision:  # m/z as an instrument reports them; the writer pads 123.45 to 123.4500
            mz = np.unique(np.round(mz, 4))
            n = mz.shape[0]
        mode = [None, "positive", "negative", "positive", "negative"][i % 5]
        spectra.append(Spectrum(
            id=f"s {i}", mz=mz, intensities=rng.uniform(0, 1e9, n) * (rng.random(n) > 0.1),
            precursor_mz=None if i % 3 == 0 else float(rng.uniform(50, 2000)),
            charge=[None, 1, -1, 2, -3][i % 5], ion_mode=mode,
            adduct="[M+H]+" if mode == "positive" and i % 2 == 0 else None, ms_level=2 + i % 2,
            mz_precision=precision,
            metadata={"smiles": "CCO", "compound_name": "ethanol\nwith newline"} if i % 2 else {}))
    path = tmp_path / "random.mgf"
    write_mgf(spectra, path)
    again = list(read_mgf(path))
    assert len(again) == len(spectra)
    for x, y in zip(spectra, again):
        assert y.id == x.id
        np.testing.assert_array_equal(y.mz, x.mz)  # bit for bit
        np.testing.assert_array_equal(y.intensities, x.intensities)
        assert (y.precursor_mz, y.charge, y.ion_mode, y.adduct, y.ms_level) == \
               (x.precursor_mz, x.charge, x.ion_mode, x.adduct, x.ms_level)
        if x.mz_precision is not None:
            assert y.mz_precision == pytest.approx(x.mz_precision)
        if x.metadata:
            assert y.metadata == {"smiles": "CCO", "compound_name": "ethanol with newline"}
    # documented: an absent ion mode is inferred on reading (here from the adduct)
    write_mgf([Spectrum(id="x", mz=[1.0], intensities=[1.0], adduct="[M-H]-")], path)
    assert next(read_mgf(path)).ion_mode == "negative"


# -- cleaning ---------------------------------------------------------------------------------------------------

def spec(mz, intensities, precursor=None, level=2) -> Spectrum:
    return Spectrum(id="t", mz=np.asarray(mz, float), intensities=np.asarray(intensities, float),
                    precursor_mz=precursor, ms_level=level)


def test_filter_ms_level():
    s = spec([1.0], [1.0], level=3)
    assert filter_ms_level(s) is None
    assert filter_ms_level(s, level=3) is s


def test_select_mz_range():
    s = spec([10, 50, 100, 100.4, 100.6, 200], [1, 2, 3, 4, 5, 6], precursor=100.0)
    np.testing.assert_array_equal(select_mz_range(s, precursor_margin=0.5).mz, [10, 50, 100, 100.4])
    np.testing.assert_array_equal(select_mz_range(s, mz_min=20, precursor_margin=0.5).intensities, [2, 3, 4])
    np.testing.assert_array_equal(select_mz_range(s, mz_max=60, precursor_margin=0.5).mz, [10, 50])
    np.testing.assert_array_equal(select_mz_range(s, mz_min=150).mz, [200])
    no_precursor = spec([10, 500], [1, 1])
    np.testing.assert_array_equal(select_mz_range(no_precursor, precursor_margin=0.5).mz, [10, 500])


def test_remove_precursor_peak():
    s = spec([50, 99.9, 99.99, 100.01, 100.1], [1, 2, 3, 4, 5], precursor=100.0)
    out = remove_precursor_peak(s, tolerance=0.02)
    np.testing.assert_array_equal(out.mz, [50, 99.9, 100.1])
    np.testing.assert_array_equal(out.intensities, [1, 2, 5])
    assert remove_precursor_peak(spec([100.0], [1])).n_peaks == 1  # unknown precursor: nothing removed


def test_merge_close_peaks():
    s = spec([100.0, 100.004, 100.008, 100.5, 200.0, 200.009], [1, 3, 0, 5, 2, 2])
    out = merge_close_peaks(s, tolerance=0.01)
    np.testing.assert_allclose(out.mz, [100.003, 100.5, 200.0045], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(out.intensities, [4, 5, 4])
    zero = merge_close_peaks(spec([10.0, 10.001], [0, 0]), tolerance=0.01)
    np.testing.assert_allclose(zero.mz, [10.0005])
    np.testing.assert_array_equal(zero.intensities, [0])
    assert merge_close_peaks(spec([1.0, 2.0], [1, 1]), tolerance=0.01).n_peaks == 2


def test_filter_relative_intensity_and_top_peaks():
    s = spec([1, 2, 3, 4, 5], [100, 10, 9.99, 0, 50])
    np.testing.assert_array_equal(filter_relative_intensity(s, 0.1).mz, [1, 2, 5])
    t = spec([1, 2, 3, 4, 5], [5, 9, 5, 9, 1])
    np.testing.assert_array_equal(keep_top_peaks(t, 2).mz, [2, 4])
    np.testing.assert_array_equal(keep_top_peaks(t, 3).mz, [1, 2, 4])  # tie 5 vs 5: lower m/z wins
    assert keep_top_peaks(t, 10) is t


def test_transform_and_normalize():
    s = spec([1, 2], [4, 9])
    np.testing.assert_array_equal(transform_intensities(s, "sqrt").intensities, [2, 3])
    np.testing.assert_allclose(transform_intensities(s, "log1p").intensities, np.log([5, 10]))
    assert transform_intensities(s, "none") is s
    np.testing.assert_array_equal(normalize_intensities(spec([1, 2], [2, 4]), "max").intensities, [0.5, 1])
    np.testing.assert_allclose(normalize_intensities(spec([1, 2], [1, 2]), "sum").intensities, [1 / 3, 2 / 3])
    np.testing.assert_allclose(normalize_intensities(spec([1, 2], [3, 4]), "l2").intensities, [0.6, 0.8])
    np.testing.assert_array_equal(normalize_intensities(spec([1], [0]), "max").intensities, [0])
    with pytest.raises(SpecError):
        transform_intensities(s, "cube")


def test_cleaning_pipeline_by_hand():
    s = spec([50, 80, 80.001, 120, 150, 199.995, 200.3, 201.0], [1, 36, 28, 100, 0.5, 1000, 4, 50],
             precursor=200.0)
    before = (s.mz.copy(), s.intensities.copy())
    out = CleaningPipeline()(s)
    # m/z <= 200.5 drops 201.0; the precursor peak 199.995 goes; 80 and 80.001 merge (64 at the weighted m/z);
    # the floor (1% of 100) drops 0.5; sqrt then max-normalisation
    np.testing.assert_allclose(out.mz, [50, 80 + 0.001 * 28 / 64, 120, 200.3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.intensities, [0.1, 0.8, 1.0, 0.2])
    # pure: the input is untouched
    np.testing.assert_array_equal(s.mz, before[0])
    np.testing.assert_array_equal(s.intensities, before[1])
    assert out.id == s.id and out.precursor_mz == 200.0

    capped = CleaningPipeline(max_peaks=2, transform="none", normalize="none", precursor_tolerance=None)(s)
    np.testing.assert_array_equal(capped.mz, [120, 199.995])


def _composed(pipeline: CleaningPipeline, s: Spectrum) -> Spectrum | None:
    """The pipeline written as a chain of the public step functions (the reference for its fused version)."""
    if pipeline.ms_level is not None and filter_ms_level(s, pipeline.ms_level) is None:
        return None
    s = select_mz_range(s, pipeline.mz_min, pipeline.mz_max, pipeline.precursor_margin)
    if pipeline.precursor_tolerance is not None:
        s = remove_precursor_peak(s, pipeline.precursor_tolerance)
    if pipeline.merge_tolerance:
        s = merge_close_peaks(s, pipeline.merge_tolerance)
    s = filter_relative_intensity(s, pipeline.min_relative_intensity)
    if pipeline.max_peaks is not None:
        s = keep_top_peaks(s, pipeline.max_peaks)
    return normalize_intensities(transform_intensities(s, pipeline.transform), pipeline.normalize)


@pytest.mark.parametrize("settings", [{}, {"max_peaks": 5, "merge_tolerance": 0.5, "transform": "log1p",
                                           "normalize": "l2", "mz_max": 900.0, "precursor_tolerance": None},
                                      {"ms_level": None, "min_relative_intensity": 0.2, "normalize": "sum"}])
def test_cleaning_pipeline_equals_composed_functions(settings):
    rng = np.random.default_rng(1)
    pipeline = CleaningPipeline(**settings)
    for i in range(300):
        n = int(rng.integers(0, 60))
        mz = np.sort(rng.uniform(20, 1000, n))
        mz = np.sort(np.concatenate([mz, mz[: n // 5] + rng.uniform(0, 0.003, n // 5)]))
        intensities = rng.exponential(100, mz.shape[0]) * (rng.random(mz.shape[0]) > 0.05)
        precursor = None if i % 7 == 0 else float(mz[-1] if mz.shape[0] and i % 2 else rng.uniform(100, 1000))
        s = Spectrum(id=str(i), mz=mz, intensities=intensities, precursor_mz=precursor, ms_level=2 + (i % 11 == 0))
        got, want = pipeline(s), _composed(pipeline, s)
        if want is None:
            assert got is None
            continue
        np.testing.assert_array_equal(got.mz, want.mz)
        np.testing.assert_allclose(got.intensities, want.intensities, rtol=1e-15, atol=0)


def test_cleaning_pipeline_keeps_empty_spectra_and_filters_levels():
    pipeline = CleaningPipeline()
    only_precursor = spec([100.0], [5.0], precursor=100.0)
    ms3 = spec([50.0], [1.0], precursor=100.0, level=3)
    cleaned = [pipeline(only_precursor), pipeline(ms3), pipeline(spec([50.0], [1.0], precursor=100.0))]
    assert cleaned[0].n_peaks == 0 and cleaned[1] is None
    assert count_empty(cleaned) == 1
    assert [s.n_peaks for s in pipeline.apply([only_precursor, ms3])] == [0]


def test_cleaning_pipeline_serialises():
    pipeline = CleaningPipeline(max_peaks=50, transform="log1p", mz_max=1000.0, merge_tolerance=None)
    data = json.loads(json.dumps(pipeline.to_dict()))
    assert data["format_version"] == 1
    assert CleaningPipeline.from_dict(data) == pipeline
    assert CleaningPipeline.from_dict({}) == CleaningPipeline()
    with pytest.raises(SpecError, match="unknown setting"):
        CleaningPipeline.from_dict({"max_peak": 3})
    with pytest.raises(SpecError, match="format_version"):
        CleaningPipeline.from_dict({"format_version": 99})
    with pytest.raises(SpecError):
        CleaningPipeline(normalize="median")
    with pytest.raises(SpecError):
        CleaningPipeline(max_peaks=0)
    with pytest.raises(SpecError):
        CleaningPipeline(min_relative_intensity=-1)


# -- arrays -------------------------------------------------------------------------------------------------------

def test_spectra_arrays_round_trip():
    spectra = list(read_mgf(SPECTRA / "quirks.mgf")) + [spec([], [])]
    arrays, meta = spectra_to_arrays(spectra, metadata_keys=None)
    n = len(spectra)
    assert arrays["offsets"].tolist() == [0, 3, 6, 7, 9, 10, 11, 12, 12]
    assert arrays["mz"].shape == arrays["intensities"].shape == (12,)
    assert np.isnan(arrays["precursor_mz"][6]) and arrays["charge"][6] == 0
    assert arrays["ion_mode"].tolist() == [1, 1, -1, -1, -1, 1, -1, 0]
    assert all(a.shape == (n,) for k, a in arrays.items() if k not in ("mz", "intensities", "offsets"))
    meta = json.loads(json.dumps(meta))
    # the format name bundles have always written (the layout move briefly wrote a module-like name; both read)
    assert meta["format"] == "molpredict.spectra"
    back = spectra_from_arrays(arrays, meta)
    assert_same_spectra(spectra, back)
    assert_same_spectra(spectra, spectra_from_arrays(arrays, {**meta, "format": "molpredict.spectra.cleaning"}))
    with pytest.raises(ModelFileError, match="unsupported spectra format"):
        spectra_from_arrays(arrays, {**meta, "format": "molpredict.spectrum"})

    slim, slim_meta = spectra_to_arrays(spectra, metadata_keys=("smiles",))
    assert slim_meta["metadata"][0] == {"smiles": "CC1Cc2cccc(O)c2C(=O)O1"} and slim_meta["metadata"][1] == {}
    broken = dict(arrays, offsets=arrays["offsets"][:-1])
    with pytest.raises(ModelFileError):
        spectra_from_arrays(broken, meta)
    with pytest.raises(ModelFileError):
        spectra_from_arrays({k: v for k, v in arrays.items() if k != "mz"}, meta)


# -- real data ----------------------------------------------------------------------------------------------------

MASSBANK_COUNTS = {"train_pos": 47_880, "val_pos": 5_204, "test_pos": 6_450,
                   "train_neg": 22_742, "val_neg": 2_450, "test_neg": 3_129}


@pytest.mark.shared
@pytest.mark.parametrize("name", list(MASSBANK_COUNTS))
def test_massbank_files_parse_completely(name):
    path = require_shared("massbank", f"{name}.mgf")
    report = SkipReport()
    n = n_structures = 0
    mode = "positive" if name.endswith("pos") else "negative"
    for s in read_mgf(path, report=report):
        n += 1
        n_structures += bool(s.smiles and s.inchikey)
        assert s.ion_mode == mode and s.precursor_mz is not None and s.n_peaks > 0
    assert report.count == 0, report.summary()
    assert n == n_structures == MASSBANK_COUNTS[name]


@pytest.mark.shared
def test_massbank_round_trip_and_reference_parser(tmp_path, monkeypatch):
    path = require_shared("massbank", "val_neg.mgf")
    spectra = list(read_mgf(path))
    out = tmp_path / "val_neg.mgf"
    write_mgf(spectra, out)
    assert_same_spectra(spectra, list(read_mgf(out)))
    monkeypatch.setattr(mgf_module, "_parse_batch",
                        lambda batch: [mgf_module._parse_peaks(lines) if lines else "no peaks" for lines in batch])
    assert_same_spectra(spectra, list(read_mgf(path)))


def test_spectra_arrays_keep_their_format_tag_across_the_layout_move():
    """The JSON companion's format tag is a file format name: written as ``molpredict.spectra`` (what bundles
    saved before the layout move carry, so they load), and the tag written for a while after the move
    (``molpredict.spectra.cleaning``) still reads; anything else is refused."""
    from molpredict.errors import ModelFileError
    from molpredict.io.arrays import spectra_from_arrays, spectra_to_arrays

    spectra = [Spectrum(mz=np.array([50.0, 80.5]), intensities=np.array([1.0, 0.25]), precursor_mz=120.0, id="a")]
    arrays, meta = spectra_to_arrays(spectra)
    assert meta["format"] == "molpredict.spectra"
    for tag in ("molpredict.spectra", "molpredict.spectra.cleaning"):
        back = spectra_from_arrays(arrays, {**meta, "format": tag})
        np.testing.assert_array_equal(back[0].mz, spectra[0].mz)
    with pytest.raises(ModelFileError):
        spectra_from_arrays(arrays, {**meta, "format": "something.else"})
