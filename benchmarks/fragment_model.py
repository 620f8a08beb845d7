"""The learnt fragmentation model and the learnt fusion ranker on validation: each new term alone, then fused.

Usage::

    python benchmarks/fragment_model.py --data ../shared/data --terms formula256=VT256.npz --terms formula=VT.npz \\
        [--mode positive] [--n-train-structures 1000] [--n-val-structures 100] [--spectra-per-structure 2] \\
        [--out DIR] [--ranker-only]

Protocol (validation only; every number here is a choice, none is a test figure)
--------------------------------------------------------------------------------
- The fragment model (:class:`molpredict.chem.fragment_model.FragmentModel`, default parameters) is fitted on the
  spectra of ``--n-train-structures`` seeded structures of ``massbank/train_{pos,neg}.mgf``; its ion-level fit
  is reported on 20% of those structures held out (grouped by structure): weighted log-loss against a constant
  and the AUC of ions shown by most of a structure's spectra.
- Validation queries: ``--spectra-per-structure`` seeded spectra of each of ``--n-val-structures`` seeded
  structures of ``val_{pos,neg}.mgf``, ranked against their ``val_formula256`` and ``val_formula`` sets (a hit
  is the InChIKey first block; ties count against the truth).
- The spectrum model's and the prior's scores of those sets come from ``--terms NAME=FILE``: an npz per set
  file with ``offsets``, ``cand`` (candidate InChIKey first blocks), ``is_true``, ``qid`` (spectrum ids),
  ``qik`` (the truth's first block), ``spectrum``, ``prior``, as :func:`write_terms` writes them from a trained
  bundle (the default model as ``make demo`` trains it). The fragment score
  (:class:`~molpredict.chem.fragments.FragmentScorer`) and the fragment model's score are computed here.
- Rows: each term alone; the fusions (weights on the grid of :func:`~molpredict.identification.fusion.fit_fusion`,
  and the learnt ranker) with every combination of the new terms, each measured out of fold (3 folds by
  structure: fitted on two, ranked on the third) over both kinds of sets together, and per set kind.
- Costs: fragmenting + predicting per candidate structure (ms, CPU), scoring per query.

Outputs under ``--out``: ``fragment_model.json`` and ``fragment_model.md``.
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

MODES = {"positive": "pos", "negative": "neg"}
TERMS = ("spectrum", "prior", "fragments", "fragment_model")
#: (eps, absent_weight) of the fragment model's score tried alone (its ion groups are computed once)
SCORE_GRID = ((0.02, 0.0), (0.02, 0.005), (0.02, 0.02), (0.02, 0.1), (0.005, 0.005), (0.1, 0.005))
COMBINATIONS = (("spectrum", "prior"), ("spectrum", "prior", "fragments"), ("spectrum", "prior", "fragment_model"),
                ("spectrum", "prior", "fragments", "fragment_model"), ("spectrum", "fragment_model"))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write_terms(bundle_path: Path, mode: str, spectra_path: Path, sets_path: Path, out: Path) -> Path:
    """The spectrum model's and the prior's scores of every validation spectrum's candidate set, as the npz this
    benchmark reads (``--terms``)."""
    from collections import Counter

    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.candidate_sources import SetSource
    from molpredict.identification.evaluate import collect_queries, labelled_queries
    from molpredict.identification.evidence import Evidence
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.io import read_spectra
    from molpredict.modelfile import ModelBundle

    bundle = ModelBundle.load(bundle_path, ion_modes=[mode])
    identifier = Identifier(bundle, SetSource(dict(load_candidate_sets(sets_path))), IdentifyOptions(),
                            cache_root=False)
    labelled, _ = collect_queries(list(read_spectra(spectra_path)), identifier.source)
    prepared = labelled_queries(identifier, [(i, q.spectrum, q.inchikey14) for i, q in enumerate(labelled)])
    scored = list(identifier.scored(prepared))
    evidence = Evidence(identifier.coordinates, use_prior=True)
    columns: dict[str, list] = defaultdict(list)
    for start in range(0, len(scored), 256):
        chunk = scored[start:start + 256]
        for terms in evidence.terms([q for q, _ in chunk], [s for _, s in chunk], Counter(), wanted=["prior"]):
            for k, v in terms.items():
                columns[k].append(v)
    queries = [q for q, _ in scored]
    source = identifier.source
    np.savez(out, offsets=np.r_[0, np.cumsum([len(q.ids) for q in queries])],
             cand=np.concatenate([source.inchikey14(q.ids) for q in queries]).astype(str),
             is_true=np.concatenate([source.inchikey14(q.ids) == q.true_key for q in queries]),
             qid=np.array([q.spectrum.id for q in queries]), qik=np.array([q.true_key for q in queries]),
             **{k: np.concatenate(v) for k, v in columns.items()})
    return out


def fit_fragment_model(data: Path, mode: str, n_structures: int, seed: int, log) -> tuple[Any, dict[str, Any]]:
    from sklearn.metrics import roc_auc_score

    from molpredict.chem.fragment_model import FragmentModel, spectra_by_structure
    from molpredict.chem.molecules import Molecule
    from molpredict.io import read_spectra

    spectra = [s for s in read_spectra(data / "massbank" / f"train_{MODES[mode]}.mgf") if s.smiles and s.inchikey]
    first: dict[str, Molecule] = {}
    molecules = [first.setdefault(s.inchikey[:14], Molecule(s.smiles)) for s in spectra]
    pairs = spectra_by_structure(spectra, molecules, n_structures, seed)
    model = FragmentModel(seed=seed, cache_size=200_000)  # every candidate's ion groups kept for the grid
    t0, c0 = time.perf_counter(), cpu_s()
    x, y, w, g = model.training_data(pairs)
    data_s = cpu_s() - c0
    held = g >= int(0.8 * len(pairs))
    model.fit_arrays(x[~held], y[~held], w[~held])
    p = np.clip(model.predict_proba(x[held]), 1e-12, 1 - 1e-12)
    base = float(np.average(y[~held], weights=w[~held]))
    loss = float(np.average(-(y[held] * np.log(p) + (1 - y[held]) * np.log(1 - p)), weights=w[held]))
    const = float(np.average(-(y[held] * np.log(base) + (1 - y[held]) * np.log(1 - base)), weights=w[held]))
    auc = float(roc_auc_score(y[held] > 0.5, p, sample_weight=w[held]))
    model.fit_arrays(x, y, w)
    model.training_ = {"n_structures": len(pairs), "n_ions": int(x.shape[0])}
    report = {"n_structures": len(pairs), "n_spectra": sum(len(s) for _, s in pairs), "n_ion_rows": int(x.shape[0]),
              "held_out_structures": int(len(np.unique(g[held]))), "held_out_log_loss": loss,
              "constant_log_loss": const, "held_out_auc_shown_by_most": auc, "features_cpu_s": data_s,
              "fit_wall_s": time.perf_counter() - t0}
    log(f"fragment model: {report}")
    return model, report


def val_queries(data: Path, mode: str, sets: dict, n_structures: int, per: int, seed: int) -> list:
    from molpredict.io import read_spectra

    by = defaultdict(list)
    for s in read_spectra(data / "massbank" / f"val_{MODES[mode]}.mgf"):
        if s.inchikey and s.inchikey[:14] in sets:
            by[s.inchikey[:14]].append(s)
    rng = np.random.default_rng(seed)
    keys = sorted(by)
    chosen = sorted(rng.choice(keys, size=min(n_structures, len(keys)), replace=False).tolist())
    out = []
    for k in chosen:
        pick = rng.choice(len(by[k]), size=min(per, len(by[k])), replace=False)
        out += [by[k][i] for i in sorted(pick)]
    return out


def score_file(name: str, terms_path: Path, spectra: list, sets: dict, model: Any, log) -> tuple[dict, dict]:
    """Join the cached terms with the new ones for the chosen spectra: flat arrays of this file's queries."""
    from molpredict.chem.fragments import FragmentScorer

    cached = np.load(terms_path)
    row_of = {str(q): i for i, q in enumerate(cached["qid"])}
    offsets, cand = cached["offsets"], cached["cand"]
    scorer = FragmentScorer()
    out: dict[str, list] = defaultdict(list)
    sizes, groups, cost = [], [], {"fragments_cpu_s": 0.0, "fragment_model_cpu_s": 0.0, "n_candidates": 0}
    smiles_of = {k: dict(v) for k, v in sets.items()}
    for spectrum in spectra:
        i = row_of.get(spectrum.id)
        if i is None:
            continue
        a, b = int(offsets[i]), int(offsets[i + 1])
        keys = [str(k) for k in cand[a:b]]
        table = smiles_of[str(cached["qik"][i])]
        smiles = [table[k] for k in keys]
        c0 = cpu_s()
        out["fragments"].append(scorer.score(spectrum, smiles))
        c1 = cpu_s()
        out["fragment_model"].append(model.score(spectrum, smiles))
        cost["fragments_cpu_s"] += c1 - c0
        cost["fragment_model_cpu_s"] += cpu_s() - c1
        for eps, absent in SCORE_GRID:
            variant = {**model.get_params(), "eps": eps, "absent_weight": absent}
            alt = type(model)(**variant)
            alt.coef_, alt.mean_, alt.scale_, alt.intercept_ = model.coef_, model.mean_, model.scale_, model.intercept_
            alt.cache_ = model.cache_  # the same ion groups
            out[f"fragment_model eps={eps} absent_weight={absent}"].append(alt.score(spectrum, smiles))
        cost["n_candidates"] += b - a
        for t in ("spectrum", "prior"):
            out[t].append(cached[t][a:b])
        out["is_true"].append(cached["is_true"][a:b])
        sizes.append(b - a)
        groups.append(str(cached["qik"][i]))
    log(f"{name}: {len(sizes)} queries scored, {cost}")
    flat = {k: np.concatenate(v) for k, v in out.items()}
    for key in [k for k in flat if k.startswith("fragment_model")]:
        finite = np.isfinite(flat[key])  # an unparsable candidate: below every other
        flat[key] = np.where(finite, flat[key], (flat[key][finite].min() if finite.any() else 0.0) - 1.0)
    return {"offsets": np.r_[0, np.cumsum(sizes)].astype(np.int64), "groups": groups, "kind": [name] * len(sizes),
            **flat}, cost


