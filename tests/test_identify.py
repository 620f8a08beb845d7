"""Identification: candidate selection, adducts, skips, batching, ranking/ties, the coordinates cache, the CLI,
and score-library's resumability. A small ridge model (tests/identification_helpers.py) stands in for the
kernel models, so these tests pin the pipeline, not the engine."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, SMILES, FingerprintRidge, install_fake_model, synthetic_spectra
from molpredict.chem.candidates import CandidateLibrary
from molpredict.cli import cli
from molpredict.identification.candidate_sources import LibrarySource, SetSource
from molpredict.identification.evidence import check_scoring
from molpredict.identification.identify import Identifier, IdentifyOptions, read_formula_hints
from molpredict.io.results import OUTPUT_COLUMNS, output_format
from molpredict.identification.scoring import score_library
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.spectra.cleaning import CleaningPipeline
from molpredict.io import read_spectra, write_mgf
from molpredict.training.pipeline import build_model

FIXTURES = Path(__file__).parent / "fixtures" / "identification"

# Same-formula decoys (positional isomers) and a stereo pair whose coordinates coincide in the test model.
DECOYS = ["CC1Cc2ccc(O)cc2C(=O)O1", "CC(=O)Nc1cccc(O)c1", "O=C(O)/C=C/c1ccc(O)cc1O", "CC(C)Cc1ccc(CC(C)C(=O)O)cc1",
          "C[C@H](N)C(=O)O", "C[C@@H](N)C(=O)O"]


@pytest.fixture
def library():
    smiles = SMILES + DECOYS
    return CandidateLibrary.from_smiles(smiles, names=[f"cand{i}" for i in range(len(smiles))], source="test")


@pytest.fixture
def bundle():
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=3, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.001|0.01|0.1"}).fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(),
                   adducts=["[M+H]+", "[M+Na]+", "[M+NH4]+", "[M]+"])
    return ModelBundle({"positive": sub})


def same_rows(a, b, rel=1e-12):
    """Equal tables up to rounding of the scores (a matrix product and a vector product differ in the last bit;
    stored int8 coordinates with a float32 row scale against computed ones: ``rel=1e-6`` for these fingerprint
    rows, whose non-zero values are all equal)."""
    assert len(a) == len(b)
    numeric = ("score", "confidence", "probability", "spectrum_score", "prior_score", "fragment_score")
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k not in numeric} == {k: v for k, v in y.items() if k not in numeric}
        assert x["score"] == pytest.approx(y["score"], rel=rel, abs=1e-12)
        for key in numeric[1:]:
            assert x[key] == pytest.approx(y[key], rel=max(rel, 1e-9), abs=rel, nan_ok=True)
    return True


def run(bundle, library, spectra, cache_root, **options):
    identifier = Identifier(bundle, LibrarySource(library, IdentifyOptions(**options)), IdentifyOptions(**options),
                            cache_root=cache_root)
    return list(identifier.run(spectra)), identifier


def test_learned_model_ranks_truth_first_among_isomers(bundle, library, tmp_path):
    queries, truths = synthetic_spectra(n_per=2, seed=11)
    rows, ident = run(bundle, library, queries, tmp_path, top_k=50)
    top = {r["query_id"]: r["inchikey"] for r in rows if r["rank"] == 1}
    assert len(top) == len(queries) and ident.skipped == []
    accuracy = np.mean([top[s.id] == m.inchikey for s, m in zip(queries, truths)])
    assert accuracy >= 0.9
    formulas = dict(zip(library.column("inchikey"), library.column("formula")))
    for r in rows:
        # by formula (the queries carry FORMULA): every candidate has the query's formula
        query = next(s for s in queries if s.id == r["query_id"])
        assert formulas[r["inchikey"]] == query.formula
        assert r["adduct"] == "[M+H]+" and r["name"].startswith("cand")


def test_ranking_order_ties_and_confidence(bundle, library, tmp_path):
    """Rows are by score descending; the stereo pair (one InChIKey first block) is one structure, ranked once as its
    first library row, not tied with itself."""
    from molpredict.spectra.record import Spectrum
    alanine = Spectrum("ala", mz=[44.05, 90.055], intensities=[100.0, 30.0], precursor_mz=90.0550, charge=1,
                       ion_mode="positive", adduct="[M+H]+", metadata={"formula": "C3H7NO2"})
    with pytest.warns(UserWarning, match="first block"):
        rows, ident = run(bundle, library, [alanine] * 2, tmp_path, top_k=5)
    assert [r["rank"] for r in rows] == [1, 1]
    assert rows[0]["smiles"] == DECOYS[4] and rows[0]["n_candidates"] == 1 and np.isnan(rows[0]["confidence"])
    assert ident.summary()["candidates_merged"] == 2
    queries, _ = synthetic_spectra(n_per=1, seed=3)
    rows, _ = run(bundle, library, queries, tmp_path, top_k=5)
    for qid in {r["query_id"] for r in rows}:
        group = [r for r in rows if r["query_id"] == qid]
        scores = [r["score"] for r in group]
        assert scores == sorted(scores, reverse=True)
        if len(group) > 1:
            assert group[0]["confidence"] == pytest.approx(scores[0] - scores[1])
            assert group[1]["confidence"] == pytest.approx(scores[1] - scores[0])
        else:
            assert np.isnan(group[0]["confidence"])
        assert all(r["n_candidates"] == len(group) for r in group)


@pytest.mark.parametrize("stored", [False, True])
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_scores_equal_model_score(bundle, library, tmp_path, stored, precision, monkeypatch):
    import molpredict.identification.scoring as scoring

    monkeypatch.setattr(scoring, "SCORING_DTYPE", np.dtype(precision).type)
    queries, _ = synthetic_spectra(n_per=1, seed=4)
    rows, _ = run(bundle, library, queries, tmp_path if stored else False, top_k=50)
    model = bundle.for_mode("positive").model
    clean = CleaningPipeline()
    index = {k: i for i, k in enumerate(library.column("inchikey"))}
    for s in queries:
        group = [r for r in rows if r["query_id"] == s.id]
        expected = model.score([clean(s)], library.molecules([index[r["inchikey"]] for r in group]))[0]
        # stored coordinates are int8 codes with a float32 row scale (see same_rows); the products run in
        # SCORING_DTYPE: float32 keeps 7 digits, float64 the model's own scores
        exact = precision == "float64" and not stored
        np.testing.assert_allclose([r["score"] for r in group], expected, rtol=1e-12 if exact else 1e-6)


class DistanceScored(FingerprintRidge):
    """Scores by negative squared distance: not a dot product, so identify must use score_coordinates."""

    dot_product_scores = False

    def score_coordinates(self, predictions, candidates):
        return -((predictions[:, None, :] - candidates[None, :, :]) ** 2).sum(axis=2)


def test_models_that_are_not_dot_products_score_through_score_coordinates(library, tmp_path):
    spectra, molecules = synthetic_spectra(n_per=3, seed=0)
    model = DistanceScored(lam=0.01).fit(spectra, molecules)
    bundle = ModelBundle({"positive": SubModel(model=model, ion_mode="positive",
                                               cleaning=CleaningPipeline().to_dict(), adducts=["[M+H]+"])})
    queries, _ = synthetic_spectra(n_per=2, seed=6)
    rows, _ = run(bundle, library, queries, False, top_k=50, block_queries=3)
    clean = CleaningPipeline()
    index = {k: i for i, k in enumerate(library.column("inchikey"))}
    for s in queries:
        group = [r for r in rows if r["query_id"] == s.id]
        expected = model.score([clean(s)], library.molecules([index[r["inchikey"]] for r in group]))[0]
        assert np.all(expected <= 0)  # a distance, not the dot product (which is positive here)
        np.testing.assert_allclose([r["score"] for r in group], expected, rtol=1e-10)


def test_block_size_does_not_change_results(bundle, library, tmp_path):
    queries, _ = synthetic_spectra(n_per=2, seed=5)
    big, _ = run(bundle, library, queries, tmp_path / "a", top_k=3)
    small, ident = run(bundle, library, queries, tmp_path / "b", top_k=3, block_queries=1)
    assert same_rows(big, small)
    seen = []
    original = Identifier.candidate_coordinates

    def spy(self, sub, ids, dtype=np.float64):
        seen.append(len(ids))
        return original(self, sub, ids, dtype)

    Identifier.candidate_coordinates = spy
    try:
        bounded, _ = run(bundle, library, queries, tmp_path / "c", top_k=3, max_block_candidates=3)
    finally:
        Identifier.candidate_coordinates = original
    assert same_rows(bounded, big) and max(seen) <= 3 + 2  # flushed once the union reaches the bound


def test_edge_cases_every_spectrum_accounted_for(bundle, library, tmp_path):
    from molpredict.io import SkipReport
    report = SkipReport()
    rows, ident = run(bundle, library, read_spectra(FIXTURES / "edge_cases.mgf", report=report), tmp_path,
                      top_k=10)
    got = {r["query_id"] for r in rows}
    skipped = {s.query_id: s.reason for s in ident.skipped}
    assert got == {"known-adduct", "unknown-adduct-by-mass", "no-adduct-by-mass"}
    assert skipped == {"negative-mode": "no model for ion mode negative in the bundle",
                       "only-precursor": "no peaks after cleaning",
                       "formula-not-in-library": "no candidates in the library (formula C30H20Cl4)"}
    assert len(report) == 1  # the record with a non-numeric peak, reported by the reader
    # no usable adduct: every default adduct is tried; Mellein is found as [M+Na]+
    for qid in ("unknown-adduct-by-mass", "no-adduct-by-mass"):
        mellein = [r for r in rows if r["query_id"] == qid and r["inchikey"] == "KWILGNNWGSNMPA-UHFFFAOYSA-N"]
        assert len(mellein) == 1 and mellein[0]["adduct"] == "[M+Na]+"
    # a known adduct restricts to it
    assert {r["adduct"] for r in rows if r["query_id"] == "known-adduct"} == {"[M+H]+"}


def test_mass_selection_window(bundle, library, tmp_path):
    from molpredict.chem.molecules import precursor_mz
    from molpredict.spectra.record import Spectrum
    mass = 178.062994  # Mellein and its isomer
    peaks = dict(mz=[133.065, 161.06], intensities=[1.0, 2.0], charge=1, ion_mode="positive", adduct="[M+H]+")
    inside = Spectrum("in", precursor_mz=precursor_mz(mass * (1 + 9e-6), "[M+H]+"), **peaks)
    outside = Spectrum("out", precursor_mz=precursor_mz(mass * (1 + 12e-6), "[M+H]+"), **peaks)
    rows, ident = run(bundle, library, [inside, outside], tmp_path, by="mass", ppm=10)
    assert {r["inchikey"][:14] for r in rows} == {"KWILGNNWGSNMPA", "NXEBHIQNMZSFHI"}
    assert [s.query_id for s in ident.skipped] == ["out"]
    rows, _ = run(bundle, library, [outside], tmp_path, by="mass", ppm=20)
    assert len(rows) == 2


def test_formula_hints_and_sources(bundle, library, tmp_path):
    queries, _ = synthetic_spectra(n_per=1, seed=2)
    hints_path = tmp_path / "hints.tsv"
    hints_path.write_text("query_id\tformula\ns1-0\tC9H8O4\n")
    hints = read_formula_hints(hints_path)
    assert hints == {"s1-0": "C9H8O4"}
    hinted = queries[1]
    hinted.metadata.pop("formula", None)  # the hint is the only formula
    rows, _ = run(bundle, library, [hinted], tmp_path, formulas=hints)
    assert {r["formula"] for r in rows} == {"C9H8O4"}
    garbage = queries[0]
    garbage.metadata["formula"] = "N/A"
    rows, ident = run(bundle, library, [garbage], tmp_path)  # falls back to the mass
    assert rows and not ident.skipped and rows[0]["adduct"] == "[M+H]+"
    rows, ident = run(bundle, library, [garbage], tmp_path, by="formula")
    assert ident.skipped[0].reason == "unparsable formula 'N/A'"
    rows, ident = run(bundle, library, queries[:1], tmp_path, sources=["elsewhere"])
    assert rows == [] and "no candidates" in ident.skipped[0].reason
    (tmp_path / "bad.tsv").write_text("s0-0\tC9H8Q4\n")
    from molpredict.errors import InputError
    with pytest.raises(InputError, match="bad.tsv, line 1, field formula: unparsable formula 'C9H8Q4'$"):
        read_formula_hints(tmp_path / "bad.tsv")
    # numbered as lines, blank and comment lines included (QA: "record 6" for line 6)
    (tmp_path / "short.tsv").write_text("query_id\tformula\n\n# hints\ns0-0\tC9H8O4\n\ns0-1 C9H8O4\n")
    with pytest.raises(InputError, match="short.tsv, line 6: expected two tab-separated columns: query_id, "
                                         "formula$"):
        read_formula_hints(tmp_path / "short.tsv")


def test_second_run_does_no_featurisation(bundle, library, tmp_path):
    queries, _ = synthetic_spectra(n_per=1, seed=6)
    FingerprintRidge.calls.clear()
    first, _ = run(bundle, library, queries, tmp_path / "cache")
    assert sum(FingerprintRidge.calls) > 0
    FingerprintRidge.calls.clear()
    path = bundle.save(tmp_path / "bundle")
    reloaded = ModelBundle.load(path)  # a new process would see the same key
    second, _ = run(reloaded, library, queries, tmp_path / "cache")
    assert FingerprintRidge.calls == [] and same_rows(second, first)
    third, _ = run(reloaded, library, queries, False)  # no cache: featurised again
    assert sum(FingerprintRidge.calls) > 0 and same_rows(third, first, rel=1e-6)


def test_score_library_resumes_after_interrupt(bundle, library, tmp_path):
    model = bundle.for_mode("positive").model
    original = model.candidate_coordinates
    calls = []

    def flaky(molecules, fail_after=None):
        if fail_after is not None and len(calls) >= fail_after:
            raise KeyboardInterrupt("simulated Ctrl-C")
        calls.append([m.inchikey for m in molecules])
        return original(molecules)

    model.candidate_coordinates = lambda mols: flaky(mols, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        score_library(bundle, library, cache_root=tmp_path / "resumed", block_size=4)
    done = [k for block in calls for k in block]
    assert len(calls) == 2 and len(done) == 8
    calls.clear()
    model.candidate_coordinates = lambda mols: flaky(mols)
    result = score_library(bundle, library, cache_root=tmp_path / "resumed", block_size=4)
    n = len(library)
    assert result["positive"]["n_computed"] == n - 8
    assert result["positive"]["n_blocks_computed"] == len(calls) == -(-(n - 8) // 4)
    assert not set(done) & {k for block in calls for k in block}
    again = score_library(bundle, library, cache_root=tmp_path / "resumed", block_size=4)
    assert again["positive"]["n_computed"] == 0
    model.candidate_coordinates = original
    score_library(bundle, library, cache_root=tmp_path / "oneshot", block_size=1000)
    from molpredict.identification.coordinates_cache import CoordinatesCache, smiles_keys, store_key
    a = CoordinatesCache(tmp_path / "resumed", store_key(model))
    b = CoordinatesCache(tmp_path / "oneshot", store_key(model))
    keys = list(smiles_keys(library.column("smiles")))
    np.testing.assert_array_equal(a.read(a.rows(keys)), b.read(b.rows(keys)))


def test_output_format_choice():
    assert output_format(None, None) == "tsv"
    assert output_format("x.json", None) == "json"
    assert output_format("x.CSV", None) == "csv"
    assert output_format("x.json", "tsv") == "tsv"
    from molpredict.errors import InputError
    with pytest.raises(InputError, match="--format"):
        output_format("x.xlsx", None)


# -- CLI ---------------------------------------------------------------------------------------------------

@pytest.fixture
def cli_setup(bundle, library, tmp_path, monkeypatch):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    model = bundle.save(tmp_path / "model")
    lib = tmp_path / "library.tsv"
    library.to_tsv(lib)
    queries, _ = synthetic_spectra(n_per=1, seed=8)
    mgf = tmp_path / "queries.mgf"
    write_mgf(queries, mgf)
    return model, lib, mgf, queries


def test_cli_identify_formats(cli_setup, tmp_path):
    model, lib, mgf, queries = cli_setup
    runner = CliRunner()
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib), "--top-k", "2",
                                 "-o", str(tmp_path / "out.tsv")])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(open(tmp_path / "out.tsv"), delimiter="\t"))
    assert tuple(rows[0]) == OUTPUT_COLUMNS
    assert {r["query_id"] for r in rows} == {s.id for s in queries}
    assert f"{len(queries)} spectra: {len(queries)} identified, 0 skipped" in result.stderr
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib), "--top-k", "2",
                                 "-o", str(tmp_path / "out.json")])
    data = json.loads((tmp_path / "out.json").read_text())
    assert [(r["query_id"], r["rank"], r["inchikey"]) for r in data] == \
        [(r["query_id"], int(r["rank"]), r["inchikey"]) for r in rows]
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib), "--top-k", "2",
                                 "--format", "csv", "-q"])
    assert result.exit_code == 0 and result.stderr == ""
    assert list(csv.DictReader(io.StringIO(result.stdout)))[0]["query_id"] == rows[0]["query_id"]


def test_cli_identify_skipped_report(cli_setup, tmp_path):
    model, lib, _, _ = cli_setup
    result = CliRunner().invoke(cli, ["identify", str(FIXTURES / "edge_cases.mgf"), "--model", str(model),
                                      "--library", str(lib), "--skipped", str(tmp_path / "skipped.tsv")])
    assert result.exit_code == 0, result.output
    skipped = list(csv.DictReader(open(tmp_path / "skipped.tsv"), delimiter="\t"))
    assert len(skipped) == 4
    # the unreadable record is named by its TITLE, read before its bad peak line: it joins with the output
    assert {s["query_id"] for s in skipped} == {"unreadable-peaks", "negative-mode", "only-precursor",
                                                "formula-not-in-library"}
    unreadable = next(s for s in skipped if s["query_id"] == "unreadable-peaks")
    assert unreadable["record"] == "7" and "unreadable record" in unreadable["reason"]
    assert "7 spectra: 3 identified, 4 skipped" in result.stderr
    assert "no model for ion mode negative" in result.stderr
    # nothing identified at all (QA: exit 0 and an empty table read as success in a batch job): exit 2, the
    # output and the skipped list still written
    from molpredict.io import read_spectra, write_mgf
    negative = [s for s in read_spectra(FIXTURES / "edge_cases.mgf") if s.ion_mode == "negative"]
    write_mgf(negative, tmp_path / "negative.mgf")
    result = CliRunner().invoke(cli, ["identify", str(tmp_path / "negative.mgf"), "--model", str(model),
                                      "--library", str(lib), "-o", str(tmp_path / "none.tsv"),
                                      "--skipped", str(tmp_path / "none_skipped.tsv")])
    assert result.exit_code == 2 and "no spectrum identified: all 1 skipped (most often: no model for ion " \
        "mode negative" in result.stderr, result.output
    assert (tmp_path / "none.tsv").is_file() and len(list(open(tmp_path / "none_skipped.tsv"))) == 2


def test_cli_identify_bad_inputs(cli_setup, tmp_path, monkeypatch):
    model, lib, mgf, _ = cli_setup
    runner = CliRunner()
    png = tmp_path / "image.mgf"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    result = runner.invoke(cli, ["identify", str(png), "--model", str(model), "--library", str(lib)])
    assert result.exit_code == 2 and "binary" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = runner.invoke(cli, ["identify", str(tmp_path / "missing.mgf"), "--model", str(model)])
    assert result.exit_code == 2 and "no such file" in result.stderr
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(tmp_path / "nope"), "--library", str(lib)])
    assert result.exit_code == 4 and "model bundle not found" in result.stderr
    # no --model and no default bundle under MOLPREDICT_HOME
    result = runner.invoke(cli, ["identify", str(mgf), "--library", str(lib)])
    assert result.exit_code == 4 and "no default model" in result.stderr and "molpredict train" in result.stderr
    # no --library and no configured library (conftest: no MOLPREDICT_LIBRARY, no config file)
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model)])
    assert result.exit_code == 2 and "--library" in result.stderr and "molpredict config set library" in result.stderr
    (model / "positive" / "metadata.json").write_text("{ truncated")
    result = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib)])
    assert result.exit_code == 4 and "corrupted or truncated" in result.stderr


def test_cli_default_bundle_location(cli_setup, tmp_path):
    model, lib, mgf, _ = cli_setup
    bundle = ModelBundle.load(model)
    bundle.save(tmp_path / "home" / "models" / "default")
    result = CliRunner().invoke(cli, ["identify", str(mgf), "--library", str(lib)])
    assert result.exit_code == 0, result.output
    assert str(tmp_path / "home" / "models" / "default") in result.stderr


def test_cli_score_library(cli_setup, tmp_path):
    model, lib, _, _ = cli_setup
    runner = CliRunner()
    args = ["score-library", str(lib), "--model", str(model), "--cache-dir", str(tmp_path / "cc"),
            "--block-size", "5"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    n = len(CandidateLibrary.from_tsv(lib))
    assert f"computed the coordinates of {n} of {n} library rows" in result.stderr
    result = runner.invoke(cli, args)
    assert f"computed the coordinates of 0 of {n} library rows" in result.stderr


def test_cli_cache_dir_url_reaches_fsspec(cli_setup, tmp_path, monkeypatch):
    """``--cache-dir s3://bucket/coords`` is an fsspec URL (fsspec's in-memory file system stands in for s3 here):
    the coordinates go there and a second run reads them back, and no local folder named after the URL appears
    (a ``Path`` folded ``memory://x`` into ``memory:/x``)."""
    import uuid

    import fsspec

    model, lib, mgf, _ = cli_setup
    monkeypatch.chdir(tmp_path)
    url = f"memory://molpredict-cli-{uuid.uuid4().hex}"
    runner = CliRunner()
    args = ["score-library", str(lib), "--model", str(model), "--cache-dir", url]
    result = runner.invoke(cli, args)
    n = len(CandidateLibrary.from_tsv(lib))
    assert result.exit_code == 0 and f"computed the coordinates of {n} of {n} library rows" in result.stderr, result.output
    assert fsspec.filesystem("memory").ls(url) and not (tmp_path / "memory:").exists()
    assert f"computed the coordinates of 0 of {n} library rows" in runner.invoke(cli, args).stderr
    identified = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib),
                                     "--cache-dir", url, "-q"])
    local = runner.invoke(cli, ["identify", str(mgf), "--model", str(model), "--library", str(lib), "--cache-dir",
                                str(tmp_path / "local"), "-q"])  # the store keeps int8 rows: compare store to store
    assert identified.exit_code == 0 and identified.stdout == local.stdout
    assert not (tmp_path / "memory:").exists()


