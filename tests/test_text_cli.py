"""Text -> molecule through the command line: train on a pairs table, evaluate against a library or candidate sets,
identify descriptions with --text; plus the pairs reader and the one-line errors."""
from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from molpredict.cli import cli
from molpredict.io.results import OUTPUT_COLUMNS
from molpredict.io.text_pairs import PairsReport, is_pairs_path, read_text_pairs

from conftest import FIXTURES, require_shared

TEXT = FIXTURES / "text"
PAIRS = TEXT / "pairs.tsv"
LIBRARY = TEXT / "library.tsv"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch, tmp_path):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    yield
    torch.set_num_threads(previous)


def invoke(args: list[str]):
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    return result


def read_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text), delimiter="\t"))


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> Path:
    """A text model trained on the fixture pairs through the CLI (sisokr + text-ngram defaults)."""
    out = tmp_path_factory.mktemp("textmodel") / "model"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(cli, ["train", str(PAIRS), "-o", str(out), "--device", "cpu",
                                          "--summary-json", str(out.parent / "summary.json")],
                                    catch_exceptions=False)
    finally:
        torch.set_num_threads(previous)
    assert result.exit_code == 0, result.output
    return out


# -- reading pairs ---------------------------------------------------------------------------------------

def test_read_pairs_skips_bad_rows_with_line_and_field():
    report = PairsReport()
    pairs = read_text_pairs(PAIRS, report)
    assert len(pairs) == 30 and report.n_read == 32
    entries = sorted((e.line, e.field, e.reason) for e in report)
    assert entries == [(17, "smiles", "SMILES not parsed by RDKit"), (18, "description", "empty description")]
    # ids from the (upper-case) ID column, canonical isomeric SMILES kept (stereo distinguishes the alanines)
    by_id = {p.id: p for p in pairs}
    assert by_id["L-alanine"].molecule.smiles != by_id["D-alanine"].molecule.smiles
    assert by_id["ethanol"].line == 2 and by_id["ethanol"].molecule.smiles == "CCO"


def test_read_pairs_csv_gz_and_missing_columns(tmp_path):
    path = tmp_path / "pairs.csv.gz"
    with gzip.open(path, "wt", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "description"])
        writer.writerow(["CCO", 'An alcohol, "ethanol", with commas'])
        writer.writerow(["CC(=O)O", "Vinegar acid"])
    assert is_pairs_path(path) and not is_pairs_path("x.mgf")
    pairs = read_text_pairs(path)
    assert [p.description for p in pairs] == ['An alcohol, "ethanol", with commas', "Vinegar acid"]
    assert [p.id for p in pairs] == ["line2", "line3"]
    bad = tmp_path / "bad.tsv"
    bad.write_text("smiles\tname\nCCO\tethanol\n")
    from molpredict.errors import InputError
    with pytest.raises(InputError, match="lacks column.*description"):
        read_text_pairs(bad)


# -- train -----------------------------------------------------------------------------------------------

def test_train_writes_a_text_bundle(text_model):
    from molpredict.modelfile import ModelBundle

    bundle = ModelBundle.load(text_model)
    assert bundle.ion_modes == ["text"] and bundle.input_type == "text"
    meta = json.loads((text_model / "text" / "metadata.json").read_text())
    assert meta["input_type"] == "text"
    assert meta["model"]["params"]["input_kernel"] == "text-ngram"
    assert meta["model"]["params"]["input_sketch"] == "none"  # 30 pairs: no sub-sampling
    summary = json.loads((text_model.parent / "summary.json").read_text())
    assert summary["n_read"] == 32 and summary["models"]["text"]["n_pairs"] == 30
    assert summary["skipped"] == {"smiles: SMILES not parsed by RDKit": 1, "description: empty description": 1}
    assert {(r["line"], r["field"]) for r in summary["skipped_rows"]} == {(17, "smiles"), (18, "description")}


