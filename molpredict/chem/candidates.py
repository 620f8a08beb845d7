"""Candidate libraries: TSV / SMILES / SDF files into columns, selecting candidates by formula, by a ppm window of
neutral mass (or precursor m/z and adduct) and by source, and MassSpecGym-style candidate sets.

A library is a table with the columns of :data:`COLUMNS` (see ``candidates/README.md``). It is held as one
Apache Arrow table (memory-mapped when it comes from the cache); the public columns are numpy arrays,
materialised on first access, and rows come out as cheap :class:`~molpredict.chem.molecules.Molecule` records.

A TSV of at least :data:`CACHE_MIN_BYTES` (or any TSV with ``cache=True``) is stored after its first read in the
content-keyed cache of :mod:`molpredict.cache`. SMILES and SDF records are read by :mod:`molpredict.chem.structures`.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from molpredict.lazy import lazy_module
from molpredict.cache import discard_entry, library_entry, load_library_entry, store_library_entry
from molpredict.errors import InputError
from molpredict.chem.structures import StructureRecord, is_gzip, open_table_text, read_sdf_records, read_smiles_records
from molpredict.chem.molecules import Adduct, Molecule, neutral_mass, normalize_formula, parse_adduct

pc = lazy_module("pyarrow.compute")  # building indexes and summaries; opening a cached library needs none of it

__all__ = [
    "COLUMNS",
    "REQUIRED_COLUMNS",
    "CandidateLibrary",
    "NO_SOURCE",
    "LoadReport",
    "SkippedRow",
    "read_library",
    "shares_one_formula",
    "load_candidate_sets",
    "candidate_sets_from",
    "in_key_order",
    "candidate_set_molecules",
    "describe_smiles",
    "describe_many",
    "undescribed_reason",
    "parent_smiles",
    "parents_many",
    "standardized",
    "dedupe",
    "CACHE_MIN_BYTES",
]

#: Library columns, in the order written to TSV.
COLUMNS = ("inchikey14", "inchikey", "smiles", "formula", "monoisotopic_mass", "name", "id", "source")
#: Columns every library has (computed from the SMILES when a file lacks them).
REQUIRED_COLUMNS = ("inchikey14", "inchikey", "smiles", "formula", "monoisotopic_mass")
_OPTIONAL_COLUMNS = ("name", "id", "source")
_COMPUTED = ("inchikey", "formula", "monoisotopic_mass")
#: TSVs at least this large are cached on disk after the first read (unless ``cache=False``).
CACHE_MIN_BYTES = 8 * 1024 * 1024

_SUFFIXES = {
    ".tsv": "tsv", ".tab": "tsv", ".txt": "tsv",
    ".smi": "smiles", ".smiles": "smiles", ".ism": "smiles",
    ".sdf": "sdf", ".sd": "sdf", ".mol": "sdf",
}


# ----------------------------------------------------------------------------------------------------------
# Skip report
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SkippedRow:
    """One record left out of a library: where, which field, why."""

    path: str
    line: int | None
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = [self.path]
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.field is not None:
            where.append(f"field {self.field}")
        return f"{', '.join(where)}: {self.reason}"


@dataclass
class LoadReport:
    """What reading a library file kept and skipped (rows, by line and field).

    Spectra readers have their own ``molpredict.io.SkipReport`` (records, not lines and fields); this class
    offers the same ``count``, ``by_reason``, ``summary`` and ``to_dict`` names.

    Attributes
    ----------
    path : str
    n_read : int
        Records read (kept + skipped; blank and comment lines are not records).
    skipped : list of SkippedRow
    n_duplicates : int
        Records dropped as duplicates of an earlier one with the same InChIKey and source (``candidates build``
        only: :func:`dedupe`).
    """

    path: str
    n_read: int = 0
    skipped: list[SkippedRow] = field(default_factory=list)
    n_duplicates: int = 0

    def skip(self, line: int | None, field_name: str | None, reason: str) -> None:
        self.skipped.append(SkippedRow(self.path, line, field_name, reason))

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)

    @property
    def n_kept(self) -> int:
        return self.n_read - self.n_skipped - self.n_duplicates

    def __len__(self) -> int:
        return self.n_skipped

    def __iter__(self) -> Iterator[SkippedRow]:
        return iter(self.skipped)

    # The same names as ``molpredict.io.SkipReport`` (spectra), for code that handles both.
    count = n_skipped

    def by_reason(self) -> dict[str, int]:
        """Skipped-row counts per field, most frequent first."""
        return dict(Counter(s.field or "row" for s in self.skipped).most_common())

    def summary(self) -> str:
        """One line: counts and the first problem."""
        text = f"{self.path}: {self.n_kept} of {self.n_read} records kept"
        if self.n_skipped:
            text += f", {self.n_skipped} skipped (first: {self.skipped[0]})"
        if self.n_duplicates:
            text += f", {self.n_duplicates} duplicate rows (same InChIKey and source) dropped"
        return text

    def warn(self) -> None:
        """Issue one ``UserWarning`` with :meth:`summary` when something was skipped."""
        if self.n_skipped:
            warnings.warn(self.summary(), UserWarning, stacklevel=3)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (:meth:`from_json` reads it back)."""
        return {"path": self.path, "n_read": self.n_read, "n_duplicates": self.n_duplicates,
                "skipped": [[s.line, s.field, s.reason] for s in self.skipped]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: str | None = None) -> LoadReport:
        report = cls(path or data["path"], n_read=int(data["n_read"]), n_duplicates=int(data["n_duplicates"]))
        for line, field_name, reason in data["skipped"]:
            report.skip(line, field_name, reason)
        return report


# ----------------------------------------------------------------------------------------------------------
# Computing the columns with RDKit
# ----------------------------------------------------------------------------------------------------------

#: Below this many SMILES, process start-up costs more than it saves.
_PARALLEL_MIN = 2000


def describe_smiles(smiles: str) -> tuple[str, str, str, float] | None:
    """(canonical SMILES, InChIKey, formula, monoisotopic mass) of a SMILES, or None when RDKit cannot parse it
    or InChI fails on it. Pure and picklable: the worker function of :func:`describe_many`."""
    try:
        m = Molecule.from_smiles(smiles)
        inchikey = m.inchikey
    except InputError:
        return None
    if not inchikey:
        return None
    return m.smiles, inchikey, m.formula, m.monoisotopic_mass


def undescribed_reason(smiles: str) -> str:
    """Why :func:`describe_smiles` returned None for ``smiles``, in words for a skip report: RDKit cannot parse
    it, or RDKit parses it but InChI fails (no InChIKey: InChI refuses, for one, structures of over 1,024 atoms).
    Parses again: call it for the few failures only."""
    from rdkit import Chem

    shown = repr(smiles[:80])
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        return f"RDKit cannot parse SMILES {shown}"
    return f"no InChIKey: InChI fails on this structure ({mol.GetNumAtoms()} heavy atoms), SMILES {shown}"


