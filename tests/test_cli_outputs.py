"""The command line's outputs and last-resort errors: output paths are checked before any work (a folder that
exists, no output written over an input or another output), a run rejected at its first record leaves no
partial files, a typo in a component spec fails before the training data is read, and whatever escapes the
library still ends as one line with an exit code."""
from __future__ import annotations

import errno

import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
from molpredict.chem.candidates import CandidateLibrary
from molpredict.cli import cli
from molpredict.io import write_mgf
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.spectra.cleaning import CleaningPipeline
from molpredict.training.pipeline import build_model


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A small model bundle, a library and a queries file, in the current folder."""
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=2, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    ModelBundle({"positive": SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(),
                                      adducts=["[M+H]+"])}).save(tmp_path / "model")
    CandidateLibrary.from_smiles(SMILES, names=[f"c{i}" for i in range(len(SMILES))]).to_tsv(tmp_path / "lib.tsv")
    queries, _ = synthetic_spectra(n_per=1, seed=3)
    write_mgf(queries[:3], tmp_path / "q.mgf")
    return tmp_path


def _identify(*extra: str):
    return CliRunner().invoke(cli, ["identify", "q.mgf", "--model", "model", "--library", "lib.tsv", *extra])


def _last_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert lines and "Traceback" not in result.output, result.output
    return lines[-1]


def test_an_output_named_twice_or_over_an_input_is_refused_before_any_work(setup):
    before = (setup / "q.mgf").read_bytes()
    result = _identify("-o", "res.tsv", "--skipped", "res.tsv")
    assert result.exit_code == 2
    assert _last_line(result) == "molpredict: error: res.tsv, field --skipped: is also -o: it would be overwritten"
    assert not (setup / "res.tsv").exists()
    result = _identify("-o", "./q.mgf", "--format", "tsv")
    assert result.exit_code == 2 and _last_line(result).endswith("q.mgf, field -o: is also SPECTRA: it would be "
                                                                 "overwritten")
    assert (setup / "q.mgf").read_bytes() == before
    result = _identify("-o", "out.tsv", "--report", "lib.tsv")
    assert result.exit_code == 2 and "is also --library" in _last_line(result)
    (setup / "hits.tsv").write_text("query_id\n")
    report = CliRunner().invoke(cli, ["report", "hits.tsv", "q.mgf", "-o", "hits.tsv"])
    assert report.exit_code == 2 and "is also RESULTS" in _last_line(report)
    build = CliRunner().invoke(cli, ["candidates", "build", "lib.tsv", "-o", "lib.tsv"])
    assert build.exit_code == 2 and "is also INPUT" in _last_line(build)


def test_an_output_in_a_missing_folder_is_refused_before_any_work(setup):
    for args in (["-o", "nodir/x.tsv"], ["-o", "ok.tsv", "--skipped", "nodir/s.tsv"],
                 ["-o", "ok.tsv", "--report", "nodir/r.html"]):
        result = _identify(*args)
        assert result.exit_code == 2, result.output
        assert _last_line(result).endswith("the folder nodir does not exist")
        assert not (setup / "ok.tsv").exists()  # nothing ran: the results are not written before the failure
    (setup / "adir").mkdir()
    assert _identify("-o", "adir").exit_code == 2
    report = CliRunner().invoke(cli, ["report", "q.mgf", "q.mgf", "-o", "nodir/r.html"])
    assert report.exit_code == 2 and _last_line(report).endswith("the folder nodir does not exist")
    train = CliRunner().invoke(cli, ["train", "q.mgf", "-o", "m2", "--summary-json", "nodir/s.json"])
    assert train.exit_code == 2 and _last_line(train).endswith("the folder nodir does not exist")
    assert not (setup / "m2").exists()


def test_a_run_rejected_at_its_first_record_leaves_no_partial_files(setup):
    (setup / "empty.mgf").write_text("")
    result = CliRunner().invoke(cli, ["identify", "empty.mgf", "--model", "model", "--library", "lib.tsv",
                                      "-o", "out.tsv"])
    assert result.exit_code == 2, result.output
    assert sorted(p.name for p in setup.iterdir() if p.name.startswith("out")) == []


def test_a_typo_in_a_component_spec_fails_before_the_training_data_is_read(setup):
    """The training file does not exist: the spec is what is reported, so it was checked first."""
    for option, spec, message in [("--input-kernel", "ppk:mz_sigam=0.01", "input kernel 'ppk' has no parameter(s) "
                                   "mz_sigam; valid: mz_sigma,"),
                                  ("--model", "sisokr:lamda=1", "model 'sisokr' has no parameter(s) lamda;"),
                                  ("--output-sketch", "subsampel:m=10", "unknown sketch 'subsampel'")]:
        result = CliRunner().invoke(cli, ["train", "missing.mgf", "-o", "m", option, spec])
        assert result.exit_code == 2 and message in _last_line(result), result.output
    # "no sketch" is a spec, not a registered name (README: "none for no sketch"): past the check, to the data
    for option in ("--input-sketch", "--output-sketch"):
        for spec in ("none", "identity", "None"):
            result = CliRunner().invoke(cli, ["train", "missing.mgf", "-o", "m", option, spec])
            assert result.exit_code == 2 and "missing.mgf" in _last_line(result), result.output
    result = CliRunner().invoke(cli, ["train", "missing.mgf", "-o", "m", "--input-sketch", "none:m=3"])
    assert result.exit_code == 2 and "unknown sketch 'none'" in _last_line(result), result.output
    # grids are over parameter values: a grid of names failed only after the data was read
    for option, spec in [("--input-kernel", "ppk|ppk-losses"), ("--output-kernel", "tanimoto|gaussian-tanimoto"),
                         ("--output-sketch", "subsample|none")]:
        result = CliRunner().invoke(cli, ["train", "missing.mgf", "-o", "m", option, spec])
        assert result.exit_code == 2 and "a grid is over parameter values" in _last_line(result), result.output
    result = CliRunner().invoke(cli, ["train", "missing.mgf", "-o", "m", "--input-kernel", "ppk:mz_sigma=0.01|0.02"])
    assert result.exit_code == 2 and "missing.mgf" in _last_line(result), result.output  # a value grid passes


def test_what_escapes_the_library_is_still_one_line(setup, monkeypatch):
    import molpredict.report.page as page

    (setup / "hits.tsv").write_text("query_id\n")
    args = ["report", "hits.tsv", "q.mgf", "-o", "r.html"]

    def raising(error):
        def build(*args, **kwargs):
            raise error
        return build

    monkeypatch.setattr(page, "build_report_from_files", raising(PermissionError(errno.EACCES, "Permission denied",
                                                                                  "/x/r.html")))
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and _last_line(result) == "molpredict: error: /x/r.html: Permission denied"
    monkeypatch.setattr(page, "build_report_from_files", raising(OSError(errno.ENOSPC, "No space left on device",
                                                                         "r.html")))
    assert CliRunner().invoke(cli, args).exit_code == 5
    monkeypatch.setattr(page, "build_report_from_files", raising(EOFError("Compressed file ended before the end")))
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "an input ended early (truncated file?)" in _last_line(result)
    assert "Aborted" not in result.output
    monkeypatch.setattr(page, "build_report_from_files", raising(RuntimeError("boom\nsecond line")))
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert _last_line(result).startswith("molpredict: internal error: RuntimeError: boom (a bug: run again with "
                                         "MOLPREDICT_DEBUG=1")
    monkeypatch.setenv("MOLPREDICT_DEBUG", "1")
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, RuntimeError)


def test_the_skip_summary_says_where_and_a_bad_cluster_prints_no_header(setup):
    bad = "".join(f"BEGIN IONS\nTITLE=bad{i}\nPEPMASS=abc\nCHARGE=1+\n100 1\nEND IONS\n" for i in range(5))
    (setup / "mixed.mgf").write_text((setup / "q.mgf").read_text() + bad)
    result = CliRunner().invoke(cli, ["identify", "mixed.mgf", "--model", "model", "--library", "lib.tsv",
                                      "-o", "out.tsv"])
    assert result.exit_code == 0, result.output
    assert "  skipped 5: unreadable record: non-numeric PEPMASS (mixed.mgf records 4, 5, 6 and 2 more, all with " \
           "--skipped FILE)" in result.stderr.splitlines()
    result = CliRunner().invoke(cli, ["identify", "mixed.mgf", "--model", "model", "--library", "lib.tsv",
                                      "-o", "out2.tsv", "--skipped", "s.tsv"])
    assert "and 2 more, all in s.tsv)" in result.stderr
    result = CliRunner().invoke(cli, ["identify", "q.mgf", "--model", "model", "--library", "lib.tsv",
                                      "--cluster", "foo"])
    assert result.exit_code == 2 and result.stdout == ""  # no header that would pass for an empty result


def test_warnings_of_the_command_line_are_one_line(setup, capsys):
    """A library row RDKit cannot parse is reported by a warning: on the command line (``main``, the console
    script) one line, without Python's source location."""
    import warnings

    from molpredict.cli import main

    (setup / "bad.tsv").write_text("smiles\n" + "\n".join(SMILES) + "\nnot_a_smiles((\n")
    with warnings.catch_warnings():  # main() installs its display of warnings: undone here
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as done:
            main(["identify", "q.mgf", "--model", "model", "--library", "bad.tsv", "-q", "-o", "out.tsv"])
    assert done.value.code == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [f"molpredict: warning: bad.tsv: {len(SMILES)} of {len(SMILES) + 1} records kept, 1 skipped "
                     f"(first: bad.tsv, line {len(SMILES) + 2}, field smiles: RDKit cannot parse SMILES "
                     f"'not_a_smiles((')"]


