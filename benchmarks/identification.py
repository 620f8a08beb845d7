"""Identification benchmark: the IOKR family against four baselines on MassBank with MassSpecGym-style candidates.

Usage::

    python benchmarks/identification.py --out DIR [--quick] [--data DIR] [--only LABEL,...] [--no-negative]
                                        [--budget-minutes 43] [--n-boot 1000]

Protocol (one run, seeded, no decision taken on test data)
----------------------------------------------------------
- Train on ``massbank/train_{pos,neg}.mgf``, select on ``val_*.mgf`` (ridge ``lam`` by validation kernel loss
  for the kernel models, early stopping for the fingerprint FFN; the prior's variant was chosen on val once, see
  :class:`molpredict.models.baselines.PriorBaseline`), report on ``test_*.mgf``. Spectra are read, labelled and
  cleaned by :func:`molpredict.training.pipeline.load_labelled` (default :class:`~molpredict.spectra.cleaning.CleaningPipeline`).
- Candidates: ``candidates/test_formula256.json``, ``test_formula.json`` and ``test_mass.json``; every test
  spectrum whose structure has a set is one query; a hit is a candidate with the true InChIKey first block.
  Ranking, metrics and intervals come from :mod:`molpredict.identification.evaluate` / :mod:`molpredict.engine.decoding`: hit@1/5/10/20
  and MRR per spectrum (primary, ``worst`` tie policy) and averaged per structure, percentile bootstrap 95%
  intervals, and the exact random-ranking expectation. The ``random`` baseline scores every candidate alike,
  so its row reports the ``average`` tie policy (the exact expectation of a uniformly random ranking).
- Methods (positive mode): the four baselines (``random``, ``prior``, ``fingerprint-ffn``, ``library-knn``;
  the FFN also with ``scoring=likelihood``);
  every kernel model with ``molpredict train``'s defaults unless it sets its own (input kernel ``ppk-losses``,
  Gaussian-Tanimoto output kernel, lam grid): ``sisokr`` (sub-sampling, m_x 4000, m_y 2000) and ``siokr`` at
  full n; on a seeded 12,000-spectrum subset ``iokr``, ``isokr`` and ``sisokr`` with sub-sampling, Gaussian and adaptive sketches
  (the last two need all of K). Comparisons at a cheaper reference configuration B (m_x 2000, m_y 1000) at
  full n, on the formula256 and formula files: input sketches sub-sampling / p-sparsified / accumulation,
  output sketches sub-sampling / p-sparsified, input kernels ``ppk`` / ``ppk-losses`` / ``cosine``, output
  kernels ``gaussian-tanimoto`` on Morgan 2048 bits / 4096 bits / 2048 counts and ``wl-subtree`` (formula file
  only: GraKeL featurises every candidate). Sketch-size curves: hit@1 on formula256 and training time against
  m_x (m_y 1000) and m_y (m_x 2000). Negative mode: the baselines, ``sisokr`` and the subset pair.
- Timings: ``fit_s`` (training, including the validation selection), ``identify_s`` per candidate file
  (cleaning the queries, candidate coordinates, prediction and scoring; no disk cache, so every file is cold),
  peak resident memory of the process (sampled every 50 ms) during training and identification. Candidate
  fingerprints (Morgan radius 2, 2048 bits) are computed once per run and shared by every model that uses that
  setting (``candidate_fingerprints_s``); other settings are computed by the model itself.
- Methods run in order of importance; once ``--budget-minutes`` have passed the remaining ones are recorded as
  skipped (the whole script targets 45 minutes on 2 cores; ``--quick`` runs small subsets in about a minute).

Outputs under ``--out``: ``results.json`` (rewritten after every method, so a partial run keeps its numbers),
``results.md`` (markdown tables and the aims check), ``sketch_size.png`` and ``topk_<file>.png``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CANDIDATE_FILES = ("formula256", "formula", "mass")
MODES = {"positive": "pos", "negative": "neg"}
KS = (1, 5, 10, 20)
#: the fingerprint setting shared by the prior, the k-NN and the default output kernel (computed once per run)
SHARED_FP = {"kind": "morgan", "radius": 2, "size": 2048, "counts": False}


# ----------------------------------------------------------------------------------------------------------
# Methods
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Method:
    """One trained model of the benchmark.

    Attributes
    ----------
    label : str
        Unique label in the tables.
    model : str
        Registry name of the model.
    params : dict
        Keyword parameters of the model (component specs as strings).
    group : str
        ``baseline``, ``main`` (full n), ``subset`` (equal-data comparison), ``kernels`` or ``curve``.
    subset : bool
        Train on the seeded subset instead of all training spectra.
    files : tuple of str
        Candidate files to evaluate on.
    curve : dict, optional
        ``{"axis": "m_x" or "m_y", "m": int}`` for sketch-size curve points.
    torch_threads : int, optional
        torch intra-op threads while this method trains and identifies (None: leave as is).
    """

    label: str
    model: str
    params: dict[str, Any]
    group: str
    subset: bool = False
    files: tuple[str, ...] = CANDIDATE_FILES
    curve: dict[str, Any] | None = None
    torch_threads: int | None = None


def _sisokr(m_x: int, m_y: int, input_sketch: str = "subsample", output_sketch: str = "subsample",
            **extra: Any) -> dict[str, Any]:
    def spec(kind: str, m: int) -> str:
        if kind == "accumulation":
            return f"accumulation:m={m},M=8"
        if kind == "adaptive":
            return f"adaptive:m={m},q=1"
        return f"{kind}:m={m}"
    return {"input_sketch": spec(input_sketch, m_x), "output_sketch": spec(output_sketch, m_y), **extra}


def okr_defaults(model: str, params: dict[str, Any]) -> dict[str, Any]:
    """``molpredict train``'s defaults (input/output kernel, lam grid) under an IOKR-family method's own params,
    so that every kernel model is compared as a user would train it."""
    from molpredict.training.pipeline import model_defaults

    defaults = model_defaults(model)
    return {**{k: defaults[k] for k in ("input_kernel", "output_kernel", "lam") if k in defaults}, **params}


def method_list(mode: str, quick: bool) -> list[Method]:
    """The methods of one ion mode, most important first (the time budget cuts from the end)."""
    if quick:
        mx, my = 300, 200
        ffn = {"hidden": 64, "max_epochs": 3, "patience": 1, "fp_size": 2048}
        methods = [
            Method("random", "random", {}, "baseline"),
            Method("prior", "prior", {}, "baseline"),
            Method("fingerprint-ffn", "fingerprint-ffn", ffn, "baseline", torch_threads=1),
            Method("library-knn", "library-knn", {"input_kernel": "ppk", "k": 10}, "baseline"),
            Method("sisokr", "sisokr", _sisokr(mx, my), "main"),
            Method("iokr (subset)", "iokr", {}, "subset", subset=True),
            Method("sisokr (subset)", "sisokr", _sisokr(mx, my), "subset", subset=True),
        ]
        if mode == "negative":
            return [m for m in methods if m.label in ("random", "prior", "sisokr")]
        methods += [Method(f"sisokr m_x={m}", "sisokr", _sisokr(m, my), "curve", files=("formula256",),
                           curve={"axis": "m_x", "m": m}) for m in (100, mx)]
        methods += [Method(f"sisokr m_y={m}", "sisokr", _sisokr(mx, m), "curve", files=("formula256",),
                           curve={"axis": "m_y", "m": m}) for m in (50, my)]
        return methods

    # The headline sisokr uses the training defaults (m_x 4000, m_y 2000); the sketch, kernel and sketch-size
    # comparisons use a cheaper reference configuration B (m_x 2000, m_y 1000) so that they fit the budget.
    mx, my = 4000, 2000
    bx, by = 2000, 1000
    hard = ("formula256",)
    variant_files = ("formula256", "formula")
    # 2048 bits: the FFN then shares the candidate fingerprints computed once per run
    ffn = {"fp_size": 2048, "max_epochs": 20, "patience": 2}
    baselines = [
        Method("random", "random", {}, "baseline"),
        Method("prior", "prior", {}, "baseline"),
        # Small GEMMs: a second thread mostly spins, and on a loaded machine an epoch then takes 6x longer.
        Method("fingerprint-ffn", "fingerprint-ffn", ffn, "baseline", torch_threads=1),
        # the same network, candidates ranked by their bits' log-likelihood instead of MassSpecGym's cosine
        Method("fingerprint-ffn (likelihood)", "fingerprint-ffn", {**ffn, "scoring": "likelihood"}, "baseline",
               torch_threads=1),
        Method("library-knn", "library-knn", {"input_kernel": "ppk", "k": 10}, "baseline"),
    ]
    main = [Method("sisokr", "sisokr", _sisokr(mx, my), "main")]
    subset = [
        Method("iokr (subset)", "iokr", {}, "subset", subset=True),
        Method("sisokr (subset)", "sisokr", _sisokr(mx, my), "subset", subset=True),
    ]
    if mode == "negative":
        return baselines + main + subset
    main.append(Method("siokr", "siokr", {"input_sketch": f"subsample:m={bx}"}, "main"))
    # Dense sketches predict through the kernel against all 12,000 training spectra (~4 min per 6,450 queries on
    # 2 cores): the two formula files only, so that the whole run fits its 45 minutes.
    subset_more = [
        Method("isokr (subset)", "isokr", {"output_sketch": f"subsample:m={my}"}, "subset", subset=True,
               files=variant_files),
        Method("sisokr gaussian (subset)", "sisokr", _sisokr(bx, by, "gaussian", "gaussian"), "subset",
               subset=True, files=variant_files),
        Method("sisokr adaptive (subset)", "sisokr", _sisokr(bx, by, "adaptive", "adaptive"), "subset",
               subset=True, files=variant_files),
    ]
    reference = Method("sisokr B", "sisokr", _sisokr(bx, by), "variants", files=variant_files)
    variants = [
        reference,
        Method("sisokr B p-SR in", "sisokr", _sisokr(bx, by, "p-sparsified-rademacher"), "variants",
               files=variant_files),
        Method("sisokr B accumulation in", "sisokr", _sisokr(bx, by, "accumulation"), "variants",
               files=variant_files),
        Method("sisokr B p-SR out", "sisokr", _sisokr(bx, by, output_sketch="p-sparsified-rademacher"),
               "variants", files=variant_files),
        Method("sisokr B ppk", "sisokr", _sisokr(bx, by, input_kernel="ppk"), "variants",
               files=variant_files),
        Method("sisokr B cosine", "sisokr", _sisokr(bx, by, input_kernel="cosine"), "variants",
               files=variant_files),
        Method("sisokr B GT morgan-4096", "sisokr",
               _sisokr(bx, by, output_kernel="gaussian-tanimoto:gamma=auto,size=4096"), "variants",
               files=variant_files),
        Method("sisokr B GT morgan-counts", "sisokr",
               _sisokr(bx, by, output_kernel="gaussian-tanimoto:gamma=auto,counts=true"), "variants",
               files=variant_files),
        # graph kernels featurise every candidate through GraKeL: the small formula sets only
        Method("sisokr B wl-subtree", "sisokr", _sisokr(bx, by, output_kernel="wl-subtree"), "variants",
               files=("formula",)),
    ]
    # three points per axis with the reference B (m_x 2000, m_y 1000) shared by both
    curve = ([Method(f"sisokr m_x={m}", "sisokr", _sisokr(m, by), "curve", files=hard,
                     curve={"axis": "m_x", "m": m}) for m in (1000, 4000)]
             + [Method(f"sisokr m_y={m}", "sisokr", _sisokr(bx, m), "curve", files=hard,
                       curve={"axis": "m_y", "m": m}) for m in (500, 2000)])
    return baselines + main + subset + variants[:4] + subset_more + curve + variants[4:]


# ----------------------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------------------

class PeakRSS:
    """Peak resident set size of this process over a ``with`` block, sampled by a thread (GB)."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil
        self._process = psutil.Process()
        self.interval = interval
        self.start_gb = self.peak_gb = 0.0

    def _rss(self) -> float:
        return self._process.memory_info().rss / 2**30

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_gb = max(self.peak_gb, self._rss())

    def __enter__(self) -> "PeakRSS":
        self.start_gb = self.peak_gb = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_gb = max(self.peak_gb, self._rss())


