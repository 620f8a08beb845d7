"""Accuracy and time of DSOKR on three tasks, each beside kernel models and baselines; writes ``dsokr_<task>.json``.

Usage: python benchmarks/dsokr.py {massbank,chebi,qm9} [--out DIR] [--data DIR] [--quick] [options, see --help]

Every task runs a small list of rows (model, input kernel or encoder, output kernel), each fitted on the same
training data, selected on the same held-out data and evaluated on the same test queries and candidates. A row
records its parameters, its test metrics (hit@1/5/10/20, MRR, mean rank of the truth; ties count against the
truth), and its fit and evaluation wall (and CPU) seconds. A ``random`` row gives the exact expectation of a
uniformly random ranking of the same candidate sets (:func:`molpredict.engine.decoding.random_expectation`), so every
row can be read beside chance.

- ``massbank``: MS/MS -> structure. Train on train_pos (early stopping / lam on a seeded subset of val_pos),
  test on test_pos (``--ion-mode neg``: the ``*_neg`` files) against ``candidates/test_formula256.json`` (each spectrum one query; hit = InChIKey first
  block). DSOKR stops early on the MRR of the validation spectra ranked in their ``val_formula256.json`` sets.
  Rows: ``dsokr`` (``kernel-mlp``: a linear layer on the Nystrom features of the ``ppk-losses`` kernel against
  m_x training spectra; Gaussian-Tanimoto output kernel, subsample m_y) as a single network and as ensembles
  (``--members 1,3``: one row per member count); ``dsokr-binned-mlp`` (``mlp``: two hidden layers on binned
  spectra); ``sisokr`` with ``molpredict train``'s defaults (kernels, sketch sizes, lam grid; ``--skip-sisokr``);
  the ``prior`` baseline (a candidate's Tanimoto similarity to its 5 most similar training structures: it never
  looks at the spectrum). Spectra are cleaned by the default pipeline, as ``molpredict train`` and ``identify``
  clean them. SISOKR selects lam by the MRR in the same validation sets (as ``molpredict train
  --val-candidates`` does). ``--input-kernel mkl --output-kernel tanimoto`` gives the DSOKR rows SISOKR's
  kernels (the linear layer on the Nystrom features of the MKL kernel; no binned-MLP row then). ``--split val``
  takes no test figure: a third of the val_pos structures (at most ``--val`` spectra) stops DSOKR and selects
  SISOKR's lam, the other two thirds are scored in their ``val_formula256.json`` sets (the split of
  ``benchmarks/formula_transformer.py``).
- ``chebi``: text -> molecule (ChEBI-20). Train on ``chebi20/val.tsv`` (the official training split is not
  available offline; 10% of its structures held out for early stopping and lam), test on ``test.tsv`` against
  all of ``molecules.tsv`` (hit = same canonical SMILES, stereo included, so the output kernels are chiral).
  Rows: ``sisokr`` x input kernels {``text-embedding``, ``text-ngram``} x output kernels {``gaussian-tanimoto``,
  ``fingerprint-cosine``}; ``dsokr`` (``text-embedding`` encoder: frozen MiniLM + MLP head) x the same two
  output kernels; ``dsokr`` with ``kernel-mlp`` (a linear layer on the whitened TF-IDF n-gram kernel features,
  early stopping on the held-out MRR) and the cosine output kernel, single and as a 3-member ensemble; ``iokr``
  on the embeddings with Gaussian-Tanimoto; and the embedding-regression baseline (see :func:`chebi_rows`).
  Frozen sentence embeddings are memoised in ``<out>/chebi_embeddings.npz``.
- ``qm9``: SMILES -> molecular graph. A fixed seeded QM9 subset (``--n-train 20000 --n-val 500 --n-test 2000``;
  one-atom molecules dropped; graphs hydrogen-suppressed and kekulised, so bonds are single / double / triple);
  candidates are the training plus the test graphs (hit = InChIKey first block). Rows per output kernel of
  ``--output-kernels`` (GraKeL ``wl-subtree``, ``nspd``, ``core-wl``; default ``wl-subtree`` only, as one
  20,000-structure DSOKR transformer fills half of the 30-minute budget on two cores: run the others as separate
  invocations): ``dsokr`` with the character-level ``transformer`` encoder and ``sisokr`` with the
  ``smiles-ngram`` input kernel. The graph edit distance between the decoded and the true graph (networkx, unit
  costs, atoms labelled by element; per-pair time limit ``--ged-timeout``, the value then an upper bound and
  counted in ``ged_timeouts``) is reported on the first ``--n-ged`` test queries, without and with bond labels
  (bond order as edge label).

``--quick`` shrinks every size that is not given on the command line to a smoke test (under half a minute per
task on one core, plus ~20 s of one-off sentence embeddings for ``chebi``); ``--only`` runs some of the rows. The
report is rewritten after every row, so an interrupted run keeps the rows it finished. Wall seconds depend on
what else runs on the machine: ``cpu_s`` per stage and the load averages are recorded too.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout's molpredict, not whichever one the environment installed
    sys.path.insert(0, str(ROOT))

#: chiral output kernels for ChEBI-20, where a hit is the same stereoisomer
CHEBI_GT = "gaussian-tanimoto:gamma=auto,chiral=true"
CHEBI_FC = "fingerprint-cosine:chiral=true"
#: DSOKR on text: a linear layer on the whitened TF-IDF n-gram kernel features (``molpredict train``'s text default)
CHEBI_KERNEL_ENCODER = "kernel-mlp:input_kernel=text-ngram;layers=0;whiten=true"
QM9_KERNELS = {"wl-subtree": "wl-subtree:n_iter=3", "nspd": "nspd", "core-wl": "core-wl:n_iter=3"}

#: sizes as (full run, ``--quick``), used for the options not given on the command line
SIZES: dict[str, tuple[Any, Any]] = {
    "m_y": (1000, 100), "m_x": (2000, 200), "epochs": (30, 2), "val": (2000, 200), "limit": (None, 2000),
    "test_limit": (None, 60), "train_limit": (None, 300), "pool_limit": (None, 2000), "members": ("1,3", "1,2"),
    "n_train": (20000, 400), "n_val": (500, 100), "n_test": (2000, 60), "n_ged": (200, 10),
}
#: full-run sizes that differ per task: ChEBI-20 trains on ~3,000 pairs, so larger output sketches are cheap there
TASK_SIZES: dict[str, dict[str, Any]] = {"chebi": {"m_y": 2000}, "massbank": {"m_y": 2000, "m_x": 4000}}
#: MassBank's DSOKR network: a linear layer on the Nystrom features of the PPK-with-losses kernel against m_x
#: training spectra (SISOKR's input side). Chosen on val_formula256 (train_pos, early stopping on the MRR of
#: 3,358 val_pos spectra, scored on the other 1,683; m_y 2000): hit@1 32.4% against SISOKR's 30.7% there; raw
#: kernel values 30.1%; one hidden layer (2048, dropout 0.5) on raw kernel values 18.9%; the binned-spectrum MLP
#: 20.9% (m_y 1000, loss-based early stopping, which picked worse-ranking epochs than the MRR throughout)
MASSBANK_ENCODER = "kernel-mlp:layers=0;whiten=true;n_landmarks={m_x}"
#: DSOKR optimiser settings per task (also under ``--quick``), for the options not given on the command line. QM9's
#: character transformer: on a 2,000 / 300 structure split (validation, 20 epochs) lr 3e-3 with 100 warm-up
#: steps gave val hit@1 19.7% against 3.7% for lr 1e-3; lr 3e-3 without warm-up stayed near the mean predictor
OPTIMISER: dict[str, Any] = {"lr": 1e-3, "warmup": 0, "batch_size": 128}
TASK_OPTIMISER: dict[str, dict[str, Any]] = {"qm9": {"lr": 3e-3, "warmup": 100}, "chebi": {"batch_size": 64}}


class Clock:
    """Wall and CPU seconds per named stage."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, float]] = {}
        self.start_wall, self.start_cpu = time.perf_counter(), time.process_time()

    def __call__(self, name: str):
        clock = self

        class _Stage:
            def __enter__(self):
                self.wall, self.cpu = time.perf_counter(), time.process_time()

            def __exit__(self, *exc):
                clock.stages[name] = {"wall_s": round(time.perf_counter() - self.wall, 2),
                                      "cpu_s": round(time.process_time() - self.cpu, 2)}
                print(f"[{name}] {clock.stages[name]}", file=sys.stderr, flush=True)
        return _Stage()


