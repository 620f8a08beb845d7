"""Identification result files: the output columns, the TSV / CSV / JSON row writer and reader, the resumable
block-wise output (``identify --resume``) and the skipped-queries report (written and read).

Text cells: in TSV and CSV each tab, newline or carriage return in a value is written as one space (JSON keeps
them); TSV is unquoted (a ``"`` is an ordinary character, read back with ``csv.QUOTE_NONE``), CSV is quoted as
needed, so every written cell reads back as written."""
from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from molpredict.errors import InputError
from molpredict.atomic import atomic_write, replace_atomically

__all__ = ["OUTPUT_COLUMNS", "OUTPUT_FORMATS", "output_format", "ResultWriter", "ResumableOutput", "write_skipped",
           "read_result_rows", "read_skipped", "json_safe"]

#: columns read back as numbers (the optional ones only when a results file has them)
_NUMERIC_COLUMNS = {"rank", "score", "confidence", "n_candidates", "record", "probability", "spectrum_score",
                    "prior_score", "fragment_score"}

#: The identification output's columns, in order (the one place that lists them). ``file`` and ``record``
#: say where the query came from (its 1-based record number in that file); ``mass_window`` the window its
#: candidates were selected with (``10 ppm``, or ``0.5 m/z`` from the precursor's written precision; empty
#: when selected by formula). ``score`` ranks (the fusion of the terms); ``probability`` (rank 1 only) is the
#: calibrated estimate that rank 1 is right; ``spectrum_score``, ``prior_score``, ``fragment_score`` the terms.
OUTPUT_COLUMNS = ("query_id", "file", "record", "rank", "score", "confidence", "probability", "spectrum_score",
                  "prior_score", "fragment_score", "smiles", "inchikey", "formula", "adduct", "name", "id",
                  "n_candidates", "mass_window")
OUTPUT_FORMATS = ("tsv", "csv", "json")


def output_format(path: str | None, fmt: str | None) -> str:
    """The output format: ``fmt`` when given, else from ``path``'s extension, else TSV."""
    if fmt:
        fmt = fmt.lower()
        if fmt not in OUTPUT_FORMATS:
            raise InputError(f"unknown output format {fmt!r} (expected tsv, csv or json)")
        return fmt
    if path and path != "-":
        suffix = Path(path).suffix.lower().lstrip(".")
        if suffix in OUTPUT_FORMATS:
            return suffix
        if suffix in ("txt", "tab"):
            return "tsv"
        raise InputError(f"cannot tell the output format from the extension {suffix!r}; use --format",
                         path=path)
    return "tsv"


#: what :func:`_cell` writes as a space (see the module docstring)
_CELL_SPACES = str.maketrans({"\t": " ", "\n": " ", "\r": " "})


def as_written(text: str) -> str:
    """``text`` as a TSV or CSV cell holds it (each tab, newline or carriage return one space): what a query id
    read back from a results file is matched against."""
    return str(text).translate(_CELL_SPACES)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    # tab, newline and carriage return would split a TSV row (and CSV's, unquoted): one space each
    return str(value).translate(_CELL_SPACES)


def json_safe(value: Any) -> Any:
    """``value`` for strict JSON: numpy scalars as Python numbers, NaN and infinities as null (strict JSON has
    neither, and jq or JSON.parse refuse them), recursively through dicts, lists and tuples (tuples become lists).

    Output rows (one cell at a time), ``evaluate``'s metrics and ``properties evaluate``'s go through it: an
    undefined number (an interval without resamples, R^2 of constant targets) is NaN in the arithmetic.
    """
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and getattr(value, "size", 1) == 1 and not isinstance(value, (str, bytes)):
        value = value.item()  # a numpy scalar (or one-value array)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ResultWriter:
    """Streams output rows as TSV, CSV or a JSON array of objects.

    Parameters
    ----------
    handle : text stream
    fmt : {"tsv", "csv", "json"}
    columns : sequence of str
    n_rows : int
        Rows already in ``handle`` (continuing a resumed output: no header is written then).
    deferred : bool
        Write the header with the first row (or on :meth:`close`), not now: on stdout, a run that fails before its
        first row then prints nothing that would pass for an empty result.
    """

    def __init__(self, handle: IO[str], fmt: str, columns: Sequence[str] = OUTPUT_COLUMNS, n_rows: int = 0,
                 header: bool = True, deferred: bool = False) -> None:
        self.handle = handle
        self.fmt = fmt
        self.columns = list(columns)
        self.n_rows = n_rows
        if fmt == "csv":
            self._csv = csv.writer(handle, lineterminator="\n")
        self._header_due = header and deferred
        if header and not deferred:
            self._write_header()

    def _write_header(self) -> None:
        self._header_due = False
        if self.fmt == "csv":
            self._csv.writerow(self.columns)
        elif self.fmt == "tsv":
            self.handle.write("\t".join(self.columns) + "\n")
        else:
            self.handle.write("[")

    def write(self, row: dict[str, Any]) -> None:
        if self._header_due:
            self._write_header()
        if self.fmt == "json":
            obj = {c: json_safe(row.get(c)) for c in self.columns}
            self.handle.write(("\n" if self.n_rows == 0 else ",\n") + json.dumps(obj, allow_nan=False))
        elif self.fmt == "csv":
            self._csv.writerow([_cell(row.get(c)) for c in self.columns])
        else:
            self.handle.write("\t".join(_cell(row.get(c)) for c in self.columns) + "\n")
        self.n_rows += 1

    def close(self) -> None:
        if self._header_due:
            self._write_header()
        if self.fmt == "json":
            self.handle.write("\n]\n" if self.n_rows else "]\n")
        self.handle.flush()