def _machine() -> dict[str, Any]:
    import torch
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_start": list(os.getloadavg())}


# ----------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------

class SharedSetSource:
    """Factory of :class:`~molpredict.identification.candidate_sources.SetSource` objects that hand out one shared ``Molecule`` record per
    (inchikey14, SMILES) pair, so a fingerprint computed once serves every model and candidate file."""

    def __init__(self) -> None:
        self.pool: dict[tuple[str, str], Any] = {}

    def make(self, sets: dict[str, list[tuple[str, str]]]):
        from molpredict.identification.candidate_sources import SetSource
        from molpredict.chem.molecules import Molecule

        pool = self.pool

        class _Source(SetSource):
            def molecules(self, ids: np.ndarray) -> list[Any]:
                smiles = self.fields(ids)["smiles"]
                out = []
                for key, smi in zip(self.inchikey14(ids), smiles):
                    molecule = pool.get((key, smi))
                    if molecule is None:
                        molecule = pool[(key, smi)] = Molecule(smi, inchikey14=key)
                    out.append(molecule)
                return out

        source = _Source(sets)
        source.molecules(np.arange(len(source)))  # register every pair in the pool
        return source

    def precompute_fingerprints(self, kind: str, radius: int, size: int, counts: bool) -> float:
        """Compute one fingerprint setting for every pooled molecule; returns the seconds taken."""
        from molpredict.chem import molecules as mol_module

        t0 = time.perf_counter()
        records = list(self.pool.values())
        matrix = mol_module.fingerprint_matrix([m.smiles for m in records], kind=kind, radius=radius, size=size,
                                               counts=counts)
        # Molecule caches fingerprints per setting; there is no public setter, so the shared records are
        # filled the way Molecule.fingerprint fills them (read-only rows under the normalised settings key).
        key = mol_module._fp_key(kind, radius, size, counts)
        for record, row in zip(records, matrix):
            row.flags.writeable = False
            if record._fps is None:
                record._fps = {}
            record._fps[key] = row
        return time.perf_counter() - t0


