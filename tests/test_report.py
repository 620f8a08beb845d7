"""The HTML report: drawings, the embedded data, the page's static parts, the CLI, and a real browser (Chromium)."""
from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import html5lib
import numpy as np
import pytest
from click.testing import CliRunner
from lxml import etree

from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
from molpredict.chem.candidates import CandidateLibrary
from molpredict.cli import cli
from molpredict.errors import InputError
from molpredict.io.results import ResultWriter, read_result_rows
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.report.page import Report, ReportOptions, compact_svg, decode_report_data, draw_molecule_svg
from molpredict.spectra.cleaning import CleaningPipeline
from molpredict.spectra.record import Spectrum
from molpredict.io import write_mgf
from molpredict.training.pipeline import build_model


ISOMERS = ["CC1Cc2cccc(O)c2C(=O)O1", "CC1Cc2ccc(O)cc2C(=O)O1", "CC1Cc2cc(O)ccc2C(=O)O1"]  # C10H10O3
SVG = "{http://www.w3.org/2000/svg}"   # the namespace an HTML parser gives inline <svg> elements
EXTERNAL = re.compile(r"https?://|@import|url\(|<link\b|\bsrc\s*=", re.I)


def _rows(query_id, smiles, scores, n=None, **extra):
    """Output rows of one query in rank order (scores descending), as ``Identifier.run`` yields them."""
    from molpredict.chem.molecules import Molecule
    out = []
    for r, (smi, score) in enumerate(zip(smiles, scores)):
        m = Molecule.from_smiles(smi)
        margin = (scores[0] - scores[1] if len(scores) > 1 else float("nan")) if r == 0 else score - scores[0]
        row = {"query_id": query_id, "rank": r + 1, "score": score, "confidence": margin, "smiles": m.smiles,
               "inchikey": m.inchikey, "formula": m.formula, "adduct": "[M+H]+", "name": f"name of {smi}",
               "id": None, "n_candidates": n or len(smiles)}
        row.update({k: v[r] for k, v in extra.items()})
        out.append(row)
    return out


def _spectrum(query_id, precursor=179.0703, smiles=None):
    from molpredict.chem.molecules import Molecule
    meta = {"compound_name": f"compound {query_id}"}
    if smiles:
        meta["inchikey"] = Molecule.from_smiles(smiles).inchikey
    return Spectrum(id=query_id, mz=np.array([133.065, 151.075, 155.974, 161.06, 179.07]),
                    intensities=np.array([21905.3, 9239.9, 10980.9, 96508.4, 72563.9]), precursor_mz=precursor,
                    charge=1, ion_mode="positive", adduct="[M+H]+", metadata=meta)


def _parse(page: str):
    """Strict HTML5 parse (a parse error raises)."""
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(page)


def _small_report(**options) -> Report:
    report = Report(ReportOptions(top_k=2, **options))
    for i in range(3):
        report.add_spectrum(_spectrum(f"q{i}", smiles=ISOMERS[i]))
    report.add_spectrum(_spectrum("lost"))
    report.add_rows(_rows("q0", ISOMERS, [0.9, 0.5, 0.1]) + _rows("q1", ISOMERS[::-1], [0.7, 0.6, 0.2])
                    + _rows("q2", ISOMERS[:1], [0.3]))
    report.add_skipped("lost", "no peaks after cleaning", "a.mgf", 4)
    report.parameters = {"model": "/models/x <b>", "library": "lib.tsv"}
    return report


def test_compact_svg_keeps_the_drawing():
    from rdkit import Chem
    from rdkit.Chem.Draw import rdMolDraw2D

    mol = Chem.MolFromSmiles("CC(=O)Nc1ccc(O)cc1Cl")
    drawer = rdMolDraw2D.MolDraw2DSVG(240, 180, -1, -1, True)
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, mol)
    drawer.FinishDrawing()
    raw = drawer.GetDrawingText()
    small = compact_svg(raw)
    assert len(small) < 0.5 * len(raw)
    root = etree.fromstring(small.encode())
    assert root.tag == "svg" and root.get("viewBox") == "0 0 240 180" and root.get("width") is None
    # the same atom labels, in the same colours
    labels = lambda text: sorted(re.findall(r"fill[=:]'?(#[0-9A-F]{6})[^>]*>([A-Za-z])</text>", text))
    assert labels(small) == labels(raw.replace(";", "' ").replace("style='", "")) and len(labels(small)) == 7
    # every stroked segment survives the merge: count the move-to commands
    assert sum(d.count("M") for d in re.findall(r" d='([^']*)'", small)) == raw.count("d='M")
    # a SMILES RDKit cannot parse gives a placeholder, not an error
    assert "no drawing" in draw_molecule_svg("not a smiles")


