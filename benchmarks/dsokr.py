"""Accuracy and time of DSOKR on three tasks, each beside a kernel baseline; writes ``dsokr_<task>.json``.

Usage: python benchmarks/dsokr.py {massbank,chebi,qm9} [--out DIR] [--data DIR] [options, see --help]

- ``massbank``: MS/MS -> structure. DSOKR (``mlp`` on binned spectra, Gaussian-Tanimoto output kernel) trained on
  train_pos (early stopping on a seeded subset of val_pos), evaluated on test_pos against
  ``candidates/test_formula256.json`` (each spectrum one query; hit = InChIKey first block; ties against the
  truth); beside SISOKR (ppk, subsample m_x, p-sparsified m_y) unless ``--skip-sisokr``.
- ``chebi``: text -> molecule (ChEBI-20). Trained on ``chebi20/val.tsv`` (the official training split is not
  available offline; 10% of its structures held out for early stopping), evaluated on ``test.tsv`` against
  all of ``molecules.tsv`` (MRR, Hits@1/10). DSOKR with the ``text-embedding`` encoder (frozen MiniLM + MLP head)
  beside IOKR on the cosine of the same embeddings (``--skip-iokr`` to leave it out).
- ``qm9``: SMILES -> molecular graph. A seeded QM9 subset; DSOKR (``transformer`` on SMILES characters, WL
  subtree output kernel) beside SISOKR (SMILES n-gram input kernel); decoded among all subset structures;
  hit@1 and the mean graph edit distance between the decoded and the true graph (networkx, element labels, no
  edge labels, per-pair time limit: an upper bound when the limit is hit).

Wall seconds depend on what else runs on the machine: ``cpu_seconds`` and load averages are recorded too.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


class Clock:
    """Wall and CPU seconds per named stage."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, float]] = {}

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


def metrics_of(model: Any, inputs: list, truths: list, candidates: Any, hit: str = "inchikey14"
               ) -> dict[str, float]:
    from molpredict.models.dsokr import candidate_sets, coordinate_metrics
    sets = candidate_sets(truths, candidates, hit=hit)
    return coordinate_metrics(model.predict_coordinates(inputs), model.candidate_coordinates(sets.pool), sets,
                              ks=(1, 5, 10, 20), scorer=model.score_coordinates)


