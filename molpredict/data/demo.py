"""``make demo``: get MassBank data and a library, train the default model (unless present), identify a few spectra.

Run as ``python -m molpredict.data.demo [--data DIR] [--library LIB] [--n 5] [--retrain]``.

- Data: ``--data DIR``, a MassBank split (``{train,val,test}_{pos,neg}.mgf``, as ``molpredict data
  import-massbank`` makes it). Without it, ``$MOLPREDICT_HOME/data/massbank``, downloaded and imported on first
  use (``molpredict data fetch massbank``: a resumable download with a progress bar; ``--url`` for a mirror).
- Library: ``--library``, else the configured default (``molpredict config set library``), else a small library
  of the structures in the data's MGF files, written to ``DIR/library.tsv`` and made the default library when
  none is set.
- Model: trained on ``train_{pos,neg}.mgf`` with grid selection on ``val_{pos,neg}.mgf``, one per ion mode, and
  saved as the default bundle (``$MOLPREDICT_HOME/models/default``); then the same-formula candidates of a few
  ``test_pos.mgf`` spectra are ranked and the top 5 of each printed, marking the true structure.

The repository's ``Makefile`` passes the project's shared MassBank split and candidate pool when its checkout
has them beside it; nothing here looks for them.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

NEEDED = ("train_pos.mgf", "val_pos.mgf", "test_pos.mgf")


def _say(message: str = "") -> None:
    print(message, flush=True)


def _shorten(text: Any, width: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= width else text[:width - 3] + "..."


def default_data_dir() -> Path:
    """Where the demo keeps the MassBank split it downloads: ``$MOLPREDICT_HOME/data/massbank``."""
    from molpredict.modelfile import home_dir
    return home_dir() / "data" / "massbank"


def _nonempty(path: Path) -> bool:
    """An existing file with content (an import writes every split file, empty when no record went there)."""
    return path.is_file() and path.stat().st_size > 0


def _missing(directory: Path) -> list[str]:
    return [name for name in NEEDED if not _nonempty(directory / name)]


def find_data(data: str | None, url: str | None = None, release: str | None = None,
              progress: bool | None = None) -> Path:
    """The directory holding ``{train,val,test}_{pos,neg}.mgf``: ``data``, or the default data directory,
    fetched and imported first when it is incomplete."""
    if data:
        directory = Path(data)
        missing = _missing(directory)
        if missing:
            raise SystemExit(
                f"demo: {directory} lacks {', '.join(missing)}.\n"
                "Get MassBank data first, e.g.:\n"
                "  molpredict data fetch massbank -o massbank_data      (needs internet)\n"
                "  python -m molpredict.data.demo --data massbank_data\n"
                "or run the demo without --data: it downloads MassBank itself.")
        return directory
    from molpredict.data.massbank import DEFAULT_RELEASE, fetch_massbank

    directory = default_data_dir()
    if not _missing(directory):
        return directory
    release = release or DEFAULT_RELEASE
    _say(f"[0/3] downloading MassBank {release} into {directory} (resumable: rerun after an interruption) and "
         "importing it...")
    t0 = time.perf_counter()
    summary = fetch_massbank(directory, release=release, url=url,
                             progress=sys.stderr.isatty() if progress is None else progress)
    _say(f"      {summary['n_imported']} of {summary['n_records']} records imported "
         f"({time.perf_counter() - t0:.0f} s)")
    missing = _missing(directory)
    if missing:
        raise SystemExit(f"demo: the imported release has no {', '.join(missing)} (too few records?)")
    return directory


def library_for(data: Path, library: str | None = None) -> tuple[Any, str]:
    """``(library, description)``: ``library``, else the configured default, else a library of every structure
    in ``data``'s MGF files (saved as ``data/library.tsv`` and made the default when none is set)."""
    from molpredict import config
    from molpredict.chem.candidates import CandidateLibrary, read_library
    from molpredict.io import read_spectra

    chosen = library or config.default_library()
    if chosen:
        from molpredict.chem.candidates import check_usable

        loaded = check_usable(read_library(chosen), chosen)  # unusable: an error here, never the default
        described = str(chosen)
        if library and config.default_library() is None:
            # the demo ends by suggesting `molpredict identify my_spectra.mgf`, which needs a default library
            config.set_value("library", str(Path(library).resolve()))
            described += "; now your default library (`molpredict config show`)"
        return loaded, described
    path = data / "library.tsv"
    if path.is_file():
        built = read_library(path)
    else:
        smiles = sorted({s.smiles for p in sorted(data.glob("*.mgf")) if _nonempty(p) for s in read_spectra(p)
                         if s.smiles})
        built = CandidateLibrary.from_smiles(smiles, source="massbank")
        try:
            built.to_tsv(path)
        except OSError:
            return built, f"the {len(built)} structures of {data} (in memory: {data} is not writable)"
    described = f"the {len(built)} structures of {data}, saved as {path}"
    if config.default_library() is None:
        config.set_value("library", str(path))
        described += "; now your default library (`molpredict config show`)"
    return built, described


