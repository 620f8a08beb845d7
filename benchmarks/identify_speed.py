"""Identification speed as a user meets it: ``molpredict identify`` end to end, a fresh process each time, with a
trained bundle and a warm candidate store. Writes JSON.

Usage::

    nice -n 10 python benchmarks/identify_speed.py --model MODEL --home HOME \\
        --spectra ../shared/data/massbank/test_pos.mgf --library ../shared/data/candidates/pool.tsv.gz \\
        [--reference-code /path/to/old/checkout --reference-model OLD_MODEL --reference-home OLD_HOME] \\
        [--repeats 3] [--repeats-all 1] [--out docs/benchmarks/identify_speed.json]

Every path is given explicitly (nothing defaults to the shared data). ``HOME`` is the ``MOLPREDICT_HOME`` whose
candidate store (``HOME/coordinates``) and library cache are warm for these spectra: run the full file once first.

Measured, each in a fresh ``python -m molpredict identify SPECTRA --model MODEL --library LIBRARY -o OUT`` process
(by formula, the default; the spectra's own FORMULA fields):

- latency for the first 1 and first 5 spectra of ``--spectra`` (written to small MGF files), and throughput for
  the whole file (spectra per second, end to end: start-up, bundle, library, scoring, writing);
- wall seconds (best of ``--repeats``, their median, and all of them) and the process's CPU seconds (user +
  system, from ``getrusage`` of the child), with the load average before each run: the machine is shared, so wall
  times are noisy and CPU seconds say what the run itself cost. With a reference the two trees' runs alternate, so
  a load that drifts during the benchmark falls on both;
- a stage breakdown from one instrumented process per size: imports (what the ``identify`` command imports),
  bundle load, library open, reading the spectra, and the per-spectrum work (cleaning, candidates, prediction,
  scoring, ranking), each with wall and CPU seconds.

With ``--fragment-cache`` (a bundle whose fusion weighs the fragmentation terms, e.g. in a second pass), the whole
file is also identified with the on-disk fragment cache (``HOME/coordinates/fragments``, issue 19) cold, that is
moved aside so that every candidate is fragmented and written, then warm (a fresh process each, the fastest of
``--repeats-all``), with the identify timings of a warm instrumented run (``fragments_s``, ``fragment_model_s``,
``fragment_cache_s``) and the ratio; the directory moved aside is put back afterwards. Goal: >= 500 spectra/s warm.

With ``--reference-code`` (a checkout of the code before a change, e.g. the pre-change tree) the same runs are
made with ``PYTHONPATH`` pointing at it, in the same invocation, and the output files of every size are compared
byte for byte with the new code's (``identical``). Goals: 5 spectra in <= 1.0 s end to end, outputs identical, the
6,450 ``test_pos`` spectra at >= 1,000 spectra/s (issue 20) and at >= 500 spectra/s on the default path (issue 19,
after the default gained its costlier kernels).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What one instrumented process runs: the identify command's steps with a clock around each (old and new module
#: layouts both work, so the reference code is broken down the same way).
STAGES_SCRIPT = r'''
import json, sys, time
def clock():
    return time.perf_counter(), time.process_time()
stages = {}
def stage(name, start):
    wall, cpu = clock()
    stages[name] = {"wall_s": round(wall - start[0], 4), "cpu_s": round(cpu - start[1], 4)}
    return wall, cpu
model, library, spectra_path = sys.argv[1:4]
t = clock()
import molpredict.cli
try:
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.identification.candidate_sources import LibrarySource
    from molpredict.chem.candidates import read_library
except ImportError:  # the layout before issue 23
    from molpredict.identify import Identifier, IdentifyOptions
    from molpredict.candidate_sources import LibrarySource
    from molpredict.candidates import read_library
from molpredict.io.results import ResultWriter
from molpredict.io import read_spectra
from molpredict.modelfile import ModelBundle
t = stage("imports", t)
bundle = ModelBundle.load(model)
t = stage("bundle_load", t)
options = IdentifyOptions()
source = LibrarySource(read_library(library), options)
t = stage("library_open", t)
spectra = list(read_spectra(spectra_path))
t = stage("read_spectra", t)
identifier = Identifier(bundle, source, options)
import io
writer = ResultWriter(io.StringIO(), "tsv")
for row in identifier.run(spectra):
    writer.write(row)
writer.close()
t = stage("per_spectrum_work", t)
heavy = sorted(m for m in ("torch", "scipy.special", "sklearn", "dask", "distributed", "zarr", "rdkit", "pyarrow.compute")
               if m in sys.modules)
print(json.dumps({"stages": stages, "n_spectra": len(spectra), "imported": heavy,
                  "timings": {k: round(v, 4) for k, v in identifier.summary()["timings"].items()}}))
'''


def _head_mgf(src: Path, n: int, dst: Path) -> Path:
    """The first ``n`` records of an MGF file."""
    out, count = [], 0
    with open(src, encoding="utf-8") as handle:
        for line in handle:
            out.append(line)
            if line.startswith("END IONS"):
                count += 1
                if count == n:
                    break
    dst.write_text("".join(out))
    return dst


def _count_records(path: Path) -> int:
    with open(path, encoding="utf-8") as handle:
        return sum(1 for line in handle if line.startswith("BEGIN IONS"))


def _env(code: Path, home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code)
    env["MOLPREDICT_HOME"] = str(home)
    env.pop("MOLPREDICT_CLUSTER", None)
    return env


def _timed(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd``; wall seconds, the child's CPU seconds (user + system) and the load average before it.

    It runs in the directory of the code it times (``env``'s ``PYTHONPATH``): ``python -m`` and ``-c`` put the
    working directory first on ``sys.path``, so from another checkout that checkout's code would run instead."""
    load = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=env["PYTHONPATH"])
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load_1min": round(load[0], 2),
            "stdout": done.stdout, "stderr": done.stderr}