def test_cli_identify_reads_stdin(cli_setup):
    model, lib, mgf, queries = cli_setup
    result = CliRunner().invoke(cli, ["identify", "--model", str(model), "--library", str(lib), "--top-k", "1", "-q"],
                                input=mgf.read_text())
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].split("\t") == list(OUTPUT_COLUMNS) and len(lines) == 1 + len(queries)


def _with_fusion(bundle, reference_smiles, prior_weight=0.7):
    """The fake-model bundle with a structure prior fitted on ``reference_smiles`` and a fusion + calibration."""
    from molpredict.identification.calibration import Calibrator
    from molpredict.identification.evidence import WITH_PRIOR, WITHOUT_PRIOR, ScoringVariant
    from molpredict.identification.fusion import ScoreFusion
    from molpredict.chem.molecules import Molecule

    sub = bundle.for_mode("positive")
    reference = [Molecule.from_smiles(s) for s in reference_smiles]
    sub.prior = build_model("prior", {}).fit(reference, reference)
    calibrator = Calibrator(coef=[0.8, 0.3, -0.1], intercept=0.2)
    sub.scoring = {
        WITH_PRIOR: ScoringVariant(ScoreFusion({"spectrum": 1.0, "prior": prior_weight}, 1.3), calibrator).to_dict(),
        WITHOUT_PRIOR: ScoringVariant(ScoreFusion({"spectrum": 1.0}, 0.9), calibrator).to_dict()}
    return bundle


