"""DSOKR with the peak-formula set encoder (``formula-transformer``) on MassBank validation data, alone, beside
SISOKR, and added to it; writes ``formula_transformer.json``.

Usage: python benchmarks/formula_transformer.py --data ../shared/data [--bundle MODEL_DIR] [--out DIR] [--quick]
       [--encoder SPEC] [--device cpu|cuda|auto] [--epochs N] [--patience N] [--rank-epochs N]
       [--output-kernel SPEC] [--output-sketch SPEC]

``--encoder kernel-formula`` measures the transformer beside the kernel features
(``docs/benchmarks/kernel_formula.md``); ``--epochs 0`` with it scores its warm start, the ridge fit alone.

Protocol (validation only; test figures are taken elsewhere, once): DSOKR trains on train_pos (cleaned by the
default pipeline, as ``molpredict train`` cleans); the val_pos structures that have a ``val_formula256.json``
set are split by structure (seeded): a third *stop* part (``--n-stop`` spectra of it) for DSOKR's early stopping
(MRR in their formula256 sets) and for choosing the weight of the added term, and the other two thirds *eval*,
where every figure is reported: hit@1/5/10, MRR, in the formula256 sets and in the real same-formula sets
(``val_formula.json``). Ties count against the truth.

Rows: ``dsokr-formula-transformer`` (the encoder given by ``--encoder``, ``--members`` seeds); ``sisokr`` (the
positive sub-model of ``--bundle``, e.g. the default bundle ``make demo`` trains, whose lam was selected on all of
val_pos; without ``--bundle``, SISOKR is trained here with ``molpredict train``'s defaults on train_pos, selecting
lam on the stop part); and ``sisokr+formula-transformer``: within each candidate set both models' scores are
standardised (z-scores) and summed, ``z_sisokr + w z_dsokr``, with ``w`` chosen on the stop part's formula256 MRR.
Fit wall and CPU seconds and the load average are recorded (the machine may be shared).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dsokr import Clock, environment, labelled_spectra  # noqa: E402

#: the DSOKR encoder measured by default (the registry's defaults)
ENCODER = "formula-transformer"
WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def set_scores(model: Any, inputs: list, truths: list, sets_json: dict) -> tuple[list, list]:
    """Per-query score vectors and truth masks of ``model`` in each query's candidate set."""
    from molpredict.chem.candidates import candidate_set_molecules
    from molpredict.models.dsokr import candidate_sets
    sets = candidate_sets(truths, [candidate_set_molecules(sets_json[m.inchikey14]) for m in truths])
    pred, coords = model.predict_coordinates(inputs), model.candidate_coordinates(sets.pool)
    scores = [model.score_coordinates(pred[k:k + 1], coords[sets.index[k]])[0] for k in range(len(inputs))]
    return scores, sets.is_true


def metrics(scores: list, truths: list) -> dict[str, float]:
    """hit@1/5/10 (%) and MRR, ties against the truth; a set without the truth is a miss."""
    ranks = []
    for row, true in zip(scores, truths):
        ranks.append(np.inf if not true.any() else 1 + int((row[~true] >= row[true].max()).sum()))
    ranks = np.asarray(ranks, dtype=float)
    out = {f"hit@{k}": round(100 * float(np.mean(ranks <= k)), 2) for k in (1, 5, 10)}
    out["mrr"] = round(float(np.mean(1.0 / ranks)), 4)
    out["n"] = len(ranks)
    return out


