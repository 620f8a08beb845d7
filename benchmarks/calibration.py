"""Calibration benchmark: does the probability that rank 1 is right hold on structures the model never saw?

Usage::

    python benchmarks/calibration.py --data ../shared/data --bundle DIR --out DIR --split val|test
                                     [--modes positive,negative] [--files formula256,formula,mass]
                                     [--fit-on formula256,formula] [--calibrate-on mass] [--cache DIR] [--n-boot 200]
                                     [--baseline]

Protocol (seeded; every choice made on validation data)
-------------------------------------------------------
- ``--bundle`` is a trained bundle (e.g. ``make demo``'s default model). Its fusion and calibration are refitted
  with this code on ``massbank/val_{pos,neg}.mgf`` against ``candidates/val_{fit-on}.json``
  (:func:`molpredict.training.ranking_validation.fit_submodel_scoring`: folds grouped by structure, each structure
  weighted once, Platt / beta / isotonic on each candidate feature set, the one with the lowest structure-weighted
  out-of-fold log-loss kept); the recalibrated bundle is saved under ``--out/models`` (reused when present). The
  model itself is not retrained. ``--calibrate-on`` names more val sets (e.g. ``mass``) the calibration is fitted
  on but not the fusion.
- ``val``: the choice table (out-of-fold log-loss, ECE per spectrum and per structure, observed FDR at an
  estimated 10%, for every feature set x method) of each mode, and the recalibrated bundle evaluated on the val
  sets (in sample for the ``--fit-on`` files; ``mass`` is not fitted on).
- ``test``: the recalibrated bundle evaluated once on ``massbank/test_*.mgf`` against ``candidates/test_{file}.json``.
- ``--baseline`` also evaluates ``--bundle`` as it is (its own calibration, e.g. the previous release's Platt
  fitted per spectrum), in the same run, for the comparison.
- Per file and mode: hit@1, ECE (10 bins) per spectrum and per structure (each structure weighted once), mean
  probability vs accuracy, the queries confident at an estimated FDR <= 10% and their observed FDR (per spectrum and
  per structure); the target is an observed FDR <= 12% where the estimate says <= 10%.

Outputs under ``--out``: ``results_{split}.json`` (rewritten after every step) and ``results_{split}.md``.
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = {"positive": "pos", "negative": "neg"}
FDR_TARGET = 0.12
TABLE_HEADER = ("| mode | set | queries / structures | hit@1 | mean p | ECE | ECE per structure | "
                "confident (queries / structures) | est. FDR | observed FDR | observed FDR per structure | <= 12% |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def recalibrate(data: Path, bundle_path: Path, out: Path, fit_on: list[str], cache: Any, log,
                calibrate_on: list[str] | None = None) -> dict[str, Any]:
    """Refit every sub-model's fusion and calibration on the validation sets; save under ``out``."""
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.modelfile import ModelBundle
    from molpredict.io import read_spectra
    from molpredict.training.ranking_validation import fit_submodel_scoring

    bundle = ModelBundle.load(bundle_path)
    collections = [load_candidate_sets(data / "candidates" / f"val_{name}.json") for name in fit_on]
    extra = [load_candidate_sets(data / "candidates" / f"val_{name}.json") for name in calibrate_on or []]
    reports: dict[str, Any] = {}
    for mode, sub in bundle.models.items():
        if mode not in MODES:
            continue
        t0, c0 = time.perf_counter(), cpu_s()
        spectra = list(read_spectra(data / "massbank" / f"val_{MODES[mode]}.mgf"))
        report = fit_submodel_scoring(sub, spectra, collections, seed=0, log=log, cache_root=cache,
                                      calibration_collections=extra)
        reports[mode] = {"report": report, "wall_s": time.perf_counter() - t0, "cpu_s": cpu_s() - c0}
    bundle.save(out)
    return reports


def evaluate_file(data: Path, mode: str, bundle_path: Path, split: str, name: str, cache: Any,
                  n_boot: int) -> dict[str, Any]:
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.evaluate import evaluate
    from molpredict.modelfile import ModelBundle

    sets = load_candidate_sets(data / "candidates" / f"{split}_{name}.json")
    bundle = ModelBundle.load(bundle_path, ion_modes=[mode])
    t0, c0 = time.perf_counter(), cpu_s()
    result = evaluate([data / "massbank" / f"{split}_{MODES[mode]}.mgf"], [("model", bundle)], sets,
                      cache_root=cache, n_boot=n_boot, kernel_loss=False)["model"]
    return {"n_queries": result["n_queries"], "n_structures": result["n_structures"], "hit@1": result["hit@1"],
            "hit@10": result["hit@10"], "calibration": result.get("calibration"),
            "wall_s": time.perf_counter() - t0, "cpu_s": cpu_s() - c0}


