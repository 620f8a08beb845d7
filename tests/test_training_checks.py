"""`molpredict train` refuses what it would misuse before reading the data (validation spectra of training
structures, bad lam or device values, an unwritable output) and says what a degenerate run did (few structures,
tied grid points, repeated spectra, the held-out selection, skipped text rows)."""
from __future__ import annotations

import warnings

import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, install_fake_model, synthetic_spectra
from molpredict.cli import cli
from molpredict.errors import InputError, ModelFileError, ResourceError, SpecError
from molpredict.io import write_mgf
from molpredict.training import pipeline
from molpredict.training.pipeline import MIN_STRUCTURES, TrainOptions, format_summary, train_bundle
from test_training import other_structures


@pytest.fixture
def data(tmp_path):
    install_fake_model()
    train, _ = synthetic_spectra(n_per=2, seed=0)
    write_mgf(train, tmp_path / "train.mgf")
    write_mgf(other_structures(n_per=1), tmp_path / "val.mgf")
    # one training structure (ethanol is not one; caffeine is) among new ones, one written as another SMILES
    overlap = other_structures(n_per=1, smiles=["CCCCO", "CN1C(=O)N(C)c2ncn(C)c2C1=O"])
    for s in overlap:
        s.metadata.pop("inchikey", None)
    write_mgf(overlap, tmp_path / "overlap.mgf")
    return tmp_path


def test_validation_of_training_structures_is_refused_before_fitting(data, monkeypatch):
    fitted = []
    monkeypatch.setattr(pipeline, "build_model", lambda *a, **k: fitted.append(1))
    with pytest.raises(InputError) as info:
        train_bundle([data / "train.mgf"], TrainOptions(model=FAKE_MODEL), val_paths=[data / "overlap.mgf"],
                     progress=False)
    message = str(info.value)
    assert message.startswith(f"{data / 'overlap.mgf'}: the positive validation spectra share 1 structure with the "
                              f"training spectra (first: RYYVLZVUVIJVGH)")  # caffeine, though written apart
    assert "validation needs other structures" in message and not fitted
    result = CliRunner().invoke(cli, ["train", str(data / "train.mgf"), "--val", str(data / "train.mgf"),
                                      "--model", FAKE_MODEL, "-o", str(data / "m")])
    assert result.exit_code == 2 and "share 12 structures with the training spectra" in result.output
    assert not (data / "m").exists()


def test_the_properties_pipeline_refuses_with_the_same_words():
    from molpredict.models.distinct import refuse_shared_structures

    refuse_shared_structures({"A", "B"}, {"C"})
    with pytest.raises(InputError, match=r"^the validation spectra share 2 structures with the training spectra "
                                         r"\(first: A\); validation needs other structures$"):
        refuse_shared_structures({"A", "B"}, {"B", "A"})


@pytest.mark.parametrize("lam", ["abc", "0", "nan", "-1", "0.1|x", "inf", ""])
def test_bad_lam_is_refused_before_the_data_is_read(lam, tmp_path, monkeypatch):
    install_fake_model()
    read = []
    monkeypatch.setattr(pipeline, "load_labelled", lambda *a, **k: read.append(1))
    with pytest.raises(SpecError, match="lam must be positive numbers"):
        train_bundle([tmp_path / "missing.mgf"], TrainOptions(model=FAKE_MODEL, lam=lam), progress=False)
    with pytest.raises(SpecError, match="lam must be positive numbers"):
        train_bundle([tmp_path / "missing.mgf"], TrainOptions(model=f"{FAKE_MODEL}:lam={lam or 'x'}"),
                     progress=False)
    assert not read


def test_good_lam_values_pass_the_check():
    for lam in ("1e-3", "0.01|0.1", 0.5, [0.1, 1.0]):
        pipeline.check_train_options(TrainOptions(lam=lam, device="cpu"))


def test_bad_device_is_refused_before_the_data_is_read(data, monkeypatch):
    import torch

    install_fake_model()
    read = []
    monkeypatch.setattr(pipeline, "load_labelled", lambda *a, **k: read.append(1))
    with pytest.raises(SpecError, match="'gpu' is not a device name"):
        train_bundle([data / "train.mgf"], TrainOptions(model=FAKE_MODEL, device="gpu"), progress=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ResourceError, match="no CUDA device"):
        train_bundle([data / "train.mgf"], TrainOptions(model=FAKE_MODEL, device="cuda"), progress=False)
    assert not read
    result = CliRunner().invoke(cli, ["train", str(data / "train.mgf"), "--model", FAKE_MODEL, "--lam", "0",
                                      "-o", str(data / "m")])
    assert result.exit_code == 2 and "--lam: lam must be positive numbers" in result.output and not read


