"""Calibration FDR benchmark: does "confident at an estimated FDR <= 10%" hold on structures the model never saw?

Usage::

    python benchmarks/calibration_fdr.py --data ../shared/data --bundle positive=DIR --bundle negative=DIR
                                         --out DIR --split val|test [--cache DIR] [--n-boot 200]

Protocol (seeded; every choice made on validation data, test measured once at the end)
--------------------------------------------------------------------------------------
- ``--bundle MODE=DIR``: trained bundles (e.g. the default model of each ion mode). The model is never retrained;
  only its fusion and calibration are refitted on val.
- ``val`` (diagnosis and choice; grouped out-of-fold, nothing from test): each val spectrum ranks once per
  candidate file (``val_formula256``, ``val_formula``, ``val_mass``); folds by structure. For each calibration
  *setup* (which val sets the calibration is fitted on, which weightings of structures it may use; the fusion is
  always fitted on the formula256 and formula sets, as the default training does, of the kind ``fit_scoring``
  chooses: fixed weights or the learnt ranker) and each scoring variant (with
  and without the prior), every query gets a probability from a fusion and a calibrator that never saw its
  structure. Per set kind: ECE per spectrum and per structure, mean probability vs accuracy, the plain
  ``confident_at_fdr`` list at 10% (observed FDR per spectrum and per structure, how concentrated its wrong calls
  are by structure) and, for each ``z`` of the grid, the list of the FDR bound over rank-1 structures
  (:func:`molpredict.identification.calibration.fdr_estimates`) with its structure-bootstrap distribution of the
  observed FDR (:func:`~molpredict.identification.calibration.bootstrap_observed_fdr`: what a new set of
  structures of val's size would see). The ``z`` rule: the smallest ``z`` of the grid at which the bootstrap 90%
  quantile of the observed FDR is <= 12% for every ion mode and set kind of the chosen setup's default (with
  prior) variant where some ``z`` of the grid reaches it.
- ``test``: the chosen setup (fusion on formula256 + formula, calibration also on mass, both weightings, the FDR
  bound with the library's ``FDR_Z``) refitted on val for each bundle, then evaluated once on
  ``massbank/test_*.mgf`` against ``candidates/test_{formula256,formula,mass}.json``, beside the bundle as it is
  (its own calibration, the plain estimate) in the same run.

Outputs under ``--out``: ``calibration_fdr.json`` and ``calibration_fdr.md`` (both splits, each run adds its own).
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
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = {"positive": "pos", "negative": "neg"}
KINDS = ("formula256", "formula", "mass")
FUSION_ON = ("formula256", "formula")
Z_GRID = (0.0, 0.5, 1.0, 1.28, 1.64, 2.0, 2.5, 3.0, 4.0)
FDR_TARGET = 0.12
#: setup name -> (val sets the calibration is fitted on, weightings it may use)
SETUPS = {
    "before": (("formula256", "formula"), ("structure",)),
    "sqrt_weighting": (("formula256", "formula"), ("structure", "sqrt_structure")),
    "chosen": (("formula256", "formula", "mass"), ("structure", "sqrt_structure")),
}
VARIANTS = {"with_prior": ("spectrum", "prior"), "without_prior": ("spectrum",)}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- val: scoring with the candidates' keys (the rank-1 structure is the FDR bound's cluster) ------------------
def score_val(data: Path, bundle_path: Path, mode: str, kind: str, cache: Any) -> tuple[Any, np.ndarray]:
    """The :class:`ValidationTerms` of val spectra of ``mode`` against ``val_{kind}.json`` (as training scores
    them, with the bundle's second-pass terms) and every candidate's InChIKey first block (flat, aligned with
    them)."""
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.candidate_sources import SetSource
    from molpredict.identification.fusion import PRIOR
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.io import read_spectra
    from molpredict.modelfile import ModelBundle
    from molpredict.training.ranking_validation import validation_terms

    sub = ModelBundle.load(bundle_path, ion_modes=[mode]).models[mode]
    source = SetSource(dict(load_candidate_sets(data / "candidates" / f"val_{kind}.json")))
    identifier = Identifier(ModelBundle({mode: sub}), source, IdentifyOptions(), cache_root=cache)
    spectra = list(read_spectra(data / "massbank" / f"val_{MODES[mode]}.mgf"))
    terms = validation_terms(identifier, spectra, [PRIOR] if sub.prior is not None else [])
    return second_pass_terms(sub, terms), np.array([m.inchikey14 for m in terms.molecules], dtype=str)


def second_pass_terms(sub: Any, data: Any) -> Any:
    """``data`` with the fragmentation terms on the top 32 of each of the bundle's first passes, as training
    computes them (unchanged for a bundle without a second pass)."""
    from molpredict.identification.fusion import ScoreFusion
    from molpredict.training.ranking_validation import RERANK_SIZES, add_second_pass_terms, second_pass_scorers

    fusions = [ScoreFusion.from_dict(v["fusion"]) for v in (sub.scoring or {}).values()]
    if not any(f.rerank is not None for f in fusions):
        return data
    return add_second_pass_terms(data, second_pass_scorers(sub), [f.first_pass(data.terms, data.offsets)
                                                                  for f in fusions], max(RERANK_SIZES))


def out_of_fold(data: Any, keys: np.ndarray, fusion_mask: np.ndarray, calibration_mask: np.ndarray,
                weightings: tuple[str, ...], seed: int = 0, n_folds: int = 5) -> dict[str, Any]:
    """Out-of-fold probability, correctness and rank-1 structure of every query under the calibrator
    :func:`fit_scoring` chooses on ``calibration_mask`` queries (fusion on ``fusion_mask`` ones): fold fusions
    and fold calibrators never see the query's structure."""
    from molpredict.identification.calibration import (ALL_FEATURES, WEIGHTINGS, Calibrator, grouped_folds,
                                                       structure_weights, top_index_flat)
    from molpredict.identification.fusion import RERANK_TERMS, fit_fusion_kind
    from molpredict.training.ranking_validation import RERANK_SIZES, calibration_data, fit_scoring

    chosen_on = data.subset(np.flatnonzero(calibration_mask))
    fitted, calibrator, report = fit_scoring(chosen_on, seed=seed, fusion_queries=fusion_mask[calibration_mask],
                                             weightings=weightings, rerank_ks=RERANK_SIZES)
    fusion_kind = report["fusion_kind"]  # weights or the learnt ranker, as fit_scoring chooses it
    # a second pass as fit_scoring chose it (the fragmentation terms it does not read are left out)
    rerank_k = fitted.rerank.k if fitted.rerank is not None else None
    data = data.view([t for t in data.terms if t not in RERANK_TERMS or t in fitted.rerank_terms])
    folds = grouped_folds(data.groups, n_folds, seed)
    features = np.zeros((data.n_queries, len(ALL_FEATURES)))
    correct = np.zeros(data.n_queries, dtype=bool)
    rank1 = np.empty(data.n_queries, dtype=object)
    for k in range(n_folds):
        train_q, test_q = np.flatnonzero((folds != k) & fusion_mask), np.flatnonzero(folds == k)
        tr, te = data.subset(train_q), data.subset(test_q)
        fusion = fit_fusion_kind(fusion_kind, tr.terms, tr.offsets, tr.is_true, metric="mrr", rerank_k=rerank_k)
        fused = fusion.combine_flat(te.terms, te.offsets)
        features[test_q], correct[test_q], _ = calibration_data(te, fused, fusion.temperature)
        flat = np.concatenate([np.arange(data.offsets[q], data.offsets[q + 1]) for q in test_q])
        rank1[test_q] = keys[flat][top_index_flat(fused, te.offsets)]
    columns = features[:, [ALL_FEATURES.index(n) for n in calibrator.features]]
    power = WEIGHTINGS[calibrator.validation.get("weighting", "structure")]
    groups = np.asarray(data.groups, dtype=object)
    folds = grouped_folds(data.groups, n_folds, seed + 1)
    probability = np.zeros(data.n_queries)
    for k in range(n_folds):
        train = (folds != k) & calibration_mask
        fold = Calibrator.fit(columns[train], correct[train], structure_weights(groups[train], power),
                              calibrator.method, calibrator.features)
        probability[folds == k] = fold.predict(columns[folds == k])
    return {"probability": probability, "correct": correct, "rank1": rank1.astype(str),
            "fusion_kind": fusion_kind, "rerank_k": rerank_k, "rerank_terms": list(fitted.rerank_terms),
            "calibrator": {"method": calibrator.method, "features": list(calibrator.features),
                           "weighting": calibrator.validation.get("weighting"),
                           "feature_set": calibrator.validation.get("feature_set")},
            "compared": report["calibration"]["compared"]}


def kind_table(p: np.ndarray, correct: np.ndarray, groups: np.ndarray, rank1: np.ndarray, n_boot: int
               ) -> dict[str, Any]:
    """The reliability and FDR figures of one set kind's out-of-fold queries (JSON-ready)."""
    from molpredict.identification.calibration import (bootstrap_observed_fdr, confident_at_fdr,
                                                       expected_calibration_error, reliability_curve,
                                                       structure_weights)

    w = structure_weights(list(groups))
    out: dict[str, Any] = {
        "n_queries": int(len(p)), "n_structures": len(set(groups)), "accuracy": float(correct.mean()),
        "mean_probability": float(p.mean()), "ece": expected_calibration_error(p, correct),
        "ece_per_structure": expected_calibration_error(p, correct, weights=w),
        "accuracy_per_structure": float(np.average(correct, weights=w)),
        "mean_probability_per_structure": float(np.average(p, weights=w)),
        "reliability": reliability_curve(p, correct), "reliability_per_structure": reliability_curve(p, correct,
                                                                                                    weights=w)}
    for z in Z_GRID:
        n, threshold = confident_at_fdr(p, 0.1, rank1, z)
        reported = p >= threshold if n else np.zeros(len(p), dtype=bool)
        wrong = reported & ~correct
        _, counts = np.unique(groups[wrong], return_counts=True)
        counts = np.sort(counts)[::-1]
        boot = bootstrap_observed_fdr(p, correct, groups, rank1, z, 0.1, n_boot, seed=0)
        out[f"z={z:g}"] = {
            "n_reported": int(reported.sum()), "n_structures": len(set(groups[reported])),
            "estimated_fdr_plain": float(np.mean(1 - p[reported])) if reported.any() else None,
            "observed_fdr": float(1 - correct[reported].mean()) if reported.any() else None,
            "observed_fdr_per_structure": float(1 - np.average(correct[reported], weights=w[reported]))
            if reported.any() else None,
            "wrong": int(wrong.sum()), "wrong_structures": int(len(counts)),
            "wrong_top5_share": float(counts[:5].sum() / max(1, wrong.sum())),
            "bootstrap": {k: v for k, v in boot.items() if k not in ("observed", "n_reported")},
            "bootstrap_mean_reported": float(np.mean(boot["n_reported"]))}
    return out


def choose_z(tables: dict[str, Any]) -> dict[str, Any]:
    """The smallest z of :data:`Z_GRID` whose bootstrap 90% quantile is <= 12% on every (mode, kind) table where
    some z reaches it; the unreachable ones are listed."""
    reachable, unreachable = [], []
    for key, table in tables.items():
        ok = [z for z in Z_GRID if table[f"z={z:g}"]["bootstrap"]["q90"] <= FDR_TARGET]
        (reachable if ok else unreachable).append((key, min(ok) if ok else None))
    z = max((v for _, v in reachable), default=0.0)
    return {"z": z, "per_table": dict(reachable), "unreachable": [k for k, _ in unreachable],
            "rule": "smallest z of the grid at which the structure-bootstrap q90 of the observed FDR at an asked "
                    "10% is <= 12% on every mode x set kind (default variant, chosen setup) where some z reaches it"}


def run_val(args: argparse.Namespace, results: dict[str, Any], save, log) -> None:
    for mode, bundle in args.bundle.items():
        t0, c0 = time.perf_counter(), cpu_s()
        from molpredict.identification.fusion import RERANK_TERMS
        from molpredict.training.ranking_validation import ValidationTerms

        parts = [score_val(args.data, bundle, mode, kind, args.cache) for kind in KINDS]
        data = ValidationTerms.concatenate([d for d, _ in parts])
        keys = np.concatenate([k for _, k in parts])
        kind = np.concatenate([[name] * d.n_queries for name, (d, _) in zip(KINDS, parts)])
        groups = np.asarray(data.groups)
        log(f"{mode}: scored val ({data.n_queries} queries) in {time.perf_counter() - t0:.0f} s")
        for setup, (calibrate_on, weightings) in SETUPS.items():
            if setup not in args.setups:
                continue
            for variant, names in VARIANTS.items():
                if not set(names) <= set(data.terms):
                    continue
                second = [t for t in data.terms if t in RERANK_TERMS]  # the second pass's, when the bundle has one
                view = data.view([*names, *second])
                oof = out_of_fold(view, keys, np.isin(kind, FUSION_ON), np.isin(kind, calibrate_on), weightings)
                entry = {"fusion_kind": oof["fusion_kind"], "calibrator": oof["calibrator"],
                         "rerank_k": oof["rerank_k"], "rerank_terms": oof["rerank_terms"],
                         "calibrate_on": list(calibrate_on),
                         "weightings": list(weightings), "compared": oof["compared"], "kinds": {}}
                for name in KINDS:
                    m = kind == name
                    entry["kinds"][name] = kind_table(oof["probability"][m], oof["correct"][m], groups[m],
                                                      oof["rank1"][m], args.n_boot)
                results.setdefault("val", {})[f"{mode}/{setup}/{variant}"] = entry
                save()
                log(f"  {mode} {setup} {variant}: {entry['calibrator']}")
        results.setdefault("timings", {})[f"val/{mode}"] = {"wall_s": time.perf_counter() - t0,
                                                            "cpu_s": cpu_s() - c0}
    tables = {f"{key.split('/')[0]}/{k}": v for key, entry in results["val"].items()
              if key.endswith("/chosen/with_prior") for k, v in entry["kinds"].items()}
    results["z_choice"] = choose_z(tables)
    save()


def run_test(args: argparse.Namespace, results: dict[str, Any], save, log) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import calibration as bench  # benchmarks/calibration.py: recalibrate, evaluate_file

    calibrate_on = [k for k in SETUPS["chosen"][0] if k not in FUSION_ON]
    for mode, bundle in args.bundle.items():
        recalibrated = args.out / "models" / mode
        if not (recalibrated / "bundle.json").exists():
            t0, c0 = time.perf_counter(), cpu_s()
            fits = bench.recalibrate(args.data, bundle, recalibrated, list(FUSION_ON), args.cache, log, calibrate_on)
            results.setdefault("fits", {})[mode] = {
                variant: {k: v for k, v in report["calibration"].items() if k != "compared"}
                for variant, report in fits[mode]["report"].items()}
            results.setdefault("timings", {})[f"refit/{mode}"] = {"wall_s": time.perf_counter() - t0,
                                                                  "cpu_s": cpu_s() - c0}
            save()
        for name in KINDS:
            for label, path in (("before", bundle), ("after", recalibrated)):
                key = f"{mode}/{name}/{label}"
                if key in results.setdefault("test", {}):
                    continue
                log(f"evaluating {key} on test")
                results["test"][key] = bench.evaluate_file(args.data, mode, path, "test", name, args.cache,
                                                           args.n_boot)
                save()


def pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Calibration FDR benchmark ({' and '.join(results.get('splits', []))})", "",
             f"Machine: {results['machine']}. Bundles: "
             + ", ".join(f"{k} {v}" for k, v in results.get("bundles", {}).items()) + ".", ""]
    if results.get("timings"):
        lines += ["Timings (2 shared cores, load from other sessions): " + "; ".join(
            f"{k} {v['wall_s']:.0f} s wall, {v['cpu_s']:.0f} s CPU" for k, v in results["timings"].items()) + ".", ""]
    if results.get("val"):
        lines += ["Out-of-fold on val (folds by structure; fusion and calibrator never saw the query's structure). "
                  "`boot q50/q90` and `P>12%`: the observed FDR at an asked 10% over 200 structure resamples.", ""]
        for key, entry in results["val"].items():
            cal = entry["calibrator"]
            lines += [f"## {key}", "", f"Fusion: {entry.get('fusion_kind', 'weights')} (fitted on formula256 + "
                      f"formula). Calibration fitted on {', '.join(entry['calibrate_on'])} "
                      f"(weightings {', '.join(entry['weightings'])}); chosen {cal['feature_set']} / {cal['method']} "
                      f"/ {cal['weighting']}.", "",
                      "| set | queries / structures | acc | mean p | ECE | ECE per structure | z | confident "
                      "(queries / structures) | observed FDR | per structure | wrong (structures, top-5 share) | "
                      "boot q50 | boot q90 | P>12% |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for name, t in entry["kinds"].items():
                for z in (0.0, 1.28, 2.0, 2.5, 3.0):
                    r = t[f"z={z:g}"]
                    b = r["bootstrap"]
                    lines.append(f"| {name} | {t['n_queries']} / {t['n_structures']} | {pct(t['accuracy'])} | "
                                 f"{pct(t['mean_probability'])} | {t['ece']:.3f} | {t['ece_per_structure']:.3f} | "
                                 f"{z:g} | {r['n_reported']} / {r['n_structures']} | {pct(r['observed_fdr'])} | "
                                 f"{pct(r['observed_fdr_per_structure'])} | {r['wrong']} ({r['wrong_structures']}, "
                                 f"{r['wrong_top5_share']:.2f}) | {pct(b['q50'])} | {pct(b['q90'])} | "
                                 f"{b['p_above']:.2f} |")
            lines.append("")
        if results.get("z_choice"):
            c = results["z_choice"]
            lines += [f"**z choice**: {c['rule']}: z = {c['z']:g} (per table: "
                      + ", ".join(f"{k} {v:g}" for k, v in c["per_table"].items())
                      + f"; unreachable in the grid: {', '.join(c['unreachable']) or 'none'}).", ""]
    if results.get("test"):
        lines += ["## Test (measured once, after every choice was made on val)", "",
                  "`before`: the bundle as trained (its own calibration, plain estimate); `after`: fusion refitted on "
                  "val formula256 + formula, calibration on val formula256 + formula + mass (structure weighting "
                  "chosen among per structure / sqrt), FDR bound over rank-1 structures; `after, plain`: the same "
                  "probabilities with the plain estimate mean(1 - p).", "",
                  "| mode | set | row | hit@1 | mean p | ECE | ECE per structure | confident (queries / structures) "
                  "| est. FDR (plain) | observed FDR | observed FDR per structure | <= 12% |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for key, result in results["test"].items():
            mode, name, label = key.split("/")
            cal = result.get("calibration") or {}
            blocks = [(label, cal.get("confident_at_fdr", {}))]
            if label == "after":
                blocks.append(("after, plain", cal.get("confident_at_fdr_plain", {})))
            for row_label, fdr in blocks:
                held = fdr.get("observed_fdr")
                verdict = "-" if held is None else ("yes" if held <= FDR_TARGET else "**no**")
                lines.append(f"| {mode} | {name} | {row_label} | {pct(result['hit@1'])} | "
                             f"{pct(cal.get('mean_probability'))} | {cal.get('ece', float('nan')):.3f} | "
                             f"{cal.get('per_structure', {}).get('ece', float('nan')):.3f} | "
                             f"{fdr.get('n_queries', 0)} / {fdr.get('n_structures', 0)} | "
                             f"{pct(fdr.get('estimated_fdr'))} | {pct(held)} | "
                             f"{pct(fdr.get('observed_fdr_per_structure'))} | {verdict} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the shared data directory (../shared/data)")
    parser.add_argument("--bundle", required=True, action="append", help="MODE=DIR (positive=..., negative=...)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--split", required=True, choices=["val", "test"])
    parser.add_argument("--cache", type=Path, default=None, help="candidate coordinates cache (default: none)")
    parser.add_argument("--n-boot", type=int, default=200)
    parser.add_argument("--setups", default=",".join(SETUPS),
                        help=f"val calibration setups to run (comma-separated, of {', '.join(SETUPS)})")
    args = parser.parse_args(argv)
    args.setups = [s for s in args.setups.split(",") if s]
    if set(args.setups) - set(SETUPS):
        parser.error(f"--setups must be among {', '.join(SETUPS)}")
    args.bundle = dict(item.split("=", 1) for item in args.bundle)
    if set(args.bundle) - set(MODES):
        parser.error(f"--bundle modes must be among {', '.join(MODES)}")
    args.bundle = {mode: Path(path) for mode, path in args.bundle.items()}
    args.cache = args.cache if args.cache is not None else False
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "calibration_fdr.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    results.update({"splits": sorted(set(results.get("splits", [])) | {args.split}),
                    "bundles": {k: str(v) for k, v in args.bundle.items()},
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"})

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def save() -> None:
        path.write_text(json.dumps(results, indent=1, default=str))
        (args.out / "calibration_fdr.md").write_text(markdown(results))

    (run_val if args.split == "val" else run_test)(args, results, save, log)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