def environment() -> dict[str, Any]:
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_avg": os.getloadavg(),
            "cuda": torch.cuda.is_available()}


# -- rows ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One benchmark row: a model (registry name) with its parameters, under a readable label."""

    name: str
    model: str
    params: dict = field(default_factory=dict)


def metrics_of(model: Any, inputs: list, truths: list, candidates: Any, hit: str = "inchikey14"
               ) -> dict[str, float]:
    """hit@1/5/10/20, MRR and mean rank of the truth (its candidate-set size + 1 when absent)."""
    from molpredict.models.dsokr import candidate_sets
    sets = candidate_sets(truths, candidates, hit=hit)
    return scored_metrics(model, model.predict_coordinates(inputs), model.candidate_coordinates(sets.pool), sets)


def scored_metrics(model: Any, predictions: np.ndarray, coordinates: np.ndarray, sets: Any) -> dict[str, float]:
    """:func:`metrics_of` from already computed query and candidate coordinates."""
    from molpredict.models.dsokr import coordinate_metrics
    out = coordinate_metrics(predictions, coordinates, sets, ks=(1, 5, 10, 20), scorer=model.score_coordinates)
    out["mean_rank"] = out.pop("rank")
    return out


def random_row(truths: list, candidates: Any, hit: str = "inchikey14") -> dict[str, Any]:
    """The exact metrics of a uniformly random ranking of the same candidate sets (queries whose set lacks the
    truth count as misses, as for the models)."""
    from molpredict.engine.decoding import random_expectation
    from molpredict.models.dsokr import candidate_sets
    sets = candidate_sets(truths, candidates, hit=hit)
    n = np.array([len(i) for i in sets.index], dtype=np.float64)
    found = np.array([bool(t.any()) for t in sets.is_true])
    expected = random_expectation(n[found] if found.any() else n)
    share = float(found.mean()) if len(found) else 0.0
    test = {k: v * share for k, v in expected.items() if k != "mean_rank"}
    test["mean_rank"] = float(np.mean(np.where(found, (n + 1.0) / 2.0, n + 1.0))) if len(n) else float("nan")
    return {"model": "random", "params": {}, "test": test, "fit_s": 0.0, "eval_s": 0.0}


