"""Structure files: SMILES and SDF records (streamed, with line numbers for skip reports), and the text opening
shared by the table readers (candidate-library TSVs, description/SMILES pairs tables)."""
from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from molpredict.errors import InputError

__all__ = ["StructureRecord", "read_smiles_records", "read_sdf_records", "sdf_items", "open_table_text", "is_gzip"]


@dataclass
class StructureRecord:
    """A structure record as read (library TSV row, SMILES line, SDF record): the given fields (None when absent
    or empty) and the line it starts on."""

    line: int | None
    smiles: str
    name: str | None = None
    id: str | None = None
    source: str | None = None
    inchikey: str | None = None
    formula: str | None = None
    mass: float | None = None


def is_gzip(path: Path) -> bool:
    """Whether the file starts with the gzip magic bytes."""
    with open(path, "rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


def open_table_text(path: Path) -> io.TextIOBase:
    """A text table or structure file (gzipped or not, sniffed) as UTF-8 text, universal newlines off."""
    # utf-8-sig: a leading byte-order mark (Windows tools write one) is not part of the first column's name.
    if is_gzip(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def read_smiles_records(path: Path, report: Any, source: str | None) -> Iterator[StructureRecord]:
    """Stream a SMILES file: one ``SMILES [name]`` per line (``#`` comments and a ``smiles`` header ignored).

    ``report`` counts records (``n_read``) and takes skips (``skip(line, field, reason)``), e.g. a
    :class:`molpredict.chem.candidates.LoadReport`.
    """
    first = True
    with open_table_text(path) as handle:
        try:
            for line_number, line in enumerate(handle, start=1):
                text = line.strip()
                if not text or text.startswith("#"):
                    continue
                if "\x00" in text:
                    raise InputError("not a SMILES file (binary content)", path=path)
                parts = text.split(None, 1)
                if first and parts[0].lower() == "smiles":
                    first = False
                    continue
                first = False
                report.n_read += 1
                yield StructureRecord(line_number, parts[0], parts[1].strip() if len(parts) > 1 else None, None, source)
        except UnicodeDecodeError:
            raise InputError("not a UTF-8 text file", path=path) from None


def read_sdf_records(path: Path, report: Any, source: str | None) -> Iterator[StructureRecord]:
    """Stream SDF records, parsing each block with RDKit (line numbers kept for the report; ``report`` as in
    :func:`read_smiles_records`). Name from a ``name`` data item or the title line, id from an ``id`` item,
    source from a ``source`` item (else ``source``)."""
    from rdkit import Chem

    def finish(start: int, lines: list[str]) -> StructureRecord | None:
        block = "".join(lines)
        if not block.strip():
            return None
        report.n_read += 1
        molblock, _, data = block.partition("\nM  END")
        mol = Chem.MolFromMolBlock(molblock + "\nM  END\n") if "M  END" in block else None
        if mol is None:
            report.skip(start, "molblock", "RDKit cannot read this SDF record")
            return None
        if mol.GetNumAtoms() == 0:  # its SMILES would be '', reported later as a SMILES RDKit cannot parse
            report.skip(start, "molblock", "empty SDF record (no atoms)")
            return None
        items = sdf_items(data)
        title = lines[0].strip() if lines else ""
        name = items.get("name") or title or None
        return StructureRecord(start, Chem.MolToSmiles(mol), name, items.get("id"), items.get("source") or source)

    lines: list[str] = []
    start = 1
    with open_table_text(path) as handle:
        try:
            for line_number, line in enumerate(handle, start=1):
                if "\x00" in line:
                    raise InputError("not an SDF file (binary content)", path=path)
                if line.rstrip("\r\n") == "$$$$":
                    record = finish(start, lines)
                    if record is not None:
                        yield record
                    lines, start = [], line_number + 1
                else:
                    lines.append(line)
        except UnicodeDecodeError:
            raise InputError("not a UTF-8 text file", path=path) from None
    record = finish(start, lines)
    if record is not None:
        yield record
    if report.n_read == 0:
        raise InputError("no SDF records found", path=path)


def sdf_items(data: str) -> dict[str, str]:
    """The ``> <KEY>`` data items of an SDF record (keys lower-cased; first value line)."""
    items: dict[str, str] = {}
    lines = data.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(">") and "<" in line and ">" in line[1:]:
            key = line[line.index("<") + 1:line.rindex(">")].strip().lower()
            value = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if key and value and key not in items:
                items[key] = value
    return items
