"""The on-disk cache of candidate coordinates: one memory-mapped float64 matrix per model output side.

A model scores a candidate by ``predict_coordinates(x) . candidate_coordinates(c)``; the candidate side depends
only on the fitted output side (``Model.coordinates_key()``), so each molecule is featurised once per model and
kept here, keyed by its InChIKey (or SMILES when it has none).

Layout of ``<root>/<coordinates key>/``
---------------------------------------
``meta.json``
    key, dimension d, dtype (float64), layout version.
``data.f64``
    append-only raw float64 rows of length d (row r = bytes [r d 8, (r + 1) d 8)).
``index/seg-<seq>.json``
    one file per appended block: ``{"seq", "start", "keys"}``, the molecule keys of rows start..start+len-1.
``index/all-<seq>.json``
    a consolidation of every segment up to ``seq`` (written when segments pile up; segments it covers are
    then deleted).
``lock``
    an advisory ``flock`` serialising writers; readers take no lock.

Crash safety: a block is appended to ``data.f64`` and fsync'ed *before* its segment file is written (to a temp
name, fsync'ed, then renamed into place, which is atomic). Rows beyond the last committed segment are garbage
from an interrupted write and are truncated by the next writer. So an interrupt loses at most the block being
written, never a finished one.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .errors import ModelFileError

__all__ = ["CoordinatesCache", "molecule_key", "default_cache_root", "cached_candidate_coordinates"]

LAYOUT_VERSION = 1
_SEG_RE = re.compile(r"^seg-(\d+)\.json$")
_ALL_RE = re.compile(r"^all-(\d+)\.json$")
#: consolidate the index once this many segment files exist
CONSOLIDATE_AFTER = 64


def default_cache_root() -> Path:
    """``$MOLPREDICT_HOME/coordinates`` (or the user cache directory's ``coordinates``)."""
    from .modelfile import home_dir
    return home_dir() / "coordinates"


def molecule_key(molecule: Any) -> str:
    """The cache key of a molecule: its full InChIKey when known, else ``smiles:<SMILES>``.

    A ``Molecule`` built without an InChIKey (e.g. from a candidate set that lists only the first block) is
    keyed by its SMILES rather than paying for an InChI computation per candidate.
    """
    if hasattr(molecule, "_inchikey"):
        inchikey = molecule._inchikey  # known without computing (Molecule computes it lazily)
    else:
        inchikey = getattr(molecule, "inchikey", None)
    if inchikey:
        return str(inchikey)
    smiles = getattr(molecule, "smiles", None)
    if smiles:
        return "smiles:" + str(smiles)
    raise ValueError(f"molecule {molecule!r} has neither an InChIKey nor a SMILES: cannot be cached")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CoordinatesCache:
    """Cached candidate coordinates of one model (one ``coordinates_key``).

    Parameters
    ----------
    root : str or Path
        The cache root (default :func:`default_cache_root`); this model's files go to ``root / key``.
    key : str
        ``model.coordinates_key()``.

    Attributes
    ----------
    directory : Path
    dim : int or None
        Coordinate dimension d (None until the first block is written).
    """

    def __init__(self, root: str | os.PathLike | None, key: str) -> None:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"invalid coordinates key {key!r}")
        self.root = Path(root) if root is not None else default_cache_root()
        self.key = key
        self.directory = self.root / key
        self.dim: int | None = None
        self._keys: list[str] = []
        self._rows: dict[str, int] = {}
        self._seq = 0          # highest segment seq read
        self._mmap: np.ndarray | None = None
        self._read_meta()
        self.refresh()

    # -- reading ---------------------------------------------------------------------------------------
    def _read_meta(self) -> None:
        meta_path = self.directory / "meta.json"
        if not meta_path.is_file():
            return
        try:
            meta = json.loads(meta_path.read_text())
            self.dim = int(meta["dim"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelFileError(f"{meta_path}: corrupted coordinates cache metadata ({exc}); delete "
                                 f"{self.directory} to rebuild it") from None

    def refresh(self) -> None:
        """Re-read the index (rows other processes committed since)."""
        index_dir = self.directory / "index"
        if not index_dir.is_dir():
            return
        for _attempt in range(5):
            try:
                keys, seq = self._read_index(index_dir)
                break
            except FileNotFoundError:
                continue  # a writer consolidated while we listed: read again
        else:
            keys, seq = self._read_index(index_dir)
        if seq == self._seq and len(keys) == len(self._keys):
            return
        self._keys = keys
        self._rows = {k: i for i, k in enumerate(keys)}
        self._seq = seq
        self._mmap = None

    @staticmethod
    def _read_index(index_dir: Path) -> tuple[list[str], int]:
        names = os.listdir(index_dir)
        alls = sorted((int(m.group(1)), n) for n in names if (m := _ALL_RE.match(n)))
        segs = sorted((int(m.group(1)), n) for n in names if (m := _SEG_RE.match(n)))
        keys: list[str] = []
        seq = 0
        if alls:
            seq, name = alls[-1]
            with open(index_dir / name, encoding="utf-8") as handle:
                keys = list(json.load(handle)["keys"])
        for s, name in segs:
            if s <= seq:
                continue
            with open(index_dir / name, encoding="utf-8") as handle:
                seg = json.load(handle)
            if int(seg["start"]) != len(keys):
                break  # a gap means a lost segment: everything after it is unusable
            keys.extend(seg["keys"])
            seq = s
        return keys, seq

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._rows

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        """Row of each key, -1 where absent; ndarray of shape (len(keys),), int64."""
        get = self._rows.get
        return np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=len(keys))

    def _matrix(self) -> np.ndarray:
        n = len(self._keys)
        if n == 0 or self.dim is None:
            return np.empty((0, self.dim or 0))
        if self._mmap is None or self._mmap.shape[0] != n:
            self._mmap = np.memmap(self.directory / "data.f64", dtype=np.float64, mode="r",
                                   shape=(n, self.dim))
        return self._mmap

    def read(self, rows: np.ndarray) -> np.ndarray:
        """Coordinates of committed rows, ndarray of shape (len(rows), d), float64 (a copy)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self._keys)):
            raise IndexError("row not in the coordinates cache")
        return np.array(self._matrix()[rows], dtype=np.float64)

    # -- writing ---------------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "lock", "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def append(self, keys: Sequence[str], coordinates: np.ndarray) -> int:
        """Commit a block of coordinates (keys already present are skipped); returns the rows added.

        Parameters
        ----------
        keys : sequence of str, length n
        coordinates : ndarray of shape (n, d)
        """
        coords = np.ascontiguousarray(coordinates, dtype=np.float64)
        if coords.ndim != 2 or coords.shape[0] != len(keys):
            raise ValueError(f"coordinates must have shape ({len(keys)}, d), got {coords.shape}")
        with self._locked():
            self.refresh()
            if self.dim is None:
                self.dim = int(coords.shape[1])
                self._write_atomic(self.directory / "meta.json", {"key": self.key, "dim": self.dim,
                                                                   "dtype": "float64",
                                                                   "layout_version": LAYOUT_VERSION})
            elif coords.shape[1] != self.dim:
                raise ValueError(f"coordinates cache {self.directory}: dimension {coords.shape[1]} != {self.dim}")
            fresh: dict[str, int] = {}
            for i, k in enumerate(keys):
                if k not in self._rows and k not in fresh:
                    fresh[k] = i
            if not fresh:
                return 0
            block = coords[list(fresh.values())]
            start = len(self._keys)
            data_path = self.directory / "data.f64"
            with open(data_path, "ab") as _:
                pass
            with open(data_path, "r+b") as handle:
                # Rows past the committed end are from an interrupted write: overwrite them.
                handle.truncate(start * self.dim * 8)
                handle.seek(start * self.dim * 8)
                handle.write(block.tobytes())
                handle.flush()
                os.fsync(handle.fileno())
            index_dir = self.directory / "index"
            index_dir.mkdir(exist_ok=True)
            seq = self._seq + 1
            self._write_atomic(index_dir / f"seg-{seq:012d}.json",
                               {"seq": seq, "start": start, "keys": list(fresh)})
            self._keys.extend(fresh)
            for offset, k in enumerate(fresh):
                self._rows[k] = start + offset
            self._seq = seq
            self._mmap = None
            self._maybe_consolidate(index_dir)
            return len(fresh)

    @staticmethod
    def _write_atomic(path: Path, obj: Any) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def _maybe_consolidate(self, index_dir: Path) -> None:
        names = os.listdir(index_dir)
        segs = [n for n in names if _SEG_RE.match(n)]
        if len(segs) < CONSOLIDATE_AFTER:
            return
        self._write_atomic(index_dir / f"all-{self._seq:012d}.json", {"seq": self._seq, "keys": self._keys})
        for name in os.listdir(index_dir):
            seg, whole = _SEG_RE.match(name), _ALL_RE.match(name)
            if (seg and int(seg.group(1)) <= self._seq) or (whole and int(whole.group(1)) < self._seq):
                try:
                    os.remove(index_dir / name)
                except FileNotFoundError:
                    pass

    # -- the main entry point --------------------------------------------------------------------------
    def get(self, molecules: Sequence[Any], compute: Callable[[list[Any]], np.ndarray],
            keys: Sequence[str] | None = None, block_size: int = 2048,
            progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Coordinates of ``molecules``, computing (in blocks) and committing only those not yet cached.

        Parameters
        ----------
        molecules : sequence, length n
            ``Molecule`` records.
        compute : callable
            ``compute(list_of_molecules) -> ndarray (len, d)``, normally ``model.candidate_coordinates``.
        keys : sequence of str, optional
            Cache keys (default :func:`molecule_key` of each molecule).
        block_size : int
            Molecules per computed and committed block.
        progress : callable, optional
            Called with the number of molecules computed after each block.

        Returns
        -------
        ndarray of shape (n, d), float64
        """
        if keys is None:
            keys = [molecule_key(m) for m in molecules]
        self.ensure(molecules, compute, keys=keys, block_size=block_size, progress=progress)
        rows = self.rows(keys)
        if (rows < 0).any():
            raise RuntimeError("coordinates cache: a computed block was not committed")
        if len(keys) == 0:
            return np.empty((0, self.dim or 0))
        return self.read(rows)

    def ensure(self, molecules: Sequence[Any], compute: Callable[[list[Any]], np.ndarray],
               keys: Sequence[str] | None = None, block_size: int = 2048,
               progress: Callable[[int], None] | None = None) -> int:
        """Compute and commit the coordinates of the molecules not cached yet; returns how many were computed."""
        if keys is None:
            keys = [molecule_key(m) for m in molecules]
        self.refresh()
        missing: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in self._rows and k not in missing:
                missing[k] = i
        todo = list(missing.items())
        for start in range(0, len(todo), block_size):
            chunk = todo[start:start + block_size]
            coords = np.asarray(compute([molecules[i] for _, i in chunk]), dtype=np.float64)
            self.append([k for k, _ in chunk], coords)
            if progress is not None:
                progress(len(chunk))
        return len(todo)


def cached_candidate_coordinates(model: Any, molecules: Sequence[Any], root: str | os.PathLike | None = None,
                                 cache: CoordinatesCache | None = None, keys: Sequence[str] | None = None
                                 ) -> np.ndarray:
    """``model.candidate_coordinates(molecules)`` through the on-disk cache (shape (n, d)).

    ``root=False``-like use (no caching) is :meth:`Model.candidate_coordinates` itself.
    """
    if cache is None:
        cache = CoordinatesCache(root, model.coordinates_key())
    return cache.get(molecules, model.candidate_coordinates, keys=keys)
