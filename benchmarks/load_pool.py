"""Load the 1.96M-row candidate pool cold and cached, and time candidate selection for every test spectrum.

Usage: python benchmarks/load_pool.py [--pool PATH] [--mgf PATH] [--output JSON] [--repeats N]

Measures (seconds unless stated), each in a fresh process-independent way where it matters:
  sha256            hashing the pool file (the cache key)
  cold_no_cache     reading the gzipped TSV (Arrow, no RDKit), no cache written
  cold_with_cache   the same plus building the mass / formula indexes and writing the cache entry
  cached            loading from the cache entry (memory-mapped Arrow + indexes), best of --repeats
  mass_queries      select_by_mass (10 ppm) for every spectrum of --mgf (neutral mass from PEPMASS and ADDUCT)
  formula_queries   select_by_formula for every spectrum's FORMULA
The cache goes to a temporary MOLPREDICT_HOME, removed afterwards, so the user's cache is left alone.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _scan_mgf(path: Path) -> list[dict[str, str]]:
    """PEPMASS / ADDUCT / FORMULA / IONMODE of each record (a plain line scan; peaks are skipped)."""
    records, current = [], {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("BEGIN IONS"):
                current = {}
            elif line.startswith("END IONS"):
                records.append(current)
            elif "=" in line and line[:1].isalpha():
                key, value = line.rstrip("\n").split("=", 1)
                if key in ("PEPMASS", "ADDUCT", "FORMULA", "IONMODE"):
                    current[key] = value.strip()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=Path, required=True, help="../shared/data/candidates/pool.tsv.gz")
    parser.add_argument("--mgf", type=Path, required=True, help="../shared/data/massbank/test_pos.mgf")
    parser.add_argument("--output", type=Path, default=ROOT / "bench-out" / "load_pool.json")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="molpredict-bench-"))
    os.environ["MOLPREDICT_HOME"] = str(home)
    import psutil

    from molpredict.cache import file_sha256
    from molpredict.chem.candidates import read_library
    from molpredict.errors import InputError
    from molpredict.chem.molecules import DEFAULT_ADDUCTS, neutral_mass, parse_adduct

    process = psutil.Process()
    result: dict = {"pool": str(args.pool), "pool_bytes": args.pool.stat().st_size,
                    "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                "platform": platform.platform()}}
    try:
        t = time.perf_counter()
        file_sha256(args.pool)
        result["sha256_s"] = time.perf_counter() - t

        t = time.perf_counter()
        library = read_library(args.pool, cache=False)
        result["cold_no_cache_s"] = time.perf_counter() - t
        result["rows"] = len(library)
        del library

        t = time.perf_counter()
        library = read_library(args.pool, cache=True)
        result["cold_with_cache_s"] = time.perf_counter() - t
        del library
        result["cache_entry_bytes"] = sum(f.stat().st_size for f in home.rglob("*") if f.is_file())

        times = []
        for _ in range(max(1, args.repeats)):
            rss_before = process.memory_info().rss
            t = time.perf_counter()
            library = read_library(args.pool, cache=True)
            times.append(time.perf_counter() - t)
        result["cached_s"] = min(times)
        result["cached_all_s"] = times
        result["rss_growth_after_cached_load_mb"] = (process.memory_info().rss - rss_before) / 1e6

        records = _scan_mgf(args.mgf)
        masses, formulas = [], []
        for record in records:
            try:
                adduct = parse_adduct(record["ADDUCT"]) if record.get("ADDUCT") else \
                    DEFAULT_ADDUCTS[record.get("IONMODE", "positive").lower()][0]
                masses.append(neutral_mass(float(record["PEPMASS"].split()[0]), adduct))
            except (InputError, KeyError, ValueError):
                continue
            if record.get("FORMULA"):
                formulas.append(record["FORMULA"])
        t = time.perf_counter()
        sizes = [len(library.select_by_mass(m, ppm=10)) for m in masses]
        result["mass_queries"] = {"n": len(masses), "total_s": time.perf_counter() - t,
                                  "median_candidates": float(np.median(sizes)), "max_candidates": int(max(sizes))}
        t = time.perf_counter()
        library.select_by_masses(masses, ppm=10)
        result["mass_queries"]["vectorised_total_s"] = time.perf_counter() - t
        t = time.perf_counter()
        sizes = [len(library.select_by_formula(f)) for f in formulas]
        result["formula_queries"] = {"n": len(formulas), "total_s": time.perf_counter() - t,
                                     "median_candidates": float(np.median(sizes))}
        t = time.perf_counter()
        some = library.select_by_mass(masses[0], ppm=10)
        library.molecules(some)
        result["molecules_for_one_query_s"] = time.perf_counter() - t
    finally:
        shutil.rmtree(home, ignore_errors=True)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