def standardised(scores: list) -> list:
    return [(s - s.mean()) / (s.std() + 1e-12) for s in scores]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data folder (massbank/, candidates/)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    parser.add_argument("--bundle", type=Path, default=None, help="a model bundle whose positive SISOKR to compare")
    parser.add_argument("--encoder", default=ENCODER)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--n-stop", type=int, default=400)
    parser.add_argument("--limit", type=int, default=None, help="train on the first N train_pos spectra")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="DSOKR's device: cpu, cuda or auto")
    parser.add_argument("--rank-epochs", type=int, default=0, help="DSOKR's ranking fine-tune epochs")
    parser.add_argument("--patience", type=int, default=None)
    parser.add_argument("--output-kernel", default=None, help="DSOKR's output kernel (default: DSOKR's)")
    parser.add_argument("--output-sketch", default=None, help="DSOKR's output sketch (default: DSOKR's)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 1,500 training spectra, 2 epochs")
    args = parser.parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    from molpredict.chem.candidates import load_candidate_sets
    if args.quick:
        args.limit = args.limit or 1500
        args.epochs = args.epochs or 2
        args.n_stop = min(args.n_stop, 100)
    clock, cache = Clock(), {}
    with clock("read"):
        train, y = labelled_spectra(args.data / "massbank" / "train_pos.mgf", args.limit, cache)
        val, yv = labelled_spectra(args.data / "massbank" / "val_pos.mgf", None, cache)
        f256 = load_candidate_sets(args.data / "candidates" / "val_formula256.json")
        fsets = load_candidate_sets(args.data / "candidates" / "val_formula.json")
    keys = sorted({m.inchikey14 for m in yv if m.inchikey14 in f256})
    stop_keys = set(np.random.default_rng(args.seed + 1).choice(keys, len(keys) // 3, replace=False).tolist())
    stop = [i for i, m in enumerate(yv) if m.inchikey14 in stop_keys]
    stop = sorted(np.random.default_rng(args.seed + 2).choice(stop, min(args.n_stop, len(stop)), replace=False))
    evl = [i for i, m in enumerate(yv) if m.inchikey14 in f256 and m.inchikey14 not in stop_keys]
    if args.quick:
        evl = evl[::10]
    parts = {"stop": ([val[i] for i in stop], [yv[i] for i in stop]),
             "eval": ([val[i] for i in evl], [yv[i] for i in evl])}
    report: dict[str, Any] = {"protocol": __doc__.split("\n\n")[1].replace("\n", " "), "n_train": len(train),
                              "n_train_structures": len({m.inchikey14 for m in y}), "n_stop": len(stop),
                              "n_eval": len(evl), "environment": environment(), "models": {}}

    params: dict[str, Any] = dict(encoder=args.encoder, n_members=args.members, seed=args.seed, device=args.device,
                                  rank_epochs=args.rank_epochs)
    if args.patience is not None:
        params["patience"] = args.patience
    if args.output_kernel is not None:
        params["output_kernel"] = args.output_kernel
    if args.output_sketch is not None:
        params["output_sketch"] = args.output_sketch
    if args.epochs is not None:
        params["epochs"] = args.epochs
    if args.lr is not None:
        params["lr"] = args.lr
    from molpredict.kernels.workers import rows_on_workers
    with rows_on_workers():  # large kernel-row requests on every core, as ``molpredict train`` computes them
        return _fit_and_score(args, params, parts, f256, fsets, train, y, clock, report)


def _fit_and_score(args: Any, params: dict, parts: dict, f256: dict, fsets: dict, train: list, y: list, clock: Any,
                   report: dict) -> int:
    from molpredict.chem.candidates import candidate_set_molecules
    from molpredict.models.dsokr import DSOKR
    sx, sy = parts["stop"]
    with clock("dsokr/fit"):
        dsokr = DSOKR(**params).fit(train, y, val=(sx, sy, [candidate_set_molecules(f256[m.inchikey14]) for m in sy]))
    print(json.dumps({"dsokr_history": dsokr.history_}, default=str), file=sys.stderr, flush=True)
    if args.bundle:
        from molpredict.modelfile import ModelBundle
        sisokr = ModelBundle.load(args.bundle).models["positive"].model
        clock.stages["sisokr/fit"] = {"wall_s": None, "cpu_s": None, "bundle": str(args.bundle)}
    else:
        from molpredict.registry import get_registry
        from molpredict.training.pipeline import DEFAULT_MODEL, model_defaults
        with clock("sisokr/fit"):
            sisokr = get_registry().get("model", DEFAULT_MODEL)(**model_defaults(DEFAULT_MODEL)).fit(train, y,
                                                                                                  val=(sx, sy))
    scores: dict[str, dict[str, tuple]] = {}
    with clock("score"):
        for part, (x, t) in parts.items():
            for kind, sets_json in (("formula256", f256), ("formula", fsets)):
                keep = [i for i, m in enumerate(t) if m.inchikey14 in sets_json]
                xs, ts = [x[i] for i in keep], [t[i] for i in keep]
                scores[f"{part}/{kind}"] = {"dsokr": set_scores(dsokr, xs, ts, sets_json),
                                            "sisokr": set_scores(sisokr, xs, ts, sets_json)}
    # the added term's weight, chosen on the stop part's formula256 MRR
    z = {key: {name: standardised(s[0]) for name, s in value.items()} for key, value in scores.items()}
    truth = {key: value["dsokr"][1] for key, value in scores.items()}

    def combined(key: str, w: float) -> list:
        return [a + w * b for a, b in zip(z[key]["sisokr"], z[key]["dsokr"])]
    chosen = {w: metrics(combined("stop/formula256", w), truth["stop/formula256"])["mrr"] for w in WEIGHTS}
    w_best = max(chosen, key=chosen.get)
    report["added_term"] = {"weights_stop_mrr": chosen, "weight": w_best}
    for kind in ("formula256", "formula"):
        key = f"eval/{kind}"
        for name in ("dsokr", "sisokr"):
            report["models"].setdefault(name, {})[kind] = metrics(scores[key][name][0], truth[key])
        report["models"].setdefault("sisokr+formula-transformer", {})[kind] = metrics(combined(key, w_best),
                                                                                     truth[key])
        report["models"].setdefault("weights_eval", {})[kind] = {
            str(w): metrics(combined(key, w), truth[key])["hit@1"] for w in WEIGHTS}
    report["models"]["dsokr"].update(params=params, history=dsokr.history_)
    report["stages"] = clock.stages
    report["load_avg_end"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("formula_transformer_quick.json" if args.quick else "formula_transformer.json")
    path.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report["models"].items()}, default=str)[:2000])
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
