"""The public Python API (molpredict.identify / train / evaluate / load_model) and the matchms adapter: the same
rows as the command, the same rank-1 hits from a file and from matchms spectra, and the README example run."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import molpredict
from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
from molpredict.cli import cli
from molpredict.errors import InputError, ModelFileError
from molpredict.io import read_spectra, write_mgf
from molpredict.io.results import OUTPUT_COLUMNS

import matchms  # noqa: E402  (a test extra: `make test` installs it)

README = Path(__file__).resolve().parents[1] / "README.md"
DECOYS = ["CC1Cc2ccc(O)cc2C(=O)O1", "CC(=O)Nc1cccc(O)c1", "O=C(O)/C=C/c1ccc(O)cc1O", "CC(C)Cc1ccc(CC(C)C(=O)O)cc1"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A trained model (the suite's small ridge stand-in), a library file and a queries file, as in the README."""
    install_fake_model()
    spectra, _ = synthetic_spectra(n_per=2, seed=1)
    molpredict.train(_write(tmp_path / "train.mgf", spectra), model=f"{FAKE_MODEL}:dim=32", lam="0.01|0.1",
                     output=tmp_path / "mymodel")
    with open(tmp_path / "library.tsv", "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["smiles", "name"])
        for i, smiles in enumerate(SMILES + DECOYS):
            writer.writerow([smiles, f"cand{i}"])
    queries, _ = synthetic_spectra(n_per=1, seed=7)
    queries = queries[:6]
    queries.append(queries[0].with_peaks(np.zeros(0), np.zeros(0)))  # no peaks: skipped, reported
    queries[-1].id = "empty"
    _write(tmp_path / "queries.mgf", queries)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(path: Path, spectra) -> Path:
    write_mgf(spectra, path)
    return path


def _cli_rows(workdir: Path) -> list[dict]:
    result = CliRunner().invoke(cli, ["identify", "queries.mgf", "--model", "mymodel", "--library", "library.tsv",
                                      "--top-k", "3", "-o", "cli.tsv", "-q", "--no-cache"])
    assert result.exit_code == 0, result.output
    with open(workdir / "cli.tsv") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def test_identify_returns_the_commands_rows(workdir):
    hits = molpredict.identify("queries.mgf", model="mymodel", library="library.tsv", top_k=3, cache_dir=False)
    assert list(hits.columns) == list(OUTPUT_COLUMNS)
    cli_rows = _cli_rows(workdir)
    assert len(hits) == len(cli_rows)
    assert hits.groupby("query_id").size().to_dict() == {
        q: min(3, n) for q, n in hits.groupby("query_id")["n_candidates"].first().items()}
    assert hits["query_id"].nunique() == 6
    for api_row, cli_row in zip(hits.to_dict("records"), cli_rows):
        assert [api_row[k] for k in ("query_id", "rank", "inchikey", "smiles", "name", "record")] == \
            [cli_row[k] if k not in ("rank", "record") else int(cli_row[k]) for k in
             ("query_id", "rank", "inchikey", "smiles", "name", "record")]
        assert api_row["score"] == pytest.approx(float(cli_row["score"]), rel=1e-6)
    # the unreadable record is named by the id its TITLE gives (as the matchms path below names it)
    assert hits.attrs["skipped"] == [{"query_id": "empty", "reason": "unreadable record: no peaks",
                                      "file": "queries.mgf", "record": 7}]
    assert hits.attrs["summary"]["n_identified"] == 6
    # the true structure is rank 1 for these well-separated synthetic spectra
    truth = {s.id: s.inchikey for s in read_spectra("queries.mgf")}
    top = hits[hits["rank"] == 1]
    assert all(row.inchikey == truth[row.query_id] for row in top.itertuples())


def test_matchms_spectra_give_the_same_rank_1_hits(workdir):
    from matchms.importing import load_from_mgf

    from_file = molpredict.identify("queries.mgf", model="mymodel", library="library.tsv", cache_dir=False)
    spectra = list(load_from_mgf("queries.mgf"))
    from_matchms = molpredict.identify(spectra, model=molpredict.load_model("mymodel"),
                                       library=molpredict.load_library("library.tsv"), cache_dir=False)
    top = lambda df: df[df["rank"] == 1][["query_id", "inchikey", "record"]].to_dict("records")  # noqa: E731
    assert top(from_matchms) == top(from_file)
    np.testing.assert_allclose(from_matchms["score"], from_file["score"], rtol=1e-9)
    assert [s["query_id"] for s in from_matchms.attrs["skipped"]] == ["empty"]


def test_a_list_of_paths_and_of_spectra(workdir):
    spectra = list(read_spectra("queries.mgf"))
    one = molpredict.identify(["queries.mgf", "queries.mgf"], model="mymodel", library="library.tsv",
                              top_k=1, cache_dir=False)
    assert list(one["query_id"]) == [s.id for s in spectra[:6]] + [f"{s.id}#2" for s in spectra[:6]]
    objects = molpredict.identify(spectra, model="mymodel", library="library.tsv", top_k=1, cache_dir=False)
    assert list(objects["inchikey"]) == list(one["inchikey"][:6])


def test_bad_arguments_are_one_line_errors(workdir):
    with pytest.raises(InputError, match="not a spectrum or a path: int"):
        molpredict.identify([1, 2], model="mymodel", library="library.tsv")
    with pytest.raises(InputError, match="by must be"):
        molpredict.identify("queries.mgf", model="mymodel", library="library.tsv", by="smell")
    with pytest.raises(InputError, match="unknown training option"):
        molpredict.train("queries.mgf", lamda=0.1)
    import pathlib
    pathlib.Path("notes").mkdir()
    pathlib.Path("notes/thesis.txt").write_text("precious")
    with pytest.raises(ModelFileError, match="notes: exists and is not a model bundle"):
        molpredict.train("no-such-file.mgf", output="notes")  # refused before the data is read (or trained on)
    assert pathlib.Path("notes/thesis.txt").read_text() == "precious"
    import pandas as pd

    call = dict(model="mymodel", library="library.tsv")
    for wrong, message in [(dict(top_k=2.5), "top_k must be an integer, not 2.5"),
                           (dict(top_k="3"), "top_k must be an integer, not '3'"),
                           (dict(top_k=0), "top_k must be >= 1, not 0"),
                           (dict(ppm="5"), "ppm must be a number, not '5'"),
                           (dict(ppm=-5), "ppm must be > 0, not -5"),
                           (dict(ppm=float("inf")), "ppm must be a finite number, not inf"),
                           (dict(ppm=float("nan")), "ppm must be a finite number, not nan"),
                           (dict(prior="off"), "prior must be True or False, not 'off'"),
                           (dict(model=3), "model must be a path or a loaded ModelBundle, not int"),
                           (dict(library=pd.read_csv("library.tsv", sep="\t")),
                            "library must be a path or a CandidateLibrary .*, not DataFrame")]:
        with pytest.raises(InputError, match=f"^{message}$"):
            molpredict.identify("queries.mgf", **{**call, **wrong})
    for spectra in ({"queries.mgf": 1}, pd.DataFrame({"queries.mgf": [1]}), b"queries.mgf", 7):
        with pytest.raises(InputError, match="^spectra must be a path, a Spectrum or matchms.Spectrum, or a list"):
            molpredict.identify(spectra, **call)
    result = CliRunner().invoke(cli, ["identify", "queries.mgf", "--by", "mass", "--ppm", "-5", *sum(
        ([f"--{k}", v] for k, v in call.items()), [])])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].endswith("ppm must be > 0, not -5.0")
    # one source named alone is that source, not its letters
    from molpredict.api import identify_options
    assert identify_options(sources="hmdb").sources == ["hmdb"]


