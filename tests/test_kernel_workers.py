"""Kernel rows on worker processes (molpredict.kernels.workers): the same values, bit for bit, as in this process,
a fallback when a kernel cannot travel, and blocks bounded by ``block_cells``."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from molpredict.kernels.base import DegenerateObjectWarning, MIN_BLOCK_ROWS
from molpredict.kernels.mkl import MKLKernel
from molpredict.kernels.spectra import BLOCK_CELLS, CosineKernel, PPKLossesKernel
from molpredict.kernels.workers import MIN_PAIRS, RowPool, active_row_pool, rows_here, rows_on_workers, using_pool
from molpredict.spectra.record import Spectrum

from test_kernels_formulas import formula_spectra


def random_spectra(n: int, seed: int = 0) -> list[Spectrum]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, 12)) if i % 9 else 0  # some without peaks: degenerate rows
        mz = np.sort(rng.choice(np.arange(50.0, 300.0, 0.5), k, replace=False) + rng.normal(0, 0.003, k))
        out.append(Spectrum(f"s{i}", mz, rng.uniform(1, 100, k), precursor_mz=310.0 + (i % 7)))
    return out


def _fitted(kernel, spectra):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        return kernel.fit(spectra)


def _rows(kernel, spectra, index, messages=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DegenerateObjectWarning)
        rows = kernel.gram(index), kernel.transform(spectra), kernel.transform_features(kernel.featurize(spectra))
    if messages is not None:
        messages.extend(str(w.message) for w in caught if w.category is DegenerateObjectWarning)
    return rows


@pytest.mark.parametrize("make", [lambda: PPKLossesKernel(), lambda: CosineKernel(),
                                  lambda: MKLKernel(kernels="ppk-losses+formula-annotation+ppk-pairs")])
def test_rows_on_workers_equal_rows_here_bit_for_bit(make):
    train = random_spectra(150) + formula_spectra(0)
    queries = random_spectra(90, seed=1) + formula_spectra(1)
    kernel = _fitted(make(), train)
    index = np.arange(len(train))[::-1].copy()  # every row, in an order of its own
    said_here, said_away = [], []
    here = _rows(kernel, queries, index, said_here)
    with using_pool(RowPool(2, min_pairs=0)) as pool:
        assert active_row_pool() is pool and pool.wants(kernel, len(queries))
        away = _rows(kernel, queries, index, said_away)
        assert pool.tasks_run >= 3 * 2  # each request went out, in more than one chunk
    assert active_row_pool() is None
    for a, b in zip(here, away):
        assert a.shape == b.shape and np.array_equal(a, b)
    assert said_away == said_here and len(said_here) == 2  # the degenerate queries, counted by the workers too
    np.testing.assert_array_equal(np.diag(here[0][:, index]), 1.0)  # gram's self pairs stay exact


def test_small_requests_and_single_core_stay_here():
    kernel = _fitted(PPKLossesKernel(), random_spectra(40))
    pool = RowPool(2)  # the default threshold
    assert not pool.wants(kernel, 40)  # 40 x 40 values: far below MIN_PAIRS
    assert MIN_PAIRS > 40 * 40
    with using_pool(pool):
        kernel.gram()
    assert pool.tasks_run == 0 and pool._executor is None  # no process was started
    with rows_on_workers(1) as none:
        assert none is None and active_row_pool() is None


class _Unpicklable(PPKLossesKernel):
    """An opted-in kernel that holds something pickle refuses (a plugin might)."""

    def fit(self, objects):
        self.hook = lambda: None
        return super().fit(objects)


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_a_kernel_that_cannot_travel_is_computed_here_with_a_warning():
    train, queries = random_spectra(100), random_spectra(80, seed=2)
    kernel = _fitted(_Unpicklable(), train)
    want = _rows(kernel, queries, np.arange(100))
    with using_pool(RowPool(2, min_pairs=0)) as pool:
        assert pool.wants(kernel, 80)
        with pytest.warns(RuntimeWarning, match="_Unpicklable cannot be sent to worker processes"):
            got = kernel.gram(np.arange(100)), kernel.transform(queries)
        assert pool.tasks_run == 0 and pool._executor is None
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_block_cells_bound_the_rows_of_a_block():
    kernel = PPKLossesKernel()
    kernel.n_fit_ = 46_529
    assert kernel.rows_per_block() == BLOCK_CELLS // 46_529 == 257
    kernel.n_fit_ = 4_000  # landmarks: the rows of block_rows
    assert kernel.rows_per_block() == kernel.block_rows == 2048
    kernel.n_fit_ = 10 ** 9
    assert kernel.rows_per_block() == MIN_BLOCK_ROWS
    kernel.block_rows = 3  # an instance's block_rows still bounds it (the conformance suite's blocked check)
    assert kernel.rows_per_block() == 3
    mkl = _fitted(MKLKernel(kernels="ppk-losses+formula-annotation"), formula_spectra(0))
    assert mkl.rows_in_processes and mkl.block_cells == BLOCK_CELLS
    mkl.subkernels_[1].rows_in_processes = False  # one sub-kernel that stays home keeps the sum home
    assert not mkl.rows_in_processes


def test_blocks_of_any_size_give_the_same_rows():
    train, queries = random_spectra(120), random_spectra(50, seed=3)
    kernel = _fitted(PPKLossesKernel(), train)
    want = _rows(kernel, queries, np.arange(120))
    kernel.block_cells = 7 * 120  # 7 rows a block (not below MIN_BLOCK_ROWS: set block_rows too)
    kernel.block_rows = 7
    got = _rows(kernel, queries, np.arange(120))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_a_failing_worker_falls_back_to_this_process():
    train, queries = random_spectra(100), random_spectra(80, seed=4)
    kernel = _fitted(PPKLossesKernel(), train)
    want = kernel.transform_features(kernel.featurize(queries))
    with using_pool(RowPool(2, min_pairs=0)) as pool:
        path = pool._ship(kernel)
        with open(path, "wb") as handle:  # the workers cannot load the kernel: every task fails
            handle.write(b"not a pickle")
        with pytest.warns(RuntimeWarning, match="kernel rows on worker processes failed for PPKLossesKernel"):
            got = kernel.transform_features(kernel.featurize(queries))
        assert not pool.wants(kernel, 80)
        # one kernel's failure is that kernel's: the pool (not broken) still serves the others
        other = _fitted(CosineKernel(), train)
        assert not pool.broken and pool.wants(other, 80)
        before = pool.tasks_run
        np.testing.assert_array_equal(other.transform(queries), _rows_away_from(other, queries))
        assert pool.tasks_run > before
    np.testing.assert_array_equal(want, got)


def _rows_away_from(kernel, queries):
    with rows_here():
        return kernel.transform(queries)


class _KilledWorker(PPKLossesKernel):
    """An opted-in kernel whose rows kill the worker process computing them (out of memory, say)."""

    def _rows_here(self, features, out):
        import multiprocessing

        if multiprocessing.parent_process() is not None:
            os._exit(1)
        return super()._rows_here(features, out)


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_a_broken_pool_sends_every_kernel_back_to_this_process():
    train, queries = random_spectra(100), random_spectra(80, seed=9)
    kernel, other = _fitted(_KilledWorker(), train), _fitted(CosineKernel(), train)
    want = _rows_away_from(kernel, queries)
    with using_pool(RowPool(2, min_pairs=0)) as pool:
        with pytest.warns(RuntimeWarning, match=r"kernel rows on worker processes failed \(BrokenProcessPool"):
            got = kernel.transform(queries)
        assert pool.broken and not pool.wants(other, 80)
    np.testing.assert_array_equal(want, got)


_PLUGIN_PPK = """
from molpredict.hookspecs import hookimpl
from molpredict.kernels.spectra import PPKernel


