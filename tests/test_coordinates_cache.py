"""The candidate-coordinates store: lazy computation, persistence, compact int8 encoding, crash safety, damaged
chunks recomputed, concurrent writers, migration of the old memory-mapped layout."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from molpredict.identification.coordinates_cache import (KEYING, CoordinatesCache, decode, encode, molecule_key,
                                                          smiles_keys, store_key)
from molpredict.chem.molecules import Molecule
from conftest import child_pythonpath


class Featurizer:
    """A deterministic stand-in for ``model.candidate_coordinates`` that records what it was asked."""

    def __init__(self, dim=5, fail_after=None):
        self.dim = dim
        self.asked: list[list[str]] = []
        self.fail_after = fail_after

    def __call__(self, molecules):
        if self.fail_after is not None and len(self.asked) >= self.fail_after:
            raise KeyboardInterrupt("simulated interrupt")
        keys = [m.smiles for m in molecules]
        self.asked.append(keys)
        return np.array([[hash((k, j)) % 1000 / 7.0 for j in range(self.dim)] for k in keys])


def mols(n, offset=0):
    return [Molecule("C" * (i + 1 + offset), inchikey=f"KEY{i + offset:05d}-X-N") for i in range(n)]


def test_molecule_key_is_the_featurised_smiles_never_an_inchikey():
    """A declared InChIKey may be wrong, and forms sharing one (a zwitterion and its neutral form) have their own
    coordinates: the key is the SMILES, computed from nothing."""
    assert molecule_key(Molecule("CCO", inchikey="LFQSCWFLJHTTHZ-UHFFFAOYSA-N")) == "smiles:CCO"
    assert molecule_key(Molecule("CCO", inchikey="WRONGKEYWRONGK-UHFFFAOYSA-N")) == "smiles:CCO"
    m = Molecule("CCO")
    assert molecule_key(m) == "smiles:CCO" and m._inchikey is None
    assert list(smiles_keys(np.array(["CCO", "C[NH3+]"], dtype=object))) == ["smiles:CCO", "smiles:C[NH3+]"]


def test_a_model_store_is_named_by_its_keying():
    """Stores keyed the old way (by declared InChIKey, under the bare coordinates key) are never opened."""
    class Model:
        def coordinates_key(self):
            return "abc"

    assert store_key(Model()) == f"abc.{KEYING}" != "abc"


def exact(root, key="k"):
    return CoordinatesCache(root, key, encoding="float64")


def test_second_run_computes_nothing(tmp_path):
    f = Featurizer()
    molecules = mols(10)
    first = exact(tmp_path, "k1").get(molecules, f, block_size=4)
    assert sum(len(a) for a in f.asked) == 10 and [len(a) for a in f.asked] == [4, 4, 2]
    np.testing.assert_array_equal(first, Featurizer()(molecules))
    f2 = Featurizer()
    again = CoordinatesCache(tmp_path, "k1").get(list(reversed(molecules)), f2)
    assert f2.asked == []
    np.testing.assert_array_equal(again, first[::-1])
    # a different model key is a different cache
    f3 = Featurizer()
    CoordinatesCache(tmp_path, "k2").get(molecules[:3], f3)
    assert sum(len(a) for a in f3.asked) == 3


def test_only_missing_and_duplicates_once(tmp_path):
    cache = exact(tmp_path)
    f = Featurizer()
    cache.get(mols(5), f)
    f.asked.clear()
    molecules = mols(8) + mols(8)  # overlap with the cached five, and duplicates
    out = cache.get(molecules, f)
    assert sorted(sum(f.asked, [])) == sorted(m.smiles for m in mols(8)[5:])
    np.testing.assert_array_equal(out, Featurizer()(molecules))
    assert len(cache) == 8


def test_int8_rows_with_a_scale_each_bound_the_error(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 64)) * rng.uniform(0.01, 100, size=(300, 1))
    x[7] = 0.0
    codes, scale = encode(x, "int8")
    assert codes.dtype == np.int8 and codes.min() >= -127 and scale.dtype == np.float32
    peak = np.abs(x).max(axis=1)
    np.testing.assert_allclose(scale, peak / 127, rtol=1e-6)
    # round to nearest code: error at most half a step (plus the float32 rounding of the scale)
    assert (np.abs(decode(codes, scale) - x) <= scale[:, None] * 0.5 + peak[:, None] * 1e-6).all()
    assert (decode(codes, scale)[7] == 0).all()
    cache = CoordinatesCache(tmp_path, "q")  # int8 is the default
    keys = [f"m{i}" for i in range(300)]
    cache.append(keys, x)
    np.testing.assert_array_equal(CoordinatesCache(tmp_path, "q").read(cache.rows(keys)), decode(codes, scale))
    assert cache.encoding == "int8" and cache.stored_bytes() < 300 * (64 + 4) + 4096


@pytest.mark.parametrize("encoding", ["int8", "float64"])
def test_reads_in_float32_are_the_float64_reads_rounded(tmp_path, encoding):
    # identification scores with float32 (scoring.SCORING_DTYPE): the store decodes straight into it
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 16)) * rng.uniform(0.01, 100, size=(50, 1))
    cache = CoordinatesCache(tmp_path, "q", encoding=encoding)
    keys = [f"m{i}" for i in range(50)]
    cache.append(keys, x)
    rows = cache.rows(keys)[::-1]
    wide, narrow = cache.read(rows), cache.read(rows, np.float32)
    assert wide.dtype == np.float64 and narrow.dtype == np.float32
    np.testing.assert_allclose(narrow, wide, rtol=2 ** -23, atol=0)
    codes, scale = encode(x, encoding)
    np.testing.assert_allclose(decode(codes, scale, np.float32), decode(codes, scale), rtol=2 ** -23, atol=0)
    empty = cache.coordinates([], lambda positions: [], lambda molecules: None, dtype=np.float32)
    assert empty.shape == (0, 16) and empty.dtype == np.float32


def test_interrupt_keeps_finished_blocks(tmp_path):
    f = Featurizer(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        exact(tmp_path).get(mols(10), f, block_size=3)
    cache = CoordinatesCache(tmp_path, "k")
    assert len(cache) == 6
    f2 = Featurizer()
    out = cache.get(mols(10), f2, block_size=3)
    assert sum(f2.asked, []) == [m.smiles for m in mols(10)[6:]]
    np.testing.assert_array_equal(out, Featurizer()(mols(10)))


def test_a_segment_without_its_commit_record_does_not_count(tmp_path):
    cache = exact(tmp_path)
    cache.get(mols(4), Featurizer(), block_size=2)
    commits = sorted((tmp_path / "k" / "commits").iterdir())
    commits[-1].unlink()  # the writer died between its arrays and its commit record
    (tmp_path / "k" / "commits" / "torn.json").write_text('{"keys": ["KEY0')  # a torn record
    fresh = CoordinatesCache(tmp_path, "k")
    assert len(fresh) == 2
    f = Featurizer()
    np.testing.assert_array_equal(fresh.get(mols(4), f), Featurizer()(mols(4)))
    assert sum(f.asked, []) == [m.smiles for m in mols(4)[2:]]


def chunk_files(root):
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and "/codes/c/" in str(p))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_chunk_is_detected_and_recomputed(tmp_path, damage):
    cache = CoordinatesCache(tmp_path, "k")
    expected = cache.get(mols(9), Featurizer(), block_size=3)
    victim = chunk_files(tmp_path / "k")[1]
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0xFF
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[: len(data) // 2]))
    else:
        victim.unlink()
    f = Featurizer()
    again = CoordinatesCache(tmp_path, "k").get(mols(9), f)
    np.testing.assert_array_equal(again, expected)
    assert len(sum(f.asked, [])) == 3  # exactly the damaged block's molecules
    f2 = Featurizer()
    np.testing.assert_array_equal(CoordinatesCache(tmp_path, "k").get(mols(9), f2), expected)
    assert f2.asked == []


def test_two_writers_share_the_cache(tmp_path):
    a, b = exact(tmp_path), exact(tmp_path)
    a.append(["x", "y"], np.array([[1.0, 2.0], [3.0, 4.0]]))
    b.append(["y", "z"], np.array([[3.0, 4.0], [5.0, 6.0]]))  # b has not seen a's rows yet
    a.refresh()
    for cache in (a, b, CoordinatesCache(tmp_path, "k")):
        assert len(cache) == 3
        np.testing.assert_array_equal(cache.read(cache.rows(["z", "x"])), [[5.0, 6.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="dimension"):
        a.append(["w"], np.zeros((1, 3)))
    names = [p.name for p in (tmp_path / "k" / "segments").iterdir() if p.is_dir()]
    assert len(names) == len(set(names)) == 2  # one segment (its own files) per committed block


def test_fsspec_url(tmp_path):
    cache = CoordinatesCache(f"file://{tmp_path}", "k", encoding="float64")
    out = cache.get(mols(5), Featurizer())
    np.testing.assert_array_equal(CoordinatesCache(tmp_path, "k").get(mols(5), Featurizer(fail_after=0)), out)


def test_a_remote_url_goes_through_fsspec():
    """A non-local root (fsspec's in-memory file system standing in for s3://...): rows are written there and a
    second cache on the same URL reads them without computing."""
    import uuid

    root = f"memory://molpredict-test-{uuid.uuid4().hex}"
    cache = CoordinatesCache(root, "k", encoding="float64")
    assert cache.directory == root + "/k"
    out = cache.get(mols(5), Featurizer())
    np.testing.assert_array_equal(CoordinatesCache(root, "k").get(mols(5), Featurizer(fail_after=0)), out)


def write_layout_1(directory, keys, data):
    """A cache as the memory-mapped layout 1 wrote it (meta.json, data.f64, index segments)."""
    directory.mkdir(parents=True)
    (directory / "meta.json").write_text(json.dumps({"key": directory.name, "dim": data.shape[1],
                                                      "dtype": "float64", "layout_version": 1}))
    (directory / "data.f64").write_bytes(np.ascontiguousarray(data, dtype=np.float64).tobytes())
    (directory / "index").mkdir()
    half = len(keys) // 2
    (directory / "index" / "seg-000000000001.json").write_text(json.dumps({"seq": 1, "start": 0,
                                                                            "keys": keys[:half]}))
    (directory / "index" / "seg-000000000002.json").write_text(json.dumps({"seq": 2, "start": half,
                                                                            "keys": keys[half:]}))


def test_old_layout_is_migrated_never_misread(tmp_path):
    keys = [molecule_key(m) for m in mols(6)]
    data = Featurizer()(mols(6))
    write_layout_1(tmp_path / "k", keys, data)
    cache = CoordinatesCache(tmp_path, "k", encoding="float64")
    assert len(cache) == 6
    np.testing.assert_array_equal(cache.read(cache.rows(keys[::-1])), data[::-1])
    assert not (tmp_path / "k" / "data.f64").exists() and not (tmp_path / "k" / "meta.json").exists()
    np.testing.assert_array_equal(CoordinatesCache(tmp_path, "k").get(mols(6), Featurizer(fail_after=0)), data)
    # an unreadable old cache is dropped and recomputed
    write_layout_1(tmp_path / "j", keys, data)
    (tmp_path / "j" / "meta.json").write_text("{not json")
    f = Featurizer()
    np.testing.assert_array_equal(CoordinatesCache(tmp_path, "j", encoding="float64").get(mols(6), f), data)
    assert len(sum(f.asked, [])) == 6


@pytest.mark.parametrize("budget_segments", [0, 1, 10])
def test_segments_kept_in_memory_read_the_same_within_their_budget(tmp_path, monkeypatch, budget_segments):
    """Whole segments are kept in memory within a byte budget (least recently used out); reads give the same
    values whether they come from memory or the store, and the budget bounds what is kept."""
    import molpredict.identification.coordinates_cache as cc

    molecules = mols(12)
    CoordinatesCache(tmp_path, "k").get(molecules, Featurizer(), block_size=4)  # three segments of 4 rows
    reference = CoordinatesCache(tmp_path, "k")
    monkeypatch.setattr(cc, "MEMORY_BUDGET_BYTES", 0)
    expected = reference.read(reference.rows([molecule_key(m) for m in molecules]))
    assert not reference._loaded  # over budget: nothing kept, rows read from the store
    segment_bytes = 4 * 5  # int8 codes, 4 rows x 5 coordinates
    monkeypatch.setattr(cc, "MEMORY_BUDGET_BYTES", budget_segments * segment_bytes)
    cache = CoordinatesCache(tmp_path, "k")
    rows = cache.rows([molecule_key(m) for m in molecules])
    for order in (np.arange(12), np.arange(12)[::-1], np.array([5, 0, 11, 5])):
        np.testing.assert_array_equal(cache.read(rows[order]), expected[order])
        assert cache._loaded_bytes <= max(budget_segments, 1) * segment_bytes
        assert cache._loaded_bytes == sum(a.nbytes for a in cache._loaded.values())
    assert len(cache._loaded) == (0 if budget_segments == 0 else min(budget_segments, 3))


def test_a_mistyped_memory_budget_falls_back_to_the_default(monkeypatch):
    import molpredict.identification.coordinates_cache as cc

    monkeypatch.setenv("MOLPREDICT_STORE_MEMORY_MB", "lots")
    assert cc._memory_budget() == 512 * 2**20
    monkeypatch.setenv("MOLPREDICT_STORE_MEMORY_MB", "64")
    assert cc._memory_budget() == 64 * 2**20


@pytest.mark.parametrize("encoding", ["int8", "float16", "float64"])
def test_local_segments_are_read_without_zarr_exactly_as_zarr_reads_them(tmp_path, encoding):
    """A local store reads its segments with numpy, zstd and CRC32C (zarr's import is a third of a short run): the
    same values as zarr, whole or by rows, with a partial last inner chunk and a chunk never written."""
    import zarr
    from molpredict.identification.coordinates_cache import _ShardedArray

    rng = np.random.default_rng(3)
    cache = CoordinatesCache(tmp_path, "k", encoding=encoding)
    cache.append([f"m{i}" for i in range(300)], rng.standard_normal((300, 7)))  # 128-row inner chunks: 3, the last partial
    segment = next(p for p in (tmp_path / "k" / "segments").iterdir() if p.is_dir())
    store = zarr.storage.LocalStore(str(tmp_path / "k"))
    expected = zarr.open_array(store=store, path=f"segments/{segment.name}/codes", mode="r")
    ours = _ShardedArray(segment / "codes")
    np.testing.assert_array_equal(ours[:], expected[:])
    rows = np.array([299, 0, 128, 5, 255, 256])
    np.testing.assert_array_equal(ours.get_orthogonal_selection((rows, slice(None))),
                                  expected.get_orthogonal_selection((rows, slice(None))))
    scale = zarr.open_array(store=store, path=f"segments/{segment.name}/scale", mode="r")
    np.testing.assert_array_equal(_ShardedArray(segment / "scale")[:], scale[:])
    # an inner chunk never written (its index entry 2**64 - 1) reads as the fill value, as in zarr
    shard = segment / "codes" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    index_start = len(data) - (16 * 3 + 4)
    index = np.frombuffer(bytes(data[index_start:-4]), dtype="<u8").copy()
    index[2:4] = 2**64 - 1
    from google_crc32c import value as crc32c
    data[index_start:] = index.tobytes() + crc32c(index.tobytes()).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    np.testing.assert_array_equal(_ShardedArray(segment / "codes")[:], zarr.open_array(
        store=zarr.storage.LocalStore(str(tmp_path / "k")), path=f"segments/{segment.name}/codes", mode="r")[:])


def test_a_warm_local_read_imports_neither_zarr_nor_fsspec(tmp_path):
    import subprocess
    import sys
    CoordinatesCache(tmp_path, "k").append(["a", "b"], np.ones((2, 3)))
    code = (f"import sys, numpy as np\nfrom molpredict.identification.coordinates_cache import CoordinatesCache\n"
            f"cache = CoordinatesCache({str(tmp_path)!r}, 'k')\n"
            f"assert np.allclose(cache.read(cache.rows(['b', 'a'])), 1.0)\n"
            f"print(sorted(m for m in ('zarr', 'fsspec') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": child_pythonpath()})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("encoding", ["int8", "float16", "float64"])
@pytest.mark.parametrize("in_memory", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rows_from_several_segments_in_any_order_are_each_rows_own_decoding(tmp_path, monkeypatch, encoding,
                                                                            in_memory, dtype):
    """A read gathers the codes of every segment in the order asked (repeats included) and decodes them once: each
    row equals the naive reference, that row encoded alone and decoded alone, bit for bit."""
    import molpredict.identification.coordinates_cache as cc

    rng = np.random.default_rng(11)
    x = rng.normal(size=(23, 7)) * rng.uniform(0.01, 100, size=(23, 1))
    keys = [f"m{i}" for i in range(23)]
    writer = CoordinatesCache(tmp_path, "s", encoding=encoding)
    for start in range(0, 23, 5):  # five segments, the last one short
        writer.append(keys[start:start + 5], x[start:start + 5])
    if not in_memory:
        monkeypatch.setattr(cc, "MEMORY_BUDGET_BYTES", 0)  # rows read from the store, segment by segment
    cache = CoordinatesCache(tmp_path, "s")
    assert len(cache._segments) == 5
    order = np.concatenate([rng.permutation(23), [4, 4, 22, 0]])
    got = cache.read(cache.rows([keys[i] for i in order]), dtype)
    assert got.dtype == dtype and got.shape == (len(order), 7)
    for position, i in enumerate(order):
        codes, scale = encode(x[i:i + 1], encoding)
        naive = codes.astype(dtype) * scale.astype(dtype)[:, None]
        np.testing.assert_array_equal(got[position], naive[0])
    assert bool(cache._loaded) == in_memory


def test_decode_into_a_given_array_is_the_cast_then_scaled_codes():
    codes = np.array([[-127, 0, 5], [127, -3, 1]], dtype=np.int8)
    scale = np.array([0.5, 3.25], dtype=np.float32)
    out = np.full((2, 3), np.nan, dtype=np.float32)
    assert decode(codes, scale, np.float32, out=out) is out
    np.testing.assert_array_equal(out, [[-63.5, 0.0, 2.5], [412.75, -9.75, 3.25]])
    np.testing.assert_array_equal(decode(codes, scale), codes.astype(np.float64) * scale.astype(np.float64)[:, None])


def test_coordinates_in_a_given_order_are_the_rows_of_those_keys(tmp_path):
    """``order`` returns the rows of ``keys[order]`` (repeats included), computing each missing key once."""
    molecules = mols(5)
    keys = [molecule_key(m) for m in molecules]
    f = Featurizer()
    cache = CoordinatesCache(tmp_path, "o")
    order = np.array([3, 0, 3, 4, 1])
    got = cache.coordinates(keys, lambda positions: [molecules[i] for i in positions], f, order=order)
    assert sorted(sum(f.asked, [])) == sorted(m.smiles for m in molecules)  # each key computed once
    np.testing.assert_array_equal(got, cache.coordinates(keys, lambda positions: [], f)[order])
    assert len(sum(f.asked, [])) == 5
