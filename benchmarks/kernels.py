"""Time the kernels on real data: PPK blocks on MassBank spectra, Gaussian-Tanimoto blocks on molecules.

Usage: python benchmarks/kernels.py [--out DIR] [--data DIR] [--rows 2000] [--mol-rows 800] [--pool 100000]
                                    [--skip-raw] [--skip-pool] [--limit N]

Sections (wall and CPU seconds each; peak RSS of the process after each; the load average of the machine,
which is shared, at the start and end):
- ``spectra``: read train_pos.mgf (``read_mgf``), clean with the default ``CleaningPipeline``;
- ``ppk`` / ``ppk-losses`` / ``cosine`` on the cleaned spectra (and ``ppk`` on the raw ones unless --skip-raw):
  fit on all training spectra (featurisation + self-similarities), then one Gram block of ``--rows`` seeded
  rows x all training spectra; the number of peak pairs evaluated; as a sanity number, the rate at which the
  most similar other training spectrum of a block row has the same structure (InChIKey first block);
- ``gaussian-tanimoto`` (Morgan r=2, 4096 bits, gamma=auto): fingerprints of the distinct training structures,
  the block ``--mol-rows`` x all of them; fingerprints of the first ``--pool`` rows of candidates/pool.tsv.gz and
  the block pool x ``--mol-rows`` (the model's R_y K_y(train, candidates) shape, in the kernel's row blocks).
  Each block is timed three ways: intersections by the dense float32 GEMM, by the sparse product, and as the
  kernel chooses (auto); the GEMM path's GFLOP/s (2 m n d) is reported next to a plain float32 numpy GEMM and
  torch.matmul of the same shape timed in the same run, in the same row blocks. The machine is shared: compare
  ``cpu_s`` (this process) as well as ``wall_s``.

Targets (issue): PPK block 2,000 x 47,880 <= 15 s on 2 cores. Writes ``kernels.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import itertools
import json
import os
import platform
import resource
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far, in GB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class Clock:
    """Wall and CPU (this process, all threads) seconds of a ``with`` block."""

    def __enter__(self) -> "Clock":
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0

    def row(self, **extra) -> dict:
        return {"wall_s": round(self.wall, 3), "cpu_s": round(self.cpu, 3), "peak_rss_gb": round(peak_rss_gb(), 3),
                **extra}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def count_pairs(kernel, query, reference) -> int:
    """Peak pairs within the pruning window of a PPK (what the kernel evaluates)."""
    import numpy as np
    q = query.peaks if hasattr(query, "peaks") else query
    r = reference.peaks if hasattr(reference, "peaks") else reference
    half = kernel.truncate * kernel._sigma()
    r_mz = r.sorted_view()[0]
    return int((np.searchsorted(r_mz, q.mz + half, "right") - np.searchsorted(r_mz, q.mz - half, "left")).sum())


def same_structure_rate(block, rows, keys) -> float:
    import numpy as np
    block = block.copy()
    block[np.arange(len(rows)), rows] = -np.inf
    return float(np.mean(keys[block.argmax(axis=1)] == keys[rows]))


def bench_spectrum_kernel(name: str, kernel, spectra, rows, keys) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # spectra emptied by cleaning (precursor only) are expected
        with Clock() as fit:
            kernel.fit(spectra)
        with Clock() as block:
            values = kernel.gram(rows)
    out = {"fit": fit.row(n_fit=kernel.n_fit_), "block": block.row(shape=list(values.shape)),
           "same_structure_top1": same_structure_rate(values, rows, keys),
           "mean_offdiag": float(values.mean())}
    if name.startswith("ppk"):
        out["params"] = {"mz_sigma": kernel._sigma(), "truncate": kernel.truncate}
        query = kernel.take(kernel.fit_features_, rows)
        out["peak_pairs"] = count_pairs(kernel, query, kernel.fit_features_)
        if name == "ppk-losses":
            out["loss_pairs"] = count_pairs(kernel, query.losses, kernel.fit_features_.losses)
        out["ns_per_pair"] = block.wall / max(out["peak_pairs"] + out.get("loss_pairs", 0), 1) * 1e9
    log(f"{name}: fit {fit.wall:.1f} s, block {values.shape} {block.wall:.1f} s wall / {block.cpu:.1f} s cpu")
    del values
    return out


def gemm_reference(m: int, n: int, d: int, block_rows: int, repeats: int = 2) -> dict:
    """Seconds of plain float32 GEMMs (m x d) @ (d x n), in numpy and in torch, done in the kernel's row blocks
    (so that both sides pay the same blocking), best of ``repeats``."""
    import numpy as np
    import torch
    rng = np.random.default_rng(0)
    rows = min(m, block_rows)
    a = (rng.integers(0, 100, (rows, d), dtype=np.uint8) == 0).astype(np.float32)
    b = (rng.integers(0, 100, (n, d), dtype=np.uint8) == 0).astype(np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    blocks = [min(block_rows, m - start) for start in range(0, m, block_rows)]
    flops = 2.0 * m * n * d
    out = {}
    for label, fn in (("numpy", lambda r: a[:r] @ b.T), ("torch", lambda r: ta[:r] @ tb.T)):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for r in blocks:
                fn(r)
            best = min(best, time.perf_counter() - start)
        out[label] = {"seconds": best, "gflop_per_s": flops / 1e9 / best}
    return out


def read_pool_smiles(path: Path, n: int) -> list[str]:
    """SMILES of the first ``n`` rows of the pool TSV (gzip + csv: no full load of the 1.9M rows)."""
    with gzip.open(path, "rt", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        return [row["smiles"] for row in itertools.islice(reader, n)]


def bench_block(kernel, rows_features, label: str) -> dict:
    """transform_features timed with the intersections forced through the GEMM, through the sparse product,
    and as chosen (auto); the GEMM path's rate next to plain float32 GEMMs of the same shape."""
    import numpy as np

    import molpredict.kernels.fingerprints as fingerprints
    saved = fingerprints.SPARSE_SPEED_RATIO
    paths, values = {}, {}
    try:
        for path, ratio in (("gemm", 1e12), ("sparse", 0.0), ("auto", saved)):
            fingerprints.SPARSE_SPEED_RATIO = ratio
            with Clock() as clock:
                values[path] = kernel.transform_features(rows_features)
            paths[path] = clock.row()
    finally:
        fingerprints.SPARSE_SPEED_RATIO = saved
    assert np.array_equal(values["gemm"], values["sparse"]), "GEMM and sparse paths disagree"
    m, n = values["gemm"].shape
    d = kernel.fit_features_.matrix.shape[1]
    flops = 2.0 * m * n * d
    ref = gemm_reference(m, n, d, kernel.block_rows)
    gemm_wall = paths["gemm"]["wall_s"]
    row = {"shape": [m, n], "fingerprint_bits": d, "paths": paths, "gemm_gflop": flops / 1e9,
           "gemm_path_gflop_per_s": flops / 1e9 / gemm_wall, "reference_gemm": ref,
           "gemm_path_vs_numpy_gemm": ref["numpy"]["seconds"] / gemm_wall,
           "gemm_path_vs_torch_gemm": ref["torch"]["seconds"] / gemm_wall,
           "sparse_speedup_over_gemm_path": gemm_wall / paths["sparse"]["wall_s"],
           "bit_density": float(np.count_nonzero(rows_features.matrix) / rows_features.matrix.size)}
    log(f"{label}: gemm path {gemm_wall:.2f} s ({row['gemm_path_gflop_per_s']:.1f} GFLOP/s; numpy GEMM "
        f"{ref['numpy']['gflop_per_s']:.1f}, torch {ref['torch']['gflop_per_s']:.1f}), sparse path "
        f"{paths['sparse']['wall_s']:.2f} s, auto {paths['auto']['wall_s']:.2f} s")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    parser.add_argument("--data", type=Path, required=True, help="the shared data directory (../shared/data)")
    parser.add_argument("--rows", type=int, default=2000, help="rows of the spectrum Gram blocks")
    parser.add_argument("--mol-rows", type=int, default=800, help="rows of the molecule blocks")
    parser.add_argument("--pool", type=int, default=100_000, help="pool molecules (0: skip)")
    parser.add_argument("--skip-raw", action="store_true", help="no PPK run on uncleaned spectra")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N training spectra")
    args = parser.parse_args()

    import numpy as np
    import torch

    from molpredict.kernels.fingerprints import GaussianTanimotoKernel
    from molpredict.kernels.spectra import CosineKernel, PPKernel, PPKLossesKernel
    from molpredict.chem.molecules import Molecule
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import read_mgf

    report: dict = {
        "benchmark": "kernels",
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "torch": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_start": list(os.getloadavg())},
        "params": vars(args) | {"out": str(args.out), "data": str(args.data)},
    }

    # -- spectra ------------------------------------------------------------------------------------------
    with Clock() as clock:
        raw = list(itertools.islice(read_mgf(args.data / "massbank" / "train_pos.mgf"), args.limit))
    pipeline = CleaningPipeline()
    with Clock() as clean_clock:
        cleaned = [pipeline(s) for s in raw]
    keep = [i for i, s in enumerate(cleaned) if s is not None]
    cleaned = [cleaned[i] for i in keep]
    raw = [raw[i] for i in keep]
    keys = np.array([(s.inchikey or "")[:14] for s in raw])
    report["spectra"] = {"read": clock.row(n=len(raw)), "clean": clean_clock.row(),
                         "peaks_raw": int(sum(s.n_peaks for s in raw)),
                         "peaks_cleaned": int(sum(s.n_peaks for s in cleaned)),
                         "empty_after_cleaning": int(sum(s.n_peaks == 0 for s in cleaned))}
    log(f"read {len(raw)} spectra in {clock.wall:.1f} s, cleaned in {clean_clock.wall:.1f} s")
    rows = np.sort(np.random.default_rng(0).choice(len(cleaned), min(args.rows, len(cleaned)), replace=False))

    kernels = report["spectrum_kernels"] = {}
    kernels["ppk"] = bench_spectrum_kernel("ppk", PPKernel(), cleaned, rows, keys)
    kernels["ppk-losses"] = bench_spectrum_kernel("ppk-losses", PPKLossesKernel(), cleaned, rows, keys)
    kernels["cosine"] = bench_spectrum_kernel("cosine", CosineKernel(), cleaned, rows, keys)
    if not args.skip_raw:
        kernels["ppk_raw_spectra"] = bench_spectrum_kernel("ppk", PPKernel(), raw, rows, keys)
    del raw

    # -- molecules ----------------------------------------------------------------------------------------
    smiles = sorted({s.smiles for s in cleaned if s.smiles})
    del cleaned
    with Clock() as parse:
        mols = [Molecule.from_smiles(s) for s in smiles]
    by_key = {}
    for m in mols:
        by_key.setdefault(m.inchikey14, m)
    mols = list(by_key.values())
    kernel = GaussianTanimotoKernel(gamma="auto", fp="morgan", radius=2, size=4096, n_jobs=2)
    with Clock() as fit:
        kernel.fit(mols)
    mol_rows = np.sort(np.random.default_rng(0).choice(len(mols), min(args.mol_rows, len(mols)), replace=False))
    sub = kernel.take(kernel.fit_features_, mol_rows)
    section = report["gaussian_tanimoto"] = {
        "parse_structures": parse.row(n=len(mols)), "fit": fit.row(gamma=kernel.gamma_),
        "train_block": bench_block(kernel, sub, f"gaussian-tanimoto {len(mol_rows)} x {len(mols)}"),
    }
    if args.pool:
        pool_smiles = read_pool_smiles(args.data / "candidates" / "pool.tsv.gz", args.pool)
        small = GaussianTanimotoKernel(gamma=kernel.gamma_, fp="morgan", radius=2, size=4096, n_jobs=2)
        small.fit([mols[i] for i in mol_rows])
        with Clock() as fps:
            pool_features = small.featurize(pool_smiles)
        section["pool_fingerprints"] = fps.row(n=len(pool_smiles))
        log(f"pool fingerprints: {len(pool_smiles)} in {fps.wall:.1f} s")
        section["pool_block"] = bench_block(small, pool_features,
                                            f"gaussian-tanimoto pool {len(pool_smiles)} x {len(mol_rows)}")

    report["machine"]["load_average_end"] = list(os.getloadavg())
    report["peak_rss_gb"] = peak_rss_gb()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "kernels.json"
    path.write_text(json.dumps(report, indent=2))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
