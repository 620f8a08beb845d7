"""``molpredict candidates``: build candidate libraries from SMILES / SDF / TSV files and summarise them."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import click

from molpredict.cli.group import cli
from molpredict.errors import InputError


@cli.group()
def candidates() -> None:
    """Candidate libraries: build one from structures, or summarise one (schema: candidates/README.md)."""


def _check_jobs(ctx: click.Context, param: click.Parameter, value: int) -> int:
    """-j/--jobs: a positive count, or negative (joblib: -1 all cores, -k all but k-1); 0 means nothing."""
    if value == 0:
        raise click.BadParameter("0 workers cannot run: give a positive count, or -1 for all cores",
                                 ctx=ctx, param=param)
    return value


@candidates.command("build")
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Library TSV to write (.tsv or .tsv.gz).")
@click.option("--source", default=None, help="Source label for records that have none.")
@click.option("-j", "--jobs", default=-1, show_default=True, type=int, callback=_check_jobs,
              help="Worker processes for RDKit (-1: all cores).")
@click.option("--standardize", is_flag=True,
              help="Replace each structure by its parent: metals disconnected, largest organic fragment, charges "
                   "neutralised where possible (salts and charged forms then match their parent's spectra).")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
def build(input_path: str, output: str, source: str | None, jobs: int, standardize: bool,
          progress: bool | None) -> None:
    """Read INPUT (SMILES file, SDF or TSV), compute InChIKey, formula and monoisotopic mass with RDKit for every
    structure, drop repeated rows (same InChIKey and source; first kept: a structure keeps one row per source) and
    write a complete library TSV."""
    from molpredict.chem.candidates import CandidateLibrary, _kind_of, check_usable, dedupe, standardized
    from molpredict.cli.paths import check_output_files

    check_output_files({"-o": output}, {"INPUT": input_path})
    if not output.lower().endswith((".tsv", ".tsv.gz")):
        raise InputError("a library is written as .tsv or .tsv.gz", path=output, field="-o")
    path = Path(input_path)
    show = sys.stderr.isatty() if progress is None else progress
    kind = _kind_of(path) or "tsv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the report is printed below, in full
        if kind == "smiles":
            library = CandidateLibrary.from_smiles_file(path, source=source, n_jobs=jobs, progress=show)
        elif kind == "sdf":
            library = CandidateLibrary.from_sdf(path, source=source, n_jobs=jobs, progress=show)
        else:
            library = _tsv_recomputed(path, source, jobs, show)
    report = library.report
    # An empty library would only surface later, as "no candidates" for every query: refuse it here, naming the
    # first skipped row, and write nothing.
    check_usable(library, input_path)
    n_changed = None
    if standardize:
        library, n_changed = standardized(library, n_jobs=jobs, progress=show)
    library = dedupe(library, report)
    if source is not None and not library.has_column("source"):
        library = CandidateLibrary({**{c: library.column(c) for c in library.columns},
                                    "source": [source] * len(library)}, path=library.path)
    library.to_tsv(output)
    if report is not None:
        click.echo(report.summary(), err=True)
        for skipped in report.skipped[:20]:
            click.echo(f"  skipped: {skipped}", err=True)
        if report.n_skipped > 20:
            click.echo(f"  ... and {report.n_skipped - 20} more", err=True)
    if n_changed is not None:
        click.echo(f"--standardize: {n_changed} rows replaced by their parent structure", err=True)
    salts = _salt_line(library.salt_or_charged_rows(), standardized=standardize)
    if salts:
        click.echo(salts, err=True)
    click.echo(f"wrote {len(library)} molecules to {output}", err=True)


def _salt_line(n: int, standardized: bool = False) -> str | None:
    """The one line on rows that are salts or charged (several fragments or a net charge), or None when none."""
    if not n:
        return None
    if standardized:  # what is left cannot be neutralised: quaternary ammonium and the like, ions as measured
        return f"{n} rows keep a net charge or several fragments after --standardize (permanent ions)"
    return (f"{n} rows are salts or charged forms (several fragments or a net charge): no spectrum of their parent "
            f"finds them by formula or mass; `candidates build --standardize` keeps the parent")


def _tsv_recomputed(path: Path, source: str | None, jobs: int, progress: bool):
    """A TSV's SMILES (and name, id, source) with every computed column recomputed by RDKit."""
    from molpredict.chem.candidates import CandidateLibrary, _read_header, _read_tsv_rows

    header = _read_header(path)
    # Read the rows without the computed columns so that every row is described afresh (canonical SMILES).
    stripped = [h if h not in ("inchikey", "inchikey14", "formula", "monoisotopic_mass") else f"_{h}"
                for h in header]
    library = _read_tsv_rows(path, stripped, n_jobs=jobs, progress=progress)
    if source is not None and library.has_column("source"):
        filled = [s if s else source for s in library.source]
        library = CandidateLibrary({**{c: library.column(c) for c in library.columns}, "source": filled},
                                   path=library.path, report=library.report)
    return library


_SKIPS_SHOWN = 20  # skipped rows listed by `info --json` (the text lists 5)


@candidates.command("info")
@click.argument("library_path", metavar="LIBRARY", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def info(library_path: str, as_json: bool) -> None:
    """Summarise a library: rows, distinct structures and formulas, sources, mass range."""
    from molpredict.chem.candidates import read_library

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the skipped rows are listed below instead
        library = read_library(library_path)
    summary = library.info()
    if library.report is not None:
        summary["skipped"] = library.report.n_skipped
        summary["skipped_first"] = [{"line": s.line, "field": s.field, "reason": s.reason}
                                    for s in library.report.skipped[:_SKIPS_SHOWN]]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"library      {summary['path']}")
    click.echo(f"rows         {summary['rows']}")
    click.echo(f"structures   {summary['distinct_inchikey14']} distinct InChIKey first blocks")
    if summary["multi_source_structures"]:
        click.echo(f"             {summary['multi_source_structures']} InChIKeys under several sources (a row "
                   f"each; ranked once)")
    click.echo(f"formulas     {summary['distinct_formulas']} distinct")
    if summary["rows"]:
        click.echo(f"mass range   {summary['mass_min']:.4f} - {summary['mass_max']:.4f} Da")
    salts = _salt_line(summary["salt_or_charged_rows"])
    if salts:
        click.echo(f"salts        {salts}")
    if summary["sources"]:
        click.echo("sources")
        for name, count in summary["sources"].items():
            click.echo(f"  {name:<20} {count}")
    if summary["top_formulas"]:
        click.echo("top formulas")
        for name, count in summary["top_formulas"].items():
            click.echo(f"  {name:<20} {count}")
    if summary.get("skipped"):
        click.echo(f"skipped rows {summary['skipped']}")
        for row in summary["skipped_first"][:5]:
            where = ", ".join(part for part in (f"line {row['line']}" if row["line"] is not None else None,
                                                f"field {row['field']}" if row["field"] is not None else None)
                              if part)
            click.echo(f"  {where + ': ' if where else ''}{row['reason']}")
        if summary["skipped"] > 5:
            click.echo(f"  ... and {summary['skipped'] - 5} more")