def test_fused_scores_are_the_weighted_z_scores_and_survive_a_bundle_round_trip(bundle, library, tmp_path):
    """The fused ranking equals a hand computation from the rows' own terms (z-scored within the query's
    candidates), the probability equals the calibrator on the hand-computed ranking features, and a saved and
    reloaded bundle (prior sub-model, fusion, calibration) gives identical rows; --prior off drops the prior."""
    from molpredict.identification.calibration import ranking_features
    from molpredict.chem.molecules import Molecule

    fused = _with_fusion(bundle, DECOYS[:3])
    queries, _ = synthetic_spectra(n_per=2, seed=12)
    rows, _ = run(fused, library, queries, tmp_path / "a", top_k=50)
    by_query: dict[str, list] = {}
    for r in rows:
        by_query.setdefault(r["query_id"], []).append(r)
    prior = fused.for_mode("positive").prior
    for query_rows in by_query.values():
        spectrum = np.array([r["spectrum_score"] for r in query_rows])
        prior_scores = np.array([r["prior_score"] for r in query_rows])
        # the prior term is the prior model's own score of the candidate
        expected_prior = prior.candidate_scores([Molecule.from_smiles(r["smiles"]) for r in query_rows])
        np.testing.assert_allclose(prior_scores, expected_prior, rtol=1e-6)
        assert len(query_rows) == query_rows[0]["n_candidates"]  # top_k covers the whole set: z-scores by hand
        z = lambda v: (v - v.mean()) / v.std() if v.std() > 0 else np.zeros_like(v)  # noqa: E731
        expected = z(spectrum) + 0.7 * z(prior_scores)
        np.testing.assert_allclose([r["score"] for r in query_rows], expected, atol=1e-9)
        assert [r["rank"] for r in query_rows] == sorted(r["rank"] for r in query_rows)
        assert all(np.diff([r["score"] for r in query_rows]) <= 1e-12)
        features = ranking_features(expected, 1.3)
        p = 1 / (1 + np.exp(-(features @ np.array([0.8, 0.3, -0.1]) + 0.2)))
        assert query_rows[0]["probability"] == pytest.approx(p, rel=1e-9)
        assert all(np.isnan(r["probability"]) for r in query_rows[1:])
    fused.save(tmp_path / "bundle")
    again = ModelBundle.load(tmp_path / "bundle")
    assert again.for_mode("positive").scoring == fused.for_mode("positive").scoring
    rows_again, _ = run(again, library, queries, tmp_path / "b", top_k=50)
    assert same_rows(rows, rows_again, rel=1e-6)
    off, _ = run(again, library, queries, tmp_path / "c", top_k=50, prior=False)
    assert all(np.isnan(r["prior_score"]) for r in off)
    # without the prior the ranking follows the spectrum score alone
    off_by_query: dict[str, list] = {}
    for r in off:
        off_by_query.setdefault(r["query_id"], []).append(r)
    for query_rows in off_by_query.values():
        spectrum = [r["spectrum_score"] for r in query_rows]
        assert spectrum == sorted(spectrum, reverse=True)


