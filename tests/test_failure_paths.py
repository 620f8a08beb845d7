"""Recovery and refusal: the failure paths a reviewer asks about, each with a test that fails when the path
breaks (DSOKR early stopping that fires, damaged coordinate stores and concurrent writers, damaged or foreign
model bundles and a failed save, corrupted OKR state and bad inputs, per-structure metrics by hand)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from molpredict.identification.coordinates_cache import CoordinatesCache
from molpredict.errors import InputError, ModelFileError, MolpredictError, SpecError
from molpredict.identification.evaluate import summarize_ranks
from molpredict.chem.molecules import Molecule
from conftest import child_pythonpath


# -- DSOKR: early stopping that really stops, with the best weights restored -------------------------------------

def test_dsokr_early_stopping_fires_and_restores_the_best_epoch(one_torch_thread):
    from dsokr_helpers import install_synthetic_registry, synthetic_pairs
    from molpredict.models.dsokr import DSOKR
    from molpredict.models.losses import squared_distance

    install_synthetic_registry()
    (x, y), (xv, yv) = synthetic_pairs(300, 0), synthetic_pairs(80, 1)
    # validation structures shuffled against their inputs: what the network learns from the training pairs
    # stops helping after a few epochs, the validation loss rises and training must stop
    yv_shuffled = [yv[i] for i in np.random.default_rng(0).permutation(len(yv))]
    params = dict(encoder="test-vec", output_kernel="test-rbf:gamma=0.5", output_sketch="subsample:m=80", lr=3e-2,
                  batch_size=32, device="cpu", seed=0)
    model = DSOKR(epochs=20, patience=2, val_metric="loss", **params).fit(x, y, val=(xv, yv_shuffled))
    history = model.history_[0]
    best = history["best_epoch"]
    assert len(history["val"]) == best + 1 + 2 < 20  # stopped 2 epochs after the best one
    assert history["val"][best] == min(history["val"]) < history["val"][-1]
    # the kept network is the best epoch's, not the last one's
    basis = model.bases_[0]
    g = torch.as_tensor(model.member_predictions(xv)[0], dtype=torch.float32)
    loss = squared_distance(g, torch.as_tensor(basis.coordinates(yv_shuffled), dtype=torch.float32), 1.0).mean()
    assert float(loss) == pytest.approx(history["val"][best], rel=1e-5)
    assert float(loss) < history["val"][-1] * 0.99
    # and it is the network of a run trained for exactly best + 1 epochs (same seed, same batches)
    short = DSOKR(epochs=best + 1, patience=2, val_metric="loss", **params).fit(x, y)
    np.testing.assert_allclose(model.member_predictions(xv)[0], short.member_predictions(xv)[0], rtol=1e-5,
                               atol=1e-6)


# -- the coordinates store ------------------------------------------------------------------------------------

class Featurizer:
    def __init__(self, dim=4):
        self.dim = dim
        self.asked: list[str] = []

    def __call__(self, molecules):
        keys = [m.smiles for m in molecules]
        self.asked += keys
        return np.array([[(len(k) * 7 + j) % 11 / 3.0 for j in range(self.dim)] for k in keys])


def mols(n, offset=0):
    return [Molecule("C" * (i + 1 + offset), inchikey=f"KEY{i + offset:05d}-X-N") for i in range(n)]


def test_corrupted_store_metadata_is_one_clear_error(tmp_path):
    CoordinatesCache(tmp_path, "k", encoding="float64").get(mols(3), Featurizer())
    meta = tmp_path / "k" / "store.json"
    for damage in ("{not json", json.dumps({"layout_version": 2, "dim": 4}), json.dumps([1, 2]),
                   json.dumps({"layout_version": 99, "key": "k", "dim": 4, "encoding": "float64"})):
        meta.write_text(damage)
        with pytest.raises(ModelFileError) as info:
            CoordinatesCache(tmp_path, "k")
        message = str(info.value)
        assert str(meta) in message and "\n" not in message and "delete" in message


def test_a_damaged_scale_array_is_detected_and_recomputed(tmp_path):
    cache = CoordinatesCache(tmp_path, "k")
    expected = cache.get(mols(6), Featurizer(), block_size=3)
    victims = sorted(p for p in (tmp_path / "k" / "segments").rglob("*") if p.is_file() and "/scale/c" in str(p))
    data = bytearray(victims[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    victims[0].write_bytes(bytes(data))
    f = Featurizer()
    np.testing.assert_array_equal(CoordinatesCache(tmp_path, "k").get(mols(6), f), expected)
    assert len(f.asked) == 3  # the damaged segment's block only


def test_a_segment_shorter_than_its_commit_record_is_recomputed(tmp_path):
    """Data shorter than the index: the commit record lists more keys than the arrays hold rows."""
    cache = CoordinatesCache(tmp_path, "k", encoding="float64")
    expected = cache.get(mols(4), Featurizer(), block_size=2)
    record = sorted((tmp_path / "k" / "commits").iterdir())[0]
    keys = json.loads(record.read_text())["keys"]
    record.write_text(json.dumps({"keys": keys + ["smiles:CCCCCCCCCCCC"]}))  # one row more than stored
    f = Featurizer()
    fresh = CoordinatesCache(tmp_path, "k")
    extra = Molecule("CCCCCCCCCCCC", inchikey="KEY09999-X-N")
    out = fresh.get(mols(4) + [extra], f)
    np.testing.assert_array_equal(out[:4], expected)
    np.testing.assert_array_equal(out[4:], Featurizer()([extra]))
    assert sorted(f.asked) == sorted([m.smiles for m in mols(2)] + [extra.smiles])


def test_a_gap_in_an_old_layout_index_keeps_only_what_precedes_it(tmp_path):
    from molpredict.identification.coordinates_cache import _layout_1_keys

    index = tmp_path / "index"
    index.mkdir()
    (index / "seg-000000000001.json").write_text(json.dumps({"seq": 1, "start": 0, "keys": ["a", "b"]}))
    (index / "seg-000000000003.json").write_text(json.dumps({"seq": 3, "start": 5, "keys": ["e"]}))  # 2 lost
    assert _layout_1_keys(index) == ["a", "b"]


WRITER = """
import sys
import numpy as np
from molpredict.identification.coordinates_cache import CoordinatesCache
root, offset, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cache = CoordinatesCache(root, "k", encoding="float64")
keys = ["smiles:" + "C" * (i + offset + 1) for i in range(n)]  # as molecule_key keys mols(): by SMILES
for start in np.random.default_rng(seed).permutation(np.arange(0, n, 3)):
    block = keys[start:start + 3]
    smiles = [k[len("smiles:"):] for k in block]
    cache.append(block, np.array([[(len(s) * 7 + j) % 11 / 3.0 for j in range(4)] for s in smiles]))
