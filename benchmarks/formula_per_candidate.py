"""Spectra without a FORMULA: encoded once per candidate formula, or once without one? Writes JSON.

Usage::

    nice -n 10 python benchmarks/formula_per_candidate.py --model MODEL --data ../shared/data \\
        [--mode pos] [--split val] [--sets mass] [--out docs/benchmarks/formula_per_candidate.json]

Most query spectra a user brings carry no molecular formula, and the default input kernel reads one (the bags
of fragment and loss sub-formulas of ``formula-annotation``). This strips ``FORMULA`` from the labelled spectra
(``{split}_{mode}.mgf``) and ranks them against ``{split}_{set}.json`` three ways in one run: with their FORMULA
(the reference the benchmarks report), without it and encoded once (``--formula-per-candidate off``), and without
it encoded once per (candidate formula, adduct) with each candidate scored by its own (the default). Per way:
hit@1 [95% CI], hit@10, MRR of the fused ranking and of the spectrum evidence (``--prior off``), the prior alone,
ECE, and the evaluation's wall seconds. Every path is given explicitly (nothing defaults to the shared data).
"""
from __future__ import annotations

import json
import platform
import tempfile
from pathlib import Path
from typing import Any

from bundle_split_args import bundle_split_parser

WAYS = ("with FORMULA", "without, encoded once", "without, once per candidate formula")


def strip_formula(src: Path, dst: Path) -> Path:
    """A copy of an MGF file without its ``FORMULA=`` lines."""
    with open(src, encoding="utf-8") as handle, open(dst, "w", encoding="utf-8") as out:
        for line in handle:
            if not line.upper().startswith("FORMULA="):
                out.write(line)
    return dst


def rank(spectra: Path, sets: Any, bundle: Any, per_candidate: bool, n_boot: int) -> dict[str, Any]:
    from molpredict.identification.evaluate import evaluate

    result = evaluate([spectra], [("model", bundle)], sets, cache_root=False, n_boot=n_boot, kernel_loss=False,
                      formula_per_candidate=per_candidate)["model"]
    views = result.get("views", {})
    spectrum, prior = views.get("without_prior", {}), views.get("prior_alone", {})
    return {"fused": {"hit@1": result["hit@1"], "hit@1_ci": result["ci95"]["hit@1"], "hit@10": result["hit@10"],
                      "mrr": result["mrr"]},
            "spectrum evidence": {k: spectrum.get(k) for k in ("hit@1", "hit@10", "mrr")},
            "prior alone": {k: prior.get(k) for k in ("hit@1", "hit@10", "mrr")},
            "ece": (result.get("calibration") or {}).get("ece"), "n_queries": result["n_queries"],
            "time_s": result["time_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = bundle_split_parser(__doc__.splitlines()[0], ["mass"], "docs/benchmarks/formula_per_candidate.json")
    parser.add_argument("--n-boot", type=int, default=1000)
    args = parser.parse_args(argv)

    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.modelfile import ModelBundle

    bundle = ModelBundle.load(args.model)
    labelled = args.data / "massbank" / f"{args.split}_{args.mode}.mgf"
    results: dict[str, Any] = {"benchmark": "formula_per_candidate", "model": str(args.model), "split": args.split,
                               "mode": args.mode, "machine": f"{platform.machine()}, python {platform.python_version()}",
                               "sets": {}}
    with tempfile.TemporaryDirectory(prefix="formula-per-candidate-") as tmp:
        stripped = strip_formula(labelled, Path(tmp) / labelled.name)
        for name in args.sets:
            sets = load_candidate_sets(args.data / "candidates" / f"{args.split}_{name}.json")
            entry = {WAYS[0]: rank(labelled, sets, bundle, True, args.n_boot),
                     WAYS[1]: rank(stripped, sets, bundle, False, args.n_boot),
                     WAYS[2]: rank(stripped, sets, bundle, True, args.n_boot)}
            results["sets"][name] = entry
            for way in WAYS:
                row = entry[way]
                print(f"{args.split}_{name} | {way} | fused {100 * row['fused']['hit@1']:.2f} / "
                      f"{100 * row['fused']['hit@10']:.2f} / {row['fused']['mrr']:.4f} | spectrum evidence "
                      f"{100 * row['spectrum evidence']['hit@1']:.2f} / {row['spectrum evidence']['mrr']:.4f} | "
                      f"ECE {row['ece']} | {row['time_s']:.0f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