def _sides(sides: list[tuple[str, Path, Path, Path]], library: Path, inputs: dict[str, tuple[Path, int]],
           repeats: int, work: Path, repeats_all: int = 1) -> dict[str, dict]:
    """End-to-end runs and the stage breakdown of each code tree (``(name, code, model, home)``).

    The trees' runs alternate (reference, new, reference, new...), so a load that drifts during the benchmark (a
    shared machine) falls on both alike; the fastest run and the median are reported."""
    python = sys.executable
    out: dict[str, dict] = {name: {"code": str(code), "model": str(model), "home": str(home), "sizes": {}}
                            for name, code, model, home in sides}
    for size, (spectra, n) in inputs.items():
        runs: dict[str, list[dict]] = {name: [] for name, *_ in sides}
        for _ in range(max(1, repeats_all if size == "all" else repeats)):
            for name, code, model, home in sides:
                cmd = [python, "-m", "molpredict", "identify", str(spectra), "--model", str(model), "--library",
                       str(library), "-o", str(work / f"{name}_{size}.tsv"), "--no-progress", "-q"]
                runs[name].append(_timed(cmd, _env(code, home)))
        for name, code, model, home in sides:
            best = min(runs[name], key=lambda r: r["wall_s"])
            median = float(statistics.median(r["wall_s"] for r in runs[name]))
            stages = _timed([python, "-c", STAGES_SCRIPT, str(model), str(library), str(spectra)], _env(code, home))
            breakdown = json.loads(stages["stdout"].strip().splitlines()[-1])
            out[name]["sizes"][size] = {
                "n_spectra": n, "output": str(work / f"{name}_{size}.tsv"),
                "wall_s": best["wall_s"], "cpu_s": best["cpu_s"], "load_1min": best["load_1min"],
                "median_wall_s": round(median, 3),
                "runs": [{k: r[k] for k in ("wall_s", "cpu_s", "load_1min")} for r in runs[name]],
                "spectra_per_s": round(n / best["wall_s"], 1),
                "median_spectra_per_s": round(n / median, 1),
                "spectra_per_cpu_s": round(n / best["cpu_s"], 1) if best["cpu_s"] > 0 else None,
                "stages": breakdown["stages"], "stages_load_1min": stages["load_1min"],
                "identify_timings": breakdown["timings"], "heavy_modules_imported": breakdown["imported"],
            }
            print(f"{name} {size}: {best['wall_s']:.2f} s wall (median {median:.2f}), {best['cpu_s']:.2f} s CPU "
                  f"(load {best['load_1min']}); stages {breakdown['stages']}", file=sys.stderr)
    return out