@dataclass
class ModeData:
    """Training, validation and test data of one ion mode."""

    mode: str
    train_spectra: list
    train_molecules: list
    val_spectra: list
    val_molecules: list
    subset: np.ndarray
    queries: dict[str, list] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)
    cleaning: dict = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def load_mode(mode: str, data: Path, shared: SharedSetSource, quick: bool, seed: int,
              log: Callable[[str], None], report_split: str = "test") -> ModeData:
    """Read, label and clean one ion mode's splits; build its candidate sources (restricted to the structures of
    ``report_split``: ``test``, or ``val`` for decisions that must not look at test data)."""
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.evaluate import collect_queries
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import read_spectra
    from molpredict.spectra.record import spectrum_ion_mode
    from molpredict.training.pipeline import TrainOptions, load_labelled

    tag = MODES[mode]
    options = TrainOptions(ion_modes=[mode])
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    train = load_labelled([data / "massbank" / f"train_{tag}.mgf"], options)
    val = load_labelled([data / "massbank" / f"val_{tag}.mgf"], options)
    train_s, train_m = train.spectra[mode], train.molecules[mode]
    val_s, val_m = val.spectra[mode], val.molecules[mode]
    if quick:
        keep = np.sort(rng.choice(len(train_s), size=min(1500, len(train_s)), replace=False))
        train_s, train_m = [train_s[i] for i in keep], [train_m[i] for i in keep]
        keep = np.sort(rng.choice(len(val_s), size=min(300, len(val_s)), replace=False))
        val_s, val_m = [val_s[i] for i in keep], [val_m[i] for i in keep]
    n_subset = 800 if quick else 12000
    subset = np.sort(rng.choice(len(train_s), size=min(n_subset, len(train_s)), replace=False))

    test = [s for s in read_spectra(data / "massbank" / f"{report_split}_{tag}.mgf") if spectrum_ion_mode(s) == mode]
    out = ModeData(mode, train_s, train_m, val_s, val_m, subset, cleaning=CleaningPipeline().to_dict())
    structures = sorted({s.inchikey.split("-", 1)[0] for s in test if s.inchikey})
    if quick:
        structures = sorted(rng.choice(structures, size=min(30, len(structures)), replace=False).tolist())
    wanted = set(structures)
    for name in CANDIDATE_FILES:
        sets = load_candidate_sets(data / "candidates" / f"{report_split}_{name}.json")
        sets = {k: v for k, v in sets.items() if k in wanted}
        source = shared.make(sets)
        queries, skipped = collect_queries(test, source)
        # Grouped by structure, consecutive queries share candidate sets (fewer coordinates per block).
        queries.sort(key=lambda q: q.inchikey14)
        out.sources[name] = source
        out.queries[name] = queries
        out.info[name] = {"n_queries": len(queries), "n_structures": len({q.inchikey14 for q in queries}),
                          "n_candidates_distinct": len(source), "skipped": dict(skipped)}
    out.info["n_train"] = len(train_s)
    out.info["n_train_structures"] = len({m.inchikey14 for m in train_m})
    out.info["n_val"] = len(val_s)
    out.info["n_subset"] = int(len(subset))
    out.info["n_subset_structures"] = len({train_m[i].inchikey14 for i in subset})
    out.info["train_skipped"] = dict(train.skipped)
    out.info["load_s"] = time.perf_counter() - t0
    log(f"{mode}: {len(train_s)} training spectra ({out.info['n_train_structures']} structures), "
        f"{len(val_s)} validation, " + ", ".join(f"{k} {v['n_queries']} queries / {v['n_candidates_distinct']} "
                                                 "candidates" for k, v in out.info.items()
                                                 if k in CANDIDATE_FILES))
    return out