def test_train_reports_skipped_rows_on_stderr(tmp_path):
    result = CliRunner().invoke(cli, ["train", str(PAIRS), "-o", str(tmp_path / "m"), "--device", "cpu",
                                      "--lam", "1e-3"])
    assert result.exit_code == 0, result.output
    assert f"{PAIRS}, line 17, field smiles: SMILES not parsed by RDKit" in result.output
    assert "read 32 description/SMILES pairs: 30 used, 2 skipped" in result.output


def test_train_mixing_tables_and_spectra_is_one_line_error(tmp_path):
    spectra = FIXTURES / "identification" / "edge_cases.mgf"
    result = CliRunner().invoke(cli, ["train", str(PAIRS), str(spectra), "-o", str(tmp_path / "m")])
    assert result.exit_code != 0
    message = result.output.strip()
    assert "cannot mix" in message and len(message.splitlines()) == 1
    # a spectra-only input kernel on text is refused with the reason
    result = CliRunner().invoke(cli, ["train", str(PAIRS), "-o", str(tmp_path / "m"), "--input-kernel", "ppk"])
    assert result.exit_code != 0 and "takes spectra, not text" in result.output


# -- identify --------------------------------------------------------------------------------------------

def test_identify_text_ranks_own_molecule_first(text_model, tmp_path):
    pairs = {p.id: p for p in read_text_pairs(PAIRS)}
    names = ["caffeine", "glucose", "aspirin", "naphthalene"]
    args = ["identify", "--model", str(text_model), "--library", str(LIBRARY), "--top-k", "3", "-q",
            "--cache-dir", str(tmp_path / "cache")]
    for name in names[:3]:
        args += ["--text", pairs[name].description]
    text_file = tmp_path / "queries.txt"
    text_file.write_text("# one per line\n\n" + pairs[names[3]].description + "\n")
    args += ["--text-file", str(text_file)]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    rows = read_rows(result.stdout)
    assert list(rows[0]) == list(OUTPUT_COLUMNS)
    # --text ones by position, the file's line by its stem and line number (the blank and comment lines count)
    ids = ["text1", "text2", "text3", "queries:3"]
    assert [r["query_id"] for r in rows] == [i for i in ids for _ in range(3)]
    assert [(r["file"], r["record"]) for r in rows[::3]] == [("", "1"), ("", "2"), ("", "3"), (str(text_file), "3")]
    n_library = sum(1 for line in LIBRARY.read_text().splitlines()[1:] if line.strip())
    for i, name in enumerate(names):
        top = [r for r in rows if r["query_id"] == ids[i]]
        assert [r["rank"] for r in top] == ["1", "2", "3"]
        assert top[0]["smiles"] == pairs[name].molecule.smiles and top[0]["name"] == name
        assert float(top[0]["confidence"]) > 0
        scores = [float(r["score"]) for r in top]
        assert scores == sorted(scores, reverse=True)
        assert all(r["adduct"] == "" and int(r["n_candidates"]) == n_library for r in top)
    # the candidate coordinates were cached, and a second run gives the same table
    assert any((tmp_path / "cache").iterdir())
    assert invoke(args).stdout == result.stdout


def test_train_dsokr_on_text_uses_the_text_encoder_and_identifies(tmp_path):
    """``--model dsokr`` on a pairs table gets the text default encoder (a linear layer on whitened TF-IDF n-gram
    kernel features), is saved as a text model, and ranks the training molecules' own descriptions."""
    out = tmp_path / "dsokr"
    result = invoke(["train", str(PAIRS), "-o", str(out), "--device", "cpu", "--model", "dsokr:epochs=60"])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "text" / "metadata.json").read_text())
    assert meta["input_type"] == "text"
    assert meta["model"]["params"]["encoder"] == "kernel-mlp:input_kernel=text-ngram;layers=0;whiten=true"
    pairs = list(read_text_pairs(PAIRS))
    args = ["identify", "--model", str(out), "--library", str(LIBRARY), "--top-k", "1", "-q",
            "--cache-dir", str(tmp_path / "cache")]
    for pair in pairs[:8]:
        args += ["--text", pair.description]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    top = [r["smiles"] for r in read_rows(result.stdout)]
    assert sum(t == p.molecule.smiles for t, p in zip(top, pairs)) >= 6  # fitted descriptions: mostly their own


