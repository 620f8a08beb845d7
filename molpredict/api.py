"""The public Python API: what each command does, as one function taking what users hold (paths, molpredict or
matchms spectra) and returning what they use (a pandas DataFrame, a model bundle, a metrics dict).

The command-line interface is a thin layer over these functions (:mod:`molpredict.cli`). Everything is imported
on first use, so ``import molpredict`` stays cheap.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from molpredict.errors import InputError, ModelFileError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from molpredict.chem.candidates import CandidateLibrary
    from molpredict.identification.identify import Identifier, IdentifyOptions, Skipped
    from molpredict.io import SkipReport
    from molpredict.modelfile import ModelBundle

__all__ = ["identify", "identify_text", "train", "evaluate", "load_model", "load_library", "iter_spectra", "open_identifier",
           "skipped_entries", "predict_properties", "load_properties"]

PathLike = str | os.PathLike


def load_model(path: "PathLike | ModelBundle | None" = None) -> "ModelBundle":
    """A model bundle: ``path``, an already loaded :class:`~molpredict.modelfile.ModelBundle` (returned as is), else
    the default one (``molpredict config set model``, ``MOLPREDICT_MODEL``, or the bundle ``make demo`` trains).

    Raises
    ------
    ModelFileError
        No default model exists, or the bundle is unreadable (one line naming the file and field).
    """
    from molpredict.config import resolve
    from molpredict.modelfile import ModelBundle

    if isinstance(path, ModelBundle):
        return path
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InputError(f"model must be a path or a loaded ModelBundle, not {type(path).__name__}")
    if path is None:
        default, origin = resolve("model")
        if origin == "default" and not Path(default).exists():
            raise ModelFileError(f"{default}: no default model; train one with `molpredict train TRAIN.mgf -o "
                                 f"{default}` (or `make demo`), give --model, or set one with "
                                 f"`molpredict config set model MODEL`")
        if not Path(default).exists():  # a configured model since deleted: say where the path came from
            raise ModelFileError(f"{default}: model bundle not found; it is the model set by the {origin}: give "
                                 f"--model, or `molpredict config set model MODEL` (or unset it)")
        path = default
    return ModelBundle.load(path)


def library_path(library: PathLike | None) -> str:
    """``library``, else the configured default library; without either, the one-line error saying how to set one."""
    from molpredict.config import no_library_message, resolve

    if library:
        return str(library)
    library, origin = resolve("library")
    if library is None:
        raise InputError(no_library_message())
    if not Path(library).exists():  # a configured library since moved or deleted: say where the path came from
        raise InputError(f"{library}: no such file; it is the library set by the {origin}: give --library, or "
                         f"`molpredict config set library LIB` (or unset it)")
    return str(library)


def load_library(library: "PathLike | CandidateLibrary | None" = None, *, progress: bool = False,
                 cache: bool | None = None) -> "CandidateLibrary":
    """A candidate library: a path (TSV / SMILES / SDF, optionally gzipped; see ``candidates/README.md``), an
    already loaded :class:`~molpredict.chem.candidates.CandidateLibrary` (returned as is), or None for the
    configured default."""
    from molpredict.chem.candidates import CandidateLibrary
    from molpredict.identification.scoring import load_library_once

    if isinstance(library, CandidateLibrary):
        return library
    if library is not None and not isinstance(library, (str, os.PathLike)):
        raise InputError(f"library must be a path or a CandidateLibrary (molpredict.load_library), "
                         f"not {type(library).__name__}")
    _check_flag("progress", progress)
    if cache is not None:
        _check_flag("cache", cache)
    # read once per process and known by its file: cluster workers read it themselves (no pickled copy)
    path = library_path(library)
    from molpredict.chem.candidates import check_usable

    return check_usable(load_library_once(path, progress=progress, cache=cache), path)


def iter_spectra(spectra: Any, report: "SkipReport | None" = None) -> Iterator[Any]:
    """molpredict :class:`~molpredict.spectra.record.Spectrum` records from what a user holds.

    Parameters
    ----------
    spectra : path, sequence of paths, Spectrum, matchms.Spectrum, or a sequence of spectra
        Files (``.mgf``, ``.msp``, ``.mzML``, ``.mzXML``, optionally gzipped) are streamed; matchms spectra are
        converted with :func:`molpredict.io.matchms.from_matchms` (their ``record`` is their 1-based position).
    report : SkipReport, optional
        Collects unreadable records of files and unusable matchms spectra (non-finite peaks, a non-numeric
        precursor m/z...; file ``""``, record their position): they are skipped, not raised.

    Raises
    ------
    InputError
        An object that is none of these, or a file that cannot be read.
    """
    from molpredict.io import read_spectra

    for item in _spectra_items(spectra, report):
        if isinstance(item, (str, os.PathLike)):
            yield from read_spectra(item, report=report)
        else:
            yield item


def _spectra_items(spectra: Any, report: "SkipReport | None" = None) -> Iterator[Any]:
    """What :func:`iter_spectra` and :func:`spectra_files` take, item by item: a path (checked to be one), or a
    molpredict Spectrum (a matchms one converted; ``record`` its 1-based position where it has none). A matchms
    spectrum that cannot be converted goes to ``report`` and is left out (raised without a report): one NaN peak
    among thousands of spectra must not stop the run that the same record in an MGF file would not stop."""
    from molpredict.io.matchms import convert_or_skip, is_matchms_spectrum
    from molpredict.spectra.record import Spectrum

    if isinstance(spectra, (str, os.PathLike)) or isinstance(spectra, Spectrum) or is_matchms_spectrum(spectra):
        spectra = [spectra]
    _check_spectra_container(spectra)
    for index, item in enumerate(spectra, start=1):
        if isinstance(item, (str, os.PathLike)):
            yield _checked_path(item)
        elif isinstance(item, Spectrum):
            yield item if item.record is not None else _with_record(item, index)
        elif is_matchms_spectrum(item):
            converted = convert_or_skip(item, index, report)
            if converted is not None:
                yield converted
        else:
            raise InputError(f"not a spectrum or a path: {type(item).__name__}", path="spectra", record=index)


def _checked_path(path: "str | os.PathLike") -> "str | os.PathLike":
    """``path``, or the one-line :class:`InputError` when a string is a file's content rather than its name."""
    if isinstance(path, str) and "\n" in path:
        raise InputError("spectra: a path, not a file's content (write it to a file, or give Spectrum records)")
    if os.path.isdir(path):  # else refused as "unknown spectra format '(no extension)'"
        raise InputError("is a directory, not a spectra file (give the files in it, e.g. "
                         "sorted(Path(folder).glob('*.mgf')))", path=os.fspath(path))
    return path