# ----------------------------------------------------------------------------------------------------------
# Running one method
# ----------------------------------------------------------------------------------------------------------

def run_method(method: Method, data: ModeData, n_boot: int, seed: int, log: Callable[[str], None]
               ) -> dict[str, Any]:
    """Train one method, evaluate it on its candidate files; JSON-ready record."""
    import torch

    if method.torch_threads is None:
        return _run_method(method, data, n_boot, seed, log)
    before = torch.get_num_threads()
    torch.set_num_threads(method.torch_threads)
    try:
        record = _run_method(method, data, n_boot, seed, log)
    finally:
        torch.set_num_threads(before)
    record["torch_threads"] = method.torch_threads
    return record


def _run_method(method: Method, data: ModeData, n_boot: int, seed: int, log: Callable[[str], None]
                ) -> dict[str, Any]:
    from molpredict.identification.evaluate import rank_queries, summarize_ranks
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.modelfile import ModelBundle, SubModel, json_ready
    from molpredict.chem.molecules import DEFAULT_ADDUCTS
    from molpredict.training.pipeline import build_model

    params = okr_defaults(method.model, method.params)
    model = build_model(method.model, {**params, "seed": seed})
    if method.subset:
        spectra = [data.train_spectra[i] for i in data.subset]
        molecules = [data.train_molecules[i] for i in data.subset]
    else:
        spectra, molecules = data.train_spectra, data.train_molecules
    record: dict[str, Any] = {"model": method.model, "params": params, "group": method.group,
                              "n_train": len(spectra), "n_train_structures": len({m.inchikey14 for m in molecules}),
                              "curve": method.curve}
    log(f"  {data.mode} {method.label}: training on {len(spectra)} spectra")
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        model.fit(spectra, molecules, val=(data.val_spectra, data.val_molecules))
        record["fit_s"] = time.perf_counter() - t0
    record["fit_peak_rss_gb"] = rss.peak_gb
    record["fit_rss_increase_gb"] = rss.peak_gb - rss.start_gb
    for name in ("lam_", "best_epoch_", "rank_"):
        if hasattr(model, name):
            record[name.rstrip("_")] = json_ready(getattr(model, name))
    if getattr(model, "selection_", None) is not None:
        record["selection"] = [{k: p.get(k) for k in ("lam", "val_loss", "input_kernel_resolved",
                                                       "output_kernel_resolved")}
                               for p in model.selection_.get("points", [])]
    bundle = ModelBundle({data.mode: SubModel(model, data.mode, cleaning=data.cleaning,
                                              adducts=[a.name for a in DEFAULT_ADDUCTS[data.mode]])})
    record["results"] = {}
    for name in method.files:
        identifier = Identifier(bundle, data.sources[name], IdentifyOptions(), cache_root=False)
        with PeakRSS() as rss:
            t0 = time.perf_counter()
            ranks = rank_queries(identifier, data.queries[name])
            identify_s = time.perf_counter() - t0
        metrics = summarize_ranks(ranks, n_boot=n_boot, seed=seed)
        metrics["identify_s"] = identify_s
        metrics["identify_peak_rss_gb"] = rss.peak_gb
        metrics["identify_timings"] = {k: round(v, 3) for k, v in identifier.timings.items()}
        metrics["n_skipped"] = len(identifier.skipped)
        record["results"][name] = metrics
        shown = metrics["average_ties"] if method.model == "random" else metrics
        log(f"    {name}: hit@1 {100 * shown['hit@1']:.2f}%  hit@10 {100 * shown['hit@10']:.2f}%  "
            f"MRR {shown['mrr']:.4f}  ({metrics['n_queries']} queries, identify {identify_s:.1f} s)")
    return record


