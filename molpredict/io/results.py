"""Identification result files: the output columns, the TSV / CSV / JSON row writer and the skipped-queries report."""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import IO, Any, Sequence

from ..errors import InputError

__all__ = ["OUTPUT_COLUMNS", "OUTPUT_FORMATS", "output_format", "ResultWriter", "write_skipped"]

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