@pytest.mark.parametrize("method", ["platt", "beta", "isotonic"])
def test_each_calibrator_kind_reads_the_rank1_features_and_survives_a_bundle_round_trip(bundle, library, tmp_path,
                                                                                      method):
    """A calibrator on runner-up and rank-1 features (is rank 1 a reference structure of the prior, its prior
    score) and the set's kind (do its candidates share one formula): identify's probability equals it on features computed by hand (the prior's top similarity of rank 1
    from its kernel), and a saved and reloaded bundle gives identical probabilities."""
    from molpredict.chem.molecules import Molecule
    from molpredict.identification.calibration import Calibrator, ranking_features
    from molpredict.identification.evidence import WITH_PRIOR, ScoringVariant
    from molpredict.identification.fusion import ScoreFusion

    fused = _with_fusion(bundle, DECOYS[:3] + SMILES[:3])  # some queries' rank 1 is a reference structure
    names = ["top1_logit", "margin", "log_n_candidates", "margin3", "entropy10", "rank1_known", "rank1_prior",
             "one_formula"]
    calibrator = Calibrator(coef=[0.5, 0.2, -0.1, 0.1, -0.3, -2.0, 1.5, 0.8], intercept=0.1, features=names,
                            method=method, beta=[1.2, 0.7, -0.2], isotonic_x=[-2.0, 0.0, 1.0, 3.0],
                            isotonic_y=[0.05, 0.2, 0.6, 0.9], clip=[0.001, 0.999])
    sub = fused.for_mode("positive")
    sub.scoring[WITH_PRIOR] = ScoringVariant(ScoreFusion({"spectrum": 1.0, "prior": 0.7}, 1.3), calibrator).to_dict()
    queries, _ = synthetic_spectra(n_per=2, seed=13)
    rows, _ = run(fused, library, queries, tmp_path / "a", top_k=50)
    # by formula (the queries carry FORMULA) and by a wide mass window (several formulas compete)
    by_mass, _ = run(fused, library, queries, tmp_path / "m", top_k=10_000, by="mass", ppm=3e5)
    by_query: dict[tuple, list] = {}
    for kind, kind_rows in (("formula", rows), ("mass", by_mass)):
        for r in kind_rows:
            by_query.setdefault((kind, r["query_id"]), []).append(r)
    seen_known, seen_kinds = set(), set()
    for query_rows in by_query.values():
        assert len(query_rows) == query_rows[0]["n_candidates"]
        scores = np.array([r["score"] for r in query_rows])
        top = query_rows[0]
        similarity = sub.prior.kernel_.transform([Molecule.from_smiles(top["smiles"])]).max()
        known = float(np.isclose(similarity, 1.0))
        seen_known.add(known)
        one_formula = float(len({r["formula"] for r in query_rows}) == 1)  # the set's kind, from its rows
        seen_kinds.add(one_formula)
        x = ranking_features(scores, 1.3, names, {"rank1_known": known, "rank1_prior": top["prior_score"],
                                                  "one_formula": one_formula})
        assert top["probability"] == pytest.approx(float(calibrator.predict(x)), rel=1e-6)
    assert seen_known == {0.0, 1.0}
    assert seen_kinds == {0.0, 1.0}
    fused.save(tmp_path / "bundle")
    again = ModelBundle.load(tmp_path / "bundle")
    assert again.for_mode("positive").scoring == sub.scoring
    rows_again, _ = run(again, library, queries, tmp_path / "b", top_k=50)
    assert same_rows(rows, rows_again, rel=1e-9)


