"""Spectrum / structure evidence ablation (issue 12, items 2-3) on VALIDATION data only.

Usage::

    python benchmarks/evidence_ablation.py --out DIR [--data DIR] [--mode positive] [--configs NAME,...]
                                            [--m-x 2000] [--m-y 1000] [--lams 1e-4,1e-3,1e-2]

Protocol: train SISOKR on ``massbank/train_<mode>.mgf`` (read, labelled and cleaned by
:func:`molpredict.training.pipeline.load_labelled`), rank the ``val_<mode>.mgf`` spectra against
``candidates/val_formula256.json`` (every val spectrum whose structure has a set is one query; hit = InChIKey
first block). For each configuration the ridge parameter ``lam`` is chosen over ``--lams`` by the validation MRR
on the same candidate sets (the model's ranking-aware grid, ``select_by="mrr"``: the kernels and sketches are
fitted once for all lams); the kernel-loss choice is recorded too. Test data is never read.

Outputs under ``--out``: ``results.json`` (rewritten after every configuration) and ``results.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = {"positive": "pos", "negative": "neg"}
GT = "gaussian-tanimoto"
MKL = "mkl:kernels=ppk-losses+formula-annotation"
#: name -> (input kernel, output kernel)
CONFIGS: dict[str, tuple[str, str]] = {
    "ppk-losses (baseline)": ("ppk-losses", GT),
    "formula-annotation": ("formula-annotation", GT),
    "formula-annotation all explanations": ("formula-annotation:explanations=all", GT),
    "mkl uniform": (MKL + ",weights=uniform", GT),
    "mkl alignment": (MKL + ",weights=alignment", GT),
    "mkl alignf": (MKL + ",weights=alignf", GT),
    "mkl alignf +cosine": ("mkl:kernels=ppk-losses+formula-annotation+cosine,weights=alignf", GT),
    "ppk-losses / tanimoto (width: linear)": ("ppk-losses", "tanimoto"),
    "ppk-losses / multi-fingerprint morgan2+morgan1c+morgan3c": (
        "ppk-losses", "multi-fingerprint:fps=morgan2+morgan1c+morgan3c"),
    "ppk-losses / multi-fingerprint morgan2+maccs": ("ppk-losses", "multi-fingerprint:fps=morgan2+maccs"),
}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def load(mode: str, data: Path) -> dict[str, Any]:
    from benchmarks.identification import SharedSetSource
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.evaluate import collect_queries
    from molpredict.training.ranking_validation import ranking_candidates
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import read_spectra
    from molpredict.spectra.record import spectrum_ion_mode
    from molpredict.training.pipeline import TrainOptions, load_labelled

    tag = MODES[mode]
    t0 = time.perf_counter()
    options = TrainOptions(ion_modes=[mode])
    train = load_labelled([data / "massbank" / f"train_{tag}.mgf"], options)
    val = load_labelled([data / "massbank" / f"val_{tag}.mgf"], options)
    raw_val = [s for s in read_spectra(data / "massbank" / f"val_{tag}.mgf") if spectrum_ion_mode(s) == mode]
    shared = SharedSetSource()
    sets = load_candidate_sets(data / "candidates" / "val_formula256.json")
    wanted = {s.inchikey.split("-", 1)[0] for s in raw_val if s.inchikey}
    source = shared.make({k: v for k, v in sets.items() if k in wanted})
    queries, skipped = collect_queries(raw_val, source)
    queries.sort(key=lambda q: q.inchikey14)
    val_sets = {k: v for k, v in sets.items() if k in {m.inchikey14 for m in val.molecules[mode]}}
    fp_s = shared.precompute_fingerprints("morgan", 2, 2048, False)
    log(f"{mode}: {len(train.spectra[mode])} train, {len(val.spectra[mode])} val, {len(queries)} queries, "
        f"{len(source)} candidates; load {time.perf_counter() - t0:.0f} s, candidate Morgan bits {fp_s:.0f} s")
    return {"mode": mode, "train": (train.spectra[mode], train.molecules[mode]),
            "val": (val.spectra[mode], val.molecules[mode]), "queries": queries,
            "val_candidates": ranking_candidates(val.molecules[mode], val_sets), "source": source,
            "cleaning": CleaningPipeline().to_dict(), "skipped": dict(skipped)}


def run_config(name: str, spec: tuple[str, str], data: dict[str, Any], m_x: int, m_y: int, lams: list[float],
               seed: int = 0) -> dict[str, Any]:
    """Fit one configuration with lam chosen by the validation MRR on the val_formula256 sets (the model's own
    ranking-aware grid: every lam shares the fitted kernels and sketches), then rank the val queries."""
    from molpredict.identification.evaluate import rank_queries, summarize_ranks
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.modelfile import ModelBundle, SubModel
    from molpredict.models.base import ValidationData
    from molpredict.chem.molecules import DEFAULT_ADDUCTS
    from molpredict.training.pipeline import build_model

    inputs, molecules = data["train"]
    model = build_model("sisokr", {"input_kernel": spec[0], "output_kernel": spec[1],
                                   "input_sketch": f"subsample:m={m_x}", "output_sketch": f"subsample:m={m_y}",
                                   "lam": "|".join(repr(x) for x in lams), "seed": seed, "select_by": "mrr"})
    log(f"  {name}: fitting ({spec[0]} / {spec[1]}, m_x {m_x}, m_y {m_y})")
    t0 = time.perf_counter()
    model.fit(inputs, molecules, val=ValidationData(*data["val"], data["val_candidates"]))
    fit_s = time.perf_counter() - t0
    points = model.selection_["points"]
    record: dict[str, Any] = {
        "input_kernel": spec[0], "output_kernel": spec[1], "m_x": m_x, "m_y": m_y, "fit_s": round(fit_s, 1),
        "stages_s": {k: round(v, 1) for k, v in model.profile_["stages"].items()},
        "per_lam": {repr(p["lam"]): {"val_mrr": p.get("val_mrr"), "val_kernel_loss": p.get("val_loss")}
                    for p in points},
        "lam_by_mrr": float(model.lam_),
        "lam_by_kernel_loss": float(min(points, key=lambda p: p["val_loss"])["lam"]),
        "input_kernel_resolved": model.input_kernel_spec_, "output_kernel_resolved": model.output_kernel_spec_}
    for p in points:
        log(f"    lam {p['lam']:g}: val MRR {p.get('val_mrr', float('nan')):.4f}, kernel loss {p['val_loss']:.4f}")
    bundle = ModelBundle({data["mode"]: SubModel(model, data["mode"], cleaning=data["cleaning"],
                                                 adducts=[a.name for a in DEFAULT_ADDUCTS[data["mode"]]])})
    identifier = Identifier(bundle, data["source"], IdentifyOptions(), cache_root=False)
    t1 = time.perf_counter()
    metrics = summarize_ranks(rank_queries(identifier, data["queries"]), n_boot=0)
    record["identify_s"] = round(time.perf_counter() - t1, 1)
    record["best"] = {k: metrics[k] for k in ("hit@1", "hit@5", "hit@10", "mrr", "n_queries")}
    log(f"    -> lam {model.lam_:g}: hit@1 {100 * metrics['hit@1']:.1f}  hit@10 {100 * metrics['hit@10']:.1f}  "
        f"MRR {metrics['mrr']:.4f}  (fit {fit_s:.0f} s, identify {record['identify_s']} s)")
    return record


def format_markdown(results: dict[str, Any]) -> str:
    lines = ["| mode | configuration | input kernel | output kernel | m_x / m_y | lam (MRR) | lam (kernel loss) | "
             "fit s | hit@1 | hit@10 | MRR |", "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for key, r in results["configs"].items():
        if "best" not in r:
            continue
        b = r["best"]
        lines.append(f"| {r['mode']} | {r['name']} | `{r['input_kernel']}` | `{r['output_kernel']}` | {r['m_x']} / "
                     f"{r['m_y']} | {r['lam_by_mrr']:g} | {r['lam_by_kernel_loss']:g} | {r['fit_s']:.0f} | "
                     f"{100 * b['hit@1']:.1f} | {100 * b['hit@10']:.1f} | {b['mrr']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="the shared data directory (../shared/data)")
    parser.add_argument("--mode", default="positive", choices=list(MODES))
    parser.add_argument("--configs", default=None, help="comma-separated names of CONFIGS (default: all)")
    parser.add_argument("--extra", action="append", default=[],
                        help="NAME=INPUT_KERNEL@OUTPUT_KERNEL, an extra configuration (repeatable)")
    parser.add_argument("--m-x", type=int, default=2000)
    parser.add_argument("--m-y", type=int, default=1000)
    parser.add_argument("--lams", default="1e-6,1e-5,1e-4,1e-3")
    args = parser.parse_args(argv)
    configs = dict(CONFIGS)
    for extra in args.extra:
        name, _, pair = extra.partition("=")
        inp, _, outk = pair.partition("@")
        configs[name] = (inp, outk)
    chosen = list(CONFIGS) if args.configs is None else [c.strip() for c in args.configs.split(",") if c.strip()]
    chosen += [e.partition("=")[0] for e in args.extra if e.partition("=")[0] not in chosen]
    lams = [float(x) for x in args.lams.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {"configs": {}}
    data = load(args.mode, args.data)
    results.setdefault("data", {})[args.mode] = {"n_train": len(data["train"][0]), "n_val": len(data["val"][0]),
                                                 "n_queries": len(data["queries"]), "skipped": data["skipped"]}
    for name in chosen:
        key = f"{args.mode} | {name} | {args.m_x}/{args.m_y}"
        try:
            record = run_config(name, configs[name], data, args.m_x, args.m_y, lams)
        except Exception as exc:  # one failing configuration must not lose the others
            log(f"  {name}: FAILED {type(exc).__name__}: {exc}")
            record = {"error": f"{type(exc).__name__}: {exc}", "input_kernel": configs[name][0],
                      "output_kernel": configs[name][1]}
        record.update({"name": name, "mode": args.mode})
        results["configs"][key] = record
        path.write_text(json.dumps(results, indent=1, default=float))
        (args.out / "results.md").write_text(format_markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
