"""Saving models: a failed write (a full disk inside safetensors) is a one-line ModelFileError that leaves no partial
folder, temporaries of killed runs are cleared, the old model survives a failed replace, and the tensors files get
the umask's permissions like the JSON beside them."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, install_fake_model, synthetic_spectra
from molpredict.errors import ModelFileError
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.registry import get_registry

DISK_FULL = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'


def _bundle(with_prior: bool = False) -> ModelBundle:
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=1)
    model = get_registry().create("model", f"{FAKE_MODEL}:dim=16", lam=0.1).fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning={"steps": []}, adducts=["[M+H]+"])
    if with_prior:
        from molpredict.training.pipeline import build_model
        sub.prior = build_model("prior", {}).fit(spectra, molecules)
    return ModelBundle({"positive": sub})


def _property_bundle():
    from molpredict.properties.model import PropertyBundle, PropertyPredictor
    from molpredict.properties.pipeline import label_spectra
    from molpredict.properties.targets import PROPERTY_NAMES
    from molpredict.registry import create
    from test_properties import SMILES, _spectra

    spectra, Y = label_spectra(_spectra(0, 2, structures=SMILES[:10]), [])
    regressor = create("regressor", "lipschitz", levels="0.1+0.5+0.9", lam="1e-2", sketch="subsample:m=10",
                       input_kernel="cosine", device="cpu")
    return PropertyBundle({"positive": PropertyPredictor(regressor, PROPERTY_NAMES).fit(spectra, Y)})


def _disk_full(*args, **kwargs):
    from safetensors import SafetensorError
    raise SafetensorError(DISK_FULL)


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.mark.parametrize("kind", ["bundle", "properties"])
def test_a_full_disk_is_one_line_and_leaves_no_partial_folder(kind, tmp_path, monkeypatch):
    import safetensors.numpy

    bundle = _bundle() if kind == "bundle" else _property_bundle()
    target = tmp_path / "model"
    bundle.save(target)
    before = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    monkeypatch.setattr(safetensors.numpy, "save_file", _disk_full)
    with pytest.raises(ModelFileError) as info:
        bundle.save(target)
    message = str(info.value)
    assert message == f"{target}: could not write the {'model bundle' if kind == 'bundle' else 'property model'}: " \
                      f"No space left on device"
    assert info.value.exit_code == 4 and "\n" not in message
    assert _leftovers(tmp_path) == []
    # the model that was there is untouched
    assert {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()} == before


def test_cli_save_failure_is_a_model_file_error(tmp_path, monkeypatch):
    """`molpredict train` on a full disk: exit 4 and one line, not an internal error."""
    import safetensors.numpy
    from molpredict.cli import cli
    from molpredict.io import write_mgf

    install_fake_model()
    spectra, _ = synthetic_spectra(n_per=2)
    write_mgf(spectra, tmp_path / "train.mgf")
    monkeypatch.setattr(safetensors.numpy, "save_file", _disk_full)
    result = CliRunner().invoke(cli, ["train", str(tmp_path / "train.mgf"), "--model", FAKE_MODEL, "--lam", "0.1",
                                      "-o", str(tmp_path / "m"), "-q"])
    assert result.exit_code == 4, result.output
    assert "could not write the model bundle: No space left on device" in result.output
    assert "internal error" not in result.output and _leftovers(tmp_path) == [] and not (tmp_path / "m").exists()


@pytest.mark.parametrize("kind", ["bundle", "properties"])
def test_stale_temporaries_of_killed_runs_are_removed(kind, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".model.tmp-{dead_pid}"
        running = tmp_path / f".model.tmp-{live.pid}"
        other = tmp_path / f".another.tmp-{dead_pid}"
        for folder in (stale, running, other):
            (folder / "positive").mkdir(parents=True)
            (folder / "positive" / "tensors.safetensors").write_bytes(b"partial")
        bundle = _bundle() if kind == "bundle" else _property_bundle()
        bundle.save(tmp_path / "model")
        assert not stale.exists()  # its run was killed: nobody will finish it
        assert running.exists() and other.exists()  # a run still saving, another model's temporary
    finally:
        live.kill()
        live.wait()


def test_a_set_aside_model_of_a_killed_run_is_put_back_or_removed(tmp_path):
    """A run killed between the two renames left the previous model under .NAME.old-PID: with no model at the
    path it is the only copy (put back, then replaced as usual); beside a model it is removed."""
    dead_pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True, check=True).stdout)
    bundle = _bundle()
    old = tmp_path / f".model.old-{dead_pid}"
    bundle.save(old)
    bundle.save(tmp_path / "model")
    assert not old.exists() and ModelBundle.load(tmp_path / "model").ion_modes == ["positive"]
    bundle.save(old)
    bundle.save(tmp_path / "model")  # a model is there: the set-aside one is stale
    assert _leftovers(tmp_path) == []


def test_property_save_keeps_the_old_model_when_the_rename_fails(tmp_path, monkeypatch):
    """The old property model is set aside, not deleted, until the new one is in place."""
    import molpredict.modelfile as modelfile

    bundle = _property_bundle()
    target = tmp_path / "props"
    bundle.save(target)
    before = (target / "properties.json").read_text()

    def failing(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(modelfile, "replace_atomically", failing)
    with pytest.raises(ModelFileError, match="No space left on device"):
        bundle.save(target)
    assert (target / "properties.json").read_text() == before and _leftovers(tmp_path) == []


def _modes(folder) -> dict[str, int]:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_tensors_get_the_umask_permissions(tmp_path, umask_022):
    """Under umask 022 every file of a bundle (its priors' too), a property model and `model upgrade`'s output
    is 0644: a model shared with a group can be loaded by it."""
    from molpredict.cli import cli

    path = _bundle(with_prior=True).save(tmp_path / "bundle")
    modes = _modes(path)
    assert "positive/tensors.safetensors" in modes and "positive/prior/tensors.safetensors" in modes
    assert set(modes.values()) == {0o644}, modes
    props = _property_bundle().save(tmp_path / "props")
    assert set(_modes(props).values()) == {0o644}, _modes(props)
    result = CliRunner().invoke(cli, ["model", "upgrade", str(path), "-o", str(tmp_path / "upgraded"), "-q"])
    assert result.exit_code == 0, result.output
    assert set(_modes(tmp_path / "upgraded").values()) == {0o644}


def test_tensors_follow_a_stricter_umask(tmp_path):
    previous = os.umask(0o077)
    try:
        path = _bundle().save(tmp_path / "bundle")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((path / "positive" / "tensors.safetensors").stat().st_mode) == 0o600


def test_an_unwritable_output_folder_is_refused_before_training(tmp_path, monkeypatch):
    """`-o` where nothing can be written fails at the check (before the data is read), not at the save."""
    import tempfile

    from molpredict.modelfile import check_bundle_output
    from molpredict.properties.model import check_output_dir

    with pytest.raises(ModelFileError, match="is not a folder"):
        (tmp_path / "afile").write_text("x")
        check_bundle_output(tmp_path / "afile" / "sub" / "model")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # root writes anywhere: a read-only folder, simulated
    for check in (check_bundle_output, check_output_dir):
        with pytest.raises(ModelFileError, match=r"cannot write in .*\(Permission denied\)"):
            check(tmp_path / "ro" / "model")
    assert not (tmp_path / "ro").exists()
