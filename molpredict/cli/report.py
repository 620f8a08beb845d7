"""``molpredict report``: the HTML report of a results file (see :mod:`molpredict.report.page`)."""
from __future__ import annotations

import click

from molpredict.cli.group import cli

__all__ = ["report"]


@cli.command("report")
@click.argument("results", type=click.Path(dir_okay=False))
@click.argument("spectra_file", metavar="SPECTRA", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="HTML file to write.")
@click.option("--skipped", "skipped_path", default=None, type=click.Path(dir_okay=False),
              help="The skipped-queries TSV written by `identify --skipped` (their reasons go into the report).")
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1), help="Candidates drawn per query.")
@click.option("--title", default=None, help="Page title.")
@click.option("--fragments/--no-fragments", default=True, show_default=True,
              help="Annotate the peaks the top candidate explains (in-silico fragmentation, ~10 ms a query).")
@click.option("--model", "model_path", default=None, type=click.Path(),
              help="The model bundle the results came from (its description goes into the parameters).")
@click.option("--library", default=None, help="The library the results came from (recorded in the parameters).")
@click.option("-q", "--quiet", is_flag=True, help="No status messages on stderr.")
def report(results, spectra_file, output, skipped_path, top_k, title, fragments, model_path, library,
           quiet) -> None:
    """Write one self-contained HTML page for RESULTS (from `molpredict identify`, .tsv/.csv/.json) and the
    SPECTRA they were computed from: a sortable, filterable index of the queries, each query's top candidates
    drawn with their scores, and its spectrum; spectra without rows are listed as skipped.

    \b
    Example:
      molpredict identify queries.mgf -o hits.tsv --skipped skipped.tsv
      molpredict report hits.tsv queries.mgf --skipped skipped.tsv -o report.html
    """
    from molpredict.cli.paths import check_output_files
    from molpredict.report.page import build_report_from_files

    check_output_files({"-o": output}, {"RESULTS": results, "SPECTRA": spectra_file, "--skipped": skipped_path})
    size, report_obj = build_report_from_files(results, spectra_file, output, skipped_path=skipped_path,
                                               top_k=top_k, title=title, model_path=model_path, library=library,
                                               fragments=fragments)
    if not quiet:
        click.echo(f"molpredict: wrote {output}: {len(report_obj.queries)} queries, {len(report_obj.skipped)} "
                   f"skipped, {size / 1e6:.2f} MB", err=True)
