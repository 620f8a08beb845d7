"""Evaluation (MassSpecGym protocol): metrics against direct computation, the random expectation for a
constant model, skip accounting, bootstrap determinism, the JSON and plot outputs of the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
from molpredict.cli import cli
from molpredict.errors import InputError
from molpredict.engine.decoding import query_metrics, true_rank_counts
from molpredict.identification.evaluate import evaluate
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.chem.molecules import Molecule
from molpredict.spectra.cleaning import CleaningPipeline
from molpredict.io import write_mgf
from molpredict.training.pipeline import build_model

DECOYS = ["CC1Cc2ccc(O)cc2C(=O)O1", "CC(=O)Nc1cccc(O)c1", "O=C(O)/C=C/c1ccc(O)cc1O", "CCCCN(C)C"]


@pytest.fixture
def setup(tmp_path):
    install_fake_model()
    train, mols = synthetic_spectra(n_per=3, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(train, mols)
    bundle = ModelBundle({"positive": SubModel(model, "positive", cleaning=CleaningPipeline().to_dict())})
    bundle.save(tmp_path / "model")
    pool = [Molecule.from_smiles(s) for s in SMILES + DECOYS]
    # every structure's set: itself plus five others (deterministic), the truth first as in the shared files
    sets = {}
    for i, m in enumerate(pool[:len(SMILES)]):
        others = [pool[(i + j) % len(pool)] for j in (1, 3, 5, 7, 11)]
        sets[m.inchikey14] = [[m.inchikey14, m.smiles]] + [[o.inchikey14, o.smiles] for o in others]
    del sets[pool[len(SMILES) - 1].inchikey14]  # one structure without a set
    (tmp_path / "sets.json").write_text(json.dumps(sets))
    queries, _ = synthetic_spectra(n_per=2, seed=21)
    queries[0].metadata.pop("inchikey")  # structure from the SMILES instead
    queries[1].metadata.pop("inchikey")
    queries[1].metadata.pop("smiles")    # no structure at all
    write_mgf(queries, tmp_path / "queries.mgf")
    return tmp_path, bundle, sets, queries


def _load_sets(path):
    from molpredict.chem.candidates import load_candidate_sets
    return load_candidate_sets(path)


def test_metrics_match_direct_computation(setup):
    tmp_path, bundle, sets, queries = setup
    result = evaluate([tmp_path / "queries.mgf"], [("m", bundle)], _load_sets(tmp_path / "sets.json"),
                      cache_root=tmp_path / "cache", n_boot=200)["m"]
    model = bundle.for_mode("positive").model
    clean = CleaningPipeline()
    g, t, n_c, groups = [], [], [], []
    for s in queries:
        smiles = s.metadata.get("smiles")
        if not smiles:
            continue
        ik14 = Molecule.from_smiles(smiles).inchikey14
        if ik14 not in sets:
            continue
        cands = [Molecule(smi, inchikey14=k) for k, smi in sets[ik14]]
        scores = model.score([clean(s)], cands)[0]
        a, b, _ = true_rank_counts(scores, np.array([c.inchikey14 == ik14 for c in cands]))
        g.append(a), t.append(b), n_c.append(len(cands)), groups.append(ik14)
    expected = query_metrics(np.array(g), np.array(t), np.ones(len(g), bool), np.array(n_c), ks=(1, 5, 10, 20))
    assert result["n_queries"] == len(g) == len(queries) - 3
    assert result["n_skipped"] == 3
    assert result["skipped"] == {"no structure (INCHIKEY or SMILES)": 1, "no candidate set for the structure": 2}
    for k in (1, 5, 10, 20):
        assert result[f"hit@{k}"] == pytest.approx(expected[f"hit@{k}"].mean(), abs=1e-6)
    assert result["mrr"] == pytest.approx(expected["rr"].mean(), abs=1e-6)
    assert result["mean_rank"] == pytest.approx(expected["rank"].mean(), abs=1e-6)
    assert result["hit@1"] > 0.8  # the test model learns this toy problem
    assert result["random"]["hit@1"] == pytest.approx(1 / 6) and result["random"]["hit@5"] == pytest.approx(5 / 6)
    lo, hi = result["ci95"]["hit@1"]
    assert lo <= result["hit@1"] <= hi
    assert result["kernel_loss"] == pytest.approx(
        model.kernel_loss([clean(s) for s in queries if s.metadata.get("smiles") and
                           Molecule.from_smiles(s.metadata["smiles"]).inchikey14 in sets],
                          [Molecule.from_smiles(s.metadata["smiles"]) for s in queries if s.metadata.get("smiles")
                           and Molecule.from_smiles(s.metadata["smiles"]).inchikey14 in sets]), rel=1e-9)
    assert len(result["curve"]) == 20 and result["curve"][0] == pytest.approx(result["hit@1"], abs=1e-6)
    # per structure: the mean over structures of each structure's mean over its queries, computed naively
    for name, per_query in [(f"hit@{k}", expected[f"hit@{k}"]) for k in (1, 5, 10, 20)] + \
            [("mrr", expected["rr"]), ("mean_rank", expected["rank"])]:
        by_structure = {}
        for key, value in zip(groups, per_query):
            by_structure.setdefault(key, []).append(float(value))
        naive = sum(sum(v) / len(v) for v in by_structure.values()) / len(by_structure)
        assert result["per_structure"][name] == pytest.approx(naive, abs=1e-12), name
    assert result["n_structures"] == len(set(groups)) < len(groups)


def test_constant_model_gets_the_random_expectation(setup):
    tmp_path, bundle, sets, _ = setup
    model = bundle.for_mode("positive").model
    model.predict_coordinates = lambda inputs: np.zeros((len(inputs), model.dim))
    result = evaluate([tmp_path / "queries.mgf"], [("const", bundle)], _load_sets(tmp_path / "sets.json"),
                      cache_root=False, n_boot=0, kernel_loss=False)["const"]
    average = result["average_ties"]
    for name in ("hit@1", "hit@5", "mrr", "mean_rank"):
        assert average[name] == pytest.approx(result["random"][name], abs=1e-6)
    assert result["hit@1"] == 0.0 and result["mean_rank"] == 6.0  # worst case: every tie counts against


def test_bootstrap_is_seeded(setup):
    tmp_path, bundle, _, _ = setup
    model = bundle.for_mode("positive").model
    original = model.predict_coordinates
    # a noisy model, so that the intervals have some width
    model.predict_coordinates = lambda x: original(x) + np.random.default_rng(0).normal(size=(len(x), model.dim))
    sets = _load_sets(tmp_path / "sets.json")
    runs = [evaluate([tmp_path / "queries.mgf"], [("m", bundle)], sets, cache_root=tmp_path / "c", n_boot=300,
                     seed=seed, kernel_loss=False)["m"] for seed in (1, 1, 2)]
    assert runs[0]["ci95"] == runs[1]["ci95"]
    assert runs[0]["ci95"]["mrr"] != runs[2]["ci95"]["mrr"]
    assert runs[0]["ci95"]["mrr"][0] < runs[0]["mrr"] < runs[0]["ci95"]["mrr"][1]


def test_cli_json_plot_and_two_models(setup):
    tmp_path, bundle, _, _ = setup
    bundle.save(tmp_path / "model2")
    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "queries.mgf"), "--model", str(tmp_path / "model"),
                                      "--model", str(tmp_path / "model2"), "--candidates",
                                      str(tmp_path / "sets.json"), "--json", "--plot", str(tmp_path / "curves.png"),
                                      "--n-boot", "50", "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(data) == sorted([str(tmp_path / "model"), str(tmp_path / "model2")])
    for m in data.values():
        for key in ("hit@1", "hit@5", "hit@10", "hit@20", "mrr"):
            assert 0.0 <= m[key] <= 1.0
        assert m["n_queries"] == 21 and m["n_skipped"] == 3
    first, second = data.values()
    assert first["hit@1"] == second["hit@1"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "queries.mgf"), "--model", str(tmp_path / "model"),
                                    "--candidates", str(tmp_path / "sets.json"), "--n-boot", "20"])
    assert text.exit_code == 0 and "hit@1" in text.stdout and "random ranking" in text.stdout
    # the table names each model by its whole path (tmp paths are long), columns aligned under the header
    header, row = text.stdout.splitlines()[:2]
    assert row.startswith(str(tmp_path / "model") + " ")
    assert header.index("hit@1") + len("hit@1") == row.index("%") + 1


def test_cli_evaluate_bad_inputs(setup):
    tmp_path, _, _, _ = setup
    (tmp_path / "notsets.json").write_text("[1, 2]")
    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "queries.mgf"), "--model", str(tmp_path / "model"),
                                      "--candidates", str(tmp_path / "notsets.json")])
    assert result.exit_code == 2 and "candidate-set" in result.stderr
    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "sets.json"), "--model", str(tmp_path / "model"),
                                      "--candidates", str(tmp_path / "sets.json")])
    assert result.exit_code == 2 and "unknown spectra format" in result.stderr


# -- bad candidate sets: skipped or left out with a reason, never ranked, never a leaked warning ----------------

def _evaluate_quietly(path, sets_path, bundle, **kwargs):
    """``evaluate`` with every warning recorded (a numpy RuntimeWarning must not reach the user)."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate([path], [("m", bundle)], _load_sets(sets_path), cache_root=False, kernel_loss=False,
                          **kwargs)["m"]
    return result, [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_an_empty_set_skips_its_queries_naming_the_key(setup):
    tmp_path, bundle, sets, _ = setup
    key = list(sets)[3]  # a structure with two labelled queries
    (tmp_path / "empty.json").write_text(json.dumps({**sets, key: []}))
    result, runtime_warnings = _evaluate_quietly(tmp_path / "queries.mgf", tmp_path / "empty.json", bundle, n_boot=20)
    assert runtime_warnings == []
    assert result["skipped"][f"empty candidate set {key}"] == 2 and result["n_queries"] == 21 - 2
    assert result["n_skipped"] == 3 + 2 and result["candidates"]["median"] == 6.0
    assert result["random"]["hit@1"] == pytest.approx(1 / 6)  # no 0/0 from the empty set


def test_an_unparsable_candidate_is_left_out_and_named(setup):
    tmp_path, bundle, sets, _ = setup
    key = list(sets)[3]  # a structure with two labelled queries
    bad = {k: v + [["BADBADBADBADBA", "C1CC((("]] if k == key else v for k, v in sets.items()}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    result, runtime_warnings = _evaluate_quietly(tmp_path / "queries.mgf", tmp_path / "bad.json", bundle, n_boot=0)
    assert runtime_warnings == []  # the fingerprints never saw it
    assert result["candidates_left_out"] == [{"set": key, "smiles": "C1CC((("}]
    assert result["candidates"]["max"] == 6 and result["n_queries"] == 21  # never ranked, nothing else lost
    cli_result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "queries.mgf"), "--model",
                                          str(tmp_path / "model"), "--candidates", str(tmp_path / "bad.json"),
                                          "--n-boot", "0", "--no-cache", "--no-kernel-loss"])
    assert cli_result.exit_code == 0, cli_result.output
    lines = [line for line in cli_result.stderr.splitlines() if "C1CC(((" in line]
    assert len(lines) == 1 and str(tmp_path / "bad.json") in lines[0] and key in lines[0]
    assert "RuntimeWarning" not in cli_result.stderr