# ----------------------------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------------------------

def _shown(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    metrics = record.get("results", {}).get(name)
    if metrics is None:
        return None
    return metrics["average_ties"] if record["model"] == "random" else metrics


def hit1(results: dict[str, Any], mode: str, label: str, name: str) -> float | None:
    record = results.get(mode, {}).get("methods", {}).get(label)
    if not record or "results" not in record:
        return None
    shown = _shown(record, name)
    return None if shown is None else float(shown["hit@1"])


def check_aims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's aims, evaluated on the test numbers (reported, never tuned on)."""
    aims = []
    for mode in ("positive", "negative"):
        if mode not in results:
            continue
        for name in CANDIDATE_FILES:
            s_sub, iokr = hit1(results, mode, "sisokr (subset)", name), hit1(results, mode, "iokr (subset)", name)
            s_full = hit1(results, mode, "sisokr", name)
            ffn, prior = hit1(results, mode, "fingerprint-ffn", name), hit1(results, mode, "prior", name)
            if s_sub is not None and iokr is not None:
                aims.append({"mode": mode, "file": name, "aim": "sisokr (subset) hit@1 within 1 point of iokr (subset)",
                             "values": [s_sub, iokr], "pass": bool(s_sub >= iokr - 0.01)})
            if s_full is not None and ffn is not None:
                aims.append({"mode": mode, "file": name, "aim": "sisokr hit@1 >= 3x fingerprint-ffn",
                             "values": [s_full, ffn], "pass": bool(s_full >= 3 * ffn)})
            if s_full is not None and prior is not None:
                aims.append({"mode": mode, "file": name, "aim": "sisokr hit@1 >= 2x prior",
                             "values": [s_full, prior], "pass": bool(s_full >= 2 * prior)})
            if s_full is not None and iokr is not None:
                aims.append({"mode": mode, "file": name, "aim": "sisokr (full n) hit@1 > iokr (subset)",
                             "values": [s_full, iokr], "pass": bool(s_full > iokr)})
    return aims


def _pct(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def format_markdown(results: dict[str, Any]) -> str:
    """Markdown tables: one per ion mode and candidate file, then sketch-size curves and the aims."""
    lines = ["# Identification benchmark", ""]
    machine = results.get("machine", {})
    lines.append(f"Run: {'quick' if results.get('quick') else 'full'}; {machine.get('cpu_count')} CPUs, torch "
                 f"{machine.get('torch')} ({machine.get('torch_threads')} threads); load average at start "
                 f"{', '.join(f'{x:.1f}' for x in machine.get('load_average_start', []))}; total "
                 f"{results.get('wall_s', float('nan')) / 60:.1f} min.")
    resumed = results.get("resumed")
    if resumed:
        lines[-1] += (f" Resumed run: the methods a first run ({(resumed.get('previous_wall_s') or float('nan')) / 60:.1f}"
                      " min) completed were kept, the total above is this run's.")
    lines.append("")
    lines.append("hit@k and MRR in % / fraction per spectrum (worst tie policy; `random` shows the exact random "
                 "expectation, i.e. the average tie policy); [95% bootstrap interval]; `/struct` = averaged "
                 "per structure. fit = training incl. validation selection; id = identification of all queries "
                 "of the file (cold: candidate coordinates computed); RSS = peak resident memory (GB) during "
                 "training / identification. `sisokr` uses the training defaults (sub-sampling, m_x 4000, m_y "
                 "2000); `sisokr B ...` rows compare sketches and kernels at a cheaper reference configuration B "
                 "(m_x 2000, m_y 1000, sub-sampling, ppk-losses, gaussian-tanimoto on Morgan 2048 bits) on the two "
                 "formula candidate files.")
    for mode in ("positive", "negative"):
        block = results.get(mode)
        if not block:
            continue
        info = block.get("data", {})
        lines += ["", f"## {mode.capitalize()} mode", ""]
        lines.append(f"{info.get('n_train')} training spectra ({info.get('n_train_structures')} structures), "
                     f"subset {info.get('n_subset')} spectra ({info.get('n_subset_structures')} structures), "
                     f"{info.get('n_val')} validation spectra.")
        methods = block.get("methods", {})
        for name in CANDIDATE_FILES:
            fi = info.get(name, {})
            lines += ["", f"### {mode} / test_{name}.json ({fi.get('n_queries')} spectra, {fi.get('n_structures')} "
                      f"structures, {fi.get('n_candidates_distinct')} distinct candidates)", ""]
            lines.append("| method | group | n train | hit@1 [95% CI] | hit@5 | hit@10 | hit@20 | MRR | hit@1 /struct "
                         "| MRR /struct | fit s | id s | RSS fit/id |")
            lines.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
            for label, record in methods.items():
                if record.get("group") == "curve":
                    continue
                if "error" in record or "skipped" in record:
                    if name in record.get("files", CANDIDATE_FILES):
                        why = record.get("error") or record.get("skipped")
                        lines.append(f"| {label} | {record.get('group')} | | {why} | | | | | | | | | |")
                    continue
                m = _shown(record, name)
                if m is None:
                    continue
                ci = m["ci95"]["hit@1"]
                ps = m["per_structure"]
                lines.append(
                    f"| {label} | {record['group']} | {record['n_train']} | {_pct(m['hit@1'])} "
                    f"[{_pct(ci[0])}, {_pct(ci[1])}] | {_pct(m['hit@5'])} | {_pct(m['hit@10'])} | "
                    f"{_pct(m['hit@20'])} | {m['mrr']:.3f} | {_pct(ps['hit@1'])} | {ps['mrr']:.3f} | "
                    f"{record['fit_s']:.0f} | {record['results'][name]['identify_s']:.0f} | "
                    f"{record['fit_peak_rss_gb']:.1f}/{record['results'][name]['identify_peak_rss_gb']:.1f} |")
            first = next((r for r in methods.values() if name in r.get("results", {})), None)
            if first is not None:
                rnd = first["results"][name]["random"]
                lines.append("")
                lines.append(f"Random-ranking expectation: hit@1 {_pct(rnd['hit@1'])}, hit@10 {_pct(rnd['hit@10'])}, "
                             f"MRR {rnd['mrr']:.3f} (median set size {first['results'][name]['candidates']['median']}).")
        curves = curve_points(block)
        if any(curves.values()):
            lines += ["", f"### {mode}: sketch size (sisokr, test_formula256, hit@1 %)", ""]
            lines.append("| axis | m | hit@1 | fit s |")
            lines.append("|---|---:|---:|---:|")
            for axis, points in curves.items():
                for m, h, fit in points:
                    lines.append(f"| {axis} | {m} | {_pct(h)} | {fit:.0f} |")
    aims = results.get("aims", [])
    if aims:
        lines += ["", "## Aims (checked on test, not tuned on it)", "", "| mode | file | aim | values (hit@1 %) | met |",
                  "|---|---|---|---|---|"]
        for a in aims:
            lines.append(f"| {a['mode']} | {a['file']} | {a['aim']} | "
                         f"{' vs '.join(_pct(v) for v in a['values'])} | {'yes' if a['pass'] else 'no'} |")
    skipped = [(mode, label, r.get("skipped") or r.get("error")) for mode in ("positive", "negative")
               for label, r in results.get(mode, {}).get("methods", {}).items() if "skipped" in r or "error" in r]
    if skipped:
        lines += ["", "## Not run", ""] + [f"- {mode} {label}: {why}" for mode, label, why in skipped]
    return "\n".join(lines) + "\n"


def curve_points(block: dict[str, Any]) -> dict[str, list[tuple[int, float, float]]]:
    """Sketch-size curve points ``{axis: [(m, hit@1, fit_s), ...]}`` on formula256; the reference run of the
    fixed configuration (``sisokr B``, or ``sisokr`` in a quick run) is the point shared by both axes."""
    methods = block.get("methods", {})
    points: dict[str, list[tuple[int, float, float]]] = {"m_x": [], "m_y": []}
    for record in methods.values():
        curve = record.get("curve")
        if curve and "results" in record and "formula256" in record["results"]:
            points[curve["axis"]].append((curve["m"], record["results"]["formula256"]["hit@1"], record["fit_s"]))
    reference = methods.get("sisokr B") or methods.get("sisokr")
    if reference and "results" in reference and "formula256" in reference["results"]:
        specs = reference["params"]
        for axis, key in (("m_x", "input_sketch"), ("m_y", "output_sketch")):
            m = int(str(specs[key]).split("m=")[1].split(",")[0])
            if points[axis] and m not in [p[0] for p in points[axis]]:
                points[axis].append((m, reference["results"]["formula256"]["hit@1"], reference["fit_s"]))
    return {axis: sorted(p) for axis, p in points.items()}


def plot_sketch_sizes(results: dict[str, Any], path: Path) -> bool:
    """hit@1 and training time against m_x and m_y (positive mode); False when there are no points."""
    block = results.get("positive", {})
    curves = curve_points(block)
    if not any(curves.values()):
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    for ax, (axis, points) in zip(axes, curves.items()):
        if not points:
            ax.set_visible(False)
            continue
        m = [p[0] for p in points]
        ax.plot(m, [100 * p[1] for p in points], marker="o", color="tab:blue")
        ax.set_xscale("log")
        ax.set_xlabel(axis)
        ax.set_ylabel("hit@1 on test_formula256 (%)", color="tab:blue")
        twin = ax.twinx()
        twin.plot(m, [p[2] for p in points], marker="s", linestyle="--", color="tab:red")
        twin.set_ylabel("training time (s)", color="tab:red")
        ax.grid(alpha=0.3)
        other = "m_y" if axis == "m_x" else "m_x"
        ax.set_title(f"sisokr: varying {axis} ({other} fixed)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_topk(results: dict[str, Any], out: Path) -> list[str]:
    """Top-k curves of the baselines and main models per candidate file (positive mode)."""
    from molpredict.identification.evaluate import plot_curves

    written = []
    methods = results.get("positive", {}).get("methods", {})
    for name in CANDIDATE_FILES:
        chosen = {}
        for label, record in methods.items():
            if record.get("group") in ("baseline", "main", "subset") and name in record.get("results", {}):
                metrics = record["results"][name]
                chosen[label] = ({**metrics, "curve": metrics["average_ties"]["curve"]} if record["model"] == "random"
                                 else metrics)
        if chosen:
            path = out / f"topk_{name}.png"
            plot_curves(chosen, path)
            written.append(path.name)
    return written


def write_outputs(results: dict[str, Any], out: Path) -> None:
    from molpredict.modelfile import json_ready

    results["aims"] = check_aims(results)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(json_ready(results), indent=1, allow_nan=True))
    os.replace(tmp, out / "results.json")
    (out / "results.md").write_text(format_markdown(results))


# ----------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------

def finished_methods(previous: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{mode: {label: record}}`` of the methods a previous run's results (results.json) completed."""
    return {mode: {label: record for label, record in previous.get(mode, {}).get("methods", {}).items()
                   if "results" in record}
            for mode in MODES if mode in previous}


def run(out: Path, data: Path, quick: bool = False, only: set[str] | None = None, negative: bool = True,
        budget_minutes: float = 43.0, n_boot: int = 1000, seed: int = 0, log: Callable[[str], None] | None = None,
        resume: bool = False) -> dict[str, Any]:
    """Run the benchmark and write its outputs; returns the results dictionary.

    With ``resume``, the methods that a previous run into ``out`` completed are kept as they are (their records
    keep their own timings) and only the others run: for a run that its time budget cut short."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, Any] = {"benchmark": "identification", "quick": quick, "seed": seed, "n_boot": n_boot,
                               "machine": _machine(), "data": str(data), "budget_minutes": budget_minutes}
    shared = SharedSetSource()
    previous_path = out / "results.json"
    previous = json.loads(previous_path.read_text()) if resume and previous_path.is_file() else {}
    kept = finished_methods(previous)
    if kept:
        (out / "results.previous.json").write_text(json.dumps(previous, indent=1))  # results.json is rewritten
        results["resumed"] = {"previous_wall_s": previous.get("wall_s"),
                              "previous_machine": previous.get("machine"),
                              "kept": {mode: sorted(labels) for mode, labels in kept.items()}}
    modes = ["positive"] + (["negative"] if negative else [])
    loaded = {}
    for mode in modes:
        loaded[mode] = load_mode(mode, data, shared, quick, seed, log)
        results[mode] = {"data": loaded[mode].info, "methods": {}}
    fp_s = shared.precompute_fingerprints(**SHARED_FP)
    results["candidate_fingerprints"] = {"setting": SHARED_FP, "n_molecules": len(shared.pool), "seconds": fp_s}
    log(f"candidate fingerprints: {len(shared.pool)} molecules in {fp_s:.1f} s")
    write_outputs(results, out)

    # Positive mode first (the headline table), then negative; within a mode, in order of importance.
    plan = [(mode, m) for mode in modes for m in method_list(mode, quick)]
    if not quick and negative:
        # the negative table is small: run it right after the positive main table so the budget cuts extras
        pos = [p for p in plan if p[0] == "positive"]
        neg = [p for p in plan if p[0] == "negative"]
        core = [p for p in pos if p[1].group in ("baseline", "main") or p[1].label in ("iokr (subset)",
                                                                                        "sisokr (subset)")]
        plan = core + neg + [p for p in pos if p not in core]
    for mode, method in plan:
        if only and method.label not in only:
            continue
        methods = results[mode]["methods"]
        if method.label in kept.get(mode, {}):
            methods[method.label] = kept[mode][method.label]
            continue
        elapsed = (time.perf_counter() - started) / 60
        if elapsed > budget_minutes:
            methods[method.label] = {"model": method.model, "group": method.group, "files": list(method.files),
                                     "skipped": f"time budget ({budget_minutes:g} min) spent"}
            log(f"  {mode} {method.label}: skipped (time budget)")
            continue
        try:
            methods[method.label] = run_method(method, loaded[mode], n_boot, seed, log)
            methods[method.label]["started_min"] = elapsed
        except Exception as exc:  # one failing method must not lose the others' numbers
            traceback.print_exc()
            methods[method.label] = {"model": method.model, "group": method.group, "files": list(method.files),
                                     "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
        results["wall_s"] = time.perf_counter() - started
        write_outputs(results, out)

    results["wall_s"] = time.perf_counter() - started
    results["machine"]["load_average_end"] = list(os.getloadavg())
    results["plots"] = plot_topk(results, out)
    if plot_sketch_sizes(results, out / "sketch_size.png"):
        results["plots"].append("sketch_size.png")
    write_outputs(results, out)
    log(f"done in {results['wall_s'] / 60:.1f} min: {out / 'results.md'}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--quick", action="store_true", help="small subsets and few methods (about a minute)")
    parser.add_argument("--data", type=Path, required=True, help="the shared data directory (../shared/data)")
    parser.add_argument("--only", default=None, help="comma-separated method labels to run")
    parser.add_argument("--no-negative", action="store_true", help="skip the negative-mode table")
    parser.add_argument("--budget-minutes", type=float, default=43.0,
                        help="start no new method after this many minutes")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true",
                        help="keep the methods a previous run into --out completed; run only the others")
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",")} if args.only else None
    run(args.out, quick=args.quick, data=args.data, only=only, negative=not args.no_negative,
        budget_minutes=args.budget_minutes, n_boot=args.n_boot, seed=args.seed, resume=args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