def test_evaluate_returns_the_commands_json(workdir):
    sets = {s.inchikey[:14]: [[s.inchikey[:14], s.smiles]] + [[f"DECOY{i:09d}", d] for i, d in enumerate(DECOYS)]
            for s in read_spectra("queries.mgf") if s.inchikey}
    (workdir / "sets.json").write_text(json.dumps(sets))
    metrics = molpredict.evaluate("queries.mgf", "sets.json", model="mymodel", n_boot=0, cache_dir=False)
    result = CliRunner().invoke(cli, ["evaluate", "queries.mgf", "--candidates", "sets.json", "--model", "mymodel",
                                      "--json", "--n-boot", "0", "--no-cache", "-q"])
    assert result.exit_code == 0, result.output
    untimed = lambda r: {m: {k: v for k, v in r[m].items() if k not in ("time_s", "timings")} for m in r}  # noqa
    assert untimed(json.loads(result.output)) == untimed(json.loads(json.dumps(metrics)))
    assert metrics["mymodel"]["n_queries"] == 6 and metrics["mymodel"]["hit@1"] == 1.0


def test_train_and_evaluate_take_spectra_in_memory_as_from_their_file(workdir):
    """``train`` and ``evaluate`` read files; in-memory spectra (molpredict or matchms, mixed with paths) reach them
    through a temporary MGF that reads back bit for bit: the same model and the same figures as from the file."""
    from matchms.importing import load_from_mgf

    sets = {s.inchikey[:14]: [[s.inchikey[:14], s.smiles]] + [[f"DECOY{i:09d}", d] for i, d in enumerate(DECOYS)]
            for s in read_spectra("queries.mgf") if s.inchikey}
    (workdir / "sets.json").write_text(json.dumps(sets))
    untimed = lambda r: {m: {k: v for k, v in r[m].items() if k not in ("time_s", "timings")} for m in r}  # noqa
    from_file = untimed(molpredict.evaluate("queries.mgf", "sets.json", model="mymodel", n_boot=0, cache_dir=False))
    records = list(read_spectra("queries.mgf"))  # the reader leaves out the record without peaks: put it back
    empty = records[0].with_peaks(np.zeros(0), np.zeros(0))
    empty.id = "empty"
    for spectra in (records + [empty], list(load_from_mgf("queries.mgf"))):
        in_memory = untimed(molpredict.evaluate(spectra, "sets.json", model="mymodel", n_boot=0, cache_dir=False))
        assert json.dumps(in_memory, sort_keys=True) == json.dumps(from_file, sort_keys=True)  # NaN != NaN
        assert from_file["mymodel"]["n_skipped"] == 1
    training = list(read_spectra("train.mgf"))
    params = dict(model=f"{FAKE_MODEL}:dim=32", lam="0.01|0.1")
    reference = molpredict.train("train.mgf", **params)
    mixed = molpredict.train([training[0], "train.mgf", *list(load_from_mgf("train.mgf"))[1:3]], **params)
    assert mixed.summary["n_read"] == reference.summary["n_read"] + 3
    again = molpredict.train(training, **params)
    model = lambda b: b.for_mode(b.ion_modes[0]).model  # noqa: E731
    np.testing.assert_array_equal(model(again).W_, model(reference).W_)
    with pytest.raises(InputError, match="not a spectrum or a path: int"):
        molpredict.evaluate([training[0], 5], "sets.json", model="mymodel")
    # the sets as a dict, as read from the file (the same checks)
    as_dict = untimed(molpredict.evaluate("queries.mgf", sets, model="mymodel", n_boot=0, cache_dir=False))
    assert json.dumps(as_dict, sort_keys=True) == json.dumps(from_file, sort_keys=True)
    for wrong, message in [(dict(candidates={"K": "CCO"}), "candidates, record K: expected a list of"),
                           (dict(candidates=3), "candidates must be a candidate-sets JSON file or a dict of sets"),
                           (dict(n_boot=2.5), "n_boot must be an integer, not 2.5"),
                           (dict(n_boot=-1), "n_boot must be >= 0, not -1")]:
        with pytest.raises(InputError, match=message):
            molpredict.evaluate("queries.mgf", **{"candidates": "sets.json", "model": "mymodel", **wrong})
    with pytest.raises(InputError, match="no training spectra given"):
        molpredict.train([], **params)
    with pytest.raises(InputError, match="a path, not a file's content"):
        molpredict.identify((workdir / "queries.mgf").read_text(), model="mymodel", library="library.tsv")
    with pytest.raises(InputError, match="texts must be a description or a list of them, not int"):
        molpredict.identify_text(5, model="mymodel", library="library.tsv")