def parent_smiles(smiles: str) -> str | None:
    """The parent structure of a SMILES, canonical (what ``candidates build --standardize`` keeps): metals
    disconnected, the largest organic fragment kept, charges neutralised where a hydrogen can be added or
    removed (RDKit's ``rdMolStandardize``); None when RDKit cannot parse it or standardisation fails.

    A salt or a charged form carries the formula and mass of what was weighed, never those of the ion a spectrum
    shows: diazepam hydrochloride, a sodium carboxylate, a tartrate salt become diazepam, the acid, the base. No
    other normalisation is done, so a neutral single-fragment structure comes back as its own canonical SMILES.
    Pure and picklable (run on worker processes by :func:`parents_many`)."""
    from rdkit import Chem
    from rdkit.Chem.MolStandardize import rdMolStandardize

    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        return None
    try:
        mol = rdMolStandardize.MetalDisconnector().Disconnect(mol)
        mol = rdMolStandardize.LargestFragmentChooser(preferOrganic=True).choose(mol)
        mol = rdMolStandardize.Uncharger().uncharge(mol)
    except (RuntimeError, ValueError):  # RDKit raises these on structures it cannot sanitise after a change
        return None
    return Chem.MolToSmiles(mol) or None


def parents_many(smiles: Sequence[str], n_jobs: int = 1, progress: bool = False,
                 desc: str = "standardising") -> list[str | None]:
    """:func:`parent_smiles` over many SMILES, as :func:`describe_many` runs :func:`describe_smiles`."""
    return _map(parent_smiles, smiles, n_jobs, progress, desc)


def describe_many(smiles: Sequence[str], n_jobs: int = 1, progress: bool = False,
                  desc: str = "molecules") -> list[tuple[str, str, str, float] | None]:
    """:func:`describe_smiles` over many SMILES, on ``n_jobs`` processes (``-1``: all cores), in input order,
    with an optional tqdm progress bar on stderr."""
    return _map(describe_smiles, smiles, n_jobs, progress, desc)


def _map(function: Any, smiles: Sequence[str], n_jobs: int, progress: bool, desc: str) -> list[Any]:
    """``function`` (picklable, pure) over ``smiles`` on ``n_jobs`` processes, in input order, with an optional
    progress bar."""
    from molpredict.chem.molecules import n_workers

    workers = n_workers(n_jobs)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(smiles), desc=desc, unit="mol", file=None, mininterval=0.5)
    try:
        if workers > 1 and len(smiles) >= _PARALLEL_MIN:
            from concurrent.futures import ProcessPoolExecutor

            out: list = []
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for result in pool.map(function, smiles, chunksize=500):
                    out.append(result)
                    if bar is not None:
                        bar.update(1)
            return out
        out = []
        for s in smiles:
            out.append(function(s))
            if bar is not None:
                bar.update(1)
        return out
    finally:
        if bar is not None:
            bar.close()


# ----------------------------------------------------------------------------------------------------------
# The library
# ----------------------------------------------------------------------------------------------------------

#: how :meth:`CandidateLibrary.source_counts` names the rows without a source
NO_SOURCE = "(none)"


