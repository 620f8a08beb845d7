"""The on-disk candidate-coordinates cache: lazy computation, persistence, crash safety, consolidation."""
from __future__ import annotations

import os

import numpy as np
import pytest

from molpredict import coordinates_cache
from molpredict.coordinates_cache import CoordinatesCache, molecule_key
from molpredict.molecules import Molecule


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


def test_molecule_key_never_computes_inchi():
    assert molecule_key(Molecule("CCO", inchikey="LFQSCWFLJHTTHZ-UHFFFAOYSA-N")) == "LFQSCWFLJHTTHZ-UHFFFAOYSA-N"
    m = Molecule("CCO")
    assert molecule_key(m) == "smiles:CCO" and m._inchikey is None


def test_second_run_computes_nothing(tmp_path):
    f = Featurizer()
    molecules = mols(10)
    first = CoordinatesCache(tmp_path, "k1").get(molecules, f, block_size=4)
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
    cache = CoordinatesCache(tmp_path, "k")
    f = Featurizer()
    cache.get(mols(5), f)
    f.asked.clear()
    molecules = mols(8) + mols(8)  # overlap with the cached five, and duplicates
    out = cache.get(molecules, f)
    assert sorted(sum(f.asked, [])) == sorted(m.smiles for m in mols(8)[5:])
    np.testing.assert_array_equal(out, Featurizer()(molecules))
    assert len(cache) == 8


def test_interrupt_keeps_finished_blocks(tmp_path):
    f = Featurizer(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        CoordinatesCache(tmp_path, "k").get(mols(10), f, block_size=3)
    cache = CoordinatesCache(tmp_path, "k")
    assert len(cache) == 6
    f2 = Featurizer()
    out = cache.get(mols(10), f2, block_size=3)
    assert sum(f2.asked, []) == [m.smiles for m in mols(10)[6:]]
    np.testing.assert_array_equal(out, Featurizer()(mols(10)))


def test_garbage_after_committed_rows_is_overwritten(tmp_path):
    cache = CoordinatesCache(tmp_path, "k")
    cache.get(mols(4), Featurizer())
    # an interrupted write left half a row past the committed end, and its segment was never written
    with open(tmp_path / "k" / "data.f64", "ab") as handle:
        handle.write(b"\x01" * 20)
    cache2 = CoordinatesCache(tmp_path, "k")
    out = cache2.get(mols(7), Featurizer())
    np.testing.assert_array_equal(out, Featurizer()(mols(7)))
    assert os.path.getsize(tmp_path / "k" / "data.f64") == 7 * 5 * 8
    np.testing.assert_array_equal(CoordinatesCache(tmp_path, "k").get(mols(7), Featurizer(fail_after=0)), out)


def test_consolidation(tmp_path, monkeypatch):
    monkeypatch.setattr(coordinates_cache, "CONSOLIDATE_AFTER", 4)
    cache = CoordinatesCache(tmp_path, "k")
    for i in range(11):
        cache.append([f"m{i}"], np.full((1, 3), float(i)))
    names = sorted(os.listdir(tmp_path / "k" / "index"))
    assert sum(n.startswith("all-") for n in names) == 1 and sum(n.startswith("seg-") for n in names) < 4
    fresh = CoordinatesCache(tmp_path, "k")
    assert len(fresh) == 11
    np.testing.assert_array_equal(fresh.read(fresh.rows([f"m{i}" for i in range(11)]))[:, 0], np.arange(11.0))


def test_two_writers_share_the_cache(tmp_path):
    a, b = CoordinatesCache(tmp_path, "k"), CoordinatesCache(tmp_path, "k")
    a.append(["x", "y"], np.array([[1.0, 2.0], [3.0, 4.0]]))
    b.append(["y", "z"], np.array([[3.0, 4.0], [5.0, 6.0]]))  # b has not seen a's rows yet
    a.refresh()
    for cache in (a, b, CoordinatesCache(tmp_path, "k")):
        assert len(cache) == 3
        np.testing.assert_array_equal(cache.read(cache.rows(["z", "x"])), [[5.0, 6.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="dimension"):
        a.append(["w"], np.zeros((1, 3)))
