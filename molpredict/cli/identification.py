"""``molpredict train | identify | evaluate | score-library | model | data``: the identification workflow.

A thin layer: each command parses options, calls :mod:`molpredict.training.pipeline`, :mod:`molpredict.identification.identify`,
:mod:`molpredict.identification.evaluate` or :mod:`molpredict.data.massbank`, and prints. No math here.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from molpredict.errors import InputError
from molpredict.cli.group import cli

__all__ = ["train", "identify", "evaluate", "score_library", "model_group", "data"]


def _progress_default(progress: bool | None) -> bool:
    return sys.stderr.isatty() if progress is None else progress


def _say(quiet: bool):
    def say(message: str) -> None:
        if not quiet:
            click.echo(f"molpredict: {message}", err=True)
    return say


def _load_bundle(path: str | None, say=None):
    from molpredict.api import load_model

    bundle = load_model(path)
    if say is not None:
        say(f"model {bundle.path} ({', '.join(bundle.ion_modes)})")
        hint = bundle.upgrade_hint()
        if hint:
            say(hint)
    return bundle


def _cache_root(cache_dir: str | None, no_cache: bool):
    from molpredict.api import coordinates_root

    return coordinates_root(False if no_cache else cache_dir)


_progress_option = click.option("--progress/--no-progress", default=None,
                                help="Progress bars on stderr (default: when stderr is a terminal).")
_quiet_option = click.option("-q", "--quiet", is_flag=True, help="No status messages on stderr.")
_cluster_option = click.option(
    "--cluster", default=None, metavar="local:N|tcp://HOST:PORT",
    help="Run the blocks on a Dask cluster: local:N (N worker processes here) or a scheduler address "
         "(default: $MOLPREDICT_CLUSTER, else in-process). Output has the in-process run's rows and ranks; the "
         "last digits of scores can differ with the thread count.")

#: the coordinates store (molpredict/identification/coordinates_cache.py) keeps int8 codes with a per-row scale, and
#: a cached run scores with the decoded values, its first run included: not the same numbers as --no-cache's
_CACHE_DIR_HELP = ("Candidate-coordinates cache, a directory or an fsspec URL such as s3://bucket/coords (default: "
                   "$MOLPREDICT_HOME/coordinates, else the user cache directory's coordinates). It keeps the "
                   "coordinates in int8 with a per-row scale.")
_NO_CACHE_HELP = ("Do not read or write the coordinates cache: compute the candidates' coordinates every run, in "
                  "full precision. The cache keeps them in int8, so spectrum scores differ from these by up to about "
                  "0.01, fused scores and probabilities by up to about 0.1, and nearly tied candidates can swap ranks.")


class _PositiveFinite(click.FloatRange):
    """A click.FloatRange (``min=0, min_open=True``) that also refuses nan and inf (which pass its comparisons, to
    fail after the loading), saying it as the library's check does (``ppm must be > 0, not -5.0``)."""

    name = "float"  # "'abc' is not a valid float", not "... a valid float range"

    def convert(self, value, param, ctx):
        import math

        number = click.types.FloatParamType.convert(self, value, param, ctx)
        name = param.name if param is not None else "the value"
        if not math.isfinite(number):
            self.fail(f"{name} must be a finite number, not {number!r}", param, ctx)
        try:
            return super().convert(number, param, ctx)
        except click.BadParameter:
            self.fail(f"{name} must be {'>' if self.min_open else '>='} {self.min:g}, not {number!r}", param, ctx)


def _executor(cluster: str | None, say):
    from molpredict.identification.scoring import executor_for

    executor = executor_for(cluster)
    if not executor.in_process:
        say(f"cluster: {executor.name} ({executor.n_threads()} worker threads)")
        # Ctrl-C can land inside the client's wait for its event loop, whose cancelled callback tornado then logs
        # as a page of traceback; what the run did is said by its own lines and exit code
        import logging
        logging.getLogger("tornado.application").setLevel(logging.CRITICAL)
    return executor


# ----------------------------------------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------------------------------------

_DEFAULT_MODEL = "sisokr"  # molpredict.training.pipeline.DEFAULT_MODEL (not imported: `molpredict --help` stays light)


class ModelDefaultOption(click.Option):
    """An option for a model parameter of the same name whose default is the model's: the help reads it from the
    default model (spectra, and text where it differs) when the help is shown."""

    def get_help_record(self, ctx: click.Context):
        record = super().get_help_record(ctx)
        if record is None:
            return None
        try:
            from molpredict.training.pipeline import DEFAULT_MODEL, model_defaults
            spectra = model_defaults(DEFAULT_MODEL).get(self.name)
            text = model_defaults(DEFAULT_MODEL, "text", n_inputs=10**9, n_structures=10**9).get(self.name)
        except Exception:  # a broken model plugin must not break --help
            return record
        if spectra is None and text is None:
            return record
        shown = f"{DEFAULT_MODEL}: {spectra}" + (f"; text: {text}" if text != spectra else "")
        return record[0], f"{record[1]}  [default: the model's; {shown}]"


@cli.command()
@click.argument("train_files", metavar="TRAIN...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
              help="Model bundle directory to write (replaced if it is a bundle).")
@click.option("--val", "val_files", multiple=True, type=click.Path(dir_okay=False),
              help="Validation spectra (or pairs tables): grids are chosen on their kernel loss (repeatable).")
@click.option("--model", "model_spec", default=_DEFAULT_MODEL, show_default=True,
              help="Model registry name, optionally with parameters (name:key=value).")
@click.option("--input-kernel", default=None, cls=ModelDefaultOption,
              help="Input kernel spec; grids of parameter values allowed (ppk:mz_sigma=0.01|0.02).")
@click.option("--output-kernel", default=None, cls=ModelDefaultOption, help="Output kernel spec.")
@click.option("--input-sketch", default=None, cls=ModelDefaultOption, help="Input sketch spec.")
@click.option("--output-sketch", default=None, cls=ModelDefaultOption, help="Output sketch spec.")
@click.option("--lam", default=None, cls=ModelDefaultOption, help="Ridge parameter or grid a|b|c.")
@click.option("--ion-mode", type=click.Choice(["positive", "negative", "both"]), default=None,
              help="Modes to train (default: those present in the training files).")
