"""Candidate coverage by mass: for how many spectra the true structure is among the candidates selected by
neutral mass, with the fixed ppm window and with the precision-aware window; writes ``mass_window_coverage.json``.

Usage: python benchmarks/mass_window_coverage.py [--spectra ../shared/data/massbank/test_pos.mgf]
       [--library ../shared/data/candidates/pool.tsv.gz] [--ppm 10] [--out DIR]

Each spectrum with peaks is one query; candidates come from :class:`molpredict.identification.candidate_sources.LibrarySource`
exactly as ``molpredict identify --by mass`` selects them (its own adduct when usable, else the default adducts
of its ion mode; no cleaning, no model). A hit is a candidate with the spectrum's InChIKey first block. Both
settings are measured in the same run: ``ppm_only`` (``--ppm-only``) and ``precision_window`` (the default:
widened to what the precursor's written decimals allow). Also reported: candidates per query (median, mean,
90th percentile) and coverage per number of written precursor decimals.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from molpredict.identification.candidate_sources import LibrarySource
from molpredict.chem.candidates import read_library
from molpredict.identification.identify import IdentifyOptions
from molpredict.chem.molecules import DEFAULT_ADDUCTS, parse_adduct
from molpredict.io import read_spectra
from molpredict.spectra.record import spectrum_ion_mode


def _adducts(spectrum, mode):
    if spectrum.adduct:
        try:
            adduct = parse_adduct(spectrum.adduct)
            if adduct.ion_mode == mode:
                return [adduct]
        except Exception:  # an unusable adduct: the defaults, as identify does
            pass
    return DEFAULT_ADDUCTS[mode]


def measure(spectra_path, library_path, ppm: float = 10.0) -> dict:
    """Coverage of both settings on one spectra file against one library (see the module docstring)."""
    t0 = time.perf_counter()
    library = read_library(library_path)
    load_s = time.perf_counter() - t0
    spectra = [s for s in read_spectra(spectra_path) if s.n_peaks]
    inchikey14 = library.column("inchikey14")
    out: dict = {"spectra": str(spectra_path), "library": str(library_path), "library_rows": len(library),
                 "n_spectra_with_peaks": len(spectra), "ppm": ppm, "library_load_s": round(load_s, 2)}
    for name, precision_window in (("ppm_only", False), ("precision_window", True)):
        options = IdentifyOptions(by="mass", ppm=ppm, precision_window=precision_window)
        source = LibrarySource(library, options)
        hits, counts = 0, []
        per_decimals: dict[int, list[int]] = {}
        windows: Counter = Counter()
        t0 = time.perf_counter()
        for s in spectra:
            mode = spectrum_ion_mode(s)
            decimals = round(-np.log10(s.precursor_mz_precision)) if s.precursor_mz_precision else -1
            selected = source.select(s, mode, _adducts(s, mode), None) if mode else "no ion mode"
            hit = False
            if isinstance(selected, str):
                counts.append(0)
            else:
                ids, _, _, window = selected
                counts.append(len(ids))
                windows[window] += 1
                hit = s.inchikey is not None and s.inchikey.split("-")[0] in set(inchikey14[ids])
            hits += hit
            per_decimals.setdefault(decimals, [0, 0])
            per_decimals[decimals][0] += hit
            per_decimals[decimals][1] += 1
        counts_a = np.asarray(counts)
        out[name] = {"hits": hits, "coverage": round(hits / len(spectra), 4),
                     "no_candidates": int((counts_a == 0).sum()),
                     "candidates_median": float(np.median(counts_a)), "candidates_mean": round(float(counts_a.mean()), 1),
                     "candidates_p90": float(np.percentile(counts_a, 90)),
                     "coverage_by_precursor_decimals": {str(d): [h, n] for d, (h, n) in sorted(per_decimals.items())},
                     "windows": dict(windows.most_common()), "time_s": round(time.perf_counter() - t0, 2)}
    out["coverage_gain"] = round(out["precision_window"]["coverage"] - out["ppm_only"]["coverage"], 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spectra", required=True, help="../shared/data/massbank/test_pos.mgf")
    parser.add_argument("--library", required=True, help="../shared/data/candidates/pool.tsv.gz")
    parser.add_argument("--ppm", type=float, default=10.0)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    result = measure(args.spectra, args.library, args.ppm)
    path = Path(args.out) / "mass_window_coverage.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
