"""The candidate-coordinates store: compact, chunked (Zarr v3) coordinates of candidate structures per model output
side, keyed by molecule, safe for concurrent writers on a shared filesystem or object storage.

A model scores a candidate by ``predict_coordinates(x) . candidate_coordinates(c)``; the candidate side depends
only on the fitted output side (``Model.coordinates_key()``) and the structure, so each structure is featurised
once per model and kept here, keyed by the SMILES that was featurised (``smiles:<SMILES>``, :func:`smiles_keys`).

Not by InChIKey: a library's InChIKey column is declared, not derived from its SMILES, and a store keyed by it
gave every later run (any library, same model) the coordinates of whichever row was featurised first under that
key: one row declaring diazepam's key for thiram's SMILES moved diazepam from rank 1 to 15 in every run after,
and a zwitterion and its neutral form (one InChIKey, two fingerprints) shared one entry. The SMILES is what
featurisation reads, so a row's score depends on its own structure only. Stores of that first keying live under
the bare coordinates key and are never opened (:func:`store_key`; delete them to reclaim the space).

Layout of ``<root>/<store key>/`` (``root``: a directory or an fsspec URL, e.g. ``s3://bucket/coords``; the store key
is :func:`store_key`, ``<coordinates key>.k2``)
------------------------------------------------------------------------------------------------------------
``store.json``
    ``{"layout_version": 2, "key", "dim", "encoding"}``.
``segments/<name>/codes``, ``segments/<name>/scale``
    one Zarr array pair per committed block, written by one writer under a name no other writer uses (time,
    process, random), so concurrent writers (Dask workers on several machines) never share a file. ``codes``
    is one shard file of (rows, d) values with zstd-compressed, CRC32C-checksummed inner chunks of 128 rows
    (a read touches only the inner chunks it needs); ``scale`` holds the per-row scale of ``int8`` codes.
``commits/<name>.json``
    ``{"keys": [...]}``: the commit record of a segment, written after its arrays (atomically on a local disk;
    an object store's put is atomic). A segment without its index file is an interrupted write and is ignored.

Encodings: ``int8`` (default; per-row scale ``max|x| / 127``, so d + 4 bytes per structure: 2,004 bytes at
m_y = 2000 against 16,000 for float64; ranking accuracy is measured in ``benchmarks/scale.py``), ``float16``,
``float32`` or ``float64`` (exact). An existing store keeps the encoding it was created with.

Damage: a corrupted chunk fails its checksum and a missing chunk file reads as the fill value (-128 for int8,
NaN otherwise, values the encoder never writes); either way :meth:`CoordinatesCache.read` drops the segment
(its index file and arrays) and raises :class:`CorruptedSegment`; :meth:`CoordinatesCache.coordinates` then
recomputes the molecules it held. Caches of the old memory-mapped layout (``meta.json``, ``data.f64``, ``index/``) are
migrated into the new layout on first open and their files removed; they are never read as the new layout.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from molpredict.errors import InputError, ModelFileError
from molpredict.atomic import fsync_directory

__all__ = ["CoordinatesCache", "CorruptedSegment", "molecule_key", "smiles_keys", "store_key", "KEYING",
           "default_cache_root", "local_directory", "cached_candidate_coordinates", "ENCODINGS", "encode", "decode"]

LAYOUT_VERSION = 2
#: How a store keys its structures, the suffix of its directory name (:func:`store_key`): ``k2``, by the featurised
#: SMILES. A new keying gets a new directory, so entries stored under an old key are never read as the new ones.
KEYING = "k2"
ENCODINGS = ("int8", "float16", "float32", "float64")
DEFAULT_ENCODING = "int8"


def _memory_budget(default_mb: float = 512.0) -> int:
    try:
        mb = float(os.environ.get("MOLPREDICT_STORE_MEMORY_MB", default_mb))
    except ValueError:
        mb = default_mb  # a mistyped setting must not stop identification: the default budget applies
    return int(max(mb, 0.0) * 2**20)


#: bytes of whole segments' codes one open store keeps in memory (MOLPREDICT_STORE_MEMORY_MB, default 512)
MEMORY_BUDGET_BYTES = _memory_budget()
#: rows per checksummed inner chunk of a segment (a read decodes only the inner chunks it touches)
INNER_ROWS = 128


def local_directory(root: str | os.PathLike | None) -> Path | None:
    """The local directory a cache root names (None: :func:`default_cache_root`; a ``file://`` URL is local), or
    None when it is a remote fsspec URL (``s3://...``)."""
    url = str(default_cache_root() if root is None else root)
    if "://" in url and not url.startswith("file://"):
        return None
    return Path(url[len("file://"):] if url.startswith("file://") else url)


def default_cache_root() -> Path:
    """``$MOLPREDICT_HOME/coordinates`` (or the user cache directory's ``coordinates``)."""
    from molpredict.modelfile import home_dir
    return home_dir() / "coordinates"


def store_key(model: Any) -> str:
    """The store name of a model's candidate coordinates: ``<model.coordinates_key()>.<KEYING>``."""
    return f"{model.coordinates_key()}.{KEYING}"


def smiles_keys(smiles: Any) -> np.ndarray:
    """Cache keys ``smiles:<SMILES>`` of an array of SMILES (object array of str, same shape): one vectorised
    concatenation, no Python loop per candidate (identification keys every block's candidates)."""
    return np.add("smiles:", np.asarray(smiles, dtype=object))


def molecule_key(molecule: Any) -> str:
    """The cache key of a molecule: ``smiles:<SMILES>``, the structure featurisation reads.

    Never its InChIKey, declared or computed: a declared key may be wrong, and forms sharing an InChIKey (a
    zwitterion and its neutral form) have different coordinates. Nothing is computed (no InChI, no parsing).
    """
    smiles = getattr(molecule, "smiles", None)
    if smiles:
        return "smiles:" + str(smiles)
    raise ValueError(f"molecule {molecule!r} has no SMILES: cannot be cached")


def encode(coordinates: np.ndarray, encoding: str) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, scale)`` of coordinates (n, d): int8 codes in [-127, 127] with a float32 per-row scale
    ``max|x| / 127``, or the values cast to a float type with scale 1."""
    x = np.asarray(coordinates, dtype=np.float64)
    if encoding == "int8":
        peak = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(len(x))
        scale = (peak / 127.0).astype(np.float32)
        safe = np.where(scale > 0, scale, 1.0).astype(np.float64)
        codes = np.clip(np.rint(x / safe[:, None]), -127, 127).astype(np.int8)
        return codes, scale
    return x.astype(encoding), np.ones(len(x), dtype=np.float32)


def decode(codes: np.ndarray, scale: np.ndarray, dtype: Any = np.float64, out: np.ndarray | None = None
           ) -> np.ndarray:
    """Coordinates (n, d) in ``dtype`` (float64 by default) from :func:`encode`'s output, written into ``out``
    (shape (n, d), ``dtype``) when given.

    One pass: the codes are cast inside the product (no float copy of them first); the values are those of
    ``codes.astype(dtype) * scale.astype(dtype)[:, None]``."""
    return np.multiply(codes, np.asarray(scale).astype(dtype)[:, None], out=out, dtype=dtype)


class CorruptedSegment(Exception):
    """A stored segment failed its checksum or lost a chunk; it has been dropped (recompute its molecules)."""


class CoordinatesCache:
    """Stored candidate coordinates of one model (one ``coordinates_key``).

    Parameters
    ----------
    root : str or Path or None
        The store root, a directory or an fsspec URL (default :func:`default_cache_root`); this model's
        store is ``root / key``.
    key : str
        :func:`store_key` of the model (``model.coordinates_key()`` with the keying suffix).
    encoding : {"int8", "float16", "float32", "float64"}, optional
        For a new store (default ``int8``); an existing store keeps its own.

    Attributes
    ----------
    directory : Path or str
    dim : int or None
        Coordinate dimension d (None until the first block is written).
    encoding : str
    """

    def __init__(self, root: str | os.PathLike | None, key: str, encoding: str | None = None) -> None:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"invalid coordinates key {key!r}")
        if encoding is not None and encoding not in ENCODINGS:
            raise ValueError(f"unknown coordinates encoding {encoding!r} (expected one of {', '.join(ENCODINGS)})")
        root = default_cache_root() if root is None else root
        self.root = root
        self.key = key
        local = local_directory(root)
        url = str(root).rstrip("/") + "/" + key
        if local is None:
            import fsspec
            try:
                self._fs, self._path = fsspec.core.url_to_fs(url)
            except ImportError as exc:  # fsspec names the package, e.g. "Install s3fs to access S3"
                raise InputError(f"the coordinates store {root} needs a file system package: {exc}") from None
            except ValueError as exc:  # "Protocol not known: foo"
                raise InputError(f"the coordinates store {root}: {exc}") from None
        elif local.exists() and not local.is_dir():
            raise InputError(f"the coordinates store {root} is a file, not a folder")
        else:  # a local directory: plain file operations (fsspec's import alone is 0.1 s of a short run)
            self._fs, self._path = _LocalFiles(), str(local / key)
        self._local = "file" in (self._fs.protocol if isinstance(self._fs.protocol, tuple) else (self._fs.protocol,))
        self.directory: Path | str = Path(self._path) if self._local else url
        self.dim: int | None = None
        self.encoding = encoding or DEFAULT_ENCODING
        self._store: Any = None
        self._segments: list[str] = []          # segment names in discovery order
        self._seen: set[str] = set()
        self._keys: list[str] = []
        self._rows: dict[str, int] = {}
        self._row_segment: list[int] = []       # per row: index into _segments
        self._row_local: list[int] = []         # per row: row inside its segment
        self._row_arrays: tuple[np.ndarray, np.ndarray] | None = None  # the two lists above as arrays
        self._arrays: dict[str, tuple[Any, np.ndarray]] = {}  # open (codes array, scale) per segment
        # whole segments' codes read once and kept (least recently used first out, within a byte budget): a warm
        # identification reads the same segments block after block, and zarr's per-read chunk decoding and
        # checksums dominated it (14 of 20 s for test_pos x formula256)
        self._loaded: OrderedDict[str, np.ndarray] = OrderedDict()
        self._loaded_bytes = 0
        self._read_meta()
        if self._local:
            self._migrate_layout_1()
        self.refresh()

    # -- paths -----------------------------------------------------------------------------------------
    def _join(self, *parts: str) -> str:
        return "/".join([self._path.rstrip("/"), *parts])

    def _zarr_store(self) -> Any:
        if self._store is None:
            import zarr.storage
            if self._local:
                self._store = zarr.storage.LocalStore(self._path)
            else:
                self._store = zarr.storage.FsspecStore.from_url(str(self.directory))
        return self._store

    def _put_json(self, path: str, obj: Any) -> None:
        data = json.dumps(obj).encode()
        if self._local:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
            fsync_directory(target.parent)
        else:
            self._fs.pipe_file(path, data)

    # -- reading ---------------------------------------------------------------------------------------
    def _read_meta(self) -> None:
        path = self._join("store.json")
        if not self._fs.exists(path):
            return
        try:
            meta = json.loads(self._fs.cat_file(path))
            self.dim = int(meta["dim"])
            self.encoding = str(meta["encoding"])
            if int(meta["layout_version"]) != LAYOUT_VERSION or self.encoding not in ENCODINGS:
                raise ValueError(f"layout {meta['layout_version']}, encoding {self.encoding}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelFileError(f"{path}: unusable coordinates store metadata ({exc}); delete "
                                 f"{self.directory} to rebuild it") from None

    def refresh(self) -> None:
        """Read the commit records written since (by this or other processes)."""
        index_dir = self._join("commits")
        try:
            names = self._fs.ls(index_dir, detail=False)
        except FileNotFoundError:
            return
        fresh = sorted(n.rsplit("/", 1)[-1][:-5] for n in names if n.endswith(".json")
                       and not n.rsplit("/", 1)[-1].startswith("."))
        for name in fresh:
            if name in self._seen:
                continue
            try:
                record = json.loads(self._fs.cat_file(self._join("commits", name + ".json")))
                keys = list(record["keys"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # torn or vanished commit record: the segment does not count
            self._seen.add(name)
            if self.dim is None:
                self._read_meta()
            seg = len(self._segments)
            self._segments.append(name)
            self._row_arrays = None
            if self._rows.keys().isdisjoint(keys) and len(set(keys)) == len(keys):
                # the usual case, in bulk: every key new (a per-key loop was most of opening a warm store)
                start = len(self._keys)
                self._rows.update(zip(keys, range(start, start + len(keys))))
                self._keys.extend(keys)
                self._row_segment.extend([seg] * len(keys))
                self._row_local.extend(range(len(keys)))
                continue
            for local, k in enumerate(keys):
                if k not in self._rows:
                    self._rows[k] = len(self._keys)
                    self._keys.append(k)
                    self._row_segment.append(seg)
                    self._row_local.append(local)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._rows

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        """Row of each key, -1 where absent; ndarray of shape (len(keys),), int64."""
        get = self._rows.get
        return np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=len(keys))

    def _open_segment(self, name: str) -> tuple[Any, np.ndarray]:
        if name not in self._arrays and self._local:
            try:
                codes = _ShardedArray(Path(self._path) / "segments" / name / "codes")
                self._arrays[name] = (codes, _ShardedArray(Path(self._path) / "segments" / name / "scale")[:])
            except _OtherLayout:
                pass  # written some other way: zarr reads it
        if name not in self._arrays:
            import zarr
            store = self._zarr_store()
            codes = zarr.open_array(store=store, path=f"segments/{name}/codes", mode="r")
            scale = np.asarray(zarr.open_array(store=store, path=f"segments/{name}/scale", mode="r")[:])
            self._arrays[name] = (codes, scale)
        return self._arrays[name]

    def _segment_codes(self, name: str, codes_array: Any) -> np.ndarray | None:
        """A segment's whole codes array from memory (read and kept within :data:`MEMORY_BUDGET_BYTES`), or None
        when the segment alone is over the budget (then rows are read from the store)."""
        hit = self._loaded.get(name)
        if hit is not None:
            self._loaded.move_to_end(name)
            return hit
        nbytes = int(np.prod(codes_array.shape)) * codes_array.dtype.itemsize
        if nbytes > MEMORY_BUDGET_BYTES:
            return None
        codes = np.asarray(codes_array[:])
        self._loaded[name] = codes
        self._loaded_bytes += nbytes
        while self._loaded_bytes > MEMORY_BUDGET_BYTES and len(self._loaded) > 1:
            _, dropped = self._loaded.popitem(last=False)
            self._loaded_bytes -= dropped.nbytes
        return codes

    def read(self, rows: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
        """Coordinates of committed rows, ndarray of shape (len(rows), d), in ``dtype`` (float64 by default;
        float32 for scoring, :data:`~molpredict.identification.scoring.SCORING_DTYPE`).

        Raises
        ------
        CorruptedSegment
            A segment holding some of the rows is damaged; it has been dropped (its keys are now absent).
        """
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self._keys)):
            raise IndexError("row not in the coordinates cache")
        out = np.empty((len(rows), self.dim or 0), dtype=dtype)
        if not rows.size:
            return out
        if self._row_arrays is None or len(self._row_arrays[0]) != len(self._keys):
            self._row_arrays = (np.asarray(self._row_segment, dtype=np.int64),
                                np.asarray(self._row_local, dtype=np.int64))
        segment = self._row_arrays[0][rows]
        local = self._row_arrays[1][rows]
        # The codes of every segment are gathered into one array in the order of ``rows`` (1 byte a value for int8)
        # and decoded once into ``out``: decoding segment by segment, then scattering the floats, moved the block's
        # coordinates through memory four times.
        codes_in_order: np.ndarray | None = None
        scale_in_order = np.empty(len(rows), dtype=np.float32)
        for seg in np.unique(segment):
            at = np.flatnonzero(segment == seg)
            name = self._segments[int(seg)]
            try:
                codes_array, scale = self._open_segment(name)
                whole = self._segment_codes(name, codes_array)
                if whole is not None:
                    wanted = local[at]
                    codes = whole[wanted]
                else:  # rows read from the store: an orthogonal selection takes sorted unique indices
                    wanted, inverse = np.unique(local[at], return_inverse=True)
                    codes = np.asarray(codes_array.get_orthogonal_selection((wanted, slice(None))))[inverse]
                    wanted = wanted[inverse]
                # a lost int8 chunk reads as -128, below every code: the minimum finds it without a mask's pass
                bad = bool(codes.size and codes.min() == -128) if codes.dtype == np.int8 else np.isnan(codes).any()
                bad = bad or not np.isfinite(scale[wanted]).all()
            except (ValueError, OSError, KeyError, RuntimeError, IndexError):
                # IndexError: the segment holds fewer rows than its commit record lists (zarr's bounds check)
                bad = True
            if bad:
                self._drop(int(seg))
                raise CorruptedSegment(f"{self.directory}: segment {name} is damaged; dropped")
            if codes_in_order is None:
                codes_in_order = np.empty((len(rows), codes.shape[1]), dtype=codes.dtype)
            elif codes.dtype != codes_in_order.dtype:  # segments stored with other encodings: widen
                codes_in_order = codes_in_order.astype(np.result_type(codes_in_order.dtype, codes.dtype))
            codes_in_order[at] = codes
            scale_in_order[at] = scale[wanted]
        assert codes_in_order is not None
        return decode(codes_in_order, scale_in_order, dtype, out=out)

    def _drop(self, seg: int) -> None:
        """Forget a damaged segment here and in the store (its molecules will be recomputed)."""
        name = self._segments[seg]
        for path in (self._join("commits", name + ".json"), self._join("segments", name)):
            try:
                self._fs.rm(path, recursive=True)
            except (FileNotFoundError, OSError):
                pass
        self._arrays.pop(name, None)
        dropped = self._loaded.pop(name, None)
        if dropped is not None:
            self._loaded_bytes -= dropped.nbytes
        keep = [i for i, s in enumerate(self._row_segment) if s != seg]
        self._keys = [self._keys[i] for i in keep]
        self._row_segment = [self._row_segment[i] for i in keep]
        self._row_local = [self._row_local[i] for i in keep]
        self._rows = {k: i for i, k in enumerate(self._keys)}
        self._row_arrays = None

    # -- writing ---------------------------------------------------------------------------------------
    def append(self, keys: Sequence[str], coordinates: np.ndarray) -> int:
        """Commit a block of coordinates as one new segment (keys already present are skipped); returns the
        rows added.

        Parameters
        ----------
        keys : sequence of str, length n
        coordinates : ndarray of shape (n, d)
        """
        coords = np.asarray(coordinates, dtype=np.float64)
        if coords.ndim != 2 or coords.shape[0] != len(keys):
            raise ValueError(f"coordinates must have shape ({len(keys)}, d), got {coords.shape}")
        self.refresh()
        if self.dim is None:
            self.dim = int(coords.shape[1])
            self._put_json(self._join("store.json"), {"layout_version": LAYOUT_VERSION, "key": self.key,
                                                      "dim": self.dim, "encoding": self.encoding})
            self._read_meta()  # a concurrent creator may have won: use what the store says
        if coords.shape[1] != self.dim:
            raise ValueError(f"coordinates cache {self.directory}: dimension {coords.shape[1]} != {self.dim}")
        fresh: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in self._rows and k not in fresh:
                fresh[k] = i
        if not fresh:
            return 0
        block = coords[list(fresh.values())]
        name = f"{time.time_ns():016x}-{os.getpid():x}-{uuid.uuid4().hex[:8]}"
        self._write_segment(name, block)
        self._put_json(self._join("commits", name + ".json"), {"keys": list(fresh)})
        self.refresh()
        return len(fresh)

    def _write_segment(self, name: str, block: np.ndarray) -> None:
        import zarr
        from zarr.codecs import Crc32cCodec, ZstdCodec

        codes, scale = encode(block, self.encoding)
        n, d = codes.shape
        inner = min(INNER_ROWS, n)
        store = self._zarr_store()
        fill = -128 if self.encoding == "int8" else float("nan")
        array = zarr.create_array(store=store, name=f"segments/{name}/codes", shape=(n, d), dtype=codes.dtype,
                                  chunks=(inner, d), shards=(-(-n // inner) * inner, d), fill_value=fill,
                                  compressors=[ZstdCodec(level=3), Crc32cCodec()], overwrite=True)
        array[:] = codes
        scales = zarr.create_array(store=store, name=f"segments/{name}/scale", shape=(n,), dtype="float32",
                                   chunks=(n,), fill_value=float("nan"), compressors=[Crc32cCodec()],
                                   overwrite=True)
        scales[:] = scale
        if self._local:
            for part in ("codes", "scale"):
                for dirpath, _, files in os.walk(Path(self._path) / "segments" / name / part):
                    for f in files:
                        with open(os.path.join(dirpath, f), "rb+") as handle:
                            os.fsync(handle.fileno())

    # -- the layout-1 cache (one memory-mapped float64 file) ---------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        Path(self._path).mkdir(parents=True, exist_ok=True)
        with open(Path(self._path) / "lock", "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _migrate_layout_1(self, block_size: int = 8192) -> None:
        """Move a layout-1 cache (``meta.json``, ``data.f64``, ``index/seg-*.json`` / ``all-*.json``) into this
        layout, then delete its files; done once, under the old writers' lock."""
        directory = Path(self._path)
        if not (directory / "data.f64").exists():
            return
        with self._locked():
            if not (directory / "data.f64").exists():
                return  # another process migrated it meanwhile
            try:
                meta = json.loads((directory / "meta.json").read_text())
                dim = int(meta["dim"])
                keys = _layout_1_keys(directory / "index")
            except (OSError, ValueError, KeyError, TypeError):
                keys, dim = [], 0  # unreadable: nothing to keep, the coordinates are recomputed
            if keys and dim:
                data = np.memmap(directory / "data.f64", dtype=np.float64, mode="r", shape=(len(keys), dim))
                self.refresh()
                for start in range(0, len(keys), block_size):
                    self.append(keys[start:start + block_size], np.asarray(data[start:start + block_size]))
                del data
            for name in ("data.f64", "meta.json"):
                try:
                    os.remove(directory / name)
                except FileNotFoundError:
                    pass
            for name in os.listdir(directory / "index") if (directory / "index").is_dir() else []:
                if name.startswith(("seg-", "all-")):
                    os.remove(directory / "index" / name)

    # -- the main entry points ---------------------------------------------------------------------------
    def coordinates(self, keys: Sequence[str], molecules: Callable[[np.ndarray], Sequence[Any]],
                    compute: Callable[[list[Any]], np.ndarray], block_size: int = 2048,
                    dtype: Any = np.float64, order: np.ndarray | None = None) -> np.ndarray:
        """Coordinates of ``keys``, computing (and committing) those not stored yet, and again those of a
        segment found damaged while reading.

        Parameters
        ----------
        keys : sequence of str, length n
        molecules : callable
            ``molecules(positions)`` -> the molecule records of ``keys[positions]`` (only called for missing ones).
        compute : callable
            ``compute(list_of_molecules) -> ndarray (len, d)``, normally ``model.candidate_coordinates``.
        dtype : numpy dtype, default float64
            Of the returned coordinates (as :meth:`read`).
        order : ndarray of int, shape (n_out,), optional
            Return the rows of ``keys[order]`` (repeats allowed), read from the store in that order (its codes are
            gathered, then decoded once: no float copy to reorder). Default: ``keys`` as given.

        Returns
        -------
        ndarray of shape (n, d) (or (n_out, d) with ``order``), ``dtype``
        """
        for attempt in range(3):
            rows = self.rows(keys)
            missing = np.flatnonzero(rows < 0)
            if missing.size:
                self.ensure(molecules(missing), compute, keys=[keys[i] for i in missing], block_size=block_size)
                rows = self.rows(keys)
                if (rows < 0).any():
                    raise RuntimeError("coordinates cache: a computed block was not committed")
            if len(keys) == 0:
                return np.empty((0, self.dim or 0), dtype=dtype)
            try:
                return self.read(rows if order is None else rows[order], dtype)
            except CorruptedSegment:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get(self, molecules: Sequence[Any], compute: Callable[[list[Any]], np.ndarray],
            keys: Sequence[str] | None = None, block_size: int = 2048,
            progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Coordinates of ``molecules``, computing (in blocks) and committing only those not yet stored.

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
        if progress is not None:
            self.ensure(molecules, compute, keys=keys, block_size=block_size, progress=progress)
        return self.coordinates(keys, lambda positions: [molecules[i] for i in positions], compute,
                                block_size=block_size)

    def ensure(self, molecules: Sequence[Any], compute: Callable[[list[Any]], np.ndarray],
               keys: Sequence[str] | None = None, block_size: int = 2048,
               progress: Callable[[int], None] | None = None) -> int:
        """Compute and commit the coordinates of the molecules not stored yet; returns how many were computed."""
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

    def stored_bytes(self) -> int:
        """Bytes the store takes (segments, commit records, metadata)."""
        total = 0
        for path in self._fs.find(self._path):
            total += int(self._fs.info(path).get("size") or 0)
        return total


class _LocalFiles:
    """The few fsspec file-system methods the store uses, on local paths (without importing fsspec)."""

    protocol = ("file", "local")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def cat_file(self, path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    def pipe_file(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)

    def ls(self, path: str, detail: bool = False) -> list[str]:
        return [os.path.join(path, name) for name in sorted(os.listdir(path))]

    def rm(self, path: str, recursive: bool = False) -> None:
        if os.path.isdir(path):
            if not recursive:
                raise IsADirectoryError(path)
            import shutil
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
        else:
            raise FileNotFoundError(path)

    def find(self, path: str) -> list[str]:
        return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]

    def info(self, path: str) -> dict[str, Any]:
        return {"name": path, "size": os.stat(path).st_size}


class _OtherLayout(Exception):
    """A segment array not in the one layout :class:`_ShardedArray` reads (zarr then reads it)."""


#: zarr v3 data types of the segment arrays -> numpy (little-endian)
_ZARR_DTYPES = {"int8": "i1", "float16": "<f2", "float32": "<f4", "float64": "<f8"}
#: an absent inner chunk's offset and length in a shard index
_ABSENT = 2**64 - 1


class _ShardedArray:
    """A segment array (``codes`` or ``scale``) as :meth:`CoordinatesCache._write_segment` writes it with zarr,
    read from its one file with numpy, zstd and CRC32C, without importing zarr (0.3 s of a short run).

    The layout (zarr v3): ``codes``, shape (n, d), one shard ``c/0/0`` of inner chunks of (rows, d): the chunks'
    bytes, zstd-compressed, each followed by its CRC32C, then the shard index at the end (per inner chunk its offset
    and length, uint64 little-endian; both 2**64 - 1 for a chunk never written) followed by the index's CRC32C;
    ``scale``, shape (n,), one chunk ``c/0``: the values and their CRC32C. A checksum that fails is a
    ``ValueError`` and an absent chunk reads as the fill value, as zarr reads them; anything else in the metadata
    raises :class:`_OtherLayout` and zarr reads the array instead.
    """

    def __init__(self, directory: Path) -> None:
        try:
            meta = json.loads((directory / "zarr.json").read_text())
            self.shape = tuple(int(n) for n in meta["shape"])
            self.dtype = np.dtype(_ZARR_DTYPES[meta["data_type"]])
            grid = meta["chunk_grid"]
            chunk = tuple(int(n) for n in grid["configuration"]["chunk_shape"])
            codecs = meta["codecs"]
            ok = (meta.get("zarr_format") == 3 and grid["name"] == "regular" and len(chunk) == len(self.shape)
                  and all(c >= n for c, n in zip(chunk, self.shape)) and not meta.get("storage_transformers")
                  and meta["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "/"}})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _OtherLayout(str(exc)) from None
        fill = meta.get("fill_value")
        self.fill = np.nan if fill == "NaN" else fill
        self.file = directory.joinpath("c", *["0"] * len(self.shape))
        names = [c.get("name") for c in codecs]
        if ok and len(self.shape) == 1 and names == ["bytes", "crc32c"] and _little(codecs[0]):
            self.inner = None
        elif (ok and len(self.shape) == 2 and names == ["sharding_indexed"]
              and codecs[0]["configuration"].get("index_location") == "end"
              and [c.get("name") for c in codecs[0]["configuration"]["codecs"]] == ["bytes", "zstd", "crc32c"]
              and _little(codecs[0]["configuration"]["codecs"][0])
              and [c.get("name") for c in codecs[0]["configuration"]["index_codecs"]] == ["bytes", "crc32c"]
              and _little(codecs[0]["configuration"]["index_codecs"][0])):
            self.inner = tuple(int(n) for n in codecs[0]["configuration"]["chunk_shape"])
            self.shard = chunk
            if self.inner[1] != self.shape[1] or self.shard[0] % self.inner[0]:
                raise _OtherLayout("inner chunks that do not span the rows")
        else:
            raise _OtherLayout(f"codecs {names}")

    def _chunks(self, wanted: np.ndarray) -> dict[int, np.ndarray]:
        """The inner chunks ``wanted`` (indices), decoded to arrays of the inner chunk's shape."""
        from google_crc32c import value as crc32c
        from numcodecs.zstd import decompress

        n_chunks = self.shard[0] // self.inner[0]
        with open(self.file, "rb") as handle:
            handle.seek(-(16 * n_chunks + 4), os.SEEK_END)
            raw = handle.read(16 * n_chunks + 4)
            _check(raw, crc32c)
            index = np.frombuffer(raw, dtype="<u8", count=2 * n_chunks).reshape(n_chunks, 2)
            out = {}
            for k in wanted.tolist():
                offset, length = (int(v) for v in index[k])
                if offset == _ABSENT:
                    out[k] = np.full(self.inner, self.fill, dtype=self.dtype)
                    continue
                handle.seek(offset)
                data = handle.read(length)
                _check(data, crc32c)
                out[k] = np.frombuffer(decompress(data[:-4]), dtype=self.dtype).reshape(self.inner)
        return out

    def __getitem__(self, key: slice) -> np.ndarray:
        """The whole array (``array[:]``)."""
        if key != slice(None):
            raise IndexError("only [:] reads a whole segment array")
        if self.inner is None:
            from google_crc32c import value as crc32c
            raw = self.file.read_bytes()
            _check(raw, crc32c)
            return np.frombuffer(raw, dtype=self.dtype, count=self.shape[0]).copy()
        chunks = self._chunks(np.arange(self.shard[0] // self.inner[0]))
        return np.concatenate([chunks[k] for k in sorted(chunks)])[:self.shape[0]]

    def get_orthogonal_selection(self, selection: tuple[np.ndarray, slice]) -> np.ndarray:
        """Rows ``selection[0]`` (all columns), reading only their inner chunks."""
        rows = np.asarray(selection[0], dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError("rows outside the segment")
        chunk_of = rows // self.inner[0]
        chunks = self._chunks(np.unique(chunk_of))
        return np.stack([chunks[c][r % self.inner[0]] for c, r in zip(chunk_of.tolist(), rows.tolist())]) \
            if rows.size else np.empty((0, self.shape[1]), dtype=self.dtype)


def _little(codec: dict) -> bool:
    return (codec.get("configuration") or {}).get("endian", "little") == "little"


def _check(data: bytes, crc32c: Any) -> None:
    """Raise ValueError unless the last 4 bytes of ``data`` are the CRC32C (little-endian) of the rest."""
    if len(data) < 4 or int.from_bytes(data[-4:], "little") != crc32c(data[:-4]):
        raise ValueError("checksum mismatch in a coordinates segment")


def _layout_1_keys(index_dir: Path) -> list[str]:
    """The committed keys of a layout-1 cache, in row order (consolidated index, then segments without gaps)."""
    names = os.listdir(index_dir)
    alls = sorted((int(n[4:-5]), n) for n in names if n.startswith("all-") and n.endswith(".json"))
    segs = sorted((int(n[4:-5]), n) for n in names if n.startswith("seg-") and n.endswith(".json"))
    keys: list[str] = []
    seq = 0
    if alls:
        seq, name = alls[-1]
        keys = list(json.loads((index_dir / name).read_text())["keys"])
    for s, name in segs:
        if s <= seq:
            continue
        seg = json.loads((index_dir / name).read_text())
        if int(seg["start"]) != len(keys):
            break  # a gap means a lost segment: everything after it is unusable
        keys.extend(seg["keys"])
    return keys


def cached_candidate_coordinates(model: Any, molecules: Sequence[Any], root: str | os.PathLike | None = None,
                                 cache: CoordinatesCache | None = None, keys: Sequence[str] | None = None
                                 ) -> np.ndarray:
    """``model.candidate_coordinates(molecules)`` through the store (shape (n, d)).

    ``root=False``-like use (no caching) is :meth:`Model.candidate_coordinates` itself.
    """
    if cache is None:
        cache = CoordinatesCache(root, store_key(model))
    return cache.get(molecules, model.candidate_coordinates, keys=keys)
