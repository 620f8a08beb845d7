"""The on-disk cache of per-structure fragmentation (molpredict.chem.fragment_cache): the pickle-free value encoding,
the content keys, identification through it (a second fresh run fragments nothing and gives the same rows),
``cache_root=False``, a damaged database, and concurrent writers."""
from __future__ import annotations

import math
import multiprocessing
import sqlite3
import warnings
from collections import OrderedDict

import numpy as np
import pytest

from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
from molpredict.chem import fragments as fragments_module
from molpredict.chem.candidates import CandidateLibrary
from molpredict.chem.fragment_cache import FragmentCache, content_key, decode_arrays, encode_arrays
from molpredict.chem.fragment_model import FEATURE_NAMES, FragmentModel, ion_features
from molpredict.chem.fragments import FragmentScorer
from molpredict.identification.candidate_sources import LibrarySource
from molpredict.identification.evidence import WITH_PRIOR, WITHOUT_PRIOR, ScoringVariant
from molpredict.identification.fusion import FIRST_PASS, LearntRanker, Rerank, ScoreFusion
from molpredict.identification.identify import Identifier, IdentifyOptions
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.spectra.cleaning import CleaningPipeline
from molpredict.training.pipeline import build_model

DECOYS = ["CC1Cc2ccc(O)cc2C(=O)O1", "CC(=O)Nc1cccc(O)c1", "O=C(O)/C=C/c1ccc(O)cc1O", "CC(C)Cc1ccc(CC(C)C(=O)O)cc1"]


# -- values --------------------------------------------------------------------------------------------------
def test_arrays_round_trip_with_their_dtypes_and_shapes():
    rng = np.random.default_rng(0)
    arrays = {"f8": rng.normal(size=(5, 3)), "f4": rng.normal(size=7).astype(np.float32),
              "big_endian": rng.normal(size=4).astype(">f8"), "i1": np.array([-128, 0, 127], dtype=np.int8),
              "i2": rng.integers(-300, 300, size=(2, 4)).astype(np.int16), "u4": np.arange(6, dtype=np.uint32),
              "flags": np.array([True, False, True]), "elements": np.array(["C", "H", "Cl", "Br"], dtype=str),
              "empty": np.zeros(0), "empty_2d": np.zeros((0, 4), dtype=np.int8), "scalar": np.float64(2.5),
              "non_contiguous": rng.normal(size=(4, 6))[:, ::2]}
    back = decode_arrays(encode_arrays(arrays))
    assert list(back) == list(arrays)
    for name, value in arrays.items():
        value = np.asarray(value)
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        np.testing.assert_array_equal(back[name], value)
    assert decode_arrays(encode_arrays({})) == {}


def test_values_refuse_objects_and_anything_not_written_by_the_encoder():
    with pytest.raises(ValueError):
        encode_arrays({"x": np.array([{"a": 1}], dtype=object)})
    good = encode_arrays({"x": np.arange(3.0)})
    # the same header naming an object dtype (what a pickled array would need) is refused
    forged = good.replace(b'"<f8"', b'"|O8"') if b'"<f8"' in good else None
    assert forged is not None
    bad = [b"", b"garbage", good[:-1], good[:6], b"XXXX" + good[4:], forged,
           good.replace(b'"shape":[3]', b'"shape":[4]'), np.save.__doc__.encode()]
    for blob in bad:
        with pytest.raises(ValueError):
            decode_arrays(blob)