def row(mode: str, name: str, result: dict[str, Any]) -> str:
    cal = result.get("calibration") or {}
    fdr = cal.get("confident_at_fdr", {})
    per = cal.get("per_structure", {})

    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    held = fdr.get("observed_fdr")
    verdict = "-" if held is None else ("yes" if held <= FDR_TARGET else "**no**")
    return (f"| {mode} | {name} | {result['n_queries']} / {result['n_structures']} | {pct(result['hit@1'])} | "
            f"{pct(cal.get('mean_probability'))} | {cal.get('ece', float('nan')):.3f} | "
            f"{per.get('ece', float('nan')):.3f} | {fdr.get('n_queries', 0)} / {fdr.get('n_structures', 0)} | "
            f"{pct(fdr.get('estimated_fdr'))} | {pct(held)} | {pct(fdr.get('observed_fdr_per_structure'))} | "
            f"{verdict} |")


def markdown(results: dict[str, Any]) -> str:
    split = results["split"]
    lines = [f"# Calibration benchmark ({split})", "",
             f"Machine: {results['machine']}. Bundle {results['bundle']}; fusion and calibration refitted on val "
             f"({', '.join(results['fit_on'])} sets; folds by structure, each structure weighted once).", ""]
    for mode, fit in results.get("fits", {}).items():
        for variant, report in fit["report"].items():
            cal = report["calibration"]
            lines += [f"## {mode}, {variant.replace('_', ' ')}: calibrators compared on val (grouped out-of-fold)",
                      "", f"Chosen: **{cal['feature_set']} / {cal['method']}"
                      + (f" / {cal['weighting']}" if cal.get("weighting") else "")
                      + f"** ({', '.join(cal['features'])}); "
                      + (f"FDR bound z {cal['fdr']['z']:g}; " if cal.get("fdr") else "")
                      + f"{report['n_queries']} queries, {report['n_structures']} structures; refit "
                      f"{fit['wall_s']:.0f} s wall, {fit['cpu_s']:.0f} s CPU.", "",
                      "| feature set / method | log-loss (per structure) | ECE | ECE per structure | "
                      "confident at est. 10% | observed FDR |", "|---|---:|---:|---:|---:|---:|"]
            for name, m in cal["compared"].items():
                observed = "-" if m["observed_fdr"] is None else f"{100 * m['observed_fdr']:.1f}"
                lines.append(f"| {name} | {m['log_loss']:.4f} | {m['ece']:.3f} | {m['ece_per_structure']:.3f} | "
                             f"{m['confident_at_fdr_0.1']} | {observed} |")
            lines.append("")
    lines += [f"## Evaluated on {split}", "", *TABLE_HEADER]
    for key, result in results.get("files", {}).items():
        mode, name = key.split("/")
        lines.append(row(mode, name, result))
    if results.get("baseline_files"):
        lines += ["", f"The bundle's own calibration, same run ({results['bundle']}):", "", *TABLE_HEADER]
        for key, result in results["baseline_files"].items():
            mode, name = key.split("/")
            lines.append(row(mode, name, result))
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the shared data directory (../shared/data)")
    parser.add_argument("--bundle", required=True, type=Path, help="a trained bundle (its model is kept)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--split", required=True, choices=["val", "test"])
    parser.add_argument("--modes", default="positive,negative")
    parser.add_argument("--files", default="formula256,formula,mass")
    parser.add_argument("--fit-on", default="formula256,formula")
    parser.add_argument("--calibrate-on", default="", help="val sets the calibration (not the fusion) also fits on")
    parser.add_argument("--cache", type=Path, default=None, help="candidate coordinates cache (default: none)")
    parser.add_argument("--n-boot", type=int, default=200)
    parser.add_argument("--baseline", action="store_true", help="also evaluate --bundle with its own calibration")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cache: Any = args.cache if args.cache is not None else False
    results_path = args.out / f"results_{args.split}.json"
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    results.update({"split": args.split, "bundle": str(args.bundle), "fit_on": args.fit_on.split(","),
                    "calibrate_on": [n for n in args.calibrate_on.split(",") if n],
                    "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, "
                               f"python {platform.python_version()}"})

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def save() -> None:
        results_path.write_text(json.dumps(results, indent=2, default=str))
        (args.out / f"results_{args.split}.md").write_text(markdown(results))

    recalibrated = args.out / "models" / "recalibrated"
    fits_path = args.out / "fits.json"
    if not (recalibrated / "bundle.json").exists():
        log(f"refitting the fusion and calibration of {args.bundle} on val ({args.fit_on})")
        fits = recalibrate(args.data, args.bundle, recalibrated, args.fit_on.split(","), cache, log,
                           [n for n in args.calibrate_on.split(",") if n])
        fits_path.write_text(json.dumps(fits, indent=2, default=str))
    results["fits"] = json.loads(fits_path.read_text())
    save()
    passes = [("files", recalibrated, "")]
    if args.baseline:
        passes.append(("baseline_files", args.bundle, " with the bundle's own calibration"))
    for results_key, bundle_path, how in passes:
        for mode in args.modes.split(","):
            for name in args.files.split(","):
                key = f"{mode}/{name}"
                if key in results.setdefault(results_key, {}):
                    continue
                log(f"evaluating {key} on {args.split}{how}")
                results[results_key][key] = evaluate_file(args.data, mode, bundle_path, args.split, name, cache,
                                                          args.n_boot)
                save()
                log("  " + row(mode, name, results[results_key][key]))
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
