"""The XML scan readers (mzML, mzXML) skip a scan whose own fields are unreadable, naming it by its id, rather than
refusing the whole file: a bad field read after the scan's id is that scan's problem, as a bad PEPMASS after a
TITLE is one MGF record's."""
from __future__ import annotations

from pathlib import Path

import pytest

from molpredict.io import SkipReport, read_spectra

SPECTRA = Path(__file__).parent / "fixtures" / "spectra"


def _read(path: Path, text: str):
    path.write_text(text)
    report = SkipReport()
    spectra = list(read_spectra(path, report=report))
    return spectra, [(e.record, e.reason, e.spectrum_id) for e in report]


def test_mzml_scan_with_a_non_numeric_ms_level_is_skipped_by_its_native_id(tmp_path):
    text = (SPECTRA / "small.mzML").read_text()
    bad = text.replace('name="ms level" value="2"', 'name="ms level" value="two"', 1)  # scan=2, the first MS2
    assert bad != text
    spectra, skipped = _read(tmp_path / "level.mzML", bad)
    assert [s.id for s in spectra] == ["scan=3"]
    assert skipped == [(2, "non-numeric ms level", "scan=2"), (4, "no precursor m/z", "scan=4")]


def test_mzxml_scan_with_an_unreadable_retention_time_is_read_without_it(tmp_path):
    text = (SPECTRA / "small.mzXML").read_text()
    bad = text.replace('retentionTime="PT2.5S"', 'retentionTime="soon"')
    assert bad != text
    spectra, skipped = _read(tmp_path / "rt.mzXML", bad)
    assert [s.id for s in spectra] == ["2", "3"]
    assert "retention_time" not in spectra[0].metadata
    assert spectra[1].metadata["retention_time"] == pytest.approx(3.0 / 60)
    assert skipped == [(4, "no precursor m/z", "4"), (5, "no peaks", "5")]