def test_store_round_trip_keeps_the_first_value_of_a_key(tmp_path):
    cache = FragmentCache(tmp_path, "test-key")
    assert cache.get_many(["a"]) == {}
    assert cache.put_many({"a": {"x": np.arange(3)}, "b": {"x": np.zeros((0, 2)), "y": np.array(["C"])}}) == 2
    cache.put_many([("a", {"x": np.arange(5)})])  # an existing key keeps its value
    fresh = FragmentCache(tmp_path, "test-key")
    got = fresh.get_many(["b", "a", "missing", "a"])
    assert set(got) == {"a", "b"} and len(fresh) == 2
    np.testing.assert_array_equal(got["a"]["x"], np.arange(3))
    assert got["b"]["x"].shape == (0, 2) and got["b"]["y"].tolist() == ["C"]
    assert (tmp_path / "fragments" / "test-key.sqlite").is_file()
    with sqlite3.connect(tmp_path / "fragments" / "test-key.sqlite") as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # more keys than one SELECT binds
    many = {f"k{i}": {"v": np.array([i])} for i in range(1200)}
    fresh.put_many(many)
    got = FragmentCache(tmp_path, "test-key").get_many(list(many))
    assert len(got) == 1200 and all(int(got[k]["v"][0]) == int(k[1:]) for k in many)


def test_structures_sharing_a_first_block_keep_their_own_fragments(tmp_path):
    """Tautomers share the InChIKey first block but carry their hydrogens on other atoms: each keeps its own
    entry, and a fresh scorer loads exactly what was computed (the ion groups of a model likewise)."""
    from molpredict.chem.fragment_cache import ScorerDiskCache
    from molpredict.chem.molecules import Molecule

    smiles = ["Oc1ccccn1", "O=c1cccc[nH]1"]  # 2-hydroxypyridine / 2-pyridone
    first_block = {Molecule.from_smiles(s).inchikey14 for s in smiles}
    assert len(first_block) == 1
    keys = [first_block.pop()] * 2
    for make in (lambda: FragmentScorer(max_depth=2), lambda: random_model(max_depth=1)):
        scorer = make()
        disk = ScorerDiskCache(scorer, FragmentCache(tmp_path, scorer.disk_cache_key()))
        missing = disk.prefetch(keys, smiles)
        assert set(missing) == set(smiles)
        computed = {s: (scorer.fragments(s) if isinstance(scorer, FragmentScorer) else scorer.ion_groups(s))
                    for s in smiles}
        assert disk.store_new(missing) == 2
        fresh = make()
        assert ScorerDiskCache(fresh, FragmentCache(tmp_path, fresh.disk_cache_key())).prefetch(keys, smiles) == {}
        for s in smiles:
            if isinstance(scorer, FragmentScorer):
                got, want = fresh.cache_[s], computed[s]
                for name in ("masses", "depth", "broken_by_type", "counts"):
                    np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
                    assert getattr(got, name).dtype == getattr(want, name).dtype
                assert got.elements == want.elements
            else:
                for got, want in zip(fresh.cache_[s], computed[s]):
                    np.testing.assert_array_equal(got, want)
        # the two tautomers' fragments differ, so a key by first block alone would have been wrong for one
        a, b = (fresh.cached_arrays(smiles)[s] for s in smiles)
        assert any(a[n].shape != b[n].shape or not np.array_equal(a[n], b[n]) for n in a)


# -- content keys --------------------------------------------------------------------------------------------
def random_model(seed: int = 0, **params) -> FragmentModel:
    """A fitted fragment model with random weights (as test_fragment_model's constant_model, not constant)."""
    model = FragmentModel(**params)
    n = ion_features(np.zeros((1, len(FEATURE_NAMES))), model.max_h_shift).shape[1]
    rng = np.random.default_rng(seed)
    model.coef_ = rng.normal(scale=0.3, size=n)
    model.mean_, model.scale_ = rng.normal(scale=0.1, size=n), rng.uniform(0.5, 2.0, size=n)
    model.intercept_ = -1.0
    return model


def test_the_model_key_changes_whenever_a_prediction_would():
    model = random_model(max_depth=1)
    key = model.disk_cache_key()
    assert key == random_model(max_depth=1).disk_cache_key()  # same content, same key
    changed = []
    for attribute in ("coef_", "mean_", "scale_"):
        other = random_model(max_depth=1)
        getattr(other, attribute)[7] += 1e-9
        changed.append(other.disk_cache_key())
    other = random_model(max_depth=1)
    other.intercept_ += 1e-9
    changed.append(other.disk_cache_key())
    for params in ({"max_depth": 2}, {"max_h_shift": 1}, {"absent_weight": 0.03}, {"max_depth": 1, "C": 2.0}):
        other = random_model(**{"max_depth": 1, **params})
        changed.append(other.disk_cache_key())
    assert key not in changed and len(set(changed)) == len(changed)
    with pytest.raises(Exception):
        FragmentModel().disk_cache_key()  # unfitted