def _fragment_cache_runs(code: Path, model: Path, home: Path, library: Path, spectra: Path, n: int, work: Path,
                         repeats: int) -> dict:
    """The whole file with the fragment cache cold (moved aside), then warm; the old cache is put back."""
    import shutil

    env = _env(code, home)
    target = work / "fragment_cache.tsv"
    cmd = [sys.executable, "-m", "molpredict", "identify", str(spectra), "--model", str(model), "--library",
           str(library), "-o", str(target), "--no-progress", "-q"]
    store = home / "coordinates" / "fragments"
    aside = store.with_name(f"fragments.aside-{os.getpid()}")
    if store.exists():
        store.rename(aside)
    try:
        cold = _timed(cmd, env)
        cold_rows = target.read_bytes()
        warm_runs = [_timed(cmd, env) for _ in range(max(1, repeats))]
        warm_rows = target.read_bytes()
        stages = _timed([sys.executable, "-c", STAGES_SCRIPT, str(model), str(library), str(spectra)], env)
        stored = sum(p.stat().st_size for p in store.glob("*.sqlite*")) if store.exists() else 0
    finally:
        if aside.exists():
            shutil.rmtree(store, ignore_errors=True)
            aside.rename(store)
    warm = min(warm_runs, key=lambda r: r["wall_s"])
    keep = ("wall_s", "cpu_s", "load_1min")
    return {"n_spectra": n, "cold": {k: cold[k] for k in keep}, "warm": {k: warm[k] for k in keep},
            "warm_runs": [{k: r[k] for k in keep} for r in warm_runs],
            "cold_spectra_per_s": round(n / cold["wall_s"], 1), "warm_spectra_per_s": round(n / warm["wall_s"], 1),
            "speedup_wall": round(cold["wall_s"] / warm["wall_s"], 2),
            "speedup_cpu": round(cold["cpu_s"] / warm["cpu_s"], 2) if warm["cpu_s"] > 0 else None,
            "identical": cold_rows == warm_rows, "store_bytes": stored,
            "warm_identify_timings": json.loads(stages["stdout"].strip().splitlines()[-1])["timings"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model bundle (as the new code loads it)")
    parser.add_argument("--home", required=True, help="MOLPREDICT_HOME with a warm store for these spectra")
    parser.add_argument("--spectra", required=True, help="query spectra (e.g. test_pos.mgf)")
    parser.add_argument("--library", required=True, help="candidate library (e.g. the shared pool.tsv.gz)")
    parser.add_argument("--reference-code", default=None, help="checkout of the code to compare with (before)")
    parser.add_argument("--reference-model", default=None, help="bundle for the reference code (default --model)")
    parser.add_argument("--reference-home", default=None, help="MOLPREDICT_HOME for the reference code "
                                                               "(default --home)")
    parser.add_argument("--repeats", type=int, default=3, help="end-to-end runs per size (the fastest is reported)")
    parser.add_argument("--repeats-all", type=int, default=1, help="end-to-end runs of the whole file")
    parser.add_argument("--sizes", default="1,5,all", help="comma-separated: numbers of spectra and/or 'all'")
    parser.add_argument("--fragment-cache", action="store_true",
                        help="also time the whole file with the fragment cache cold, then warm")
    parser.add_argument("--out", default="identify_speed.json")
    args = parser.parse_args(argv)

    # absolute: every run is made in the directory of the code it times (see _timed)
    for name in ("model", "home", "spectra", "library", "reference_code", "reference_model", "reference_home"):
        if getattr(args, name):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    spectra = Path(args.spectra)
    n_all = _count_records(spectra)
    with tempfile.TemporaryDirectory(prefix="identify-speed-") as tmp:
        work = Path(tmp)
        inputs: dict[str, tuple[Path, int]] = {}
        for size in args.sizes.split(","):
            if size == "all":
                inputs["all"] = (spectra, n_all)
            else:
                n = int(size)
                inputs[str(n)] = (_head_mgf(spectra, n, work / f"first{n}.mgf"), n)
        result: dict = {
            "benchmark": "identify_speed", "spectra": str(spectra), "library": args.library,
            "by": "formula (the spectra's FORMULA)", "repeats": args.repeats,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "load_before": [round(x, 2) for x in os.getloadavg()]},
            "goal": {"5_spectra_wall_s": 1.0, "all_spectra_per_s": 1000.0},
        }
        sides = [("new", ROOT, Path(args.model), Path(args.home))]
        if args.reference_code:
            sides.insert(0, ("reference", Path(args.reference_code), Path(args.reference_model or args.model),
                             Path(args.reference_home or args.home)))
        result.update(_sides(sides, Path(args.library), inputs, args.repeats, work, args.repeats_all))
        if args.fragment_cache:
            cache = _fragment_cache_runs(ROOT, Path(args.model), Path(args.home), Path(args.library), spectra, n_all,
                                         work, args.repeats_all)
            result["fragment_cache"] = cache
            result["goal"]["warm_fragment_cache_spectra_per_s"] = 500.0
            result["goal"]["warm_fragment_cache_met"] = cache["warm_spectra_per_s"] >= 500.0
            print(f"fragment cache: cold {cache['cold_spectra_per_s']}/s, warm {cache['warm_spectra_per_s']}/s",
                  file=sys.stderr)
        new = result["new"]["sizes"]
        if "5" in new:
            result["goal"]["5_spectra_met"] = new["5"]["wall_s"] <= 1.0
        if "all" in new:
            result["goal"]["all_spectra_met"] = new["all"]["spectra_per_s"] >= 1000.0
            result["goal"]["default_path_spectra_per_s"] = 500.0
            result["goal"]["default_path_met"] = new["all"]["spectra_per_s"] >= 500.0
        if args.reference_code:
            ref = result["reference"]["sizes"]
            result["identical"] = {size: Path(new[size]["output"]).read_bytes() == Path(ref[size]["output"]).read_bytes()
                                   for size in new}
            result["speedup_wall"] = {size: round(ref[size]["wall_s"] / new[size]["wall_s"], 2) for size in new}
            result["speedup_median_wall"] = {size: round(ref[size]["median_wall_s"] / new[size]["median_wall_s"], 2)
                                             for size in new}
            result["speedup_cpu"] = {size: round(ref[size]["cpu_s"] / new[size]["cpu_s"], 2) for size in new}
        for side in ("reference", "new"):
            for entry in result.get(side, {}).get("sizes", {}).values():
                entry.pop("output", None)
        result["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result.get(k) for k in ("goal", "identical", "speedup_wall", "speedup_cpu")}, indent=2))
    if "fragment_cache" in result:
        print(json.dumps({"fragment_cache": {k: v for k, v in result["fragment_cache"].items()
                                             if k != "warm_identify_timings"}}, indent=2))
    return result


if __name__ == "__main__":
    main()