def test_drawing_leaves_rdkit_logs_silenced(capfd):
    """The drawing used to switch RDKit's logging back on for the whole process, so that a later unparsable
    SMILES printed RDKit's lines to stderr (the suite caught it when the report tests ran first)."""
    from molpredict.chem.molecules import Molecule

    draw_molecule_svg("C1CC")
    with pytest.raises(InputError):
        Molecule.from_smiles("C1CC")
    assert capfd.readouterr().err == ""


def test_page_parses_and_holds_every_query_with_its_drawings(tmp_path):
    report = _small_report()
    size = report.write(tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert size == len(page.encode())
    doc = _parse(page)
    assert doc.find(".//title").text == "molpredict identification report"
    data = decode_report_data(page)
    assert [q["id"] for q in data["queries"]] == ["q0", "q1", "q2"]
    # each distinct structure drawn once, referenced by every query that ranks it
    assert report.drawing_count == len(data["molecules"]) == 3
    for q, expected in zip(data["queries"], [ISOMERS[:2], ISOMERS[::-1][:2], ISOMERS[:1]]):
        from molpredict.chem.molecules import Molecule
        assert [data["molecules"][c[0]][1] for c in q["c"]] == [Molecule.from_smiles(s).inchikey for s in expected]
        for c in q["c"]:
            svg = etree.fromstring(data["molecules"][c[0]][4].encode())
            assert svg.tag == "svg" and svg.findall(".//path")
    q0 = data["queries"][0]
    assert q0["c"][0][1:3] == [0.9, 0.4] and q0["c"][1][2] == pytest.approx(-0.4) and q0["n"] == 3
    assert q0["mz"] == 179.0703 and q0["name"] == "compound q0" and q0["adduct"] == "[M+H]+"
    # peaks: relative to the highest, by m/z
    assert q0["pk"] == [[133.065, 151.075, 155.974, 161.06, 179.07], [227, 96, 114, 1000, 752]]
    # the truth (from the spectrum's INCHIKEY) and its rank among the rows
    assert q0["true"] == data["molecules"][q0["c"][0][0]][1][:14]
    assert q0["tr"] == 1 and data["queries"][1]["tr"] == 2 and data["queries"][2]["tr"] is None
    assert "nan" not in page.lower().replace("nano", "")
    # the skipped spectrum and the parameters are plain HTML, escaped
    skipped = doc.find(".//details[@id='skipped-section']")
    cells = [td.text for td in skipped.iter("td")]
    assert cells == ["lost", "a.mgf", "4", "no peaks after cleaning"]
    params = {tr.find("th").text: "".join(tr.find("td").itertext()) for tr in doc.find(".//table[@class='params']")
              .iter("tr")}
    assert params["model"] == "/models/x <b>" and "rdkit" in params["versions"] and "created" in params
    assert "/models/x &lt;b&gt;" in page and "/models/x <b>" not in page
    assert not EXTERNAL.search(page), EXTERNAL.search(page)


def test_gzip_payload_round_trip(tmp_path):
    plain = _small_report(gzip_above=-1)
    packed = _small_report(gzip_above=0)
    page_plain, page_packed = plain.html(), packed.html()
    assert 'data-encoding="json"' in page_plain and 'data-encoding="gzip-base64"' in page_packed
    assert decode_report_data(page_plain) == decode_report_data(page_packed)
    _parse(page_packed)
    assert not EXTERNAL.search(page_packed)


def test_script_breakout_is_escaped():
    report = Report(ReportOptions(gzip_above=-1))
    rows = _rows("</script><script>alert(1)</script>", ISOMERS[:1], [1.0])
    rows[0]["name"] = "<!-- x </script>"
    report.add_rows(rows)
    page = report.html()
    body = page.split('id="report-data"', 1)[1]
    assert body.count("</script>") == 2   # the data element's and the code's own
    assert decode_report_data(page)["queries"][0]["id"] == "</script><script>alert(1)</script>"


def test_rows_group_by_query_and_match_spectra_by_id():
    report = Report(ReportOptions(top_k=5))
    spectra = [_spectrum("a"), _spectrum("dup", 180.0), _spectrum("skipped"), _spectrum("dup", 181.0)]
    for s in report.watch(spectra):
        pass
    for row in _rows("a", ISOMERS, [3, 2, 1]) + _rows("dup", ISOMERS[:2], [2, 1]) + _rows("dup", ISOMERS[:1], [5]):
        report.add_row(row)
    data = report.data()
    assert [(q["id"], len(q["c"]), q.get("mz")) for q in data["queries"]] == \
        [("a", 3, 179.0703), ("dup", 2, 180.0), ("dup", 1, 181.0)]
    assert [s.id for s in report.unmatched_spectra] == ["skipped"]


def test_optional_columns_and_explained_peaks(monkeypatch):
    """probability / spectrum_score / prior_score are kept when the rows have them; molpredict.chem.fragments, when
    present, annotates the top candidate's peaks."""
    calls = []

    def explain_peaks(spectrum, molecule, adduct):
        calls.append((spectrum.id, molecule.smiles, adduct))
        return [{"mz": 161.0597, "intensity": 96508.4, "formula": "C10H9O2+"},
                types.SimpleNamespace(mz=133.0648, intensity=21905.3, formula="C9H9O+")]

    monkeypatch.setitem(sys.modules, "molpredict.chem.fragments", types.SimpleNamespace(explain_peaks=explain_peaks))
    report = Report(ReportOptions(top_k=2))
    report.add_spectrum(_spectrum("q0"))
    nan = float("nan")   # identify writes the probability on rank 1 only
    report.add_rows(_rows("q0", ISOMERS, [0.9, 0.5, 0.1], probability=[0.81, nan, nan],
                          spectrum_score=[0.5, 0.3, 0.1], prior_score=[0.4, 0.2, 0.0], fragment_score=[nan] * 3))
    data = report.data()
    q = data["queries"][0]
    assert data["extra"] == ["probability", "spectrum_score", "prior_score"]
    assert q["p"] == 0.81 and q["c"][0][4] == {"probability": 0.81, "spectrum_score": 0.5, "prior_score": 0.4}
    assert q["c"][1][4] == {"spectrum_score": 0.3, "prior_score": 0.2}
    assert q["ex"] == [[161.0597, 1000, "C10H9O2+"], [133.0648, 227, "C9H9O+"]]
    assert calls == [("q0", ISOMERS[0], "[M+H]+")]
    # without the module: no annotation, and the page says so instead of guessing
    monkeypatch.setitem(sys.modules, "molpredict.chem.fragments", None)
    report = Report()
    report.add_spectrum(_spectrum("q0"))
    report.add_rows(_rows("q0", ISOMERS, [0.9, 0.5, 0.1]))
    assert "ex" not in report.data()["queries"][0]


def test_explained_peaks_from_in_silico_fragments():
    """With the real molpredict.chem.fragments: Mellein's [M+H]+ spectrum (the MassBank fixture record) has its
    133.065 peak explained as C9H9O+, as the depositors annotated it (PK$ANNOTATION), and its precursor as the
    intact ion."""
    pytest.importorskip("molpredict.chem.fragments")
    report = Report()
    report.add_spectrum(_spectrum("mellein"))
    report.add_rows(_rows("mellein", ISOMERS[:1], [1.0]))
    explained = {mz: formula for mz, _, formula in report.data()["queries"][0]["ex"]}
    assert explained[133.065] == "C9H9O+" and explained[179.07] == "C10H11O3+"


def test_read_result_rows_all_formats(tmp_path):
    rows = _rows("q0", ISOMERS, [0.9, 0.5, 0.1]) + _rows("q1", ISOMERS[:1], [0.3])
    for fmt in ("tsv", "csv", "json"):
        path = tmp_path / f"out.{fmt}"
        with open(path, "w", newline="") as handle:
            writer = ResultWriter(handle, fmt)
            for row in rows:
                writer.write(row)
            writer.close()
        back = list(read_result_rows(path))
        assert [(r["query_id"], r["rank"], r["inchikey"]) for r in back] == \
            [(r["query_id"], r["rank"], r["inchikey"]) for r in rows]
        assert back[0]["score"] == pytest.approx(0.9) and back[0]["confidence"] == pytest.approx(0.4)
        assert math.isnan(back[3]["confidence"]) or back[3]["confidence"] is None
    from molpredict.errors import InputError
    (tmp_path / "bad.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(InputError, match="no query_id column"):
        list(read_result_rows(tmp_path / "bad.tsv"))
    (tmp_path / "bad2.tsv").write_text("query_id\tscore\nq\tabc\n")
    with pytest.raises(InputError, match="record 2.*field score.*not a number"):
        list(read_result_rows(tmp_path / "bad2.tsv"))
    for name in ("binary.tsv", "binary.json"):
        (tmp_path / name).write_bytes(b"query_id\t\xff\xfe\x00\x81 not text\n")
        with pytest.raises(InputError, match=f"{name}: not a results (table|file) \\(not UTF-8 text\\)"):
            list(read_result_rows(tmp_path / name))


def test_results_of_another_spectra_file_are_an_error_and_a_partial_match_a_warning(tmp_path):
    """`report` matches rows to spectra by query id: when none matches, the results come from another file (an
    error, not a page of queries without spectra and spectra listed as skipped); when some miss, a warning."""
    from molpredict.errors import InputError
    from molpredict.report.page import build_report_from_files

    rows = _rows("q0", ISOMERS, [0.9, 0.5, 0.1]) + _rows("q1", ISOMERS[:1], [0.3])
    with open(tmp_path / "hits.tsv", "w", newline="") as handle:
        writer = ResultWriter(handle, "tsv")
        for row in rows:
            writer.write(row)
        writer.close()
    write_mgf([_spectrum("other0"), _spectrum("other1")], tmp_path / "other.mgf")
    with pytest.raises(InputError, match=r"other.mgf: none of the 2 queries of .*hits.tsv is a spectrum of this file"):
        build_report_from_files(tmp_path / "hits.tsv", tmp_path / "other.mgf", tmp_path / "r.html", fragments=False)
    assert not (tmp_path / "r.html").exists()
    write_mgf([_spectrum("q0"), _spectrum("other1")], tmp_path / "half.mgf")
    with pytest.warns(UserWarning, match="hits.tsv: 1 of 2 queries have no spectrum in .*half.mgf"):
        build_report_from_files(tmp_path / "hits.tsv", tmp_path / "half.mgf", tmp_path / "r.html", fragments=False)


def test_report_names_an_unreadable_record_by_its_id_apart_from_a_spectrum_of_the_same_id(tmp_path):
    """An unreadable record is listed under the id its reader read (its TITLE), with or without identify's skipped
    table; a readable spectrum of the same id that the results lack is still listed as without rows: the
    unreadable record's row does not stand for it."""
    from molpredict.report.page import build_report_from_files

    with open(tmp_path / "hits.tsv", "w", newline="") as handle:
        writer = ResultWriter(handle, "tsv")
        for row in _rows("q0", ISOMERS, [0.9, 0.5, 0.1]):
            writer.write(row)
        writer.close()
    mgf = tmp_path / "queries.mgf"
    write_mgf([_spectrum("q0"), _spectrum("dup")], mgf)
    with open(mgf, "a") as handle:   # record 3: the same TITLE, a peak that is not a number
        handle.write("BEGIN IONS\nTITLE=dup\nPEPMASS=179.0703\n133.065 abc\nEND IONS\n")
    unreadable = ("dup", str(mgf), 3, "unreadable record: non-numeric peak")
    _, report = build_report_from_files(tmp_path / "hits.tsv", mgf, tmp_path / "a.html", fragments=False)
    assert report.skipped == [unreadable, ("dup", "", None, "no rows in hits.tsv")]
    (tmp_path / "skipped.tsv").write_text("query_id\tfile\trecord\treason\n" + "\t".join(map(str, unreadable)) + "\n")
    _, report = build_report_from_files(tmp_path / "hits.tsv", mgf, tmp_path / "b.html", fragments=False,
                                        skipped_path=tmp_path / "skipped.tsv")
    assert [(q, reason) for q, _, _, reason in report.skipped] == [("dup", unreadable[3]),
                                                                   ("dup", "no rows in hits.tsv")]


def test_read_skipped_refuses_rows_with_the_wrong_number_of_fields(tmp_path):
    from molpredict.errors import InputError
    from molpredict.io.results import read_skipped

    path = tmp_path / "skipped.tsv"
    path.write_text("query_id\tfile\trecord\treason\nq1\ta.mgf\t3\tno peaks\n")
    assert read_skipped(path) == [("q1", "a.mgf", "3", "no peaks")]
    for bad in ("foo\n", "q\ta\t1\tr\textra\n"):
        path.write_text("query_id\tfile\trecord\treason\n" + bad)
        with pytest.raises(InputError, match="skipped.tsv, record 2: expected 4 tab-separated fields"):
            read_skipped(path)


# -- the commands ----------------------------------------------------------------------------------------------

@pytest.fixture
def identify_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=2, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(), adducts=["[M+H]+"])
    bundle_path = ModelBundle({"positive": sub}).save(tmp_path / "model")
    library = CandidateLibrary.from_smiles(SMILES + ISOMERS[1:], names=[f"cand{i}" for i in range(len(SMILES) + 2)])
    lib = tmp_path / "library.tsv"
    library.to_tsv(lib)
    queries, _ = synthetic_spectra(n_per=1, seed=8)
    queries.append(Spectrum(id="empty", mz=np.array([]), intensities=np.array([]), precursor_mz=200.0, charge=1,
                            ion_mode="positive", adduct="[M+H]+"))
    queries.append(Spectrum(id="neg", mz=np.array([50.0, 80.0]), intensities=np.array([1.0, 2.0]), precursor_mz=200.0,
                            charge=-1, ion_mode="negative", adduct="[M-H]-"))
    # a repeated id (identify numbers it "s0-0#2"), with peaks of its own
    first = queries[0]
    queries.append(Spectrum(id=first.id, mz=first.mz[:-1], intensities=first.intensities[:-1],
                            precursor_mz=first.precursor_mz, charge=1, ion_mode="positive", adduct="[M+H]+",
                            metadata=dict(first.metadata)))
    mgf = tmp_path / "queries.mgf"
    write_mgf(queries, mgf)
    return bundle_path, lib, mgf, queries


def test_identify_report_and_report_command_agree(identify_setup, tmp_path):
    model, lib, mgf, queries = identify_setup
    runner = CliRunner()
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib), "--top-k", "3",
                                 "-o", str(tmp_path / "hits.tsv"), "--skipped", str(tmp_path / "skipped.tsv"),
                                 "--report", str(tmp_path / "a.html")])
    assert result.exit_code == 0, result.output
    assert "report " in result.stderr
    page = (tmp_path / "a.html").read_text()
    _parse(page)
    assert not EXTERNAL.search(page)
    data = decode_report_data(page)
    identified = {r["query_id"] for r in csv.DictReader(open(tmp_path / "hits.tsv"), delimiter="\t")}
    assert {q["id"] for q in data["queries"]} == identified and len(identified) == len(queries) - 2
    by_id = {q["id"]: q for q in data["queries"]}
    assert len(by_id["s0-0#2"]["pk"][0]) == len(by_id["s0-0"]["pk"][0]) - 1   # each its own spectrum
    assert all(len(q["c"]) == min(3, q["n"]) and q["pk"][0] for q in data["queries"])
    assert any(q["n"] >= 3 for q in data["queries"])
    # where each query came from: the file (once, in a table) and its record number
    assert data["files"] == [str(mgf)] and all(q["f"] == 0 for q in data["queries"])
    assert [int(q["record"]) for q in data["queries"]] == list(range(1, len(identified))) + [len(queries)]
    # the synthetic model ranks the truth first for these spectra
    assert sum(q["tr"] == 1 for q in data["queries"]) >= len(identified) - 2
    doc = _parse(page)
    skipped = [[td.text or "" for td in tr.iter("td")] for tr in doc.find(".//details[@id='skipped-section']")
               .iter("tr")][1:]
    assert skipped[0] == ["empty", str(mgf), str(len(queries) - 2), "unreadable record: no peaks"]
    assert skipped[1][0] == "neg" and "negative" in skipped[1][3]
    params = "".join(doc.find(".//table[@class='params']").itertext())
    assert str(model) in params and str(lib) in params and "top 3 rows per query" in params
    # the same page from the files
    result = runner.invoke(cli, ["report", str(tmp_path / "hits.tsv"), str(mgf), "--skipped",
                                 str(tmp_path / "skipped.tsv"), "--top-k", "3", "-o", str(tmp_path / "b.html")])
    assert result.exit_code == 0, result.output
    again = decode_report_data((tmp_path / "b.html").read_text())
    strip = lambda d: [{k: v for k, v in q.items()} for q in d["queries"]]
    assert [q["id"] for q in again["queries"]] == [q["id"] for q in data["queries"]]
    for a, b in zip(strip(again), strip(data)):
        assert [c[0:2] for c in a["c"]] == [c[0:2] for c in b["c"]] or \
            [again["molecules"][c[0]][1] for c in a["c"]] == [data["molecules"][c[0]][1] for c in b["c"]]
        assert a["pk"] == b["pk"] and a["mz"] == b["mz"]
    # without --skipped, the spectrum without rows is listed as skipped anyway
    result = runner.invoke(cli, ["report", str(tmp_path / "hits.tsv"), str(mgf), "-o", str(tmp_path / "c.html")])
    doc = _parse((tmp_path / "c.html").read_text())
    assert "no rows in hits.tsv" in "".join(doc.find(".//details[@id='skipped-section']").itertext())
    # bad inputs are one line
    result = runner.invoke(cli, ["report", str(tmp_path / "nope.tsv"), str(mgf), "-o", str(tmp_path / "d.html")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1 and "no such file" in result.stderr
    result = runner.invoke(cli, ["identify", "--text", "a molecule", "--model", str(model), "--library", str(lib),
                                 "--report", str(tmp_path / "e.html")])
    assert result.exit_code == 2 and "not available for text" in result.stderr
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib), "--resume",
                                 "-o", str(tmp_path / "hits.tsv"), "--report", str(tmp_path / "e.html")])
    assert result.exit_code == 2 and "molpredict report" in result.stderr


