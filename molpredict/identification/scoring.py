"""Scoring: candidate coordinates for library rows, and the scores of query blocks against their candidates, run
block by block on an executor.

Identification, evaluation and library precompute share one shape: a stream of blocks, each handled by a task
that needs the same loaded state (a model bundle, a candidate source, the coordinates cache). So they share one
seam:

* :func:`score_queries` scores a block of queries of one sub-model: the coordinates of each distinct candidate list
  of the block are fetched once (:class:`CandidateCoordinates`, through the on-disk cache), the queries'
  coordinates are predicted together, and each group of queries sharing one candidate list is scored with one
  matrix product, so memory stays bounded by the block, never ``n_queries x n_library``. :func:`scored` cuts a
  stream of queries into such blocks and yields, per query in input order, the **raw model score vector**
  aligned with the query's candidate ids. What is made of those scores (ranking, output rows, metrics) belongs
  to the caller (:mod:`molpredict.identification.identify`, :mod:`molpredict.identification.evaluate`).
* :func:`shared_candidate_scores` scores blocks of inputs against one shared candidate list (text queries
  against a whole library), in chunks of candidates.
* :func:`score_library` computes and stores the candidate coordinates of a whole library, block of rows by
  block, resumably.

Executors run ``task(state, block)`` for every block and yield the results in block order, whoever ran each
block: :class:`InProcessExecutor` (the default) runs them here, one after another.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from molpredict.identification.coordinates_cache import CoordinatesCache, smiles_keys, store_key
from molpredict.errors import InputError
from molpredict.modelfile import ModelBundle, SubModel

__all__ = ["Query", "CandidateCoordinates", "score_queries", "query_blocks", "scored", "shared_candidate_scores",
           "score_library", "load_bundle_once", "load_library_once", "library_file", "bundle_stamp", "file_stamp",
           "content_token", "WorkerState", "Executor", "InProcessExecutor", "DaskExecutor", "executor_for",
           "chunked", "SCORING_DTYPE"]

#: ``coordinates(sub, ids, dtype=np.float64) -> ndarray (len(ids), d)``: candidate coordinates of ``ids`` in their order
#: (repeats allowed)
CoordinatesFn = Callable[..., np.ndarray]

#: The precision of the query-candidate products of a dot-product model. The stored candidate coordinates are int8
#: codes (:mod:`~molpredict.identification.coordinates_cache`: a relative error up to 0.4% per coordinate), so
#: float32's 6e-8 changes no ranking that matters, and it halves the memory traffic of the three steps that bound
#: identification (decoding, predicting, scoring): docs/benchmarks/scoring_precision.md measures both on validation.
SCORING_DTYPE = np.float32


@dataclass
class Query:
    """A spectrum (or, for a text model, a description) on its way through the pipeline."""

    position: int
    spectrum: Any
    mode: str
    sub: SubModel
    ids: np.ndarray                   # candidate ids in the source (ascending)
    adducts: np.ndarray | None = None  # adduct name per candidate (object array) or None
    adduct: str = ""                   # the adduct reported when ``adducts`` is None
    true_key: str | None = None        # for evaluation: the true structure's InChIKey first block
    window: str = ""                   # the mass window its candidates were selected with ("" by formula)
    query_id: str | None = None        # its id in the output, unique within a run (default: the spectrum's)


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of ``size`` items (the last one shorter), lazily."""
    block: list[Any] = []
    for item in items:
        block.append(item)
        if len(block) >= size:
            yield block
            block = []
    if block:
        yield block


