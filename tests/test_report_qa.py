"""The HTML report from a user's seat (QA): long ids, results files in another row order, the page's wording of
probabilities, candidate counts and true ranks, and a page that cannot be written."""
from __future__ import annotations

import errno
import subprocess
import warnings

import html5lib
import numpy as np
import pytest
from click.testing import CliRunner

from test_report import ISOMERS, _chromium, _rows, _spectrum
from molpredict.cli import cli
from molpredict.io import read_spectra, write_mgf
from molpredict.io.results import ResultWriter
from molpredict.report.page import Report, ReportOptions, build_report_from_files, decode_report_data, query_groups


def _write_results(path, rows) -> None:
    with open(path, "w", newline="") as handle:
        writer = ResultWriter(handle, "tsv")
        for row in rows:
            writer.write(row)
        writer.close()


def _run(page, fragment: str = "", *args: str) -> subprocess.CompletedProcess:
    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium: `apt-get install chromium` (Debian/Ubuntu) to run the browser check")
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=5000", "--window-size=1280,900", *args, page.as_uri() + fragment],
                          capture_output=True, text=True, timeout=120)


def _dom(page, fragment: str = ""):
    done = _run(page, fragment, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = html5lib.parse(done.stdout, namespaceHTMLElements=False)
    assert dom.find(".//body").get("data-ready") == "true", done.stdout[:2000]
    return dom


def _text(element) -> str:
    return "".join(element.itertext())


def test_a_long_query_id_does_not_push_the_index_off_the_window(tmp_path):
    """A 400-character spectrum TITLE without a space (as some converters write) made the query column as wide as
    the id: the structure and every column after it were drawn beyond the right edge of the window."""
    report = Report(ReportOptions(gzip_above=-1))
    long_id = "L" * 400
    report.add_spectrum(_spectrum(long_id))
    report.add_rows(_rows(long_id, ISOMERS[:1], [1.0]))
    report.add_skipped("S" * 400, "no peaks after cleaning", "a.mgf", 2)
    path = tmp_path / "r.html"
    report.write(path)
    assert decode_report_data(path.read_text())["queries"][0]["id"] == long_id   # kept whole in the data
    shot = tmp_path / "shot.png"
    done = _run(path, "", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pil = pytest.importorskip("PIL.Image")
    rgb = np.asarray(pil.open(shot).convert("RGB"), dtype=np.int32)
    # the first row's structure drawing is in the window: RDKit draws its oxygens in pure red
    red = (rgb[..., 0] > 200) & (rgb[..., 1] < 90) & (rgb[..., 2] < 90)
    assert red[:400].sum() > 20
    # the id is still there to read, whole, in the cell's tooltip
    dom = _dom(path)
    cell = dom.find(".//table[@id='index']/tbody/tr/td[2]/span")
    assert cell.get("title") == long_id and _text(cell) == long_id


def test_results_sorted_by_another_column_keep_each_query_together(tmp_path):
    """A results file sorted by score (in a spreadsheet, with `sort`) has a query's rows apart: each run of rows
    became a query of its own, the later ones without a spectrum (a warning) and their cards numbered #1."""
    rows = (_rows("q0", ISOMERS, [0.9, 0.5, 0.1]) + _rows("q1", ISOMERS[::-1], [0.7, 0.6, 0.2])
            + _rows("q2", ISOMERS[:1], [0.3]))
    by_score = sorted(rows, key=lambda r: -r["score"])
    _write_results(tmp_path / "hits.tsv", by_score)
    write_mgf([_spectrum(f"q{i}", smiles=ISOMERS[i]) for i in range(3)], tmp_path / "q.mgf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # every query has its spectrum
        _, report = build_report_from_files(tmp_path / "hits.tsv", tmp_path / "q.mgf", tmp_path / "r.html",
                                            top_k=3, fragments=False)
    data = decode_report_data((tmp_path / "r.html").read_text())
    assert [q["id"] for q in data["queries"]] == ["q0", "q1", "q2"]   # in the order of their first row
    assert [[c[1] for c in q["c"]] for q in data["queries"]] == [[0.9, 0.5, 0.1], [0.7, 0.6, 0.2], [0.3]]
    assert all(q["pk"][0] for q in data["queries"]) and report.skipped == []
    # a query's rows together, as identify writes them; two queries under one id (not numbered) stay two
    key = lambda groups: [[(r["query_id"], r["rank"]) for r in g] for g in groups]
    row = lambda q, rank: {"query_id": q, "rank": rank}
    assert key(query_groups([row("d", 1), row("d", 2), row("d", 1), row("d", 2), row("d", 3)])) == \
        [[("d", 1), ("d", 2)], [("d", 1), ("d", 2), ("d", 3)]]
    assert key(query_groups([row("a", 2), row("b", 1), row("a", 1)])) == [[("a", 1), ("a", 2)], [("b", 1)]]


def test_probability_counts_and_true_rank_say_what_the_results_say(tmp_path):
    """The page rounded a probability of 0.999 to "1.00" (a certainty the model does not claim), wrote
    "1 candidates", a missing candidate count as "0 candidates", the true structure absent from a query's 3 rows
    as "> 5" (the drawn top_k, not the rows read), and numbered the cards by position when a rank was missing."""
    nan = float("nan")
    q0 = _rows("q0", [ISOMERS[0], ISOMERS[1]], [0.9, 0.1], n=40, probability=[0.999, nan])
    q0[1]["rank"] = 3   # rank 2 filtered out of the results
    q1 = _rows("q1", ISOMERS[:1], [0.5], n=1, probability=[0.004])
    q2 = _rows("q2", ISOMERS[2:], [0.5], probability=[0.5])
    q2[0]["n_candidates"] = None
    _write_results(tmp_path / "hits.tsv", q0 + q1 + q2)
    write_mgf([_spectrum("q0", smiles=ISOMERS[2]), _spectrum("q1", smiles=ISOMERS[2]),
               _spectrum("q2", smiles=ISOMERS[2])], tmp_path / "q.mgf")
    path = tmp_path / "r.html"
    build_report_from_files(tmp_path / "hits.tsv", tmp_path / "q.mgf", path, fragments=False)
    data = decode_report_data(path.read_text())
    assert [q["n"] for q in data["queries"]] == [40, 1, None]

    dom = _dom(path, "#q=0")
    headers = [_text(th) for th in dom.find(".//table[@id='index']/thead").iter("th")]
    rows = [tr for tr in dom.find(".//table[@id='index']/tbody") if tr.get("data-q")]
    cell = lambda tr, name: _text(tr.findall("td")[headers.index(name)])
    assert [cell(tr, "probability") for tr in rows] == ["> 0.99", "< 0.01", "0.50"]
    assert [cell(tr, "candidates") for tr in rows] == ["40", "1", ""]
    # q0: 3 rows read, none the truth; q1: its only candidate is not the truth; q2: ranked first
    assert [cell(tr, "true rank") for tr in rows] == ["> 3", "none", "1"]
    detail = dom.find(".//tr[@data-detail='0']")
    head = _text(detail.find(".//div[@class='qhead']"))
    assert "40 candidates" in head and "probability that rank 1 is right: > 0.99" in head
    cards = [d for d in detail.iter("div") if "card" in (d.get("class") or "").split()]
    assert [_text(c.find("div[@class='rank']")) for c in cards] == ["#1", "#3"]
    assert "P(right)0.999" in _text(cards[0])   # the card keeps 3 decimals

    head = _text(_dom(path, "#q=1").find(".//tr[@data-detail='1']//div[@class='qhead']"))
    assert "· 1 candidate ·" in head
    head = _text(_dom(path, "#q=2").find(".//tr[@data-detail='2']//div[@class='qhead']"))
    assert "candidate" not in head


def test_a_page_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch):
    """Writing failed with the name of the temporary file beside the page (`/proc/.r.html.jkdky62m.tmp: No such
    file or directory`), a file the user never named."""
    import contextlib

    import molpredict.atomic

    @contextlib.contextmanager
    def full_disk(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".r.html.x1y2.tmp"))
        yield

    _write_results(tmp_path / "hits.tsv", _rows("q0", ISOMERS[:1], [1.0]))
    write_mgf([_spectrum("q0")], tmp_path / "q.mgf")
    monkeypatch.setattr(molpredict.atomic, "atomic_write", full_disk)
    report = Report()
    report.add_rows(_rows("q0", ISOMERS[:1], [1.0]))
    with pytest.raises(OSError) as caught:
        report.write(tmp_path / "r.html")
    assert caught.value.filename == str(tmp_path / "r.html") and caught.value.errno == errno.ENOSPC

    result = CliRunner().invoke(cli, ["report", str(tmp_path / "hits.tsv"), str(tmp_path / "q.mgf"),
                                      "--no-fragments", "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 5, result.output
    assert result.stderr.strip() == f"molpredict: error: {tmp_path / 'r.html'}: No space left on device"


def test_a_title_with_a_tab_is_matched_to_its_rows(tmp_path):
    """A results file writes a TITLE's tab as a space (a TSV cell cannot hold it): ``report`` then found no spectrum
    for that query and listed the spectrum as skipped. Ids are matched as a results file writes them, both from the
    files and when identify hands its rows over directly."""
    title = "scan\t12"
    write_mgf([_spectrum(title, smiles=ISOMERS[0]), _spectrum("plain", smiles=ISOMERS[1])], tmp_path / "q.mgf")
    assert next(iter(read_spectra(tmp_path / "q.mgf"))).id == title   # the reader keeps the tab
    _write_results(tmp_path / "hits.tsv", _rows(title, ISOMERS, [0.9, 0.5, 0.1]) + _rows("plain", ISOMERS, [0.4]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # every query has its spectrum
        _, report = build_report_from_files(tmp_path / "hits.tsv", tmp_path / "q.mgf", tmp_path / "r.html",
                                            fragments=False)
    data = decode_report_data((tmp_path / "r.html").read_text())
    assert [q["id"] for q in data["queries"]] == ["scan 12", "plain"]
    assert all(q.get("pk") for q in data["queries"]) and report.skipped == []
    live = Report(ReportOptions(gzip_above=-1))
    live.add_spectrum(_spectrum(title))
    live.add_rows(_rows(title, ISOMERS[:1], [1.0]))
    assert live.queries[0].get("pk") and live.unmatched_spectra == []