class ResumableOutput:
    """An output file written in committed blocks, so that a killed run resumes where it stopped.

    Rows go to ``<path>.partial``; after each block, :meth:`commit` syncs it and appends one JSON line to the
    journal ``<path>.partial.journal``: the byte length of the output so far, the spectra finished and
    whatever the caller needs to restore (the block's skipped queries...). :meth:`finish` completes the file
    and renames it to ``path`` (atomically: a killed run never leaves a half file under the final name).
    Opened with ``resume=True``, the partial output is cut back to its last committed block (a block written
    but not journalled, or a torn journal line, is redone) and :attr:`done` says how many spectra to skip.

    Parameters
    ----------
    path : str or path-like
    fmt : {"tsv", "csv", "json"}
    columns : sequence of str
    resume : bool
        Continue ``<path>.partial`` when its journal matches ``fingerprint``; else start afresh.
    fingerprint : dict
        What must not change between the run and its resumption (input file, model, options).

    Raises
    ------
    InputError
        ``resume=True`` but the journal was written for another input or other settings.
    """

    def __init__(self, path: str | os.PathLike, fmt: str, columns: Sequence[str] = OUTPUT_COLUMNS,
                 resume: bool = False, fingerprint: dict | None = None) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.journal_path = self.path.with_name(self.path.name + ".partial.journal")
        self.fingerprint = {"format": fmt, "columns": list(columns), **(fingerprint or {})}
        self.done = 0
        self.blocks: list[dict] = []
        # the journal is this run's lock on the output: a second run on the same path would truncate the first's
        # partial file under it (opened for append, so nothing is cut before the lock is held)
        self._journal = open(self.journal_path, "a+b")
        try:
            fcntl.flock(self._journal.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._journal.close()
            raise InputError(f"another molpredict run is writing it ({self.partial.name} is locked)",
                             path=str(self.path)) from None
        try:
            self._open(resume, fmt, columns)
        except BaseException:
            self._journal.close()  # and with it the lock
            raise

    def _open(self, resume: bool, fmt: str, columns: Sequence[str]) -> None:
        """Continue the partial output (``resume`` and a matching journal) or start it afresh."""
        entries = self._read_journal() if resume else []
        if entries:
            head, self.blocks = entries[0], entries[1:]
            if head.get("fingerprint") != self.fingerprint:
                raise InputError("cannot resume: the interrupted run had another input, model or settings "
                                 "(run without --resume to start again)", path=str(self.partial))
            last = self.blocks[-1] if self.blocks else {"offset": head["offset"], "n_rows": 0, "done": 0}
            if self.partial.stat().st_size < last["offset"]:
                raise InputError("cannot resume: the partial output is shorter than its journal says (run "
                                 "without --resume to start again)", path=str(self.partial))
            raw = open(self.partial, "r+b")
            raw.truncate(last["offset"])  # rows written after the last commit are redone
            raw.seek(last["offset"])
            self.done = last["done"]
            self.handle = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            self.writer = ResultWriter(self.handle, fmt, columns, n_rows=last["n_rows"], header=False)
            self._journal.truncate(self._journal_end)  # a torn last line (appends go after it)
        else:
            self.handle = io.TextIOWrapper(open(self.partial, "w+b"), encoding="utf-8", newline="")
            self.writer = ResultWriter(self.handle, fmt, columns)
            self._journal.truncate(0)
            self._sync()
            self._append({"fingerprint": self.fingerprint}, offset=self.handle.buffer.tell())

    def _read_journal(self) -> list[dict]:
        """The journal's complete lines (a torn last line is dropped); empty when there is nothing to resume."""
        self._journal_end = 0
        if not (self.partial.is_file() and self.journal_path.is_file()):
            return []
        entries: list[dict] = []
        with open(self.journal_path, "rb") as handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                try:
                    entry = json.loads(line)
                except ValueError:
                    break
                if not isinstance(entry, dict) or not isinstance(entry.get("offset"), int):
                    break
                entries.append(entry)
                self._journal_end += len(line)
        if entries and "fingerprint" not in entries[0]:
            return []
        return entries

    def _sync(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.buffer.fileno())

    def _append(self, entry: dict, offset: int) -> None:
        line = json.dumps({**entry, "offset": offset}, allow_nan=False) + "\n"
        self._journal.write(line.encode("utf-8"))
        self._journal.flush()
        os.fsync(self._journal.fileno())

    def write(self, row: dict[str, Any]) -> None:
        self.writer.write(row)

    def commit(self, done: int, **state: Any) -> None:
        """Record that the first ``done`` spectra are finished and their rows written; ``state`` (JSON) is
        kept for :attr:`blocks` of a resumed run."""
        self._sync()
        entry = {"done": int(done), "n_rows": self.writer.n_rows, **state}
        self._append(entry, offset=self.handle.buffer.tell())
        self.blocks.append({**entry, "offset": self.handle.buffer.tell()})
        self.done = int(done)

    def finish(self) -> None:
        """Complete the file (JSON's closing bracket), sync it and rename it to ``path``; drop the journal."""
        self.writer.close()
        self._sync()
        self.handle.close()
        self._journal.close()
        replace_atomically(self.partial, self.path)
        self.journal_path.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop without finishing: once a block is committed, the partial output and its journal stay for
        ``--resume``; before that there is nothing to resume (an input rejected at its first record), and they
        are removed."""
        self.handle.close()
        self._journal.close()
        if not self.blocks:
            self.partial.unlink(missing_ok=True)
            self.journal_path.unlink(missing_ok=True)


def write_skipped(skipped: Sequence[Any], path: str | os.PathLike) -> None:
    """The skipped-queries report: TSV with columns query_id, file, record, reason (written atomically).

    ``query_id`` is the spectrum's id, that of an unreadable record included where its reader had read it (the
    record's TITLE, scan id, or the reader's ``"<file stem>:<record>"``), so that it joins with the results;
    empty where it is unknown."""
    with atomic_write(path) as handle:
        handle.write("query_id\tfile\trecord\treason\n")
        for s in skipped:
            handle.write(f"{_cell(s.query_id)}\t{_cell(s.file)}\t{'' if s.record is None else s.record}\t"
                         f"{_cell(s.reason)}\n")


def read_result_rows(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The rows of a results file written by ``molpredict identify`` (.tsv, .csv or .json; format from the
    extension, TSV otherwise), numeric columns as floats.

    Raises
    ------
    InputError
        Missing file, not a results table (no ``query_id`` column), or malformed JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path=str(path))
    suffix = path.suffix.lower()

    def convert(row: dict[str, Any], record: int) -> dict[str, Any]:
        out = dict(row)
        for column in _NUMERIC_COLUMNS & set(out) | {c for c in out if c.startswith("prop_")}:
            value = out[column]
            if value in (None, ""):
                out[column] = None if column != "confidence" else float("nan")
                continue
            try:
                out[column] = float(value)
            except (TypeError, ValueError):
                raise InputError(f"not a number: {value!r}", path=str(path), record=record, field=column) from None
        return out

    if suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON ({exc.msg}, line {exc.lineno})", path=str(path)) from None
        except UnicodeDecodeError:
            raise InputError("not a results file (not UTF-8 text)", path=str(path)) from None
        if not isinstance(rows, list) or (rows and (not isinstance(rows[0], dict) or "query_id" not in rows[0])):
            raise InputError("not a results array (objects with a query_id)", path=str(path))
        for i, row in enumerate(rows, start=1):
            yield convert(row, i)
        return
    with open(path, encoding="utf-8", newline="") as handle:
        try:
            # TSV is written unquoted (a cell starting with '"' is text, not a quoted field); CSV with csv's quoting
            reader = (csv.DictReader(handle) if suffix == ".csv"
                      else csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
            if not reader.fieldnames or "query_id" not in reader.fieldnames:
                raise InputError("not a results table (no query_id column in the header)", path=str(path))
            for i, row in enumerate(reader, start=2):
                yield convert(row, i)
        except UnicodeDecodeError:
            raise InputError("not a results table (not UTF-8 text)", path=str(path)) from None


def read_skipped(path: str | os.PathLike) -> list[tuple[str, str, str, str]]:
    """The rows ``(query_id, file, record, reason)`` of a skipped-queries TSV (``identify --skipped``).

    Raises
    ------
    InputError
        Missing file or a header without ``reason``.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path=str(path))
    rows = []
    with open(path, encoding="utf-8", newline="") as handle:
        try:
            reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)  # written unquoted
            if not reader.fieldnames or "reason" not in reader.fieldnames:
                raise InputError("not a skipped-queries table (no reason column in the header)", path=str(path))
            for line, row in enumerate(reader, start=2):
                if None in row or None in row.values():  # DictReader's marks of too many / too few fields
                    raise InputError(f"expected {len(reader.fieldnames)} tab-separated fields", path=str(path),
                                     record=line)
                rows.append((row.get("query_id") or "", row.get("file") or "", row.get("record") or "",
                             row.get("reason") or ""))
        except UnicodeDecodeError:
            raise InputError("not a skipped-queries table (not UTF-8 text)", path=str(path)) from None
    return rows
