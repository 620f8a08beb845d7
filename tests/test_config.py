"""User defaults (`molpredict config`): precedence, the stored file, and `identify` without --library / --model."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from molpredict import config
from molpredict.cli import cli
from molpredict.errors import InputError


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh user: MOLPREDICT_HOME in tmp_path, no config file, no environment defaults."""
    monkeypatch.delenv("MOLPREDICT_CONFIG", raising=False)
    monkeypatch.delenv("MOLPREDICT_LIBRARY", raising=False)
    monkeypatch.delenv("MOLPREDICT_MODEL", raising=False)
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_precedence_and_file(home, tmp_path, monkeypatch):
    assert config.config_path() == home / "config.json"
    assert config.resolve("library") == (None, "unset")
    assert config.resolve("model") == (str(home / "models" / "default"), "default")
    lib = tmp_path / "lib.tsv"
    lib.write_text("smiles\n")
    (tmp_path / "m").mkdir()
    config.set_value("library", str(lib))
    config.set_value("model", str(tmp_path / "m"))
    assert json.loads((home / "config.json").read_text()) == {"library": str(lib.resolve()),
                                                             "model": str((tmp_path / "m").resolve())}
    assert config.resolve("library") == (str(lib.resolve()), "config file")
    monkeypatch.setenv("MOLPREDICT_LIBRARY", "/elsewhere.tsv")
    assert config.resolve("library") == ("/elsewhere.tsv", "environment (MOLPREDICT_LIBRARY)")
    monkeypatch.delenv("MOLPREDICT_LIBRARY")
    config.unset_value("library")
    assert config.default_library() is None and config.default_model() == str((tmp_path / "m").resolve())
    # MOLPREDICT_CONFIG names the file itself
    monkeypatch.setenv("MOLPREDICT_CONFIG", str(tmp_path / "other.json"))
    assert config.read_config() == {} and config.resolve("model")[1] == "default"


def test_bad_values_and_files(home, tmp_path):
    with pytest.raises(InputError, match="no such file"):
        config.set_value("library", str(tmp_path / "missing.tsv"))
    with pytest.raises(InputError, match="no such directory"):
        config.set_value("model", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="unknown setting 'colour'"):
        config.set_value("colour", "blue")
    home.mkdir()
    (home / "config.json").write_text("{ not json")
    with pytest.raises(InputError) as e:
        config.read_config()
    assert "config.json" in str(e.value) and "\n" not in str(e.value)


def test_what_config_stores_must_be_usable(home, tmp_path):
    """`config set` refuses a folder that is no bundle and a file that is no library (every later identify would
    fail on it with a message about another file); a setting that is not a path string (null) is a one-line
    error saying how to repair it, and `config unset` repairs it."""
    runner = CliRunner()
    (tmp_path / "folder").mkdir()
    result = runner.invoke(cli, ["config", "set", "model", str(tmp_path / "folder")])
    assert result.exit_code == 2 and "not a model bundle (no bundle.json)" in result.output
    (tmp_path / "spectra.mgf").write_text("BEGIN IONS\nPEPMASS=100\n50 1\nEND IONS\n")
    result = runner.invoke(cli, ["config", "set", "library", str(tmp_path / "spectra.mgf")])
    assert result.exit_code == 2 and "not a candidate library" in result.output
    (tmp_path / "nosmiles.tsv").write_text("name\tmass\nx\t1\n")
    result = runner.invoke(cli, ["config", "set", "library", str(tmp_path / "nosmiles.tsv")])
    assert result.exit_code == 2 and "no 'smiles' column" in result.output
    assert not (home / "config.json").exists()
    home.mkdir()
    (home / "config.json").write_text('{"model": null, "library": "/a/lib.tsv"}')
    with pytest.raises(InputError, match="setting 'model' must be a path in quotes, not null; fix it or "
                                         "`molpredict config unset model`"):
        config.read_config()
    result = runner.invoke(cli, ["config", "unset", "model"])  # the null was set: removing it repairs the file
    assert result.exit_code == 0 and result.stderr.startswith("molpredict: model unset (in ")
    assert config.read_config() == {"library": "/a/lib.tsv"}


