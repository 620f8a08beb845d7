"""End to end on a small real subset of the shared MassBank data, through the CLI: train -> save -> load ->
identify -> evaluate, with the real SISOKR engine (small sketches so that it runs in well under a minute)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import child_pythonpath, require_shared
from molpredict.cli import cli

N_TRAIN, N_VAL, N_TEST = 600, 100, 60
SMALL = ["--input-sketch", "subsample:m=200", "--output-sketch", "subsample:m=100", "--device", "cpu",
         "--lam", "1e-4|1e-3|1e-2"]


def head_mgf(src: Path, n: int, dst: Path) -> Path:
    """The first ``n`` records of an MGF file."""
    out, count = [], 0
    with open(src, encoding="utf-8") as handle:
        for line in handle:
            out.append(line)
            if line.startswith("END IONS"):
                count += 1
                if count == n:
                    break
    dst.write_text("".join(out))
    return dst


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    data = require_shared("massbank")
    sets_path = require_shared("candidates", "test_formula256.json")
    root = tmp_path_factory.mktemp("e2e")
    files = {"train": head_mgf(data / "train_pos.mgf", N_TRAIN, root / "train.mgf"),
             "val": head_mgf(data / "val_pos.mgf", N_VAL, root / "val.mgf"),
             "test": head_mgf(data / "test_pos.mgf", N_TEST, root / "test.mgf")}
    # a library holding the candidate sets of the test structures (the formula256 protocol's candidates)
    from molpredict.chem.candidates import CandidateLibrary, load_candidate_sets
    from molpredict.io import read_spectra
    sets = load_candidate_sets(sets_path)
    keys = {s.inchikey[:14] for s in read_spectra(files["test"])}
    smiles = sorted({smi for k in keys for _, smi in sets.get(k, [])})
    CandidateLibrary.from_smiles(smiles, source="formula256").to_tsv(root / "library.tsv")
    return root, files, sets_path


@pytest.fixture
def home(workspace, monkeypatch):
    root, _, _ = workspace
    monkeypatch.setenv("MOLPREDICT_HOME", str(root / "home"))
    return root / "home"


@pytest.fixture(scope="module")
def trained(workspace):
    root, files, _ = workspace
    runner = CliRunner()
    val_sets = require_shared("candidates", "val_formula256.json")
    mass_sets = require_shared("candidates", "val_mass.json")
    result = runner.invoke(cli, ["train", str(files["train"]), "--val", str(files["val"]), "-o",
                                 str(root / "model"), "--summary-json", str(root / "summary.json"),
                                 "--val-candidates", str(val_sets), "--calibration-candidates", str(mass_sets),
                                 *SMALL])
    assert result.exit_code == 0, result.output
    return root / "model", result


def test_train_summary_and_bundle(workspace, trained):
    root, files, _ = workspace
    model_dir, result = trained
    assert "read 600 spectra" in result.stderr and "skipped" in result.stderr
    assert "validation kernel loss" in result.stderr
    summary = json.loads((root / "summary.json").read_text())
    used = summary["models"]["positive"]["n_spectra"]
    assert used + sum(summary["skipped"].values()) == N_TRAIN
    meta = json.loads((model_dir / "positive" / "metadata.json").read_text())
    assert meta["training"]["n_spectra"] == used
    assert sum(meta["training"]["licenses"].values()) == used
    assert meta["model"]["name"] == "sisokr"
    kinds = {c["kind"] for c in meta["components"]}
    assert {"model", "input_kernel", "output_kernel", "sketch"} <= kinds
    assert 0 < meta["validation"]["kernel_loss"] <= 2.0
    assert meta["selection"]["source"] == "val" and len(meta["selection"]["points"]) == 3
    # ranking-aware selection: lam chosen by the validation MRR in the val_formula256 sets
    assert meta["selection"]["select_by"] == "mrr"
    mrrs = [p["val_mrr"] for p in meta["selection"]["points"]]
    assert meta["selection"]["best"] == int(np.argmax(mrrs)) and 0 < max(mrrs) <= 1
    # the prior is an explicit component, fused with weights chosen on validation, with a calibration
    model_dir = trained[0]
    assert meta["prior"] == {"directory": "prior", "model": "prior"}
    assert (model_dir / "positive" / "prior" / "tensors.safetensors").is_file()
    with_prior = meta["scoring"]["with_prior"]
    assert with_prior["fusion"]["weights"]["spectrum"] == 1.0 and "prior" in with_prior["fusion"]["weights"]
    assert "prior" not in meta["scoring"]["without_prior"]["fusion"]["weights"]
    report = meta["validation"]["ranking"]["with_prior"]
    # in-sample, the weight grid ranks the validation truths at least as well as the spectrum alone (weight 0 for
    # the prior is on the grid). A learnt ranker, when chosen, is fitted by likelihood, not by MRR, so it carries
    # no such bound in-sample: it is chosen over the weights out of fold, which is what is checked for it
    validation = with_prior["fusion"]["validation"]
    grid = validation["fused_weights"] if report["fusion_kind"] == "ranker" else validation["fused"]
    assert grid["mrr"] >= report["spectrum_alone"]["mrr"] - 1e-12
    choice = report.get("fusion_choice")
    if choice is not None:
        w, r = choice["weights"], choice["ranker"]
        ranker_wins = r["mrr"] > w["mrr"] + 1e-9 and r["hit@1"] >= w["hit@1"]
        assert choice["chosen"] == report["fusion_kind"] == ("ranker" if ranker_wins else "weights")
    assert 0 <= report["calibration"]["ece_out_of_fold"] < 0.3
    # the calibration (not the fusion) also fitted on the mass-window sets; the FDR bound kept with it
    from molpredict.identification.calibration import FDR_Z
    assert with_prior["calibration"]["validation"]["n_queries"] > with_prior["fusion"]["validation"]["n_sets"]
    # the training log counts the queries the fusion's figures are on, not the calibration's extra sets
    line = next(line for line in result.stderr.splitlines() if "positive with prior:" in line)
    assert f"({with_prior['fusion']['validation']['n_sets']} queries)" in line, line
    assert with_prior["calibration"]["fdr"] == {"z": FDR_Z, "clusters": "rank1"}
    info = CliRunner().invoke(cli, ["model", "info", str(model_dir)])
    assert info.exit_code == 0
    described = json.loads(info.output)["positive"]
    assert described["prior_weight"] == with_prior["fusion"]["weights"]["prior"]
    assert described["prior"]["model"] == "prior"
    assert meta["default_adducts"][0] == "[M+H]+" and meta["cleaning"]["format_version"] == 1
    from molpredict.modelfile import file_sha256
    assert meta["training"]["sha256"] == file_sha256([files["train"]], extra=meta["training"]["filters"])


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_bundle_round_trip_predicts_the_same(workspace, trained, tmp_path):
    from molpredict.chem.candidates import read_library
    from molpredict.modelfile import ModelBundle
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import read_spectra
    root, files, _ = workspace
    a = ModelBundle.load(trained[0])
    a.save(tmp_path / "copy")
    b = ModelBundle.load(tmp_path / "copy")
    ma, mb = a.for_mode("positive").model, b.for_mode("positive").model
    clean = CleaningPipeline.from_dict(a.for_mode("positive").cleaning)
    spectra = [clean(s) for s in read_spectra(files["test"])][:20]
    np.testing.assert_array_equal(ma.predict_coordinates(spectra), mb.predict_coordinates(spectra))
    molecules = read_library(root / "library.tsv").molecules(np.arange(30))
    np.testing.assert_array_equal(ma.candidate_coordinates(molecules), mb.candidate_coordinates(molecules))
    assert ma.coordinates_key() == mb.coordinates_key()


def test_identify_and_evaluate(workspace, trained, home):
    root, files, sets_path = workspace
    model_dir, _ = trained
    runner = CliRunner()
    result = runner.invoke(cli, ["identify", str(files["test"]), "--model", str(model_dir), "--library",
                                 str(root / "library.tsv"), "--top-k", "5", "-o", str(root / "ids.tsv"),
                                 "--skipped", str(root / "skipped.tsv")])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(open(root / "ids.tsv"), delimiter="\t"))
    skipped = list(csv.DictReader(open(root / "skipped.tsv"), delimiter="\t"))
    from molpredict.io import read_spectra
    queries = {s.id: s for s in read_spectra(files["test"])}
    assert {r["query_id"] for r in rows} | {s["query_id"] for s in skipped} == set(queries)
    assert not {r["query_id"] for r in rows} & {s["query_id"] for s in skipped}
    for r in rows:
        assert r["formula"] == queries[r["query_id"]].formula  # by formula (the MGF has FORMULA)
        assert int(r["n_candidates"]) >= 256 or int(r["rank"]) <= int(r["n_candidates"])
        # the fused score, its terms and (rank 1 only) the calibrated probability
        assert r["spectrum_score"] != "" and r["prior_score"] != ""
        assert (r["probability"] != "") == (r["rank"] == "1")
        if r["rank"] == "1" and int(r["n_candidates"]) > 1:
            assert 0 < float(r["probability"]) < 1
    hits_identify = np.mean([any(r["inchikey"][:14] == queries[q].inchikey[:14] and r["rank"] == "1"
                                 for r in rows if r["query_id"] == q) for q in {r["query_id"] for r in rows}])

    result = runner.invoke(cli, ["evaluate", str(files["test"]), "--model", str(model_dir), "--candidates",
                                 str(sets_path), "--json", "--n-boot", "200"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)[str(model_dir)]
    assert metrics["n_queries"] + metrics["n_skipped"] == N_TEST
    assert metrics["n_skipped"] == 0  # empty-after-cleaning spectra are kept in evaluation
    from molpredict.spectra.cleaning import CleaningPipeline
    assert metrics["n_empty_spectra"] == sum(CleaningPipeline()(s).n_peaks == 0 for s in queries.values())
    assert metrics["hit@1"] <= metrics["hit@5"] <= metrics["hit@10"] <= metrics["hit@20"]
    # a model trained on ~500 spectra is weak, but far better than a random ranking of 256 isomers
    assert metrics["random"]["hit@1"] == pytest.approx(1 / 256, rel=0.05)
    assert metrics["hit@20"] > 5 * metrics["random"]["hit@20"]
    assert metrics["mrr"] > 5 * metrics["random"]["mrr"]
    assert 0 < metrics["kernel_loss"] <= 2.0
    # identify (library by formula = the union of same-formula sets) and evaluate agree roughly on hit@1
    assert abs(hits_identify - metrics["hit@1"]) < 0.25
    # the fused ranking, each term alone and the fusion without the prior, from one pass
    assert {"spectrum_alone", "prior_alone", "without_prior"} <= set(metrics["views"])
    cal = metrics["calibration"]
    assert cal["n_bins"] == 10 and 0 <= cal["ece"] <= 1 and cal["n_queries"] == metrics["n_queries"]
    # --prior off ranks exactly as the "without_prior" view of the fused run
    result = runner.invoke(cli, ["evaluate", str(files["test"]), "--model", str(model_dir), "--candidates",
                                 str(sets_path), "--json", "--n-boot", "50", "--prior", "off", "--no-kernel-loss"])
    assert result.exit_code == 0, result.output
    off = json.loads(result.stdout)[str(model_dir)]
    assert off["mrr"] == pytest.approx(metrics["views"]["without_prior"]["mrr"])
    assert off["hit@1"] == pytest.approx(metrics["views"]["without_prior"]["hit@1"])


def test_real_bundle_with_missing_plugin(workspace, trained, tmp_path):
    from molpredict.modelfile import ModelBundle
    root, files, _ = workspace
    copy = ModelBundle.load(trained[0]).save(tmp_path / "bundle")
    meta_path = copy / "positive" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for comp in meta["components"]:
        if comp["kind"] == "input_kernel":
            comp["name"] = "ppk-from-a-plugin"
    meta_path.write_text(json.dumps(meta))
    result = CliRunner().invoke(cli, ["identify", str(files["test"]), "--model", str(copy), "--library",
                                      str(root / "library.tsv")])
    assert result.exit_code == 3
    assert "input kernel 'ppk-from-a-plugin'" in result.stderr and "install the plugin" in result.stderr


def test_demo_on_an_imported_style_directory(workspace, tmp_path, monkeypatch, capsys):
    """``make demo`` with ``--data DIR`` (train/val/test MGF files) and no library given or configured: builds a
    library of the directory's structures (and makes it the default), trains the default bundle into
    $MOLPREDICT_HOME, then identifies against that library."""
    root, files, _ = workspace
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test"):
        (data / f"{split}_pos.mgf").write_text(files[split].read_text())
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MOLPREDICT_CONFIG")   # a fresh user's config file: $MOLPREDICT_HOME/config.json
    from molpredict import config
    from molpredict.data import demo
    from molpredict.models.okr import SISOKR
    small = {"input_sketch": "subsample:m=200", "output_sketch": "subsample:m=100", "lam": "1e-3"}
    monkeypatch.setattr(SISOKR, "train_defaults", classmethod(lambda cls, *args: dict(small)))
    assert demo.main(["--data", str(data), "--n", "3", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "[2/3] training the default model" in out and "[3/3] identifying 3 test_pos.mgf spectra" in out
    assert "[1/3] candidate library: the" in out and "now your default library" in out
    assert config.default_library() == str((data / "library.tsv").resolve())
    assert (tmp_path / "home" / "models" / "default" / "bundle.json").is_file()
    assert "TRUE" in out and "true structure ranked first for" in out
    # second run: the default model is reused
    assert demo.main(["--data", str(data), "--n", "1", "--device", "cpu"]) == 0
    assert "using the existing default model" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="lacks"):
        demo.main(["--data", str(tmp_path / "nothing")])


def test_dsokr_default_through_the_cli(workspace, home, tmp_path):
    """``--model dsokr`` on spectra gets DSOKR's default network (a linear layer on whitened ppk-losses features
    against the training spectra), stops early on the validation MRR, reloads from its bundle and ranks the
    formula256 candidate sets far better than chance."""
    root, files, sets_path = workspace
    runner = CliRunner()
    model_dir = tmp_path / "dsokr"
    result = runner.invoke(cli, ["train", str(files["train"]), "--val", str(files["val"]), "-o", str(model_dir),
                                 "--device", "cpu", "--model", "dsokr:epochs=8"])
    assert result.exit_code == 0, result.output
    meta = json.loads((model_dir / "positive" / "metadata.json").read_text())
    params = meta["model"]["params"]
    assert params["encoder"] == "kernel-mlp:layers=0;whiten=true" and params["val_metric"] == "auto"
    history = meta["state"]["history"][0]
    assert history["val_metric"] == "mrr" and history["val"][history["best_epoch"]] == max(history["val"])
    result = runner.invoke(cli, ["evaluate", str(files["test"]), "--model", str(model_dir), "--candidates",
                                 str(sets_path), "--json", "--n-boot", "50"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)[str(model_dir)]
    assert metrics["mrr"] > 5 * metrics["random"]["mrr"]


def _as_old_bundle(bundle: Path, target: Path) -> Path:
    """A copy of ``bundle`` as molpredict wrote it before fitted kernels were saved: no ``fitted_kernels`` entry in
    the model states and no ``fitted_kernels.*`` tensors (the hash and size in metadata.json updated)."""
    import shutil
    from safetensors.numpy import load_file, save_file
    from molpredict.cache import file_sha256
    shutil.copytree(bundle, target)
    for meta_path in target.rglob("metadata.json"):
        meta = json.loads(meta_path.read_text())
        if "fitted_kernels" not in meta["state"]:
            continue
        del meta["state"]["fitted_kernels"]
        tensors = meta_path.parent / meta["tensors"]["file"]
        arrays = {k: v for k, v in load_file(str(tensors)).items() if not k.startswith("fitted_kernels.")}
        save_file(arrays, str(tensors))
        meta["tensors"].update(sha256=file_sha256([tensors]), n_bytes=tensors.stat().st_size, names=sorted(arrays))
        meta_path.write_text(json.dumps(meta))
    return target


def test_old_bundle_loads_says_how_to_upgrade_and_upgrades(workspace, trained, home, tmp_path):
    """A bundle saved before fitted kernels were (the kernels are refitted on their landmarks at load) still loads,
    predicts exactly as the current format, says how to re-save it, and `molpredict model upgrade` makes it current
    without changing a prediction, an output byte or the candidate-coordinates cache key."""
    from molpredict.modelfile import ModelBundle
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import read_spectra
    root, files, _ = workspace
    old = _as_old_bundle(trained[0], tmp_path / "old")
    current, stale = ModelBundle.load(trained[0]), ModelBundle.load(old)
    assert current.refitted_on_load() == {} and current.upgrade_hint() is None
    assert stale.refitted_on_load() == {"positive": ["input kernel", "output kernel"]}
    assert "molpredict model upgrade" in stale.upgrade_hint()
    a, b = current.for_mode("positive"), stale.for_mode("positive")
    clean = CleaningPipeline.from_dict(a.cleaning)
    spectra = [clean(s) for s in read_spectra(files["test"])][:20]
    np.testing.assert_array_equal(a.model.predict_coordinates(spectra), b.model.predict_coordinates(spectra))
    assert a.model.coordinates_key() == b.model.coordinates_key()

    runner = CliRunner()
    args = [str(files["test"]), "--library", str(root / "library.tsv"), "--no-progress"]
    result = runner.invoke(cli, ["identify", *args, "--model", str(old), "-o", str(tmp_path / "before.tsv")])
    assert result.exit_code == 0, result.output
    assert f"`molpredict model upgrade {old}`" in result.stderr
    result = runner.invoke(cli, ["model", "upgrade", str(old)])
    assert result.exit_code == 0, result.output
    assert "upgraded" in result.stderr
    upgraded = ModelBundle.load(old)
    assert upgraded.refitted_on_load() == {}
    assert upgraded.for_mode("positive").model.coordinates_key() == a.model.coordinates_key()
    result = runner.invoke(cli, ["identify", *args, "--model", str(old), "-o", str(tmp_path / "after.tsv")])
    assert result.exit_code == 0 and "model upgrade" not in result.stderr
    assert (tmp_path / "after.tsv").read_bytes() == (tmp_path / "before.tsv").read_bytes()
    result = runner.invoke(cli, ["model", "upgrade", str(old)])
    assert result.exit_code == 0 and "already current" in result.stderr
    # a current bundle written elsewhere is a copy, said as one; never written inside itself
    result = runner.invoke(cli, ["model", "upgrade", str(old), "-o", str(tmp_path / "copy")])
    assert result.exit_code == 0 and f"{old} is already current: copied to {tmp_path / 'copy'}" in result.stderr
    result = runner.invoke(cli, ["model", "upgrade", str(old), "-o", str(old / "inside")])
    assert result.exit_code == 2 and "is inside the bundle it would be written from" in result.output


HEAVY = ("torch", "dask", "distributed", "sklearn", "scipy.special", "zarr", "fsspec", "pandas", "rdkit",
         "pyarrow.compute")


def _imported_after(argv: list[str], env: dict, cache_small_libraries: bool = True) -> set[str]:
    """The HEAVY modules a fresh process has imported after running the CLI entry on ``argv``."""
    import subprocess
    import sys
    # the small test library is cached like the shared pool (over CACHE_MIN_BYTES) is: the warm path a user meets
    setup = "import molpredict.chem.candidates as c\nc.CACHE_MIN_BYTES = 0\n" if cache_small_libraries else ""
    code = ("import json, sys\n" + setup + "from molpredict.cli import main\ntry:\n    main(json.loads(sys.argv[1]))\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_identify_imports_only_what_it_uses(workspace, trained, home, tmp_path):
    """`molpredict identify` with a kernel model and a warm local store imports neither torch (the model predicts
    with numpy) nor Dask, scikit-learn, scipy.special, zarr / fsspec (the store's segments are read directly) or
    pandas (which pyarrow pulls in for list and to_numpy conversions); `molpredict --help` imports none of the
    heavy packages."""
    import os
    root, files, _ = workspace
    env = {**os.environ, "MOLPREDICT_HOME": str(home), "PYTHONPATH": child_pythonpath()}
    argv = ["identify", str(files["test"]), "--model", str(trained[0]), "--library", str(root / "library.tsv"),
            "-o", str(tmp_path / "ids.tsv"), "--no-progress", "-q"]
    _imported_after(argv, env)  # warms the store
    warm = _imported_after(argv, env)
    assert not warm & {"torch", "dask", "distributed", "sklearn", "scipy.special", "zarr", "fsspec", "pandas"}, warm
    assert "rdkit" in warm  # the formula masses of the formula-annotation kernel do need it
    assert _imported_after(["--help"], env, cache_small_libraries=False) == set()
