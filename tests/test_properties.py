"""The properties stage: RDKit targets, metrics, conformal intervals, the bundle, the commands and the API."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from molpredict.cli import cli
from molpredict.errors import InputError, ModelFileError
from molpredict.io import read_spectra, write_mgf
from molpredict.properties import predict_properties
from molpredict.properties.metrics import crossing_share, interval_coverage, pinball_score, property_metrics, r2_score
from molpredict.properties.model import PropertyBundle, PropertyPredictor, apply_offsets, conformal_offsets
from molpredict.properties.pipeline import evaluate_properties, train_properties
from molpredict.properties.targets import PROPERTY_NAMES, clip_to_ranges, compute_properties
from molpredict.spectra.record import Spectrum

SMILES = ["CCO", "OC(=O)c1ccccc1", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "CCN", "c1ccc2ccccc2c1", "OCC(O)C(O)C(O)C(O)CO",
          "CC(C)NCC(O)c1ccc(O)cc1", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "OC(=O)CCC(=O)O", "Nc1ncnc2[nH]cnc12",
          "CCCCCCCCCCCCCCCC(=O)O", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O", "CCCCCC", "CCOC(=O)C", "NCCc1ccc(O)c(O)c1",
          "CC(C)(C)c1ccc(O)cc1", "O=C(O)c1ccncc1", "CCCCCCCCO", "C1CCCCC1O"]
#: the fixture's training and validation structures (disjoint, as --val must be)
TRAIN_SMILES, VAL_SMILES = SMILES[:14], SMILES[14:]
FAST = ["--sketch", "subsample:m=25", "--lam", "1e-2,1e-3", "--kernel",
        "mkl:kernels=cosine+precursor+mass-defect,weights=uniform", "-q"]


# ----------------------------------------------------------------------------------------------------------
# targets and metrics
# ----------------------------------------------------------------------------------------------------------

def test_targets_against_hand_values():
    """Ethanol C2H6O, benzoic acid C7H6O2, ibuprofen C13H18O2 (hand-counted weights, Ertl TPSA, counts)."""
    Y = dict(zip(["ethanol", "benzoic", "ibuprofen"], compute_properties(["CCO", "OC(=O)c1ccccc1",
                                                                           "CC(C)Cc1ccc(cc1)C(C)C(=O)O"])))
    col = {name: i for i, name in enumerate(PROPERTY_NAMES)}
    assert Y["ethanol"][col["mw"]] == pytest.approx(2 * 12.011 + 6 * 1.008 + 15.999, abs=1e-3)
    assert Y["benzoic"][col["mw"]] == pytest.approx(7 * 12.011 + 6 * 1.008 + 2 * 15.999, abs=1e-3)
    assert Y["ethanol"][col["tpsa"]] == pytest.approx(20.23)  # one hydroxyl O
    assert Y["benzoic"][col["tpsa"]] == pytest.approx(20.23 + 17.07)  # hydroxyl O + carbonyl O
    assert Y["ethanol"][col["fraction_sp3"]] == 1.0 and Y["benzoic"][col["fraction_sp3"]] == 0.0
    assert Y["ibuprofen"][col["fraction_sp3"]] == pytest.approx(6 / 13)
    assert [Y["benzoic"][col[c]] for c in ("hbd", "rings", "aromatic_rings", "rotatable_bonds")] == [1, 1, 1, 1]
    assert Y["ibuprofen"][col["rotatable_bonds"]] == 4 and Y["ethanol"][col["rings"]] == 0
    assert Y["ethanol"][col["logp"]] < Y["benzoic"][col["logp"]] < Y["ibuprofen"][col["logp"]]
    assert 0 < Y["ibuprofen"][col["qed"]] < 1


def test_unparsable_smiles_names_the_record():
    with pytest.raises(InputError, match=r"x.mgf record 7: field SMILES 'C1CC' "):
        compute_properties(["CCO", "C1CC"], where=["x.mgf record 3", "x.mgf record 7"])


def test_metrics_hand_values():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    q = np.array([[-1.0, 0.0, 1.0], [0.0, 1.0, 2.0], [2.5, 2.0, 3.0], [0.0, 1.0, 2.0]])
    assert interval_coverage(y, q[:, 0], q[:, -1]) == 0.5  # rows 0 and 1 inside; 2.0 < 2.5; 3.0 > 2.0
    assert crossing_share(q) == 1 / 8  # one of the 8 consecutive pairs (row 2: 2.5 > 2.0)
    r = y[:, None] - q
    tau = np.array([0.1, 0.5, 0.9])
    assert pinball_score(y, q, tau) == pytest.approx(np.mean(np.maximum(tau * r, (tau - 1) * r)))
    assert pinball_score(np.array([1.0]), np.array([[0.0]]), [0.9]) == pytest.approx(0.9)
    assert r2_score(y, y) == 1.0 and r2_score(y, np.full(4, 1.5)) == 0.0
    m = property_metrics(y, q, tau)
    assert set(m) == {"r2", "mae", "pinball", "coverage", "crossing"} and m["mae"] == pytest.approx(0.5)  # medians 0, 1, 2, 1


def test_conformal_offsets_reach_the_coverage():
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(999, 2))
    lower, upper = np.full((999, 2), -0.5), np.full((999, 2), 0.5)
    c = conformal_offsets(Y, lower, upper, 0.8)
    inside = np.mean((Y >= lower - c) & (Y <= upper + c), axis=0)
    assert np.all(inside >= 0.8) and np.all(inside < 0.81)
    assert np.allclose(c, np.quantile(np.abs(Y), 0.8, axis=0) - 0.5, atol=0.01)


def test_offsets_never_cross_the_median_and_clipping_keeps_ranges():
    F = np.array([[[0.0, 1.0, 2.0]], [[0.9, 1.0, 1.1]]])
    out = apply_offsets(F, np.array([-0.5]))  # shrinking: the outer quantiles stop at the median
    assert np.allclose(out[0, 0], [0.5, 1.0, 1.5]) and np.allclose(out[1, 0], [1.0, 1.0, 1.0])
    F = np.array([[[-0.3, 0.2, 1.4]] * len(PROPERTY_NAMES)]).reshape(1, len(PROPERTY_NAMES), 3)
    clipped = clip_to_ranges(F, PROPERTY_NAMES)
    qed = PROPERTY_NAMES.index("qed")
    assert np.allclose(clipped[0, qed], [0.0, 0.2, 1.0]) and clipped[0, 0, 0] == -0.3  # logP is unbounded


# ----------------------------------------------------------------------------------------------------------
# a small fixture: spectra whose precursor is the [M+H]+ of real structures, with fragment peaks
# ----------------------------------------------------------------------------------------------------------

def _spectra(seed: int, copies: int, mode: str = "positive", structures: list[str] = SMILES) -> list[Spectrum]:
    from rdkit import Chem
    from rdkit.Chem import Descriptors
    rng = np.random.default_rng(seed)
    out = []
    for i, smiles in enumerate(structures):
        mass = Descriptors.ExactMolWt(Chem.MolFromSmiles(smiles))
        for c in range(copies):
            k = int(rng.integers(3, 8))
            mz = np.sort(np.round(mass + 1.00728 - rng.choice([15.0235, 17.0027, 18.0106, 28.0313, 44.0262, 46.0055],
                                                                 k) * rng.integers(1, 3, k), 4))
            sign = 1.00728 if mode == "positive" else -1.00728
            mz = np.unique(np.append(mz[mz > 20], round(mass + sign, 4)))  # at least the precursor peak
            out.append(Spectrum(f"{mode[:3]}{seed}-{i}-{c}", mz, rng.uniform(10, 100, mz.size),
                                precursor_mz=round(mass + sign, 4), charge=1 if mode == "positive" else -1,
                                ion_mode=mode, mz_precision=1e-4, metadata={"smiles": smiles}))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("properties")
    paths = {"train": root / "train.mgf", "val": root / "val.mgf", "neg": root / "neg.mgf"}
    write_mgf(_spectra(0, 3, structures=TRAIN_SMILES), paths["train"])
    write_mgf(_spectra(1, 2, structures=VAL_SMILES), paths["val"])
    write_mgf(_spectra(2, 1, "negative"), paths["neg"])
    return paths


@pytest.fixture(scope="module")
def model_dir(files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("model") / "props"
    result = CliRunner().invoke(cli, ["properties", "train", str(files["train"]), "--val", str(files["val"]),
                                      "-o", str(out), *FAST])
    assert result.exit_code == 0, result.output
    return out


def test_cli_train_predict_evaluate_round_trip(files, model_dir, tmp_path):
    runner = CliRunner()
    tsv = tmp_path / "props.tsv"
    result = runner.invoke(cli, ["properties", "predict", str(files["val"]), "--model", str(model_dir), "-o",
                                 str(tsv), "-q"])
    assert result.exit_code == 0, result.output
    import pandas as pd
    table = pd.read_csv(tsv, sep="\t")
    assert len(table) == len(VAL_SMILES) * 2
    assert list(table.columns[:4]) == ["id", "file", "record", "ion_mode"]
    assert {"logp", "logp_low", "logp_high", "qed_high"} <= set(table.columns)
    assert np.all(table["logp_low"] <= table["logp"]) and np.all(table["logp"] <= table["logp_high"])
    result = runner.invoke(cli, ["properties", "evaluate", str(files["val"]), "--model", str(model_dir), "--json",
                                 "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report) == {"properties", "n_spectra"} and report["n_spectra"] == len(VAL_SMILES) * 2
    assert list(report["properties"]) == list(PROPERTY_NAMES)
    for metrics in report["properties"].values():
        assert set(metrics) == {"r2", "mae", "pinball", "coverage", "crossing"}
    # calibrated on these very spectra: the 80% interval covers at least 80% of them
    assert all(m["coverage"] >= 0.8 for m in report["properties"].values())
    # the precursor kernel carries the weight
    assert report["properties"]["mw"]["r2"] > 0.5


def test_constant_targets_give_r2_null_and_an_aligned_table(model_dir, tmp_path):
    """R^2 of constant targets is undefined: null in the JSON (strict: no NaN, no -1e29 from a rounded mean) and
    "n/a" in the table, whose columns stay aligned."""
    spectra = _spectra(5, 1)[:6]
    for s in spectra:
        s.metadata["smiles"] = "CC(C)Cc1ccc(cc1)C(C)C(=O)O"  # one structure: every target constant
    write_mgf(spectra, tmp_path / "constant.mgf")
    runner = CliRunner()
    result = runner.invoke(cli, ["properties", "evaluate", str(tmp_path / "constant.mgf"), "--model", str(model_dir),
                                 "--json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output, parse_constant=lambda token: pytest.fail(f"non-standard JSON {token}"))
    assert all(m["r2"] is None for m in report["properties"].values())
    assert all(isinstance(m["mae"], float) for m in report["properties"].values())
    table = runner.invoke(cli, ["properties", "evaluate", str(tmp_path / "constant.mgf"), "--model", str(model_dir),
                                "-q"])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()[:-1]
    assert len(lines) == 1 + len(PROPERTY_NAMES) and len({len(line) for line in lines}) == 1
    assert all(line.split()[1] == "n/a" for line in lines[1:])
    assert np.isnan(r2_score(np.full(5, 0.1 + 0.2), np.arange(5.0)))  # 0.30000000000000004: mean rounds


def test_bundle_round_trip_and_api(files, model_dir):
    bundle = PropertyBundle.load(model_dir)
    assert bundle.ion_modes == ["positive"] and bundle.quantiles == (0.1, 0.5, 0.9)
    spectra = list(read_spectra(files["val"]))
    direct = bundle.predictors["positive"].predict(spectra)
    table = predict_properties(files["val"], model_dir)
    assert np.allclose(table["logp"].to_numpy(), direct[:, 0, 1])
    assert np.allclose(table["mw_high"].to_numpy(), direct[:, PROPERTY_NAMES.index("mw"), 2])
    bundle.save(model_dir.parent / "copy")
    again = PropertyBundle.load(model_dir.parent / "copy").predictors["positive"].predict(spectra)
    assert np.array_equal(again, direct)
    import molpredict
    via_api = molpredict.predict_properties(spectra, model_dir)  # the public API: records (or matchms spectra) too
    assert np.array_equal(via_api["logp"].to_numpy(), table["logp"].to_numpy()) and via_api.attrs["skipped"] == []


def test_skip_and_report_in_batch(files, model_dir, tmp_path):
    mixed = tmp_path / "mixed.mgf"
    spectra = _spectra(3, 1)[:4] + _spectra(4, 1, "negative")[:2]
    spectra[1].metadata["smiles"] = "C1CC"  # not a structure
    del spectra[2].metadata["smiles"]
    write_mgf(spectra, mixed)
    skipped: list = []
    table = predict_properties(mixed, model_dir, skipped=skipped)
    assert len(table) == 4 and len(skipped) == 2  # the negative spectra: the model has positive only
    assert all("ion mode negative" in s.reason for s in skipped) and skipped[0].record == 5
    result, skipped = evaluate_properties(mixed, PropertyBundle.load(model_dir))
    assert result["n_spectra"] == 2
    reasons = sorted(s.reason for s in skipped)
    assert any("field SMILES 'C1CC'" in r for r in reasons) and any("SMILES is missing" in r for r in reasons)
    assert [s.record for s in skipped if "C1CC" in s.reason] == [2]


def test_bad_input_is_one_line_and_non_zero(files, model_dir, tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["properties", "evaluate", str(files["val"]), "--model", str(tmp_path), "--json"])
    assert result.exit_code != 0 and "not a property model" in result.output
    assert len(result.output.strip().splitlines()) == 1
    broken = tmp_path / "broken"
    import shutil
    shutil.copytree(model_dir, broken)
    (broken / "properties.json").write_text("{nope")
    result = runner.invoke(cli, ["properties", "predict", str(files["val"]), "--model", str(broken)])
    assert result.exit_code != 0 and "properties.json: not valid JSON" in result.output
    result = runner.invoke(cli, ["properties", "predict", str(files["neg"]), "--model", str(model_dir), "-q"])
    assert result.exit_code != 0 and "no spectrum could be predicted" in result.output
    result = runner.invoke(cli, ["properties", "train", str(files["train"]), "-o", str(tmp_path / "m"),
                                 "--levels", "0.5,2"])
    assert result.exit_code != 0 and "--levels" in result.output
    with pytest.raises(ModelFileError, match="format"):
        bad = tmp_path / "other"
        bad.mkdir()
        (bad / "properties.json").write_text(json.dumps({"format": "something-else"}))
        PropertyBundle.load(bad)


def test_two_ion_modes_in_one_bundle(files, tmp_path):
    bundle, skipped = train_properties([files["train"], files["neg"]], None, params={
        "sketch": "subsample:m=15", "lam": 1e-2, "max_iter": 30,
        "input_kernel": "mkl:kernels=cosine+precursor,weights=uniform"}, min_spectra=10)
    assert bundle.ion_modes == ["positive", "negative"] and not skipped
    # no validation spectra: the intervals are calibrated on held-out training structures (20% of them)
    negative = bundle.predictors["negative"]
    assert negative.n_val_ == round(0.2 * len(SMILES)) and negative.n_train_ + negative.n_val_ == len(SMILES)
    table, _ = __import__("molpredict.properties.pipeline", fromlist=["predict_table"]).predict_table(
        list(read_spectra(files["neg"])) + list(read_spectra(files["val"]))[:3], bundle)
    assert list(table["ion_mode"]) == ["negative"] * len(SMILES) + ["positive"] * 3


@pytest.mark.shared
def test_real_subset_intervals_and_weight(shared_data, tmp_path):
    """On real spectra: trained on 600 train_pos, calibrated on 300 val_pos, evaluated on 300 other val_pos."""
    from itertools import islice
    train = list(islice((s for s in read_spectra(shared_data / "massbank" / "train_pos.mgf")
                         if s.metadata.get("smiles")), 0, 6000, 10))
    val = [s for s in islice(read_spectra(shared_data / "massbank" / "val_pos.mgf"), 1200)
           if s.metadata.get("smiles")]
    calibration, held_out = val[0::4][:300], val[1::4][:300]
    bundle, _ = train_properties(train, calibration, params={"sketch": "subsample:m=300", "lam": "1e-3+1e-4",
                                                             "max_iter": 100})
    result, _ = evaluate_properties(held_out, bundle)
    props = result["properties"]
    assert props["mw"]["r2"] > 0.9
    assert all(0.65 <= m["coverage"] <= 0.95 for m in props.values()), {k: m["coverage"] for k, m in props.items()}
    assert all(m["crossing"] <= 0.05 for m in props.values())


def test_identify_properties_adds_columns_and_the_report_shows_them(model_dir, tmp_path, monkeypatch):
    """``identify --properties``: every row carries its query's medians and intervals (the same numbers as
    ``properties predict``), and the HTML report lists them per query."""
    from identification_helpers import FAKE_MODEL, SMILES as ID_SMILES, install_fake_model, synthetic_spectra
    from molpredict.chem.candidates import CandidateLibrary
    from molpredict.io.results import OUTPUT_COLUMNS, read_result_rows
    from molpredict.modelfile import ModelBundle, SubModel
    from molpredict.report.page import decode_report_data
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.training.pipeline import build_model

    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=2, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    ModelBundle({"positive": SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(),
                                      adducts=["[M+H]+"])}).save(tmp_path / "idmodel")
    CandidateLibrary.from_smiles(ID_SMILES, names=[f"c{i}" for i in range(len(ID_SMILES))],
                                 source="test").to_tsv(tmp_path / "lib.tsv")
    queries, _ = synthetic_spectra(n_per=1, seed=8)
    write_mgf(queries, tmp_path / "q.mgf")
    result = CliRunner().invoke(cli, ["identify", str(tmp_path / "q.mgf"), "--model", str(tmp_path / "idmodel"),
                                      "--library", str(tmp_path / "lib.tsv"), "--top-k", "2", "--properties",
                                      str(model_dir), "-o", str(tmp_path / "out.tsv"), "--report",
                                      str(tmp_path / "r.html"), "-q"])
    assert result.exit_code == 0, result.output
    rows = list(read_result_rows(tmp_path / "out.tsv"))
    assert tuple(rows[0])[:len(OUTPUT_COLUMNS)] == OUTPUT_COLUMNS
    assert {"prop_logp", "prop_logp_low", "prop_logp_high", "prop_qed_high"} <= set(rows[0])
    expected = predict_properties(tmp_path / "q.mgf", model_dir).set_index("id")
    for row in rows:
        assert row["prop_mw"] == pytest.approx(expected.loc[row["query_id"], "mw"], rel=1e-5)
        assert row["prop_logp_low"] <= row["prop_logp"] <= row["prop_logp_high"]
    data = decode_report_data((tmp_path / "r.html").read_text())
    shown = {q["id"]: {p[0]: p[1:] for p in q["props"]} for q in data["queries"]}
    first = rows[0]
    assert shown[first["query_id"]]["logp"] == pytest.approx(
        [first["prop_logp"], first["prop_logp_low"], first["prop_logp_high"]], rel=1e-3)  # rounded
    assert "Predicted properties of the unknown" in (tmp_path / "r.html").read_text()


def test_computing_targets_leaves_rdkit_logs_silenced(capfd):
    """compute_properties switched RDKit's logging back on for the whole process, so a later unparsable SMILES
    printed RDKit's lines to stderr (the suite caught it when a property test ran before test_molecules)."""
    from molpredict.chem.molecules import Molecule

    compute_properties(["CCO"])
    with pytest.raises(InputError):
        compute_properties(["C1CC"])
    with pytest.raises(InputError):
        Molecule.from_smiles("C1CC")
    assert capfd.readouterr().err == ""


