"""Beyond one process: identify, evaluate and score-library on a 2-process Dask LocalCluster give the in-process
output byte for byte; an interrupted score-library resumes; a worker killed mid-run loses no row."""
from __future__ import annotations

import io
import json
import os
import signal

import distributed
import numpy as np
import pytest
from click.testing import CliRunner

from identification_helpers import SMILES, synthetic_spectra
from molpredict.identification.candidate_sources import LibrarySource
from molpredict.chem.candidates import CandidateLibrary
from molpredict.cli import cli
from molpredict.identification.coordinates_cache import CoordinatesCache, smiles_keys, store_key
from molpredict.errors import InputError
from molpredict.identification.identify import Identifier, IdentifyOptions
from molpredict.io.results import ResultWriter
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.chem.molecules import Molecule
from molpredict.identification.scoring import DaskExecutor, InProcessExecutor, executor_for, score_library
from molpredict.spectra.cleaning import CleaningPipeline
from molpredict.io import write_mgf
from molpredict.training.pipeline import build_model

DECOYS = ["CC1Cc2ccc(O)cc2C(=O)O1", "CC(=O)Nc1cccc(O)c1", "O=C(O)/C=C/c1ccc(O)cc1O", "CC(C)Cc1ccc(CC(C)C(=O)O)cc1",
          "C[C@H](N)C(=O)O", "C[C@@H](N)C(=O)O"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny real SISOKR bundle saved to disk (workers load it by path), a library file and query spectra."""
    root = tmp_path_factory.mktemp("scale")
    spectra, molecules = synthetic_spectra(n_per=3, seed=0)
    model = build_model("sisokr", {"input_sketch": "subsample:m=20", "output_sketch": "subsample:m=20",
                                   "lam": "1e-3", "device": "cpu"}).fit(spectra, molecules)
    sub = SubModel(model=model, ion_mode="positive", cleaning=CleaningPipeline().to_dict(),
                   adducts=["[M+H]+", "[M+Na]+"])
    ModelBundle({"positive": sub}).save(root / "model")
    library = CandidateLibrary.from_smiles(SMILES + DECOYS, names=[f"c{i}" for i in range(len(SMILES) + 6)],
                                           source="test")
    library.to_tsv(root / "library.tsv")
    queries, _ = synthetic_spectra(n_per=2, seed=5)
    queries[3] = queries[3].with_peaks(np.zeros(0), np.zeros(0))  # skipped: no peaks
    write_mgf(queries, root / "queries.mgf")
    sets = {}
    for smi in SMILES:
        m = Molecule.from_smiles(smi)
        sets[m.inchikey14] = [(m.inchikey14, m.smiles)] + [(Molecule.from_smiles(d).inchikey14, d) for d in DECOYS]
    (root / "sets.json").write_text(json.dumps(sets))
    return root, ModelBundle.load(root / "model"), queries, sets


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes."""
    local = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = distributed.Client(local)
    yield client
    client.close()
    local.close()


def identify_tsv(bundle, library, queries, cache_root, executor=None, **options):
    opts = IdentifyOptions(top_k=4, **options)
    identifier = Identifier(bundle, LibrarySource(library, opts), opts, cache_root=cache_root)
    out = io.StringIO()
    writer = ResultWriter(out, "tsv")
    for row in identifier.run(queries, executor=executor):
        writer.write(row)
    writer.close()
    return out.getvalue(), identifier


def test_identify_on_a_cluster_is_byte_identical(setup, cluster, tmp_path):
    root, bundle, queries, _ = setup
    library = CandidateLibrary.from_tsv(root / "library.tsv")
    here, a = identify_tsv(bundle, library, queries, tmp_path / "a", block_queries=3)
    there, b = identify_tsv(bundle, library, queries, tmp_path / "b", DaskExecutor(cluster), block_queries=3)
    assert here == there and here.count("\n") > len(queries)
    assert [(s.query_id, s.reason) for s in a.skipped] == [(s.query_id, s.reason) for s in b.skipped] != []
    assert (a.n_queries, a.n_identified, a.n_candidates) == (b.n_queries, b.n_identified, b.n_candidates)


def test_evaluate_on_a_cluster_gives_the_same_metrics(setup, cluster, tmp_path):
    from molpredict.identification.evaluate import evaluate

    root, bundle, _, sets = setup
    sets = {k: [tuple(x) for x in v] for k, v in sets.items()}
    here = evaluate([root / "queries.mgf"], [("m", bundle)], sets, cache_root=tmp_path / "a", n_boot=50)
    there = evaluate([root / "queries.mgf"], [("m", bundle)], sets, cache_root=tmp_path / "b", n_boot=50,
                     executor=DaskExecutor(cluster))
    for metrics in (here["m"], there["m"]):
        metrics.pop("time_s")
        metrics.pop("timings")
    assert here == there and here["m"]["n_queries"] == len(SMILES) * 2 - 1


def test_score_library_on_a_cluster_stores_the_same_coordinates(setup, cluster, tmp_path):
    root, bundle, _, _ = setup
    library = CandidateLibrary.from_tsv(root / "library.tsv")
    key = store_key(bundle.for_mode("positive").model)
    here = score_library(bundle, library, cache_root=tmp_path / "a", block_size=5)
    there = score_library(bundle, library, cache_root=tmp_path / "b", block_size=5, executor=DaskExecutor(cluster))
    assert here["positive"]["n_computed"] == there["positive"]["n_computed"] == len(library)
    assert there["positive"]["n_blocks_computed"] == -(-len(library) // 5)
    keys = list(smiles_keys(library.column("smiles")))
    a, b = CoordinatesCache(tmp_path / "a", key), CoordinatesCache(tmp_path / "b", key)
    np.testing.assert_array_equal(a.read(a.rows(keys)), b.read(b.rows(keys)))


class Interrupting(InProcessExecutor):
    """Stops the run (as Ctrl-C would) once ``after`` blocks have finished."""

    def __init__(self, inner, after):
        self.inner, self.after = inner, after
        self.in_process = inner.in_process

    def map(self, task, state, blocks, on_done=None):
        for i, result in enumerate(self.inner.map(task, state, blocks, on_done)):
            if i == self.after:
                raise KeyboardInterrupt("simulated interrupt")
            yield result


def test_interrupted_score_library_resumes(setup, cluster, tmp_path):
    root, bundle, _, _ = setup
    library = CandidateLibrary.from_tsv(root / "library.tsv")
    with pytest.raises(KeyboardInterrupt):
        score_library(bundle, library, cache_root=tmp_path, block_size=4,
                      executor=Interrupting(DaskExecutor(cluster, window=1), after=2))
    key = store_key(bundle.for_mode("positive").model)
    kept = len(CoordinatesCache(tmp_path, key))
    assert kept >= 8  # the blocks finished before the interrupt stay
    resumed = score_library(bundle, library, cache_root=tmp_path, block_size=4, executor=DaskExecutor(cluster))
    assert resumed["positive"]["n_computed"] == len(library) - kept
    again = score_library(bundle, library, cache_root=tmp_path, block_size=4)
    assert again["positive"]["n_computed"] == 0


def test_a_killed_worker_loses_nothing(setup, cluster, tmp_path):
    root, bundle, queries, _ = setup
    library = CandidateLibrary.from_tsv(root / "library.tsv")
    here, _ = identify_tsv(bundle, library, queries, tmp_path / "a", block_queries=1)
    pids = cluster.run(os.getpid)
    victim = next(iter(pids.values()))
    opts = IdentifyOptions(top_k=4, block_queries=1)
    identifier = Identifier(bundle, LibrarySource(library, opts), opts, cache_root=tmp_path / "b")
    out = io.StringIO()
    writer = ResultWriter(out, "tsv")
    killed = False
    for row in identifier.run(queries, executor=DaskExecutor(cluster, window=6)):
        writer.write(row)
        if not killed:
            os.kill(victim, signal.SIGKILL)  # tasks are in flight on both workers
            killed = True
    writer.close()
    assert killed and out.getvalue() == here
    assert identifier.n_queries == len(queries)
    cluster.wait_for_workers(2, timeout=60)  # the nanny restarted it
    assert victim not in cluster.run(os.getpid).values()


def test_cli_cluster_from_the_environment(setup, cluster, tmp_path, monkeypatch):
    root, _, _, _ = setup
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    args = ["identify", str(root / "queries.mgf"), "--model", str(root / "model"), "--library",
            str(root / "library.tsv"), "-q"]
    here = runner.invoke(cli, args + ["-o", str(tmp_path / "here.tsv")])
    assert here.exit_code == 0, here.output
    monkeypatch.setenv("MOLPREDICT_CLUSTER", cluster.scheduler.address)
    there = runner.invoke(cli, args + ["-o", str(tmp_path / "there.tsv"), "--cache-dir", str(tmp_path / "c2")])
    assert there.exit_code == 0, there.output
    assert (tmp_path / "here.tsv").read_bytes() == (tmp_path / "there.tsv").read_bytes()
    lib = runner.invoke(cli, ["score-library", str(root / "library.tsv"), "--model", str(root / "model"),
                              "--cache-dir", str(tmp_path / "c3"), "--block-size", "7"])
    assert lib.exit_code == 0 and f"computed the coordinates of {len(SMILES) + 6} of {len(SMILES) + 6}" in lib.stderr


def test_cluster_addresses(monkeypatch):
    assert isinstance(executor_for(""), InProcessExecutor)
    for bad in ("local:0", "local:x", "somehost:8786"):
        with pytest.raises(InputError, match=f"^--cluster '{bad}': expected"):
            executor_for(bad)
    monkeypatch.setenv("MOLPREDICT_CLUSTER", "bogus")  # no --cluster given: the error names the variable
    with pytest.raises(InputError, match="^MOLPREDICT_CLUSTER='bogus': expected local:N"):
        executor_for(None)


def test_a_library_file_travels_as_its_path_with_a_content_token(setup, cluster, tmp_path):
    """A library read through load_library_once reaches the workers as its file (the pickled state stays small;
    each worker reads the file once per process), the token is a content hash (the same inputs give the same
    token, so a warm worker keeps its loaded state from run to run), and the output is still byte-identical."""
    import pickle

    from molpredict.identification.identify import IdentifierState
    from molpredict.identification.scoring import library_file, load_library_once

    root, bundle, queries, _ = setup
    library = load_library_once(root / "library.tsv")
    assert load_library_once(root / "library.tsv") is library and library_file(library) is not None
    opts = IdentifyOptions(top_k=4, block_queries=3)
    make = lambda lib: Identifier(bundle, LibrarySource(lib, opts), opts, cache_root=tmp_path / "s")
    by_file, again = IdentifierState(make(library)), IdentifierState(make(library))
    assert by_file.source is None and by_file.library[0] == library_file(library)
    assert by_file.token == again.token
    in_memory = CandidateLibrary.from_tsv(root / "library.tsv")  # not read through load_library_once
    shipped = IdentifierState(make(in_memory))
    assert library_file(in_memory) is None and shipped.source is not None
    assert shipped.token != IdentifierState(make(in_memory)).token  # no content key: one token per run
    assert len(pickle.dumps(by_file)) < len(pickle.dumps(shipped)) / 2
    loaded = by_file.load()
    assert len(loaded.source.library) == len(library)
    here, _ = identify_tsv(bundle, library, queries, tmp_path / "a", block_queries=3)
    there, _ = identify_tsv(bundle, library, queries, tmp_path / "b", DaskExecutor(cluster), block_queries=3)
    assert here == there and here.count("\n") > len(queries)


def test_local_workers_keep_malloc_and_drop_the_profiler():
    """local:N workers: Dask's MALLOC_TRIM_THRESHOLD_ (memory returned and re-mapped on every numpy block) and its
    10 ms stack sampler are off; the one-thread BLAS settings stay."""
    from molpredict.identification.scoring import local_worker_config

    config = local_worker_config({"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1})
    assert config["distributed.nanny.pre-spawn-environ"] == {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1}
    assert config["distributed.worker.profile.enabled"] is False
    executor = DaskExecutor.connect("local:1")
    try:
        env = executor.client.run(lambda: dict(os.environ))
        assert all("MALLOC_TRIM_THRESHOLD_" not in e and e.get("OMP_NUM_THREADS") == "1" for e in env.values())
    finally:
        executor.close()


def _ignores_sigint(pid: int) -> bool:
    """From the kernel's view of process ``pid``: is SIGINT in its ignored set?"""
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the signal masks from /proc")
def test_local_workers_ignore_ctrl_c_and_this_process_keeps_its_handler():
    """Ctrl-C reaches the whole foreground process group: the local cluster's workers ignore it (each printed a page
    of tracebacks), this process still turns it into KeyboardInterrupt, and the workers end with the executor."""
    # as in a terminal: Ctrl-C raises KeyboardInterrupt here (a run started in the background, as `nohup cmd &`
    # does, inherits SIGINT ignored, and so would every worker, whatever the executor does)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert not _ignores_sigint(os.getpid())
        executor = DaskExecutor.connect("local:1")
        try:
            pids = list(executor.client.run(os.getpid).values())
            assert pids and all(_ignores_sigint(pid) for pid in pids)
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not _ignores_sigint(os.getpid())
        finally:
            executor.close()
    finally:
        signal.signal(signal.SIGINT, outer)
    for pid in pids:  # gone (or a zombie being reaped) once the executor is closed
        try:
            os.kill(pid, 0)
            state = open(f"/proc/{pid}/stat").read().split()[2]
            assert state == "Z", f"worker {pid} still running"
        except (ProcessLookupError, FileNotFoundError):
            pass
