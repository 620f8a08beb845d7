"""In-silico fragment scoring (molpredict.chem.fragments): fragmentation time per structure, scoring speed, and the
identification accuracy of the fragment score alone on labelled spectra against candidate sets. Writes JSON.

Usage::

    python benchmarks/fragments.py --spectra ../shared/data/massbank/val_pos.mgf \\
        --candidates ../shared/data/candidates/val_formula256.json [--n-structures 250] [--seed 0] \\
        [--store-dir DIR] [--search] [--fusion SCORES.npz] [--out fragments.json]

A query is a spectrum whose structure has a candidate set; a hit is a match of the InChIKey first block, ties
count against the truth (the ``worst`` policy), so candidate order does not matter. ``--n-structures`` draws
that many query structures (seeded) and ``--max-queries`` of their spectra (seeded). ``--search`` tunes the scorer's settings by
coordinate ascent on MRR (run it on validation only). ``--fusion`` reads a file of per-candidate model and
prior scores (``offsets, cand_ik14, spectrum_score, prior_score, is_true, query_id``) and reports what adding
the fragment score (z-scored within each candidate set, weights on a grid) gives, in-sample and two-fold
cross-fitted by structure. ``--store-dir`` keeps the fragment sets of the candidates (derived data: keep it
out of the repository) so that a rerun fragments nothing.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from molpredict.engine.decoding import query_metrics, true_rank_counts  # noqa: E402
from molpredict.chem.fragments import (FragmentScorer, fragment_structure, load_fragment_sets,  # noqa: E402
                                  save_fragment_sets)

SEARCH_SPACE = {
    "max_depth": [1, 2],
    "max_h_shift": [0, 1, 2, 3],
    "tolerance_ppm": [5.0, 10.0, 20.0],
    "min_tolerance_da": [0.002, 0.005, 0.01],
    "intensity_power": [0.0, 0.25, 0.5, 1.0],
    "mz_power": [0.0, 0.5, 1.0, 2.0],
    "depth_penalty": [1.0, 0.75, 0.5, 0.25],
    "carbon_bond_penalty": [1.0, 0.75, 0.5],
    "aromatic_bond_penalty": [1.0, 0.5, 0.25],
    "multiple_bond_penalty": [1.0, 0.5, 0.25],
    "h_shift_penalty": [1.0, 0.75, 0.5],
    "h_shift_per_bond": [False, True],
}


def _fragment_chunk(args: tuple[list[str], int]) -> list:
    smiles, depth = args
    out = []
    for s in smiles:
        try:
            out.append(fragment_structure(s, depth))
        except Exception:  # noqa: BLE001 - an unparsable candidate scores 0, counted in the report
            out.append(None)
    return out


def fragment_all(smiles: list[str], depth: int, jobs: int) -> list:
    """Fragment sets of every SMILES; with jobs=2 one extra process takes half."""
    if jobs <= 1 or len(smiles) < 100:
        return _fragment_chunk((smiles, depth))
    half = len(smiles) // 2
    with ProcessPoolExecutor(max_workers=1) as pool:
        future = pool.submit(_fragment_chunk, (smiles[half:], depth))
        first = _fragment_chunk((smiles[:half], depth))
        return first + future.result()


def time_fragmentation(smiles: list[str], depths: list[int]) -> dict:
    from molpredict.chem.molecules import Molecule
    out = {}
    for depth in depths:
        n_frag = []
        start = time.perf_counter()
        for s in smiles:
            n_frag.append(fragment_structure(Molecule(s), depth).n_fragments)
        seconds = time.perf_counter() - start
        out[f"depth{depth}"] = {"ms_per_structure": 1e3 * seconds / len(smiles),
                                "median_fragments": float(np.median(n_frag)), "max_fragments": int(max(n_frag))}
    return out


def metrics(n_greater: list, n_ties: list, found: list, n_cand: list) -> dict:
    m = query_metrics(np.array(n_greater), np.array(n_ties), np.array(found), np.array(n_cand), ks=(1, 5, 10),
                      policy="worst")
    return {"hit@1": float(m["hit@1"].mean()), "hit@5": float(m["hit@5"].mean()),
            "hit@10": float(m["hit@10"].mean()), "mrr": float(m["rr"].mean()), "n_queries": len(found)}


# What a forked worker needs to score queries (inherited, not pickled): the queries, candidate sets, store.
_SHARED: dict = {}


def _rank_counts(params: dict, queries: list) -> list[tuple[int, int, bool, int]]:
    scorer = FragmentScorer(**params)
    scorer.store_ = _SHARED["store"]
    out = []
    for spectrum, key in queries:
        keys, mols = _SHARED["sets"][key]
        scores = scorer.score(spectrum, mols)
        out.append((*true_rank_counts(scores, keys == key), len(keys)))
    return out


def _rank_counts_part(params: dict, part: int, n_parts: int) -> list:
    return _rank_counts(params, _SHARED["queries"][part::n_parts])


def evaluate(params: dict, queries: list, pool: ProcessPoolExecutor | None = None) -> tuple[dict, float]:
    """Metrics of the fragment score with ``params`` over ``queries`` (half in ``pool``'s worker when given;
    the queries must then be ``_SHARED["queries"]``), and queries scored per second."""
    start = time.perf_counter()
    if pool is None:
        rows = _rank_counts(params, queries)
    else:
        future = pool.submit(_rank_counts_part, params, 1, 2)
        rows = _rank_counts(params, queries[0::2]) + future.result()
    seconds = time.perf_counter() - start
    g, t, f, n = zip(*rows)
    return metrics(list(g), list(t), list(f), list(n)), len(queries) / seconds


def zscore(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for a, b in zip(offsets[:-1], offsets[1:]):
        seg = x[a:b]
        sd = seg.std()
        out[a:b] = (seg - seg.mean()) / sd if sd > 0 else 0.0
    return out


def fusion_metrics(fused: np.ndarray, is_true: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> dict:
    g, t, f, n = [], [], [], []
    for q in rows:
        a, b = offsets[q], offsets[q + 1]
        x, y, z = true_rank_counts(fused[a:b], is_true[a:b])
        g.append(x), t.append(y), f.append(z), n.append(b - a)
    return metrics(g, t, f, n)


def fusion(path: str, scorer: FragmentScorer, spectra_by_id: dict, smiles_of: dict, allowed: set) -> dict:
    with np.load(path) as data:
        offsets = data["offsets"]
        cand = data["cand_ik14"]
        model = data["spectrum_score"]
        prior = data["prior_score"]
        is_true = data["is_true"]
        qid = data["query_id"]
        qik = data["query_ik14"]
    rows = np.array([q for q in range(len(qid)) if qik[q] in allowed and qid[q] in spectra_by_id])
    frag = np.zeros_like(model)
    for q in rows:
        a, b = offsets[q], offsets[q + 1]
        frag[a:b] = scorer.score(spectra_by_id[qid[q]], [smiles_of[k] for k in cand[a:b]])
    # Only the rows evaluated matter; z-score every set (others are zeros, harmless).
    zm, zp, zf = zscore(model, offsets), zscore(prior, offsets), zscore(frag, offsets)
    prior_w = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0]
    frag_w = [0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0]

    def best(sub: np.ndarray, use_frag: bool) -> tuple[float, float]:
        top, arg = -1.0, (0.0, 0.0)
        for wp in prior_w:
            for wf in (frag_w if use_frag else [0.0]):
                mrr = fusion_metrics(zm + wp * zp + wf * zf, is_true, offsets, sub)["mrr"]
                if mrr > top:
                    top, arg = mrr, (wp, wf)
        return arg

    out = {"n_queries": int(len(rows)),
           "model_alone": fusion_metrics(model, is_true, offsets, rows),
           "prior_alone": fusion_metrics(prior, is_true, offsets, rows),
           "fragments_alone": fusion_metrics(frag, is_true, offsets, rows)}
    for name, use in (("model+prior", False), ("model+prior+fragments", True)):
        wp, wf = best(rows, use)
        out[name] = {"weights": {"prior": wp, "fragments": wf},
                     "in_sample": fusion_metrics(zm + wp * zp + wf * zf, is_true, offsets, rows)}
    # Two-fold cross-fit by structure: weights chosen on one half of the structures, measured on the other.
    structures = np.unique(qik[rows])
    rng = np.random.default_rng(0)
    half = set(rng.permutation(structures)[:len(structures) // 2].tolist())
    fold = np.array([qik[q] in half for q in rows])
    for name, use in (("model+prior", False), ("model+prior+fragments", True)):
        fused = np.zeros_like(model)
        chosen = []
        for k in (True, False):
            wp, wf = best(rows[fold == k], use)
            chosen.append({"prior": wp, "fragments": wf})
            for q in rows[fold != k]:
                a, b = offsets[q], offsets[q + 1]
                fused[a:b] = zm[a:b] + wp * zp[a:b] + wf * zf[a:b]
        out[name]["cross_fitted"] = fusion_metrics(fused, is_true, offsets, rows)
        out[name]["cross_fitted_weights"] = chosen
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spectra", required=True, help="validation spectra (../shared/data/massbank/val_pos.mgf)")
    parser.add_argument("--candidates", required=True,
                        help="their candidate sets (../shared/data/candidates/val_formula256.json)")
    parser.add_argument("--n-structures", type=int, default=250, help="query structures drawn (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-queries", type=int, default=1000, help="seeded subsample of their spectra (0: all)")
    parser.add_argument("--store-depth", type=int, default=2, help="fragment the candidates to this depth")
    parser.add_argument("--store-dir", default=None, help="reuse / keep fragment sets here (not in the repo)")
    parser.add_argument("--jobs", type=int, default=1, choices=(1, 2))
    parser.add_argument("--timing-sample", type=int, default=200)
    parser.add_argument("--params", default="{}", help="JSON of FragmentScorer parameters to evaluate")
    parser.add_argument("--search", action="store_true", help="coordinate ascent on MRR (validation only)")
    parser.add_argument("--fusion", default=None, help="npz of model / prior scores for the same spectra")
    parser.add_argument("--out", default="fragments.json")
    args = parser.parse_args(argv)

    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.chem.molecules import Molecule
    from molpredict.io import read_spectra

    sets_raw = load_candidate_sets(args.candidates)
    spectra = [s for s in read_spectra(args.spectra) if s.inchikey and s.inchikey[:14] in sets_raw]
    structures = sorted({s.inchikey[:14] for s in spectra})
    rng = np.random.default_rng(args.seed)
    if args.n_structures and args.n_structures < len(structures):
        structures = sorted(rng.choice(structures, args.n_structures, replace=False).tolist())
    chosen = set(structures)
    queries = [(s, s.inchikey[:14]) for s in spectra if s.inchikey[:14] in chosen]
    if args.max_queries and args.max_queries < len(queries):
        keep = np.sort(np.random.default_rng(args.seed + 1).choice(len(queries), args.max_queries, replace=False))
        queries = [queries[i] for i in keep]
    smiles_of = {k: smi for key in structures for k, smi in sets_raw[key]}
    print(f"{len(queries)} queries, {len(structures)} structures, {len(smiles_of)} candidate structures",
          file=sys.stderr)

    timing_keys = rng.choice(sorted(smiles_of), min(args.timing_sample, len(smiles_of)), replace=False)
    timing = time_fragmentation([smiles_of[k] for k in timing_keys], [1, 2])

    store = None
    store_path = None
    if args.store_dir:
        name = f"{Path(args.spectra).stem}_{Path(args.candidates).stem}_n{args.n_structures}_s{args.seed}"
        store_path = Path(args.store_dir) / f"fragments_{name}_d{args.store_depth}.npz"
        if store_path.exists():
            store, depth = load_fragment_sets(store_path)
            if depth < args.store_depth:
                store = None
    fragment_s = 0.0
    n_failed = 0
    if store is None:
        keys = sorted(smiles_of)
        start = time.perf_counter()
        computed = fragment_all([smiles_of[k] for k in keys], args.store_depth, args.jobs)
        fragment_s = time.perf_counter() - start
        store = {k: fs for k, fs in zip(keys, computed) if fs is not None}
        n_failed = len(keys) - len(store)
        if store_path is not None:
            save_fragment_sets(store_path, store, args.store_depth)
    print(f"fragmented in {fragment_s:.0f} s", file=sys.stderr)

    def make(params: dict) -> FragmentScorer:
        scorer = FragmentScorer(**params)
        scorer.store_ = store
        return scorer

    usable = {k for k in smiles_of if k in store}
    sets = {}
    for key in structures:
        pairs = [(k, smi) for k, smi in sets_raw[key] if k in usable]
        sets[key] = (np.array([k for k, _ in pairs]),
                     [Molecule(smi, inchikey14=k) for k, smi in pairs])
    params = json.loads(args.params)
    _SHARED.update(store=store, sets=sets, queries=queries)
    # Speed: one process, fragments already in memory (what a cached library gives).
    base_metrics, qps = evaluate(params, queries)
    pool = None
    if args.jobs == 2:
        import multiprocessing
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
    # The warm speed: fragments come from the in-memory store (what a cached library gives).
    result = {
        "benchmark": "fragments",
        "spectra": Path(args.spectra).name, "candidates": Path(args.candidates).name,
        "n_structures": len(structures), "n_queries": len(queries), "n_candidate_structures": len(smiles_of),
        "n_unparsable_candidates": n_failed, "seed": args.seed,
        "fragmentation": timing,
        "fragmentation_wall_s": fragment_s, "jobs": args.jobs, "store_depth": args.store_depth,
        "params": make(params).get_params(),
        "scoring_queries_per_s": qps,
        "fragment_score_alone": base_metrics,
        "platform": platform.platform(),
    }
    best_params = dict(params)
    if args.search:
        trail = []
        best = base_metrics["mrr"]
        for _round in range(2):
            improved = False
            for name, values in SEARCH_SPACE.items():
                if name == "max_depth":
                    values = [v for v in values if v <= args.store_depth]
                for value in values:
                    trial = {**best_params, name: value}
                    if make(trial).get_params() == make(best_params).get_params():
                        continue
                    m, _ = evaluate(trial, queries, pool)
                    trail.append({"params": trial, **m})
                    print(json.dumps(trail[-1]), file=sys.stderr)
                    if m["mrr"] > best + 1e-9:
                        best, best_params, improved = m["mrr"], trial, True
            if not improved:
                break
        result["search"] = {"best_params": make(best_params).get_params(),
                            "best": evaluate(best_params, queries, pool)[0], "trail": trail}
    if pool is not None:
        pool.shutdown()
    if args.fusion:
        spectra_by_id = {s.id: s for s, _ in queries}
        result["fusion"] = fusion(args.fusion, make(best_params), spectra_by_id, smiles_of, chosen)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("fragment_score_alone", "scoring_queries_per_s", "fragmentation")},
                     indent=1), file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