def split_by_structure(molecules: list, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted({m.inchikey14 for m in molecules})
    rng = np.random.default_rng(seed)
    held = set(rng.choice(keys, size=max(1, int(round(fraction * len(keys)))), replace=False).tolist())
    mask = np.array([m.inchikey14 in held for m in molecules])
    return np.flatnonzero(~mask), np.flatnonzero(mask)


# -- massbank --------------------------------------------------------------------------------------------
def labelled_spectra(path: Path, limit: int | None, cache: dict) -> tuple[list, list]:
    from molpredict.io import read_spectra
    from molpredict.molecules import Molecule
    spectra, labels = [], []
    for spectrum in itertools.islice(read_spectra(path), limit):
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


def run_massbank(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    from molpredict.candidates import candidate_set_molecules, load_candidate_sets
    from molpredict.models.dsokr import DSOKR
    cache: dict = {}
    with clock("read"):
        train, y = labelled_spectra(args.data / "massbank" / "train_pos.mgf", args.limit, cache)
        val, yv = labelled_spectra(args.data / "massbank" / "val_pos.mgf", None, cache)
        test, yt = labelled_spectra(args.data / "massbank" / "test_pos.mgf", args.test_limit, cache)
        sets = load_candidate_sets(args.data / "candidates" / "test_formula256.json")
    rng = np.random.default_rng(args.seed)
    keep = np.sort(rng.choice(len(val), size=min(args.val, len(val)), replace=False))
    val, yv = [val[i] for i in keep], [yv[i] for i in keep]
    queries = [i for i, m in enumerate(yt) if m.inchikey14 in sets]
    test, yt = [test[i] for i in queries], [yt[i] for i in queries]
    candidates = [candidate_set_molecules(sets[m.inchikey14]) for m in yt]
    report: dict[str, Any] = {"n_train": len(train), "n_train_structures": len({m.inchikey14 for m in y}),
                              "n_val": len(val), "n_test": len(test),
                              "n_test_structures": len({m.inchikey14 for m in yt}),
                              "candidates": "test_formula256.json", "models": {}}
    spec = dict(encoder=args.encoder, output_kernel="gaussian-tanimoto:gamma=auto",
                output_sketch=f"subsample:m={args.m_y}", epochs=args.epochs, lr=args.lr,
                batch_size=args.batch_size, patience=args.patience, n_members=args.members,
                device=args.device, seed=args.seed)
    with clock("dsokr_fit"):
        model = DSOKR(**spec).fit(train, y, val=(val, yv))
    with clock("dsokr_eval"):
        result = metrics_of(model, test, yt, candidates)
    report["models"]["dsokr"] = {"params": spec, "test": result, "kernel_loss_val": model.kernel_loss(val, yv),
                                 "history": model.history_, "fit": clock.stages["dsokr_fit"],
                                 "eval": clock.stages["dsokr_eval"]}
    print(json.dumps({"dsokr": result}), file=sys.stderr)
    if not args.skip_sisokr:
        from molpredict.models.okr import SISOKR
        sspec = dict(input_kernel="ppk", output_kernel="gaussian-tanimoto:gamma=auto",
                     input_sketch=f"subsample:m={args.m_x}", output_sketch=f"p-sparsified-rademacher:m={args.m_y}",
                     lam=args.lam, device=args.device, seed=args.seed)
        with clock("sisokr_fit"):
            reference = SISOKR(**sspec).fit(train, y, val=(val, yv))
        with clock("sisokr_eval"):
            result = metrics_of(reference, test, yt, candidates)
        report["models"]["sisokr"] = {"params": sspec, "test": result, "lam": getattr(reference, "lam_", None),
                                      "kernel_loss_val": reference.kernel_loss(val, yv),
                                      "fit": clock.stages["sisokr_fit"], "eval": clock.stages["sisokr_eval"]}
        print(json.dumps({"sisokr": result}), file=sys.stderr)
    return report


# -- chebi -----------------------------------------------------------------------------------------------
def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        return [dict(zip(header, line.rstrip("\n").split("\t"))) for line in handle if line.strip()]


def molecules_of(rows: list[dict[str, str]], cache: dict) -> list:
    from molpredict.molecules import Molecule
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


def run_chebi(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    from molpredict.models.basis import distinct_objects
    from molpredict.models.dsokr import DSOKR
    cache: dict = {}
    with clock("read"):
        train_rows = read_tsv(args.data / "chebi20" / "val.tsv")
        test_rows = read_tsv(args.data / "chebi20" / "test.tsv")[: args.test_limit]
        pool_rows = read_tsv(args.data / "chebi20" / "molecules.tsv")
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
                              "models": {}}
    spec = dict(encoder=args.encoder or "text-embedding:hidden=1024,layers=1,dropout=0.2",
                output_kernel="gaussian-tanimoto:gamma=auto,chiral=true", output_sketch=f"subsample:m={args.m_y}",
                epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, patience=args.patience,
                n_members=args.members, device=args.device, seed=args.seed)
    with clock("dsokr_fit"):
        model = DSOKR(**spec).fit(x, y, val=(xv, yv))
    with clock("dsokr_eval"):
        result = metrics_of(model, xt, yt, pool, hit="smiles")
    report["models"]["dsokr"] = {"params": spec, "test": result, "history": model.history_,
                                 "fit": clock.stages["dsokr_fit"], "eval": clock.stages["dsokr_eval"]}
    print(json.dumps({"dsokr": result}), file=sys.stderr)
    if not args.skip_iokr:
        from molpredict.models.okr import IOKR
        ispec = dict(input_kernel="text-embedding", output_kernel="gaussian-tanimoto:gamma=auto,chiral=true",
                     lam=args.lam_grid, device=args.device, seed=args.seed)
        with clock("iokr_fit"):
            reference = IOKR(**ispec).fit(x, y, val=(xv, yv))
        with clock("iokr_eval"):
            result = metrics_of(reference, xt, yt, pool, hit="smiles")
        report["models"]["iokr"] = {"params": ispec, "test": result, "lam": getattr(reference, "lam_", None),
                                    "fit": clock.stages["iokr_fit"], "eval": clock.stages["iokr_eval"]}
        print(json.dumps({"iokr": result}), file=sys.stderr)
    return report


# -- qm9 -------------------------------------------------------------------------------------------------
def graph_edit_distance(a: Any, b: Any, timeout: float) -> float:
    """GED between two molecules' heavy-atom graphs (element labels, unlabelled bonds), best found in time."""
    import networkx as nx

    def to_nx(molecule):
        edges, labels, _ = molecule.graph(bond_labels=False)
        graph = nx.Graph()
        for node, label in labels.items():
            graph.add_node(node, label=label)
        for i, neighbours in edges.items():
            for j in neighbours:
                graph.add_edge(i, j)
        return graph

    if a.inchikey14 == b.inchikey14 and a.smiles == b.smiles:
        return 0.0
    return float(nx.graph_edit_distance(to_nx(a), to_nx(b), node_match=lambda u, v: u["label"] == v["label"],
                                        timeout=timeout))


def run_qm9(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    from molpredict.errors import InputError
    from molpredict.models.dsokr import DSOKR, candidate_sets
    from molpredict.molecules import Molecule
    with clock("read"):
        smiles = [line.split()[0] for line in open(args.data / "qm9" / "qm9.smi", encoding="utf-8") if line.strip()]
        rng = np.random.default_rng(args.seed)
        molecules = []
        for i in rng.permutation(len(smiles)):  # a few QM9 SMILES do not parse in RDKit: skip them
            try:
                molecules.append(Molecule.from_smiles(smiles[i]))
            except InputError:
                continue
            if len(molecules) == args.n_train + args.n_test:
                break
        strings = [m.smiles for m in molecules]   # canonical SMILES as inputs
    x, y = strings[: args.n_train], molecules[: args.n_train]
    xt, yt = strings[args.n_train:], molecules[args.n_train:]
    n_val = max(1, args.n_train // 10)
    xv, yv, x, y = x[:n_val], y[:n_val], x[n_val:], y[n_val:]
    pool = molecules
    report: dict[str, Any] = {"n_train": len(x), "n_val": len(xv), "n_test": len(xt), "n_candidates": len(pool),
                              "ged_timeout_s": args.ged_timeout, "models": {}}
    sets = candidate_sets(yt, pool)

    def evaluate(model: Any, name: str) -> dict[str, Any]:
        result = metrics_of(model, xt, yt, pool)
        scores = model.score_coordinates(model.predict_coordinates(xt), model.candidate_coordinates(sets.pool))
        decoded = [sets.pool[j] for j in np.argmax(scores, axis=1)]
        n_ged = min(len(xt), args.n_ged)
        with clock(f"{name}_ged"):
            distances = [graph_edit_distance(decoded[i], yt[i], args.ged_timeout) for i in range(n_ged)]
        result["ged_mean"] = float(np.mean(distances))
        result["n_ged"] = n_ged
        return result

    spec = dict(encoder=args.encoder or "transformer", output_kernel="wl-subtree:n_iter=3",
                output_sketch=f"subsample:m={args.m_y}", epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                patience=args.patience, n_members=args.members, device=args.device, seed=args.seed)
    with clock("dsokr_fit"):
        model = DSOKR(**spec).fit(x, y, val=(xv, yv))
    report["models"]["dsokr"] = {"params": spec, "test": evaluate(model, "dsokr"), "history": model.history_,
                                 "fit": clock.stages["dsokr_fit"]}
    print(json.dumps({"dsokr": report["models"]["dsokr"]["test"]}), file=sys.stderr)
    if not args.skip_sisokr:
        from molpredict.models.okr import SISOKR
        sspec = dict(input_kernel="smiles-ngram", output_kernel="wl-subtree:n_iter=3",
                     input_sketch=f"subsample:m={args.m_x}", output_sketch=f"subsample:m={args.m_y}",
                     lam=args.lam_grid, device=args.device, seed=args.seed)
        with clock("sisokr_fit"):
            reference = SISOKR(**sspec).fit(x, y, val=(xv, yv))
        report["models"]["sisokr"] = {"params": sspec, "test": evaluate(reference, "sisokr"),
                                      "lam": getattr(reference, "lam_", None), "fit": clock.stages["sisokr_fit"]}
        print(json.dumps({"sisokr": report["models"]["sisokr"]["test"]}), file=sys.stderr)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=["massbank", "chebi", "qm9"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--encoder", default=None, help="encoder spec (default per task)")
    parser.add_argument("--m-y", type=int, default=1000)
    parser.add_argument("--m-x", type=int, default=2000)
    parser.add_argument("--lam", type=float, default=1e-4, help="SISOKR ridge (massbank)")
    parser.add_argument("--lam-grid", default="1e-6|1e-5|1e-4|1e-3|1e-2", help="IOKR/SISOKR ridge grid (chebi, qm9)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--patience", type=int, default=5)
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="massbank: first N training records")
    parser.add_argument("--test-limit", type=int, default=None, help="first N test records")
    parser.add_argument("--val", type=int, default=2000, help="massbank: val_pos spectra for early stopping")
    parser.add_argument("--skip-sisokr", action="store_true")
    parser.add_argument("--skip-iokr", action="store_true")
    parser.add_argument("--n-train", type=int, default=10000, help="qm9: training structures (10%% for validation)")
    parser.add_argument("--n-test", type=int, default=500, help="qm9: test structures")
    parser.add_argument("--n-ged", type=int, default=200, help="qm9: test queries whose GED is computed")
    parser.add_argument("--ged-timeout", type=float, default=2.0)
    args = parser.parse_args()
    if args.encoder is None and args.task == "massbank":
        args.encoder = "mlp"
    clock = Clock()
    wall, cpu = time.perf_counter(), time.process_time()
    runner = {"massbank": run_massbank, "chebi": run_chebi, "qm9": run_qm9}[args.task]
    report = runner(args, clock)
    report.update({"task": args.task, "args": {k: str(v) for k, v in vars(args).items()},
                   "stages": clock.stages, "wall_s": round(time.perf_counter() - wall, 1),
                   "cpu_s": round(time.process_time() - cpu, 1), "environment": environment()})
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"dsokr_{args.task}.json"
    path.write_text(json.dumps(report, indent=2, default=float))
    print(json.dumps({k: v["test"] for k, v in report["models"].items()}, indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
