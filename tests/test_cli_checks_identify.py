"""The identification commands refuse, before any work, what they would otherwise fail on after it or silently
ignore: a plot format matplotlib cannot write, candidate options `train` cannot use, a --source no library row
has, spectra-only options given with text queries, a --ppm that is not positive; and identify warns about formula
hints that name no query."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from identification_helpers import SMILES
from molpredict.chem.candidates import CandidateLibrary
from molpredict.cli import cli

from conftest import FIXTURES
from test_cli_outputs import _identify, _last_line, setup  # noqa: F401 (setup: the fixture)

TEXT = FIXTURES / "text"


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


# -- 1. --plot: its format before the work ------------------------------------------------------------------

def test_an_unsupported_plot_format_is_refused_before_the_evaluation(setup):
    result = _run("evaluate", "q.mgf", "--candidates", "sets.json", "--model", "model", "--plot", "x.txt")
    assert result.exit_code == 2, result.output
    assert _last_line(result).startswith("molpredict: error: x.txt, field --plot: format 'txt' is not supported "
                                         "(one of: ")
    assert "png" in _last_line(result) and result.stdout == ""
    assert not (setup / "x.txt").exists()
    result = _run("evaluate", "q.mgf", "--candidates", "sets.json", "--model", "model", "--plot", "curves")
    assert result.exit_code == 2 and "field --plot: no file extension" in _last_line(result), result.output


def test_select_sketch_size_refuses_a_plot_format_before_the_curve_and_writes_no_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.smi").write_text("\n".join(SMILES) + "\n")
    (tmp_path / "val.smi").write_text("\n".join(SMILES[:3]) + "\n")
    result = _run("select-sketch-size", "train.smi", "--val", "val.smi", "--grid", "2,4", "--landmarks", "0",
                  "--plot", "x.txt", "--json", "x.json", "-q")
    assert result.exit_code == 2, result.output
    assert "x.txt, field --plot: format 'txt' is not supported" in _last_line(result)
    assert "recommended" not in result.output
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "x.txt").exists()


def test_plot_formats_are_matplotlibs_or_the_fixed_list(monkeypatch):
    from molpredict.cli.paths import PLOT_FORMATS, check_plot_file, plot_formats
    from molpredict.errors import InputError, ResourceError

    pytest.importorskip("matplotlib")
    assert {"png", "pdf", "svg"} <= set(plot_formats())
    check_plot_file("curve.PNG")  # the extension's case does not matter (matplotlib lowers it)
    check_plot_file(None)
    with pytest.raises(InputError, match="format 'txt' is not supported"):
        check_plot_file("a/b.txt", "--plot")
    for name in ("matplotlib", "matplotlib.backend_bases"):  # matplotlib not installed
        monkeypatch.setitem(__import__("sys").modules, name, None)
    assert plot_formats() == sorted(PLOT_FORMATS)
    with pytest.raises(InputError, match="format 'txt' is not supported"):
        check_plot_file("b.txt")
    with pytest.raises(ResourceError, match="^--plot needs matplotlib"):  # before the work, not after it
        check_plot_file("b.png")


# -- 2. train: candidate options that cannot take effect ------------------------------------------------------

@pytest.fixture
def no_default_library(monkeypatch):
    monkeypatch.delenv("MOLPREDICT_LIBRARY", raising=False)  # (conftest points MOLPREDICT_CONFIG at no file)


def test_train_refuses_candidate_options_it_would_ignore(setup, no_default_library, monkeypatch):
    import molpredict.training.pipeline as pipeline

    (setup / "vc.json").write_text("{}")
    cases = [
        (["--calibration-candidates", "nosuch.json"], "--calibration-candidates needs --val"),
        (["--val-candidates", "vc.json"], "--val-candidates needs --val"),
        (["--val-candidates", "vc.json", "--calibration-candidates", "vc.json"],
         "--val-candidates and --calibration-candidates need --val"),
        (["--val", "q.mgf", "--calibration-candidates", "vc.json"],
         "--calibration-candidates needs --val-candidates or --library"),
        (["--val", "q.mgf", "--val-candidates", "nosuch.json"],
         "molpredict: error: nosuch.json, field --val-candidates: no such file"),
        (["--val", "q.mgf", "--val-candidates", "vc.json", "--calibration-candidates", "gone.json"],
         "molpredict: error: gone.json, field --calibration-candidates: no such file"),
    ]
    for extra, message in cases:
        result = _run("train", "q.mgf", "-o", "m2", *extra)
        assert result.exit_code == 2, (extra, result.output)
        assert message in _last_line(result), (extra, result.output)
        assert not (setup / "m2").exists()
    text = _run("train", str(TEXT / "pairs.tsv"), "--val", str(TEXT / "pairs.tsv"), "-o", "m2",
                "--val-candidates", "vc.json")
    assert text.exit_code == 2 and "--val-candidates apply to spectra" in _last_line(text), text.output

    # what can take effect passes the checks, to the training
    def stop(*args, **kwargs):
        raise SystemExit(7)
    monkeypatch.setattr(pipeline, "train_bundle", stop)
    for extra in (["--val", "q.mgf", "--val-candidates", "vc.json", "--calibration-candidates", "vc.json"],
                  ["--val", "q.mgf", "--calibration-candidates", "vc.json", "--library", "lib.tsv"]):
        assert _run("train", "q.mgf", "-o", "m2", *extra).exit_code == 7, extra
    monkeypatch.setenv("MOLPREDICT_LIBRARY", str(setup / "lib.tsv"))  # the configured library stands in
    assert _run("train", "q.mgf", "-o", "m2", "--val", "q.mgf", "--calibration-candidates", "vc.json").exit_code == 7


# -- 3. identify --source that no library row has --------------------------------------------------------------

def test_a_source_no_library_row_has_is_an_error_listing_the_librarys_sources(setup):
    library = CandidateLibrary.from_smiles(SMILES, names=[f"c{i}" for i in range(len(SMILES))], source="hmdb")
    library.to_tsv(setup / "src.tsv")
    result = _identify("--library", "src.tsv", "--source", "pubchem", "-o", "out.tsv")
    assert result.exit_code == 2, result.output
    assert _last_line(result) == ("molpredict: error: src.tsv: no library row has --source pubchem (its sources: "
                                  "hmdb)")
    assert not (setup / "out.tsv").exists()
    result = _identify("--source", "pubchem")  # lib.tsv has no source column
    assert result.exit_code == 2 and _last_line(result).endswith("(it has no source column)"), result.output
    ok = _identify("--library", "src.tsv", "--source", "pubchem", "--source", "hmdb", "-q")
    assert ok.exit_code == 0, ok.output


# -- 4. --formulas hints that name no query ---------------------------------------------------------------------

def test_formula_hints_naming_no_query_are_warned_about(setup):
    (setup / "hints.tsv").write_text("query_id\tformula\ns0-0\tC2H6O\nnosuch\tC2H6O\nother\tCH4O\n")
    with pytest.warns(UserWarning, match=r"^hints.tsv: 2 formula hints name no query in the input "
                                         r"\(first: nosuch\)$"):
        result = _identify("--formulas", "hints.tsv", "-q", "-o", "out.tsv")
    assert result.exit_code == 0, result.output
    (setup / "good.tsv").write_text("s0-0\tC2H6O\n")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = _identify("--formulas", "good.tsv", "-q", "-o", "out2.tsv")
    assert result.exit_code == 0, result.output


# -- 5. text queries: the spectra-only options ------------------------------------------------------------------

@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("textmodel") / "model"
    result = CliRunner().invoke(cli, ["train", str(TEXT / "pairs.tsv"), "-o", str(out), "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    return out


def test_text_queries_refuse_the_spectra_only_options(tmp_path, monkeypatch, text_model):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.tsv").write_text("text1\tC2H6O\n")
    base = ["identify", "--text", "an alcohol", "--model", str(text_model), "--library", str(TEXT / "library.tsv"),
            "-q", "-o", "out.tsv"]
    result = _run(*base, "--ppm", "3", "--by", "mass", "--formulas", "f.tsv", "--cluster", "local:1")
    assert result.exit_code == 2, result.output
    assert _last_line(result) == ("molpredict: error: --by, --ppm, --formulas, --cluster apply to spectra only: not "
                                  "available for text queries (--text, --text-file)")
    for extra, name in ((["--prior", "off"], "--prior"), (["--ppm-only"], "--ppm-only"),
                        (["--block-queries", "3"], "--block-queries"), (["--skipped", "s.tsv"], "--skipped")):
        result = _run(*base, *extra)
        assert result.exit_code == 2 and _last_line(result) == (f"molpredict: error: {name} applies to spectra "
                                                                f"only: not available for text queries (--text, "
                                                                f"--text-file)"), result.output
    assert not (tmp_path / "out.tsv").exists()
    ok = _run(*base, "--ppm", "10", "--prior", "on", "--top-k", "2")  # the defaults, spelt out: nothing ignored
    assert ok.exit_code == 0, ok.output
    assert len((tmp_path / "out.tsv").read_text().splitlines()) == 3
    # --source on the text path too
    result = _run(*base[:-2], "--source", "nosuch")
    assert result.exit_code == 2 and "no library row has --source nosuch" in _last_line(result), result.output


# -- 6. --no-cache's help says what the cache changes ---------------------------------------------------------

def test_the_cache_help_says_it_keeps_int8_coordinates():
    for command in ("identify", "evaluate"):
        text = " ".join(_run(command, "--help").output.split())
        assert "Do not read or write the coordinates cache: compute the candidates' coordinates every run, in " \
               "full precision. The cache keeps them in int8" in text, command
        assert "spectrum scores differ from these by up to about 0.01" in text
        assert "nearly tied candidates can swap ranks" in text
        assert "(default: $MOLPREDICT_HOME/coordinates" in text, command


# -- 7. --ppm is checked by click, before the model and the library -------------------------------------------

def test_a_ppm_that_is_not_positive_fails_before_any_loading(setup):
    for value in ("0", "-3", "nan", "inf"):
        result = CliRunner().invoke(cli, ["identify", "q.mgf", "--model", "nosuch-model", "--library", "lib.tsv",
                                          "--ppm", value])
        assert result.exit_code == 2, (value, result.output)
        assert "Invalid value for '--ppm'" in result.output and "nosuch-model" not in result.output, result.output


# -- 8. train's help names the metadata a label is read from ----------------------------------------------------

def test_train_help_says_labels_are_smiles_else_inchi_as_the_pipeline_reads_them(tmp_path):
    """The help said "SMILES / INCHIKEY", but a spectrum with only an INCHIKEY is skipped: no structure can be drawn
    from a key (QA: a file of such spectra trained on nothing)."""
    from molpredict.training.pipeline import TrainOptions, load_labelled

    text = " ".join(_run("train", "--help").output.split())
    assert "spectra labelled with structures (SMILES, else INCHI metadata)" in text
    assert "SMILES / INCHIKEY" not in text and "an INCHIKEY alone is not one" in text
    (tmp_path / "k.mgf").write_text("BEGIN IONS\nPEPMASS=181.0707\nIONMODE=positive\n"
                                    "INCHIKEY=RYYVLZVUVIJVGH-UHFFFAOYSA-N\n55.0 10\n82.1 100\nEND IONS\n")
    labelled = load_labelled([tmp_path / "k.mgf"], TrainOptions())
    assert labelled.n_used() == 0 and labelled.skipped == {"no structure (SMILES or InChI)": 1}