class DirPPK(PPKernel):
    \"\"\"A plugins-directory kernel: inherits rows_in_processes from the built-in PPK.\"\"\"


@hookimpl
def register_input_kernels(register):
    register("dir-ppk", DirPPK)
"""


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_a_plugins_dir_kernel_trains_with_rows_on_workers(tmp_path, monkeypatch):
    """A spawned worker imports the kernel's class from the plugins-directory file (as molpredict_plugin_NAME);
    it could not import that module by itself, and every row came back to the training process."""
    from contextlib import contextmanager

    from click.testing import CliRunner
    from identification_helpers import synthetic_spectra
    from molpredict.cli import cli
    from molpredict.io import write_mgf
    from molpredict.kernels import workers
    from plugin_helpers import use_plugins_dir

    use_plugins_dir(tmp_path, monkeypatch, {"dirppk.py": _PLUGIN_PPK})
    pools = []

    @contextmanager
    def small_rows_on_workers(n_jobs=-1, min_pairs=workers.MIN_PAIRS):  # every request goes out, on 2 workers
        with using_pool(RowPool(2, min_pairs=0)) as pool:
            pools.append(pool)
            yield pool

    monkeypatch.setattr(workers, "rows_on_workers", small_rows_on_workers)
    spectra, _ = synthetic_spectra(n_per=8, seed=0)  # 96: the 64 landmarks' rows are a request for the workers
    write_mgf(spectra, tmp_path / "train.mgf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        result = CliRunner().invoke(cli, ["train", str(tmp_path / "train.mgf"), "-o", str(tmp_path / "m"),
                                          "--input-kernel", "dir-ppk", "--lam", "0.1", "--device", "cpu",
                                          "--no-fragments", "--prior", "none", "--input-sketch", "subsample:m=64",
                                          "--output-sketch", "subsample:m=8"])
    assert result.exit_code == 0, result.output
    failed = [str(w.message) for w in caught if "worker processes" in str(w.message)]
    assert failed == [] and pools and sum(pool.tasks_run for pool in pools) > 0


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_a_refitted_kernel_is_sent_again():
    kernel = PPKLossesKernel().fit(random_spectra(100))
    queries = random_spectra(80, seed=5)
    with using_pool(RowPool(2, min_pairs=0)):
        first = kernel.transform(queries)
        kernel.fit(random_spectra(100, seed=6))  # same object, other reference spectra
        second = kernel.transform(queries)
    np.testing.assert_array_equal(first, PPKLossesKernel().fit(random_spectra(100)).transform(queries))
    np.testing.assert_array_equal(second, kernel.transform(queries))
    assert not np.array_equal(first, second)


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_workers_start_only_as_many_as_memory_allows(monkeypatch):
    from molpredict.kernels import workers

    kernel = PPKLossesKernel().fit(random_spectra(100))
    queries = random_spectra(80, seed=7)
    want = kernel.transform(queries)
    monkeypatch.setattr(workers, "available_memory", lambda: 10_000)  # room for no worker at all
    with using_pool(RowPool(4, min_pairs=0)) as pool:
        got = kernel.transform(queries)
        assert pool.tasks_run == 0 and pool._executor is None and pool.workers < 2
    np.testing.assert_array_equal(want, got)
    monkeypatch.setattr(workers, "available_memory", lambda: None)  # unknown: every process asked for
    with using_pool(RowPool(2, min_pairs=0)) as pool:
        np.testing.assert_array_equal(want, kernel.transform(queries))
        assert pool.workers == 2 and pool.tasks_run > 0


@pytest.mark.filterwarnings("ignore::molpredict.kernels.base.DegenerateObjectWarning")
def test_rows_here_sets_the_active_pool_aside_and_brings_it_back():
    kernel = PPKLossesKernel().fit(random_spectra(100))
    queries = random_spectra(80, seed=8)
    with using_pool(RowPool(2, min_pairs=0)) as pool:
        with rows_here():
            assert active_row_pool() is None
            here = kernel.transform(queries)
        assert active_row_pool() is pool and pool.tasks_run == 0  # nothing ran on the workers, the pool stays open
        np.testing.assert_array_equal(here, kernel.transform(queries))
        assert pool.tasks_run > 0
    assert active_row_pool() is None