class CandidateLibrary:
    """A table of candidate structures with fast selection by formula, mass window and source.

    Parameters
    ----------
    columns : mapping of str to array-like, or pyarrow.Table
        At least ``smiles``, ``inchikey``, ``formula`` and ``monoisotopic_mass`` (``inchikey14`` is derived
        from ``inchikey`` when absent); optionally ``name``, ``id``, ``source``. Values are taken as given (no
        RDKit): use :meth:`from_smiles` or the file readers to compute them.
    path : str, optional
        The file it came from (for messages).
    report : LoadReport, optional
        What reading the file skipped.

    Attributes
    ----------
    smiles, inchikey, inchikey14, formula : ndarray of shape (n,), dtype object (str)
    monoisotopic_mass : ndarray of shape (n,), float64
    name, id, source : ndarray of shape (n,), dtype object, or None when the library lacks the column
    report : LoadReport or None
    path : str or None

    Notes
    -----
    The string columns are materialised from the Arrow table on first access (about 1 s per column for two
    million rows); selection, indexing and :meth:`molecules` never need them.
    """

    def __init__(self, columns: Mapping[str, Any] | pa.Table, *, path: str | os.PathLike | None = None,
                 report: LoadReport | None = None) -> None:
        table = columns if isinstance(columns, pa.Table) else _table_from_columns(columns)
        self._table = _conform(table, path)
        self.path = None if path is None else str(path)
        self.report = report
        self._arrays: dict[str, np.ndarray] = {}
        self._mass_order: np.ndarray | None = None
        self._mass_sorted: np.ndarray | None = None
        self._formula_index: tuple[np.ndarray, np.ndarray, Any] | None = None
        self._taken: Counter = Counter()  # rows read per column through take() (a column read often is materialised)

    # -- constructors --------------------------------------------------------------------------------------
    @classmethod
    def from_molecules(cls, molecules: Iterable[Molecule], *, source: str | None = None) -> CandidateLibrary:
        """A library of ``Molecule`` records (their attributes are computed if needed)."""
        rows = list(molecules)
        return cls(_record_columns(rows, [m.monoisotopic_mass for m in rows], source=source))

    @classmethod
    def from_smiles(cls, smiles: Sequence[str], *, names: Sequence[str | None] | None = None,
                    source: str | None = None, n_jobs: int = 1) -> CandidateLibrary:
        """A library from SMILES strings, columns computed with RDKit; unparsable SMILES are skipped and reported
        in ``report`` (record = 1-based position)."""
        report = LoadReport("<smiles>")
        raw = [StructureRecord(i + 1, s, None if names is None else names[i], None, source) for i, s in enumerate(smiles)]
        report.n_read = len(raw)
        return cls(_complete(raw, [], report, n_jobs=n_jobs), path=None, report=report)

    @classmethod
    def from_tsv(cls, path: str | os.PathLike, *, cache: bool | None = None, n_jobs: int = 1,
                 progress: bool = False) -> CandidateLibrary:
        """Read a library TSV (``.tsv`` or gzipped ``.tsv.gz``; see ``candidates/README.md``).

        Only ``smiles`` is required; ``inchikey``, ``formula``, ``monoisotopic_mass`` are computed with RDKit
        for rows that lack them, ``inchikey14`` from ``inchikey``. Bad rows are skipped and listed in
        ``report`` with file, line and field (a ``UserWarning`` says how many). ``cache``: None caches files of
        at least :data:`CACHE_MIN_BYTES`, True always, False never.
        """
        path = Path(path)
        _check_file(path)
        use_cache = path.stat().st_size >= CACHE_MIN_BYTES if cache is None else bool(cache)
        if use_cache:
            entry = library_entry(path)
            cached = _load_cached(entry, path)
            if cached is not None:
                if cached.report is not None:
                    cached.report.warn()
                return cached
        library = _read_tsv(path, n_jobs=n_jobs, progress=progress)
        if use_cache:
            library.build_indexes()
            store_library_entry(entry, library.table, library.report.to_dict() if library.report is not None else None,
                                library._mass_index(), library._formulas(), what=f"library {library.path}")
        if library.report is not None:
            library.report.warn()
        return library

    @classmethod
    def from_smiles_file(cls, path: str | os.PathLike, *, source: str | None = None, n_jobs: int = 1,
                         progress: bool = False) -> CandidateLibrary:
        """Read a SMILES file: one ``SMILES [name]`` per line (whitespace-separated; ``#`` comments and a
        ``smiles`` header line are ignored). Columns are computed with RDKit; bad lines are reported."""
        return cls._from_records(read_smiles_records, path, source, n_jobs, progress)

    @classmethod
    def from_sdf(cls, path: str | os.PathLike, *, source: str | None = None, n_jobs: int = 1,
                 progress: bool = False) -> CandidateLibrary:
        """Read an SDF file (``.sdf`` or ``.sdf.gz``). Name from a ``name`` data item or the title line, id from
        an ``id`` item, source from a ``source`` item (or ``source``). Records RDKit cannot read are reported
        with the line where they start."""
        return cls._from_records(read_sdf_records, path, source, n_jobs, progress)

    @classmethod
    def _from_records(cls, reader: Any, path: str | os.PathLike, source: str | None, n_jobs: int,
                      progress: bool) -> CandidateLibrary:
        """A library from a structure-file reader of :mod:`molpredict.chem.structures` (columns computed with
        RDKit; bad records reported)."""
        path = Path(path)
        _check_file(path)
        report = LoadReport(str(path))
        raw = list(reader(path, report, source))
        library = cls(_complete(raw, [], report, n_jobs=n_jobs, progress=progress), path=path, report=report)
        report.warn()
        return library

    # -- table access --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._table.num_rows

    def __repr__(self) -> str:
        where = f" from {self.path}" if self.path else ""
        return f"<CandidateLibrary {len(self)} molecules{where}>"

    @property
    def table(self) -> pa.Table:
        """The underlying Arrow table (read-only view)."""
        return self._table

    @property
    def columns(self) -> list[str]:
        return list(self._table.column_names)

    def has_column(self, name: str) -> bool:
        return name in self._table.column_names

    def column(self, name: str) -> np.ndarray | None:
        """A column as a numpy array (float64 for the mass, object str otherwise); None when absent."""
        if name not in self._table.column_names:
            return None
        array = self._arrays.get(name)
        if array is None:
            # through Python lists: pyarrow's to_numpy would import pandas (a second) for a column it converts as fast
            values = self._table.column(name).to_pylist()
            array = np.array(values, dtype=np.float64 if name == "monoisotopic_mass" else object)
            array.flags.writeable = False
            self._arrays[name] = array
        return array

    def take(self, name: str, indices: np.ndarray) -> np.ndarray | None:
        """Rows ``indices`` of one column (as :meth:`column` types them), reading only those rows of the table;
        None when the library lacks the column.

        A column read this way for more than an eighth of the library in all is materialised whole (after that,
        indexing the array is cheaper than the per-call cost of a take): a few queries touch only their
        candidates, a run over thousands of spectra pays for each column once."""
        if name not in self._table.column_names:
            return None
        indices = np.asarray(indices, dtype=np.int64)
        array = self._arrays.get(name)
        if array is None:
            self._taken[name] += indices.size
            if self._taken[name] > len(self) // 8:
                array = self.column(name)
        if array is not None:
            return array[indices]
        values = self._table.column(name).take(_arrow_indices(self._check_indices(indices))).to_pylist()
        return np.array(values, dtype=np.float64 if name == "monoisotopic_mass" else object)

    smiles = property(lambda self: self.column("smiles"))
    inchikey = property(lambda self: self.column("inchikey"))
    inchikey14 = property(lambda self: self.column("inchikey14"))
    formula = property(lambda self: self.column("formula"))
    monoisotopic_mass = property(lambda self: self.column("monoisotopic_mass"))
    name = property(lambda self: self.column("name"))
    id = property(lambda self: self.column("id"))
    source = property(lambda self: self.column("source"))

    def __getitem__(self, index: int) -> Molecule:
        if not isinstance(index, (int, np.integer)):
            raise TypeError("CandidateLibrary[i] takes one integer; use molecules(indices) or subset(indices)")
        n = len(self)
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"row {index} out of range for a library of {n}")
        row = {name: self._table.column(name)[i].as_py() for name in self._table.column_names}
        return _molecule(row)

    def __iter__(self) -> Iterator[Molecule]:
        for start in range(0, len(self), 4096):
            yield from self.molecules(np.arange(start, min(start + 4096, len(self))))

    def molecules(self, indices: Sequence[int] | np.ndarray) -> list[Molecule]:
        """Rows as ``Molecule`` records (cheap: nothing is parsed), in the order of ``indices``."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size == 0:
            return []
        taken = self._table.take(_arrow_indices(self._check_indices(indices)))
        rows = {name: taken.column(name).to_pylist() for name in taken.column_names}
        keys = list(rows)
        return [_molecule({k: rows[k][j] for k in keys}) for j in range(indices.size)]

    def subset(self, indices: Sequence[int] | np.ndarray) -> CandidateLibrary:
        """A new library of the given rows, in that order (``report`` and ``path`` carried over)."""
        indices = self._check_indices(np.asarray(indices, dtype=np.int64).reshape(-1))
        library = CandidateLibrary(self._table.take(pa.array(indices)), path=self.path, report=self.report)
        return library

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        n = len(self)
        if indices.size and (indices.min() < -n or indices.max() >= n):
            raise IndexError(f"row indices out of range for a library of {n}")
        return np.where(indices < 0, indices + n, indices)

    # -- selection -----------------------------------------------------------------------------------------
    def build_indexes(self) -> None:
        """Build the mass and formula indexes now rather than on the first selection (a cluster worker does it
        while loading, not inside its first block)."""
        self._mass_index()
        self._formulas()

    def _mass_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(order, sorted masses)``: rows by ascending mass (memory-mapped from the cache: a mass window reads
        only the pages its binary search and its rows touch)."""
        if self._mass_order is None:
            self._mass_order = np.argsort(self.monoisotopic_mass, kind="stable")
        if self._mass_sorted is None:
            self._mass_sorted = np.ascontiguousarray(self.monoisotopic_mass[self._mass_order])
        return self._mass_order, self._mass_sorted

    def _formulas(self) -> tuple[np.ndarray, np.ndarray, Any]:
        """The formula index: ``(rows, offsets, keys)`` with ``keys`` the distinct normalised formulas, sorted (a
        list, or an Arrow string array when memory-mapped from the cache), and ``rows[offsets[k]:offsets[k + 1]]``
        the rows (ascending) of ``keys[k]``."""
        if self._formula_index is None:
            encoded = pc.dictionary_encode(self._table.column("formula")).combine_chunks()
            codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            normalised = [_formula_key(raw) for raw in encoded.dictionary.to_pylist()]
            keys = sorted(set(normalised))
            position = {key: k for k, key in enumerate(keys)}
            key_of_code = np.fromiter((position[key] for key in normalised), dtype=np.int64, count=len(normalised))
            row_keys = key_of_code[codes]
            rows = np.argsort(row_keys, kind="stable")
            offsets = np.zeros(len(keys) + 1, dtype=np.int64)
            np.cumsum(np.bincount(row_keys, minlength=len(keys)), out=offsets[1:])
            self._formula_index = (rows, offsets, keys)
        return self._formula_index

    def select_by_formula(self, formula: str) -> np.ndarray:
        """Row indices (ascending, int64) whose formula equals ``formula`` after :func:`normalize_formula` on
        both sides (so ``"OH2"`` finds ``"H2O"``). Raises ``InputError`` on an unparsable query.

        A binary search in the sorted distinct formulas: only the query's rows of the index are read."""
        key = normalize_formula(formula)
        rows, offsets, keys = self._formulas()
        k = _sorted_position(keys, key)
        if k is None:
            return np.empty(0, dtype=np.int64)
        return np.asarray(rows[offsets[k]:offsets[k + 1]], dtype=np.int64)

    def mass_windows(self, masses: Sequence[float] | np.ndarray, ppm: float = 10.0,
                     min_tolerance: Sequence[float] | np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """For each neutral mass M, the half-open range ``[start, end)`` of positions in the mass-sorted order
        with ``|m - M| <= max(M * ppm * 1e-6, min_tolerance)`` (``min_tolerance`` in Da, one per mass or one
        for all: what a precursor's written precision allows). Vectorised: the building block of
        :meth:`select_by_mass`."""
        masses = np.asarray(masses, dtype=np.float64)
        _, sorted_masses = self._mass_index()
        tolerance = np.maximum(np.abs(masses) * (float(ppm) * 1e-6), np.asarray(min_tolerance, dtype=np.float64))
        start = np.searchsorted(sorted_masses, masses - tolerance, side="left")
        end = np.searchsorted(sorted_masses, masses + tolerance, side="right")
        return start, end

    def select_by_mass(self, neutral_mass: float, ppm: float = 10.0) -> np.ndarray:
        """Row indices (ascending, int64) with monoisotopic mass within ``ppm`` of ``neutral_mass`` (the window
        is ``neutral_mass * ppm * 1e-6`` each side, bounds included)."""
        order, _ = self._mass_index()
        start, end = self.mass_windows(np.array([neutral_mass]), ppm)
        return np.sort(order[int(start[0]):int(end[0])])

    def select_by_masses(self, masses: Sequence[float] | np.ndarray, ppm: float = 10.0,
                         min_tolerance: Sequence[float] | np.ndarray | float = 0.0) -> list[np.ndarray]:
        """:meth:`select_by_mass` for many masses at once (one ascending index array per mass); see
        :meth:`mass_windows` for ``min_tolerance``."""
        order, _ = self._mass_index()
        start, end = self.mass_windows(masses, ppm, min_tolerance)
        return [np.sort(order[s:e]) for s, e in zip(start.tolist(), end.tolist())]

    def select_by_precursor(self, precursor_mz: float, adducts: str | Adduct | Iterable[str | Adduct],
                            ppm: float = 10.0) -> np.ndarray:
        """Rows whose mass matches ``precursor_mz`` as any of ``adducts`` (union, ascending indices)."""
        if isinstance(adducts, (str, Adduct)):
            adducts = [adducts]
        masses = [neutral_mass(precursor_mz, parse_adduct(a)) for a in adducts]
        if not masses:
            return np.empty(0, dtype=np.int64)
        return np.unique(np.concatenate(self.select_by_masses(masses, ppm)))

    def select_by_source(self, sources: str | Iterable[str]) -> np.ndarray:
        """Row indices (ascending) whose ``source`` is one of ``sources``; empty when there is no such column."""
        if isinstance(sources, str):
            sources = [sources]
        if not self.has_column("source"):
            return np.empty(0, dtype=np.int64)
        mask = pc.is_in(self._table.column("source"), value_set=pa.array(list(sources), pa.string()))
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False))

    def lookup(self, inchikey14s: Sequence[str]) -> np.ndarray:
        """Row index of each InChIKey first block (first occurrence), -1 where the library lacks it."""
        found = pc.index_in(pa.array(list(inchikey14s), pa.string()),
                            value_set=self._table.column("inchikey14").combine_chunks())
        return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)

    # -- summaries and writing -----------------------------------------------------------------------------
    def source_counts(self) -> dict[str, int]:
        """Rows per ``source`` label, most frequent first; rows without one under :data:`NO_SOURCE` (not the
        string "None"); empty when there is no source column."""
        if not self.has_column("source"):
            return {}
        counts = pc.value_counts(self._table.column("source")).to_pylist()
        return {NO_SOURCE if c["values"] in (None, "") else str(c["values"]): int(c["counts"])
                for c in sorted(counts, key=lambda c: -c["counts"])}

    def info(self) -> dict[str, Any]:
        """Rows, distinct InChIKeys / formulas, sources with counts (:meth:`source_counts`; a structure counts
        under each of its sources), structures under several sources, rows that are salts or charged
        (:meth:`salt_or_charged_rows`), mass range: a JSON-ready summary."""
        mass = self.monoisotopic_mass
        sources = self.source_counts()
        formulas = pc.value_counts(self._table.column("formula")).to_pylist()
        top = sorted(formulas, key=lambda c: -c["counts"])[:5]
        multi_source = 0
        if self.has_column("source"):
            per_key = pa.table({"key": self._table.column("inchikey"), "source": self._table.column("source")}) \
                .group_by("key", use_threads=False).aggregate([("source", "count_distinct")])
            multi_source = int(pc.sum(pc.greater(per_key.column("source_count_distinct"), 1)).as_py() or 0)
        return {
            "path": self.path, "rows": len(self),
            "distinct_inchikey14": int(pc.count_distinct(self._table.column("inchikey14")).as_py()),
            "multi_source_structures": multi_source,
            "salt_or_charged_rows": self.salt_or_charged_rows(),
            "distinct_formulas": len(formulas),
            "top_formulas": {str(c["values"]): int(c["counts"]) for c in top},
            "sources": sources,
            "mass_min": float(mass.min()) if len(mass) else None,
            "mass_max": float(mass.max()) if len(mass) else None,
            "columns": self.columns,
        }

    def salt_or_charged_rows(self) -> int:
        """Rows whose structure has several fragments (a salt, a solvate) or a net charge: their formula and mass
        are those of what was weighed, which a spectrum's precursor never shows, so they match no query by formula
        or mass (``candidates build --standardize`` replaces each by its parent). From the SMILES and formula
        columns, without RDKit."""
        if not len(self):
            return 0
        several = pc.match_substring(self._table.column("smiles"), ".")
        charged = pc.match_substring_regex(self._table.column("formula"), r"[+-]\d*$")
        return int(pc.sum(pc.or_(several, charged)).as_py() or 0)

    def to_tsv(self, path: str | os.PathLike) -> None:
        """Write the library TSV (gzipped when ``path`` ends in ``.gz``): :data:`COLUMNS` present, in order;
        masses with 6 decimals."""
        from molpredict.atomic import atomic_text

        path = Path(path)
        names = [c for c in COLUMNS if self.has_column(c)]
        block = 65536
        with atomic_text(path, newline="") as handle:  # a failed write leaves no half file
            handle.write("\t".join(names) + "\n")
            for start in range(0, len(self), block):
                part = self._table.slice(start, block).select(names).to_pydict()
                columns = []
                for name in names:
                    values = part[name]
                    if name == "monoisotopic_mass":
                        columns.append([f"{v:.6f}" for v in values])
                    else:
                        columns.append(["" if v is None else _clean_cell(v) for v in values])
                handle.writelines("\t".join(row) + "\n" for row in zip(*columns))