class CandidateCoordinates:
    """Candidate coordinates of one candidate source, per sub-model, through the on-disk cache.

    Parameters
    ----------
    source : CandidateSource
        Supplies cache keys and molecules of candidate ids.
    cache_root : path, False or None
        Root of the coordinates cache (None: the default location; False: no disk cache, coordinates are
        computed on every call).
    """

    def __init__(self, source: Any, cache_root: Any = None) -> None:
        self.source = source
        self.cache_root = cache_root
        self._caches: dict[int, tuple[Any, CoordinatesCache | None]] = {}

    def cache(self, sub: SubModel) -> CoordinatesCache | None:
        """The cache of ``sub``'s model (None when caching is off), opened once."""
        return self.model_cache(sub.model)

    def model_cache(self, model: Any) -> CoordinatesCache | None:
        """The cache of any fitted model's candidate coordinates (a spectrum model, a structure prior), opened
        once per model object."""
        key = id(model)
        if key not in self._caches:
            # keep the model alive with its cache: an id() may be reused once its object is gone
            self._caches[key] = (model, None if self.cache_root is False
                                 else CoordinatesCache(self.cache_root, store_key(model)))
        return self._caches[key][1]

    def __call__(self, sub: SubModel, ids: np.ndarray, timings: Counter, dtype: Any = np.float64) -> np.ndarray:
        """Coordinates of candidates ``ids`` (in any order, repeats allowed) for ``sub``'s model, ndarray of shape
        (len(ids), d), in ``dtype`` (float64 by default), rows in the order of ``ids``. Each distinct id is computed
        or read once. Time spent is added to ``timings`` (``featurize_s``, ``cache_read_s``)."""
        return self.of_model(sub.model, ids, timings, dtype)

    def of_model(self, model: Any, ids: np.ndarray, timings: Counter, dtype: Any = np.float64) -> np.ndarray:
        """Like :meth:`__call__` for any fitted model with ``candidate_coordinates``."""
        cache = self.model_cache(model)
        t0 = time.perf_counter()
        ids = np.asarray(ids, dtype=np.int64)
        distinct, inverse = np.unique(ids, return_inverse=True)
        in_order = distinct.size == ids.size and bool((distinct == ids).all())
        if cache is None:
            coords = np.asarray(model.candidate_coordinates(self.source.molecules(distinct)), dtype=dtype)
            timings["featurize_s"] += time.perf_counter() - t0
            return coords if in_order else coords[inverse]
        computed = []  # whether the store computed any (missing or damaged) rows: the time is featurising then

        def compute(molecules: list[Any]) -> np.ndarray:
            computed.append(len(molecules))
            return model.candidate_coordinates(molecules)

        coords = cache.coordinates(self.source.keys(distinct),
                                   lambda positions: self.source.molecules(distinct[positions]), compute, dtype=dtype,
                                   order=None if in_order else inverse)
        timings["featurize_s" if computed else "cache_read_s"] += time.perf_counter() - t0
        return coords


def _formula_rows(query: Query, candidate_formulas: np.ndarray, inputs: list[Any]) -> np.ndarray:
    """Encode a spectrum without a formula once per (candidate formula, adduct) of its candidates: the copies are
    appended to ``inputs``; returns the row of ``inputs`` each candidate is scored with, shape (len(query.ids),)."""
    adducts = query.adducts if query.adducts is not None else [query.adduct] * len(query.ids)
    spectrum = query.spectrum
    index: dict[tuple[Any, Any], int] = {}
    rows = np.empty(len(query.ids), dtype=np.int64)
    for c, key in enumerate(zip(candidate_formulas, adducts)):
        row = index.get(key)
        if row is None:
            formula, adduct = key
            row = index[key] = len(inputs)
            inputs.append(dataclasses.replace(spectrum, metadata={**spectrum.metadata, "formula": formula},
                                              adduct=adduct or spectrum.adduct))
        rows[c] = row
    return rows