def _check_spectra_container(spectra: Any) -> None:
    """Raise the one-line :class:`InputError` for what is not a sequence of paths or spectra: iterating a dict or a
    DataFrame would read its keys as file names, and bytes as numbers."""
    if isinstance(spectra, (bytes, bytearray, Mapping)) or hasattr(spectra, "columns") or \
            not isinstance(spectra, Iterator) and not hasattr(spectra, "__iter__"):
        raise InputError(f"spectra must be a path, a Spectrum or matchms.Spectrum, or a list of them, "
                         f"not {type(spectra).__name__}")


def _with_record(spectrum: Any, index: int) -> Any:
    import dataclasses
    return dataclasses.replace(spectrum, record=index)


@contextlib.contextmanager
def spectra_files(spectra: Any) -> Iterator[list[str]]:
    """File paths for the jobs that read files (training, evaluation) from what :func:`iter_spectra` takes: paths as
    they are, each run of in-memory spectra (molpredict or matchms) written to a temporary MGF, which
    :func:`~molpredict.io.write_mgf` writes so that it reads back bit for bit (metadata such as SMILES included),
    and removed on exit. A spectrum's ``record`` in messages is then its 1-based position within its run. A
    matchms spectrum that cannot be converted (non-finite peaks, ...) is left out with one warning naming its
    position and reason, as a file reader without a skip report says what it dropped.
    """
    import tempfile

    from molpredict.io import SkipReport, write_mgf

    if isinstance(spectra, (str, os.PathLike)):  # the common case: no temporary folder
        yield [os.fspath(_checked_path(spectra))]
        return
    with tempfile.TemporaryDirectory(prefix="molpredict-spectra-") as directory:
        paths: list[str] = []
        run: list[Any] = []

        def flush() -> None:
            if run:
                path = os.path.join(directory, f"spectra-{len(paths) + 1}.mgf")
                write_mgf(run, path)
                paths.append(path)
                run.clear()

        report = SkipReport()
        for item in _spectra_items(spectra, report):
            if isinstance(item, (str, os.PathLike)):
                flush()
                paths.append(os.fspath(item))
            else:
                run.append(item)
        flush()
        if report:
            import logging
            first = report.entries[0]
            logging.getLogger("molpredict.io").warning(
                "matchms spectra: skipped %d unusable spectr%s (%s; first: record %d, %s)", len(report),
                "a" if len(report) > 1 else "um", ", ".join(f"{n} {r}" for r, n in report.by_reason().items()),
                first.record, first.spectrum_id)
        yield paths