def test_unsetting_what_is_not_set_says_so(home, monkeypatch):
    """A second `config unset` does not report having removed something (QA: "model unset" both times)."""
    runner = CliRunner()
    home.mkdir()
    (home / "config.json").write_text('{"model": "/a/model"}')
    first = runner.invoke(cli, ["config", "unset", "model"])
    assert first.exit_code == 0 and first.stderr == f"molpredict: model unset (in {home / 'config.json'})\n"
    second = runner.invoke(cli, ["config", "unset", "model"])
    assert second.exit_code == 0
    assert second.stderr == f"molpredict: model was not set in {home / 'config.json'}: nothing to unset\n"
    assert config.unset_value("library") == (home / "config.json", False)
    # the environment's value outlives the unset: said, or the user believes the default now applies
    monkeypatch.setenv("MOLPREDICT_MODEL", "/env/model")
    third = runner.invoke(cli, ["config", "unset", "model"])
    assert third.stderr.endswith("nothing to unset; MOLPREDICT_MODEL from the environment still applies\n")


def test_cli_config_and_identify_defaults(home, tmp_path, monkeypatch):
    """`identify` without --library uses the configured library; a fresh user gets one line naming the command."""
    from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
    from molpredict.chem.candidates import CandidateLibrary
    from molpredict.modelfile import ModelBundle, SubModel
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import write_mgf
    from molpredict.training.pipeline import build_model

    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=2, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(), adducts=["[M+H]+"])
    model_path = ModelBundle({"positive": sub}).save(tmp_path / "model")
    lib = tmp_path / "library.tsv"
    CandidateLibrary.from_smiles(SMILES).to_tsv(lib)
    queries, _ = synthetic_spectra(n_per=1, seed=8)
    mgf = tmp_path / "q.mgf"
    write_mgf(queries, mgf)

    runner = CliRunner()
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model_path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "molpredict config set library" in lines[0] and "--library" in lines[0]
    result = runner.invoke(cli, ["config", "show"])
    assert result.exit_code == 0 and "library: (not set" in result.stdout and "[default]" in result.stdout

    result = runner.invoke(cli, ["config", "set", "library", str(lib)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["config", "set", "model", str(model_path)])
    assert result.exit_code == 0, result.output
    shown = json.loads(runner.invoke(cli, ["config", "show", "--json"]).stdout)
    assert shown["library"] == {**shown["library"], "value": str(lib.resolve()), "origin": "config file"}
    assert shown["config_file"] == str(home / "config.json")
    result = runner.invoke(cli, ["identify", str(mgf), "-o", str(tmp_path / "hits.tsv")])
    assert result.exit_code == 0, result.output
    assert f"library {lib.resolve()}" in result.stderr and f"model {model_path.resolve()}" in result.stderr
    assert f"{len(queries)} identified" in result.stderr
    # the environment wins over the file
    monkeypatch.setenv("MOLPREDICT_LIBRARY", str(tmp_path / "gone.tsv"))
    result = runner.invoke(cli, ["identify", str(mgf)])
    assert result.exit_code == 2 and "gone.tsv" in result.stderr
    # a configured path since deleted: the error says where the path came from (QA)
    assert "it is the library set by the environment (MOLPREDICT_LIBRARY)" in result.stderr
    monkeypatch.delenv("MOLPREDICT_LIBRARY")
    model_path.rename(tmp_path / "moved")
    result = runner.invoke(cli, ["identify", str(mgf)])
    assert result.exit_code == 4 and "it is the model set by the config file" in result.stderr, result.output
    assert "molpredict config set model" in result.stderr
    (tmp_path / "moved").rename(model_path)
    result = runner.invoke(cli, ["config", "set", "library", str(tmp_path / "gone.tsv")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