def concatenate(parts: list[dict]) -> dict:
    offsets = [parts[0]["offsets"]]
    for p in parts[1:]:
        offsets.append(offsets[-1][-1] + p["offsets"][1:])
    out = {"offsets": np.concatenate(offsets), "groups": [g for p in parts for g in p["groups"]],
           "kind": [k for p in parts for k in p["kind"]]}
    for k in parts[0]:
        if k not in out:
            out[k] = np.concatenate([p[k] for p in parts])
    return out


def metrics_of(ranks: np.ndarray) -> dict[str, float]:
    return {"n_queries": int(ranks.size), "mrr": float(np.mean(1.0 / ranks)),
            **{f"hit@{k}": float(np.mean(ranks <= k)) for k in (1, 5, 10, 20)}}


def ablation(data: dict, seed: int, n_folds: int = 3, combinations: tuple = COMBINATIONS,
             alone: tuple = TERMS) -> dict[str, Any]:
    from molpredict.identification.fusion import fit_fusion_kind, true_ranks
    from molpredict.identification.calibration import grouped_folds as _folds
    from molpredict.training.ranking_validation import ValidationTerms

    vt = ValidationTerms(data["offsets"], data["is_true"], {t: data[t] for t in TERMS}, data["groups"])
    kinds = np.array(data["kind"])
    rows: dict[str, Any] = {}

    def per_kind(ranks: np.ndarray) -> dict[str, Any]:
        return {"all": metrics_of(ranks), **{k: metrics_of(ranks[kinds == k]) for k in sorted(set(kinds))}}

    for t in alone:
        rows[f"{t} alone"] = per_kind(true_ranks(vt.terms[t], vt.offsets, vt.is_true))
    for key in data:
        if key.startswith("fragment_model eps="):
            rows[f"{key} alone"] = per_kind(true_ranks(data[key], vt.offsets, vt.is_true))
    folds = _folds(vt.groups, n_folds, seed)
    for combo in combinations:
        for kind in ("weights", "ranker"):
            ranks = np.zeros(vt.n_queries, dtype=np.int64)
            chosen = []
            for k in range(n_folds):
                train_q, test_q = np.flatnonzero(folds != k), np.flatnonzero(folds == k)
                tr, te = vt.subset(train_q), vt.subset(test_q)
                fusion = fit_fusion_kind(kind, {t: tr.terms[t] for t in combo}, tr.offsets, tr.is_true)
                ranks[test_q] = true_ranks(fusion.combine_flat({t: te.terms[t] for t in combo}, te.offsets),
                                           te.offsets, te.is_true)
                chosen.append(fusion.weights if kind == "weights" else
                              dict(zip(fusion.ranker.features({t: te.terms[t] for t in combo}, te.offsets)[1],
                                       np.round(fusion.ranker.coef, 3).tolist())))
            rows[f"{' + '.join(combo)} ({kind}, out of fold)"] = {**per_kind(ranks), "fitted": chosen}
    return rows