def test_without_val_the_intervals_are_calibrated_on_held_out_structures(files):
    """Without --val, the raw quantiles of a model on its own training spectra are far too narrow (QA: 30
    spectra, 80% intervals covering none of the validation values); held-out training structures calibrate
    them instead, so on new structures they cover more, and the split keeps each structure on one side."""
    from molpredict.models.distinct import split_by_structure
    from molpredict.properties.pipeline import structure_key

    params = {"sketch": "subsample:m=25", "lam": "1e-2+1e-3",
              "input_kernel": "mkl:kernels=cosine+precursor+mass-defect,weights=uniform"}
    said: list[str] = []
    bundle, _ = train_properties(files["train"], None, params=params, log=said.append)
    predictor = bundle.predictors["positive"]
    n_train = len(TRAIN_SMILES) * 3
    held_structures = round(0.2 * len(TRAIN_SMILES))
    assert predictor.n_val_ == 3 * held_structures and predictor.n_train_ + predictor.n_val_ == n_train
    assert said == [f"positive: no validation spectra: {3 * held_structures} training spectra of "
                    f"{held_structures} structures held out to calibrate the intervals"]
    assert np.any(predictor.offsets_ != 0)
    raw = PropertyPredictor(predictor.regressor, predictor.names)  # the same fit without the widening
    raw.offsets_ = np.zeros(len(predictor.names))
    val = list(read_spectra(files["val"]))
    truth = compute_properties([s.metadata["smiles"] for s in val])

    def coverage(model):
        F = model.predict(val)
        return float(np.mean((F[..., 0] <= truth) & (truth <= F[..., -1])))
    assert coverage(predictor) > coverage(raw) and coverage(predictor) >= 0.6, (coverage(predictor), coverage(raw))
    spectra = _spectra(7, 2)
    fit, held = split_by_structure(spectra, 0.25, 0, key=structure_key)  # the split the held-out part comes from
    keys = [s.metadata["smiles"] for s in spectra]
    assert not {keys[i] for i in fit} & {keys[i] for i in held} and len(fit) + len(held) == len(spectra)
    assert len({keys[i] for i in held}) == 5  # a quarter of the 20 structures


