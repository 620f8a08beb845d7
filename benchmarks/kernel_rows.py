"""Training's input kernel rows three ways, in one run: blocks of ``block_rows``, blocks bounded by ``block_cells``,
and on worker processes (``rows_on_workers``).

Usage::

    python benchmarks/kernel_rows.py --data ../shared/data [--rows 2048] [--repeats 2] [--kernel SPEC]
                                     [--limit N] [--out DIR]

What it does: reads and cleans ``massbank/train_pos.mgf`` as training does, fits the input kernel (the default
spectrum models' ``mkl`` unless ``--kernel``) on every spectrum, then computes ``gram(rows)`` for ``--rows`` seeded
training spectra against all of them (what the input sketch's ``sketch_rows`` asks for per block of landmarks)
``--repeats`` times per way, the ways alternating so that a load that comes and goes hits them alike:

- ``block_rows``: the kernel's blocks of ``block_rows`` rows (the release before ``block_cells``; the reference);
- ``block_cells``: blocks bounded by ``block_cells`` values, in this process;
- ``workers``: inside ``rows_on_workers(-1)`` (every core this process may use). The processes start and load
  the kernel in an untimed warm-up (a small gram on the pool; its wall time is reported as ``warm_up_wall_s``).

Per way: wall and CPU seconds of each repeat (the CPU of this process: the workers' is not in it),
the fastest and the median, the ratio of the reference's median to the way's, and whether the rows equal the
reference's bit for bit. Writes ``kernel_rows.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(call) -> tuple[object, float, float]:
    t0, c0 = time.perf_counter(), cpu_s()
    out = call()
    return out, time.perf_counter() - t0, cpu_s() - c0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data directory (../shared/data)")
    parser.add_argument("--rows", type=int, default=2048, help="training spectra whose rows are computed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kernel", default=None, help="input kernel spec (default: the spectrum models' default)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N training spectra")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out")
    args = parser.parse_args(argv)

    import numpy as np

    from molpredict.io import read_spectra
    from molpredict.kernels.base import DegenerateObjectWarning
    from molpredict.kernels.workers import MIN_CHUNK_ROWS, rows_here, rows_on_workers
    from molpredict.models.okr import DEFAULT_INPUT_KERNEL
    from molpredict.registry import create
    from molpredict.spectra.cleaning import CleaningPipeline

    warnings.simplefilter("ignore", DegenerateObjectWarning)
    spec = args.kernel or DEFAULT_INPUT_KERNEL
    load_start = os.getloadavg()[0]
    spectra = list(read_spectra(args.data / "massbank" / "train_pos.mgf"))[:args.limit]
    clean = CleaningPipeline()
    spectra = [c for c in (clean(s) for s in spectra) if c is not None]
    kernel = create("input_kernel", spec)
    _, fit_wall, fit_cpu = timed(lambda: kernel.fit(spectra))
    rows = np.sort(np.random.default_rng(0).choice(len(spectra), min(args.rows, len(spectra)), replace=False))
    cells = kernel.block_cells

    def block_rows_way():
        kernel.block_cells = None
        try:
            return kernel.gram(rows)
        finally:
            kernel.block_cells = cells

    results: dict[str, dict] = {name: {"wall_s": [], "cpu_s": []}
                                for name in ("block_rows", "block_cells", "workers")}
    reference = None
    equal = {"block_cells": True, "workers": True}
    with rows_on_workers(-1) as pool:
        warm_up_wall = None
        if pool is not None:  # the processes start and load the kernel here, timed apart from the repeats
            _, warm_up_wall, _ = timed(lambda: kernel.gram(rows[:4 * MIN_CHUNK_ROWS * pool.workers]))
        for _ in range(args.repeats):
            for name in ("block_rows", "block_cells", "workers"):
                if name == "workers" and pool is not None:
                    out, wall, cpu = timed(lambda: kernel.gram(rows))
                elif name == "workers":
                    continue  # one core: no workers
                else:
                    with rows_here():  # the two in-process ways: the pool set aside
                        out, wall, cpu = timed(block_rows_way if name == "block_rows" else lambda: kernel.gram(rows))
                results[name]["wall_s"].append(round(wall, 3))
                results[name]["cpu_s"].append(round(cpu, 3))
                if name == "block_rows":
                    reference = out if reference is None else reference
                elif reference is not None:
                    equal[name] = equal[name] and bool(np.array_equal(out, reference))
        # as many processes as started (the pool starts fewer where memory is short)
        workers, tasks = (1, 0) if pool is None else (pool.workers, pool.tasks_run)
    ref_median = statistics.median(results["block_rows"]["wall_s"])
    for name, r in results.items():
        if not r["wall_s"]:
            continue
        r["fastest_wall_s"] = min(r["wall_s"])
        r["median_wall_s"] = statistics.median(r["wall_s"])
        r["speedup_vs_block_rows"] = round(ref_median / r["median_wall_s"], 3)
        if name != "block_rows":
            r["rows_equal_reference"] = equal[name]
    report = {
        "benchmark": "kernel_rows", "kernel": spec, "n_spectra": len(spectra), "rows": len(rows),
        "block_rows": int(kernel.block_rows), "block_cells": cells, "rows_per_block": kernel.rows_per_block(),
        "workers": workers, "worker_tasks": tasks,
        "warm_up_wall_s": None if warm_up_wall is None else round(warm_up_wall, 2),
        "fit_wall_s": round(fit_wall, 2), "fit_cpu_s": round(fit_cpu, 2),
        "results": results,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                    "load_start": round(load_start, 2), "load_end": round(os.getloadavg()[0], 2)},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_rows.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "results"}))
    for name, r in results.items():
        if r["wall_s"]:
            print(f"{name}: median {r['median_wall_s']} s wall (fastest {r['fastest_wall_s']}), "
                  f"x{r['speedup_vs_block_rows']}" + (f", equal {r['rows_equal_reference']}"
                                                       if "rows_equal_reference" in r else ""))
    return report


if __name__ == "__main__":
    main()