@click.option("--exclude-license", "exclude_licenses", multiple=True,
              help="Drop records whose licence contains this token, e.g. NC (repeatable).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--summary-json", type=click.Path(dir_okay=False), default=None,
              help="Also write the training summary as JSON.")
@click.option("--select-by", default=None,
              help="Choose grid points and the score fusion by a ranking metric of the validation structures in "
                   "their candidate sets (mrr, hit@K; needs --val-candidates or --library), or kernel-loss "
                   "(default: the model's, mrr for the IOKR family).")
@click.option("--val-candidates", multiple=True, type=click.Path(dir_okay=False),
              help="Candidate sets of the validation structures (MassSpecGym JSON, e.g. val_formula256.json); "
                   "repeat to fit the selection and fusion on several kinds of sets.")
@click.option("--calibration-candidates", multiple=True, type=click.Path(dir_okay=False),
              help="More candidate sets of the validation structures (e.g. val_mass.json) that only the "
                   "calibration of the probability is fitted on (not the selection or the fusion); repeatable.")
@click.option("--library", "train_library", default=None, type=click.Path(dir_okay=False),
              help="Without --val-candidates: draw same-formula validation candidate sets from this library.")
@click.option("--prior", "prior_reference", default="train", show_default=True,
              help="Structure prior fused with the spectrum score: train (similarity to the training "
                   "structures), none, or a library/SMILES file of reference structures.")
@click.option("--fragments/--no-fragments", default=True, show_default=True,
              help="Re-rank the fused ranking's top 16-32 with the fragment score and a learnt fragmentation "
                   "model (kept only if validation ranks better with them; each re-ranked candidate is "
                   "fragmented once, ~3 ms, then cached on disk).")
@_progress_option
@_quiet_option
def train(train_files, output, val_files, model_spec, input_kernel, output_kernel, input_sketch, output_sketch,
          lam, ion_mode, exclude_licenses, device, seed, summary_json, select_by, val_candidates,
          calibration_candidates, train_library, prior_reference, fragments, progress, quiet) -> None:
    """Train a model bundle on spectra labelled with structures (SMILES, else INCHI metadata), or on text.

    \b
    Examples:
      molpredict train train_pos.mgf --val val_pos.mgf -o mymodel
      molpredict train pairs.tsv --val val_pairs.tsv -o textmodel
    One model is trained per ion mode present (or asked with --ion-mode); spectra without a usable structure
    (an INCHIKEY alone is not one: no structure can be drawn from it) or without peaks after cleaning are skipped
    and counted in the closing summary.

    A .tsv/.csv table (optionally .gz) with description and smiles columns trains one text -> molecule model
    (default input kernel text-ngram; rows with an empty description or an unusable SMILES are skipped and
    counted, the first ones named by file, line and field). Tables and spectra cannot be mixed in one call.
    """
    from molpredict.cli.paths import check_output_files
    from molpredict.training.pipeline import TrainOptions, format_summary, train_bundle

    check_output_files({"--summary-json": summary_json},
                       {f"TRAIN {i + 1}": path for i, path in enumerate(train_files)} |
                       {f"--val {i + 1}": path for i, path in enumerate(val_files)})
    _check_train_candidates(train_files, val_files, val_candidates, calibration_candidates, train_library)
    from molpredict.modelfile import check_bundle_output
    check_bundle_output(output)  # before the training, not after it
    say = _say(quiet)
    modes = None if ion_mode is None else (["positive", "negative"] if ion_mode == "both" else [ion_mode])
    options = TrainOptions(model=model_spec, input_kernel=input_kernel, output_kernel=output_kernel,
                           input_sketch=input_sketch, output_sketch=output_sketch, lam=lam, ion_modes=modes,
                           exclude_licenses=tuple(exclude_licenses), device=device, seed=seed,
                           select_by=select_by, val_candidates=list(val_candidates) or None,
                           calibration_candidates=list(calibration_candidates) or None, library=train_library,
                           prior=prior_reference, fragments=fragments)
    t0 = time.perf_counter()
    bundle, summary = train_bundle(list(train_files), options, val_paths=list(val_files),
                                   progress=_progress_default(progress), log=say)
    path = bundle.save(output)
    summary["total_s"] = time.perf_counter() - t0
    summary["output"] = str(path)
    if not quiet:
        click.echo(format_summary(summary), err=True)
        click.echo(f"molpredict: saved model bundle {path} ({summary['total_s']:.1f} s)", err=True)
    if summary_json:
        from molpredict.modelfile import json_ready
        from molpredict.atomic import atomic_write
        with atomic_write(summary_json) as handle:
            handle.write(json.dumps(json_ready(summary), indent=2) + "\n")


def _check_train_candidates(train_files, val_files, val_candidates, calibration_candidates, train_library) -> None:
    """Refuse, before any work, the candidate-set options ``train`` would ignore (see
    :func:`molpredict.training.pipeline._validation_sets`: the sets are for the validation structures, so they
    need --val; the calibration sets are used only beside selection sets, from --val-candidates or a library; a
    text model is not ranked against candidate sets) and candidate files that do not exist."""
    from molpredict.cli.paths import check_input_files
    from molpredict.io.text_pairs import split_inputs

    given = [name for name, value in (("--val-candidates", val_candidates),
                                      ("--calibration-candidates", calibration_candidates)) if value]
    if not given:
        return
    if split_inputs(list(train_files) + list(val_files), what="train"):
        raise InputError(f"{' and '.join(given)} apply to spectra: a text model is not selected or calibrated on "
                         f"candidate sets")
    if not val_files:
        raise InputError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --val (the candidate sets "
                         f"are for the validation structures)")
    if calibration_candidates and not val_candidates:
        from molpredict.config import default_library
        if not (train_library or default_library()):
            raise InputError("--calibration-candidates needs --val-candidates or --library (the calibration is "
                             "fitted beside the selection on validation candidate sets)")
    check_input_files({"--val-candidates": val_candidates, "--calibration-candidates": calibration_candidates})