def _check_number(name: str, value: Any, *, integer: bool = False, minimum: float | None = None,
                   positive: bool = False) -> None:
    """Raise the one-line :class:`InputError` unless ``value`` is a number (an integer) in range (a bool is not)."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InputError(f"{name} must be {'an integer' if integer else 'a number'}, not {value!r}")
    if not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, not {value!r}")
    if positive and not value > 0 or minimum is not None and not value >= minimum:
        raise InputError(f"{name} must be {'> 0' if positive else f'>= {minimum}'}, not {value!r}")


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InputError(f"{name} must be True or False, not {value!r}")


def _check_cluster(cluster: Any) -> None:
    """Raise the one-line :class:`InputError` unless ``cluster`` is an address string or None (a number reached
    the executor's string handling as an AttributeError)."""
    if cluster is not None and not isinstance(cluster, str):
        raise InputError(f"cluster must be 'local:N', a scheduler address or None, not {type(cluster).__name__} "
                         f"{cluster!r}")


def identify_options(*, top_k: int = 10, by: str | None = None, ppm: float = 10.0, precision_window: bool = True,
                     sources: Sequence[str] | None = None, formulas: "PathLike | dict[str, str] | None" = None,
                     block_queries: int = 512, prior: bool = True, properties: Any = None,
                     formula_per_candidate: bool = True) -> "IdentifyOptions":
    """The options of an identification run, checked (``formulas``: a ``query_id<TAB>formula`` file or a dict;
    ``properties``: a loaded property model, see :func:`load_properties`)."""
    from molpredict.identification.identify import IdentifyOptions, read_formula_hints

    if by not in (None, "formula", "mass"):
        raise InputError(f"by must be 'formula', 'mass' or None, not {by!r}")
    _check_number("top_k", top_k, integer=True, minimum=1)
    _check_number("ppm", ppm, positive=True)
    _check_number("block_queries", block_queries, integer=True, minimum=1)
    for name, flag in (("prior", prior), ("precision_window", precision_window),
                       ("formula_per_candidate", formula_per_candidate)):
        _check_flag(name, flag)
    sources = check_sources(sources)
    if formulas is not None and not isinstance(formulas, (str, os.PathLike, Mapping)):
        raise InputError(f"formulas must be a file of query_id<TAB>formula lines or a dict, "
                         f"not {type(formulas).__name__}")
    hints = read_formula_hints(formulas) if isinstance(formulas, (str, os.PathLike)) else \
        formula_hints(formulas) if formulas is not None else None
    return IdentifyOptions(by=by, ppm=ppm, precision_window=precision_window, sources=list(sources) if sources else None,
                           top_k=top_k, formulas=hints, block_queries=block_queries,
                           prior=prior, properties=properties, formula_per_candidate=formula_per_candidate)


def check_sources(sources: Any) -> list[str] | None:
    """``sources`` as a list of source names (one name given alone is that source, not its letters), None for
    none; the one-line :class:`InputError` for anything else (a number reached the library filter as an Arrow
    type error, deep inside pyarrow)."""
    if sources is None:
        return None
    if isinstance(sources, str):
        return [sources]
    if isinstance(sources, (bytes, bytearray, Mapping)) or not hasattr(sources, "__iter__"):
        raise InputError(f"sources must be a source name or a list of them, not {type(sources).__name__}")
    names = list(sources)
    for name in names:
        if not isinstance(name, str):
            raise InputError(f"sources must be source names (strings), not {type(name).__name__} {name!r}")
    return names or None


def formula_hints(formulas: Mapping) -> dict[str, str]:
    """A dict of formula hints checked and normalised as :func:`~molpredict.identification.identify.read_formula_hints`
    reads a hints file: a hint that does not parse would otherwise replace the spectrum's own FORMULA and leave it
    to be selected by mass without a word. Raises the one-line :class:`InputError` naming the query id."""
    from molpredict.identification.identify import normalized_hint

    hints: dict[str, str] = {}
    for query, formula in formulas.items():
        if not isinstance(query, str):
            raise InputError(f"query ids must be strings (spectrum ids), not {type(query).__name__} {query!r}",
                             path="formulas")
        if not isinstance(formula, str):
            raise InputError(f"a formula must be a string, not {type(formula).__name__} {formula!r}",
                             path="formulas", record=query, field="formula")
        hints[query] = normalized_hint(formula, "formulas", record=query)
    return hints


def load_properties(model: Any) -> tuple[Any, tuple[str, ...]]:
    """``(property model or None, output columns)``: the identification columns, then each property's median and
    interval (``prop_<name>``, ``prop_<name>_low``, ``prop_<name>_high``) when a property model is given (a path
    written by ``molpredict properties train``, or a loaded ``PropertyBundle``)."""
    from molpredict.io.results import OUTPUT_COLUMNS

    if model is None:
        return None, tuple(OUTPUT_COLUMNS)
    from molpredict.properties.model import PropertyBundle
    from molpredict.properties.pipeline import output_columns

    if not isinstance(model, (PropertyBundle, str, os.PathLike)):
        raise InputError(f"properties must be a property model's path or a PropertyBundle, not "
                         f"{type(model).__name__}")
    bundle = model if isinstance(model, PropertyBundle) else PropertyBundle.load(os.fspath(model))
    return bundle, tuple(OUTPUT_COLUMNS) + tuple(output_columns(bundle.names))


def coordinates_root(cache_dir: "PathLike | None | bool") -> "Path | str | None | bool":
    """The candidate-coordinates store a run uses: ``cache_dir`` as a path, an fsspec URL (``s3://bucket/coords``)
    as it is (a ``Path`` would fold its ``//`` into a local folder ``s3:/bucket``), None for the default one, False
    for none."""
    if cache_dir is False:
        return False
    if cache_dir is not None and (isinstance(cache_dir, bool) or not isinstance(cache_dir, (str, os.PathLike))):
        raise InputError(f"cache_dir must be a path, a URL, None (the default store) or False (none), "
                         f"not {type(cache_dir).__name__} {cache_dir!r}")
    if not cache_dir:
        return None
    return str(cache_dir) if "://" in str(cache_dir) else Path(cache_dir)


def check_spectra_model(bundle: "ModelBundle") -> None:
    """Raise the one-line :class:`InputError` when ``bundle`` does not take spectra (a text model)."""
    if bundle.input_type != "spectrum":
        raise InputError(f"the model takes {bundle.input_type} input, not spectra: give --text or --text-file "
                         f"(molpredict.identify_text from Python)", path=str(bundle.path))


def text_queries(texts: "str | Sequence[str]", where: str = "texts") -> list[tuple[str, str, str, int]]:
    """Descriptions as queries ``(query_id, description, file, record)``: ``("text1", description, "", 1), ...``
    (``record`` the 1-based position in ``texts``), whitespace collapsed; a one-line :class:`InputError` naming
    ``where`` and the position of what is not a non-empty string. A list has no blank-line convention (a file's
    blank lines are passed over, :func:`text_file_queries`), so an empty string in it is refused, not dropped:
    dropping it would shift the answers against the caller's list."""
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, (bytes, bytearray, Mapping)) or not hasattr(texts, "__iter__"):
        raise InputError(f"texts must be a description or a list of them, not {type(texts).__name__}")
    queries = []
    for i, text in enumerate(texts, start=1):
        if not isinstance(text, str):
            raise InputError(f"a description must be a string, not {type(text).__name__}", path=where, record=i)
        text = " ".join(text.split())
        if not text:
            raise InputError(f"empty description at position {i}: leave it out (an empty string is no query)",
                             path=where)
        queries.append((f"text{i}", text, "", i))
    if not queries:
        raise InputError("no descriptions", path=where)
    return queries


