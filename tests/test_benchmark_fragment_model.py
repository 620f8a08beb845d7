"""benchmarks/fragment_model.py: the ablation's out-of-fold rows per set kind, and its markdown."""
from __future__ import annotations

import numpy as np

from conftest import load_benchmark


def synthetic(seed=0, n=60):
    rng = np.random.default_rng(seed)
    sizes = np.where(np.arange(n) % 2 == 0, 30, 4)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    is_true = np.zeros(offsets[-1], dtype=bool)
    for i in range(n):
        is_true[offsets[i] + rng.integers(sizes[i])] = True
    terms = {t: rng.normal(size=offsets[-1]) + (1.0 if t == "spectrum" else 0.3) * is_true
             for t in ("spectrum", "prior", "fragments", "fragment_model")}
    return {"offsets": offsets, "groups": [f"s{i // 2}" for i in range(n)],
            "kind": ["formula256" if s == 30 else "formula" for s in sizes], "is_true": is_true, **terms}


def test_ablation_rows_and_markdown():
    bench = load_benchmark("fragment_model")
    data = synthetic()
    rows = bench.ablation(data, seed=0, combinations=(("spectrum", "prior"),), alone=("spectrum", "fragment_model"))
    assert list(rows) == ["spectrum alone", "fragment_model alone", "spectrum + prior (weights, out of fold)",
                          "spectrum + prior (ranker, out of fold)"]
    # each row: all queries and each set kind; 'alone' rows equal the ranks of the raw term
    alone = rows["spectrum alone"]
    assert alone["all"]["n_queries"] == 60 and alone["formula"]["n_queries"] == alone["formula256"]["n_queries"] == 30
    ranks = []
    for i in range(60):
        a, b = data["offsets"][i], data["offsets"][i + 1]
        s, t = data["spectrum"][a:b], data["is_true"][a:b]
        ranks.append(1 + int(np.sum((s >= s[t].max()) & ~t)))
    assert alone["all"]["mrr"] == np.mean(1.0 / np.array(ranks))
    assert len(rows["spectrum + prior (ranker, out of fold)"]["fitted"]) == 3  # one fit per fold
    results = {"machine": "test", "mode": "positive", "n_queries": 60,
               "args": {"spectra_per_structure": 2, "n_val_structures": 30},
               "fragment_model": {"n_spectra": 10, "n_structures": 5, "n_ion_rows": 100, "held_out_structures": 1,
                                  "held_out_log_loss": 0.1, "constant_log_loss": 0.2,
                                  "held_out_auc_shown_by_most": 0.7},
               "cost": {"formula256": {"fragments_cpu_s": 1.0, "fragment_model_cpu_s": 2.0, "n_candidates": 1000}},
               "rows": rows, "ranker_all_queries": rows}
    text = bench.markdown(results)
    m = rows["spectrum alone"]["formula"]
    assert (f"| spectrum alone | {100 * alone['all']['hit@1']:.1f} | {100 * alone['all']['hit@10']:.1f} | "
            f"{alone['all']['mrr']:.3f} | {100 * m['hit@1']:.1f} |") in text
    assert "fragment model 2.0 ms per candidate" in text and "every validation query (60 queries" in text