def test_a_bundle_with_unreadable_scoring_is_refused(bundle, tmp_path):
    from molpredict.errors import ModelFileError

    _with_fusion(bundle, DECOYS[:3]).save(tmp_path / "bundle")
    meta_path = tmp_path / "bundle" / "positive" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["scoring"]["with_prior"]["fusion"]["temperature"] = -1
    meta_path.write_text(json.dumps(meta))
    loaded = ModelBundle.load(tmp_path / "bundle")
    with pytest.raises(ModelFileError, match=r"metadata.json: field scoring.with_prior"):
        check_scoring(loaded.models["positive"])
    with pytest.raises(ModelFileError, match="scoring.with_prior"):
        Identifier(loaded, SetSource({"Q": [("LFQSCWFLJHTTHZ", "CCO")]}))
    meta["scoring"]["with_prior"]["fusion"]["temperature"] = 1.0
    meta["prior"]["directory"] = "../elsewhere"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ModelFileError, match="prior.directory"):
        ModelBundle.load(tmp_path / "bundle")


def test_training_fits_the_fusion_with_fragments_on_validation_sets(bundle, library):
    """fit_submodel_scoring with the fragment scorer: the first pass's terms are computed for every validation
    candidate and the fragment score for the candidates a second pass would re-rank; the fusion, the second-pass
    choice and the calibration are stored per variant; and a fused identification with a fragment weight then
    reports the fragment score, equal to the scorer's own score of each candidate."""
    from molpredict.chem.fragments import FragmentScorer
    from molpredict.training.ranking_validation import fit_submodel_scoring
    from molpredict.chem.molecules import Molecule

    sub = _with_fusion(bundle, DECOYS[:3]).for_mode("positive")
    sub.scoring = None
    sub.fragments = FragmentScorer(max_depth=1).get_params()
    val, molecules = synthetic_spectra(n_per=2, seed=21)
    sets = {}
    for m in molecules:
        same = [Molecule.from_smiles(s) for s in SMILES + DECOYS]
        sets[m.inchikey14] = [(c.inchikey14, c.smiles) for c in same if c.formula == m.formula]
    report = fit_submodel_scoring(sub, val, [sets, sets], metric="mrr", seed=0, max_structures=3)
    assert set(sub.scoring) == {"with_prior", "without_prior"}
    # the fragment score belongs to the second pass: the first pass weighs the other terms only
    assert set(sub.scoring["with_prior"]["fusion"]["weights"]) == {"spectrum", "prior"}
    assert set(sub.scoring["without_prior"]["fusion"]["weights"]) == {"spectrum"}
    for variant, fitted in sub.scoring.items():
        choice = report[variant]["rerank_choice"]
        assert {"first_pass", "k=16", "k=32", "chosen"} <= set(choice)
        assert ("rerank" in fitted["fusion"]) == (choice["chosen"] is not None)
        if choice["chosen"] is not None:
            assert fitted["fusion"]["rerank"]["k"] == choice["chosen"]
            assert fitted["fusion"]["rerank"]["ranker"]["terms"] == ["first_pass", "fragments"]
        fitted["fusion"].pop("rerank", None)  # below: the fragment score as a first-pass weight
    # max_structures: only the spectra of three structures were used
    assert report["with_prior"]["n_queries"] == 2 * 3 * 2  # two collections x three structures x two spectra
    # identification with a fragment weight: the rows carry the scorer's own score of each candidate. The
    # queries' peaks are protonated fragment ions of their structures, so the scores are not all zero.
    from molpredict.spectra.record import Spectrum
    for variant in sub.scoring.values():
        variant["fusion"]["weights"]["fragments"] = 0.5
    scorer = FragmentScorer(**sub.fragments)
    queries = []
    for j, smiles in enumerate(SMILES[:4]):
        mol = Molecule.from_smiles(smiles)
        ions = np.unique(np.round(scorer.fragments(mol).masses[1:] + 1.007276, 4))[:12]
        queries.append(Spectrum(id=f"q{j}", mz=ions, intensities=np.linspace(10, 100, len(ions)),
                                precursor_mz=mol.monoisotopic_mass + 1.007276, charge=1, ion_mode="positive",
                                adduct="[M+H]+", metadata={"formula": mol.formula}))
    rows, _ = run(bundle, library, queries, False, top_k=50)
    cleaned = {s.id: CleaningPipeline()(s) for s in queries}
    scores = []
    for r in rows:
        expected = scorer.score(cleaned[r["query_id"]], [Molecule.from_smiles(r["smiles"])], "[M+H]+")[0]
        assert r["fragment_score"] == pytest.approx(expected)
        scores.append(expected)
    assert max(scores) > 0.1  # explained intensity, discounted by the broken bonds (depth_penalty)


