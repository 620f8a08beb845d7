"""Model bundles: round trip, metadata, no pickle, and one-line errors for missing / corrupted / unknown parts."""
from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pytest

from identification_helpers import FAKE_MODEL, FingerprintRidge, install_fake_model, synthetic_spectra
from molpredict.errors import ModelFileError, PluginError
from molpredict.cache import file_sha256, known_file_sha256
from molpredict.modelfile import (FORMAT_VERSION, ModelBundle, SubModel, default_bundle_path, home_dir, map_tensors,
                                  model_components)
from molpredict.registry import get_registry, reset_registry


@pytest.fixture
def bundle_dir(tmp_path):
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=2)
    model = get_registry().create("model", f"{FAKE_MODEL}:dim=64", lam="0.1|1",
                                  input_kernel="ppk:mz_sigma=0.005", output_sketch="subsample:m=10")
    model.fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning={"steps": []}, adducts=["[M+H]+", "[M+Na]+"],
                   info={"training": {"sha256": "abc", "licenses": {"CC BY": 12, "CC BY-NC": 12}},
                         "validation": {"loss": 0.5}})
    path = ModelBundle({"positive": sub}).save(tmp_path / "bundle")
    return path, model, spectra


def test_round_trip(bundle_dir):
    path, model, spectra = bundle_dir
    assert sorted(p.name for p in path.iterdir()) == ["bundle.json", "positive"]
    # no pickle anywhere: only JSON and safetensors files
    assert sorted(p.name for p in (path / "positive").iterdir()) == ["metadata.json", "tensors.safetensors"]
    loaded = ModelBundle.load(path)
    assert loaded.ion_modes == ["positive"] and loaded.for_mode("negative") is None
    sub = loaded.for_mode("positive")
    assert isinstance(sub.model, FingerprintRidge)
    np.testing.assert_array_equal(sub.model.predict_coordinates(spectra), model.predict_coordinates(spectra))
    assert sub.model.coordinates_key() == model.coordinates_key()
    assert sub.adducts == ["[M+H]+", "[M+Na]+"] and sub.cleaning == {"steps": []}
    meta = sub.metadata
    assert meta["format_version"] == FORMAT_VERSION and meta["molpredict_version"]
    assert meta["model"]["name"] == FAKE_MODEL and meta["model"]["params"]["lam"] == "0.1|1"
    kinds = {(c["kind"], c["name"]) for c in meta["components"]}
    assert {("model", FAKE_MODEL), ("input_kernel", "ppk"), ("sketch", "subsample")} <= kinds
    assert meta["training"]["licenses"] == {"CC BY": 12, "CC BY-NC": 12}
    assert meta["validation"] == {"loss": 0.5} and meta["created"].endswith("Z")
    assert len(meta["tensors"]["sha256"]) == 64


def test_model_components_handles_grids_of_names():
    m = FingerprintRidge(input_kernel="ppk|cosine", output_kernel="gaussian-tanimoto:gamma=0.5|1")
    m.registry_name = FAKE_MODEL
    names = [(c["kind"], c["name"]) for c in model_components(m)]
    assert names == [("model", FAKE_MODEL), ("input_kernel", "ppk"), ("input_kernel", "cosine"),
                     ("output_kernel", "gaussian-tanimoto")]


def test_overwrite_bundle_but_never_other_directories(bundle_dir, tmp_path):
    path, model, _ = bundle_dir
    sub = ModelBundle.load(path).for_mode("positive")
    ModelBundle({"negative": SubModel(sub.model, "negative")}).save(path)  # replacing a bundle is fine
    assert ModelBundle.load(path).ion_modes == ["negative"]
    other = tmp_path / "precious"
    other.mkdir()
    (other / "thesis.txt").write_text("do not delete")
    with pytest.raises(ModelFileError, match="not a model bundle"):
        ModelBundle({"positive": sub}).save(other)
    assert (other / "thesis.txt").read_text() == "do not delete"


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def test_missing_and_not_a_bundle(tmp_path):
    with pytest.raises(ModelFileError, match="not found") as e:
        ModelBundle.load(tmp_path / "nope")
    _one_line(e)
    (tmp_path / "file.mgf").write_text("BEGIN IONS\nEND IONS\n")
    with pytest.raises(ModelFileError, match="not a model bundle"):
        ModelBundle.load(tmp_path / "file.mgf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match="bundle.json"):
        ModelBundle.load(tmp_path / "empty")


def test_truncated_metadata(bundle_dir):
    path, _, _ = bundle_dir
    meta = path / "positive" / "metadata.json"
    meta.write_bytes(meta.read_bytes()[:100])
    with pytest.raises(ModelFileError, match="corrupted or truncated") as e:
        ModelBundle.load(path)
    assert "metadata.json" in _one_line(e)


def test_truncated_tensors(bundle_dir):
    path, _, _ = bundle_dir
    tensors = path / "positive" / "tensors.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-40])
    with pytest.raises(ModelFileError, match="truncated") as e:
        ModelBundle.load(path)
    _one_line(e)


def test_corrupted_tensors_same_size(bundle_dir):
    path, _, _ = bundle_dir
    tensors = path / "positive" / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-8] ^= 0xFF
    tensors.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="SHA-256"):
        ModelBundle.load(path)