# ----------------------------------------------------------------------------------------------------------
# identify
# ----------------------------------------------------------------------------------------------------------

def _spool_stdin() -> str:
    handle = tempfile.NamedTemporaryFile("wb", suffix=".mgf", delete=False)
    with handle:
        shutil.copyfileobj(sys.stdin.buffer, handle)
    return handle.name


def _library_path(library: str | None) -> str:
    from molpredict.api import library_path

    return library_path(library)


def _load_library(library: str | None, say, progress: bool, cache: bool | None = None):
    import warnings

    from molpredict.api import load_library

    library = _library_path(library)
    t0 = time.perf_counter()
    # the reader's warning about skipped rows is held back until the library proves usable: a library with none
    # is one error line naming its first bad row, not that warning and then the error saying it again (QA)
    with warnings.catch_warnings(record=True) as held:
        lib = load_library(library, progress=progress, cache=cache)
    for warning in held:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    say(f"library {library}: {len(lib)} structures ({time.perf_counter() - t0:.1f} s)")
    return lib


@cli.command()
@click.argument("spectra_file", metavar="[SPECTRA]", required=False, type=click.Path(dir_okay=False))
@click.option("--text", "texts", multiple=True,
              help="A description to identify with a text model (repeatable; instead of SPECTRA).")
@click.option("--text-file", default=None, type=click.Path(dir_okay=False),
              help="Descriptions to identify, one per line (instead of SPECTRA; blank lines and # comments are "
                   "not queries).")
@click.option("--model", "model_path", default=None, type=click.Path(),
              help="Model bundle (default: `molpredict config set model` or $MOLPREDICT_MODEL, else "
                   "$MOLPREDICT_HOME/models/default).")
@click.option("--library", default=None, type=click.Path(dir_okay=False),
              help="Candidate library (default: `molpredict config set library LIB` or $MOLPREDICT_LIBRARY).")
@click.option("--by", type=click.Choice(["formula", "mass"]), default=None,
              help="Candidate selection (default: formula when the query has one, else mass).")
@click.option("--ppm", default=10.0, show_default=True, type=_PositiveFinite(min=0, min_open=True),
              help="Mass window for --by mass.")
@click.option("--source", "sources", multiple=True, help="Only library rows of this source (repeatable).")
@click.option("--formulas", default=None, type=click.Path(dir_okay=False),
              help="TSV of query_id<TAB>formula hints (override the spectra's FORMULA).")
@click.option("--top-k", default=10, show_default=True, type=click.IntRange(min=1))
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Output file (format from the extension: .tsv, .csv, .json); default stdout.")
@click.option("--format", "fmt", type=click.Choice(["tsv", "csv", "json"]), default=None,
              help="Output format (default: from -o's extension, else tsv).")
@click.option("--skipped", "skipped_path", default=None, type=click.Path(dir_okay=False),
              help="Write the skipped queries (query_id, file, record, reason) as TSV.")
@click.option("--report", "report_path", default=None, type=click.Path(dir_okay=False),
              help="Also write a self-contained HTML report (structures, spectra, index); spectra only.")