def test_identification_fragments_only_the_top_k_and_ranks_them_by_the_second_pass(bundle, library, tmp_path):
    """A bundle whose fusion re-ranks its top 2 with the fragment score: the rows carry a fragment score for
    exactly the first pass's top 2 of each query (NaN elsewhere), rank those two by the second pass's ranker, the
    rest below in first-pass order; the bundle round trip gives the same rows."""
    import math

    from molpredict.chem.fragments import FragmentScorer
    from molpredict.identification.fusion import FIRST_PASS, LearntRanker, Rerank, ScoreFusion, top_k_flat

    fused = _with_fusion(bundle, DECOYS[:3])
    sub = fused.for_mode("positive")
    sub.fragments = FragmentScorer(max_depth=1).get_params()
    ranker = LearntRanker((FIRST_PASS, "fragments"), (), (), (), False, np.array([0.5, 2.0]))
    for variant in sub.scoring.values():
        variant["fusion"]["rerank"] = Rerank(2, ranker, spacing=1.0).to_dict()
    queries, _ = synthetic_spectra(n_per=2, seed=12)
    rows, _ = run(fused, library, queries, tmp_path / "a", top_k=50)
    scorer = FragmentScorer(**sub.fragments)
    cleaned = {s.id: CleaningPipeline()(s) for s in queries}
    first_fusion = ScoreFusion.from_dict({k: v for k, v in sub.scoring["with_prior"]["fusion"].items()
                                          if k != "rerank"})
    checked = 0
    by_query: dict[str, list] = {}
    for r in rows:
        by_query.setdefault(r["query_id"], []).append(r)
    for qid, group in by_query.items():
        terms = {"spectrum": np.array([r["spectrum_score"] for r in group]),
                 "prior": np.array([r["prior_score"] for r in group])}
        first = first_fusion.combine(terms)
        top = top_k_flat(first, np.array([0, len(group)]), 2)[0]
        has_fragment = np.array([not math.isnan(r["fragment_score"]) for r in group])
        assert set(np.flatnonzero(has_fragment)) == set(top)
        for j in top:
            assert group[j]["fragment_score"] == pytest.approx(
                scorer.score(cleaned[qid], [group[j]["smiles"]], group[j]["adduct"])[0])
        # the re-ranked two lead, ordered by the second pass (rows come in rank order)
        assert sorted(group[j]["rank"] for j in top) == list(range(1, min(2, len(group)) + 1))
        if len(group) > 2:
            second = ranker.score_flat({FIRST_PASS: first[top], "fragments": np.array(
                [group[j]["fragment_score"] for j in top])}, np.array([0, 2]))
            assert [group[j]["rank"] for j in top] == [1, 2] if second[0] >= second[1] else [2, 1]
            # the others follow in first-pass order
            rest = [j for j in np.argsort(-first, kind="stable") if j not in set(top)]
            assert [group[j]["rank"] for j in rest] == list(range(3, len(group) + 1))
            checked += 1
    assert checked >= 2
    again, _ = run(ModelBundle.load(fused.save(tmp_path / "bundle")), library, queries, tmp_path / "b", top_k=50)
    assert [(r["query_id"], r["smiles"], r["rank"]) for r in again] == \
        [(r["query_id"], r["smiles"], r["rank"]) for r in rows]