def fit_and_evaluate(row: Row, data: tuple, evaluate: Callable[[Any, str], dict], clock: Clock) -> dict[str, Any]:
    """Fit ``row``'s model on ``data`` = (inputs, molecules, val) and evaluate it; the report entry."""
    from molpredict.registry import get_registry
    x, y, val = data[:3]
    model = get_registry().get("model", row.model)(**row.params)
    if len(data) > 3 and data[3] is not None and "select_by" in model.param_names():
        val = data[3]  # a model that selects its grid point by ranking gets the candidate sets as train passes them
    with clock(f"{row.name}/fit"):
        model.fit(x, y, val=val)
    with clock(f"{row.name}/eval"):
        test = evaluate(model, row.name)
    fit, ev = clock.stages[f"{row.name}/fit"], clock.stages[f"{row.name}/eval"]
    entry: dict[str, Any] = {"model": row.model, "params": row.params, "test": test,
                             "fit_s": fit["wall_s"], "eval_s": ev["wall_s"],
                             "fit_cpu_s": fit["cpu_s"], "eval_cpu_s": ev["cpu_s"], "load_avg": os.getloadavg()}
    if hasattr(model, "lam_"):
        entry["lam"] = model.lam_
        entry["val_loss"] = {str(p["lam"]): p["val_loss"] for p in model.selection_["points"]}
        metric = model.selection_.get("select_by", "kernel-loss")
        entry["select_by"] = metric
        if metric != "kernel-loss":
            entry[f"val_{metric}"] = {str(p["lam"]): p.get(f"val_{metric}") for p in model.selection_["points"]}
        chosen = model.selection_["points"][model.selection_["best"]]
        if "finetune" in chosen:
            entry["finetune"] = chosen["finetune"]
    if hasattr(model, "history_") and isinstance(model.history_, list) and model.history_ \
            and isinstance(model.history_[0], dict):
        entry["best_epoch"] = [h.get("best_epoch") for h in model.history_]
        entry["epochs_run"] = [len(h.get("train_loss", [])) for h in model.history_]
        entry["p_y"] = [h.get("rank") for h in model.history_]
        entry["history"] = model.history_
    if val is not None and hasattr(model, "kernel_loss"):  # the baselines have none
        entry["kernel_loss_val"] = float(model.kernel_loss(val[0], val[1]))
    print(json.dumps({row.name: test}), file=sys.stderr, flush=True)
    return entry


def run_rows(rows: list[Row], data: tuple, evaluate: Callable[[Any, str], dict], clock: Clock,
             report: dict[str, Any], args: argparse.Namespace) -> None:
    """Fit and evaluate the rows in order (those ``--only`` names), writing the report after each one."""
    for row in rows:
        if args.only and not any(row.model == o or row.name.startswith(o) for o in args.only):
            continue
        report["models"][row.name] = fit_and_evaluate(row, data, evaluate, clock)
        write_report(report, args, clock)


