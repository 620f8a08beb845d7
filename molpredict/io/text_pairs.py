"""Text -> molecule pairs: reading description/SMILES tables (the ChEBI-20 layout) and free-text queries.

A pairs file is a ``.tsv``, ``.tab`` or ``.csv`` table (optionally gzipped) whose header has a ``description``
and a ``smiles`` column (names case-insensitive, other columns ignored; an ``id`` or ``cid`` column names the
queries). ChEBI-20's ``val.tsv`` / ``test.tsv`` (``cid, smiles, description``) are read as they are.

A row is skipped, and recorded with file, line and field, when it has the wrong number of fields, an empty
description, an empty SMILES or a SMILES that RDKit cannot parse (or that has no InChIKey); one bad row never
stops a file.

Identity for text evaluation: a hit is the *same molecule*, i.e. the same RDKit canonical isomeric SMILES
(stereo included), not merely the same InChIKey first block: ChEBI-20 lists stereoisomers as different
entries, and a description usually names the stereoisomer.
"""
from __future__ import annotations

import csv
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from molpredict.errors import InputError
from molpredict.chem.structures import open_table_text

__all__ = [
    "PAIR_SUFFIXES",
    "TextPair",
    "PairSkip",
    "PairsReport",
    "is_pairs_path",
    "read_text_pairs",
    "read_text_lines",
    "read_text_queries",
    "canonical_smiles",
    "split_inputs",
]

#: Extensions (before an optional ``.gz``) read as pairs tables.
PAIR_SUFFIXES = (".tsv", ".tab", ".csv")
#: Columns that name a query, in order of preference.
ID_COLUMNS = ("id", "cid", "chebi_id", "name")


@dataclass
class TextPair:
    """One usable row: a description and its structure.

    Attributes
    ----------
    description : str
    molecule : Molecule
        Parsed from the row's SMILES (``molecule.smiles`` is the RDKit canonical isomeric SMILES).
    id : str
        The row's ``id``/``cid`` cell, else ``line<N>``.
    line : int
        1-based line of the row in its file.
    """

    description: str
    molecule: Any
    id: str
    line: int


@dataclass(frozen=True)
class PairSkip:
    """A skipped row: file, 1-based line, the field at fault (None: the whole row) and why."""

    path: str
    line: int
    field: str | None
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        where = f"{self.path}, line {self.line}" + (f", field {self.field}" if self.field else "")
        return f"{where}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class PairsReport:
    """What reading pairs files skipped.

    Attributes
    ----------
    entries : list of PairSkip
    n_read : int
        Non-empty data rows read (kept + skipped).
    """

    entries: list[PairSkip] = field(default_factory=list)
    n_read: int = 0

    def skip(self, path: str, line: int, field_name: str | None, reason: str, detail: str = "") -> None:
        self.entries.append(PairSkip(str(path), int(line), field_name, reason, detail))

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[PairSkip]:
        return iter(self.entries)

    def by_reason(self) -> dict[str, int]:
        """Skipped-row counts per reason (``"<field>: <reason>"``), most frequent first."""
        counts = Counter(f"{e.field}: {e.reason}" if e.field else e.reason for e in self.entries)
        return dict(counts.most_common())

    def to_list(self, limit: int | None = 100) -> list[dict[str, Any]]:
        """The first ``limit`` entries as JSON-ready dicts (file, line, field, reason)."""
        entries = self.entries if limit is None else self.entries[:limit]
        return [{"file": e.path, "line": e.line, "field": e.field, "reason": e.reason + (f" ({e.detail})"
                                                                                       if e.detail else "")}
                for e in entries]


def _suffixes(path: Path) -> list[str]:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes


def is_pairs_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a pairs table by its extension (``.tsv``, ``.tab``, ``.csv``, each maybe ``.gz``)."""
    suffixes = _suffixes(Path(path))
    return bool(suffixes) and suffixes[-1] in PAIR_SUFFIXES


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def canonical_smiles(smiles: str) -> str | None:
    """RDKit canonical isomeric SMILES of ``smiles`` (None when RDKit cannot parse it)."""
    from molpredict.chem.molecules import Molecule
    try:
        return Molecule.from_smiles(smiles).smiles
    except InputError:
        return None


def read_text_pairs(path: str | os.PathLike, report: PairsReport | None = None,
                    structures: dict[str, Any] | None = None, limit: int | None = None) -> list[TextPair]:
    """Read a pairs table (see the module docstring).

    Parameters
    ----------
    path : path
        ``.tsv``/``.tab``/``.csv`` (optionally gzipped) with ``description`` and ``smiles`` columns.
    report : PairsReport, optional
        Receives the skipped rows (file, line, field, reason).
    structures : dict, optional
        SMILES -> ``Molecule`` or skip reason, shared between files (a structure is parsed once).
    limit : int, optional
        Stop after this many usable pairs.

    Returns
    -------
    list of TextPair
        In file order.

    Raises
    ------
    InputError
        Missing file, not UTF-8 text, or a header without ``description`` and ``smiles`` columns.
    """
    from molpredict.chem.molecules import label_structure

    path = Path(path)
    if not path.exists():
        raise InputError("no such file", path=str(path))
    if path.is_dir():
        raise InputError("is a directory, not a text-pairs table", path=str(path))
    report = report if report is not None else PairsReport()
    structures = structures if structures is not None else {}
    delimiter = "," if _suffixes(path)[-1:] == [".csv"] else "\t"
    pairs: list[TextPair] = []
    try:
        with open_table_text(path) as handle:
            # Tabs never occur inside ChEBI-style descriptions, while quotes do: TSV is read without quoting.
            reader = (csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if delimiter == "\t"
                      else csv.reader(handle))
            header = next(reader, None)
            if header is None:
                raise InputError("empty file (expected a header with description and smiles columns)",
                                 path=str(path))
            if any("\x00" in h for h in header):
                raise InputError("not a text-pairs table (binary content)", path=str(path))
            names = [h.strip().lower() for h in header]
            missing = [c for c in ("description", "smiles") if c not in names]
            if missing:
                raise InputError(f"not a text-pairs table: the header lacks column(s) {', '.join(missing)} "
                                 f"(found: {', '.join(names) or 'nothing'})", path=str(path), record=1,
                                 field=missing[0])
            i_desc, i_smiles = names.index("description"), names.index("smiles")
            i_id = next((names.index(c) for c in ID_COLUMNS if c in names), None)
            while True:
                line = reader.line_num + 1
                try:
                    cells = next(reader)
                except StopIteration:
                    break
                except csv.Error as exc:
                    report.n_read += 1
                    report.skip(str(path), line, None, "malformed row", str(exc))
                    continue
                if not cells or not any(c.strip() for c in cells):
                    continue
                report.n_read += 1
                if len(cells) != len(names):
                    report.skip(str(path), line, None, f"expected {len(names)} fields, got {len(cells)}")
                    continue
                description = " ".join(cells[i_desc].split())
                smiles = cells[i_smiles].strip()
                if not description:
                    report.skip(str(path), line, "description", "empty description")
                    continue
                if not smiles:
                    report.skip(str(path), line, "smiles", "empty SMILES")
                    continue
                molecule = label_structure(structures, smiles, unparsed="SMILES not parsed by RDKit")
                if isinstance(molecule, str):
                    report.skip(str(path), line, "smiles", molecule, repr(_shorten(smiles)))
                    continue
                row_id = cells[i_id].strip() if i_id is not None else ""
                pairs.append(TextPair(description, molecule, row_id or f"line{line}", line))
                if limit is not None and len(pairs) >= limit:
                    break
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path=str(path)) from None
    except (OSError, EOFError) as exc:
        raise InputError(f"unreadable file ({type(exc).__name__}: {exc})", path=str(path)) from None
    return pairs


def read_text_queries(path: str | os.PathLike) -> list[tuple[int, str]]:
    """Queries from a text file, one description per line, as ``(line number, description)`` (1-based, whitespace
    collapsed). Blank lines and ``#`` comments are not queries; their lines keep their numbers, so a query is
    found by its line and its id (``<file stem>:<line>``, see :func:`molpredict.api.text_queries`) does not change
    when blank lines are added or removed above it."""
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path=str(path))
    try:
        with open_table_text(path) as handle:
            lines = [(lineno, " ".join(line.split())) for lineno, line in enumerate(handle, start=1)]
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path=str(path)) from None
    return [(lineno, line) for lineno, line in lines if line and not line.startswith("#")]


def read_text_lines(path: str | os.PathLike) -> list[str]:
    """The descriptions of :func:`read_text_queries`, without their line numbers."""
    return [line for _, line in read_text_queries(path)]


def split_inputs(paths: Sequence[str | os.PathLike], what: str = "training") -> bool:
    """Whether ``paths`` are pairs tables (True) or spectra files (False).

    Raises
    ------
    InputError
        A mix of both kinds.
    """
    kinds = {is_pairs_path(p) for p in paths}
    if len(kinds) > 1:
        tables = [str(p) for p in paths if is_pairs_path(p)]
        others = [str(p) for p in paths if not is_pairs_path(p)]
        raise InputError(f"cannot mix text-pairs tables ({tables[0]}) and spectra files ({others[0]}) in one "
                         f"{what} call")
    return kinds == {True}