def test_matchms_round_trip_and_reader_agreement(workdir):
    from matchms.importing import load_from_mgf

    from molpredict.io.matchms import from_matchms, to_matchms

    ours = list(read_spectra("queries.mgf"))[:6]
    theirs = [from_matchms(s, i) for i, s in enumerate(load_from_mgf("queries.mgf"), start=1)]
    for a, b in zip(ours, theirs):
        assert (a.id, a.precursor_mz, a.charge, a.ion_mode, a.adduct, a.ms_level, a.record) == \
            (b.id, b.precursor_mz, b.charge, b.ion_mode, b.adduct, b.ms_level, b.record)
        np.testing.assert_array_equal(a.mz, b.mz)
        np.testing.assert_array_equal(a.intensities, b.intensities)
        assert (a.smiles, a.inchikey, a.formula) == (b.smiles, b.inchikey, b.formula)
        assert a.precursor_mz_precision == b.precursor_mz_precision
        back = from_matchms(to_matchms(a), a.record)
        assert (back.id, back.precursor_mz, back.charge, back.adduct, back.metadata) == \
            (a.id, a.precursor_mz, a.charge, a.adduct, a.metadata)


def test_negative_charge_and_missing_fields_from_matchms():
    from molpredict.io.matchms import from_matchms

    spectrum = matchms.Spectrum(mz=np.array([20.5, 50.0]), intensities=np.array([2.0, 1.0]),
                                metadata={"precursor_mz": 180.06, "ionmode": "negative", "charge": 1,
                                          "compound_name": "Glucose M-H"}, metadata_harmonization=False)
    ours = from_matchms(spectrum, 3)
    assert (ours.id, ours.charge, ours.adduct, ours.record, list(ours.mz)) == ("matchms:3", -1, "[M-H]-", 3,
                                                                              [20.5, 50.0])
    assert ours.precursor_mz_precision == pytest.approx(0.01)
    broken = matchms.Spectrum(mz=np.array([10.0]), intensities=np.array([1.0]),
                              metadata={"precursor_mz": "abc"}, metadata_harmonization=False)
    with pytest.raises(InputError, match=r"matchms spectra.*record 2.*precursor_mz|precursor_mz.*record 2"):
        from_matchms(broken, 2)