def test_identify_text_source_filter_and_errors(text_model, tmp_path):
    library = tmp_path / "lib.tsv"
    lines = LIBRARY.read_text().splitlines()
    library.write_text("smiles\tname\tsource\n" + "\n".join(
        line + ("\tdecoys" if "decoy" in line else "\tref") for line in lines[1:]) + "\n")
    result = invoke(["identify", "--text", "an alcohol", "--model", str(text_model), "--library", str(library),
                     "--source", "decoys", "--top-k", "50", "-q"])
    rows = read_rows(result.stdout)
    assert rows and all(r["name"].startswith("decoy") for r in rows) and rows[0]["n_candidates"] == "20"
    # text + spectra, a text model given spectra: one-line errors naming the input type
    spectra = FIXTURES / "identification" / "edge_cases.mgf"
    both = CliRunner().invoke(cli, ["identify", str(spectra), "--text", "x", "--model", str(text_model),
                                    "--library", str(LIBRARY)])
    assert both.exit_code != 0 and "not both" in both.output
    wrong = CliRunner().invoke(cli, ["identify", str(spectra), "--model", str(text_model),
                                     "--library", str(LIBRARY)])
    assert wrong.exit_code != 0
    assert "the model takes text input, not spectra" in wrong.output and len(wrong.output.strip().splitlines()) <= 2


def test_identify_text_from_python_gives_the_commands_rows(text_model, tmp_path):
    """molpredict.identify_text: the rows of `identify --text`, one-line errors for what is not a description."""
    import molpredict
    from molpredict.errors import InputError

    texts = ["an alcohol", "  a   carboxylic acid "]
    result = invoke(["identify", "--model", str(text_model), "--library", str(LIBRARY), "--top-k", "3", "-q",
                     "--no-cache", *sum((["--text", t] for t in texts), [])])
    frame = molpredict.identify_text(texts, model=text_model, library=LIBRARY, top_k=3, cache_dir=False)
    rows = read_rows(result.stdout)
    assert list(frame["query_id"]) == [r["query_id"] for r in rows] == ["text1"] * 3 + ["text2"] * 3
    assert list(frame["smiles"]) == [r["smiles"] for r in rows]
    assert frame["score"].tolist() == pytest.approx([float(r["score"]) for r in rows], abs=5e-7)  # 6 decimals
    assert list(molpredict.identify_text("an alcohol", model=text_model, library=LIBRARY, top_k=3,
                                         cache_dir=False)["smiles"]) == list(frame["smiles"][:3])
    for bad, message in [(["ok", "  ", "ok"], r"texts: empty description at position 2: leave it out \(an empty "
                                               r"string is no query\)"),
                         ([3], "texts, record 1: a description must be a string, not int"), ([], "texts: no descriptions")]:
        with pytest.raises(InputError, match=f"^{message}$"):
            molpredict.identify_text(bad, model=text_model, library=LIBRARY)


