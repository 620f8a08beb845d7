"""Small command-line checks: `candidates build -j 0`, `candidates info` skip reasons and empty sources,
`config set` messages for a file / directory of the wrong kind, no empty directory left by a failed data import,
`data fetch massbank --url` refusing what is no URL to download from."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from molpredict.cli import cli

SMILES = "smiles name\nCCO ethanol\nnot_a_smiles junk\nc1ccccc1O phenol\n"
TSV = ("smiles\tname\tsource\n"
       "CCO\tethanol\tmine\n"
       "C1CC\tbroken ring\tmine\n"
       "c1ccccc1O\tphenol\t\n")


def test_build_refuses_zero_jobs(tmp_path):
    src = tmp_path / "in.smi"
    src.write_text(SMILES)
    out = tmp_path / "lib.tsv"
    result = CliRunner().invoke(cli, ["candidates", "build", str(src), "-o", str(out), "-j", "0"])
    assert result.exit_code == 2, result.output
    assert "-j" in result.stderr and "--jobs" in result.stderr and "0" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("jobs", ["1", "-1", "-2"])
def test_build_accepts_positive_and_negative_jobs(tmp_path, jobs):
    src = tmp_path / "in.smi"
    src.write_text(SMILES)
    out = tmp_path / "lib.tsv"
    result = CliRunner().invoke(cli, ["candidates", "build", str(src), "-o", str(out), "-j", jobs])
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_info_lists_skip_reasons_and_empty_source(tmp_path):
    lib = tmp_path / "lib.tsv"
    lib.write_text(TSV)
    result = CliRunner().invoke(cli, ["candidates", "info", str(lib)])
    assert result.exit_code == 0, result.output
    assert "see warnings" not in result.output
    assert "skipped rows 1" in result.stdout
    assert "line 3, field smiles: RDKit cannot parse SMILES 'C1CC'" in result.stdout
    assert "(none)" in result.stdout and "None" not in result.stdout
    data = json.loads(CliRunner().invoke(cli, ["candidates", "info", str(lib), "--json"]).stdout)
    assert data["sources"] == {"mine": 1, "(none)": 1}
    assert data["skipped"] == 1 and data["skipped_first"][0]["line"] == 3
    assert "C1CC" in data["skipped_first"][0]["reason"]


def test_info_lists_skip_reasons_of_a_smiles_file(tmp_path):
    lib = tmp_path / "lib.smi"
    lib.write_text(SMILES)
    result = CliRunner().invoke(cli, ["candidates", "info", str(lib)])
    assert result.exit_code == 0, result.output
    assert "skipped rows 1" in result.stdout and "not_a_smiles" in result.stdout
    assert "see warnings" not in result.output


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.delenv("MOLPREDICT_CONFIG", raising=False)
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_config_set_names_the_wrong_kind(home, tmp_path):
    a_file = tmp_path / "lib.tsv"
    a_file.write_text("smiles\nCCO\n")
    a_dir = tmp_path / "somedir"
    a_dir.mkdir()
    result = CliRunner().invoke(cli, ["config", "set", "model", str(a_file)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"molpredict: error: {a_file}: is a file, not a model bundle directory"
    result = CliRunner().invoke(cli, ["config", "set", "library", str(a_dir)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"molpredict: error: {a_dir}: is a directory, not a library file"
    result = CliRunner().invoke(cli, ["config", "set", "library", str(tmp_path / "missing.tsv")])
    assert result.exit_code == 2 and "no such file" in result.stderr
    assert not (home / "config.json").exists()


def test_failed_import_leaves_no_directory(tmp_path):
    out = tmp_path / "mbx"
    result = CliRunner().invoke(cli, ["data", "import-massbank", str(tmp_path / "nosuch"), "-o", str(out)])
    assert result.exit_code == 2 and "no such file or directory" in result.stderr
    assert not out.exists()
    # nor its missing parents; a failure inside the input (an unreadable archive) also cleans up
    bad = tmp_path / "bad.tar.gz"
    bad.write_text("not a tarball")
    nested = tmp_path / "a" / "b"
    result = CliRunner().invoke(cli, ["data", "import-massbank", str(bad), "-o", str(nested)])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "a").exists()


def test_failed_import_keeps_a_directory_that_existed(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    result = CliRunner().invoke(cli, ["data", "import-massbank", str(tmp_path / "nosuch"), "-o", str(out)])
    assert result.exit_code == 2
    assert out.is_dir()


def test_failed_fetch_leaves_no_directory(tmp_path):
    out = tmp_path / "mbf3"
    result = CliRunner().invoke(cli, ["data", "fetch", "massbank", "-o", str(out), "--url", "notaurl",
                                      "--no-progress"])
    assert result.exit_code == 2 and "not a URL to download from" in result.output, result.output  # bad input
    assert not out.exists()
    refused = "http://127.0.0.1:9/MassBank.tar.gz"  # the discard port: the connection is refused at once
    result = CliRunner().invoke(cli, ["data", "fetch", "massbank", "-o", str(out), "--url", refused,
                                      "--no-progress"])
    assert result.exit_code == 5, result.output  # a failed download
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    result = CliRunner().invoke(cli, ["data", "fetch", "massbank", "-o", str(kept), "--url", refused,
                                      "--no-progress"])
    assert result.exit_code == 5 and kept.is_dir()


@pytest.mark.parametrize("url", ["notaurl", "", "http:notaurl", "https://", "https://:443/x.tar.gz",
                                 "ftp://mirror/x.tar.gz", "file://", "http://[::1/x", "http://host:port/x",
                                 "http://my mirror/x.tar.gz"])
def test_fetch_refuses_a_malformed_url_as_a_usage_error(tmp_path, monkeypatch, url):
    """A malformed --url (no scheme, no host, another scheme, unparsable) is bad input, exit 2, in one line naming
    the option: refused before the library is called, so before any folder is created or connection tried."""
    import molpredict.data.massbank as massbank
    from molpredict.errors import InputError

    def must_not_run(*args, **kwargs):
        raise AssertionError("fetch_massbank called")

    monkeypatch.setattr(massbank, "fetch_massbank", must_not_run)
    out = tmp_path / "mb"
    result = CliRunner().invoke(cli, ["data", "fetch", "massbank", "-o", str(out), "--url", url, "--no-progress"])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"molpredict: error: --url {url!r}: not a URL to download from (")
    assert not out.exists()
    monkeypatch.undo()  # the library refuses the same URLs by itself (a non-empty one: "" means the release URL)
    if url:
        with pytest.raises(InputError, match="^not a URL to download from"):
            massbank.fetch_massbank(out, url=url, progress=False)
        assert not out.exists()


def test_a_plugins_dir_that_is_a_file_is_one_error(tmp_path, capsys, monkeypatch):
    """Through the console script: one line (the registry's "does not exist" warning came first, then click's)."""
    from molpredict.cli import main

    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", "")  # main() sets it from the option: undone after the test
    plugin_file = tmp_path / "plugins.py"
    plugin_file.write_text("")
    with pytest.raises(SystemExit) as done:
        main(["--plugins-dir", str(plugin_file), "plugins", "list"])
    assert done.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"molpredict: error: {plugin_file}: is a file, not a plugins directory (--plugins-dir or "
                   f"MOLPREDICT_PLUGINS_DIR)"]