def text_file_queries(path: PathLike) -> list[tuple[str, str, str, int]]:
    """The descriptions of a file, one per line, as queries ``(query_id, description, file, line)``: the id
    ``<file stem>:<line>`` (the spectra readers' id for a record without one), which neither shifts when blank
    lines are added nor collides with the ``text<n>`` ids of descriptions given one by one (``--text``). Blank
    lines and ``#`` comments are not queries (:func:`~molpredict.io.text_pairs.read_text_queries`)."""
    from molpredict.io.common import file_stem
    from molpredict.io.text_pairs import read_text_queries

    stem = file_stem(path)
    return [(f"{stem}:{line}", text, os.fspath(path), line) for line, text in read_text_queries(path)]


def text_identifier(model: "PathLike | ModelBundle | None" = None,
                    library: "PathLike | CandidateLibrary | None" = None, *, top_k: int = 10,
                    sources: Sequence[str] | None = None, cache_dir: PathLike | None | bool = None,
                    progress: bool = False) -> "Identifier":
    """The identifier of descriptions (:func:`text_queries`) against a text model; the library read with its
    cache."""
    from molpredict.identification.candidate_sources import LibrarySource
    from molpredict.identification.identify import Identifier

    bundle = load_model(model)
    if bundle.input_type != "text":
        raise InputError(f"the model takes {bundle.input_type} input, not text: give spectra (SPECTRA; "
                         f"molpredict.identify from Python)", path=str(bundle.path))
    options = identify_options(top_k=top_k, sources=sources)
    lib = load_library(library, progress=progress, cache=True)
    return Identifier(bundle, LibrarySource(lib, options), options, cache_root=coordinates_root(cache_dir),
                      progress=progress)