def test_a_description_with_no_known_word_is_skipped_not_ranked(text_model, tmp_path):
    """Every candidate would score the same (0.0): its rows would be the library's first InChIKeys, answers that
    look like any other. Skipped with the reason, in the API and on the command line."""
    import warnings

    import molpredict

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = molpredict.identify_text(["zzqx", "an alcohol"], model=text_model, library=LIBRARY, top_k=2,
                                         cache_dir=False)
    assert set(frame["query_id"]) == {"text2"} and list(frame["record"]) == [2, 2]
    reason = "no word of the description is known to the model (every candidate scores the same)"
    assert frame.attrs["skipped"] == [{"query_id": "text1", "reason": reason, "file": "", "record": 1}]
    assert frame.attrs["summary"]["n_skipped"] == 1
    assert not [w for w in caught if "spectra without peaks" in str(w.message)]  # the kernel's wording for spectra
    result = invoke(["identify", "--text", "zzqx", "--text", "an alcohol", "--model", str(text_model),
                     "--library", str(LIBRARY), "--top-k", "1", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert [r["query_id"] for r in read_rows(result.stdout)] == ["text2"]
    assert f"skipped 1: {reason} (text1)" in result.stderr


def test_text_file_ids_are_line_numbers_that_blank_lines_do_not_shift(text_model, tmp_path):
    pairs = list(read_text_pairs(PAIRS))
    tight, loose = tmp_path / "q.txt", tmp_path / "loose" / "q.txt"
    loose.parent.mkdir()
    tight.write_text(f"{pairs[0].description}\n{pairs[1].description}\n")
    loose.write_text(f"{pairs[0].description}\n\n   \n# a comment\n{pairs[1].description}\n")
    args = ["--model", str(text_model), "--library", str(LIBRARY), "--top-k", "1", "-q", "--no-cache"]
    rows = [read_rows(invoke(["identify", "--text-file", str(path), *args]).stdout) for path in (tight, loose)]
    assert [(r["query_id"], r["file"], r["record"]) for r in rows[0]] == [("q:1", str(tight), "1"),
                                                                        ("q:2", str(tight), "2")]
    assert [(r["query_id"], r["file"], r["record"]) for r in rows[1]] == [("q:1", str(loose), "1"),
                                                                        ("q:5", str(loose), "5")]
    assert [r["smiles"] for r in rows[0]] == [r["smiles"] for r in rows[1]]
    (tmp_path / "blank.txt").write_text("\n  \n# only a comment\n")
    result = invoke(["identify", "--text-file", str(tmp_path / "blank.txt"), *args])
    assert result.exit_code == 2 and "no descriptions (only blank lines and # comments)" in result.output


def test_spectrum_model_given_text_is_one_line_error(tmp_path):
    from molpredict.modelfile import ModelBundle, SubModel
    from molpredict.chem.molecules import Molecule
    from molpredict.training.pipeline import build_model

    model = build_model("random", {}).fit([object(), object()],
                                          [Molecule.from_smiles("CCO"), Molecule.from_smiles("CO")])
    ModelBundle({"positive": SubModel(model, "positive")}).save(tmp_path / "spec")
    result = CliRunner().invoke(cli, ["identify", "--text", "an alcohol", "--model", str(tmp_path / "spec"),
                                      "--library", str(LIBRARY)])
    assert result.exit_code != 0
    assert "the model takes spectrum input, not text" in result.output
    result = CliRunner().invoke(cli, ["evaluate", str(PAIRS), "--model", str(tmp_path / "spec"),
                                      "--library", str(LIBRARY)])
    assert result.exit_code != 0 and "takes spectrum input, not text" in result.output


# -- evaluate --------------------------------------------------------------------------------------------

def test_evaluate_text_against_library(text_model, tmp_path):
    result = invoke(["evaluate", str(PAIRS), "--model", str(text_model), "--library", str(LIBRARY), "--json",
                     "--n-boot", "20", "-q", "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)[str(text_model)]
    spectra_keys = {"n_queries", "n_structures", "hit@1", "hit@5", "hit@10", "hit@20", "mrr", "mean_rank", "ci95",
                    "per_structure", "average_ties", "random", "candidates", "n_skipped", "skipped",
                    "kernel_loss", "model", "time_s", "timings", "n_empty_spectra"}
    assert spectra_keys <= set(m)
    assert m["n_queries"] == 30 and m["n_skipped"] == 2 and m["candidates"]["max"] == 50
    # training descriptions: every molecule is ranked first, the stereoisomer pairs (E/Z but-2-ene, L/D-alanine)
    # included, since the default text output kernel uses chirality-aware Morgan counts
    assert m["hit@1"] == 1.0 and m["mean_rank"] == 1.0 and m["average_ties"]["hit@1"] == 1.0
    assert m["random"]["hit@1"] == pytest.approx(1 / 50)


def test_plain_morgan_bits_tie_stereoisomers_with_the_truth(tmp_path):
    """Why the text default is chiral: with plain bits the two stereo pairs tie exactly, counted against the truth."""
    model = tmp_path / "plain"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = invoke(["train", str(PAIRS), "-o", str(model), "--device", "cpu", "-q",
                         "--output-kernel", "gaussian-tanimoto"])
        assert result.exit_code == 0, result.output
        result = invoke(["evaluate", str(PAIRS), "--model", str(model), "--library", str(LIBRARY), "--json",
                         "--n-boot", "20", "-q", "--cache-dir", str(tmp_path / "cache")])
    finally:
        torch.set_num_threads(previous)
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)[str(model)]
    assert m["hit@1"] == pytest.approx(26 / 30)
    assert m["hit@5"] == 1.0 and m["mean_rank"] == pytest.approx((26 + 4 * 2) / 30)
    assert m["average_ties"]["hit@1"] == pytest.approx(28 / 30)


def test_evaluate_text_with_candidate_sets_and_missing_truth(text_model, tmp_path):
    from molpredict.chem.molecules import Molecule

    pairs = read_text_pairs(PAIRS)
    decoys = ["CCCO", "CCCCO", "CC(C)O"]
    sets = {}
    for p in pairs[:10]:
        entries = [[p.molecule.inchikey14, p.molecule.smiles]]
        entries += [[Molecule.from_smiles(s).inchikey14, s] for s in decoys]
        sets[p.molecule.inchikey14] = entries
    path = tmp_path / "sets.json"
    path.write_text(json.dumps(sets))
    result = invoke(["evaluate", str(PAIRS), "--model", str(text_model), "--candidates", str(path), "--json",
                     "--n-boot", "10", "-q", "--no-cache"])
    m = json.loads(result.stdout)[str(text_model)]
    # L- and D-alanine share a first block: the set written last (D) lacks L-alanine, and a hit needs the stereo
    assert m["skipped"] == {"no candidate set for the structure": 20,
                            "true structure (stereo included) not in its candidate set": 1,
                            "unreadable row (smiles: SMILES not parsed by RDKit)": 1,
                            "unreadable row (description: empty description)": 1}
    assert m["n_queries"] == 9 and m["candidates"]["max"] == 4 and m["hit@1"] == 1.0
    # a library lacking some true structures: those queries are skipped and counted
    small = tmp_path / "small.tsv"
    small.write_text("\n".join(LIBRARY.read_text().splitlines()[:11]) + "\n")
    result = invoke(["evaluate", str(PAIRS), "--model", str(text_model), "--library", str(small), "--json",
                     "--n-boot", "10", "-q", "--no-cache"])
    m = json.loads(result.stdout)[str(text_model)]
    assert m["n_queries"] == 10 and m["skipped"]["true structure not in the library"] == 20
    # exactly one of --library / --candidates
    both = CliRunner().invoke(cli, ["evaluate", str(PAIRS), "--model", str(text_model), "--library", str(small),
                                    "--candidates", str(path)])
    assert both.exit_code != 0 and "exactly one of --library and --candidates" in both.output


# -- real data -------------------------------------------------------------------------------------------

def test_chebi20_text_ngram_beats_random(tmp_path):
    """ChEBI-20: 1000 pairs of val.tsv, 100 descriptions of test.tsv ranked against all of molecules.tsv."""
    root = require_shared("chebi20")
    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    with open(root / "val.tsv", encoding="utf-8") as handle:
        train.write_text("".join(line for _, line in zip(range(1001), handle)))
    with open(root / "test.tsv", encoding="utf-8") as handle:
        test.write_text("".join(line for _, line in zip(range(101), handle)))
    result = invoke(["train", str(train), "-o", str(tmp_path / "model"), "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    result = invoke(["evaluate", str(test), "--model", str(tmp_path / "model"), "--library",
                     str(root / "molecules.tsv"), "--json", "--n-boot", "50", "-q", "--no-kernel-loss"])
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)[str(tmp_path / "model")]
    assert m["candidates"]["max"] > 33000
    random_mrr = m["random"]["mrr"]
    assert random_mrr == pytest.approx(float(np.mean([
        sum(1 / r for r in range(1, n + 1)) / n for n in [m["candidates"]["max"]]])), rel=1e-3)
    # measured: MRR 0.018, hit@10 6% (random: MRR 0.0003, hit@10 0.03%)
    assert m["n_queries"] >= 95
    assert m["mrr"] > 20 * random_mrr
    assert m["hit@20"] > 0.02