# -- a real browser ----------------------------------------------------------------------------------------------

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _browser(page: Path, *args: str) -> subprocess.CompletedProcess:
    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium: `apt-get install chromium` (Debian/Ubuntu) to run the browser check")
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=5000", "--window-size=1280,1200", *args, page.as_uri() + "#q=0"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("gzip_above", [-1, 0], ids=["json", "gzip"])
def test_chromium_renders_index_structures_and_spectrum(tmp_path, gzip_above, monkeypatch):
    monkeypatch.setitem(sys.modules, "molpredict.chem.fragments", types.SimpleNamespace(
        explain_peaks=lambda s, m, a: [{"mz": 161.06, "intensity": 96508.4, "formula": "C10H9O2+"}]))
    report = _small_report(gzip_above=gzip_above)
    path = tmp_path / "r.html"
    report.write(path)
    done = _browser(path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = html5lib.parse(done.stdout, namespaceHTMLElements=False)
    assert dom.find(".//body").get("data-ready") == "true", done.stdout[:3000]
    index = [tr for tr in dom.find(".//table[@id='index']/tbody") if "q" in (tr.get("class") or "").split()]
    assert [tr.get("data-q") for tr in index] == ["0", "1", "2"]
    assert all(tr.find(f".//div[@class='thumb']/{SVG}svg") is not None for tr in index)
    headers = [th.text for th in dom.find(".//table[@id='index']/thead").iter("th")]
    assert headers[:3] == ["#", "query", "structure"] and "true rank" in headers
    # #q=0 opened the first query: its stick plot (precursor marked, the explained peak labelled) and 2 cards
    detail = dom.find(".//tr[@data-detail='0']")
    plot = detail.find(f".//{SVG}svg[@class='spectrum']")
    sticks = [line.get("class") for line in plot.iter(f"{SVG}line") if "pk" in (line.get("class") or "").split()]
    assert sorted(sticks) == ["pk"] * 4 + ["pk ex"]
    assert any("precursor 179.0703" in (t.text or "") for t in plot.iter(f"{SVG}text"))
    assert [t.text for t in plot.iter(f"{SVG}text") if t.get("class") == "ex"] == ["C10H9O2+"]
    cards = [div for div in detail.iter("div") if "card" in (div.get("class") or "").split()]
    assert len(cards) == 2 and all(card.find(f".//div[@class='mol']/{SVG}svg//{SVG}path") is not None for card in cards)
    assert "true" in cards[0].get("class")

    pil = pytest.importorskip("PIL.Image")
    shot = tmp_path / "shot.png"
    done = _browser(path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    rgb = np.asarray(pil.open(shot).convert("RGB"), dtype=np.int32)
    assert rgb.shape == (1200, 1280, 3)
    dark = rgb.sum(axis=2) < 3 * 128
    assert dark.mean() > 0.01                          # not blank
    assert dark[:60].mean() > 0.005                    # the header: title and summary
    # the index's first row (within the top 300 px) shows a drawn structure: RDKit draws oxygen in pure red
    red = (rgb[..., 0] > 200) & (rgb[..., 1] < 90) & (rgb[..., 2] < 90)
    assert red[:300].sum() > 20


def test_chromium_sorts_and_filters_from_the_address(tmp_path):
    """The index sorts by a column and filters by text (set through the address: #sort=..., #filter=...)."""
    report = _small_report()
    path = tmp_path / "r.html"
    report.write(path)

    def order(fragment: str) -> list[str]:
        binary = _chromium()
        if binary is None:
            pytest.skip("no Chromium: `apt-get install chromium` (Debian/Ubuntu) to run the browser check")
        done = subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                               "--dump-dom", path.as_uri() + fragment], capture_output=True, text=True, timeout=120)
        dom = html5lib.parse(done.stdout, namespaceHTMLElements=False)
        assert dom.find(".//body").get("data-ready") == "true"
        return [tr.get("data-q") for tr in dom.find(".//table[@id='index']/tbody") if tr.get("data-q")]

    assert order("#sort=score") == ["2", "1", "0"]                 # top scores 0.9, 0.7, 0.3
    assert order("#sort=margin") == ["1", "0", "2"]                # margins 0.1, 0.4, none (empty last)
    assert order("#filter=gsasjowncIINEK") == ["1"]               # q1's top hit (ISOMERS[2]), any case


