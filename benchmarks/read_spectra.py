"""Time reading every shared MassBank MGF file with ``molpredict.io.read_mgf`` (and, optionally, pyteomics).

Usage: python benchmarks/read_spectra.py [--data DIR] [--output JSON] [--repeats N] [--reference]
                                         [--clean]

For each file: spectra read, wall seconds (best of --repeats), CPU seconds of this process for that run
(the machine may be shared: CPU time is the steadier number), spectra per second and MB per second.
``--clean`` also times the default CleaningPipeline over the spectra read. ``--reference`` times
``pyteomics.mgf.read`` (a general-purpose reader: the ratio says what the hand-written parser buys) on the
same files.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["train_pos", "val_pos", "test_pos", "train_neg", "val_neg", "test_neg"]


def _time(function, repeats: int) -> tuple[float, float, object]:
    """(best wall seconds, CPU seconds of that run, result of the last run)."""
    best = None
    for _ in range(repeats):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = function()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if best is None or wall < best[0]:
            best = (wall, cpu)
    return best[0], best[1], result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the MassBank split directory (../shared/data/massbank)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench-out" / "read_spectra.json")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--reference", action="store_true", help="also time pyteomics.mgf.read")
    parser.add_argument("--clean", action="store_true", help="also time the default CleaningPipeline")
    args = parser.parse_args()

    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import SkipReport, read_mgf

    rows = []
    for name in FILES:
        path = args.data / f"{name}.mgf"
        if not path.exists():
            print(f"missing {path}: skipped", file=sys.stderr)
            continue
        size_mb = path.stat().st_size / 1e6
        report = SkipReport()
        wall, cpu, spectra = _time(lambda: list(read_mgf(path, report=report)), args.repeats)
        n = len(spectra)
        row = {"file": path.name, "size_mb": round(size_mb, 2), "spectra": n,
               "peaks": int(sum(s.n_peaks for s in spectra)), "skipped": report.count // args.repeats,
               "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
               "spectra_per_second": round(n / wall), "mb_per_second": round(size_mb / wall, 1)}
        if args.clean:
            pipeline = CleaningPipeline()
            wall_c, cpu_c, _ = _time(lambda: [pipeline(s) for s in spectra], args.repeats)
            row.update({"clean_seconds": round(wall_c, 3), "clean_cpu_seconds": round(cpu_c, 3)})
        if args.reference:
            from pyteomics import mgf

            def reference() -> int:
                with mgf.read(str(path), convert_arrays=1, read_charges=True, use_index=False) as reader:
                    return sum(1 for _ in reader)

            wall_r, cpu_r, n_r = _time(reference, 1)
            row.update({"pyteomics_spectra": n_r, "pyteomics_seconds": round(wall_r, 3),
                        "pyteomics_cpu_seconds": round(cpu_r, 3), "speedup_vs_pyteomics": round(wall_r / wall, 1)})
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    result = {
        "benchmark": "read_spectra",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "repeats": args.repeats,
        "files": rows,
        "total_seconds": round(sum(r["seconds"] for r in rows), 3),
        "total_cpu_seconds": round(sum(r["cpu_seconds"] for r in rows), 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