def test_one_pass_serves_both_variants_second_passes(bundle, library, tmp_path):
    """With ``every_variant`` (what evaluation's ``without_prior`` view uses), the fragment score is computed for
    the union of both variants' first-pass top k (k 2 with the prior, 3 without), NaN elsewhere, and the ranking
    the without-prior fusion makes of those terms equals a ``--prior off`` run's."""
    from molpredict.chem.fragments import FragmentScorer
    from molpredict.identification.fusion import FIRST_PASS, LearntRanker, Rerank, ScoreFusion, top_k_flat

    fused = _with_fusion(bundle, DECOYS[:3])
    sub = fused.for_mode("positive")
    sub.fragments = FragmentScorer(max_depth=1).get_params()
    for k, variant in ((2, "with_prior"), (3, "without_prior")):
        ranker = LearntRanker((FIRST_PASS, "fragments"), (), (), (), False, np.array([0.4, 1.5]))
        sub.scoring[variant]["fusion"]["rerank"] = Rerank(k, ranker, spacing=1.0).to_dict()
    queries, _ = synthetic_spectra(n_per=2, seed=13)
    # a wide mass window: sets of several candidates (by formula this library's are of 1-3)
    options = IdentifyOptions(top_k=50, by="mass", ppm=5e5)
    both = Identifier(fused, LibrarySource(library, options), options, cache_root=False)
    both.evidence.every_variant = True
    off_options = IdentifyOptions(top_k=50, by="mass", ppm=5e5, prior=False)
    off = Identifier(fused, LibrarySource(library, off_options), off_options, cache_root=False)
    with_first = ScoreFusion.from_dict({k: v for k, v in sub.scoring["with_prior"]["fusion"].items() if k != "rerank"})
    without = ScoreFusion.from_dict(sub.scoring["without_prior"]["fusion"])
    prepared = [q for q in (both.prepare(i, s) for i, s in enumerate(queries)) if q is not None]
    checked = 0
    for (query, scores), (_, alone) in zip(both.fused(prepared), off.fused(
            [q for q in (off.prepare(i, s) for i, s in enumerate(queries)) if q is not None])):
        n = len(query.ids)
        terms = scores.terms
        one = np.array([0, n])
        expected = set(top_k_flat(with_first.combine(terms), one, 2)[0]) | set(
            top_k_flat(without.first_pass(terms, one), one, 3)[0])
        assert set(np.flatnonzero(~np.isnan(terms["fragments"]))) == expected
        from_one_pass = without.combine({t: v for t, v in terms.items() if t != "prior"})
        np.testing.assert_array_equal(np.argsort(-from_one_pass, kind="stable"),
                                      np.argsort(-alone.score, kind="stable"))
        checked += n > 3
    assert checked >= 2


@pytest.mark.parametrize("needs", [False, True])
def test_a_block_is_fused_as_its_queries_are_one_at_a_time(bundle, library, needs):
    """``Evidence.fuse_block`` (one flat fusion and calibration over a block's candidate sets, what identification
    runs) gives every query exactly what ``Evidence.fuse`` gives it alone: a first pass, a learnt second pass on
    its top 2, the set's kind as context, a calibrator with and without the rank-1 features; the second pass's
    candidates, picked for the whole block at once, are each query's own first-pass top 2."""
    from molpredict.chem.fragments import FragmentScorer
    from molpredict.identification.calibration import Calibrator
    from molpredict.identification.evidence import WITH_PRIOR, ScoringVariant
    from molpredict.identification.fusion import FIRST_PASS, LearntRanker, Rerank, ScoreFusion

    fused = _with_fusion(bundle, DECOYS[:3])
    sub = fused.for_mode("positive")
    sub.fragments = FragmentScorer(max_depth=1).get_params()
    ranker = LearntRanker((FIRST_PASS, "fragments"), (), (), (), False, np.array([0.4, 1.5]))
    fusion = ScoreFusion({"spectrum": 1.0, "prior": 0.6}, 1.1, rerank=Rerank(2, ranker, spacing=1.0))
    calibrator = (Calibrator(coef=[0.8, 0.3, -0.1, 0.5, 0.2, -0.3], intercept=0.1,
                             features=["top1_logit", "margin", "log_n_candidates", "rank1_known", "rank1_prior",
                                       "one_formula"])
                  if needs else Calibrator(coef=[0.8, 0.3, -0.1], intercept=0.2))
    sub.scoring[WITH_PRIOR] = ScoringVariant(fusion, calibrator).to_dict()
    queries, _ = synthetic_spectra(n_per=3, seed=21)
    for by, ppm in (("mass", 5e5), ("formula", 10.0)):
        options = IdentifyOptions(top_k=50, by=by, ppm=ppm)
        identifier = Identifier(fused, LibrarySource(library, options), options, cache_root=False)
        prepared = [q for q in (identifier.prepare(i, s) for i, s in enumerate(queries)) if q is not None]
        raw = [scores for _, scores in identifier.scored(prepared)]
        evidence = identifier.evidence
        terms = evidence.terms(prepared, raw, identifier.timings)
        evidence._second_pass_terms(prepared, terms, identifier.timings)
        assert any(len(q.ids) > 2 for q in prepared) and "fragments" in terms[0]
        first = [{k: v for k, v in t.items() if k != "fragments"} for t in terms]
        variants = [evidence.variant(prepared[0].sub)]
        picked = evidence._rerank_candidates(prepared, first, variants)
        for q, t, chosen in zip(prepared, first, picked):
            context = {"formula_known": 0.0 if q.window else 1.0}
            np.testing.assert_array_equal(chosen, np.unique(variants[0].fusion.rerank_candidates(t, context)))
        block = evidence.fuse_block(prepared, terms)
        for q, t, together in zip(prepared, terms, block):
            alone = evidence.fuse(q, t)
            np.testing.assert_array_equal(together.score, alone.score)
            # the calibrator's linear map is one product over the block: equal to rounding
            assert together.probability == pytest.approx(alone.probability, rel=1e-12) and 0 < alone.probability < 1
            assert set(together.terms) == set(alone.terms)


class FormulaReading(FingerprintRidge):
    """Its prediction depends on the spectrum's FORMULA and adduct (a stand-in for the formula-annotation kernel)."""

    reads_formula = True

    def predict_coordinates(self, inputs):
        base = super().predict_coordinates(inputs)
        shift = np.zeros_like(base)
        for row, spectrum in enumerate(inputs):
            if spectrum.formula:
                key = f"{spectrum.formula}|{spectrum.adduct}"
                shift[row] = np.random.default_rng(sum(map(ord, key))).normal(size=base.shape[1]) * 0.3
        return base + shift