def test_an_unwritable_output_is_refused_before_the_data_is_read(data, monkeypatch):
    import tempfile

    import molpredict

    read = []
    monkeypatch.setattr(pipeline, "load_labelled", lambda *a, **k: read.append(1))
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    result = CliRunner().invoke(cli, ["train", str(data / "train.mgf"), "--model", FAKE_MODEL,
                                      "-o", str(data / "ro" / "m")])
    assert result.exit_code == 4 and "cannot write in" in result.output and not read
    with pytest.raises(ModelFileError, match="cannot write in"):
        molpredict.train(str(data / "train.mgf"), output=data / "ro" / "m", model=FAKE_MODEL)
    assert not read


def _warnings_of(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in caught]


def test_few_structures_ties_and_duplicates_are_warned(tmp_path):
    install_fake_model()
    spectra, _ = synthetic_spectra(n_per=1, seed=0)
    few = spectra[:3]
    write_mgf(few + few[:2], tmp_path / "few.mgf")  # 3 structures, 2 spectra repeated
    write_mgf(other_structures(n_per=1)[:2], tmp_path / "val.mgf")
    (_, summary), said = _warnings_of(lambda: train_bundle(
        [tmp_path / "few.mgf"], TrainOptions(model=FAKE_MODEL, lam="0.1|1"), val_paths=[tmp_path / "val.mgf"],
        progress=False))
    assert any(f"positive: the training spectra hold 3 distinct structures (fewer than {MIN_STRUCTURES})" in w
               for w in said), said
    assert any("positive: 2 training spectra repeat another (same structure, precursor and peaks)" in w
               for w in said), said
    assert not any("tie" in w for w in said), said  # the fake model's two points differ


def test_a_tied_grid_is_warned(monkeypatch):
    class Tied:
        selection_ = {"source": "val", "best": 0, "select_by": "kernel-loss",
                      "points": [{"lam": 0.1, "val_loss": 0.5}, {"lam": 1.0, "val_loss": 0.5}]}

    _, said = _warnings_of(lambda: pipeline._warn_tied_grid(Tied(), "positive"))
    assert said == ["positive: the 2 grid points tie on the validation loss (0.5): the first (lam 0.1) was kept; "
                    "the data cannot choose"]
    Tied.selection_["points"][1]["val_loss"] = 0.4
    assert _warnings_of(lambda: pipeline._warn_tied_grid(Tied(), "positive"))[1] == []


def test_the_held_out_selection_is_reported(tmp_path):
    """Without --val a grid is chosen on held-out training structures: the log and the summary say on how many and
    what loss it got."""
    install_fake_model()
    spectra, _ = synthetic_spectra(n_per=2, seed=0)
    write_mgf(spectra, tmp_path / "train.mgf")
    said: list[str] = []
    # the fake model is no grid searcher: the sisokr of the CLI, small
    options = TrainOptions(model="sisokr", input_kernel="cosine", input_sketch="subsample:m=10",
                           output_sketch="subsample:m=10", lam="0.01|0.1", device="cpu", fragments=False,
                           prior="none")
    (_, summary), caught = _warnings_of(lambda: train_bundle([tmp_path / "train.mgf"], options, progress=False,
                                                             log=said.append))
    # one held-out structure, far from every training one: both lam values get the worst loss, 1
    assert any(w.startswith("positive: the 2 grid points tie on the held-out loss (1)") for w in caught), caught
    held = summary["models"]["positive"]["held_out_selection"]
    assert held["n_structures"] == 1 and held["n_spectra"] == 2 and held["fraction"] == 0.1  # round(10% of 12)
    line = next(m for m in said if "held out" in m)
    assert line.startswith("positive: no validation spectra: the grid point was chosen on 2 training spectra of 1 "
                           "structures held out (10% of them), kernel loss ")
    assert "held-out selection: kernel loss" in format_summary(summary)


def test_skipped_text_rows_are_counted_and_warned(tmp_path):
    rows = ["description\tsmiles"] + [f"compound number {i}\tCCO" if i % 2 else f"compound number {i}\tC1CC(C"
                                      for i in range(16)] + [f"aromatic alcohol {i}\tc1ccccc1O" for i in range(4)]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    said: list[str] = []
    (_, summary), caught = _warnings_of(lambda: train_bundle(
        [tmp_path / "pairs.tsv"], TrainOptions(device="cpu"), progress=False, log=said.append))
    assert sum(m.startswith("skipped ") for m in said) == 5
    assert "... and 3 more skipped training rows (summary: skipped_rows)" in said
    assert [w for w in caught if "training rows skipped" in w] == [
        f"8 training rows skipped (first: {tmp_path / 'pairs.tsv'}, line 2, field smiles: "
        f"{summary['skipped_rows'][0]['reason']})"]
