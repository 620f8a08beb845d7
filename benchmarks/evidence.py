"""Spectrum evidence benchmark: does the spectrum count? The default pipeline (ranking-aware selection, the score
fusion of the spectrum model, the structure prior and the fragment score, the calibrated probability) against its
parts, on held-out MassBank test spectra with MassSpecGym-style candidate sets.

Usage::

    python benchmarks/evidence.py --data ../shared/data --out DIR [--modes positive,negative]
                                  [--configs default,baseline] [--files formula256,formula,mass] [--n-boot 1000]

Protocol (one run, seeded, every choice made on validation data)
----------------------------------------------------------------
- Each configuration trains one bundle per ion mode on ``massbank/train_{pos,neg}.mgf`` with
  ``massbank/val_*.mgf`` as validation spectra and ``candidates/val_formula256.json`` and ``val_formula.json``
  as their candidate sets (the bundle's grid points, fusion weights and calibration are chosen on both kinds:
  ``molpredict train ... --val-candidates A --val-candidates B``); then it is evaluated on ``test_*.mgf``
  against ``candidates/test_{file}.json``.
- Configurations: ``default`` is ``molpredict train``'s defaults; ``baseline`` is the previous release's model
  (``ppk-losses`` input kernel, lam by validation kernel loss, no prior, no fragments), for the ablation.
- Rows, all from one evaluation pass of each bundle (:func:`molpredict.identification.evaluate.evaluate` ``views``): the fused
  ranking, the spectrum evidence without the prior (``--prior off``: model + fragments), the spectrum model
  alone, the fragment score alone and the prior alone; hit@1/5/10/20 and MRR with 95% bootstrap intervals for
  hit@1; the calibration (ECE, 10 bins; queries confident at an estimated FDR <= 10%).
- Timings: training (with the validation selection and fusion fit) and evaluation per file, on this machine.

Outputs under ``--out``: ``results.json`` (rewritten after every step) and ``results.md``.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = {"positive": "pos", "negative": "neg"}
#: the evidence kernels chosen on val_formula256 (docs/benchmarks/evidence_ablation.md): MKL of ppk-losses and the
#: fragment/loss-formula bags, linear Tanimoto output kernel
EVIDENCE_KERNELS = {"input_kernel": "mkl:kernels=ppk-losses+formula-annotation:explanations=all,weights=uniform",
                    "output_kernel": "tanimoto"}
CONFIGS = {
    "default": {},
    "evidence": {**EVIDENCE_KERNELS, "fragments": False},
    "evidence+fragments": {**EVIDENCE_KERNELS, "fragments": True},
    "fragments": {"fragments": True},
    "baseline": {"input_kernel": "ppk-losses", "select_by": "kernel-loss", "prior": "none", "fragments": False},
}
VIEWS = (("fused", None), ("spectrum evidence (--prior off)", "without_prior"),
         ("spectrum model alone", "spectrum_alone"), ("fragments alone", "fragments_alone"),
         ("prior alone", "prior_alone"))


def train(data: Path, mode: str, config: dict[str, Any], out: Path, log) -> tuple[Path, float]:
    from molpredict.training.pipeline import TrainOptions, train_bundle

    short = MODES[mode]
    # as `make demo` trains: the fusion chosen on formula256 + formula sets, the calibration also on mass sets
    options = TrainOptions(ion_modes=[mode], val_candidates=[str(data / "candidates" / f"val_{name}.json")
                                                             for name in ("formula256", "formula")],
                           calibration_candidates=[str(data / "candidates" / "val_mass.json")], **config)
    t0 = time.perf_counter()
    bundle, summary = train_bundle([data / "massbank" / f"train_{short}.mgf"], options,
                                   val_paths=[data / "massbank" / f"val_{short}.mgf"], progress=False, log=log)
    fit_s = time.perf_counter() - t0
    path = bundle.save(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return path, fit_s


def evaluate_file(data: Path, mode: str, bundle_path: Path, name: str, n_boot: int) -> dict[str, Any]:
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.evaluate import evaluate
    from molpredict.modelfile import ModelBundle

    sets = load_candidate_sets(data / "candidates" / f"test_{name}.json")
    bundle = ModelBundle.load(bundle_path)
    t0 = time.perf_counter()
    result = evaluate([data / "massbank" / f"test_{MODES[mode]}.mgf"], [("model", bundle)], sets, cache_root=False,
                      n_boot=n_boot, kernel_loss=False)["model"]
    result["evaluate_s"] = time.perf_counter() - t0
    return result


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for label, view in VIEWS:
        block = result if view is None else result.get("views", {}).get(view)
        if block is None:
            continue
        out.append({"row": label, "hit@1": block["hit@1"], "hit@1_ci": block["ci95"]["hit@1"],
                    "hit@5": block["hit@5"], "hit@10": block["hit@10"], "hit@20": block["hit@20"],
                    "mrr": block["mrr"]})
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Spectrum evidence benchmark", "",
             f"Machine: {results['machine']}. Train on train_*, every choice on val_* with the val_formula256 and "
             "val_formula candidate sets, report on test_*.", ""]
    for key, run in results["runs"].items():
        lines += [f"## {key}", "", f"fit {run.get('fit_s', float('nan')):.0f} s", ""]
        for name, result in run.get("files", {}).items():
            lines += [f"### test_{name} ({result['n_queries']} queries, median {result['candidates']['median']} "
                      f"candidates, evaluate {result['evaluate_s']:.0f} s)", "",
                      "| row | hit@1 [95% CI] | hit@5 | hit@10 | hit@20 | MRR |", "|---|---|---:|---:|---:|---:|"]
            for r in rows(result):
                lines.append(f"| {r['row']} | {100 * r['hit@1']:.1f} [{100 * r['hit@1_ci'][0]:.1f}, "
                             f"{100 * r['hit@1_ci'][1]:.1f}] | {100 * r['hit@5']:.1f} | {100 * r['hit@10']:.1f} | "
                             f"{100 * r['hit@20']:.1f} | {r['mrr']:.3f} |")
            cal = result.get("calibration")
            if cal:
                fdr = cal["confident_at_fdr"]
                plain = cal.get("confident_at_fdr_plain")
                lines += ["", f"Calibration: ECE {cal['ece']:.3f} (10 bins); mean probability "
                              f"{cal['mean_probability']:.3f} vs hit@1 {cal['accuracy']:.3f}; {fdr['n_queries']} "
                              f"queries confident at estimated FDR <= 10% (observed FDR {fdr['observed_fdr']}, "
                              f"z {fdr.get('z', 0.0)})"
                              + (f"; plain estimate mean(1 - p): {plain['n_queries']} queries, observed FDR "
                                 f"{plain['observed_fdr']}" if plain else "") + "."]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the shared data directory (../shared/data)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--modes", default="positive,negative")
    parser.add_argument("--configs", default="default,baseline")
    parser.add_argument("--files", default="formula256,formula,mass")
    parser.add_argument("--n-boot", type=int, default=1000)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {"runs": {}}
    results["machine"] = f"{platform.machine()}, {__import__('os').cpu_count()} cores, python {platform.python_version()}"

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def save() -> None:
        results_path.write_text(json.dumps(results, indent=2, default=str))
        (args.out / "results.md").write_text(markdown(results))

    for mode in args.modes.split(","):
        for config_name in args.configs.split(","):
            key = f"{mode}/{config_name}"
            run = results["runs"].setdefault(key, {"config": CONFIGS[config_name]})
            bundle_path = args.out / "models" / f"{config_name}_{MODES[mode]}"
            if "fit_s" not in run:
                log(f"{key}: training")
                _, run["fit_s"] = train(args.data, mode, CONFIGS[config_name], bundle_path, log)
                save()
            for name in args.files.split(","):
                if name in run.get("files", {}):
                    continue
                log(f"{key}: evaluating on test_{name}")
                result = evaluate_file(args.data, mode, bundle_path, name, args.n_boot)
                result.pop("curve", None)
                run.setdefault("files", {})[name] = result
                save()
                for r in rows(result):
                    log(f"  {r['row']}: hit@1 {100 * r['hit@1']:.1f}, hit@10 {100 * r['hit@10']:.1f}, "
                        f"MRR {r['mrr']:.3f}")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
