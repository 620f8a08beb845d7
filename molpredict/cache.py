"""On-disk caches and content keys: the molpredict home directory, the one file hash, and the candidate-library
cache entries (a library's Arrow table and indexes, keyed by the SHA-256 of the library file).

A library entry lives under ``<home>/cache/candidates/<sha256 of the file>-v<format>/``, ``<home>`` being
``$MOLPREDICT_HOME`` or ``platformdirs.user_cache_dir("molpredict")``. The key is the SHA-256 of the file's bytes:
exact (an edited file never hits a stale entry, a copied or moved one still hits) and cheap (0.08-0.2 s for the
65 MB pool, against 3 s to parse it; and remembered by the file's ``stat``, :func:`known_file_sha256`, so an
unchanged file is not read at all). The entry holds the table as an uncompressed Arrow IPC file, read back
memory-mapped, plus the mass and formula indexes as memory-mapped arrays (rows by mass and the sorted masses;
rows grouped by normalised formula, their offsets and the sorted formulas as a one-column Arrow file) and the
skip report (as JSON): opening a library reads no whole column, and a query touches only its own rows. Entries are written atomically
(a temporary directory renamed into place); a damaged one is removed and rebuilt by the caller.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from molpredict.atomic import creation_mode

__all__ = ["home_dir", "file_sha256", "known_file_sha256", "library_cache_dir", "library_entry", "LibraryEntry", "load_library_entry",
           "store_library_entry", "discard_entry", "LIBRARY_CACHE_FORMAT"]

#: 2: a "cid" column is read as "id" (ChEBI-20); 3: the indexes are memory-mapped arrays (sorted masses; rows by
#: normalised formula with the sorted formulas as an Arrow file), so opening reads no whole column; 4: rows are read
#: by the rules of both readers alike (a negative mass or an unparsable formula skipped on the fast path too), an
#: isotope-labelled structure keeps its labelled formula, and an InChI column stands in for an empty SMILES
LIBRARY_CACHE_FORMAT = 4
_TABLE_FILE = "library.arrow"
_REPORT_FILE = "report.json"
_INDEX_FILES = ("mass_order.npy", "mass_sorted.npy", "formula_rows.npy", "formula_offsets.npy", "formula_keys.arrow")


def home_dir() -> Path:
    """The base directory for default models and caches: ``$MOLPREDICT_HOME`` or the user cache directory."""
    env = os.environ.get("MOLPREDICT_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs
    return Path(platformdirs.user_cache_dir("molpredict"))


def file_sha256(paths: "str | os.PathLike | Iterable[str | os.PathLike]", extra: Any = None,
                block: int = 1 << 22) -> str:
    """SHA-256 (hex) of a file's bytes, or of several files' bytes in order followed by the JSON of ``extra``
    (e.g. the filters applied to training data)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(block):
                digest.update(chunk)
    if extra is not None:
        digest.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def _stat_key(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]


def known_file_sha256(path: str | os.PathLike) -> str:
    """:func:`file_sha256` of one file, remembered under ``<home>/cache/hashes`` by its path and ``stat`` (size,
    modification and change times, inode): a file not written since it was last hashed is not read again.

    This is how Git's index tells unchanged files: any write changes the modification time (and the change
    time, which cannot be set back), a copy has another inode. The 65 MB candidate pool and a model's tensors are
    then keyed or checked in microseconds instead of 0.1-0.2 s each. Failing to remember only costs the hash.
    """
    path = Path(path).resolve()
    stat = path.stat()
    record = home_dir() / "cache" / "hashes" / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")
    try:
        known = json.loads(record.read_text())
        if known.get("stat") == _stat_key(stat) and known.get("path") == str(path):
            return str(known["sha256"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    digest = file_sha256(path)
    if _stat_key(path.stat()) == _stat_key(stat):  # not written while it was read
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"path": str(path), "stat": _stat_key(stat), "sha256": digest}))
            os.replace(tmp, record)
        except OSError:
            pass
    return digest


def library_cache_dir() -> Path:
    """Where library caches live: ``<home>/cache/candidates``."""
    return home_dir() / "cache" / "candidates"