def _clean_cell(value: Any) -> str:
    return str(value).replace("\t", " ").replace("\n", " ").replace("\r", " ")


def _arrow_indices(indices: np.ndarray) -> pa.Array:
    """Row indices as an Arrow array, zero-copy. (``pa.array`` of a numpy array, like ``to_numpy`` of a chunked
    column or ``to_pydict``, makes pyarrow import pandas, a second at start-up for a few rows.)"""
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(indices), [None, pa.py_buffer(indices)])


def _sorted_position(keys: Any, key: str) -> int | None:
    """Position of ``key`` in the sorted strings ``keys`` (a list or an Arrow string array), or None."""
    lo, hi = 0, len(keys)
    arrow = isinstance(keys, (pa.Array, pa.ChunkedArray))
    while lo < hi:
        mid = (lo + hi) // 2
        value = keys[mid].as_py() if arrow else keys[mid]
        if value < key:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(keys) and (keys[lo].as_py() if arrow else keys[lo]) == key:
        return lo
    return None


#: prefix of the formula-index key of a formula that does not parse (:func:`_formula_key`)
_UNPARSED = "unparsed:"
#: an isotope written apart, as :func:`~molpredict.chem.molecules.molecular_formula` writes it (``[13C]``, ``[2H]3``)
#: or as RDKit abbreviates hydrogen's (``D``, ``T``: no element symbol is one of these letters alone)
_ISOTOPE = re.compile(r"\[\d+([A-Z][a-z]?)\]|[DT](?![a-z])")