"""


def test_two_processes_writing_at_once(tmp_path):
    """Two processes append overlapping blocks to one store at the same time; every key ends up stored once,
    with its value."""
    import os
    import subprocess
    import sys

    from conftest import PROJECT_ROOT

    env = {**os.environ, "PYTHONPATH": child_pythonpath(PROJECT_ROOT)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(offset), "30", str(seed)], env=env)
               for offset, seed in ((0, 1), (15, 2))]  # keys 0-29 and 15-44: 15 shared
    for p in writers:
        assert p.wait(timeout=120) == 0
    cache = CoordinatesCache(tmp_path, "k")
    everything = mols(45)
    assert len(cache) == 45
    f = Featurizer()
    np.testing.assert_array_equal(cache.get(everything, f), Featurizer()(everything))
    assert f.asked == []


# -- model bundles --------------------------------------------------------------------------------------------

@pytest.fixture
def bundle_dir(tmp_path):
    from identification_helpers import FAKE_MODEL, install_fake_model, synthetic_spectra
    from molpredict.modelfile import ModelBundle, SubModel
    from molpredict.training.pipeline import build_model

    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=1)
    model = build_model(FAKE_MODEL, {"lam": "0.1"}).fit(spectra, molecules)
    bundle = ModelBundle({"positive": SubModel(model=model, ion_mode="positive", cleaning={"steps": []})})
    return bundle.save(tmp_path / "bundle"), bundle


@pytest.mark.parametrize("damage, match", [
    (lambda text: text[: len(text) // 2], "corrupted or truncated model bundle"),
    (lambda text: "", "corrupted or truncated model bundle"),
    (lambda text: "\x00\x01garbage", "corrupted or truncated model bundle"),
    (lambda text: "[1, 2, 3]", "not a JSON object"),
    (lambda text: text.replace("molpredict-model-bundle", "someone-elses-bundle"), "not a molpredict model bundle"),
    (lambda text: json.dumps({**json.loads(text), "ion_modes": ["sideways"]}), "ion_modes is missing or invalid"),
    (lambda text: json.dumps({**json.loads(text), "ion_modes": []}), "ion_modes is missing or invalid"),
    (lambda text: json.dumps({**json.loads(text), "ion_modes": "positive"}), "ion_modes is missing or invalid"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "format_version"}),
     "format_version is missing or invalid"),
])
def test_damaged_bundle_json(bundle_dir, damage, match):
    from molpredict.modelfile import ModelBundle

    path, _ = bundle_dir
    head = path / "bundle.json"
    head.write_text(damage(head.read_text()))
    with pytest.raises(ModelFileError, match=match) as info:
        ModelBundle.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_failed_save_leaves_the_previous_bundle_intact(bundle_dir, tmp_path, monkeypatch):
    import molpredict.modelfile as modelfile

    path, bundle = bundle_dir
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(modelfile, "_write_json", disk_full)
    with pytest.raises(ModelFileError, match="could not write the model bundle.*No space left"):
        bundle.save(path)
    after = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind
    monkeypatch.undo()
    modelfile.ModelBundle.load(path)
    # and a failure for a new path leaves nothing under that name
    monkeypatch.setattr(modelfile, "_write_json", disk_full)
    with pytest.raises(ModelFileError):
        bundle.save(tmp_path / "new")
    assert not (tmp_path / "new").exists()


# -- OKR state and inputs -------------------------------------------------------------------------------------

@pytest.fixture
def okr_state():
    from dsokr_helpers import install_synthetic_registry, synthetic_pairs
    from molpredict.models.okr import SISOKR

    install_synthetic_registry()
    x, y = synthetic_pairs(60, 0)
    model = SISOKR(input_kernel="test-rbf-in:gamma=0.2", output_kernel="test-rbf:gamma=0.5",
                   input_sketch="subsample:m=20,seed=1", output_sketch="gaussian:m=10,seed=2", lam=1e-3).fit(x, y)
    return model, x, y


@pytest.mark.parametrize("corrupt, match", [
    (lambda a, m: m.update(version=99), "unsupported format"),
    (lambda a, m: m.update(format="other"), "unsupported format"),
    (lambda a, m: m.pop("lam"), "missing 'lam'"),
    (lambda a, m: m["input"].pop("kernel"), "missing 'kernel'"),
    (lambda a, m: a.update(W=a["W"][:-1]), "W has .* rows for .* input landmarks"),
    (lambda a, m: a.update(W=a["W"][:, :-1]), "output sketch, landmarks and W do not match"),
    (lambda a, m: a.pop("output_A_indptr"), "sparse array 'output_A' is missing or inconsistent"),
    (lambda a, m: a.update(output_A_shape=np.array([3, 3])), "sparse array 'output_A'|do not match"),
])
def test_okr_corrupted_state_is_refused(okr_state, corrupt, match):
    from molpredict.models.okr import SISOKR

    model, _, _ = okr_state
    arrays, metadata = model.get_state()
    arrays = dict(arrays)
    metadata = json.loads(json.dumps(metadata))
    corrupt(arrays, metadata)
    with pytest.raises(ModelFileError, match=match):
        SISOKR.from_state(arrays, metadata)


def test_okr_input_validation(okr_state):
    from dsokr_helpers import synthetic_pairs
    from molpredict.models.okr import SISOKR

    model, x, y = okr_state
    for lam in ("-1", "0", "abc", "1|x", ""):
        with pytest.raises(SpecError, match="lam must be positive"):
            SISOKR(input_kernel="test-rbf-in", output_kernel="test-rbf", lam=lam).fit(x, y)
    # a grid with one structure and no validation data cannot be searched
    with pytest.raises(InputError, match="grid search needs validation data"):
        SISOKR(input_kernel="test-rbf-in", output_kernel="test-rbf", lam="0.1|1",
               input_sketch="subsample:m=5", output_sketch="subsample:m=1").fit(x[:6], [y[0]] * 6)
    with pytest.raises(RuntimeError, match="not fitted"):
        SISOKR(input_kernel="test-rbf-in", output_kernel="test-rbf").predict_coordinates(x[:2])
    xs, ys = synthetic_pairs(5, 3)
    assert model.score(xs, ys).shape == (5, 5)


# -- per-structure metrics, by hand ---------------------------------------------------------------------------

def test_per_structure_metrics_by_hand():
    # structure A has three queries ranked 1, 3, 5; structure B one query ranked 2 (10 candidates each)
    ranks = {"n_greater": np.array([0, 2, 4, 1]), "n_ties": np.zeros(4, dtype=np.int64),
             "found": np.ones(4, dtype=bool), "n_candidates": np.full(4, 10), "groups": ["A", "A", "A", "B"]}
    result = summarize_ranks(ranks, n_boot=50)
    assert result["hit@1"] == pytest.approx(0.25) and result["mean_rank"] == pytest.approx(2.75)
    per = result["per_structure"]
    assert per["hit@1"] == pytest.approx((1 / 3 + 0) / 2, abs=1e-15)
    assert per["hit@5"] == pytest.approx(1.0)
    assert per["mrr"] == pytest.approx(((1 + 1 / 3 + 1 / 5) / 3 + 1 / 2) / 2, abs=1e-15)
    assert per["mean_rank"] == pytest.approx((3 + 2) / 2, abs=1e-15)
    assert result["n_structures"] == 2


# -- atomic writes --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["out.mgf", "out.mgf.gz"])
def test_a_failed_mgf_write_leaves_the_previous_file(tmp_path, name):
    from molpredict.spectra.record import Spectrum
    from molpredict.io import read_mgf, write_mgf

    path = tmp_path / name
    good = [Spectrum("a", mz=[100.0], intensities=[1.0])]
    write_mgf(good, path)
    before = path.read_bytes()

    def failing():
        yield Spectrum("b", mz=[50.0], intensities=[2.0])
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_mgf(failing(), path)
    assert path.read_bytes() == before and [s.id for s in read_mgf(path)] == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary left behind


def _permissions(path) -> int:
    import stat
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_writes_get_the_permissions_open_would_give(tmp_path, monkeypatch):
    """``mkstemp`` makes its file 0600 and ``mkdtemp`` its directory 0700: renamed into place as they are, a built
    library, a report or a model's tensors would be unreadable to the group and to workers under other accounts.
    A new file gets ``0666 & ~umask`` (as ``open`` gives it), a file written over keeps its own bits, and a library's
    cache entry gets ``0777 & ~umask``."""
    import os

    from molpredict.atomic import atomic_write, creation_mode
    from molpredict.cache import library_entry
    from molpredict.chem.candidates import CandidateLibrary, read_library

    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    before = os.umask(0o022)
    try:
        assert (creation_mode(), creation_mode(directory=True)) == (0o644, 0o755)
        library = tmp_path / "lib.tsv"
        CandidateLibrary.from_smiles(["CCO", "c1ccccc1"]).to_tsv(library)
        assert _permissions(library) == 0o644
        read_library(library, cache=True)  # stores its cache entry
        entry = library_entry(library)
        assert entry.is_dir() and _permissions(entry) == 0o755
        assert {_permissions(f) for f in entry.iterdir()} == {0o644}
        shared = tmp_path / "shared.txt"
        shared.write_text("a")
        shared.chmod(0o664)
        with atomic_write(shared) as handle:
            handle.write("b")
        assert shared.read_text() == "b" and _permissions(shared) == 0o664
        os.umask(0o077)
        assert creation_mode() == 0o600
        with atomic_write(tmp_path / "private.txt") as handle:
            handle.write("c")
        assert _permissions(tmp_path / "private.txt") == 0o600
    finally:
        os.umask(before)


def test_library_tsv_is_written_atomically(tmp_path, monkeypatch):
    from molpredict.chem.candidates import CandidateLibrary, read_library

    library = CandidateLibrary.from_smiles(["CCO", "c1ccccc1"])
    path = tmp_path / "lib.tsv.gz"
    library.to_tsv(path)
    before = path.read_bytes()
    monkeypatch.setattr("molpredict.chem.candidates._clean_cell", lambda value: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        library.to_tsv(path)
    assert path.read_bytes() == before and len(read_library(path, cache=False)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lib.tsv.gz"]