def library_entry(path: str | os.PathLike) -> Path:
    """The cache entry directory of a library file (whether or not it exists)."""
    return library_cache_dir() / f"{known_file_sha256(path)}-v{LIBRARY_CACHE_FORMAT}"


@dataclass
class LibraryEntry:
    """A stored library: its table, skip report (JSON) and indexes (None when not stored)."""

    table: Any
    report: dict[str, Any] | None
    mass_order: np.ndarray | None
    mass_sorted: np.ndarray | None
    formula_index: tuple[np.ndarray, np.ndarray, Any] | None


def discard_entry(entry: Path) -> None:
    """Remove a damaged entry (interrupted by a crash, disk full): the caller rebuilds it."""
    shutil.rmtree(entry, ignore_errors=True)


def load_library_entry(entry: Path) -> LibraryEntry | None:
    """The stored library of ``entry``, memory-mapped; None when absent or damaged (a damaged one is removed)."""
    import pyarrow as pa
    table_file = entry / _TABLE_FILE
    if not table_file.exists():
        return None
    try:
        table = pa.ipc.open_file(pa.memory_map(str(table_file), "r")).read_all()
        report = json.loads((entry / _REPORT_FILE).read_text()) if (entry / _REPORT_FILE).exists() else None
        mass_order = mass_sorted = formula_index = None
        if all((entry / f).exists() for f in _INDEX_FILES):
            mass_order = np.load(entry / "mass_order.npy", mmap_mode="r")
            mass_sorted = np.load(entry / "mass_sorted.npy", mmap_mode="r")
            keys = pa.ipc.open_file(pa.memory_map(str(entry / "formula_keys.arrow"), "r")).read_all().column(0)
            formula_index = (np.load(entry / "formula_rows.npy", mmap_mode="r"),
                             np.load(entry / "formula_offsets.npy", mmap_mode="r"), keys.combine_chunks())
        return LibraryEntry(table, report, mass_order, mass_sorted, formula_index)
    except (OSError, ValueError, KeyError, pa.ArrowException, json.JSONDecodeError):
        discard_entry(entry)
        return None


def store_library_entry(entry: Path, table: Any, report: dict[str, Any] | None,
                        mass_index: tuple[np.ndarray, np.ndarray], formula_index: tuple[np.ndarray, np.ndarray, Any],
                        what: str = "library") -> None:
    """Write a library entry atomically (a temporary directory renamed into place); failures only warn.

    ``mass_index``: ``(rows by ascending mass, the sorted masses)``; ``formula_index``: ``(rows grouped by normalised
    formula, offsets of each formula's rows, the sorted distinct formulas)``."""
    import pyarrow as pa
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        try:
            os.chmod(tmp, creation_mode(directory=True))  # mkdtemp's 0700 would hide a shared cache from others
            with pa.OSFile(str(tmp / _TABLE_FILE), "wb") as sink:
                with pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table)
            if report is not None:
                (tmp / _REPORT_FILE).write_text(json.dumps(report))
            rows, offsets, keys = formula_index
            np.save(tmp / "mass_order.npy", np.asarray(mass_index[0], dtype=np.int64))
            np.save(tmp / "mass_sorted.npy", np.asarray(mass_index[1], dtype=np.float64))
            np.save(tmp / "formula_rows.npy", np.asarray(rows, dtype=np.int64))
            np.save(tmp / "formula_offsets.npy", np.asarray(offsets, dtype=np.int64))
            keys_table = pa.table({"formula": pa.array(list(keys) if not isinstance(keys, pa.Array) else keys,
                                                       pa.string())})
            with pa.OSFile(str(tmp / "formula_keys.arrow"), "wb") as sink:
                with pa.ipc.new_file(sink, keys_table.schema) as writer:
                    writer.write_table(keys_table)
            try:
                os.replace(tmp, entry)
            except OSError:  # another process stored the same entry first
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        warnings.warn(f"could not cache {what} in {entry.parent}: {exc}", UserWarning, stacklevel=3)
