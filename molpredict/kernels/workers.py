"""Kernel rows on worker processes, for the large requests of a training run.

The spectrum kernels compute a block of rows with many numpy calls per block (peak windows by ``searchsorted``,
pair terms, sums by ``bincount``) and hold the GIL between them: on threads the default kernel's rows ran 1.16x
faster on 2 cores and not at all faster on 16 (docs/benchmarks/train_speed_gpu.md). Within
:func:`rows_on_workers`, a kernel that opts in (:attr:`~molpredict.kernels.base.Kernel.rows_in_processes`) computes
a large request of rows (``gram``, ``transform``) on a pool of spawned processes instead:

- the fitted kernel is pickled once per pool into a private temporary directory, and each worker unpickles it once
  (transport between this process and its own workers; the directory is removed with the pool); the file names the
  plugins-directory modules imported here first, so that a worker imports a plugin's kernel class from the same
  file (:func:`molpredict.registry.find_plugin_files`);
- the rows are cut into chunks of whole rows, and a worker runs the kernel's own block code on its chunk, so every
  value is the one the single-process path computes, bit for bit;
- the pool starts only as many processes as fit in half of the memory available then (each holds the kernel and
  a chunk's rows); fewer than two, and this process computes the rows;
- a kernel that cannot be pickled, or whose rows fail on the workers, falls back to this process with a warning
  (the values do not depend on where they were computed), and the other kernels keep the pool; a pool that breaks
  (a worker killed) sends every kernel's rows back to this process.

Identification never opens a pool: its requests are a block of queries against the landmarks, where starting
processes would cost more than the rows.
"""
from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
import warnings
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from molpredict.registry import find_plugin_files, plugin_files

__all__ = ["rows_on_workers", "using_pool", "rows_here", "active_row_pool", "RowPool", "available_memory", "MIN_PAIRS",
           "MIN_CHUNK_ROWS"]

#: requests of fewer kernel values (rows x reference objects) stay in this process: starting a spawned worker
#: costs about a second, and the default spectrum kernel computes about 3 million values a second per core
MIN_PAIRS = 8_000_000
#: the fewest rows a worker's task gets (its pickled features and result must outweigh the round trip)
MIN_CHUNK_ROWS = 32

_ACTIVE = threading.local()


def active_row_pool() -> "RowPool | None":
    """The pool of the innermost :func:`rows_on_workers` block of this thread, or None."""
    return getattr(_ACTIVE, "pool", None)


@contextmanager
def rows_on_workers(n_jobs: int | None = -1, min_pairs: int = MIN_PAIRS) -> Iterator["RowPool | None"]:
    """Within the block, large kernel-row requests of opted-in kernels run on ``n_jobs`` processes (joblib's
    convention, :func:`molpredict.chem.molecules.n_workers`; one core or ``n_jobs`` 1: nothing changes).

    The processes start at the first request that needs them and stop when the block ends.
    """
    from molpredict.chem.molecules import n_workers

    workers = n_workers(n_jobs)
    if workers <= 1:
        yield None
        return
    with using_pool(RowPool(workers, min_pairs=min_pairs)) as pool:
        yield pool


@contextmanager
def _active(pool: "RowPool | None") -> Iterator[None]:
    """``pool`` (None: no pool) is this thread's active pool within the block; the previous one comes back after."""
    previous = active_row_pool()
    _ACTIVE.pool = pool
    try:
        yield
    finally:
        _ACTIVE.pool = previous


@contextmanager
def using_pool(pool: "RowPool") -> Iterator["RowPool"]:
    """Make ``pool`` this thread's active pool within the block, and close it at the end."""
    try:
        with _active(pool):
            yield pool
    finally:
        pool.close()


@contextmanager
def rows_here() -> Iterator[None]:
    """Within the block, every kernel row is computed in this process: an active pool is set aside (not closed)
    and comes back at the end."""
    with _active(None):
        yield


