"""The seeds' table on our data: sketched kernel machines for Lipschitz losses, exact vs sketched.

For each loss (pinball at 0.1/0.5/0.9 with the non-crossing penalty, kappa-Huber, epsilon-insensitive, square)
and each feature map (the exact kernel machine on a seeded subset of ``train_pos``, then every sketch at several
sizes), one run: pinball loss, crossing, R^2, MAE and coverage of the 0.1-0.9 interval on a seeded subset of
``val_pos`` (all ten standardised property targets of :mod:`molpredict.properties.targets`, averaged), and the
training time (feature map: kernel rows, eigendecomposition, whitening; solver: L-BFGS), CPU and wall seconds,
with ratios against the exact machine of the same run. The intervals here are the raw quantiles (no conformal
widening: that is the property predictor's, not the machine's).

    nice -n 10 python benchmarks/lipschitz.py --data ../shared/data --out docs/benchmarks \
        [--n-train 3000] [--n-eval 1000] [--sizes 100,200,400] [--lam 1e-4]

Writes ``lipschitz.json`` and ``lipschitz.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from molpredict.engine.lipschitz import LossSpec, crossing_rate, fit_linear  # noqa: E402
from molpredict.engine.nystrom import Nystrom  # noqa: E402
from molpredict.io import read_spectra  # noqa: E402
from molpredict.models.lipschitz import DEFAULT_INPUT_KERNEL  # noqa: E402
from molpredict.properties.metrics import r2_score  # noqa: E402
from molpredict.properties.targets import PROPERTY_NAMES, compute_properties  # noqa: E402
from molpredict.specs import nested_spec  # noqa: E402

LEVELS = (0.1, 0.5, 0.9)
LOSSES = {
    "pinball": LossSpec("pinball", LEVELS, crossing_weight=1.0, smoothing=0.01),
    "huber": LossSpec("huber", kappa=1.0),
    "epsilon-insensitive": LossSpec("epsilon-insensitive", epsilon=0.1, smoothing=0.01),
    "square": LossSpec("square"),
}


def _subset(path: Path, n: int, seed: int) -> list:
    spectra = [s for s in read_spectra(path) if s.metadata.get("smiles")]
    rng = np.random.default_rng(seed)
    if n < len(spectra):
        spectra = [spectra[i] for i in np.sort(rng.choice(len(spectra), n, replace=False))]
    return spectra


def _sketches(n: int, sizes: list[int]) -> list[str | None]:
    """The exact machine, then each sketch at each size; p-sparsified with about 4 non-zeros per row."""
    p = min(1.0, 4.0 / n)
    out: list[str | None] = [None]
    for m in sizes:
        out += [f"p-sparsified-rademacher:m={m},p={p:.3g}", f"p-sparsified-gaussian:m={m},p={p:.3g}",
                f"accumulation:m={m},M=4", f"subsample:m={m}", f"gaussian:m={m}"]
    return out


def _metrics(Y: np.ndarray, F: np.ndarray, spec: LossSpec) -> dict:
    """Averages over the properties; Y (n, T) and F (n, T, Q) standardised."""
    middle = F[:, :, F.shape[2] // 2]
    levels = spec.levels if spec.name == "pinball" else (0.5,)
    R = Y[:, :, None] - F
    tau = np.asarray(levels)[None, None, :]
    out = {"pinball": float(np.mean(np.maximum(tau * R, (tau - 1) * R))),
           "r2": float(np.mean([r2_score(Y[:, t], middle[:, t]) for t in range(Y.shape[1])])),
           "r2_logp": r2_score(Y[:, 0], middle[:, 0]),
           "mae": float(np.mean(np.abs(Y - middle)))}
    if spec.name == "pinball":
        out["crossing"] = crossing_rate(torch.as_tensor(F))
        out["coverage"] = float(np.mean((Y >= F[:, :, 0]) & (Y <= F[:, :, -1])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the shared data directory")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--n-eval", type=int, default=1000)
    parser.add_argument("--sizes", default="100,200,400")
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--kernel", default=DEFAULT_INPUT_KERNEL)
    parser.add_argument("--max-iter", type=int, default=200)
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [int(v) for v in args.sizes.split(",")]
    train = _subset(args.data / "massbank" / "train_pos.mgf", args.n_train, args.seed)
    evals = _subset(args.data / "massbank" / "val_pos.mgf", args.n_eval, args.seed + 1)
    Y = compute_properties([s.metadata["smiles"] for s in train])
    Ye = compute_properties([s.metadata["smiles"] for s in evals])
    mean, scale = Y.mean(0), Y.std(0)
    Ys, Yes = (Y - mean) / scale, (Ye - mean) / scale
    rows = []
    for sketch in _sketches(len(train), sizes):
        wall, cpu = time.perf_counter(), time.process_time()
        features = Nystrom(nested_spec(args.kernel), sketch, seed=args.seed).fit(train)
        Z = features.train_features_.T.contiguous()
        feature_wall, feature_cpu = time.perf_counter() - wall, time.process_time() - cpu
        Ze = torch.as_tensor(features.transform(evals))
        for loss in args.losses.split(","):
            spec = LOSSES[loss]
            wall, cpu = time.perf_counter(), time.process_time()
            W, b, info = fit_linear(Z, torch.as_tensor(Ys), spec, args.lam, max_iter=args.max_iter)
            solver_wall, solver_cpu = time.perf_counter() - wall, time.process_time() - cpu
            F = (Ze @ W + b).reshape(len(evals), Y.shape[1], spec.n_outputs).numpy()
            row = {"loss": loss, "sketch": sketch or "none (exact)", "rank": int(features.rank_),
                   "landmarks": len(features.landmarks_), **_metrics(Yes, F, spec),
                   "features_wall_s": feature_wall, "features_cpu_s": feature_cpu,
                   "solver_wall_s": solver_wall, "solver_cpu_s": solver_cpu,
                   "train_wall_s": feature_wall + solver_wall, "train_cpu_s": feature_cpu + solver_cpu,
                   "evaluations": info["n_evaluations"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del Z, features
    for row in rows:
        exact = next(r for r in rows if r["loss"] == row["loss"] and r["sketch"] == "none (exact)")
        row["pinball_ratio"] = row["pinball"] / exact["pinball"]
        row["speedup_cpu"] = exact["train_cpu_s"] / row["train_cpu_s"]
        row["speedup_solver_cpu"] = exact["solver_cpu_s"] / row["solver_cpu_s"]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"n_train": len(train), "n_eval": len(evals), "lam": args.lam, "kernel": args.kernel,
            "levels": LEVELS, "targets": list(PROPERTY_NAMES), "max_iter": args.max_iter,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared), torch "
                       f"{torch.__version__} on 1 thread",
            "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    (args.out / "lipschitz.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Sketched Lipschitz-loss machines: exact vs sketched ({len(train)} train_pos spectra, "
             f"{len(evals)} val_pos spectra, 10 standardised properties, lam {args.lam:g})", "",
             "| loss | sketch | landmarks | pinball | ratio | crossing | coverage | R2 (mean) | R2 logP | "
             "train CPU s (features + solver) | speed-up (CPU) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['loss']} | {r['sketch']} | {r['landmarks']} | {r['pinball']:.4f} | "
                     f"{r['pinball_ratio']:.3f} | {r.get('crossing', float('nan')):.4f} | "
                     f"{r.get('coverage', float('nan')):.3f} | {r['r2']:.3f} | {r['r2_logp']:.3f} | "
                     f"{r['train_cpu_s']:.1f} ({r['features_cpu_s']:.1f} + {r['solver_cpu_s']:.1f}) | "
                     f"{r['speedup_cpu']:.1f}x |")
    lines += ["", f"Machine: {meta['machine']}; 1-minute load {meta['load']}. Pinball: mean over levels and "
              "properties (for the point losses at level 0.5, i.e. half the MAE); ratio: against the exact machine "
              "of the same loss; coverage: raw 0.1-0.9 quantiles, before conformal widening."]
    (args.out / "lipschitz.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