def identify_text(texts: "str | Sequence[str]", model: "PathLike | ModelBundle | None" = None,
                  library: "PathLike | CandidateLibrary | None" = None, *, top_k: int = 10,
                  sources: Sequence[str] | None = None, cache_dir: PathLike | None | bool = None,
                  progress: bool = False) -> "pd.DataFrame":
    """Rank the library's molecules for each description with a text model, as ``molpredict identify --text``
    does (every description against the whole library, or its ``sources`` rows).

    Returns
    -------
    pandas.DataFrame
        One row per (description, rank), the command's columns; ``query_id`` is ``text1``, ``text2``, ... in
        the order given and ``record`` the description's 1-based position. ``df.attrs["skipped"]`` lists the
        descriptions without rows as dicts ``{query_id, reason, file, record}`` (one with no word the model
        knows, which every candidate would score alike); ``df.attrs["summary"]`` the run's counts.

    Raises
    ------
    InputError
        A description that is not a string or is empty (naming its position), or no descriptions.
    """
    import pandas as pd

    from molpredict.io.results import OUTPUT_COLUMNS

    queries = text_queries(texts)
    _check_flag("progress", progress)
    coordinates_root(cache_dir)  # a wrong type named before the model and library are read
    identifier = text_identifier(model, library, top_k=top_k, sources=sources, cache_dir=cache_dir,
                                 progress=progress)
    frame = pd.DataFrame(list(identifier.run_text(queries)), columns=list(OUTPUT_COLUMNS))
    frame.attrs["skipped"] = [{"query_id": s.query_id, "reason": s.reason, "file": s.file, "record": s.record}
                              for s in identifier.skipped]
    frame.attrs["summary"] = identifier.summary()
    return frame


def open_identifier(bundle: "ModelBundle", library: "CandidateLibrary", options: "IdentifyOptions", *,
                    cache_dir: PathLike | None | bool = None, progress: bool = False) -> "Identifier":
    """The :class:`~molpredict.identification.identify.Identifier` of a spectra model against a library
    (``cache_dir``: the candidate-coordinates store; None the default one, False none)."""
    from molpredict.identification.candidate_sources import LibrarySource
    from molpredict.identification.identify import Identifier

    check_spectra_model(bundle)
    cache_root = coordinates_root(cache_dir)
    return Identifier(bundle, LibrarySource(library, options), options, cache_root=cache_root, progress=progress)


def skipped_entries(report: "SkipReport", identifier: "Identifier") -> list["Skipped"]:
    """Every spectrum without output rows: unreadable records of the files, then those the run skipped.

    An unreadable record's ``query_id`` is the id its reader would have given it (``SkipEntry.spectrum_id``: its
    TITLE, DB# or scan id, else ``"<file stem>:<record>"``, as the rows of a readable record carry; such a record
    takes no part in numbering repeated ids ``#2``), empty where the reader could not tell it."""
    from molpredict.identification.identify import Skipped

    return [Skipped(e.spectrum_id or "", f"unreadable record: {e.reason}", e.path, e.record)
            for e in report] + identifier.skipped