def ranker_on_all_queries(term_files: list[tuple[str, Path]], seed: int) -> dict[str, Any]:
    """The fusion of the spectrum model and the prior on every query of the term files (no fragment terms, so no
    sampling): weights against the learnt ranker, out of fold (3 folds by structure), per set kind."""
    parts = []
    for name, path in term_files:
        cached = np.load(path)
        n = len(cached["offsets"]) - 1
        parts.append({"offsets": cached["offsets"].astype(np.int64), "groups": [str(g) for g in cached["qik"]],
                      "kind": [name] * n, "is_true": cached["is_true"], "spectrum": cached["spectrum"],
                      "prior": cached["prior"], "fragments": np.zeros(len(cached["is_true"])),
                      "fragment_model": np.zeros(len(cached["is_true"]))})
    rows = ablation(concatenate(parts), seed, combinations=(("spectrum", "prior"),), alone=("spectrum", "prior"))
    return rows


def table(rows: dict[str, Any]) -> list[str]:
    kinds = sorted({k for row in rows.values() for k in row if k not in ("all", "fitted")})
    header = "| row | " + " | ".join(f"{k} hit@1 | {k} hit@10 | {k} MRR" for k in ["all", *kinds]) + " |"
    lines = [header, "|---|" + "---:|" * (3 * (1 + len(kinds)))]
    for name, row in rows.items():
        cells = []
        for k in ["all", *kinds]:
            m = row[k]
            cells += [f"{100 * m['hit@1']:.1f}", f"{100 * m['hit@10']:.1f}", f"{m['mrr']:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    fm = results["fragment_model"]
    lines = ["# Learnt fragmentation model and fusion ranker on validation (`benchmarks/fragment_model.py`)", "",
             f"Machine: {results['machine']}. Mode {results['mode']}. Validation only: {results['n_queries']} "
             f"queries in all: up to {results['args']['spectra_per_structure']} seeded spectra of each of up to "
             f"{results['args']['n_val_structures']} seeded val structures, each spectrum ranked once against its "
             "val_formula256 set and once against its val_formula set; fusions out of fold (3 folds by "
             "structure). Ties count against the truth.", "",
             f"Fragment model: fitted on {fm['n_spectra']} spectra of {fm['n_structures']} training structures "
             f"({fm['n_ion_rows']} ion rows); on {fm['held_out_structures']} held-out structures log-loss "
             f"{fm['held_out_log_loss']:.4f} vs {fm['constant_log_loss']:.4f} for a constant, AUC "
             f"{fm['held_out_auc_shown_by_most']:.3f} (ions shown by most spectra).", ""]
    lines += table(results["rows"])
    if results.get("ranker_all_queries"):
        n = results["ranker_all_queries"]["spectrum alone"]["all"]["n_queries"]
        lines += ["", f"## The fusion ranker on every validation query ({n} queries, spectrum + prior)", "",
                  *table(results["ranker_all_queries"])]
    cost = results["cost"]
    lines += ["", "Cost (CPU seconds under the machine's load at the time): "
              + "; ".join(f"{name}: fragment score {c['fragments_cpu_s'] / max(c['n_candidates'], 1) * 1e3:.1f} ms, "
                          f"fragment model {c['fragment_model_cpu_s'] / max(c['n_candidates'], 1) * 1e3:.1f} ms per "
                          f"candidate ({c['n_candidates']} candidates, each structure fragmented once per process)"
                          for name, c in cost.items()), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--terms", action="append", required=True, help="NAME=FILE (npz of cached terms)")
    parser.add_argument("--mode", default="positive", choices=sorted(MODES))
    parser.add_argument("--n-train-structures", type=int, default=1000)
    parser.add_argument("--n-val-structures", type=int, default=100)
    parser.add_argument("--spectra-per-structure", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--ranker-only", action="store_true",
                        help="only the spectrum + prior fusion on every query of the term files (fast); merged "
                             "into an existing fragment_model.json under --out")
    args = parser.parse_args(argv)
    term_files = [(item.split("=", 1)[0], Path(item.split("=", 1)[1])) for item in args.terms]
    if args.ranker_only:
        path = args.out / "fragment_model.json"
        results = json.loads(path.read_text()) if path.is_file() else {}
        results["ranker_all_queries"] = ranker_on_all_queries(term_files, args.seed)
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, default=float))
        if "rows" in results:
            (args.out / "fragment_model.md").write_text(markdown(results))
        return 0

    from molpredict.chem.candidates import load_candidate_sets

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    model, fm_report = fit_fragment_model(args.data, args.mode, args.n_train_structures, args.seed, log)
    parts, cost = [], {}
    for item in args.terms:
        name, path = item.split("=", 1)
        sets = load_candidate_sets(args.data / "candidates" / f"val_{name}.json")
        spectra = val_queries(args.data, args.mode, sets, args.n_val_structures, args.spectra_per_structure,
                              args.seed)
        part, cost[name] = score_file(name, Path(path), spectra, sets, model, log)
        parts.append(part)
    data = concatenate(parts)
    results = {"machine": f"{platform.machine()}, {platform.system()}, python {platform.python_version()}",
               "mode": args.mode, "args": {k: str(v) for k, v in vars(args).items()},
               "n_queries": int(len(data["offsets"]) - 1), "fragment_model": fm_report, "cost": cost,
               "rows": ablation(data, args.seed), "ranker_all_queries": ranker_on_all_queries(term_files, args.seed)}
    results["args"]["spectra_per_structure"] = args.spectra_per_structure
    results["args"]["n_val_structures"] = args.n_val_structures
    (args.out / "fragment_model.json").write_text(json.dumps(results, indent=1, default=float))
    (args.out / "fragment_model.md").write_text(markdown(results))
    log(f"wrote {args.out / 'fragment_model.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