def test_the_fragment_set_key_depends_on_the_depth_alone():
    key = FragmentScorer(max_depth=2).disk_cache_key()
    assert FragmentScorer(max_depth=2, tolerance_ppm=5.0, h_shift_penalty=0.1).disk_cache_key() == key
    assert FragmentScorer(max_depth=1).disk_cache_key() != key
    assert content_key("fragment-sets", {"max_depth": 2}) != content_key("fragment-sets", {"max_depth": 3})


# -- identification through the cache -----------------------------------------------------------------------
@pytest.fixture
def library():
    smiles = SMILES + DECOYS
    return CandidateLibrary.from_smiles(smiles, names=[f"cand{i}" for i in range(len(smiles))], source="test")


@pytest.fixture(params=["second_pass", "first_pass"])
def fragment_bundle(request):
    """The fake-model bundle weighing the fragment score and the learnt fragment model: in a second pass over
    the first pass's top 3, or (an older bundle) in the first pass over every candidate."""
    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=3, seed=0)
    model = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(),
                   adducts=["[M+H]+", "[M+Na]+", "[M+NH4]+", "[M]+"])
    # small memory caches in the second pass (room for one query's top 3 at a time): the union of a block's
    # chosen candidates is then read from the disk in several groups
    cache_size = 6 if request.param == "second_pass" else 8192
    sub.fragments = FragmentScorer(max_depth=1, cache_size=cache_size).get_params()
    sub.fragment_model = random_model(max_depth=1, cache_size=cache_size)
    if request.param == "second_pass":
        ranker = LearntRanker((FIRST_PASS, "fragments", "fragment_model"), (), (), (), False,
                              np.array([0.5, 2.0, 1.0]))
        fusion = ScoreFusion({"spectrum": 1.0}, 1.0, rerank=Rerank(3, ranker, spacing=1.0))
    else:
        fusion = ScoreFusion({"spectrum": 1.0, "fragments": 0.5, "fragment_model": 0.3}, 1.0)
    sub.scoring = {name: ScoringVariant(fusion).to_dict() for name in (WITH_PRIOR, WITHOUT_PRIOR)}
    return ModelBundle({"positive": sub})


def identify(bundle, library, spectra, cache_root):
    options = IdentifyOptions(top_k=50, block_queries=5)  # several blocks
    identifier = Identifier(bundle, LibrarySource(library, options), options, cache_root=cache_root)
    return list(identifier.run(spectra)), identifier


def forget_fragmentation(bundle, monkeypatch):
    """What a fresh process would not hold: the shared fragment sets and the model's ion groups in memory."""
    monkeypatch.setattr(fragments_module, "_RECENT", OrderedDict())
    for sub in bundle.models.values():
        sub.fragment_model._clear_cache()


def count_fragmentation(monkeypatch, fail: bool = False) -> list:
    calls = []
    real = fragments_module.fragment_structure

    def counted(*args, **kwargs):
        calls.append(args[0])
        if fail:
            raise AssertionError("fragmented although the disk cache holds every structure")
        return real(*args, **kwargs)
    monkeypatch.setattr(fragments_module, "fragment_structure", counted)
    return calls


def same(a, b):
    """Rows equal field by field (NaN equal to NaN)."""
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            both_nan = isinstance(x[k], float) and isinstance(y[k], float) and math.isnan(x[k]) and math.isnan(y[k])
            assert both_nan or x[k] == y[k], (k, x[k], y[k])
    return True