def score_queries(queries: Sequence[Query], coordinates: CoordinatesFn, timings: Counter,
                  formulas: Callable[[np.ndarray], np.ndarray] | None = None) -> list[np.ndarray]:
    """Raw model scores of each query's candidates, for queries of one sub-model.

    Parameters
    ----------
    queries : sequence of Query, length n
        All of the same sub-model.
    coordinates : callable
        ``coordinates(sub, ids, dtype=...) -> ndarray (len(ids), d)``, rows in the order of ``ids`` (the block's
        distinct candidate lists one after another: repeats across lists are possible).
    timings : Counter
        ``predict_s`` and ``score_s`` are added to it.
    formulas : callable, optional
        ``formulas(ids) -> object array of str``, the candidates' molecular formulas. Given, and the model
        :attr:`~molpredict.models.base.Model.reads_formula`, a query whose spectrum has no formula is encoded once
        per (candidate formula, adduct) and each candidate scored with its own formula's encoding.

    Returns
    -------
    list of ndarray
        ``scores[i]``: shape (len(queries[i].ids),), float64, aligned with ``queries[i].ids``; a dot-product
        model's products run in :data:`SCORING_DTYPE`.
    """
    sub = queries[0].sub
    dtype = SCORING_DTYPE if sub.model.dot_product_scores else np.float64
    per_formula = formulas is not None and sub.model.reads_formula
    inputs: list[Any] = []
    rows: list[Any] = []  # per query: its row of inputs, or one row per candidate
    for q in queries:
        if per_formula and not q.spectrum.formula and len(q.ids):
            rows.append(_formula_rows(q, formulas(q.ids), inputs))
        else:
            rows.append(len(inputs))
            inputs.append(q.spectrum)
    groups: dict[bytes, list[int]] = {}  # queries sharing one candidate list, scored with one product
    for i, q in enumerate(queries):
        if isinstance(rows[i], int):
            groups.setdefault(q.ids.tobytes(), []).append(i)
    # Each distinct candidate list once, one after another: its coordinates are then one contiguous slice (the store
    # decodes straight into that order; gathering float rows per list from a sorted union copied them again).
    lists = [queries[members[0]].ids for members in groups.values()] + \
        [q.ids for q, r in zip(queries, rows) if not isinstance(r, int)]
    starts = np.concatenate([[0], np.cumsum([len(ids) for ids in lists])]).astype(np.int64)
    coords = coordinates(sub, np.concatenate(lists) if lists else np.empty(0, np.int64), dtype=dtype)
    t0 = time.perf_counter()
    predicted = sub.model.predict_coordinates_as(inputs, dtype)
    timings["predict_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    out: list[np.ndarray | None] = [None] * len(queries)
    next_list = len(groups)
    for i, q in enumerate(queries):
        if not isinstance(rows[i], int):  # each candidate against its own formula's encoding, encoding by encoding
            block = coords[starts[next_list]:starts[next_list + 1]]
            next_list += 1
            scores = np.empty(len(q.ids), dtype=np.float64)
            for row in np.unique(rows[i]):
                mine = np.flatnonzero(rows[i] == row)
                scores[mine] = (np.einsum("cd,d->c", block[mine], predicted[row]) if sub.model.dot_product_scores
                                else sub.model.score_coordinates(predicted[row:row + 1], block[mine])[0])
            out[i] = scores
    # The products are small (a few queries x a few candidates: by formula in a 2M-structure pool the median query
    # has 3) and run in numpy, outside BLAS: einsum's own loop on one thread. A threaded BLAS call per query waits
    # for its worker threads, 10-20x slower than one thread on a busy machine; and every row is one dot product
    # with one summation order, so candidates with equal coordinates get exactly equal scores (ties then go by
    # InChIKey, as documented; a blocked BLAS kernel may round rows differently by their position).
    P = np.ascontiguousarray(predicted)
    for g, members in enumerate(groups.values()):
        block = coords[starts[g]:starts[g + 1]]
        own = [rows[i] for i in members]
        if not sub.model.dot_product_scores:
            scores = sub.model.score_coordinates(P[own], block)
        else:
            scores = np.einsum("qd,cd->qc", P[own], block)
        for row, i in enumerate(members):
            out[i] = scores[row].astype(np.float64)
    timings["score_s"] += time.perf_counter() - t0
    return out  # type: ignore[return-value]


def query_blocks(queries: Iterable[Query], block_queries: int, max_block_candidates: int
                 ) -> Iterator[list[Query]]:
    """Consecutive blocks of at most ``block_queries`` queries, cut early once the block's candidate count
    reaches ``max_block_candidates`` (bounds the coordinate rows a block holds)."""
    block: list[Query] = []
    size = 0
    for q in queries:
        block.append(q)
        size += len(q.ids)
        if len(block) >= block_queries or size >= max_block_candidates:
            yield block
            block, size = [], 0
    if block:
        yield block


def scored(queries: Iterable[Query], coordinates: CoordinatesFn, timings: Counter, block_queries: int = 512,
           max_block_candidates: int = 16384, formulas: Callable[[np.ndarray], np.ndarray] | None = None
           ) -> Iterator[tuple[Query, np.ndarray]]:
    """``(query, raw model scores aligned with query.ids)`` in input order, block by block (grouped by
    sub-model inside a block; see :func:`score_queries`)."""
    for block in query_blocks(queries, block_queries, max_block_candidates):
        by_mode: dict[str, list[int]] = {}
        for i, q in enumerate(block):
            by_mode.setdefault(q.mode, []).append(i)
        results: list[np.ndarray | None] = [None] * len(block)
        for members in by_mode.values():
            for i, scores in zip(members, score_queries([block[i] for i in members], coordinates, timings,
                                                        formulas)):
                results[i] = scores
        yield from zip(block, results)  # type: ignore[misc]


def shared_candidate_scores(coordinates: CoordinatesFn, sub: SubModel, inputs: Sequence[Any], ids: np.ndarray,
                            timings: Counter, block_queries: int = 64, chunk: int = 16384
                            ) -> Iterator[tuple[int, np.ndarray]]:
    """Scores of the same candidates ``ids`` for every input, block of inputs by block.

    The candidates are taken in chunks of ``chunk`` rows, so memory is bounded by ``block_queries x len(ids)``
    scores plus one chunk of coordinates, never ``n_inputs x len(ids)``.

    Parameters
    ----------
    coordinates : callable
        ``coordinates(sub, ids) -> ndarray (len(ids), d)`` (cached candidate coordinates).
    sub : SubModel
    inputs : sequence
        What ``sub.model.predict_coordinates`` takes (descriptions for a text model).
    ids : ndarray of shape (n_candidates,), int64
        Candidate ids, ascending and unique.
    timings : Counter
        ``predict_s`` and ``score_s`` are added to it.
    block_queries : int
        Inputs per block.
    chunk : int
        Candidate rows per coordinates fetch.

    Yields
    ------
    (start, scores)
        ``scores``: ndarray of shape (block size, n_candidates), float64, for ``inputs[start:start + b]``.
    """
    inputs = list(inputs)
    ids = np.asarray(ids, dtype=np.int64)
    chunk = max(1, int(chunk))
    model = sub.model
    for start in range(0, len(inputs), block_queries):
        block = inputs[start:start + block_queries]
        t0 = time.perf_counter()
        predicted = np.asarray(model.predict_coordinates(block), dtype=np.float64)
        timings["predict_s"] += time.perf_counter() - t0
        scores = np.empty((len(block), len(ids)), dtype=np.float64)
        for lo in range(0, len(ids), chunk):
            coords = coordinates(sub, ids[lo:lo + chunk])
            t0 = time.perf_counter()
            if model.dot_product_scores:
                scores[:, lo:lo + chunk] = predicted @ coords.T
            else:
                scores[:, lo:lo + chunk] = model.score_coordinates(predicted, coords)
            timings["score_s"] += time.perf_counter() - t0
        yield start, scores


# -- executors ---------------------------------------------------------------------------------------------

class WorkerState:
    """What block tasks need, described so that another process can load it once (a picklable recipe).

    Subclasses hold paths or small data and implement :meth:`load`; a Dask worker loads a state once (keyed by
    :attr:`token`) and reuses it for every block it runs.
    """

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex

    def load(self) -> Any:
        """The live object the tasks take (e.g. an :class:`~molpredict.identification.identify.Identifier`)."""
        raise NotImplementedError


_LOADED: dict[str, Any] = {}
_LOADED_LOCK = threading.Lock()
_BUNDLES: dict[tuple[str, int], ModelBundle] = {}
#: libraries read by :func:`load_library_once`, keyed by :func:`file_stamp` (one kept per process: they are big)
_LIBRARIES: dict[tuple[str, int, int], Any] = {}


def bundle_stamp(path: str) -> tuple[str, int]:
    """``(real path, modification time of bundle.json)``: what identifies a saved bundle's content."""
    directory = os.path.realpath(path)
    marker = os.path.join(directory, "bundle.json")
    return directory, os.stat(marker if os.path.exists(marker) else directory).st_mtime_ns


def file_stamp(path: str | os.PathLike) -> tuple[str, int, int]:
    """``(real path, size, modification time)`` of a file: what identifies its content for per-process caches."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    return real, int(stat.st_size), int(stat.st_mtime_ns)


def load_bundle_once(path: str) -> ModelBundle:
    """A bundle loaded once per process (keyed by path and modification time), for worker states: a new run
    on a warm worker does not load the model again."""
    key = bundle_stamp(path)
    bundle = _BUNDLES.get(key)
    if bundle is None:
        bundle = _BUNDLES[key] = ModelBundle.load(path)
    return bundle


def load_library_once(path: str | os.PathLike, **kwargs: Any) -> Any:
    """A candidate library read once per process (keyed by :func:`file_stamp`; ``kwargs`` go to
    :func:`~molpredict.chem.candidates.read_library`). A library read here is known by its file
    (:func:`library_file`), so a cluster's workers read it themselves instead of receiving a pickled copy."""
    from molpredict.chem.candidates import read_library

    try:
        key = file_stamp(path)
    except OSError:  # missing or unreadable: read_library says so in one line (file named)
        return read_library(path, **kwargs)
    library = _LIBRARIES.get(key)
    if library is None:
        library = read_library(path, **kwargs)
        _LIBRARIES.clear()
        _LIBRARIES[key] = library
    return library


def library_file(library: Any) -> tuple[str, int, int] | None:
    """The :func:`file_stamp` of the file ``library`` was read from by :func:`load_library_once` (still
    unchanged on disk), or None (a library built or subset in memory, or a file changed since)."""
    for key, known in _LIBRARIES.items():
        if known is library:
            try:
                return key if file_stamp(key[0]) == key else None
            except OSError:
                return None
    return None


def content_token(*parts: Any) -> str:
    """A hex digest of picklable ``parts`` (paths with their stamps, options): a worker state's token that
    stays the same from run to run while the inputs are unchanged, so warm workers keep what they loaded."""
    import hashlib
    import pickle

    return hashlib.sha256(pickle.dumps(parts, protocol=4)).hexdigest()


def _loaded(live: Any, block: Any) -> int:
    """The task of :func:`_preload`: nothing beyond loading the state; the worker's process id."""
    return os.getpid()


def _preload(state: WorkerState) -> int:
    """Load ``state`` on the worker that runs this (once per process and token, as every block does)."""
    return _run_block(_loaded, state, None)


def _run_block(task: Callable[[Any, Any], Any], state: WorkerState, block: Any) -> Any:
    """A task as a worker runs it: the state is loaded once per process, blocks run one at a time per
    process (the state's caches are not shared between threads)."""
    with _LOADED_LOCK:
        live = _LOADED.get(state.token)
        if live is None:
            _LOADED.clear()  # a new run: the previous run's state (its source, its caches) is done with
            live = _LOADED[state.token] = state.load()
        return task(live, block)


class Executor:
    """Runs ``task(state, block)`` for every block; yields the results in block order.

    ``in_process`` executors take the live state object; the others take a :class:`WorkerState`.
    """

    in_process = True
    name = "in-process"

    def map(self, task: Callable[[Any, Any], Any], state: Any, blocks: Iterable[Any],
            on_done: Callable[[Any], None] | None = None) -> Iterator[Any]:
        """Results of ``task(state, block)`` in block order; ``on_done(result)`` is called as each finishes."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the executor started."""


class InProcessExecutor(Executor):
    """Every block here, one after another (the default)."""

    def map(self, task: Callable[[Any, Any], Any], state: Any, blocks: Iterable[Any],
            on_done: Callable[[Any], None] | None = None) -> Iterator[Any]:
        for block in blocks:
            result = task(state, block)
            if on_done is not None:
                on_done(result)
            yield result


def local_worker_config(environ: dict[str, Any]) -> dict[str, Any]:
    """Dask settings for the worker processes of a ``local:N`` cluster, so that a worker spends on a spectrum
    the CPU the process spends in-process.

    - No ``MALLOC_TRIM_THRESHOLD_`` (Dask's nanny sets 64 KiB): glibc then returns freed memory to the system
      at once and maps it again for the next block's arrays, page faults that cost a numpy-heavy task system
      time on every allocation (``environ``: the nanny's environment without it; one BLAS / OpenMP thread per
      single-threaded worker is kept).
    - No statistical profiler (it samples every thread's stack every 10 ms: CPU the task does not get).
    """
    kept = {k: v for k, v in dict(environ).items() if k != "MALLOC_TRIM_THRESHOLD_"}
    return {"distributed.nanny.pre-spawn-environ": kept, "distributed.worker.profile.enabled": False}


class DaskExecutor(Executor):
    """Blocks as tasks on a ``dask.distributed`` cluster; results yielded in block order.

    The :class:`WorkerState` is scattered to every worker once and loaded there once; blocks are submitted as
    they are read, at most ``window`` in flight (memory stays bounded by the window, the input is streamed);
    results are collected as they complete (:func:`distributed.as_completed`, which drives ``on_done``) and
    released in block order. A worker that dies mid-run has its tasks rerun elsewhere by the scheduler; the
    results are only ever taken from the futures, so no block is lost or counted twice.

    Parameters
    ----------
    client : distributed.Client
    window : int, optional
        Blocks in flight (default: twice the cluster's threads, at least 4).
    owned : sequence, optional
        Objects to close with the executor (the client and the LocalCluster it started).
    local : bool
        The workers are this run's own (``local:N``): their logs are silenced before they are stopped, so that an
        interrupted run ends with its one line (a worker stopped while another fetched from it logged a traceback).
    """

    in_process = False

    def __init__(self, client: Any, window: int | None = None, owned: Sequence[Any] = (), local: bool = False
                 ) -> None:
        self.client = client
        self.window = window
        self._owned = list(owned)
        self._local = bool(local)
        self.name = f"dask {client.scheduler.address}"

    @classmethod
    def connect(cls, address: str, window: int | None = None) -> DaskExecutor:
        """``local:N`` (a LocalCluster of N single-threaded worker processes) or a scheduler address
        (``tcp://HOST:PORT``).

        Raises
        ------
        InputError
            An address of neither form, an N below 1, or a scheduler that cannot be reached.
        """
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InputError("--cluster needs dask.distributed: pip install 'dask[distributed]'") from None
        address = address.strip()
        if address.startswith("local:"):
            try:
                n = int(address.split(":", 1)[1])
            except ValueError:
                n = 0
            if n < 1:
                raise InputError(f"--cluster {address!r}: expected local:N with N >= 1 worker processes")
            import dask

            # a nanny writes its pre-spawn environment into this process's os.environ (an earlier cluster's
            # MALLOC_TRIM_THRESHOLD_ would be inherited): out while our workers start, then as it was
            saved = os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
            try:
                with dask.config.set(local_worker_config(dask.config.get("distributed.nanny.pre-spawn-environ",
                                                                         {}))), _workers_ignore_interrupts():
                    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
            finally:
                if saved is not None:
                    os.environ["MALLOC_TRIM_THRESHOLD_"] = saved
            client = Client(cluster)
            client.run(_quiet_logs, "distributed.worker.state_machine", logging.ERROR)
            return cls(client, window, owned=[client, cluster], local=True)
        if "://" not in address:
            raise InputError(f"--cluster {address!r}: expected local:N or a scheduler address tcp://HOST:PORT")
        try:
            client = Client(address, timeout="20s")
        except (OSError, TimeoutError) as exc:
            raise InputError(f"--cluster {address}: cannot reach the scheduler ({exc})") from None
        return cls(client, window, owned=[client])

    def n_threads(self) -> int:
        return max(1, sum(self.client.nthreads().values()))

    def map(self, task: Callable[[Any, Any], Any], state: Any, blocks: Iterable[Any],
            on_done: Callable[[Any], None] | None = None) -> Iterator[Any]:
        from distributed import as_completed

        if not isinstance(state, WorkerState):
            raise TypeError("DaskExecutor.map takes a WorkerState (a recipe the workers load)")
        from distributed import wait

        window = self.window or max(4, 2 * self.n_threads())
        remote_state = self.client.scatter(state, broadcast=True, hash=False)
        # every worker loads the state once, all at the same time, before the first block (a warm worker with
        # the same content token has it already): no block pays for a load, and none waits behind one
        wait([self.client.submit(_preload, remote_state, workers=[address], allow_other_workers=False, pure=False)
              for address in self.client.scheduler_info()["workers"]])
        pending = as_completed()
        inflight: dict[str, tuple[int, Any]] = {}
        done: dict[int, Any] = {}
        source = enumerate(blocks)
        next_out = 0
        exhausted = False

        def submit_more() -> None:
            nonlocal exhausted
            while not exhausted and len(inflight) < window:
                try:
                    i, block = next(source)
                except StopIteration:
                    exhausted = True
                    return
                future = self.client.submit(_run_block, task, remote_state, block, pure=False)
                inflight[future.key] = (i, future)
                pending.add(future)

        try:
            submit_more()
            while inflight:
                future = next(pending)
                result = future.result()
                i, _ = inflight.pop(future.key)
                future.release()
                if on_done is not None:
                    on_done(result)
                done[i] = result
                while next_out in done:
                    yield done.pop(next_out)
                    next_out += 1
                submit_more()
        finally:
            for _, future in inflight.values():
                future.cancel()
            remote_state.release()

    def close(self) -> None:
        if self._local and self._owned:
            try:
                self.client.run(_quiet_logs, "distributed", logging.CRITICAL)
            except Exception:  # best effort: the workers are being stopped anyway
                pass
        for thing in self._owned:
            try:
                thing.close()
            except Exception:  # closing is best effort: the run's result is already out
                pass
        self._owned = []


def _quiet_logs(name: str, level: int) -> None:
    """On a local worker: log ``name`` at ``level`` and above only. At the start, "distributed.worker.state_machine"
    at ERROR (no warning for a block cancelled by an interrupted run; failures are logged at ERROR, and a block's
    own error reaches this process through its future); before the workers are stopped, all of "distributed"."""
    logging.getLogger(name).setLevel(level)


@contextmanager
def _workers_ignore_interrupts() -> Iterator[None]:
    """Within the block, SIGINT is ignored, so processes started in it ignore it too (an ignored signal stays ignored
    through exec, and Python then installs no KeyboardInterrupt handler).

    Ctrl-C in a terminal reaches every process of the foreground group: the local cluster's workers each printed a
    page of tracebacks while this process stopped cleanly. They end with this process (the nannies stop them, or
    they die with it as daemon processes). Off the main thread, where signal handlers cannot be set, nothing changes.
    """
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def executor_for(cluster: str | None) -> Executor:
    """The executor for a ``--cluster`` value (or ``$MOLPREDICT_CLUSTER`` when None): in-process when both are
    empty, else :meth:`DaskExecutor.connect`."""
    address = cluster if cluster is not None else os.environ.get("MOLPREDICT_CLUSTER", "")
    if not address or address.strip() in ("", "none", "in-process"):
        return InProcessExecutor()
    try:
        return DaskExecutor.connect(address)
    except InputError as exc:
        if cluster is not None:
            raise
        # the user gave no --cluster: name where the address came from
        raise InputError(exc.message.replace("--cluster ", "MOLPREDICT_CLUSTER=", 1), path=exc.path, record=exc.record,
                         field=exc.field) from None


# -- library precompute ------------------------------------------------------------------------------------

class LibraryScorer:
    """What a library block task needs, loaded: the bundle, the library and the caches (one per ion mode)."""

    def __init__(self, bundle: ModelBundle, library: Any, cache_root: Any) -> None:
        self.bundle = bundle
        self.library = library
        self.cache_root = cache_root
        self._caches: dict[str, CoordinatesCache] = {}

    def cache(self, mode: str) -> CoordinatesCache:
        if mode not in self._caches:
            sub = self.bundle.for_mode(mode)
            self._caches[mode] = CoordinatesCache(self.cache_root, store_key(sub.model))
        return self._caches[mode]


class LibraryState(WorkerState):
    """A :class:`LibraryScorer` for workers: the bundle by path, the library itself, the cache root."""

    def __init__(self, bundle: ModelBundle, library: Any, cache_root: Any) -> None:
        super().__init__()
        self.bundle_path = require_bundle_path(bundle)
        self.library = library
        self.cache_root = resolved_cache_root(cache_root)

    def load(self) -> LibraryScorer:
        return LibraryScorer(load_bundle_once(self.bundle_path), self.library, self.cache_root)


def require_bundle_path(bundle: ModelBundle) -> str:
    """The bundle's directory (workers load the bundle from it); an error for a bundle never saved."""
    if bundle.path is None:
        raise InputError("a cluster run needs a saved model bundle (workers load it by path)")
    return str(bundle.path)


def resolved_cache_root(cache_root: Any) -> Any:
    """The cache root made explicit (None: this process's default), so workers use the same one."""
    if cache_root is None:
        from molpredict.identification.coordinates_cache import default_cache_root
        return default_cache_root()
    return cache_root


def _library_block(state: LibraryScorer, block: tuple[str, int, int]) -> tuple[int, int, int]:
    """Compute and commit the coordinates of library rows ``start..stop`` not stored yet; returns
    ``(rows in the block, rows computed, 1 if anything was computed else 0)``."""
    mode, start, stop = block
    cache = state.cache(mode)
    ids = np.arange(start, stop)
    keys = list(smiles_keys(state.library.column("smiles")[ids]))  # as LibrarySource.keys: the featurised SMILES
    missing = np.flatnonzero(cache.rows(keys) < 0)
    if not missing.size:
        return len(ids), 0, 0
    molecules = state.library.molecules(ids[missing])
    computed = cache.ensure(molecules, state.bundle.for_mode(mode).model.candidate_coordinates,
                            keys=[keys[i] for i in missing], block_size=max(1, stop - start))
    return len(ids), computed, 1


def score_library(bundle: ModelBundle, library: Any, cache_root: Any = None, block_size: int = 8192,
                  ion_modes: Sequence[str] | None = None, progress: bool = False,
                  log: Callable[[str], None] | None = None, executor: Executor | None = None) -> dict[str, Any]:
    """Precompute the candidate coordinates of a whole library for each model of a bundle.

    Works through the library in blocks of ``block_size`` rows; a block whose molecules are all cached is
    skipped, and each computed block is committed before the next starts, so an interrupted run resumes where it
    stopped without losing finished blocks. ``executor``: where the blocks run (default in-process; a
    :class:`DaskExecutor` runs them on its workers, which write the shared cache).

    Returns
    -------
    dict
        Per ion mode: ``{"coordinates_key", "n_rows", "n_computed", "n_blocks_computed", "time_s", "cache"}``.
    """
    say = log or (lambda message: None)
    executor = executor or InProcessExecutor()
    out: dict[str, Any] = {}
    n = len(library)
    scorer = LibraryScorer(bundle, library, cache_root)
    state = scorer if executor.in_process else LibraryState(bundle, library, cache_root)
    for mode in ion_modes or bundle.ion_modes:
        sub = bundle.for_mode(mode)
        if sub is None:
            raise InputError(f"the bundle has no {mode} model", path=str(bundle.path))
        cache = scorer.cache(mode)
        cache.refresh()
        say(f"{mode}: {n} library rows, {len(cache)} coordinates already cached in {cache.directory}")
        t0 = time.perf_counter()
        n_computed = n_blocks = 0
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=n, desc=f"scoring library ({mode})", unit=" molecules", file=sys.stderr)
        if not executor.in_process:
            say(f"{mode}: blocks of {block_size} rows on {executor.name}")
        blocks = ((mode, start, min(start + block_size, n)) for start in range(0, n, block_size))
        try:
            for _rows, computed, block_computed in executor.map(
                    _library_block, state, blocks,
                    on_done=(lambda result: bar.update(result[0])) if bar is not None else None):
                n_computed += computed
                n_blocks += block_computed
        finally:
            if bar is not None:
                bar.close()
        out[mode] = {"coordinates_key": sub.model.coordinates_key(), "n_rows": n, "n_computed": n_computed,
                     "n_blocks_computed": n_blocks, "time_s": round(time.perf_counter() - t0, 3),
                     "cache": str(cache.directory)}
    return out