@pytest.mark.shared
def test_real_massbank_report_in_chromium(shared_data, tmp_path):
    """The first 200 MassBank test_pos spectra, each with its real same-formula candidate set (test_formula.json,
    in file order: the true structure first): every identified query is in the page with its drawings, the page
    names no URL, and Chromium renders the index, a query's stick plot and its drawn candidates."""
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.io import read_spectra

    sets = load_candidate_sets(shared_data / "candidates" / "test_formula.json")
    report = Report(ReportOptions(top_k=5))
    n_rows = 0
    for i, spectrum in enumerate(read_spectra(shared_data / "massbank" / "test_pos.mgf")):
        if i == 200:
            break
        report.add_spectrum(spectrum)
        entries = sets.get(spectrum.inchikey[:14], [])[:5]
        if not entries:
            report.add_skipped(spectrum.id, "no candidate set")
            continue
        rows = _rows(spectrum.id, [smi for _, smi in entries], [1.0 - 0.1 * r for r in range(len(entries))])
        report.add_rows(rows)
        n_rows += 1
    path = tmp_path / "massbank.html"
    report.write(path)
    page = path.read_text()
    _parse(page)
    assert not EXTERNAL.search(page)
    data = decode_report_data(page)
    assert len(data["queries"]) == n_rows >= 190
    assert all(q["tr"] == 1 and q["pk"][0] and q["mz"] for q in data["queries"])
    for smiles, inchikey, formula, name, svg in data["molecules"]:
        assert etree.fromstring(svg.encode()).findall(".//path"), smiles
    # fragment annotation explains peaks of most spectra by their true structure
    assert sum(bool(q.get("ex")) for q in data["queries"]) >= 0.8 * n_rows
    done = _browser(path, "--dump-dom")
    dom = html5lib.parse(done.stdout, namespaceHTMLElements=False)
    assert dom.find(".//body").get("data-ready") == "true"
    rows = [tr for tr in dom.find(".//table[@id='index']/tbody") if tr.get("data-q")]
    assert len(rows) == 50 and all(tr.find(f".//div[@class='thumb']/{SVG}svg") is not None for tr in rows)
    detail = dom.find(".//tr[@data-detail='0']")
    assert detail.find(f".//{SVG}svg[@class='spectrum']") is not None
    assert len([d for d in detail.iter("div") if "card" in (d.get("class") or "").split()]) == len(data["queries"][0]["c"])