def _formula_key(raw: str | None) -> str:
    """The formula-index key: the normalised formula; a labelled formula (``C15[13C]H13ClN2O``) as written,
    which no normalised query formula equals (it is reached by mass only); ``unparsed:...`` for anything else,
    which nothing selects and the readers skip."""
    try:
        return normalize_formula(raw or "")
    except InputError:
        pass
    text = (raw or "").strip()
    if _ISOTOPE.search(text):
        try:  # a labelled formula is valid when it parses with each isotope read as its element
            normalize_formula(_ISOTOPE.sub(lambda m: m.group(1) or "H", text))
            return text
        except InputError:
            pass
    return f"{_UNPARSED}{raw}"  # still selectable by nothing, never confused with a real formula


def _molecule(row: Mapping[str, Any]) -> Molecule:
    return Molecule(row["smiles"], inchikey=row.get("inchikey"), inchikey14=row.get("inchikey14"),
                    formula=row.get("formula"), monoisotopic_mass=row.get("monoisotopic_mass"),
                    name=row.get("name"), id=row.get("id"), source=row.get("source"))


def _table_from_columns(columns: Mapping[str, Any]) -> pa.Table:
    arrays = {}
    for name, values in columns.items():
        if values is None:
            continue
        if name == "monoisotopic_mass":
            arrays[name] = pa.array(np.asarray(values, dtype=np.float64))
        else:
            arrays[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
    return pa.table(arrays)


def _conform(table: pa.Table, path: Any) -> pa.Table:
    """Check the required columns, derive ``inchikey14``, fix types and column order, one chunk per column."""
    missing = [c for c in ("smiles", "inchikey", "formula", "monoisotopic_mass") if c not in table.column_names]
    if missing:
        raise InputError(f"library lacks column(s) {', '.join(missing)}", path=path, field=missing[0])
    if "inchikey14" not in table.column_names:
        table = table.append_column("inchikey14", pc.utf8_slice_codeunits(table.column("inchikey"), 0, 14))
    fields = []
    for name in COLUMNS:
        if name not in table.column_names:
            continue
        column = table.column(name)
        wanted = pa.float64() if name == "monoisotopic_mass" else pa.string()
        if column.type != wanted:
            column = column.cast(wanted)
        fields.append((name, column))
    out = pa.table({name: column for name, column in fields})
    return out.combine_chunks() if any(c.num_chunks > 1 for c in out.columns) else out


# ----------------------------------------------------------------------------------------------------------
# Readers
# ----------------------------------------------------------------------------------------------------------

def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError("no such file", path=path)
    if path.is_dir():
        raise InputError("is a directory, not a library file", path=path)


def _read_header(path: Path) -> list[str]:
    try:
        with open_table_text(path) as handle:
            first = handle.readline()
    except (EOFError, zlib.error) as exc:
        raise InputError(f"the compressed file is truncated or damaged ({type(exc).__name__}: {exc})",
                         path=path) from None
    except (UnicodeDecodeError, OSError) as exc:
        raise InputError(f"not a text library file ({type(exc).__name__})", path=path) from None
    if "\x00" in first:
        raise InputError("not a text library file (binary content)", path=path)
    names = [h.strip().lower() for h in first.rstrip("\r\n").split("\t")]
    if "id" not in names and "cid" in names:  # ChEBI-20 / PubChem tables name their identifier "cid"
        names[names.index("cid")] = "id"
    if "smiles" not in names:
        raise InputError("not a library TSV: the header has no 'smiles' column", path=path, record=1,
                         field="smiles")
    return names


def _read_tsv(path: Path, *, n_jobs: int = 1, progress: bool = False) -> CandidateLibrary:
    header = _read_header(path)
    if all(c in header for c in _COMPUTED):
        library = _read_tsv_fast(path, header)
        if library is not None:
            return library
    return _read_tsv_rows(path, header, n_jobs=n_jobs, progress=progress)


def _read_tsv_fast(path: Path, header: list[str]) -> CandidateLibrary | None:
    """Arrow's multithreaded reader for complete files (every computed column present): no RDKit, no Python
    loop. Returns None on any irregularity (a bad number, a short row, an empty cell), and the row-by-row
    reader then reports it by line."""
    import pyarrow.csv as pcsv

    if len(set(header)) != len(header):
        return None
    types = {name: (pa.float64() if name == "monoisotopic_mass" else pa.string()) for name in header}
    try:
        stream = pa.input_stream(str(path), compression="gzip" if is_gzip(path) else None)
        table = pcsv.read_csv(
            stream,
            read_options=pcsv.ReadOptions(column_names=header, skip_rows=1, block_size=1 << 24),
            parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False, ignore_empty_lines=False),
            convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False,
                                                include_columns=[c for c in header if c in COLUMNS]),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError, OSError):
        return None  # OSError: a truncated gzip stream, which the row reader reports with its line
    for name in ("smiles", "inchikey", "formula"):
        if pc.any(pc.equal(pc.utf8_length(table.column(name)), 0)).as_py():
            return None
    mass = table.column("monoisotopic_mass")
    if mass.null_count or pc.any(pc.invert(pc.is_finite(mass))).as_py() or pc.any(pc.less(mass, 0)).as_py():
        return None
    for name in _OPTIONAL_COLUMNS:
        if name in table.column_names:  # empty optional cells are missing values
            column = table.column(name)
            table = table.set_column(table.column_names.index(name), name,
                                     pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column))
    report = LoadReport(str(path), n_read=table.num_rows)
    library = CandidateLibrary(table, path=path, report=report)
    # The row reader skips a row taken as given whose formula does not parse: check the distinct formulas here, through
    # the formula index that every selection by formula (and every cached library) builds anyway, and leave any such
    # file to the row reader, which reports the rows by line.
    _, _, keys = library._formulas()
    if any(key.startswith(_UNPARSED) for key in keys):
        return None
    return library


