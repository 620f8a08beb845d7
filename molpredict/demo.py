"""``make demo``: train the default model (unless present) and identify a few test spectra against the pool.

Run as ``python -m molpredict.demo [--data DIR] [--n 5] [--retrain]``. It uses the shared MassBank split
(``../shared/data/massbank``) or a directory made by ``molpredict data import-massbank`` (``--data``), trains
one model per ion mode on ``train_{pos,neg}.mgf`` with grid selection on ``val_{pos,neg}.mgf``, saves it as the
default bundle (``$MOLPREDICT_HOME/models/default``), then ranks the same-formula candidates of a few
``test_pos.mgf`` spectra from the candidate pool and prints the top 5 of each, marking the true structure.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def _say(message: str = "") -> None:
    print(message, flush=True)


def _shorten(text: Any, width: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= width else text[:width - 3] + "..."


def find_data(data: str | None) -> Path:
    """The directory holding ``{train,val,test}_{pos,neg}.mgf``."""
    directory = Path(data) if data else SHARED / "massbank"
    needed = ["train_pos.mgf", "val_pos.mgf", "test_pos.mgf"]
    missing = [name for name in needed if not (directory / name).is_file()]
    if missing:
        raise SystemExit(
            f"demo: {directory} lacks {', '.join(missing)}.\n"
            "Get MassBank data first, e.g.:\n"
            "  molpredict data fetch massbank -o massbank_data      (needs internet)\n"
            "  python -m molpredict.demo --data massbank_data")
    return directory


def train_default(data: Path, bundle_path: Path, device: str) -> None:
    from .training import TrainOptions, format_summary, train_bundle

    train = [data / f"train_{m}.mgf" for m in ("pos", "neg") if (data / f"train_{m}.mgf").is_file()]
    val = [data / f"val_{m}.mgf" for m in ("pos", "neg") if (data / f"val_{m}.mgf").is_file()]
    _say(f"[1/3] training the default model on {', '.join(p.name for p in train)} (validation: "
         f"{', '.join(p.name for p in val)}); one model per ion mode, a few minutes on a laptop CPU...")
    t0 = time.perf_counter()
    bundle, summary = train_bundle(train, TrainOptions(device=device), val_paths=val,
                                   progress=sys.stderr.isatty(), log=lambda m: _say(f"      {m}"))
    bundle.save(bundle_path)
    for line in format_summary(summary).splitlines():
        _say(f"      {line}")
    _say(f"      saved {bundle_path} ({time.perf_counter() - t0:.0f} s)")


def pick_queries(data: Path, library: Any, bundle: Any, n: int) -> list:
    """The first ``n`` distinct-structure test_pos spectra with peaks left after cleaning and at least 5
    same-formula candidates in the library (so that the ranking has something to do)."""
    from .spectra import read_spectra

    sub = bundle.for_mode("positive")
    clean = sub.cleaning_pipeline() if sub is not None else None
    rich, poor, seen = [], [], set()
    for spectrum in read_spectra(data / "test_pos.mgf"):
        key = (spectrum.inchikey or "")[:14]
        if not key or key in seen or not spectrum.formula:
            continue
        cleaned = clean(spectrum) if clean is not None else spectrum
        if cleaned is None or cleaned.n_peaks < 5:
            continue
        n_candidates = len(library.select_by_formula(spectrum.formula))
        if n_candidates == 0:
            continue
        seen.add(key)
        (rich if n_candidates >= 5 else poor).append(spectrum)
        if len(rich) == n:
            break
    return (rich + poor)[:n]  # a small library may not have 5 candidates for any formula


def library_for(data: Path) -> Any:
    """The shared candidate pool, else a library of every structure in the data directory's MGF files."""
    from .candidates import CandidateLibrary, read_library
    from .identify import default_library_path
    from .spectra import read_spectra

    pool = default_library_path()
    if pool is not None:
        return read_library(pool), str(pool)
    smiles = sorted({s.smiles for path in sorted(data.glob("*.mgf")) for s in read_spectra(path) if s.smiles})
    return CandidateLibrary.from_smiles(smiles, source="massbank"), f"the {len(smiles)} structures of {data}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m molpredict.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="directory with {train,val,test}_{pos,neg}.mgf "
                        "(default: ../shared/data/massbank)")
    parser.add_argument("--n", type=int, default=5, help="test spectra to identify (default 5)")
    parser.add_argument("--top", type=int, default=5, help="candidates shown per spectrum (default 5)")
    parser.add_argument("--retrain", action="store_true", help="train even if the default model exists")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    args = parser.parse_args(argv)

    from .errors import MolpredictError
    from .candidate_sources import LibrarySource
    from .identify import Identifier, IdentifyOptions
    from .kernels.base import DegenerateObjectWarning
    from .modelfile import ModelBundle, default_bundle_path

    warnings.simplefilter("ignore", DegenerateObjectWarning)
    data = find_data(args.data)
    bundle_path = default_bundle_path()
    _say(f"molpredict demo: data {data}; default model {bundle_path}")
    bundle = None
    if bundle_path.exists() and not args.retrain:
        try:
            bundle = ModelBundle.load(bundle_path)
            _say(f"[1/3] using the existing default model ({', '.join(bundle.ion_modes)}); --retrain to rebuild it")
        except MolpredictError as exc:
            _say(f"[1/3] the default model cannot be loaded ({exc}); training a new one")
    if bundle is None:
        try:
            train_default(data, bundle_path, args.device)
        except MolpredictError as exc:
            print(f"demo: error: {exc}", file=sys.stderr)
            return exc.exit_code
        bundle = ModelBundle.load(bundle_path)

    t0 = time.perf_counter()
    library, described = library_for(data)
    _say(f"[2/3] candidate library: {described} ({len(library)} structures, {time.perf_counter() - t0:.1f} s)")
    queries = pick_queries(data, library, bundle, args.n)
    _say(f"[3/3] identifying {len(queries)} test_pos.mgf spectra by formula (candidates: every library "
         "structure with the spectrum's molecular formula)")
    options = IdentifyOptions(by="formula", top_k=args.top)
    identifier = Identifier(bundle, LibrarySource(library, options), options)
    rows = list(identifier.run(queries))
    for spectrum in queries:
        group = [r for r in rows if r["query_id"] == spectrum.id]
        true14 = (spectrum.inchikey or "")[:14]
        n_c = group[0]["n_candidates"] if group else 0
        _say("")
        _say(f"{spectrum.id}  {_shorten(spectrum.metadata.get('compound_name'), 40)}  {spectrum.formula}  "
             f"{spectrum.adduct or ''}  precursor m/z {spectrum.precursor_mz}  {n_c} candidates")
        _say(f"  {'rank':>4}  {'score':>7}  {'margin':>7}  {'':4}  {'InChIKey':<27}  SMILES")
        for r in group:
            mark = "TRUE" if r["inchikey"][:14] == true14 else ""
            margin = "" if r["confidence"] != r["confidence"] else f"{r['confidence']:+.3f}"
            _say(f"  {r['rank']:>4}  {r['score']:>7.3f}  {margin:>7}  {mark:4}  {r['inchikey']:<27}  "
                 f"{_shorten(r['smiles'], 60)}")
        if group and not any(r["inchikey"][:14] == true14 for r in group):
            _say(f"  (the true structure {true14} is not in the top {args.top})")
    found = sum(any(r["inchikey"][:14] == (s.inchikey or "")[:14] and r["rank"] == 1 for r in rows)
                for s in queries)
    _say("")
    _say(f"true structure ranked first for {found} of {len(queries)} spectra. Margin: rank 1's lead over the "
         "runner-up; other ranks: gap to rank 1.")
    _say("Try it on your own spectra:  molpredict identify my_spectra.mgf -o results.tsv")
    _say("Evaluate: molpredict evaluate ../shared/data/massbank/test_pos.mgf "
         "--candidates ../shared/data/candidates/test_formula256.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