def test_garbage_tensors_without_checksum(bundle_dir):
    path, _, _ = bundle_dir
    meta_path = path / "positive" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    del meta["tensors"]["sha256"], meta["tensors"]["n_bytes"]
    meta_path.write_text(json.dumps(meta))
    (path / "positive" / "tensors.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelFileError, match="unreadable tensors file") as e:
        ModelBundle.load(path)
    _one_line(e)


def test_corrupted_after_a_load_is_still_caught(bundle_dir):
    """The tensors' hash is remembered by the file's stat after a load; rewriting the file (same size) invalidates
    it, so the next load hashes again and sees the damage."""
    path, _, _ = bundle_dir
    ModelBundle.load(path)
    tensors = path / "positive" / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-8] ^= 0xFF
    tensors.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="SHA-256"):
        ModelBundle.load(path)


def test_known_file_sha256_remembers_until_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    target = tmp_path / "data.bin"
    target.write_bytes(b"a" * 1000)
    assert known_file_sha256(target) == file_sha256(target)
    records = list((tmp_path / "home" / "cache" / "hashes").iterdir())
    assert len(records) == 1
    # a forged record for the same stat is believed (that is the point: the file is not read again) ...
    record = json.loads(records[0].read_text())
    records[0].write_text(json.dumps({**record, "sha256": "remembered"}))
    assert known_file_sha256(target) == "remembered"
    # ... until the file is written: new content of the same size is hashed again
    target.write_bytes(b"b" * 1000)
    assert known_file_sha256(target) == file_sha256(target) != record["sha256"]


def test_map_tensors_reads_what_safetensors_wrote(tmp_path):
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    arrays = {"f64": rng.standard_normal((7, 3)), "f32": rng.standard_normal(5).astype(np.float32),
              "i64": np.arange(-3, 9, dtype=np.int64), "u8": np.arange(10, dtype=np.uint8).reshape(2, 5),
              "i8": np.array([-128, 0, 127], dtype=np.int8), "b": np.array([True, False, True]),
              "empty": np.zeros((0, 4)), "u64": np.array([2**63 + 5], dtype=np.uint64)}
    path = tmp_path / "t.safetensors"
    save_file(arrays, str(path))
    mapped, reference = map_tensors(path), load_file(str(path))
    assert set(mapped) == set(arrays)
    for name, array in arrays.items():
        assert mapped[name].dtype == array.dtype and mapped[name].shape == array.shape, name
        np.testing.assert_array_equal(mapped[name], array)
        np.testing.assert_array_equal(mapped[name], reference[name])
    assert not mapped["f64"].flags.owndata  # a view of the mapping, not a copy
    before = path.read_bytes()
    mapped["f64"][0, 0] = 123.0  # copy on write: the file is never modified
    assert path.read_bytes() == before
    path.write_bytes(before[:-4])
    with pytest.raises(ModelFileError, match="unreadable tensors file"):
        map_tensors(path)


def test_missing_tensors_file(bundle_dir):
    path, _, _ = bundle_dir
    (path / "positive" / "tensors.safetensors").unlink()
    with pytest.raises(ModelFileError, match="missing"):
        ModelBundle.load(path)


def test_unknown_model_name_asks_for_plugin(bundle_dir):
    path, _, _ = bundle_dir
    reset_registry()  # built-ins only: the test model's plugin is gone
    with pytest.raises(PluginError) as e:
        ModelBundle.load(path)
    text = _one_line(e)
    assert FAKE_MODEL in text and "install the plugin" in text


def _add_component(path, kind: str, name: str) -> None:
    """Make the saved positive model name a component ``name`` of ``kind`` (one no plugin registers)."""
    meta_path = path / "positive" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["components"].append({"kind": kind, "name": name, "spec": name})
    meta_path.write_text(json.dumps(meta))


def test_unknown_component_name_asks_for_plugin(bundle_dir):
    path, _, _ = bundle_dir
    _add_component(path, "output_kernel", "quantum-fingerprint")
    with pytest.raises(PluginError) as e:
        ModelBundle.load(path)
    text = _one_line(e)
    assert "output kernel 'quantum-fingerprint'" in text and "install the plugin" in text


_LOAD_HINT = "load its plugin file with molpredict.load_plugins({}) in Python or --plugins-dir {} on the command line"


def test_an_unregistered_component_says_how_to_load_its_plugin(bundle_dir, tmp_path, monkeypatch):
    """A plugin kernel whose plugin file was not loaded: the message said to install a plugin only, not how a
    plugins-directory file is loaded (from Python or on the command line)."""
    import warnings

    import molpredict

    path, _, _ = bundle_dir
    _add_component(path, "input_kernel", "quantum-ppk")
    with pytest.raises(PluginError) as e:
        molpredict.load_model(path)
    text = _one_line(e)
    assert e.value.exit_code == 3 and "input kernel 'quantum-ppk'" in text and "install the plugin" in text
    assert text.endswith(_LOAD_HINT.format("DIRECTORY", "DIRECTORY")), text
    # a plugins directory named after the registry was built (read once): the hint names it
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    get_registry()
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", str(plugins))
    with warnings.catch_warnings(), pytest.raises(PluginError) as e:
        warnings.simplefilter("ignore")  # the registry's own warning about the late variable
        ModelBundle.load(path)
    assert _one_line(e).endswith(_LOAD_HINT.format(repr(str(plugins)), plugins)), str(e.value)