def _read_tsv_rows(path: Path, header: list[str], *, n_jobs: int = 1, progress: bool = False
                   ) -> CandidateLibrary:
    report = LoadReport(str(path))
    position = {name: header.index(name) for name in (*COLUMNS, "inchi") if name in header}
    raw: list[StructureRecord] = []
    with open_table_text(path) as handle:
        try:
            handle.readline()
            for line_number, line in enumerate(handle, start=2):
                text = line.rstrip("\r\n")
                if not text.strip() or text.startswith("#"):
                    continue
                report.n_read += 1
                cells = text.split("\t")
                if len(cells) != len(header):
                    report.skip(line_number, None, f"expected {len(header)} tab-separated fields, got {len(cells)}")
                    continue

                def get(name: str) -> str | None:
                    i = position.get(name)
                    value = None if i is None else cells[i].strip()
                    return value or None

                smiles = get("smiles")
                if smiles is None and "inchi" in position:
                    inchi = get("inchi")
                    smiles = None if inchi is None else _smiles_of_inchi(inchi)
                    if smiles is None:
                        if inchi is None:
                            report.skip(line_number, "smiles", "empty SMILES and InChI")
                        else:
                            report.skip(line_number, "inchi",
                                        f"empty SMILES, and RDKit cannot parse InChI {inchi[:80]!r}")
                        continue
                if smiles is None:
                    report.skip(line_number, "smiles", "empty SMILES")
                    continue
                mass_text = get("monoisotopic_mass")
                mass = None
                if mass_text is not None:
                    try:
                        mass = float(mass_text)
                    except ValueError:
                        mass = float("nan")
                    if not np.isfinite(mass) or mass < 0:
                        report.skip(line_number, "monoisotopic_mass", f"not a mass: {mass_text!r}")
                        continue
                formula = get("formula")
                if formula is not None and mass is not None and get("inchikey") is not None \
                        and _formula_key(formula).startswith(_UNPARSED):  # taken as given: checked as the fast path
                    report.skip(line_number, "formula", f"not a formula: {formula[:80]!r}")
                    continue
                raw.append(StructureRecord(line_number, smiles, get("name"), get("id"), get("source"), get("inchikey"),
                                get("formula"), mass))
        except UnicodeDecodeError:
            raise InputError("not a UTF-8 text file", path=path) from None
        except (EOFError, OSError, zlib.error) as exc:  # a truncated or damaged gzip stream
            raise InputError(f"the compressed file is truncated or damaged ({type(exc).__name__}: {exc})",
                             path=path) from None
    extra = [c for c in _OPTIONAL_COLUMNS if c in header]
    library = CandidateLibrary(_complete(raw, extra, report, n_jobs=n_jobs, progress=progress), path=path,
                               report=report)
    return library


def _smiles_of_inchi(inchi: str) -> str | None:
    """Canonical SMILES of an InChI (for a TSV row whose ``smiles`` cell is empty), None when RDKit cannot read it."""
    try:
        return Molecule.from_inchi(inchi).smiles
    except InputError:
        return None


def _complete(raw: list[StructureRecord], extra: Sequence[str], report: LoadReport, *, n_jobs: int = 1,
              progress: bool = False) -> dict[str, Any]:
    """Columns for the raw records, computing what is missing with RDKit (rows it cannot parse are reported).

    A record that lacks any computed field is described from its SMILES entirely (canonical SMILES included),
    so that the row is self-consistent; a record with all fields keeps them as given.
    """
    todo = [i for i, r in enumerate(raw) if r.inchikey is None or r.formula is None or r.mass is None]
    described = describe_many([raw[i].smiles for i in todo], n_jobs=n_jobs, progress=progress)
    keep = np.ones(len(raw), dtype=bool)
    for i, result in zip(todo, described):
        record = raw[i]
        if result is None:
            report.skip(record.line, "smiles", undescribed_reason(record.smiles))
            keep[i] = False
            continue
        record.smiles, record.inchikey, record.formula, record.mass = result
    report.skipped.sort(key=lambda s: (s.line is None, s.line or 0))
    rows = [r for r, k in zip(raw, keep) if k]
    return _record_columns(rows, [r.mass for r in rows], extra)


