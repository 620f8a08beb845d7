"""Identification speed: all test_pos spectra, each against a 256-candidate set (test_formula256), with a cold
and then a warm candidate-coordinates cache. Writes JSON.

Usage::

    python benchmarks/identify_speed.py --model MODEL [--spectra ../shared/data/massbank/test_pos.mgf]
        [--candidates ../shared/data/candidates/test_formula256.json] [--cache-dir DIR] [--out identify_speed.json]

The timed pass is what ``molpredict identify`` does per spectrum (cleaning, candidate selection, prediction,
scoring, ranking, top-10 rows), with the candidates of each spectrum's own formula256 set instead of a library
query. Model loading and reading the candidate sets are timed separately. Goal: the warm pass at >= 500 spectra/s.
For a bundle with a score fusion (prior, fragments), a reference warm pass with ``--prior off`` (the fusion without
the prior) runs in the same process and the ratio is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model bundle (default: the default bundle)")
    parser.add_argument("--spectra", default=str(SHARED / "massbank" / "test_pos.mgf"))
    parser.add_argument("--candidates", default=str(SHARED / "candidates" / "test_formula256.json"))
    parser.add_argument("--cache-dir", default=None, help="coordinates cache (default: the user cache)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N spectra")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--warm-runs", type=int, default=2, help="timed warm passes (the best is reported)")
    parser.add_argument("--out", default="identify_speed.json")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch

    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.candidate_sources import SetSource
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.kernels.base import DegenerateObjectWarning
    from molpredict.modelfile import ModelBundle, default_bundle_path
    from molpredict.io import read_spectra

    warnings.simplefilter("ignore", DegenerateObjectWarning)
    t0 = time.perf_counter()
    bundle = ModelBundle.load(args.model or default_bundle_path())
    load_model_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    source = SetSource(load_candidate_sets(args.candidates))
    load_sets_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    spectra = list(read_spectra(args.spectra))
    if args.limit:
        spectra = spectra[:args.limit]
    read_s = time.perf_counter() - t0
    cache_root = Path(args.cache_dir) if args.cache_dir else None
    options = IdentifyOptions(top_k=args.top_k)

    def one_pass(opts: IdentifyOptions = options) -> tuple[float, Identifier, int]:
        identifier = Identifier(bundle, source, opts, cache_root=cache_root)
        start = time.perf_counter()
        n_rows = sum(1 for _ in identifier.run(spectra))
        return time.perf_counter() - start, identifier, n_rows

    cold_s, cold, _ = one_pass()
    print(f"cold pass: {cold_s:.1f} s ({cold.summary()['timings']})", file=sys.stderr)
    warm = []
    for _ in range(max(1, args.warm_runs)):
        seconds, identifier, n_rows = one_pass()
        warm.append(seconds)
        print(f"warm pass: {seconds:.1f} s ({identifier.summary()['timings']})", file=sys.stderr)
    summary = identifier.summary()
    sub = bundle.for_mode("positive")
    reference = None
    if sub is not None and sub.prior is not None and sub.scoring:
        no_prior = IdentifyOptions(top_k=args.top_k, prior=False)
        reference = min(one_pass(no_prior)[0] for _ in range(max(1, args.warm_runs)))
        print(f"warm pass without the prior: {reference:.1f} s", file=sys.stderr)
    result = {
        "benchmark": "identify_speed",
        "spectra": args.spectra, "candidates": args.candidates, "model": str(bundle.path),
        "model_name": sub.metadata.get("model", {}).get("name") if sub else None,
        "coordinates_dim": int(sub.model.candidate_coordinates(source.molecules(np.arange(1))).shape[1])
        if sub else None,
        "n_spectra": len(spectra), "n_identified": summary["n_identified"], "n_skipped": summary["n_skipped"],
        "skipped": summary["skipped"], "candidates_median": summary["candidates_median"],
        "n_rows": n_rows, "top_k": args.top_k,
        "load_model_s": round(load_model_s, 3), "load_sets_s": round(load_sets_s, 3), "read_spectra_s": round(read_s, 3),
        "cold_s": round(cold_s, 3), "cold_timings": cold.summary()["timings"],
        "warm_s": round(min(warm), 3), "warm_runs_s": [round(w, 3) for w in warm],
        "warm_timings": summary["timings"],
        "warm_ms_per_spectrum": round(1000 * min(warm) / max(1, len(spectra)), 3),
        "warm_spectra_per_s": round(len(spectra) / min(warm), 1),
        "fusion": {"prior": sub.prior is not None, "fragments": sub.fragments is not None,
                   "weights": (sub.scoring or {}).get("with_prior", {}).get("fusion", {}).get("weights")}
        if sub else None,
        "warm_without_prior_s": round(reference, 3) if reference is not None else None,
        "warm_ratio_to_without_prior": round(min(warm) / reference, 3) if reference else None,
        "goal_spectra_per_s": 500.0, "meets_goal": len(spectra) / min(warm) >= 500.0,
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpus": os.cpu_count(), "cuda": torch.cuda.is_available()},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