def test_a_component_missing_from_the_model_state_says_how_to_load_its_plugin(bundle_dir, monkeypatch):
    """The same hint where the model's own state names the component (an mkl sub-kernel, a fitted kernel)."""
    from molpredict.errors import SpecError

    path, _, _ = bundle_dir

    def unknown(cls, arrays, state):
        raise SpecError("unknown input kernel 'quantum-ppk'; valid names: ppk")

    monkeypatch.setattr(FingerprintRidge, "from_state", classmethod(unknown))
    with pytest.raises(PluginError) as e:
        ModelBundle.load(path)
    text = _one_line(e)
    assert "needs a component that is not registered (unknown input kernel 'quantum-ppk'" in text
    assert text.endswith("install the plugin that provides it or " + _LOAD_HINT.format("DIRECTORY", "DIRECTORY"))


def test_newer_format_and_inconsistent_state(bundle_dir):
    path, _, _ = bundle_dir
    head = json.loads((path / "bundle.json").read_text())
    head["format_version"] = FORMAT_VERSION + 1
    (path / "bundle.json").write_text(json.dumps(head))
    with pytest.raises(ModelFileError, match="newer"):
        ModelBundle.load(path)
    # bundles written before the text sub-model (format 1) still load
    for name in ("bundle.json", "positive/metadata.json"):
        meta = json.loads((path / name).read_text())
        meta["format_version"] = 1
        (path / name).write_text(json.dumps(meta))
    assert ModelBundle.load(path).ion_modes == ["positive"]
    head["format_version"] = FORMAT_VERSION
    (path / "bundle.json").write_text(json.dumps(head))
    meta_path = path / "positive" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["state"]["params"]["n_bins"] = 7  # does not match the stored tensor
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ModelFileError, match="inconsistent"):
        ModelBundle.load(path)


def test_default_location_honours_molpredict_home(monkeypatch, tmp_path):
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    assert home_dir() == tmp_path / "home"
    assert default_bundle_path() == tmp_path / "home" / "models" / "default"
    monkeypatch.delenv("MOLPREDICT_HOME")
    assert default_bundle_path().parts[-3:] == ("molpredict", "models", "default")


def test_a_bundle_written_before_the_stage_layout_loads_and_scores_the_same():
    """tests/fixtures/bundles/sisokr_v0.2 was saved by molpredict 0.2 (modules at the top level): registry names and
    state formats make it independent of where the classes live; the scores it gave then are in the JSON."""
    import json as _json

    from molpredict.chem.molecules import Molecule
    from molpredict.io import read_spectra

    here = Path(__file__).parent / "fixtures" / "bundles"
    expected = _json.loads((here / "sisokr_v0.2_expected.json").read_text())
    sub = ModelBundle.load(here / "sisokr_v0.2").for_mode("positive")
    queries = list(read_spectra(here / "sisokr_v0.2_queries.mgf"))
    scores = sub.model.score(queries, [Molecule.from_smiles(s) for s in expected["candidates"]])
    np.testing.assert_allclose(scores, np.asarray(expected["scores"]), rtol=1e-9, atol=1e-12)


def test_describe_says_when_the_selection_used_another_metric_than_select_by(tmp_path):
    """`model info`: an IOKR model's select_by (mrr by default) chose nothing when training had no validation
    candidate sets (selection.select_by kernel-loss); showing it bare read as if it had (QA). The saved file keeps
    the parameter as given."""
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=2)
    model = get_registry().create("model", f"{FAKE_MODEL}:dim=64", lam="0.1")
    model.fit(spectra, molecules)

    def described(selection):
        sub = SubModel(model=model, ion_mode="positive", cleaning={"steps": []}, adducts=["[M+H]+"],
                       info={"selection": selection})
        path = ModelBundle({"positive": sub}).save(tmp_path / "bundle")
        meta_path = path / "positive" / "metadata.json"
        meta = json.loads(meta_path.read_text())
        meta["model"]["params"]["select_by"] = "mrr"  # as the IOKR family saves its parameters
        meta_path.write_text(json.dumps(meta))
        out = ModelBundle.load(path).describe()["positive"]
        assert json.loads(meta_path.read_text())["model"]["params"]["select_by"] == "mrr"  # describe changes no file
        return out

    unused = described({"source": "held-out", "points": [], "best": 0, "select_by": "kernel-loss"})
    assert unused["model"]["params"]["select_by"] == ("mrr (not used: the selection used kernel-loss, no validation "
                                                      "candidate sets were given)")
    assert unused["selection"]["select_by"] == "kernel-loss"
    used = described({"source": "val", "points": [], "best": 0, "select_by": "mrr"})
    assert used["model"]["params"]["select_by"] == "mrr"
