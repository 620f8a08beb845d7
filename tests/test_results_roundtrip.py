"""Result and skipped-queries tables read back as written (QA): TSV is written unquoted, so a value starting with
``"`` (a spectrum TITLE ``"quoted start``) was read as the start of a quoted field, swallowing the fields and rows
after it (``report`` then said a query had no spectrum), and ``"quoted"`` lost its quotes. A carriage return in a
value split the row in TSV and CSV alike."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
from molpredict.chem.candidates import CandidateLibrary
from molpredict.cli import cli
from molpredict.io import write_mgf
from molpredict.io.results import ResultWriter, read_result_rows, read_skipped, write_skipped
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.report.page import build_report_from_files, decode_report_data
from molpredict.spectra.cleaning import CleaningPipeline
from molpredict.training.pipeline import build_model

AWKWARD = ['"quoted start', '"quoted"', 'a"b', 'end"', '""', "'single'", "back\\slash", "tab\there",
           "two\t\ttabs", "new\nline", "cr\rhere", "crlf\r\nhere", "\ttab first", "comma, semicolon;", "plain"]


def _as_written(value: str) -> str:
    """The documented text-cell rule of TSV / CSV: tab, newline and carriage return are each one space."""
    return value.replace("\t", " ").replace("\n", " ").replace("\r", " ")


@pytest.mark.parametrize("fmt", ["tsv", "csv", "json"])
def test_result_rows_read_back_as_written(tmp_path, fmt):
    path = tmp_path / f"hits.{fmt}"
    rows = [{"query_id": value, "rank": 1, "score": 0.5, "smiles": "CCO", "name": value, "formula": value,
             "id": f"id{i}", "n_candidates": 3} for i, value in enumerate(AWKWARD)]
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = ResultWriter(handle, fmt)
        for row in rows:
            writer.write(row)
        writer.close()
    back = list(read_result_rows(path))
    assert len(back) == len(rows)
    expect = (lambda v: v) if fmt == "json" else _as_written
    for row, got in zip(rows, back):
        assert (got["query_id"], got["name"], got["formula"]) == (expect(row["query_id"]),) * 3
        assert (got["id"], got["smiles"], got["rank"], got["n_candidates"]) == (row["id"], "CCO", 1.0, 3.0)
    if fmt != "json":   # what a reader of the file sees is the same text: one line per row
        assert len(path.read_text(encoding="utf-8").splitlines()) == len(rows) + 1


def test_skipped_rows_read_back_as_written(tmp_path):
    path = tmp_path / "skipped.tsv"
    skipped = [SimpleNamespace(query_id=value, file=f"dir/{value}.mgf", record=i + 1, reason=f"reason {value}")
               for i, value in enumerate(AWKWARD)]
    skipped.append(SimpleNamespace(query_id=None, file="x.mgf", record=None, reason="unreadable record: bad"))
    write_skipped(skipped, path)
    assert read_skipped(path) == [(_as_written(v), _as_written(f"dir/{v}.mgf"), str(i + 1),
                                   _as_written(f"reason {v}")) for i, v in enumerate(AWKWARD)] + \
        [("", "x.mgf", "", "unreadable record: bad")]


def test_identify_then_report_with_quoted_titles_and_names(tmp_path, monkeypatch):
    """End to end: TITLEs and library names starting with or holding ``"``; every query keeps its spectrum."""
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=2, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(), adducts=["[M+H]+"])
    bundle = ModelBundle({"positive": sub}).save(tmp_path / "model")
    names = [f'"cand{i}' if i % 2 else f'"cand" {i}' for i in range(len(SMILES))]
    library = CandidateLibrary.from_smiles(SMILES, names=names)
    lib = tmp_path / "library.tsv"
    library.to_tsv(lib)
    queries, _ = synthetic_spectra(n_per=1, seed=8)
    titles = ['"quoted start', '"quoted"', 'a"b'] + [f"q{i}" for i in range(len(queries) - 3)]
    for query, title in zip(queries, titles):
        query.id = title
    mgf = tmp_path / "queries.mgf"
    write_mgf(queries, mgf)
    runner = CliRunner()
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(bundle), "--library", str(lib), "--top-k", "2",
                                 "-o", str(tmp_path / "hits.tsv"), "--skipped", str(tmp_path / "skipped.tsv")])
    assert result.exit_code == 0, result.output
    rows = list(read_result_rows(tmp_path / "hits.tsv"))
    assert list(dict.fromkeys(r["query_id"] for r in rows)) == titles and all(r["rank"] <= 2 for r in rows)
    assert {r["name"] for r in rows} <= set(names) and any(r["name"].startswith('"') for r in rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # "... queries have no spectrum" was the symptom
        _, report = build_report_from_files(tmp_path / "hits.tsv", mgf, tmp_path / "r.html", fragments=False,
                                            skipped_path=tmp_path / "skipped.tsv")
    assert [q["id"] for q in report.queries] == titles and all("pk" in q for q in report.queries)
    assert report.skipped == []
    data = decode_report_data((tmp_path / "r.html").read_text())
    assert [q["id"] for q in data["queries"]] == titles
    assert np.all([len(q["pk"][0]) > 0 for q in data["queries"]])