def split_by_structure(molecules: list, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted({m.inchikey14 for m in molecules})
    rng = np.random.default_rng(seed)
    held = set(rng.choice(keys, size=max(1, int(round(fraction * len(keys)))), replace=False).tolist())
    mask = np.array([m.inchikey14 in held for m in molecules])
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def dsokr_params(args: argparse.Namespace, encoder: str, output_kernel: str, members: int = 1) -> dict[str, Any]:
    return dict(encoder=encoder, output_kernel=output_kernel, output_sketch=f"subsample:m={args.m_y}",
                epochs=args.epochs, lr=args.lr, warmup=args.warmup, batch_size=args.batch_size,
                patience=args.patience, n_members=members, device=args.device, seed=args.seed,
                rank_epochs=args.dsokr_rank_epochs)


# -- massbank --------------------------------------------------------------------------------------------
def labelled_spectra(path: Path, limit: int | None, cache: dict) -> tuple[list, list]:
    """Spectra with a parsable SMILES, cleaned by the default pipeline as ``molpredict train`` / ``identify``
    clean them; those left without peaks are dropped."""
    from molpredict.io import read_spectra
    from molpredict.chem.molecules import Molecule
    from molpredict.spectra.cleaning import CleaningPipeline
    clean = CleaningPipeline()
    spectra, labels = [], []
    for spectrum in itertools.islice(read_spectra(path), limit):
        spectrum = clean(spectrum)
        if spectrum is None:
            continue
        smiles = spectrum.smiles
        if not smiles or spectrum.n_peaks == 0:
            continue
        if smiles not in cache:
            try:
                cache[smiles] = Molecule.from_smiles(smiles)
            except Exception:
                cache[smiles] = None
        if cache[smiles] is not None:
            spectra.append(spectrum)
            labels.append(cache[smiles])
    return spectra, labels


def massbank_encoder(args: argparse.Namespace) -> str:
    """The DSOKR rows' encoder: ``--encoder`` as given, else :data:`MASSBANK_ENCODER` (m_x landmarks) on
    ``--input-kernel`` when given (e.g. ``mkl``, SISOKR's default input kernel), else on ``ppk-losses``."""
    if args.encoder:
        return args.encoder
    encoder = MASSBANK_ENCODER.format(m_x=args.m_x)
    if args.input_kernel:
        if "," in args.input_kernel or ";" in args.input_kernel:
            # a nested spec reads every ';' as ',', which would end the kernel's parameters in the encoder's
            raise SystemExit(f"--input-kernel {args.input_kernel!r}: a kernel nested in the encoder spec cannot "
                             "carry ',' or ';' (give its defaults by name, e.g. mkl)")
        encoder = encoder.replace("kernel-mlp:", f"kernel-mlp:input_kernel={args.input_kernel};", 1)
    return encoder


def massbank_rows(args: argparse.Namespace) -> list[Row]:
    """DSOKR single and ensembles (and a single binned-spectrum MLP), SISOKR with ``molpredict train``'s
    defaults, and the prior baseline. The DSOKR rows' output kernel is ``--output-kernel``, else SISOKR's."""
    from molpredict.training.pipeline import DEFAULT_MODEL, model_defaults
    DEFAULTS = model_defaults(DEFAULT_MODEL)
    output = args.output_kernel or DEFAULTS["output_kernel"]
    members = [int(m) for m in str(args.members).split(",") if m.strip()]
    encoder = massbank_encoder(args)
    dsokr = [Row("dsokr" if t == 1 else f"dsokr-ensemble{t}", "dsokr",
                 dsokr_params(args, encoder, output, members=t)) for t in members]
    rows = [r for r in dsokr if r.params["n_members"] == 1]
    if not args.encoder and not args.input_kernel:
        rows.append(Row("dsokr-binned-mlp", "dsokr", dict(dsokr_params(args, "mlp", output), lr=1e-3)))
    if not args.skip_sisokr:
        # the model a user gets from `molpredict train` (kernels, sketch sizes, lam grid selected on val)
        defaults = {k: DEFAULTS[k] for k in ("input_kernel", "output_kernel", "input_sketch", "output_sketch", "lam")}
        if args.quick:
            defaults.update(input_sketch=f"subsample:m={args.m_x}", output_sketch=f"subsample:m={args.m_y}")
        # SISOKR with its ranking fine-tune: one row per epoch budget and learning rate
        for epochs, lr in [(e, lr) for e in args.rank_epochs for lr in (args.rank_lr if e else [None])]:
            default = epochs == DEFAULTS.get("rank_epochs", 0) and lr in (None, DEFAULTS.get("rank_lr"))
            name = "sisokr" if default else ("sisokr-ridge" if epochs == 0 else f"sisokr-rank{epochs}")
            name += f"-lr{lr:g}" if not default and epochs and len(args.rank_lr) > 1 else ""
            params = dict(defaults, rank_epochs=epochs, device=args.device, seed=args.seed)
            if lr is not None and epochs:
                params["rank_lr"] = lr
            rows.append(Row(name, DEFAULT_MODEL, params))
    rows.append(Row("prior", "prior", dict(similarity="tanimoto", top_k=5)))
    return rows + [r for r in dsokr if r.params["n_members"] > 1]  # the costliest last


def validation_split(molecules: list, sets: dict, n_stop: int, seed: int) -> tuple[list[int], list[int]]:
    """``--split val``: the positions of the validation spectra whose structure has a candidate set, split by
    structure (seeded, as ``benchmarks/formula_transformer.py`` splits): a third of the structures for early
    stopping and grid selection (*stop*, at most ``n_stop`` spectra of them, drawn with ``seed``), the other two
    thirds scored (*eval*)."""
    keys = sorted({m.inchikey14 for m in molecules if m.inchikey14 in sets})
    stop_keys = set(np.random.default_rng(seed + 1).choice(keys, len(keys) // 3, replace=False).tolist())
    stop = [i for i, m in enumerate(molecules) if m.inchikey14 in stop_keys]
    stop = sorted(np.random.default_rng(seed + 2).choice(stop, min(n_stop, len(stop)), replace=False).tolist())
    evl = [i for i, m in enumerate(molecules) if m.inchikey14 in sets and m.inchikey14 not in stop_keys]
    return stop, evl


def run_massbank(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    from molpredict.chem.candidates import candidate_set_molecules, load_candidate_sets
    from molpredict.models.base import ValidationData
    from molpredict.training.ranking_validation import ranking_candidates
    cache: dict = {}
    with clock("read"):
        train, y = labelled_spectra(args.data / "massbank" / f"train_{args.ion_mode}.mgf", args.limit, cache)
        val, yv = labelled_spectra(args.data / "massbank" / f"val_{args.ion_mode}.mgf", None, cache)
        val_sets = load_candidate_sets(args.data / "candidates" / "val_formula256.json")
        if args.split == "test":
            test, yt = labelled_spectra(args.data / "massbank" / f"test_{args.ion_mode}.mgf", args.test_limit, cache)
            sets = load_candidate_sets(args.data / "candidates" / "test_formula256.json")
    if args.split == "val":  # stop on a third of the validation structures, score the other two thirds
        stop, evl = validation_split(yv, val_sets, args.val, args.seed)
        test, yt, sets = [val[i] for i in evl][: args.test_limit], [yv[i] for i in evl][: args.test_limit], val_sets
        val, yv = [val[i] for i in stop], [yv[i] for i in stop]
    else:
        rng = np.random.default_rng(args.seed)
        val = [(s, m) for s, m in zip(val, yv) if m.inchikey14 in val_sets]  # early stopping ranks their sets
        keep = np.sort(rng.choice(len(val), size=min(args.val, len(val)), replace=False))
        val, yv = [val[i][0] for i in keep], [val[i][1] for i in keep]
    val_candidates = [candidate_set_molecules(val_sets[m.inchikey14]) for m in yv]
    # SISOKR selects lam by the MRR in the same sets, as `molpredict train --val-candidates` does
    ranking_val = ValidationData(val, yv, ranking_candidates(yv, [val_sets]))
    queries = [i for i, m in enumerate(yt) if m.inchikey14 in sets]
    test, yt = [test[i] for i in queries], [yt[i] for i in queries]
    candidates = [candidate_set_molecules(sets[m.inchikey14]) for m in yt]
    report: dict[str, Any] = {"split": args.split, "ion_mode": args.ion_mode, "n_train": len(train),
                              "n_train_structures": len({m.inchikey14 for m in y}),
                              "n_val": len(val), "n_val_structures": len({m.inchikey14 for m in yv}),
                              "n_test": len(test), "n_test_structures": len({m.inchikey14 for m in yt}),
                              "candidates": ("val_formula256.json (eval part)" if args.split == "val"
                                             else "test_formula256.json"), "models": {}}
    report["models"]["random"] = random_row(yt, candidates)
    run_rows(massbank_rows(args), (train, y, (val, yv, val_candidates), ranking_val),
             lambda model, name: metrics_of(model, test, yt, candidates),
             clock, report, args)
    return report


# -- chebi -----------------------------------------------------------------------------------------------
def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        return [dict(zip(header, line.rstrip("\n").split("\t"))) for line in handle if line.strip()]


def molecules_of(rows: list[dict[str, str]], cache: dict) -> list:
    from molpredict.chem.molecules import Molecule
    out = []
    for row in rows:
        smiles = row["smiles"]
        if smiles not in cache:
            try:
                cache[smiles] = Molecule.from_smiles(smiles)
            except Exception:
                cache[smiles] = None
        out.append(cache[smiles])
    return out


def warm_embeddings(texts: list[str], path: Path) -> None:
    """Fill the process's sentence-embedding memo from ``path`` (bench-out, not the repository), computing and
    saving what is missing: the frozen embeddings are the slow part on a CPU and do not change between runs."""
    from molpredict.kernels import text as text_module
    if path.exists():
        saved = np.load(path, allow_pickle=False)
        text_module._EMBEDDINGS.update(zip(saved["texts"].tolist(), saved["embeddings"]))
    missing = [t for t in dict.fromkeys(texts) if t not in text_module._EMBEDDINGS]
    if missing:
        text_module.embed_texts(missing)
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(text_module._EMBEDDINGS)
        np.savez(path, texts=np.array(keys), embeddings=np.stack([text_module._EMBEDDINGS[k] for k in keys]))


def chebi_rows(args: argparse.Namespace) -> list[Row]:
    """SISOKR (2 input x 2 output kernels), DSOKR (2 output kernels), IOKR on embeddings, embedding regression.

    The embedding-regression baseline ("embedding-regression (IOKR, linear kernels)") is ridge regression from
    the frozen sentence embeddings to the molecules' fingerprint feature space, decoded by cosine: IOKR with the
    ``text-embedding`` input kernel (the cosine of embeddings, i.e. the linear kernel on unit-length
    embeddings) and the ``fingerprint-cosine`` output kernel (the linear kernel on unit-length Morgan count
    fingerprints). Kernel ridge regression with two linear kernels *is* linear ridge regression of unit
    fingerprints on unit embeddings (in its dual form), and the IOKR score <phi(c), h(x)> ranks candidates as
    the cosine between c's fingerprint and the predicted one. lam is chosen on the held-out structures.
    """
    outputs = {"gaussian-tanimoto": CHEBI_GT, "fingerprint-cosine": CHEBI_FC}
    encoder = args.encoder or "text-embedding:hidden=1024,layers=1,dropout=0.2"
    rows = []
    for input_kernel in ("text-embedding", "text-ngram"):
        for out_name, output in outputs.items():
            rows.append(Row(f"sisokr/{input_kernel}/{out_name}", "sisokr", dict(
                input_kernel=input_kernel, output_kernel=output, input_sketch=f"subsample:m={args.m_x}",
                output_sketch=f"subsample:m={args.m_y}", lam=args.lam_grid, device=args.device, seed=args.seed)))
    for out_name, output in outputs.items():
        rows.append(Row(f"dsokr/text-embedding/{out_name}", "dsokr", dsokr_params(args, encoder, output)))
    for members in (1, 3):
        suffix = "" if members == 1 else f"-ensemble{members}"
        rows.append(Row(f"dsokr{suffix}/kernel-mlp(text-ngram)/fingerprint-cosine", "dsokr",
                        dsokr_params(args, CHEBI_KERNEL_ENCODER, CHEBI_FC, members=members)))
    rows.append(Row("iokr/text-embedding/gaussian-tanimoto", "iokr", dict(
        input_kernel="text-embedding", output_kernel=CHEBI_GT, lam=args.lam_grid, device=args.device,
        seed=args.seed)))
    rows.append(Row("embedding-regression (IOKR, linear kernels)", "iokr", dict(
        input_kernel="text-embedding", output_kernel=CHEBI_FC, lam=args.lam_grid, device=args.device,
        seed=args.seed)))
    return rows


def run_chebi(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    from molpredict.models.basis import distinct_objects
    cache: dict = {}
    with clock("read"):
        train_rows = read_tsv(args.data / "chebi20" / "val.tsv")[: args.train_limit]
        test_rows = read_tsv(args.data / "chebi20" / "test.tsv")[: args.test_limit]
        pool_rows = read_tsv(args.data / "chebi20" / "molecules.tsv")[: args.pool_limit]
        train = [(r["description"], m) for r, m in zip(train_rows, molecules_of(train_rows, cache)) if m]
        test = [(r["description"], m) for r, m in zip(test_rows, molecules_of(test_rows, cache)) if m]
        pool = distinct_objects([m for m in molecules_of(pool_rows, cache) if m is not None] +
                                [m for _, m in test])[0]
    with clock("embed"):
        warm_embeddings([t for t, _ in train] + [t for t, _ in test], args.out / "chebi_embeddings.npz")
    fit_index, val_index = split_by_structure([m for _, m in train], 0.1, args.seed)
    x = [train[i][0] for i in fit_index]
    y = [train[i][1] for i in fit_index]
    xv = [train[i][0] for i in val_index]
    yv = [train[i][1] for i in val_index]
    xt, yt = [t for t, _ in test], [m for _, m in test]
    report: dict[str, Any] = {"n_train": len(x), "n_val": len(xv), "n_test": len(xt), "n_candidates": len(pool),
                              "hit": "canonical isomeric SMILES", "models": {}}
    report["models"]["random"] = random_row(yt, pool, hit="smiles")
    run_rows(chebi_rows(args), (x, y, (xv, yv)), lambda model, name: metrics_of(model, xt, yt, pool, hit="smiles"),
             clock, report, args)
    return report


# -- qm9 -------------------------------------------------------------------------------------------------
def to_nx(molecule: Any, bond_labels: bool) -> Any:
    """The molecule's heavy-atom graph for networkx: nodes labelled by element, edges by bond type if asked."""
    import networkx as nx
    edges, labels, bonds = molecule.graph(bond_labels=bond_labels)
    graph = nx.Graph()
    for node, label in labels.items():
        graph.add_node(node, label=label)
    for i, neighbours in edges.items():
        for j in neighbours:
            graph.add_edge(i, j, **({"label": bonds[(i, j)]} if bond_labels else {}))
    return graph


def graph_edit_distance(a: Any, b: Any, timeout: float, bond_labels: bool = False) -> tuple[float, bool]:
    """GED between two networkx graphs (unit costs; node labels, edge labels if asked), the best found in
    ``timeout`` seconds; also whether the limit was hit (the value is then an upper bound)."""
    import networkx as nx
    same = lambda u, v: u["label"] == v["label"]  # noqa: E731
    start = time.perf_counter()
    value = nx.graph_edit_distance(a, b, node_match=same, edge_match=same if bond_labels else None,
                                   timeout=timeout)
    return float(value), time.perf_counter() - start >= timeout


def _ged_task(task: tuple) -> tuple[float, bool]:
    return graph_edit_distance(*task)


def graph_edit_distances(pairs: list[tuple[Any, Any]], timeout: float, workers: int, memo: dict
                         ) -> dict[bool, list[tuple[float, bool]]]:
    """GED (value, hit the time limit) of each (decoded, true) molecule pair, without and with bond labels.

    Identical structures are 0 without search; ``memo`` (keyed by the two SMILES) keeps values across calls, as
    rows often decode the same wrong graph; the rest runs on ``workers`` processes (the search is pure Python).
    Graphs are built here and shipped as networkx graphs: a kekulised molecule re-parsed from its SMILES in
    another process would be aromatic again.
    """
    todo: dict[tuple, tuple] = {}
    for a, b in pairs:
        for bonds in (False, True):
            key = (a.smiles, b.smiles, bonds)
            if key in memo or key in todo:
                continue
            if a.inchikey14 == b.inchikey14 and a.smiles == b.smiles:
                memo[key] = (0.0, False)
            else:
                todo[key] = (to_nx(a, bonds), to_nx(b, bonds), timeout, bonds)
    if workers > 1 and len(todo) > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            memo.update(zip(todo, pool.map(_ged_task, todo.values(), chunksize=4)))
    else:
        memo.update(zip(todo, map(_ged_task, todo.values())))
    return {bonds: [memo[(a.smiles, b.smiles, bonds)] for a, b in pairs] for bonds in (False, True)}


def qm9_molecule(smiles: str) -> tuple[str, Any] | None:
    """(canonical SMILES input, kekulised Molecule output), or None for unparsable and one-atom molecules.

    RDKit drops the hydrogens on parsing; kekulising (aromatic flags cleared) makes every bond single, double or
    triple, which is what the graph kernels and the GED with bond labels see. The input string is RDKit's
    canonical (aromatic) SMILES, as for any other SMILES query.
    """
    from rdkit import Chem

    from molpredict.chem.molecules import Molecule
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() < 2:
        return None
    text = Chem.MolToSmiles(mol)
    Chem.Kekulize(mol, clearAromaticFlags=True)
    return text, Molecule.from_rdkit(mol)


def qm9_subset(path: Path, n: int, seed: int) -> tuple[list[str], list]:
    """The first ``n`` usable molecules of a seeded permutation of the file's SMILES."""
    smiles = [line.split()[0] for line in open(path, encoding="utf-8") if line.strip()]
    strings, molecules = [], []
    for i in np.random.default_rng(seed).permutation(len(smiles)):
        item = qm9_molecule(smiles[i])
        if item is not None:
            strings.append(item[0])
            molecules.append(item[1])
            if len(molecules) == n:
                break
    return strings, molecules


def qm9_rows(args: argparse.Namespace) -> list[Row]:
    """Per output kernel: DSOKR (character transformer) and SISOKR (SMILES n-gram input kernel)."""
    rows = []
    for name in [k.strip() for k in args.output_kernels.split(",") if k.strip()]:
        if name not in QM9_KERNELS:
            raise SystemExit(f"unknown qm9 output kernel {name!r} (known: {', '.join(QM9_KERNELS)})")
        output = QM9_KERNELS[name]
        rows.append(Row(f"dsokr/transformer/{name}", "dsokr",
                        dsokr_params(args, args.encoder or "transformer", output)))
        if not args.skip_sisokr:
            rows.append(Row(f"sisokr/smiles-ngram/{name}", "sisokr", dict(
                input_kernel="smiles-ngram", output_kernel=output, input_sketch=f"subsample:m={args.m_x}",
                output_sketch=f"subsample:m={args.m_y}", lam=args.lam_grid, device=args.device, seed=args.seed)))
    return rows


def run_qm9(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    from molpredict.models.dsokr import candidate_sets
    with clock("read"):
        strings, molecules = qm9_subset(args.data / "qm9" / "qm9.smi", args.n_train + args.n_val + args.n_test,
                                        args.seed)
    a, b = args.n_train, args.n_train + args.n_val
    x, y = strings[:a], molecules[:a]
    xv, yv = strings[a:b], molecules[a:b]
    xt, yt = strings[b:], molecules[b:]
    pool = y + yt
    report: dict[str, Any] = {"n_train": len(x), "n_val": len(xv), "n_test": len(xt), "n_candidates": len(pool),
                              "candidates": "training + test graphs", "ged_timeout_s": args.ged_timeout,
                              "models": {}}
    report["models"]["random"] = random_row(yt, pool)
    sets = candidate_sets(yt, pool)
    memo: dict[tuple, tuple[float, bool]] = {}

    def evaluate(model: Any, name: str) -> dict[str, Any]:
        predictions = model.predict_coordinates(xt)
        coordinates = model.candidate_coordinates(sets.pool)
        result = scored_metrics(model, predictions, coordinates, sets)
        n_ged = min(len(xt), args.n_ged)
        decoded = [sets.pool[j] for j in np.argmax(model.score_coordinates(predictions[:n_ged], coordinates), 1)]
        with clock(f"{name}/ged"):
            distances = graph_edit_distances(list(zip(decoded, yt[:n_ged])), args.ged_timeout, args.ged_workers,
                                             memo)
        for bonds, key in ((False, "ged"), (True, "ged_bonds")):
            pairs = distances[bonds]
            result[f"{key}_mean"] = float(np.mean([d for d, _ in pairs])) if pairs else float("nan")
            result[f"{key}_timeouts"] = int(sum(t for _, t in pairs))
        result["n_ged"] = n_ged
        result["ged_s"] = clock.stages[f"{name}/ged"]["wall_s"]
        return result

    run_rows(qm9_rows(args), (x, y, (xv, yv)), evaluate, clock, report, args)
    return report


# -- main ------------------------------------------------------------------------------------------------
def table(report: dict[str, Any]) -> str:
    """The rows as a plain-text table (hit@k in %, fit and evaluation wall seconds)."""
    lines = [f"{'row':<46} {'hit@1':>6} {'hit@10':>6} {'MRR':>6} {'rank':>8} {'fit s':>7} {'eval s':>7}"]
    for name, entry in report["models"].items():
        t = entry["test"]
        lines.append(f"{name:<46} {100 * t['hit@1']:>6.2f} {100 * t['hit@10']:>6.2f} {t['mrr']:>6.3f} "
                     f"{t['mean_rank']:>8.1f} {entry['fit_s']:>7.1f} {entry['eval_s']:>7.1f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=["massbank", "chebi", "qm9"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    parser.add_argument("--data", type=Path, required=True, help="the shared data directory (../shared/data)")
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes for every size option not given")
    parser.add_argument("--only", default=None,
                        help="comma-separated model names or row-name prefixes to run (default: all rows), "
                             "e.g. sisokr/text-ngram,embedding-regression")
    parser.add_argument("--encoder", default=None, help="DSOKR encoder spec (default per task)")
    parser.add_argument("--input-kernel", default=None,
                        help="massbank: the DSOKR encoder's input kernel (kernel-mlp on its Nystrom features; "
                             "default ppk-losses; mkl is SISOKR's default, ppk-losses+formula-annotation uniform)")
    parser.add_argument("--output-kernel", default=None,
                        help="massbank: the DSOKR rows' output kernel (default: SISOKR's, molpredict train's)")
    parser.add_argument("--split", choices=["test", "val"], default="test",
                        help="massbank: test (stop on --val val_pos spectra, score test_pos in test_formula256) "
                             "or val (stop and select on a third of the val_pos structures, at most --val "
                             "spectra, score the other two thirds in val_formula256)")
    parser.add_argument("--m-y", type=int, default=None,
                        help="output sketch size (1000; chebi, massbank 2000; --quick 100)")
    parser.add_argument("--m-x", type=int, default=None,
                        help="SISOKR input sketch size; massbank: DSOKR landmark spectra (2000, massbank 4000; "
                             "--quick 200)")
    parser.add_argument("--lam-grid", default="1e-6|1e-5|1e-4|1e-3|1e-2|1e-1",
                        help="IOKR/SISOKR ridge grid, chosen on the held-out data (chebi, qm9)")
    parser.add_argument("--epochs", type=int, default=None, help="DSOKR epochs (30; --quick 2)")
    parser.add_argument("--lr", type=float, default=None, help="DSOKR learning rate (1e-3, qm9 3e-3)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="DSOKR linear learning-rate warm-up steps (0, qm9 100)")
    parser.add_argument("--batch-size", type=int, default=None, help="DSOKR mini-batch (128, chebi 64)")
    parser.add_argument("--patience", type=int, default=5)
    parser.add_argument("--members", default=None,
                        help="massbank: DSOKR member counts, one row each (1,3: a single network and a 3-member "
                             "ensemble; --quick 1,2)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="massbank: first N training records")
    parser.add_argument("--test-limit", type=int, default=None, help="massbank, chebi: first N test records")
    parser.add_argument("--val", type=int, default=None, help="massbank: val_pos spectra for early stopping (2000)")
    parser.add_argument("--train-limit", type=int, default=None, help="chebi: first N training pairs")
    parser.add_argument("--pool-limit", type=int, default=None,
                        help="chebi: first N candidates of molecules.tsv (the test molecules are always added)")
    parser.add_argument("--skip-sisokr", action="store_true")
    parser.add_argument("--dsokr-rank-epochs", type=int, default=0,
                        help="DSOKR: ranking fine-tune epochs after the square-loss training (0: none)")
    parser.add_argument("--ion-mode", choices=["pos", "neg"], default="pos",
                        help="massbank: the spectra files (train_/val_/test_ pos or neg)")
    parser.add_argument("--rank-lr", default=None,
                        help="massbank: SISOKR ranking fine-tune learning rates, one row each (default: molpredict "
                             "train's)")
    parser.add_argument("--rank-epochs", default=None,
                        help="massbank: SISOKR ranking fine-tune epoch budgets, one row each (default: molpredict "
                             "train's; 0 is the ridge solution alone)")
    parser.add_argument("--n-train", type=int, default=None, help="qm9: training structures (20000)")
    parser.add_argument("--n-val", type=int, default=None, help="qm9: validation structures (500)")
    parser.add_argument("--n-test", type=int, default=None, help="qm9: test structures (2000)")
    parser.add_argument("--output-kernels", default="wl-subtree",
                        help="qm9: comma-separated output kernels among wl-subtree, nspd, core-wl")
    parser.add_argument("--n-ged", type=int, default=None, help="qm9: test queries whose GED is computed (200)")
    parser.add_argument("--ged-timeout", type=float, default=0.5,
                        help="qm9: GED seconds per pair (the best path found by then is an upper bound)")
    parser.add_argument("--ged-workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="qm9: processes for the GED search")
    args = parser.parse_args(argv)
    for name, (full, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else TASK_SIZES.get(args.task, {}).get(name, full))
    for name, value in OPTIMISER.items():
        if getattr(args, name) is None:
            setattr(args, name, TASK_OPTIMISER.get(args.task, {}).get(name, value))
    args.only = {s.strip() for s in args.only.split(",")} if args.only else None
    from molpredict.models.okr import DEFAULT_RANK_EPOCHS, DEFAULT_RANK_LR
    args.rank_epochs = [int(e) for e in str(args.rank_epochs if args.rank_epochs is not None
                                            else DEFAULT_RANK_EPOCHS).split(",") if e.strip()]
    args.rank_lr = [float(e) for e in str(args.rank_lr if args.rank_lr is not None
                                          else DEFAULT_RANK_LR).split(",") if e.strip()]
    return args


def write_report(report: dict[str, Any], args: argparse.Namespace, clock: Clock) -> Path:
    """Write ``dsokr_<task>.json`` (also after every row, so that an interrupted run keeps what it finished)."""
    report.update({"task": args.task, "args": {k: str(v) for k, v in vars(args).items()},
                   "stages": clock.stages, "wall_s": round(time.perf_counter() - clock.start_wall, 1),
                   "cpu_s": round(time.process_time() - clock.start_cpu, 1), "environment": environment()})
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"dsokr_{args.task}.json"
    path.write_text(json.dumps(report, indent=2, default=float))
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    clock = Clock()
    runner = {"massbank": run_massbank, "chebi": run_chebi, "qm9": run_qm9}[args.task]
    report = runner(args, clock)
    path = write_report(report, args, clock)
    print(table(report))
    print(f"wrote {path} ({report['wall_s']} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