def test_a_library_without_a_usable_structure_is_an_error_not_a_run_of_skips(setup, capsys):
    (setup / "none.tsv").write_text("smiles\nnot_a_smiles((\n")
    (setup / "header.tsv").write_text("smiles\n")
    (setup / "two.tsv").write_text("smiles\tname\n\tx\nC1CC(\ty\n")
    for name, why in [("none.tsv", "(1 row read, none usable; first: line 2, field smiles: RDKit cannot parse "
                                   "SMILES 'not_a_smiles(('"),
                      ("header.tsv", "(no rows)"),
                      ("two.tsv", "(2 rows read, none usable; first: line 2, field smiles: empty SMILES)")]:
        result = _identify("--library", name)  # the later --library wins
        assert result.exit_code == 2 and f"{name}: no usable structure in the library {why}" in _last_line(result)
    # the whole story in one line naming the file once: no warning about the skipped rows before it (QA)
    import warnings

    from molpredict.cli import main

    with warnings.catch_warnings():  # main() installs its display of warnings: undone here
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as done:
            main(["identify", "q.mgf", "--model", "model", "--library", "two.tsv", "-q"])
    assert done.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ["molpredict: error: two.tsv: no usable structure in the library (2 rows read, none usable; "
                     "first: line 2, field smiles: empty SMILES)"]
    build = CliRunner().invoke(cli, ["candidates", "build", "lib.tsv", "-o", "lib.xyz"])
    assert build.exit_code == 2 and _last_line(build).endswith("lib.xyz, field -o: a library is written as .tsv "
                                                                "or .tsv.gz")
    assert not (setup / "lib.xyz").exists()
    plot = CliRunner().invoke(cli, ["evaluate", "q.mgf", "--candidates", "sets.json", "--model", "model",
                                    "--plot", "nodir/p.png"])
    assert plot.exit_code == 2 and _last_line(plot).endswith("the folder nodir does not exist")
    predict = CliRunner().invoke(cli, ["properties", "predict", "q.mgf", "--model", "model", "-o", "q.mgf"])
    assert predict.exit_code == 2 and "is also SPECTRA" in _last_line(predict)