def test_a_set_without_its_truth_is_skipped_and_counted(setup):
    tmp_path, bundle, sets, _ = setup
    key = list(sets)[3]  # a structure with two labelled queries
    (tmp_path / "missing.json").write_text(json.dumps({**sets, key: sets[key][1:]}))
    result, _ = _evaluate_quietly(tmp_path / "queries.mgf", tmp_path / "missing.json", bundle, n_boot=0)
    assert result["skipped"]["true structure not in its candidate set"] == 2 and result["n_queries"] == 21 - 2
    assert result["n_true_missing"] == 0  # not scored as misses


def test_nothing_to_evaluate_is_a_one_line_error(setup):
    tmp_path, bundle, _, _ = setup
    (tmp_path / "other.json").write_text(json.dumps({"AAAAAAAAAAAAAA": [["AAAAAAAAAAAAAA", "CCO"]]}))
    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "queries.mgf"), "--model", str(tmp_path / "model"),
                                      "--candidates", str(tmp_path / "other.json"), "--no-cache", "-q"])
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "nothing to evaluate" in result.stderr and "no candidate set for the structure" in result.stderr
    assert str(tmp_path / "queries.mgf") in result.stderr
    with pytest.raises(InputError, match="nothing to evaluate"):
        evaluate([tmp_path / "queries.mgf"], [("m", bundle)], _load_sets(tmp_path / "other.json"), cache_root=False)


