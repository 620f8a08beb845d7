"""Time the OKR engine on MassBank: SISOKR on all positive training spectra, exact IOKR on a subset.

Usage: python benchmarks/engine.py [--out DIR] [--data DIR] [--m-x 2000] [--m-y 800] [--lam 1e-4]
                                   [--iokr-n 12000] [--skip-iokr] [--limit N] [--val N] [--grid]

Stages (wall seconds each, and peak RSS of the process after each):
- parse: ``read_mgf`` of train_pos.mgf, labels via ``Molecule.from_smiles`` (one per distinct SMILES);
- sisokr_fit: ``SISOKR(ppk, gaussian-tanimoto:gamma=auto, subsample:m=m_x, p-sparsified-rademacher:m=m_y)``
  fitted with one ``lam`` (kernel featurisation, fingerprints, sketched kernel rows, linear algebra; the
  engine's own stage clock is reported under ``engine_stages``); with ``--grid`` also the default lam grid
  selected on val_pos (the selection cost);
- iokr_fit: exact IOKR on a seeded subset of ``--iokr-n`` training spectra;
- the mean validation kernel loss of each model on the first ``--val`` val_pos spectra (a sanity number).

Wall seconds depend on what else runs on the machine: ``cpu_seconds`` (this process, all threads) and the
load averages are recorded beside them. For every dense product the engine ran (its shape m x k x n and
seconds), the JSON lists its GFLOP/s next to a plain ``torch.matmul`` of the same shape timed in the same run
(syrk products count m k n flops, half a GEMM; a Cholesky factorisation n^3 / 3, compared with a GEMM
of that flop count, n x n x n/6).
Targets (issue): SISOKR fit <= 60 s on 2 cores, peak RSS <= 6 GB. Writes ``engine.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far, in GB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def load(path: Path, limit: int | None, cache: dict) -> tuple[list, list]:
    from molpredict.chem.molecules import Molecule
    from molpredict.io import read_mgf
    spectra, labels = [], []
    for spectrum in read_mgf(path):
        smiles = spectrum.smiles
        if not smiles:
            continue
        if smiles not in cache:
            cache[smiles] = Molecule.from_smiles(smiles)
        spectra.append(spectrum)
        labels.append(cache[smiles])
        if limit and len(spectra) >= limit:
            break
    return spectra, labels


def gemm_reference(products: list[dict], device: str, repeats: int = 1) -> list[dict]:
    """Each product's GFLOP/s and that of a plain torch GEMM of the same shape."""
    import torch
    rows = []
    for p in products:
        m, k, n = p["shape"]
        flops = {"syrk": 1.0, "cholesky": 1.0 / 3.0}.get(p["kind"], 2.0) * m * k * n
        if p["kind"] == "cholesky":
            n = max(1, n // 6)  # a GEMM of the same flop count: 2 n n (n / 6) = n^3 / 3
        a = torch.randn(m, k, dtype=torch.float64, device=device)
        b = torch.randn(k, n, dtype=torch.float64, device=device)
        best = float("inf")
        for _ in range(repeats):
            if device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            a @ b
            if device != "cpu":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        del a, b
        rows.append({**p, "gflops": flops / 1e9, "gflop_per_s": flops / 1e9 / max(p["seconds"], 1e-9),
                     "torch_gemm_seconds": best, "torch_gemm_gflop_per_s": 2.0 * m * k * n / 1e9 / best})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    parser.add_argument("--data", type=Path, required=True, help="the MassBank split directory (../shared/data/massbank)")
    parser.add_argument("--m-x", type=int, default=2000)
    parser.add_argument("--m-y", type=int, default=800)
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--iokr-n", type=int, default=12000)
    parser.add_argument("--skip-iokr", action="store_true")
    parser.add_argument("--grid", action="store_true", help="also time lam-grid selection on val_pos")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N training spectra")
    parser.add_argument("--val", type=int, default=2000, help="val_pos spectra for the kernel loss (0: none)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    import numpy as np
    import torch
    from molpredict.engine.device import resolve_device
    from molpredict.models.okr import IOKR, SISOKR

    device = str(resolve_device(args.device))
    report: dict = {
        "benchmark": "engine",
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
                    "load_average_start": list(os.getloadavg())},
        "params": vars(args) | {"out": str(args.out), "data": str(args.data)},
        "stages": {},
    }
    stages = report["stages"]

    cache: dict = {}
    cpu = time.process_time()
    start = time.perf_counter()
    spectra, labels = load(args.data / "train_pos.mgf", args.limit, cache)
    stages["parse"] = {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                       "n_spectra": len(spectra),
                       "n_structures": len({m.inchikey for m in labels}), "peak_rss_gb": peak_rss_gb()}
    val = None
    if args.val:
        val = load(args.data / "val_pos.mgf", args.val, cache)
    print(f"parsed {len(spectra)} spectra in {stages['parse']['seconds']:.1f} s", file=sys.stderr)

    base = dict(input_kernel="ppk", output_kernel="gaussian-tanimoto:gamma=auto", device=args.device)
    sisokr = SISOKR(input_sketch=f"subsample:m={args.m_x}", output_sketch=f"p-sparsified-rademacher:m={args.m_y}",
                    lam=args.lam, **base)
    cpu, start = time.process_time(), time.perf_counter()
    sisokr.fit(spectra, labels)
    stages["sisokr_fit"] = {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                            "peak_rss_gb": peak_rss_gb(),
                            "rank": sisokr.rank_, "n_unique": sisokr.n_unique_,
                            "n_output_landmarks": len(sisokr.output_landmarks_), "lam": sisokr.lam_,
                            "engine_stages": sisokr.profile_["stages"]}
    print(f"sisokr fit {stages['sisokr_fit']['seconds']:.1f} s", file=sys.stderr)
    report["sisokr_products"] = gemm_reference(sisokr.profile_["products"], device)
    if val is not None:
        start = time.perf_counter()
        stages["sisokr_fit"]["val_kernel_loss"] = sisokr.kernel_loss(*val)
        stages["sisokr_predict_val"] = {"seconds": time.perf_counter() - start, "n": len(val[0])}

    if args.grid and val is not None:
        grid = SISOKR(input_sketch=f"subsample:m={args.m_x}",
                      output_sketch=f"p-sparsified-rademacher:m={args.m_y}", **base)
        cpu, start = time.process_time(), time.perf_counter()
        grid.fit(spectra, labels, val=val)
        stages["sisokr_fit_grid"] = {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                                     "peak_rss_gb": peak_rss_gb(),
                                     "selection": grid.selection_, "engine_stages": grid.profile_["stages"]}
        del grid

    if not args.skip_iokr:
        del sisokr
        n = min(args.iokr_n, len(spectra))
        subset = np.sort(np.random.default_rng(0).choice(len(spectra), size=n, replace=False))
        iokr = IOKR(lam=args.lam, **base)
        cpu, start = time.process_time(), time.perf_counter()
        iokr.fit([spectra[i] for i in subset], [labels[i] for i in subset])
        stages["iokr_fit"] = {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                              "peak_rss_gb": peak_rss_gb(), "n": n,
                              "rank": iokr.rank_, "n_unique": iokr.n_unique_,
                              "engine_stages": iokr.profile_["stages"]}
        print(f"iokr fit {stages['iokr_fit']['seconds']:.1f} s", file=sys.stderr)
        report["iokr_products"] = gemm_reference(iokr.profile_["products"], device)
        if val is not None:
            start = time.perf_counter()
            stages["iokr_fit"]["val_kernel_loss"] = iokr.kernel_loss(*val)
            stages["iokr_predict_val"] = {"seconds": time.perf_counter() - start, "n": len(val[0])}

    report["targets"] = {"sisokr_fit_s": 60, "peak_rss_gb": 6,
                         "sisokr_fit_ok": stages["sisokr_fit"]["seconds"] <= 60,
                         "sisokr_rss_ok": stages["sisokr_fit"]["peak_rss_gb"] <= 6}
    report["machine"]["load_average_end"] = list(os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "engine.json"
    path.write_text(json.dumps(report, indent=2, default=float))
    print(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()