def test_stdin_is_named_stdin_and_a_failed_run_prints_no_header(setup):
    result = CliRunner().invoke(cli, ["identify", "--model", "model", "--library", "lib.tsv"], input="garbage\n")
    assert result.exit_code == 2 and result.stdout == ""
    assert _last_line(result).startswith("molpredict: error: <stdin>: not an MGF file")
    ok = CliRunner().invoke(cli, ["identify", "--model", "model", "--library", "lib.tsv", "-q", "--top-k", "1"],
                            input=(setup / "q.mgf").read_text())
    lines = ok.stdout.splitlines()
    assert ok.exit_code == 0 and lines[0].startswith("query_id\t") and len(lines) == 4


def test_the_configured_library_and_the_model_bundle_are_never_written_over(setup, monkeypatch):
    """Without --library / --model the defaults are the inputs: `identify q.mgf -o lib.tsv` must not replace the
    configured library with results, nor -o write into the bundle."""
    before = (setup / "lib.tsv").read_bytes()
    monkeypatch.setenv("MOLPREDICT_LIBRARY", str(setup / "lib.tsv"))
    result = CliRunner().invoke(cli, ["identify", "q.mgf", "--model", "model", "-o", "lib.tsv"])
    assert result.exit_code == 2 and _last_line(result).endswith("lib.tsv, field -o: is also --library: it would "
                                                                 "be overwritten")
    assert (setup / "lib.tsv").read_bytes() == before
    result = _identify("-o", "model/bundle.json")
    assert result.exit_code == 2 and "field -o: is inside --model model: it would change it" in _last_line(result)
    monkeypatch.setenv("MOLPREDICT_MODEL", str(setup / "model"))
    result = CliRunner().invoke(cli, ["identify", "q.mgf", "-o", "model/positive/x.tsv"])
    assert result.exit_code == 2 and "is inside --model" in _last_line(result)


