"""Identification result files: the output columns, the TSV / CSV / JSON row writer and reader, and the skipped-queries
report (written and read)."""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from ..errors import InputError

__all__ = ["OUTPUT_COLUMNS", "OUTPUT_FORMATS", "output_format", "ResultWriter", "write_skipped", "read_result_rows",
           "read_skipped"]

#: columns read back as numbers (the optional ones only when a results file has them)
_NUMERIC_COLUMNS = {"rank", "score", "confidence", "n_candidates", "record", "probability", "spectrum_score",
                    "prior_score"}

OUTPUT_COLUMNS = ("query_id", "rank", "score", "confidence", "smiles", "inchikey", "formula", "adduct", "name", "id",
                  "n_candidates")
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


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value).replace("\t", " ").replace("\n", " ")


class ResultWriter:
    """Streams output rows as TSV, CSV or a JSON array of objects.

    Parameters
    ----------
    handle : text stream
    fmt : {"tsv", "csv", "json"}
    columns : sequence of str
    """

    def __init__(self, handle: IO[str], fmt: str, columns: Sequence[str] = OUTPUT_COLUMNS) -> None:
        self.handle = handle
        self.fmt = fmt
        self.columns = list(columns)
        self.n_rows = 0
        if fmt == "csv":
            self._csv = csv.writer(handle, lineterminator="\n")
            self._csv.writerow(self.columns)
        elif fmt == "tsv":
            handle.write("\t".join(self.columns) + "\n")
        else:
            handle.write("[")

    def write(self, row: dict[str, Any]) -> None:
        if self.fmt == "json":
            obj = {c: (None if isinstance(row.get(c), float) and math.isnan(row[c]) else row.get(c))
                   for c in self.columns}
            self.handle.write(("\n" if self.n_rows == 0 else ",\n") + json.dumps(obj))
        elif self.fmt == "csv":
            self._csv.writerow([_cell(row.get(c)) for c in self.columns])
        else:
            self.handle.write("\t".join(_cell(row.get(c)) for c in self.columns) + "\n")
        self.n_rows += 1

    def close(self) -> None:
        if self.fmt == "json":
            self.handle.write("\n]\n" if self.n_rows else "]\n")
        self.handle.flush()


def write_skipped(skipped: Sequence[Any], path: str | os.PathLike) -> None:
    """The skipped-queries report: TSV with columns query_id, file, record, reason."""
    with open(path, "w", encoding="utf-8") as handle:
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
        for column in _NUMERIC_COLUMNS & set(out):
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
        if not isinstance(rows, list) or (rows and (not isinstance(rows[0], dict) or "query_id" not in rows[0])):
            raise InputError("not a results array (objects with a query_id)", path=str(path))
        for i, row in enumerate(rows, start=1):
            yield convert(row, i)
        return
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="," if suffix == ".csv" else "\t")
        if not reader.fieldnames or "query_id" not in reader.fieldnames:
            raise InputError("not a results table (no query_id column in the header)", path=str(path))
        for i, row in enumerate(reader, start=2):
            yield convert(row, i)


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
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        if not reader.fieldnames or "reason" not in reader.fieldnames:
            raise InputError("not a skipped-queries table (no reason column in the header)", path=str(path))
        return [(row.get("query_id") or "", row.get("file") or "", row.get("record") or "", row.get("reason") or "")
                for row in reader]