def test_json_is_strict_null_for_undefined_numbers(setup):
    tmp_path, _, _, _ = setup

    def strict(text):
        return json.loads(text, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))

    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "queries.mgf"), "--model", str(tmp_path / "model"),
                                      "--candidates", str(tmp_path / "sets.json"), "--json", "--n-boot", "0",
                                      "--no-cache", "--no-kernel-loss", "-q"])
    assert result.exit_code == 0, result.output
    m = strict(result.stdout)[str(tmp_path / "model")]
    assert m["ci95"]["hit@1"] == [None, None] and m["per_structure"]["ci95"]["mrr"] == [None, None]
    assert 0 <= m["hit@1"] <= 1
    text = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "queries.mgf"), "--model", str(tmp_path / "model"),
                                    "--candidates", str(tmp_path / "sets.json"), "--n-boot", "0", "--no-cache",
                                    "--no-kernel-loss", "-q"])
    assert text.exit_code == 0 and "hit@1 [n/a, n/a]" in text.stdout and "nan" not in text.stdout


def test_a_model_without_queries_prints_n_a_not_none(setup):
    """Beside a model that has queries, one whose ion mode no query has ranks none: its text report says "n/a"
    where the median candidate count is undefined (QA: "median candidates None")."""
    from molpredict.identification.evaluate import format_report

    tmp_path, bundle, _, _ = setup
    negative = ModelBundle({"negative": SubModel(bundle.for_mode("positive").model, "negative",
                                                 cleaning=CleaningPipeline().to_dict())})
    results = evaluate([tmp_path / "queries.mgf"], [("m", bundle), ("neg", negative)],
                       _load_sets(tmp_path / "sets.json"), cache_root=False, kernel_loss=False, n_boot=0)
    assert results["neg"]["n_queries"] == 0 and results["neg"]["candidates"]["median"] is None
    text = format_report(results)
    assert "None" not in text
    neg = text[text.index("\nneg: "):]
    assert "median candidates n/a" in neg
    assert f"median candidates {results['m']['candidates']['median']:.1f}" in text
