"""The training pipeline: filters and skip reasons, licences, ion modes, the bundle it saves, and `molpredict train`."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, install_fake_model, synthetic_spectra
from molpredict.cli import cli
from molpredict.errors import InputError, SpecError
from molpredict.modelfile import ModelBundle
from molpredict.spectra.record import Spectrum
from molpredict.io import write_mgf
from molpredict.training.pipeline import TrainOptions, build_model, license_excluded, load_labelled, train_bundle


#: validation structures: none is a training structure (train refuses validation spectra of seen structures)
VAL_SMILES = ["CCO", "CCCCO", "CC(=O)O", "Oc1ccccc1", "CC(C)CO", "OCCCO", "CC(N)C(=O)O", "NCC(=O)O",
              "c1ccncc1", "CCOC(C)=O", "CCCC(=O)O", "OC(=O)CCC(=O)O"]


def other_structures(n_per: int = 1, seed: int = 2, smiles: list[str] = VAL_SMILES) -> list:
    """:func:`synthetic_spectra` of other structures than the training ones (``smiles``)."""
    import identification_helpers

    saved = identification_helpers.SMILES
    identification_helpers.SMILES = list(smiles)
    try:
        spectra, _ = synthetic_spectra(n_per=n_per, seed=seed)
    finally:
        identification_helpers.SMILES = saved
    for s in spectra:
        s.id = "val-" + s.id
    return spectra


@pytest.fixture
def files(tmp_path):
    install_fake_model()
    pos, _ = synthetic_spectra(n_per=3, seed=0)
    neg, _ = synthetic_spectra(n_per=2, seed=1, ion_mode="negative")
    for s in neg:
        s.id = "neg-" + s.id
    odd = [
        Spectrum("no-structure", mz=[50.0, 60.0], intensities=[1.0, 2.0], precursor_mz=100.0, charge=1,
                 ion_mode="positive"),
        Spectrum("bad-smiles", mz=[50.0, 60.0], intensities=[1.0, 2.0], precursor_mz=100.0, charge=1,
                 ion_mode="positive", metadata={"smiles": "C1CC(C"}),
        Spectrum("precursor-only", mz=[100.0], intensities=[5.0], precursor_mz=100.0, charge=1,
                 ion_mode="positive", metadata={"smiles": "CCO"}),
    ]
    write_mgf(pos + odd, tmp_path / "train_pos.mgf")
    write_mgf(neg, tmp_path / "train_neg.mgf")
    write_mgf(other_structures(n_per=1, seed=2), tmp_path / "val_pos.mgf")
    with open(tmp_path / "train_pos.mgf", "a") as handle:  # a record the reader cannot parse
        handle.write("BEGIN IONS\nTITLE=broken\nPEPMASS=100\n12.0 abc\nEND IONS\n")
    return tmp_path, pos, neg


def test_license_tokens():
    assert license_excluded("CC BY-NC-SA", ["NC"]) and license_excluded("cc by-nc", ["nc"])
    assert not license_excluded("CC0", ["NC"]) and not license_excluded("UNCLEAR", ["NC"])
    assert not license_excluded(None, ["NC"]) and not license_excluded("CC BY-NC", [])
    assert license_excluded("dl-de/by-2-0", ["dl-de"]) is False  # tokens, not substrings
    assert license_excluded("CC BY-SA", ["SA", "ND"])


def test_skip_reasons_and_counts(files):
    tmp_path, pos, neg = files
    data = load_labelled([tmp_path / "train_pos.mgf", tmp_path / "train_neg.mgf"], TrainOptions())
    assert data.n_used("positive") == len(pos) and data.n_used("negative") == len(neg)
    assert dict(data.skipped) == {"no structure (SMILES or InChI)": 1, "structure not parsed by RDKit": 1,
                                  "no peaks after cleaning": 1, "unreadable record (non-numeric peak)": 1}
    assert data.n_read == len(pos) + len(neg) + 4
    assert data.n_structures("positive") == 12
    nc = load_labelled([tmp_path / "train_pos.mgf"], TrainOptions(exclude_licenses=["NC"], ion_modes=["positive"]))
    assert nc.skipped["licence excluded"] == sum("NC" in s.metadata["license"] for s in pos)
    assert set(nc.licenses["positive"]) == {"CC BY"}
    only_neg = load_labelled([tmp_path / "train_pos.mgf", tmp_path / "train_neg.mgf"],
                             TrainOptions(ion_modes=["negative"]))
    assert only_neg.skipped["ion mode positive not requested"] == len(pos) + 3  # + the three odd positive ones


def test_train_bundle_both_modes(files):
    tmp_path, pos, neg = files
    options = TrainOptions(model=f"{FAKE_MODEL}:dim=32", lam="0.01|0.1")
    bundle, summary = train_bundle([tmp_path / "train_pos.mgf", tmp_path / "train_neg.mgf"], options,
                                   val_paths=[tmp_path / "val_pos.mgf"], progress=False)
    assert bundle.ion_modes == ["positive", "negative"]
    assert summary["models"]["positive"]["n_spectra"] == len(pos)
    assert summary["models"]["positive"]["validation"]["n_spectra"] == 12
    assert "kernel_loss" not in summary["models"]["negative"]["validation"]  # no negative validation data
    sub = bundle.for_mode("negative")
    assert sub.adducts[0] == "[M-H]-" and sub.info["training"]["n_structures"] == 12
    assert sub.info["selection"] == [{"lam": 0.01, "loss": pytest.approx(sub.model.selection_[0]["loss"])},
                                     {"lam": 0.1, "loss": pytest.approx(sub.model.selection_[1]["loss"])}]
    # the message says which modes the file has, not "use --ion-mode" to a user who gave it (QA)
    with pytest.raises(InputError, match=r"train_pos.mgf: no usable negative training spectra \(40 read; skipped: "
                                         r"39 ion mode positive not requested, 1 unreadable record \(non-numeric "
                                         r"peak\)\); the files have positive spectra: --ion-mode positive trains "
                                         r"them$"):
        train_bundle([tmp_path / "train_pos.mgf"], TrainOptions(model=FAKE_MODEL, ion_modes=["negative"]),
                     progress=False)


def test_build_model_errors():
    install_fake_model()
    with pytest.raises(SpecError, match="no parameter"):
        build_model(f"{FAKE_MODEL}:depth=3", {})
    with pytest.raises(SpecError, match="unknown model"):
        build_model("no-such-model", {})
    model = build_model(f"{FAKE_MODEL}:lam=0.1|1", {"lam": 5.0, "not_a_param": 1, "input_kernel": "ppk"})
    assert model.lam == "0.1|1" and model.input_kernel == "ppk"


def test_cli_train(files):
    tmp_path, pos, neg = files
    runner = CliRunner()
    result = runner.invoke(cli, ["train", str(tmp_path / "train_pos.mgf"), str(tmp_path / "train_neg.mgf"),
                                 "--val", str(tmp_path / "val_pos.mgf"), "--model", FAKE_MODEL, "--lam", "0.01|0.1",
                                 "--exclude-license", "NC", "--ion-mode", "both", "-o", str(tmp_path / "m"),
                                 "--summary-json", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.stderr and "licence excluded" in result.stderr
    assert "saved model bundle" in result.stderr
    bundle = ModelBundle.load(tmp_path / "m")
    meta = bundle.for_mode("positive").metadata
    assert meta["training"]["filters"]["exclude_licenses"] == ["NC"]
    assert meta["training"]["licenses"] == {"CC BY": sum("NC" not in s.metadata["license"] for s in pos)}
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["skipped"]["licence excluded"] > 0
    # bad inputs: not spectra, nothing usable, unknown model
    (tmp_path / "notes.txt").write_text("hello")
    result = runner.invoke(cli, ["train", str(tmp_path / "notes.txt"), "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "unknown spectra format" in result.stderr
    empty = tmp_path / "nostructure.mgf"
    write_mgf([Spectrum("a", mz=[50.0], intensities=[1.0], precursor_mz=100.0, charge=1, ion_mode="positive")],
              empty)
    result = runner.invoke(cli, ["train", str(empty), "--model", FAKE_MODEL, "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no usable training spectra" in result.stderr
    assert "no structure" in result.stderr
    result = runner.invoke(cli, ["train", str(tmp_path / "train_pos.mgf"), "--model", "deep-magic", "-o",
                                 str(tmp_path / "x")])
    assert result.exit_code == 2 and "unknown model 'deep-magic'" in result.stderr
    assert not (tmp_path / "x").exists()


def test_train_takes_the_models_own_defaults():
    """`train` asks the model: for spectra the constructor's defaults, for text the model's ``train_defaults``
    (sized to the data); the user's options win; the CLI help shows the default model's values."""
    from molpredict.models.dsokr import DSOKR, TEXT_ENCODER
    from molpredict.models.okr import SIOKR, SISOKR
    from molpredict.training.pipeline import DEFAULT_MODEL, model_defaults

    params = TrainOptions().component_params("spectrum", 10, 5)
    for name in ("input_kernel", "output_kernel", "input_sketch", "output_sketch", "lam"):
        assert params[name] == getattr(SISOKR(), name)
    assert TrainOptions(lam="0.5").component_params()["lam"] == "0.5"
    assert build_model("siokr", TrainOptions(model="siokr").component_params()).get_params() == SIOKR().get_params()
    small = TrainOptions(model="sisokr").component_params("text", 100, 30)
    assert (small["input_kernel"], small["input_sketch"], small["output_sketch"]) == ("text-ngram", "none", "none")
    assert build_model("sisokr", small).input_type == "text"
    large = model_defaults("sisokr", "text", 5000, 3000)
    assert (large["input_sketch"], large["output_sketch"]) == ("subsample:m=4000", "subsample:m=2000")
    text = build_model("dsokr", TrainOptions(model="dsokr").component_params("text", 100, 30))
    assert isinstance(text, DSOKR) and text.encoder == TEXT_ENCODER and text.output_sketch == "subsample:m=30"
    assert text.input_type == "text" and DSOKR().input_type == "spectrum"
    assert model_defaults("prior", "text", 10, 10) == model_defaults("prior")  # no output_kernel: nothing to add
    help_text = "".join(CliRunner().invoke(cli, ["train", "--help"]).output.split())  # click wraps long specs
    assert f"{DEFAULT_MODEL}:{SISOKR().input_kernel}" in help_text
    assert f"{DEFAULT_MODEL}:{SISOKR().lam}" in help_text


def test_training_names_no_model():
    """The training pipeline switches on no model name: what differs between models is asked of the model."""
    import inspect as _inspect
    import molpredict.training.pipeline as training
    source = _inspect.getsource(training)
    for name in ("dsokr", "iokr", "OKR_MODELS", "okr-robust"):
        assert f'"{name}"' not in source and f"'{name}'" not in source


def test_each_mode_trains_with_kernel_rows_on_workers(files, monkeypatch):
    """The model's fit and the scoring of each ion mode run inside one rows_on_workers block (closed after it)."""
    from contextlib import contextmanager

    import identification_helpers
    from molpredict.kernels import workers

    tmp_path, _, _ = files
    opened, seen_in_fit = [], []

    @contextmanager
    def recording(n_jobs=-1, min_pairs=workers.MIN_PAIRS):
        with workers.using_pool(workers.RowPool(2, min_pairs=min_pairs)) as pool:
            opened.append(pool)
            yield pool

    original_fit = identification_helpers.FingerprintRidge.fit

    def fit(self, *args, **kwargs):
        seen_in_fit.append(workers.active_row_pool())
        return original_fit(self, *args, **kwargs)

    monkeypatch.setattr(workers, "rows_on_workers", recording)
    monkeypatch.setattr(identification_helpers.FingerprintRidge, "fit", fit)
    train_bundle([tmp_path / "train_pos.mgf", tmp_path / "train_neg.mgf"], TrainOptions(model=FAKE_MODEL),
                 progress=False)
    assert len(opened) == 2 and seen_in_fit == opened  # one pool per mode, active while its model fits
    assert workers.active_row_pool() is None and all(p._executor is None for p in opened)