def identify(spectra: Any, model: "PathLike | ModelBundle | None" = None,
             library: "PathLike | CandidateLibrary | None" = None, *, top_k: int = 10, by: str | None = None,
             ppm: float = 10.0, prior: bool = True, cluster: str | None = None,
             formulas: "PathLike | dict[str, str] | None" = None, sources: Sequence[str] | None = None,
             precision_window: bool = True, cache_dir: PathLike | None | bool = None, block_queries: int = 512,
             properties: Any = None, formula_per_candidate: bool = True,
             progress: bool = False) -> "pd.DataFrame":
    """Rank the library's candidate structures for each spectrum, as ``molpredict identify`` does.

    Parameters
    ----------
    spectra : path, sequence of paths, Spectrum or matchms.Spectrum objects
        See :func:`iter_spectra`.
    model : path or ModelBundle, optional
        Default: the default bundle (:func:`load_model`).
    library : path or CandidateLibrary, optional
        Default: the configured library (``molpredict config set library LIB``).
    top_k : int
        Rows per spectrum.
    by : {None, "formula", "mass"}
        Candidates with the spectrum's formula or within ``ppm`` of its neutral mass; None (the command's
        default): by formula when the spectrum has one (or ``formulas`` gives one), else by mass.
    ppm : float
        Mass window for selection by mass (widened to what a low-precision precursor allows unless
        ``precision_window`` is False).
    prior : bool
        Fuse the bundle's structure prior into the score (False: the spectrum evidence alone).
    cluster : str, optional
        ``local:N`` or a Dask scheduler address (default ``$MOLPREDICT_CLUSTER``, else in-process); the rows are
        identical either way.
    formulas : path or dict, optional
        Per-query formula hints (``query_id -> formula``).
    sources : sequence of str, optional
        Only library rows of these sources.
    cache_dir : path, None or False
        The candidate-coordinates store (None: the default one; False: none).
    properties : path or PropertyBundle, optional
        A property model (``molpredict properties train``): adds each property's median and interval per query.
    formula_per_candidate : bool
        Without a formula, score each candidate with the formula annotation of its own formula (the command's
        ``--formula-per-candidate on``, the default); False annotates once, as the bundle was trained.

    Returns
    -------
    pandas.DataFrame
        One row per (spectrum, rank) with exactly the command's output columns
        (:data:`molpredict.io.results.OUTPUT_COLUMNS`, then ``prop_*`` with ``properties``), in input order. ``df.attrs["skipped"]`` lists the spectra
        without rows as dicts ``{query_id, reason, file, record}``; ``df.attrs["summary"]`` the run's counts.
        For matchms or in-memory spectra, ``record`` is the spectrum's 1-based position in ``spectra``.
    """
    import pandas as pd

    from molpredict.identification.scoring import executor_for
    from molpredict.io import SkipReport

    # every argument checked before the model and the library are read (a minute of loading, then a type error)
    _check_flag("progress", progress)
    _check_cluster(cluster)
    coordinates_root(cache_dir)
    _check_spectra_container(spectra)
    if isinstance(spectra, Sequence) and not isinstance(spectra, str) and not spectra:
        # as identify_text([]) and train([]) say: an empty list is a mistake upstream (a filter that kept
        # nothing), not a run whose answer is an empty table
        raise InputError("no spectra given (spectra is empty)")
    property_model, columns = load_properties(properties)
    options = identify_options(top_k=top_k, by=by, ppm=ppm, precision_window=precision_window, sources=sources,
                               formulas=formulas, block_queries=block_queries, prior=prior,
                               properties=property_model, formula_per_candidate=formula_per_candidate)
    report = SkipReport()
    stream = iter_spectra(spectra, report=report)
    bundle = load_model(model)
    check_spectra_model(bundle)
    identifier = open_identifier(bundle, load_library(library, progress=progress), options, cache_dir=cache_dir,
                                 progress=progress)
    executor = executor_for(cluster)
    try:
        rows = list(identifier.run(stream, executor=executor))
    finally:
        executor.close()
    frame = pd.DataFrame(rows, columns=list(columns))
    frame.attrs["skipped"] = [{"query_id": s.query_id, "reason": s.reason, "file": s.file, "record": s.record}
                              for s in skipped_entries(report, identifier)]
    frame.attrs["summary"] = identifier.summary()
    return frame


#: the training options that name a component, with the registry kind of each
_COMPONENT_OPTIONS = {"input_kernel": "input_kernel", "output_kernel": "output_kernel", "input_sketch": "sketch",
                      "output_sketch": "sketch"}


def _init_params(component: Any) -> dict[str, Any] | None:
    """The parameters that rebuild ``component``, or None when they cannot be read back as spec values: its
    ``get_params()`` (a :class:`~molpredict.component.Component`, sklearn style), else the attributes named as its
    ``__init__`` parameters; every value a JSON scalar."""
    import inspect

    if callable(getattr(component, "get_params", None)):
        params = component.get_params()
    else:
        try:
            names = [p.name for p in inspect.signature(type(component).__init__).parameters.values()
                     if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):
            return None
        if not all(hasattr(component, name) for name in names):
            return None
        params = {name: getattr(component, name) for name in names}
    if not isinstance(params, dict) or not all(v is None or isinstance(v, (bool, int, float, str))
                                               for v in params.values()):
        return None
    return dict(params)