def _record_columns(rows: Sequence[Any], masses: Sequence[float], extra: Sequence[str] = (),
                    source: str | None = None) -> dict[str, Any]:
    """Library columns from records with ``smiles``, ``inchikey``, ``formula`` and the optional columns as
    attributes: an optional column is kept when named in ``extra`` or set on any row; ``source`` fills the rows
    without one."""
    columns: dict[str, Any] = {
        "smiles": [r.smiles for r in rows], "inchikey": [r.inchikey for r in rows],
        "formula": [r.formula for r in rows], "monoisotopic_mass": np.array(masses, dtype=np.float64),
    }
    for name in _OPTIONAL_COLUMNS:
        values = [getattr(r, name) for r in rows]
        if name == "source" and source is not None:
            values = [v or source for v in values]
        if name in extra or any(v is not None for v in values):
            columns[name] = values
    return columns


def _kind_of(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return _SUFFIXES.get(suffixes[-1]) if suffixes else None


def check_usable(library: CandidateLibrary, path: str | os.PathLike) -> CandidateLibrary:
    """``library``, or the one-line :class:`InputError` when it holds no usable structure: every query would
    then be skipped with "no candidates", which reads as a problem of the queries."""
    if len(library) == 0:
        report = getattr(library, "report", None)
        why = " (no rows)"
        if report is not None and report.n_read:
            first = ""
            if report.skipped:  # where in the file, without naming the file again (the message starts with it)
                row = report.skipped[0]
                place = []
                if row.line is not None:
                    place.append(f"line {row.line}")
                if row.field is not None:
                    place.append(f"field {row.field}")
                first = "; first: " + (f"{', '.join(place)}: " if place else "") + row.reason
            why = f" ({report.n_read} row{'s' if report.n_read != 1 else ''} read, none usable{first})"
        raise InputError(f"no usable structure in the library{why}", path=str(path))
    return library


def check_library_file(path: str | os.PathLike) -> None:
    """Raise the one-line :class:`InputError` of :func:`read_library` for a file it would refuse at once (not a
    readable file; an extension that says nothing and a header without a ``smiles`` column; a TSV whose header has
    none), without reading its rows."""
    path = Path(path)
    _check_file(path)
    kind = _kind_of(path)
    if kind is None:
        _check_unnamed_kind(path)
    elif kind == "tsv":
        _read_header(path)


def _check_unnamed_kind(path: Path) -> None:
    """A file whose extension says nothing is read as TSV only when its header has a ``smiles`` column."""
    try:
        _read_header(path)
    except InputError:
        raise InputError("not a candidate library (expected .tsv, .tsv.gz, .smi or .sdf, or a TSV with a "
                         "'smiles' column)", path=path) from None


def read_library(path: str | os.PathLike, *, cache: bool | None = None, n_jobs: int = 1,
                 progress: bool = False) -> CandidateLibrary:
    """Read a candidate library, choosing the reader by extension: ``.tsv``/``.tab``/``.txt`` (TSV),
    ``.smi``/``.smiles`` (SMILES file), ``.sdf``/``.sd``/``.mol`` (SDF), each optionally ``.gz``. A file whose
    extension says nothing is read as TSV when its header has a ``smiles`` column; anything else is a one-line
    ``InputError``."""
    path = Path(path)
    _check_file(path)
    kind = _kind_of(path)
    if kind == "smiles":
        return CandidateLibrary.from_smiles_file(path, n_jobs=n_jobs, progress=progress)
    if kind == "sdf":
        return CandidateLibrary.from_sdf(path, n_jobs=n_jobs, progress=progress)
    if kind is None:
        _check_unnamed_kind(path)
    # a .tsv's header is read by from_tsv, and not at all when its cache entry answers
    return CandidateLibrary.from_tsv(path, cache=cache, n_jobs=n_jobs, progress=progress)


def _load_cached(entry: Path, path: Path) -> CandidateLibrary | None:
    """The library stored in the cache entry (:mod:`molpredict.cache`), or None (absent, or damaged: removed)."""
    stored = load_library_entry(entry)
    if stored is None:
        return None
    try:
        report = None if stored.report is None else LoadReport.from_json(stored.report, path=str(path))
        library = CandidateLibrary(stored.table, path=path, report=report)
    except (InputError, KeyError, ValueError):
        discard_entry(entry)
        return None
    if stored.mass_order is not None:
        library._mass_order, library._mass_sorted = stored.mass_order, stored.mass_sorted
        library._formula_index = stored.formula_index
    return library


# ----------------------------------------------------------------------------------------------------------
# MassSpecGym-style candidate sets
# ----------------------------------------------------------------------------------------------------------

def load_candidate_sets(path: str | os.PathLike) -> dict[str, list[tuple[str, str]]]:
    """Read a candidate-set JSON: ``{query_inchikey14: [[inchikey14, smiles], ...]}``.

    Returns the same mapping with ``(inchikey14, smiles)`` tuples, order kept (in the shared files the true
    structure comes first: shuffle or ignore order when ranking). Raises ``InputError`` when the file is not
    of this form.
    """
    path = Path(path)
    _check_file(path)
    try:
        opener = gzip.open if is_gzip(path) else open
        with opener(path, "rt", encoding="utf-8-sig") as handle:  # -sig: a byte-order mark is not JSON
            data = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not a candidate-set JSON file ({type(exc).__name__})", path=path) from None
    return candidate_sets_from(data, path)


#: an InChIKey, or its first block alone (upper case once normalised); digits are let through for the
#: placeholder keys of generated decoys (``DECOY000000001``), which real keys never collide with
_INCHIKEY_LIKE = re.compile(r"[A-Z0-9]{14}(-[A-Z0-9]{10}-[A-Z0-9])?")


def _set_key(key: Any, path: str | os.PathLike, record: str | None = None) -> str:
    """A candidate-set key as the sets are looked up: the upper-case first block (14 characters) of an InChIKey
    or of its first block, in any case; anything else is refused (naming the file and the key)."""
    text = key.strip().upper() if isinstance(key, str) else ""
    if not _INCHIKEY_LIKE.fullmatch(text):
        raise InputError(f"key {str(key)[:60]!r} is not an InChIKey or its first block (14 characters)", path=path,
                         record=record)
    return text[:14]


def candidate_sets_from(data: Any, path: str | os.PathLike = "candidates") -> dict[str, list[tuple[str, str]]]:
    """The candidate sets of a parsed JSON value (or a dict built in Python), checked: what
    :func:`load_candidate_sets` returns; ``path`` names the source in errors.

    Keys (of the sets and of their candidates) are normalised to the upper-case first InChIKey block, as
    queries look them up: a file keyed by full InChIKeys, or in lower case, would otherwise match no query (or
    hold no query's truth). A key that is not InChIKey-like is refused. A set whose true structure (the entry
    under the set's own key) has a SMILES that gives another key is counted and warned about once: ranking
    reads the SMILES, while the hit is decided by the key."""
    if not isinstance(data, dict):
        raise InputError("not a candidate-set JSON file (expected an object keyed by InChIKey first block)",
                         path=path)
    out: dict[str, list[tuple[str, str]]] = {}
    for query, entries in data.items():
        if not isinstance(entries, list):
            raise InputError("expected a list of [inchikey14, smiles] pairs", path=path, record=query)
        key = _set_key(query, path)
        pairs = out.setdefault(key, [])  # a full key and its first block are one set
        for entry in entries:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and all(isinstance(v, str) for v in entry)):
                raise InputError(f"bad candidate entry {str(entry)[:60]!r} (expected [inchikey14, smiles])",
                                 path=path, record=query)
            pairs.append((_set_key(entry[0], path, record=query), entry[1]))
    _warn_wrong_truths(out, path)
    return out