def test_a_coordinates_store_that_cannot_be_opened_is_one_line(setup):
    for root, message in [("foo://x", "the coordinates store foo://x: Protocol not known: foo"),
                          ("q.mgf", "the coordinates store q.mgf is a file, not a folder")]:
        result = _identify("--cache-dir", root)
        assert result.exit_code == 2 and _last_line(result) == f"molpredict: error: {message}"


def test_a_file_without_a_readable_spectrum_exits_non_zero(setup):
    (setup / "bad.mgf").write_text("BEGIN IONS\nPEPMASS=abc\n100 1\nEND IONS\n")
    result = CliRunner().invoke(cli, ["identify", "bad.mgf", "--model", "model", "--library", "lib.tsv",
                                      "-o", "out.tsv", "--skipped", "skipped.tsv"])
    assert result.exit_code == 2 and _last_line(result) == ("molpredict: error: bad.mgf: no readable spectrum "
                                                             "(1 record unreadable)")
    assert "non-numeric PEPMASS" in (setup / "skipped.tsv").read_text()  # the report is still written


def test_a_skip_summary_of_many_reasons_stays_short_and_counts_every_skip():
    """Many distinct reasons: the summary lists the most frequent ones and counts the rest in one line, so the
    counts still add up to every skip."""
    from molpredict.cli.identification import MAX_REASON_LINES, skip_summary
    from molpredict.identification.identify import Skipped

    skipped = [Skipped(query_id=f"q{i}", reason=f"MS level {k} (the model takes MS2)", file="a.mgf",
                       record=i) for i, k in enumerate([1] * 5 + [3] * 4 + list(range(4, 31)))]
    lines = skip_summary(skipped, shown=2)
    assert len(lines) == MAX_REASON_LINES
    assert lines[0] == ("skipped 5: MS level 1 (the model takes MS2) (a.mgf records 0, 1 and 3 more, all "
                        "with --skipped FILE)")
    assert lines[1].startswith("skipped 4: MS level 3 (the model takes MS2) (a.mgf records 5, 6 and 2")
    assert lines[-1] == "skipped 20 more for 20 other reasons (all with --skipped FILE)"  # 29 reasons, 9 listed
    counted = sum(int(line.split()[1].rstrip(":")) for line in lines)
    assert counted == len(skipped)
    few = skip_summary(skipped[:9], shown=2)  # two reasons: no summary line
    assert len(few) == 2 and not any("other reasons" in line for line in few)


def test_reasons_differing_only_by_formula_or_mass_are_one_line_on_stderr_and_in_the_report():
    """A small library against a large file: one "no candidates" reason per formula. Identify's summary and the
    HTML report's both give them one line, saying how many formulas (QA: the report had one line per formula);
    a reason of one formula keeps it."""
    from molpredict.cli.identification import skip_summary
    from molpredict.identification.identify import Skipped
    from molpredict.report.page import Report

    reasons = ([f"no candidates in the library (formula C{k}H4)" for k in (1, 1, 2, 3)]
               + ["no candidates in the library (mass within 10 ppm)", "no peaks after cleaning",
                  "no candidates from source elsewhere (formula C9H8O4)"])
    skipped = [Skipped(query_id=f"q{i}", reason=r, file="a.mgf", record=i + 1) for i, r in enumerate(reasons)]
    assert skip_summary(skipped, shown=2) == [
        "skipped 5: no candidates in the library (3 formulas, 1 mass window) (a.mgf records 1, 2 and 3 more, all "
        "with --skipped FILE)",
        "skipped 1: no peaks after cleaning (a.mgf record 6)",
        "skipped 1: no candidates from source elsewhere (formula C9H8O4) (a.mgf record 7)"]
    report = Report()
    for s in skipped:
        report.add_skipped(s.query_id, s.reason, s.file, s.record)
    summary = report._skipped_html().split("<table")[0]
    assert summary == ("<ul><li>5 &times; no candidates in the library (3 formulas, 1 mass window)</li>"
                       "<li>1 &times; no peaks after cleaning</li>"
                       "<li>1 &times; no candidates from source elsewhere (formula C9H8O4)</li></ul>")
    assert "(formula C2H4)</td>" in report._skipped_html()  # the table keeps each query's own reason


def test_train_refuses_an_output_folder_of_other_files_before_reading_the_data(setup):
    """The training file does not exist: refusing the output is what is reported, so it came first (it came
    after the whole fit)."""
    (setup / "mine").mkdir()
    (setup / "mine" / "notes.txt").write_text("precious")
    result = CliRunner().invoke(cli, ["train", "missing.mgf", "-o", "mine"])
    assert result.exit_code != 0 and "mine: exists and is not a model bundle" in _last_line(result), result.output
    assert (setup / "mine" / "notes.txt").read_text() == "precious"
