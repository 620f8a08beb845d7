"""Does scoring in float32 keep the accuracy of float64? Writes JSON and prints a Markdown table.

Usage::

    nice -n 10 python benchmarks/scoring_precision.py --model MODEL --data ../shared/data \\
        [--mode pos] [--sets formula256 formula mass] [--split val] [--out docs/benchmarks/scoring_precision.json]

Identification multiplies each query's predicted coordinates with its candidates' in
:data:`molpredict.identification.scoring.SCORING_DTYPE` (float32): decoding the stored candidate coordinates,
the prediction product ``K W`` and the query-candidate products. This evaluates one bundle twice on the same
labelled spectra and candidate sets (``{split}_{mode}.mgf`` against ``{split}_{set}.json``, validation by
default), once with float32 and once with float64 as the reference in the same run, with the coordinates
computed afresh (no cache, so the only difference is the precision), and reports for the fused ranking and the
spectrum evidence alone: hit@1/5/10, MRR and ECE under each, and how many queries' rank of the true structure
moved. Every path is given explicitly (nothing defaults to the shared data).
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from bundle_split_args import bundle_split_parser

VIEWS = (("fused", None), ("spectrum evidence (--prior off)", "without_prior"))


def _ranks(data: Path, mode: str, split: str, name: str, bundle: Any, dtype: Any) -> dict[str, Any]:
    """:func:`~molpredict.identification.evaluate.rank_queries` of the labelled spectra with products in
    ``dtype``, the coordinates computed afresh."""
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification import scoring
    from molpredict.identification.candidate_sources import SetSource
    from molpredict.identification.evaluate import collect_queries, rank_queries
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.io import read_spectra

    source = SetSource(load_candidate_sets(data / "candidates" / f"{split}_{name}.json"))
    queries, _ = collect_queries(list(read_spectra(data / "massbank" / f"{split}_{mode}.mgf")), source)
    saved = scoring.SCORING_DTYPE
    scoring.SCORING_DTYPE = dtype
    try:
        t0 = time.perf_counter()
        ranks = rank_queries(Identifier(bundle, source, IdentifyOptions(), cache_root=False), queries)
        ranks["time_s"] = round(time.perf_counter() - t0, 1)
        return ranks
    finally:
        scoring.SCORING_DTYPE = saved


def _summary(ranks: dict[str, Any], view: str | None) -> tuple[dict[str, Any], np.ndarray]:
    """Headline metrics of one view and its per-query count of candidates scored above the truth."""
    from molpredict.identification.evaluate import calibration_report, summarize_ranks

    view_ranks = dict(ranks)
    if view is not None:
        view_ranks["n_greater"], view_ranks["n_ties"] = ranks["views"][view]
    metrics = summarize_ranks(view_ranks, n_boot=1)
    row = {"hit@1": metrics["hit@1"], "hit@5": metrics["hit@5"], "hit@10": metrics["hit@10"], "mrr": metrics["mrr"],
           "n_queries": metrics["n_queries"]}
    if view is None:
        calibration = calibration_report(ranks) or {}
        row["ece"] = calibration.get("ece")
    return row, view_ranks["n_greater"] + view_ranks["n_ties"]


def main(argv: list[str] | None = None) -> int:
    parser = bundle_split_parser(__doc__.splitlines()[0], ["formula256", "formula", "mass"],
                                 "docs/benchmarks/scoring_precision.json")
    args = parser.parse_args(argv)

    from molpredict.modelfile import ModelBundle

    bundle = ModelBundle.load(args.model)
    results: dict[str, Any] = {"benchmark": "scoring_precision", "model": str(args.model), "split": args.split,
                               "mode": args.mode, "reference": "float64 (the same bundle, the same run)",
                               "machine": f"{platform.machine()}, python {platform.python_version()}", "sets": {}}
    lines = ["| set | ranking | float64 hit@1 / hit@10 (%) / MRR (/ ECE) | float32 hit@1 / hit@10 (%) / MRR (/ ECE) | "
             "queries whose true rank moved |", "|---|---|---|---|---:|"]
    for name in args.sets:
        wide = _ranks(args.data, args.mode, args.split, name, bundle, np.float64)
        narrow = _ranks(args.data, args.mode, args.split, name, bundle, np.float32)
        entry: dict[str, Any] = {"time_s": {"float64": wide["time_s"], "float32": narrow["time_s"]}}
        for label, view in VIEWS:
            (a, rank_a), (b, rank_b) = _summary(wide, view), _summary(narrow, view)
            moved = int((rank_a != rank_b).sum())
            entry[label] = {"float64": a, "float32": b, "queries_rank_moved": moved,
                            "max_rank_move": int(np.abs(rank_a - rank_b).max(initial=0)),
                            "ratio_mrr": round(b["mrr"] / a["mrr"], 6) if a["mrr"] else None}
            fmt = lambda r: f"{100 * r['hit@1']:.2f} / {100 * r['hit@10']:.2f} / {r['mrr']:.4f}" + (
                f" / {r['ece']:.4f}" if r.get("ece") is not None else "")
            lines.append(f"| {name} | {label} | {fmt(a)} | {fmt(b)} | {moved} of {a['n_queries']} |")
            print(lines[-1], flush=True)
        results["sets"][name] = entry
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))  # the table of docs/benchmarks/scoring_precision.md
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