def test_identifications_written_into_matchms_metadata_and_exported(workdir):
    from matchms.exporting import save_as_mgf
    from matchms.importing import load_from_mgf

    from molpredict.io.matchms import with_identifications

    spectra = list(load_from_mgf("queries.mgf"))
    hits = molpredict.identify(spectra, model="mymodel", library="library.tsv", cache_dir=False)
    annotated = with_identifications(spectra, hits)
    top = hits[hits["rank"] == 1].set_index("record")
    for index, spectrum in enumerate(annotated, start=1):
        if index in top.index:
            assert spectrum.get("molpredict_inchikey") == top.loc[index, "inchikey"]
        else:
            assert spectrum.get("molpredict_inchikey") is None  # the skipped spectrum
        assert spectrum.get("molpredict_inchikey") is None or spectra[index - 1].get("molpredict_inchikey") is None
    save_as_mgf(annotated, str(workdir / "annotated.mgf"))
    text = (workdir / "annotated.mgf").read_text()
    assert text.count("MOLPREDICT_INCHIKEY=") == 6


def test_the_readme_example_runs(workdir, capsys):
    section = README.read_text().split("### From Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README 'From Python' has no python block"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    hits = namespace["hits"]
    assert list(hits.columns) == list(OUTPUT_COLUMNS) and hits["query_id"].nunique() == 6
    assert "annotated.mgf" in {p.name for p in workdir.iterdir()}