def train_default(data: Path, bundle_path: Path, device: str, val_candidates: list[str] | None = None,
                  library: str | None = None, calibration_candidates: list[str] | None = None) -> None:
    """Train the default bundle; the validation candidate sets (for the ranking-aware selection, the fusion with
    the prior and the calibration) come from ``val_candidates``, else from ``library``'s same-formula
    structures; ``calibration_candidates`` are more sets the calibration alone is fitted on."""
    from molpredict.training.pipeline import TrainOptions, format_summary, train_bundle

    train = [data / f"train_{m}.mgf" for m in ("pos", "neg") if _nonempty(data / f"train_{m}.mgf")]
    val = [data / f"val_{m}.mgf" for m in ("pos", "neg") if _nonempty(data / f"val_{m}.mgf")]
    _say(f"[2/3] training the default model on {', '.join(p.name for p in train)} (validation: "
         f"{', '.join(p.name for p in val)}); one model per ion mode, about 12 minutes on 2 CPU cores...")
    t0 = time.perf_counter()
    options = TrainOptions(device=device, val_candidates=val_candidates, library=library,
                           calibration_candidates=calibration_candidates)
    bundle, summary = train_bundle(train, options, val_paths=val,
                                   progress=sys.stderr.isatty(), log=lambda m: _say(f"      {m}"))
    bundle.save(bundle_path)
    for line in format_summary(summary).splitlines():
        _say(f"      {line}")
    _say(f"      saved {bundle_path} ({time.perf_counter() - t0:.0f} s)")


def pick_queries(data: Path, library: Any, bundle: Any, n: int) -> list:
    """The first ``n`` distinct-structure test_pos spectra with peaks left after cleaning and at least 5
    same-formula candidates in the library (so that the ranking has something to do)."""
    from molpredict.io import read_spectra

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m molpredict.data.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="directory with {train,val,test}_{pos,neg}.mgf "
                        "(default: $MOLPREDICT_HOME/data/massbank, downloaded on first use)")
    parser.add_argument("--library", default=None, help="candidate library (default: the configured one, else "
                        "the structures of the data)")
    parser.add_argument("--url", default=None, help="download MassBank from this URL (a mirror of the release "
                        ".tar.gz) instead of GitHub")
    parser.add_argument("--release", default=None, help="MassBank-data release to download")
    parser.add_argument("--val-candidates", action="append", default=None,
                        help="candidate sets of the validation structures (MassSpecGym JSON; repeatable) for "
                        "training; default: same-formula sets from the library")
    parser.add_argument("--calibration-candidates", action="append", default=None,
                        help="more candidate sets of the validation structures (e.g. val_mass.json; repeatable) "
                        "that only the calibration is fitted on")
    parser.add_argument("--n", type=int, default=5, help="test spectra to identify (default 5)")
    parser.add_argument("--top", type=int, default=5, help="candidates shown per spectrum (default 5)")
    parser.add_argument("--retrain", action="store_true", help="train even if the default model exists")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    args = parser.parse_args(argv)

    from molpredict.errors import MolpredictError, one_line_warning
    from molpredict.identification.candidate_sources import LibrarySource
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.kernels.base import DegenerateObjectWarning
    from molpredict.modelfile import ModelBundle, default_bundle_path

    warnings.simplefilter("ignore", DegenerateObjectWarning)
    warnings.showwarning = one_line_warning  # as the command line shows them
    try:
        data = find_data(args.data, url=args.url, release=args.release)
        bundle_path = default_bundle_path()
        _say(f"molpredict demo: data {data}; default model {bundle_path}")
        t0 = time.perf_counter()
        library, described = library_for(data, args.library)
    except MolpredictError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return exc.exit_code
    _say(f"[1/3] candidate library: {described} ({len(library)} structures, {time.perf_counter() - t0:.1f} s)")
    bundle = None
    if bundle_path.exists() and not args.retrain:
        try:
            bundle = ModelBundle.load(bundle_path)
            _say(f"[2/3] using the existing default model ({', '.join(bundle.ion_modes)}); --retrain to rebuild it")
        except MolpredictError as exc:
            _say(f"[2/3] the default model cannot be loaded ({exc}); training a new one")
    if bundle is None:
        try:
            from molpredict import config
            library_path = args.library or config.default_library() or (
                str(data / "library.tsv") if (data / "library.tsv").is_file() else None)
            train_default(data, bundle_path, args.device, args.val_candidates, library_path,
                          args.calibration_candidates)
        except MolpredictError as exc:
            print(f"demo: error: {exc}", file=sys.stderr)
            return exc.exit_code
        bundle = ModelBundle.load(bundle_path)

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
        probability = group[0].get("probability") if group else None
        confident = "" if probability is None or probability != probability else \
            f"  P(rank 1 right) {probability:.2f}"
        _say(f"{spectrum.id}  {_shorten(spectrum.metadata.get('compound_name'), 40)}  {spectrum.formula}  "
             f"{spectrum.adduct or ''}  precursor m/z {spectrum.precursor_mz}  {n_c} candidates{confident}")
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
    _say(f"A report with structures and spectra: molpredict identify {data / 'test_pos.mgf'} -o hits.tsv "
         "--report report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