def test_a_second_fresh_run_fragments_nothing_and_gives_the_same_rows(fragment_bundle, library, tmp_path,
                                                                     monkeypatch):
    queries, _ = synthetic_spectra(n_per=2, seed=12)
    forget_fragmentation(fragment_bundle, monkeypatch)
    with monkeypatch.context() as m:
        computed = count_fragmentation(m)
        first, _ = identify(fragment_bundle, library, queries, tmp_path / "cache")
    assert computed  # the first run fragmented (so the second run's silence means something)
    stores = sorted((tmp_path / "cache" / "fragments").glob("*.sqlite"))
    assert len(stores) == 2
    sub = fragment_bundle.for_mode("positive")
    assert {p.stem for p in stores} == {FragmentScorer(**sub.fragments).disk_cache_key(),
                                        sub.fragment_model.disk_cache_key()}
    n_structures = len({s if isinstance(s, str) else s.smiles for s in computed})
    for path in stores:
        assert len(FragmentCache(path.parent.parent, path.stem)) == n_structures

    forget_fragmentation(fragment_bundle, monkeypatch)
    count_fragmentation(monkeypatch, fail=True)
    second, identifier = identify(fragment_bundle, library, queries, tmp_path / "cache")
    assert same(first, second)
    assert identifier.timings["fragment_cache_s"] > 0


def test_no_disk_cache_writes_nothing(fragment_bundle, library, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MOLPREDICT_HOME", str(home))
    queries, _ = synthetic_spectra(n_per=1, seed=3)
    forget_fragmentation(fragment_bundle, monkeypatch)
    computed = count_fragmentation(monkeypatch)
    rows, _ = identify(fragment_bundle, library, queries, False)
    assert rows and computed
    assert not home.exists() or not any(home.rglob("*"))
    # the default root (None) is the home's coordinates directory
    forget_fragmentation(fragment_bundle, monkeypatch)
    identify(fragment_bundle, library, queries, None)
    assert len(list((home / "coordinates" / "fragments").glob("*.sqlite"))) == 2


def test_a_damaged_database_warns_once_in_one_line_and_the_rows_stay_right(fragment_bundle, library, tmp_path,
                                                                          monkeypatch):
    queries, _ = synthetic_spectra(n_per=2, seed=12)
    sub = fragment_bundle.for_mode("positive")
    forget_fragmentation(fragment_bundle, monkeypatch)
    expected, _ = identify(fragment_bundle, library, queries, tmp_path / "clean")  # (coordinates stored alike)
    root = tmp_path / "cache"
    (root / "fragments").mkdir(parents=True)
    paths = [root / "fragments" / f"{key}.sqlite" for key in (FragmentScorer(**sub.fragments).disk_cache_key(),
                                                              sub.fragment_model.disk_cache_key())]
    for path in paths:
        path.write_bytes(b"this is not a database, " * 200)
    forget_fragmentation(fragment_bundle, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows, _ = identify(fragment_bundle, library, queries, root)
    assert same(expected, rows)
    messages = [str(w.message) for w in caught if "fragment cache" in str(w.message)]
    assert len(messages) == 2, messages  # once per file, not once per block, group or query
    for path in paths:
        assert sum(str(path) in m for m in messages) == 1
    assert all("\n" not in m for m in messages)


def _write_entries(root: str, start: int, stop: int) -> None:
    cache = FragmentCache(root, "concurrent")
    for i in range(start, stop, 5):
        cache.put_many({f"s{j}": {"masses": np.full(j % 7, float(j)), "who": np.array([start])}
                        for j in range(i, min(i + 5, stop))})
        cache.get_many([f"s{j}" for j in range(start, i)])


def test_concurrent_writers_leave_a_readable_store_with_every_entry(tmp_path):
    context = multiprocessing.get_context("fork")
    ranges = [(0, 300), (200, 500)]  # overlapping keys: both try to write s200..s299
    workers = [context.Process(target=_write_entries, args=(str(tmp_path), a, b)) for a, b in ranges]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    cache = FragmentCache(tmp_path, "concurrent")
    got = cache.get_many([f"s{j}" for j in range(500)])
    assert len(got) == 500 == len(cache)
    for j in range(500):
        np.testing.assert_array_equal(got[f"s{j}"]["masses"], np.full(j % 7, float(j)))
    with sqlite3.connect(tmp_path / "fragments" / "concurrent.sqlite") as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