def test_train_refuses_what_it_would_destroy_or_misuse(files, tmp_path):
    runner = CliRunner()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    result = runner.invoke(cli, ["properties", "train", str(files["train"]), "-o", str(mine), *FAST])
    assert result.exit_code != 0 and "exists and is not a property model" in result.output
    assert (mine / "notes.txt").read_text() == "precious"  # was deleted by the save before
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.json").write_text("{}")  # an identification bundle
    result = runner.invoke(cli, ["properties", "train", str(files["train"]), "-o", str(bundle), *FAST])
    assert result.exit_code != 0 and (bundle / "bundle.json").is_file()
    for option, value, message in [("--max-train", "-5", "--max-train"), ("--lam", "abc", "separated by commas")]:
        result = runner.invoke(cli, ["properties", "train", str(files["train"]), "-o", str(tmp_path / "m"),
                                     option, value])
        assert result.exit_code == 2 and message in result.output, result.output
    result = runner.invoke(cli, ["properties", "train", str(files["train"]), "--val", str(files["train"]), "-o",
                                 str(tmp_path / "m"), *FAST])
    assert result.exit_code == 2 and "validation spectra share 14 structures with the training" in result.output
    assert not (tmp_path / "m").exists()
    # one structure written as another SMILES (ethanol, 'CCO' in training) is still the same structure
    written_apart = tmp_path / "val_ethanol.mgf"
    write_mgf(_spectra(3, 1, structures=["OCC", "C1CCCCC1O"]), written_apart)
    result = runner.invoke(cli, ["properties", "train", str(files["train"]), "--val", str(written_apart), "-o",
                                 str(tmp_path / "m"), *FAST])
    assert result.exit_code == 2 and "validation spectra share 1 structure with the training" in result.output