def _component_option(option: str, value: Any) -> Any:
    """A training option naming a component as a spec string: an instance (or class) of a registered component
    becomes the spec that rebuilds it (its registry name and parameters; it is rebuilt unfitted), anything else is
    passed on as given.

    Raises
    ------
    SpecError
        The class is not registered as the option's kind, or the instance's parameters cannot be read back from
        its spec (the message says to pass the registered name or spec string instead).
    """
    import inspect

    from molpredict.errors import SpecError
    from molpredict.specs import ComponentSpec, nested_spec

    kind = _COMPONENT_OPTIONS.get(option)
    if kind is None or value is None or isinstance(value, (str, ComponentSpec, numbers.Number)):
        return value
    from molpredict.registry import get_registry

    registry = get_registry()
    cls = value if inspect.isclass(value) else type(value)
    entry = registry.entry_of(cls, (kind,))
    what = kind.replace("_", " ")
    advice = (f"pass its registered name or spec string instead ({option}='NAME:key=value,...'; "
              "`molpredict plugins list`)")
    if entry is None:
        raise SpecError(f"{option}: {cls.__name__} is not a registered {what}; {advice}")
    if inspect.isclass(value):
        return entry.name
    params = _init_params(value)
    text = None if params is None else str(ComponentSpec(entry.name, params))
    if text is None or _read_back(registry, kind, nested_spec(text)) != params:
        raise SpecError(f"{option}: the parameters of this {entry.name!r} {what} ({cls.__name__}) cannot be written "
                        f"as a spec; {advice}")
    return text


def _read_back(registry: Any, kind: str, text: str) -> dict[str, Any] | None:
    """The parameters of the component that the training builds from the spec ``text`` (read as it reads the
    option: a value holding ',', ';' or '|' does not survive that), or None when it builds none."""
    from molpredict.errors import SpecError

    try:
        return _init_params(registry.create(kind, text))
    except SpecError:
        return None