@pytest.mark.parametrize("per_candidate", [True, False])
def test_a_spectrum_without_a_formula_is_encoded_once_per_candidate_formula(library, per_candidate):
    """By mass, a spectrum without FORMULA scored by a model that reads formulas: each candidate's score is the
    model's score of the spectrum given that candidate's formula (and the adduct it was matched with); with
    ``formula_per_candidate`` off, or with a FORMULA, the spectrum is encoded once as it is."""
    import dataclasses

    spectra, molecules = synthetic_spectra(n_per=3, seed=0)
    model = FormulaReading(lam=0.01).fit(spectra, molecules)
    bundle = ModelBundle({"positive": SubModel(model=model, ion_mode="positive",
                                               cleaning=CleaningPipeline().to_dict(), adducts=["[M+H]+"])})
    labelled, _ = synthetic_spectra(n_per=1, seed=8)
    queries = [dataclasses.replace(q, metadata={k: v for k, v in q.metadata.items() if k != "formula"})
               for q in labelled]
    assert all(q.formula for q in labelled) and not any(q.formula for q in queries)
    options = IdentifyOptions(top_k=50, by="mass", ppm=5e5, formula_per_candidate=per_candidate)
    identifier = Identifier(bundle, LibrarySource(library, options), options, cache_root=False)
    rows = list(identifier.run(queries))
    clean = CleaningPipeline()
    index = {k: i for i, k in enumerate(library.column("inchikey"))}
    formulas = library.column("formula")
    several = 0
    for s in queries:
        group = [r for r in rows if r["query_id"] == s.id]
        cands = library.molecules([index[r["inchikey"]] for r in group])
        plain = model.score([clean(s)], cands)[0]
        if per_candidate:
            expected = [model.score([dataclasses.replace(clean(s), metadata={**s.metadata,
                                                                                 "formula": formulas[index[r["inchikey"]]]},
                                                         adduct=r["adduct"])], [c])[0, 0] for r, c in zip(group, cands)]
            several += len({r["formula"] for r in group}) > 1 and not np.allclose(expected, plain, rtol=1e-3)
        else:
            expected = plain
        np.testing.assert_allclose([r["spectrum_score"] for r in group], expected, rtol=1e-5, atol=1e-6)
    assert not per_candidate or several >= 3
    # a FORMULA given: one encoding, as before
    given = labelled[0]
    rows = list(Identifier(bundle, LibrarySource(library, options), options, cache_root=False).run([given]))
    cands = library.molecules([index[r["inchikey"]] for r in rows])
    np.testing.assert_allclose([r["spectrum_score"] for r in rows], model.score([clean(given)], cands)[0],
                               rtol=1e-5, atol=1e-6)


def test_the_default_input_kernel_reads_formulas():
    from molpredict.registry import create

    spectra, _ = synthetic_spectra(n_per=1, seed=0)
    mkl = create("input_kernel", "mkl:kernels=ppk-losses+formula-annotation,weights=uniform").fit(spectra)
    assert mkl.reads_formula and create("input_kernel", "formula-annotation").reads_formula
    assert not create("input_kernel", "ppk-losses").fit(spectra).reads_formula
    assert not create("input_kernel", "mkl:kernels=ppk-losses+cosine,weights=uniform").fit(spectra).reads_formula


def test_a_set_source_parses_each_candidates_formula_once(monkeypatch):
    """``CandidateSource.formulas`` from parsed structures: each id parsed once however many queries ask (the
    spectra of one structure share its set), None for a structure RDKit cannot parse."""
    source = SetSource({"QQQQ": [("AAAA", "CCO"), ("BBBB", "C1CC"), ("CCCC", "c1ccccc1")]})
    ids = source.set_ids("QQQQ")
    parsed = []
    original = source.molecules
    monkeypatch.setattr(source, "molecules", lambda some: parsed.append(len(some)) or original(some))
    assert list(source.formulas(ids)) == ["C2H6O", None, "C6H6"]
    assert list(source.formulas(ids[::-1])) == ["C6H6", None, "C2H6O"]
    assert parsed == [3]


def test_a_block_reads_its_candidates_columns_once_and_ranks_as_without_prefetching(bundle, library, tmp_path,
                                                                                   monkeypatch):
    """identify_block prefetches the block's candidate rows (one take per column); ranking then reads no row from
    the table, and the output equals that of a source that never prefetches."""
    queries, _ = synthetic_spectra(n_per=2, seed=5)
    taken = []
    original_take = CandidateLibrary.take

    def counting_take(self, name, indices):
        taken.append((name, len(indices)))
        return original_take(self, name, indices)

    monkeypatch.setattr(CandidateLibrary, "take", counting_take)
    rows, _ = run(bundle, library, queries, tmp_path / "a", top_k=4)
    # one block: one take per column the library has (the cache keys too come from it), nothing per query
    assert taken == [("inchikey", 15), ("inchikey14", 15), ("smiles", 15), ("formula", 15), ("name", 15)]
    monkeypatch.setattr(LibrarySource, "prefetch", lambda self, ids: None)
    taken.clear()
    plain, _ = run(bundle, library, queries, tmp_path / "b", top_k=4)
    assert len(taken) >= 3 * len(queries)  # without it, several takes per query
    assert same_rows(rows, plain, rel=0)

    source = LibrarySource(library, IdentifyOptions())
    monkeypatch.undo()
    source.prefetch(np.array([3, 1, 3, 0]))
    for ids in (np.array([1, 0, 3, 3]), np.array([2, 1]), np.array([], dtype=np.int64)):  # 2 was not prefetched
        assert list(source.tie_keys(ids)) == list(library.take("inchikey", ids))
        fields = source.fields(ids)
        for name in ("smiles", "inchikey", "formula", "name"):
            assert list(fields[name]) == list(library.take(name, ids))
        assert list(fields["id"]) == [None] * len(ids)  # the library has no id column


@pytest.mark.parametrize("cached", [True, False])
def test_candidate_coordinates_come_in_the_order_asked_with_repeats(bundle, library, tmp_path, cached):
    """CandidateCoordinates answers ids in any order, repeats included (score_queries asks for each distinct
    candidate list of a block in turn): row for row what the model computes, each distinct id computed once."""
    from collections import Counter

    from molpredict.identification.scoring import CandidateCoordinates

    model = bundle.models["positive"].model
    source = LibrarySource(library, IdentifyOptions())
    coordinates = CandidateCoordinates(source, tmp_path / "store" if cached else False)
    asked = []
    original = type(model).candidate_coordinates

    def counting(self, molecules):
        asked.extend(m.inchikey for m in molecules)
        return original(self, molecules)

    type(model).candidate_coordinates = counting
    try:
        ids = np.array([5, 2, 2, 9, 0, 5, 1], dtype=np.int64)
        timings = Counter()
        got = coordinates.of_model(model, ids, timings)
        naive = np.vstack([original(model, source.molecules(np.array([i]))) for i in ids])
        # stored: int8 codes with a float32 scale, exact for these rows' equal non-zero values up to that scale
        np.testing.assert_allclose(got, naive, rtol=1e-6 if cached else 1e-12, atol=1e-12)
        assert sorted(asked) == sorted(library.take("inchikey", np.unique(ids)))  # each distinct id once
        if cached:  # again, from the store: the int8 codes in the order asked, rows equal to the first read's
            asked.clear()
            again = coordinates.of_model(model, ids[::-1], timings, np.float32)
            assert asked == [] and timings["cache_read_s"] > 0
            reference = coordinates.of_model(model, np.unique(ids), timings)
            np.testing.assert_array_equal(again, reference[np.searchsorted(np.unique(ids), ids[::-1])]
                                          .astype(np.float32))
    finally:
        type(model).candidate_coordinates = original