class RowPool:
    """Spawned worker processes that compute kernel rows (:meth:`transform_features`).

    Parameters
    ----------
    workers : int
        Processes (started on the first request).
    min_pairs : int
        Requests of fewer kernel values stay in the calling process.
    """

    def __init__(self, workers: int, min_pairs: int = MIN_PAIRS) -> None:
        self.workers = int(workers)
        self.min_pairs = int(min_pairs)
        self._executor: Any = None
        self._directory: str | None = None
        # id(kernel) -> (kernel, its fit features, the file the workers load it from); the references keep the
        # ids from being reused while the pool lives
        self._shipped: dict[int, tuple[Any, Any, str]] = {}
        self._refused: set[int] = set()
        self._files_written = 0
        self.broken = False
        self.tasks_run = 0

    def wants(self, kernel: Any, n_rows: int) -> bool:
        """Whether ``n_rows`` rows of ``kernel`` go to the workers."""
        return (not self.broken and getattr(kernel, "rows_in_processes", False) and id(kernel) not in self._refused
                and n_rows >= 2 * MIN_CHUNK_ROWS and n_rows * int(getattr(kernel, "n_fit_", 0)) >= self.min_pairs)

    def transform_features(self, kernel: Any, features: Any, out: np.ndarray) -> int | None:
        """Fill ``out`` (len(features), n_fit) with ``kernel``'s rows of ``features`` on the workers.

        Returns
        -------
        int or None
            The number of degenerate rows (as ``Kernel._transform_features``), or None when the request was not
            run on the workers (the caller computes it itself).
        """
        n = len(features)
        path = self._ship(kernel)
        if path is None:
            return None
        chunk = max(MIN_CHUNK_ROWS, min(kernel.rows_per_block(), -(-n // (4 * self.workers))))
        # a worker holds the unpickled kernel and a chunk's rows twice (computed, then pickled to send back)
        per_worker = 2 * os.path.getsize(path) + 2 * chunk * int(kernel.n_fit_) * 8
        if self._executor is None and self._processes_that_fit(per_worker) < 2:
            return None  # too little free memory for two workers: this process computes the rows
        starts = range(0, n, chunk)
        futures: list[Any] = []
        try:
            executor = self._pool()
            futures = [executor.submit(_rows_task, path, kernel.take(features, slice(s, min(s + chunk, n))))
                       for s in starts]
            n_degenerate = 0
            for start, future in zip(starts, futures):
                block, degenerate = future.result()
                out[start:start + len(block)] = block
                n_degenerate += degenerate
        except BrokenProcessPool as exc:  # a worker killed (out of memory): no kernel can use the pool any more
            self.broken = True
            warnings.warn(f"kernel rows on worker processes failed ({type(exc).__name__}: {exc}); computing them "
                          "in this process", RuntimeWarning, stacklevel=3)
            return None
        except Exception as exc:  # this kernel's tasks failed (it cannot be loaded or run there): only its rows
            for future in futures:  # stay here; the pool still serves the other kernels
                future.cancel()
            self._refused.add(id(kernel))
            warnings.warn(f"kernel rows on worker processes failed for {type(kernel).__name__} "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())}); computing its rows in this process",
                          RuntimeWarning, stacklevel=3)
            return None
        self.tasks_run += len(futures)
        return n_degenerate

    def _ship(self, kernel: Any) -> str | None:
        """The file the workers load ``kernel`` from (written at its first request), or None when it cannot be
        pickled."""
        shipped = self._shipped.get(id(kernel))
        if shipped is not None and shipped[1] is kernel.fit_features_:
            return shipped[2]
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="molpredict-rows-")
        # a new name per shipment: a refitted kernel must not reach a worker that cached the file's old content
        self._files_written += 1
        path = os.path.join(self._directory, f"kernel-{self._files_written}.pickle")
        try:
            with open(path, "wb") as handle:
                # first the plugin files a worker must be able to import (by the name this process gave them) before
                # it unpickles the kernel: a plugins-directory kernel's class lives in one
                pickle.dump(plugin_files(), handle, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.dump(kernel, handle, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError, OSError) as exc:
            self._refused.add(id(kernel))
            warnings.warn(f"{type(kernel).__name__} cannot be sent to worker processes ({exc}); its rows are "
                          "computed in this process", RuntimeWarning, stacklevel=4)
            return None
        self._shipped[id(kernel)] = (kernel, kernel.fit_features_, path)
        return path

    def _processes_that_fit(self, per_worker: int) -> int:
        """How many of the pool's processes fit in half of the memory now available (all where it is unknown);
        the pool starts that many."""
        available = available_memory()
        if available is not None:
            self.workers = min(self.workers, int(available // 2 // max(1, per_worker)))
        return self.workers

    def _pool(self) -> Any:
        if self._executor is None:
            from concurrent.futures import ProcessPoolExecutor
            from multiprocessing import get_context

            # spawned, not forked: the training process holds torch's and BLAS's threads
            self._executor = ProcessPoolExecutor(max_workers=self.workers, mp_context=get_context("spawn"))
        return self._executor

    def close(self) -> None:
        """Stop the workers and remove the kernels' files."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
        self._shipped.clear()


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux ``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


#: in a worker: the kernels loaded so far, by file
_LOADED: dict[str, Any] = {}


def _rows_task(path: str, features: Any) -> tuple[np.ndarray, int]:
    """In a worker: the kernel rows of ``features`` against the reference objects, and the degenerate count."""
    kernel = _LOADED.get(path)
    if kernel is None:
        with open(path, "rb") as handle:  # written by this worker's own parent (RowPool._ship)
            find_plugin_files(pickle.load(handle))
            kernel = _LOADED[path] = pickle.load(handle)
    out = np.empty((len(features), kernel.n_fit_), dtype=np.float64)
    n_degenerate = kernel._rows_here(features, out)
    return out, n_degenerate