def train(train: Any, val: Any = (), *,
          output: PathLike | None = None, progress: bool = False, log: Callable[[str], None] | None = None,
          **options: Any) -> "ModelBundle":
    """Train a model bundle, as ``molpredict train`` does.

    Parameters
    ----------
    train, val : path, sequence of paths, Spectrum or matchms.Spectrum objects
        Labelled spectra (SMILES / INCHIKEY metadata; in-memory spectra as :func:`spectra_files` writes them), or
        description/SMILES tables for a text model.
    output : path, optional
        Save the bundle there too.
    **options
        Fields of :class:`~molpredict.training.pipeline.TrainOptions` (``model``, ``input_kernel``,
        ``output_kernel``, ``input_sketch``, ``output_sketch``, ``lam``, ``ion_modes``, ``device``, ``seed``,
        ``select_by``, ``val_candidates``, ``library``, ``prior``, ``fragments``, ...). A kernel or sketch may be
        given as an instance of a registered class: it is rebuilt, unfitted, from its registry name and parameters.

    Returns
    -------
    ModelBundle
        With the training summary in ``bundle.summary``.
    """
    import dataclasses

    from molpredict.training.pipeline import TrainOptions, train_bundle

    _check_flag("progress", progress)
    if log is not None and not callable(log):
        raise InputError(f"log must be a function taking a message (print, say), not {type(log).__name__}")
    if output is not None and not isinstance(output, (str, os.PathLike)):
        raise InputError(f"output must be a path, not {type(output).__name__}")
    known = {f.name for f in dataclasses.fields(TrainOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InputError(f"unknown training option(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    options = {key: _component_option(key, value) for key, value in options.items()}
    if output is not None:
        from molpredict.modelfile import check_bundle_output
        check_bundle_output(output)  # before the training, which the refusal would waste
    with spectra_files(train) as paths, spectra_files(val) as val_paths:
        if not paths:
            raise InputError("no training spectra given (train is empty)")
        bundle, summary = train_bundle(paths, TrainOptions(**options), val_paths=val_paths, progress=progress,
                                       log=log)
    bundle.summary = summary
    if output is not None:
        summary["output"] = str(bundle.save(output))
    return bundle


def evaluate(spectra: Any, candidates: "PathLike | Mapping[str, Any]", model: "PathLike | ModelBundle | None" = None,
             *, prior: bool = True, n_boot: int = 1000, seed: int = 0, kernel_loss: bool = True,
             cluster: str | None = None, cache_dir: PathLike | None | bool = None,
             progress: bool = False) -> dict[str, Any]:
    """Evaluate a model on labelled spectra against candidate sets (the MassSpecGym protocol), as
    ``molpredict evaluate --json`` does.

    Parameters
    ----------
    spectra : path, sequence of paths, Spectrum or matchms.Spectrum objects
        Spectra with SMILES / INCHIKEY metadata (in-memory spectra as :func:`spectra_files` writes them).
    candidates : path or dict
        Candidate sets JSON ``{query_inchikey14: [[inchikey14, smiles], ...]}``, or that dict.

    Returns
    -------
    dict
        The command's JSON: per model, hit@k, MRR, bootstrap intervals, per-structure means, calibration.
    """
    from molpredict.identification.evaluate import evaluate as run_evaluation
    from molpredict.identification.scoring import executor_for

    _check_flag("prior", prior)
    _check_flag("kernel_loss", kernel_loss)
    _check_flag("progress", progress)
    _check_cluster(cluster)
    _check_number("n_boot", n_boot, integer=True, minimum=0)
    _check_number("seed", seed, integer=True)
    cache_root = coordinates_root(cache_dir)
    bundle = load_model(model)
    if bundle.input_type != "spectrum":
        raise InputError(f"the model takes {bundle.input_type} input, not spectra", path=str(bundle.path))
    sets = _candidate_sets(candidates)
    with spectra_files(spectra) as paths:
        executor = executor_for(cluster)
        try:
            return run_evaluation(paths, [(str(bundle.path), bundle)], sets,
                                  cache_root=cache_root, n_boot=n_boot, seed=seed, kernel_loss=kernel_loss,
                                  progress=progress, executor=executor, prior=prior)
        finally:
            executor.close()


def _candidate_sets(candidates: Any) -> dict[str, list[tuple[str, str]]]:
    """Candidate sets from a JSON file or a dict of the same shape (checked as the file's reader checks it)."""
    from molpredict.chem.candidates import candidate_sets_from, load_candidate_sets

    if isinstance(candidates, (str, os.PathLike)):
        return load_candidate_sets(candidates)
    if not isinstance(candidates, Mapping):
        raise InputError(f"candidates must be a candidate-sets JSON file or a dict of sets, not "
                         f"{type(candidates).__name__}")
    return candidate_sets_from(dict(candidates))


def predict_properties(spectra: Any, model: Any) -> "pd.DataFrame":
    """Properties of the molecules behind spectra (``molpredict properties predict``): per spectrum and property
    the median and an interval, whether or not any candidate is right.

    Parameters
    ----------
    spectra : path, sequence of paths, Spectrum or matchms.Spectrum objects
        See :func:`iter_spectra`.
    model : path or PropertyBundle
        Written by ``molpredict properties train``.

    Returns
    -------
    pandas.DataFrame
        One row per spectrum: ``id``, ``file``, ``record``, ``ion_mode``, then per property (``logp``, ``tpsa``,
        ``mw``, ``hbd``, ``hba``, ``rotatable_bonds``, ``rings``, ``aromatic_rings``, ``fraction_sp3``, ``qed``)
        its median ``<name>`` and interval ``<name>_low``, ``<name>_high``. ``df.attrs["skipped"]``: the spectra
        without a row, as dicts ``{file, record, reason}``.
    """
    from molpredict.properties import predict_properties as predict

    from molpredict.io import SkipReport
    from molpredict.properties.model import PropertyBundle

    if not isinstance(model, (PropertyBundle, str, os.PathLike)):
        raise InputError(f"model must be a property model's path or a PropertyBundle, not {type(model).__name__}")
    report = SkipReport()
    if not isinstance(spectra, (str, os.PathLike)):
        spectra = list(iter_spectra(spectra, report))  # unusable matchms spectra skipped, listed below
    skipped: list = []
    table = predict(spectra, model, skipped=skipped)
    table.attrs["skipped"] = [{"file": e.path, "record": e.record, "reason": f"unreadable record: {e.reason}"}
                              for e in report] + \
        [{"file": getattr(s, "file", None), "record": getattr(s, "record", None),
          "reason": getattr(s, "reason", str(s))} for s in skipped]
    return table