@click.option("--cache-dir", default=None, type=str, help=_CACHE_DIR_HELP)
@click.option("--no-cache", is_flag=True, help=_NO_CACHE_HELP)
@click.option("--prior", "prior", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Fuse the bundle's structure prior into the score (when it has one); off: spectrum evidence only.")
@_cluster_option
@click.option("--resume", is_flag=True,
              help="Continue an interrupted run writing to -o FILE: its finished queries are kept, the rest done.")
@click.option("--block-queries", default=512, show_default=True, type=click.IntRange(min=1),
              help="Spectra per block (the unit in which the output is committed, and resumed).")
@click.option("--properties", "properties_path", default=None, type=click.Path(file_okay=False),
              help="A property model (`molpredict properties train`): add each query's predicted properties, "
                   "median and interval, as prop_<name>, prop_<name>_low, prop_<name>_high columns.")
@click.option("--ppm-only", is_flag=True,
              help="Mass window of --ppm only, never widened to what the precursor's written precision allows.")
@click.option("--formula-per-candidate", "formula_per_candidate", type=click.Choice(["on", "off"]), default="on",
              show_default=True,
              help="A spectrum without FORMULA (by mass) is encoded once per candidate formula when the model reads "
                   "formulas, each candidate scored with its own; off: once, without a formula (faster).")
@_progress_option
@_quiet_option
def identify(spectra_file, texts, text_file, model_path, library, by, ppm, sources, formulas, top_k, output, fmt,
             skipped_path, report_path, cache_dir, no_cache, prior, cluster, resume, block_queries, ppm_only,
             progress, quiet, properties_path=None, formula_per_candidate="on") -> None:
    """Rank candidate structures for each spectrum of SPECTRA (.mgf, .msp, .mzML, .mzXML; stdin MGF when absent or -),
    or for each description given with --text / --text-file (a text model).

    \b
    Output columns: query_id, file, record, rank, score, confidence, probability, spectrum_score, prior_score,
    fragment_score, smiles, inchikey, formula, adduct, name, id, n_candidates, mass_window. query_id is the
    spectrum's id, made unique within the run (a repeated id gets #2, #3...); file and record (1-based) say where
    it was read. mass_window: the window used by mass ("10 ppm", or "0.5 m/z" for a precursor written with two
    decimals or fewer). With --properties MODEL: prop_<name>, prop_<name>_low, prop_<name>_high per predicted
    property (median and interval of the query's molecule, from `molpredict properties train`).
    Ranking: score descending (the fusion of the spectrum model's score with the bundle's structure prior and
    fragment score, each z-scored within the query's candidates; --prior off leaves the prior out), ties broken
    by InChIKey (ascending). probability (rank 1 only): the calibrated estimate that rank 1 is right.
    Confidence: for rank 1, its score minus the runner-up's (the decision margin, >= 0); for the other
    ranks, the score minus the top score (<= 0); empty with a single candidate.
    Every spectrum appears in the output or in the skipped report (stderr summary, --skipped FILE).
    -o FILE is written in blocks under FILE.partial and renamed when complete; after a kill, --resume
    continues it.
    Text queries are ranked against the whole library (or its --source rows); query_id is text1, text2, ...
    for the --text descriptions (record: their position) and <file stem>:<line> for the lines of --text-file
    (file and record: the file and line; blank lines and # comments are not queries). A description with no
    word the model knows is skipped (every candidate would score the same). --by, --ppm, --formulas and
    --cluster apply to spectra only.

    \b
    Example:
      molpredict identify --text "The molecule is a ..." --model textmodel --library molecules.tsv
    """
    from molpredict.api import (check_spectra_model, identify_options, load_properties, open_identifier,
                                skipped_entries)
    from molpredict.identification.identify import read_formula_hints
    from molpredict.io.results import ResultWriter, ResumableOutput, output_format, write_skipped
    from molpredict.io import SkipReport, read_spectra
    from molpredict.cli.paths import check_output_files
    from molpredict.config import default_library, default_model

    say = _say(quiet)
    show = _progress_default(progress)
    out_format = output_format(output, fmt)
    # the defaults count: `identify q.mgf -o lib.tsv` must not write over the configured library
    check_output_files({"-o": output, "--skipped": skipped_path, "--report": report_path},
                       {"SPECTRA": spectra_file, "--library": library or default_library(), "--formulas": formulas,
                        "--text-file": text_file}, {"--model": model_path or default_model()})
    if texts or text_file:
        if spectra_file is not None:
            raise InputError("give either SPECTRA or --text/--text-file, not both")
        if report_path:
            raise InputError("--report draws spectra: it is not available for text queries")
        _refuse_spectra_options(click.get_current_context())
        _identify_text(list(texts), text_file, model_path, library, sources, top_k, output, out_format,
                       cache_dir, no_cache, show, quiet)
        return
    if resume and (not output or output == "-"):
        raise InputError("--resume needs -o FILE (an interrupted run's output file)")
    if resume and report_path:
        raise InputError("--report would show only the resumed part: finish with --resume, then run "
                         "`molpredict report OUTPUT SPECTRA -o REPORT.html`")
    spool = None
    if spectra_file in (None, "-"):
        if sys.stdin.isatty():
            raise InputError("no spectra: give a SPECTRA file (or pipe MGF into stdin)")
        spool = spectra_file = _spool_stdin()
    try:
        report = SkipReport()
        # Open the spectra first: a wrong file fails at once, before the model and library are loaded.
        spectra = read_spectra(spectra_file, report=report)
        hints = read_formula_hints(formulas) if formulas else None
        library = _library_path(library)
        bundle = _load_bundle(model_path, say)
        check_spectra_model(bundle)  # before the library is read
        lib = _load_library(library, say, show)
        _check_sources(lib, sources, library)
        properties, columns = load_properties(properties_path)
        options = identify_options(by=by, ppm=ppm, precision_window=not ppm_only, sources=sources, top_k=top_k,
                                   formulas=hints, block_queries=block_queries, prior=prior == "on",
                                   properties=properties, formula_per_candidate=formula_per_candidate == "on")
        identifier = open_identifier(bundle, lib, options, cache_dir=_cache_root(cache_dir, no_cache), progress=show)
        html = None
        if report_path:
            from molpredict.identification.identify import unique_ids
            from molpredict.report.page import Report, ReportOptions
            html = Report(ReportOptions(top_k=min(top_k, 5)))
            spectra = html.watch(unique_ids(spectra))   # the ids the rows will carry
        seen = None
        if hints:
            seen = _SeenIds()
            spectra = seen.watch(spectra)
        t0 = time.perf_counter()
        stdin_name = "-" if spool else None
        executor = _executor(cluster, say)  # a bad --cluster fails before a header reaches stdout or a file
        if output and output != "-":
            fingerprint = _run_fingerprint(spectra_file, spool, model_path, library, by, ppm, not ppm_only,
                                           sources, formulas, top_k, prior=prior,
                                           formula_per_candidate=formula_per_candidate)
            sink = ResumableOutput(output, out_format, columns, resume=resume, fingerprint=fingerprint)
            if sink.done:
                _restore(identifier, sink.blocks)
                say(f"resuming {output}: {sink.done} spectra already done")
        else:
            sink = None
            writer = ResultWriter(sys.stdout, out_format, columns, deferred=True)
        try:
            for block in identifier.run_blocks(spectra, executor=executor, start=sink.done if sink else 0):
                for row in block.rows:
                    if stdin_name:
                        row["file"] = stdin_name
                    (sink or writer).write(row)
                    if html is not None:
                        html.add_row(row)
                if sink:
                    sink.commit(identifier.n_queries, n_candidates=block.n_candidates,
                                skipped=[[s.query_id, s.reason, stdin_name or s.file, s.record]
                                         for s in block.skipped])
            if sink:
                sink.finish()
            else:
                writer.close()
        except BaseException:
            if sink:
                sink.close()
            raise
        finally:
            executor.close()
    except InputError as exc:
        if spool and (exc.path == spool or spool in exc.message):  # the user gave stdin, not our spool file
            raise InputError(exc.message.replace(spool, "<stdin>"), path="<stdin>" if exc.path == spool else
                             exc.path, record=exc.record, field=exc.field) from None
        raise
    finally:
        if spool:
            os.unlink(spool)
    skipped = skipped_entries(report, identifier)
    if stdin_name:
        for s in skipped:
            s.file = stdin_name
    summary = identifier.summary()
    if skipped_path:
        write_skipped(skipped, skipped_path)
    if html is not None:
        from molpredict.report.page import run_parameters
        for s in skipped:
            html.add_skipped(s.query_id, s.reason, s.file, s.record)
        html.parameters = run_parameters(bundle, lib.path or library, len(lib), options,
                                         spectra="(stdin)" if spool else spectra_file)
        size = html.write(report_path)
        say(f"report {report_path} ({size / 1e6:.2f} MB)")
    if not quiet:
        n_total = summary["n_queries"] + len(report)
        median = summary["candidates_median"]
        click.echo(f"molpredict: {n_total} spectra: {summary['n_identified']} identified, {len(skipped)} skipped "
                   f"({time.perf_counter() - t0:.1f} s; "
                   f"{'no candidates' if median is None else f'median {median} candidates'})", err=True)
        for line in skip_summary(skipped, listed_in=skipped_path):
            click.echo(f"  {line}", err=True)
    if seen is not None:
        unused = seen.unused(hints)
        if unused:  # a warning, not a status message: shown with -q too (as the library's skipped rows are)
            import warnings
            warnings.warn(f"{formulas}: {len(unused)} formula hint{'s' if len(unused) > 1 else ''} "
                          f"name{'' if len(unused) > 1 else 's'} no query in the input (first: {unused[0]})",
                          UserWarning, stacklevel=2)
    if summary["n_queries"] == 0 and len(report):  # bad input, as evaluate and properties predict say
        raise InputError(f"no readable spectrum ({len(report)} record{'s' if len(report) > 1 else ''} unreadable)",
                         path="<stdin>" if spool else spectra_file)
    if summary["n_identified"] == 0 and skipped:  # a batch job must not read an empty table as success (QA)
        from molpredict.report.page import reason_groups
        first = reason_groups(skipped, lambda s: s.reason)[0][0]  # grouped as the summary above groups them
        raise InputError(f"no spectrum identified: all {len(skipped)} skipped (most often: {first}); the "
                         f"skipped list says why for each", path="<stdin>" if spool else spectra_file)


def skip_summary(skipped: list, listed_in: str | None = None, shown: int = 3) -> list[str]:
    """One line per skip reason of identify's skips, saying where: ``skipped 2: no peaks (a.mgf records 4, 9)``
    (see :func:`_reason_lines`)."""
    def where(entries: list) -> str:
        places: dict[str, list[str]] = {}
        for s in entries:
            places.setdefault(s.file or "", []).append(str(s.record) if s.record is not None else (s.query_id or "?"))
        return "; ".join(f"{file} record{'s' if len(records) > 1 else ''} {', '.join(records)}" if file else
                         ", ".join(records) for file, records in places.items())

    return _reason_lines(skipped, lambda s: s.reason, where,
                         f"in {listed_in}" if listed_in else "with --skipped FILE", shown)


#: the most reason lines a skip summary prints; past them one line counts the rest (reasons that differ only by
#: their formula or mass window are one line already: see report.page.reason_groups)
MAX_REASON_LINES = 10


def _reason_lines(entries: list, reason_of: Callable[[Any], str], where: Callable[[list], str], all_of: str,
                  shown: int, max_lines: int = MAX_REASON_LINES) -> list[str]:
    """``skipped N: reason (where)`` per reason, most frequent first, reasons that differ only by their formula or
    mass window grouped (:func:`molpredict.report.page.reason_groups`, which the HTML report's summary uses too):
    ``where`` places the first ``shown`` entries of a reason, past them how many more and where all of them are
    (``all_of``). Past ``max_lines`` reasons, one line counts the entries of the others."""
    from molpredict.report.page import reason_groups

    ordered = reason_groups(entries, reason_of)
    if len(ordered) > max_lines:  # the last line counts the rest, so the summary stays within max_lines
        listed, rest = ordered[:max_lines - 1], ordered[max_lines - 1:]
    else:
        listed, rest = ordered, []
    lines = []
    for reason, group in listed:
        text = where(group[:shown])
        if len(group) > shown:
            text += f" and {len(group) - shown} more, all {all_of}"
        lines.append(f"skipped {len(group)}: {reason} ({text})")
    if rest:
        lines.append(f"skipped {sum(len(group) for _, group in rest)} more for {len(rest)} other reasons (all "
                     f"{all_of})")
    return lines


#: identify's options (parameter names) that only spectra use: a text query (--text, --text-file) has no precursor,
#: formula or spectrum to apply them to (--report has its own message)
_SPECTRA_ONLY = ("by", "ppm", "ppm_only", "formulas", "formula_per_candidate", "prior", "properties_path",
                 "skipped_path", "cluster", "resume", "block_queries")


def _refuse_spectra_options(ctx: click.Context) -> None:
    """Raise the one-line :class:`InputError` naming the spectra-only options the user set (on the command line or
    from the environment) to other values than their defaults, which text queries would silently ignore."""
    from click.core import ParameterSource

    given = []
    for param in ctx.command.params:
        if param.name not in _SPECTRA_ONLY:
            continue
        source = ctx.get_parameter_source(param.name)
        if source in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            continue
        if ctx.params.get(param.name) == param.get_default(ctx):
            continue
        given.append(next((opt for opt in param.opts if opt.startswith("--")), param.opts[0]))
    if given:
        raise InputError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to spectra only: not "
                         f"available for text queries (--text, --text-file)")