def _warn_wrong_truths(sets: dict[str, list[tuple[str, str]]], path: str | os.PathLike) -> None:
    """One warning counting the sets whose truth entry's SMILES does not give the set's key (RDKit's InChIKey of
    the first truth entry; one parse per set; an unparsable truth is counted, not logged: RDKit's logging is off
    since molpredict.chem.molecules was imported)."""
    wrong: list[str] = []
    for key, entries in sets.items():
        smiles = next((s for k, s in entries if k == key), None)
        if smiles is None:
            continue
        try:
            found = Molecule.from_smiles(smiles).inchikey14
        except (InputError, ValueError, RuntimeError):
            found = None
        if found != key:
            wrong.append(key)
    if wrong:
        warnings.warn(f"{path}: {len(wrong)} of {len(sets)} candidate sets list their true structure with a SMILES "
                      f"that does not give its key (first: set {wrong[0]}); hits are decided by the key",
                      UserWarning, stacklevel=3)


def shares_one_formula(molecules: Iterable[Molecule]) -> bool:
    """Whether every structure of a candidate set has one molecular formula (a same-formula set, as a known
    FORMULA selects; a mass window usually holds several). Stops at the first differing formula; a structure
    RDKit cannot parse counts as a formula of its own."""
    first = None
    for molecule in molecules:
        try:
            formula = molecule.formula
        except (InputError, ValueError, RuntimeError):
            return False
        if first is None:
            first = formula
        elif formula != first:
            return False
    return True



def in_key_order(entries: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A candidate set's distinct ``(inchikey14, smiles)`` pairs in key order (InChIKey first block, then SMILES),
    whatever the file's order.

    The shared set files list the truth first, and a second pass keeps a set's top k with ties broken by position
    (:func:`molpredict.identification.fusion.top_k_flat`): in file order, a query whose scores all tie would
    always keep its truth. Every source of candidate sets for ranking takes them in this order.
    """
    return sorted({(str(k), str(s)) for k, s in entries})

def candidate_set_molecules(entries: Sequence[tuple[str, str]], source: str | None = None) -> list[Molecule]:
    """Cheap ``Molecule`` records for one candidate set's ``(inchikey14, smiles)`` pairs (``inchikey14`` set,
    everything else computed on demand)."""
    return [Molecule(smiles, inchikey14=key, source=source) for key, smiles in entries]


def standardized(library: CandidateLibrary, n_jobs: int = 1, progress: bool = False
                 ) -> tuple[CandidateLibrary, int]:
    """The library with each structure replaced by its parent (:func:`parent_smiles`) and its InChIKey, formula
    and mass recomputed, and how many rows changed (what ``candidates build --standardize`` writes). A row whose
    parent RDKit cannot compute or describe is kept as it is."""
    smiles = library.smiles
    parents = parents_many(list(smiles), n_jobs=n_jobs, progress=progress)
    changed = [i for i, (old, new) in enumerate(zip(smiles, parents)) if new is not None and new != old]
    described = describe_many([parents[i] for i in changed], n_jobs=n_jobs, progress=progress, desc="parents")
    columns = {c: np.array(library.column(c), dtype=object) for c in ("smiles", "inchikey", "formula")}
    mass = np.array(library.monoisotopic_mass, dtype=np.float64)
    n_changed = 0
    for i, result in zip(changed, described):
        if result is None:  # a parent InChI cannot describe: the row stays as read
            continue
        (columns["smiles"][i], columns["inchikey"][i], columns["formula"][i], mass[i]) = result
        n_changed += 1
    rest = {c: library.column(c) for c in library.columns if c not in ("smiles", "inchikey", "inchikey14", "formula",
                                                                       "monoisotopic_mass")}
    return CandidateLibrary({**columns, "monoisotopic_mass": mass, **rest}, path=library.path,
                            report=library.report), n_changed


def dedupe(library: CandidateLibrary, report: LoadReport | None = None) -> CandidateLibrary:
    """The first row of each (InChIKey, source) pair, order kept (the number dropped is added to
    ``report.n_duplicates``).

    A structure listed under two sources keeps a row under each: ``identify --source`` selects rows by their
    label, so keeping only the first would lose the structure for the other source's queries. Ranking without a
    source filter takes one row per structure (the first). A row without a source is a pair of its own."""
    columns = {"key": library.table.column("inchikey"), "row": pa.array(np.arange(len(library)))}
    if library.has_column("source"):
        columns["source"] = library.table.column("source")
    table = pa.table(columns)
    first = table.group_by([c for c in ("key", "source") if c in columns], use_threads=False) \
        .aggregate([("row", "min")]).column("row_min")
    first = np.sort(first.to_numpy(zero_copy_only=False))
    if report is not None:
        report.n_duplicates += len(library) - len(first)
    if len(first) == len(library):
        return library
    return library.subset(first)


def source_counts(library: CandidateLibrary) -> Counter:
    """How many rows each source has (empty when the library has no source column)."""
    if not library.has_column("source"):
        return Counter()
    return Counter({str(c["values"]): int(c["counts"])
                    for c in pc.value_counts(library.table.column("source")).to_pylist()})