def _check_sources(lib, sources, library: str | None) -> None:
    """Raise the one-line :class:`InputError` when no row of the loaded library has any of the ``--source`` labels
    (every query would be skipped for want of candidates), listing the sources the library has."""
    if not sources or len(lib.select_by_source(list(sources))):
        return
    if lib.has_column("source"):
        from molpredict.chem.candidates import NO_SOURCE

        labels = sorted(label for label in lib.source_counts() if label != NO_SOURCE)
        shown = ", ".join(labels[:20]) + (f" and {len(labels) - 20} more" if len(labels) > 20 else "")
        has = f"its sources: {shown}" if labels else "its source column is empty"
    else:
        has = "it has no source column"
    raise InputError(f"no library row has --source {', '.join(sources)} ({has})", path=lib.path or library)


class _SeenIds:
    """The ids of the spectra a run reads (made unique, and their original ids), for the --formulas hints that name
    none of them; passes the spectra through unchanged."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def watch(self, spectra):
        from molpredict.identification.identify import ORIGINAL_ID, unique_ids

        for spectrum in unique_ids(spectra):
            self.ids.add(str(spectrum.id))
            if ORIGINAL_ID in spectrum.metadata:
                self.ids.add(str(spectrum.metadata[ORIGINAL_ID]))
            yield spectrum

    def unused(self, hints: dict[str, str]) -> list[str]:
        return [query for query in hints if query not in self.ids]


def _run_fingerprint(spectra_file, spool, model_path, library, by, ppm, precision_window, sources, formulas,
                     top_k, **settings) -> dict:
    """What an interrupted run and its resumption must share: the input (name, size, modification time), the
    model, the library and the options that change the output."""
    def describe(path):
        if not path:
            return None
        p = Path(path)
        stat = p.stat()
        return [str(p.resolve()), stat.st_size, stat.st_mtime_ns]

    import hashlib

    digest = None
    if spool:  # stdin has no name: its content identifies it
        digest = hashlib.sha256(Path(spool).read_bytes()).hexdigest()
    return {"input": digest or describe(spectra_file), "model": str(Path(model_path).resolve()) if model_path else None,
            "library": describe(library), "by": by, "ppm": ppm, "precision_window": precision_window,
            "sources": sorted(sources), "formulas": describe(formulas), "top_k": top_k, **settings}


def _restore(identifier, blocks: list[dict]) -> None:
    """The accounting of the blocks an interrupted run finished (from the resumable output's journal)."""
    from molpredict.identification.identify import Skipped

    for block in blocks:
        identifier.n_candidates.extend(block.get("n_candidates", []))
        identifier.skipped.extend(Skipped(q, reason, f or "", r) for q, reason, f, r in block.get("skipped", []))
    identifier.n_queries = blocks[-1]["done"] if blocks else 0
    identifier.n_identified = len(identifier.n_candidates)


def _identify_text(texts: list[str], text_file: str | None, model_path: str | None, library: str | None,
                   sources, top_k: int, output: str | None, out_format: str, cache_dir: str | None,
                   no_cache: bool, show: bool, quiet: bool) -> None:
    """``identify --text``: every description against the whole library (or its --source rows)."""
    from molpredict.api import text_file_queries, text_identifier, text_queries
    from molpredict.atomic import atomic_write
    from molpredict.io.results import ResultWriter

    say = _say(quiet)
    # before the model and the library are read: --text ones text1, text2, ..., a file's <stem>:<line>
    queries = (text_queries(list(texts), where="--text") if texts else []) + \
        (text_file_queries(text_file) if text_file else [])
    if not queries:
        raise InputError("no descriptions (only blank lines and # comments)" if text_file else "no descriptions",
                         path=text_file)
    bundle = _load_bundle(model_path, say)
    if bundle.input_type != "text":  # before the library is read
        raise InputError(f"the model takes {bundle.input_type} input, not text: give SPECTRA (not --text)",
                         path=str(bundle.path))
    lib = _load_library(library, say, show, cache=True)
    _check_sources(lib, sources, library)
    identifier = text_identifier(bundle, lib, top_k=top_k,
                                 sources=list(sources) or None, cache_dir=_cache_root(cache_dir, no_cache),
                                 progress=show)
    t0 = time.perf_counter()
    with (atomic_write(output, newline="") if output and output != "-" else contextlib.nullcontext(sys.stdout)
          ) as handle:
        writer = ResultWriter(handle, out_format)
        for row in identifier.run_text(queries):
            writer.write(row)
        writer.close()
    summary = identifier.summary()
    n_candidates = summary["candidates_max"] if summary["candidates_max"] is not None else len(lib)
    say(f"{summary['n_identified']} of {summary['n_queries']} descriptions identified against {n_candidates} "
        f"candidates, {summary['n_skipped']} skipped ({time.perf_counter() - t0:.1f} s)")
    if not quiet:  # --skipped is for spectra: the ids of the skipped descriptions are listed here
        for line in _reason_lines(identifier.skipped, lambda s: s.reason,
                                  lambda group: ", ".join(s.query_id for s in group), "without output rows", 5):
            click.echo(f"  {line}", err=True)


# ----------------------------------------------------------------------------------------------------------
# evaluate
# ----------------------------------------------------------------------------------------------------------

@cli.command()
@click.argument("spectra_files", metavar="SPECTRA...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--model", "model_paths", multiple=True, type=click.Path(),
              help="Model bundle (repeatable to compare models; default: the default bundle).")
@click.option("--candidates", "candidates_path", default=None, type=click.Path(dir_okay=False),
              help="Candidate sets JSON {query_inchikey14: [[inchikey14, smiles], ...]} (required for spectra).")
@click.option("--library", default=None, type=click.Path(dir_okay=False),
              help="Text pairs only: rank every description against this whole library (e.g. molecules.tsv).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON (one object per model).")
@click.option("--plot", default=None, type=click.Path(dir_okay=False),
              help="Write top-k curves to this image (format from the extension: .png, .pdf, .svg, ...).")
@click.option("--n-boot", default=1000, show_default=True, type=click.IntRange(min=0),
              help="Bootstrap resamples for the 95% intervals.")
@click.option("--seed", default=0, show_default=True, type=int, help="Bootstrap seed.")
@click.option("--cache-dir", default=None, type=str, help=_CACHE_DIR_HELP)
@click.option("--no-cache", is_flag=True, help=_NO_CACHE_HELP)
@click.option("--no-kernel-loss", is_flag=True, help="Skip the kernel loss (saves a pass over the queries).")
@click.option("--prior", "prior", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Fuse the bundle's structure prior into the score (when it has one); off: spectrum evidence only.")
@_cluster_option
@_progress_option
@_quiet_option
def evaluate(spectra_files, model_paths, candidates_path, library, as_json, plot, n_boot, seed, cache_dir, no_cache,
             no_kernel_loss, prior, cluster, progress, quiet) -> None:
    """Evaluate model bundles on labelled SPECTRA against candidate sets (the MassSpecGym protocol), or text
    models on description/SMILES pairs tables against a library (--library) or candidate sets.

    Each spectrum is one query ranked against the set of its true structure's InChIKey first block; a hit is a
    candidate with that first block. Reports hit@1/5/10/20, MRR and mean rank (ties counted against the truth,
    and the random-tie-break average), 95% bootstrap intervals, per-structure averages, the random-ranking
    expectation and the kernel loss.

    For text, each description is ranked against the whole --library (ChEBI-20: molecules.tsv) or its
    structure's candidate set; a hit is the same molecule (canonical isomeric SMILES, stereo included).
    """
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.identification.evaluate import evaluate as run_evaluation
    from molpredict.identification.evaluate import evaluate_text, format_report, plot_curves
    from molpredict.cli.paths import check_output_files, check_plot_file
    from molpredict.io.text_pairs import split_inputs

    check_output_files({"--plot": plot}, {f"SPECTRA {i + 1}": p for i, p in enumerate(spectra_files)} |
                       {"--candidates": candidates_path, "--library": library})
    check_plot_file(plot)  # its format and matplotlib: a failure after the evaluation would lose the results
    say = _say(quiet)
    text = split_inputs(spectra_files, what="evaluate")
    if text and bool(library) == bool(candidates_path):
        raise click.UsageError("text pairs need exactly one of --library and --candidates")
    if not text and library:
        raise click.UsageError("--library applies to text pairs; spectra are evaluated with --candidates")
    if not text and not candidates_path:
        raise click.UsageError("Missing option '--candidates'.")
    sets = None
    if candidates_path:
        sets = load_candidate_sets(candidates_path)
        say(f"{len(sets)} candidate sets from {candidates_path}")
    paths = list(model_paths) or [None]
    bundles = []
    for path in paths:
        bundle = _load_bundle(path, say)
        wanted = "text" if text else "spectrum"
        if bundle.input_type != wanted:
            raise InputError(f"the model takes {bundle.input_type} input, not "
                             f"{'text' if text else 'spectra'}", path=str(bundle.path))
        bundles.append((str(bundle.path), bundle))
    if len({label for label, _ in bundles}) != len(bundles):
        raise InputError("the same model was given twice")
    if text:
        lib = _load_library(library, say, _progress_default(progress), cache=True) if library else None
        results = evaluate_text(list(spectra_files), bundles, library=lib, sets=sets,
                                cache_root=_cache_root(cache_dir, no_cache), n_boot=n_boot, seed=seed,
                                kernel_loss=not no_kernel_loss, progress=_progress_default(progress))
    else:
        executor = _executor(cluster, say)
        try:
            results = run_evaluation(list(spectra_files), bundles, sets, cache_root=_cache_root(cache_dir, no_cache),
                                     n_boot=n_boot, seed=seed, kernel_loss=not no_kernel_loss,
                                     progress=_progress_default(progress), executor=executor, prior=prior == "on")
        finally:
            executor.close()
    # the sets are shared by the models: their left-out candidates once, one line each, then a count
    left_out = next(iter(results.values()), {}).get("candidates_left_out") or []
    for entry in left_out[:20]:
        say(f"warning: {candidates_path}: set {entry['set']}: candidate SMILES {entry['smiles']!r} "
            f"left out (RDKit cannot parse it)")
    if len(left_out) > 20:
        say(f"warning: {candidates_path}: {len(left_out)} unparsable candidates left out in all "
            f"({len(left_out) - 20} more than listed)")
    if as_json:
        # the results hold null, never NaN (see json_safe): allow_nan=False keeps it so for strict parsers
        click.echo(json.dumps(results, indent=2, allow_nan=False))
    else:
        click.echo(format_report(results))
    if plot:  # after the results are printed: a plot that fails does not lose them
        plot_curves(results, plot)
        say(f"top-k curves written to {plot}")


# ----------------------------------------------------------------------------------------------------------
# score-library
# ----------------------------------------------------------------------------------------------------------

@cli.command("score-library")
@click.argument("library", type=click.Path(dir_okay=False))
@click.option("--model", "model_path", default=None, type=click.Path(),
              help="Model bundle (default: the default bundle).")
@click.option("--ion-mode", type=click.Choice(["positive", "negative"]), multiple=True,
              help="Only these modes' models (default: all in the bundle).")
@click.option("--block-size", default=8192, show_default=True, type=click.IntRange(min=1),
              help="Molecules per computed and committed block.")
@click.option("--cache-dir", default=None, type=str,
              help="Candidate-coordinates cache, a directory or an fsspec URL such as s3://bucket/coords "
                   "(default: $MOLPREDICT_HOME/coordinates).")
@_cluster_option
@_progress_option
@_quiet_option
def score_library(library, model_path, ion_mode, block_size, cache_dir, cluster, progress, quiet) -> None:
    """Precompute candidate coordinates of a whole LIBRARY for a model (resumable: rerun after an interrupt)."""
    from molpredict.identification.scoring import score_library as run

    say = _say(quiet)
    show = _progress_default(progress)
    bundle = _load_bundle(model_path, say)
    lib = _load_library(library, say, show)
    executor = _executor(cluster, say)
    try:
        result = run(bundle, lib, cache_root=_cache_root(cache_dir, False), block_size=block_size,
                     ion_modes=list(ion_mode) or None, progress=show, log=say, executor=executor)
    finally:
        executor.close()
    for mode, info in result.items():
        rest = info["n_rows"] - info["n_computed"]
        say(f"{mode}: computed the coordinates of {info['n_computed']} of {info['n_rows']} library rows in "
            f"{info['time_s']:.1f} s ({info['n_blocks_computed']} blocks)"
            + (f"; the other {rest} were cached already or repeat a structure" if rest else "")
            + f"; cache {info['cache']}")


# ----------------------------------------------------------------------------------------------------------
# model info
# ----------------------------------------------------------------------------------------------------------

@cli.group("model")
def model_group() -> None:
    """Inspect and upgrade model bundles."""


@model_group.command("info")
@click.argument("model_path", metavar="[MODEL]", required=False, type=click.Path())
def model_info(model_path) -> None:
    """Show what a bundle holds: per ion mode the model, its components and the plugins that provide them,
    training data, licences and validation metrics. When a plugin it needs is missing (or another one provides
    a component's name), it shows the components and their providers, and the problem on stderr."""
    from molpredict.errors import PluginError
    from molpredict.modelfile import bundle_components, json_ready

    try:
        described = _load_bundle(model_path).describe()
    except PluginError as exc:  # what the bundle needs is what the user must find out: show it, do not fail
        from molpredict.config import resolve

        described = bundle_components(model_path or resolve("model")[0])
        click.echo(f"molpredict: warning: {exc}", err=True)
    click.echo(json.dumps(json_ready(described), indent=2))


@model_group.command("upgrade")
@click.argument("model_path", metavar="[MODEL]", required=False, type=click.Path())
@click.option("-o", "--output", default=None, type=click.Path(file_okay=False),
              help="Write the upgraded bundle here (default: replace MODEL in place, atomically).")
@_quiet_option
def model_upgrade(model_path, output, quiet) -> None:
    """Re-save a bundle in the current format: its fitted kernels' features are stored, so that it loads in
    milliseconds instead of recomputing them (a bundle saved by molpredict before 0.2). The model is unchanged:
    same predictions, same candidate-coordinates cache."""
    say = _say(quiet)
    t0 = time.perf_counter()
    bundle = _load_bundle(model_path)
    load_s = time.perf_counter() - t0
    stale = bundle.refitted_on_load()
    source = Path(bundle.path)
    target = Path(output) if output else source
    if output and source.resolve() in Path(output).resolve().parents:
        raise InputError("is inside the bundle it would be written from", path=output, field="-o")
    if not stale and target.resolve() == source.resolve():
        say(f"{source}: already current (loaded in {load_s:.2f} s); nothing to do")
        return
    path = bundle.save(target)
    if not stale:
        say(f"{source} is already current: copied to {path}")
        return
    t0 = time.perf_counter()
    _load_bundle(str(path))
    say(f"upgraded {source} -> {path}: loads in {time.perf_counter() - t0:.2f} s (was {load_s:.2f} s)")


# ----------------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------------

@cli.group()
def data() -> None:
    """Get training data: import MassBank records into split MGF files."""


def _print_import(summary: dict, out: str, shown: int = 3) -> None:
    """The import's summary on stderr; each skip reason says where, as `identify` does:
    ``skipped 2: no precursor m/z (A/x.txt, B/y.txt)`` (files relative to the input named first), past ``shown``
    files how many more and where all are listed."""
    click.echo(f"molpredict: {summary['source']}: {summary['n_imported']} of {summary['n_records']} records "
               f"imported into {out}", err=True)
    for name, n in summary["files"].items():
        click.echo(f"  {name}: {n} spectra", err=True)
    def where(entries: list[dict]) -> str:
        places = [entry["file"] + (f" record {entry['record']}" if entry["record"] is not None else "")
                  + (f": {entry['detail']}" if entry["detail"] else "") for entry in entries]
        return ("; " if any(entry["detail"] for entry in entries) else ", ").join(places)

    for line in _reason_lines(summary["skipped_records"], lambda entry: entry["reason"], where,
                              f"in {summary['skipped_list']}", shown):
        click.echo(f"  {line}", err=True)
    others = summary["not_records"]
    if others:
        more = f" and {len(others) - shown} more" if len(others) > shown else ""
        what = "file that is not a MassBank record" if len(others) == 1 else "files that are not MassBank records"
        click.echo(f"  ignored {len(others)} {what} ({', '.join(others[:shown])}{more})", err=True)


def _split_fractions(train: float, val: float) -> tuple[tuple[str, float], ...]:
    """The three split fractions from the two options (test takes the rest), or a one-line error naming the
    options and their values (the library's own check can only name the splits)."""
    import math

    rule = "the fractions must be from 0 to 1 and sum to at most 1"
    for option, value in (("--train-fraction", train), ("--val-fraction", val)):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise InputError(f"{option} {value:g}: {rule}")
    # rounded: 1 - 0.7 - 0.2 is 0.10000000000000003, and 1 - 0.9 - 0.1 a tiny negative, not what was meant
    test = round(1.0 - train - val, 12) + 0.0
    if test < 0:
        raise InputError(f"--train-fraction {train:g} and --val-fraction {val:g} leave {test:g} for test: {rule}")
    return ("train", train), ("val", val), ("test", test)


@data.command("import-massbank")
@click.argument("path", type=click.Path(exists=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--train-fraction", default=0.8, show_default=True, type=float,
              help="Share of structures in train, from 0 to 1.")
@click.option("--val-fraction", default=0.1, show_default=True, type=float,
              help="Share of structures in val; test gets the rest (the two must sum to at most 1).")
@_progress_option
def import_massbank(path, output, train_fraction, val_fraction, progress) -> None:
    """Import MassBank records (a MassBank-data checkout, or a .zip / .tar.gz release archive) into
    {train,val,test}_{pos,neg}.mgf, split by a hash of the InChIKey first block (structure-disjoint)."""
    from molpredict.data.massbank import import_massbank as run

    summary = run(path, output, fractions=_split_fractions(train_fraction, val_fraction),
                  progress=_progress_default(progress))
    _print_import(summary, output)


@data.group("fetch")
def fetch() -> None:
    """Download a public data set and import it (needs internet)."""


def _check_url(url: str | None) -> None:
    """``--url``: a URL to download from, or a one-line usage error (exit 2) naming the option, before the output
    folder is created or a connection tried (the library's own check cannot name the option)."""
    from molpredict.data.massbank import url_problem

    problem = None if url is None else url_problem(url)
    if problem:
        raise InputError(f"--url {url!r}: not a URL to download from ({problem})")


@fetch.command("massbank")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--release", default="2025.05.1", show_default=True, help="MassBank-data release tag.")
@click.option("--keep-archive", is_flag=True, help="Keep the downloaded .tar.gz next to the MGF files.")
@click.option("--url", default=None, help="Download from this URL instead of GitHub (a mirror of the .tar.gz).")
@_progress_option
def fetch_massbank(output, release, keep_archive, url, progress) -> None:
    """Download the MassBank-data release archive from GitHub and import it (see `data import-massbank`).
    An interrupted download resumes where it stopped when run again."""
    from molpredict.data.massbank import fetch_massbank as run

    _check_url(url)
    summary = run(output, release=release, keep_archive=keep_archive, progress=_progress_default(progress),
                  url=url)
    _print_import(summary, output)
