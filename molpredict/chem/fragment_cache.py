"""The on-disk cache of per-structure fragmentation results: a small persistent key-value store of named numpy arrays
per structure, one SQLite file per content key, shared by concurrent processes on one machine.

A fragmentation scorer (:class:`~molpredict.chem.fragments.FragmentScorer`'s fragment sets, the learnt
:class:`~molpredict.chem.fragment_model.FragmentModel`'s ion groups) computes, per candidate structure, arrays that
depend on the structure and on the scorer's content key alone (``scorer.disk_cache_key()``). A fresh process would
fragment every candidate again; this store keeps them across runs.

Layout
------
``<cache root>/fragments/<content key>.sqlite``: one table ``entries(key TEXT PRIMARY KEY, value BLOB)`` and a
``meta`` table (format, version, content key). The database runs in WAL mode with a busy timeout, so identify
processes and Dask workers on one machine read while another writes and queue their writes (SQLite's locks do
not hold on network file systems: a root on NFS or object storage is not supported). Entries are only ever
added (``INSERT OR IGNORE``): a content key fixes every value.

Values
------
A few named arrays in one blob, without pickle (:func:`encode_arrays`): ``b"MPFC"``, a little-endian uint32 header
length, a JSON header (per array its name, dtype string, shape, byte offset and length), then the raw bytes.
Only boolean, integer, float and fixed-width unicode dtypes are accepted; :func:`decode_arrays` refuses anything
else (``ValueError``).

Damage
------
A database that cannot be opened, read or written (a damaged file, a full disk, no permission) never stops
identification: the cache warns once, in one line naming the file, and turns itself off (the scorers recompute).
An entry whose value does not decode is a miss.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import struct
import threading
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["FragmentCache", "ScorerDiskCache", "encode_arrays", "decode_arrays", "content_key", "FORMAT_VERSION"]

#: version of the store layout and value encoding (part of every content key)
FORMAT_VERSION = 1
_MAGIC = b"MPFC"
_FORMAT = "molpredict-fragment-cache"
#: dtype kinds a value may hold: bool, signed / unsigned integers, floats, fixed-width unicode
_KINDS = frozenset("biufU")
#: keys per SELECT ... IN (...) (SQLite's default limit on bound parameters is 999 in older builds)
_BATCH = 500
#: milliseconds a connection waits for another process's write lock before giving up
BUSY_TIMEOUT_MS = 60_000


def encode_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """One blob of named arrays (module docstring), without pickle.

    Raises
    ------
    ValueError
        An array of a dtype outside booleans, integers, floats and fixed-width unicode (objects, structured).
    """
    header, chunks, offset = [], [], 0
    for name, value in arrays.items():
        a = np.asarray(value)  # tobytes() writes C order whatever the layout
        if a.dtype.kind not in _KINDS or a.dtype.hasobject:
            raise ValueError(f"array {name!r}: dtype {a.dtype} cannot be cached")
        raw = a.tobytes()
        header.append({"name": str(name), "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                       "nbytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *chunks])


def decode_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays :func:`encode_arrays` wrote, read-only views of ``blob``: name -> ndarray.

    Raises
    ------
    ValueError
        Not such a blob: wrong magic, a header that does not parse, a refused dtype, sizes that do not add up.
    """
    blob = bytes(blob)
    if len(blob) < 8 or blob[:4] != _MAGIC:
        raise ValueError("not a fragment cache value")
    (n_head,) = struct.unpack("<I", blob[4:8])
    start = 8 + n_head
    if start > len(blob):
        raise ValueError("truncated fragment cache value")
    try:
        header = json.loads(blob[8:start])
        out = {}
        for item in header:
            dtype = _dtype(item["dtype"])
            shape = tuple(int(n) for n in item["shape"])
            offset, nbytes = int(item["offset"]), int(item["nbytes"])
            count = math.prod(shape)  # (np.prod costs more than the rest of an array's decoding)
            if (min(shape, default=0) < 0 or offset < 0 or count * dtype.itemsize != nbytes
                    or start + offset + nbytes > len(blob)):
                raise ValueError(f"array {item['name']!r}: sizes do not add up")
            out[str(item["name"])] = (np.frombuffer(blob, dtype=dtype, count=count, offset=start + offset)
                                      .reshape(shape) if count else np.empty(shape, dtype=dtype))
        return out
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed fragment cache header ({type(exc).__name__}: {exc})") from None


_DTYPES: dict[str, np.dtype] = {}


def _dtype(name: Any) -> np.dtype:
    """The dtype a header names, when it is one a value may hold (``ValueError`` otherwise); remembered."""
    hit = _DTYPES.get(name) if isinstance(name, str) else None
    if hit is not None:
        return hit
    dtype = np.dtype(str(name))
    if dtype.kind not in _KINDS or dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"refused dtype {dtype}")
    if len(_DTYPES) < 256:
        _DTYPES[str(name)] = dtype
    return dtype


def content_key(kind: str, params: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> str:
    """``<kind>-<hash>``: a SHA-256 of :data:`FORMAT_VERSION`, ``kind``, the JSON of ``params`` (keys sorted) and
    the bytes, dtypes and shapes of ``arrays`` (names sorted), 24 hex digits. Whatever changes a scorer's
    per-structure arrays must be among ``params`` or ``arrays``."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": _FORMAT, "version": FORMAT_VERSION, "kind": kind, "params": dict(params)},
                             sort_keys=True, default=repr).encode())
    for name in sorted(arrays or {}):
        a = np.asarray(arrays[name])
        digest.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        digest.update(a.tobytes())
    return f"{kind}-{digest.hexdigest()[:24]}"


class FragmentCache:
    """Named arrays per structure key, stored in ``<root>/fragments/<key>.sqlite``.

    Parameters
    ----------
    root : str or Path
        The cache root (the candidate-coordinates cache's root; a local directory).
    key : str
        The content key of what is stored (a scorer's ``disk_cache_key()``).

    Attributes
    ----------
    path : Path
        The database file.
    disabled : bool
        True once the database failed (warned once); every read is then a miss and writes are dropped.

    The connection is opened on first use, once per process (a forked child opens its own) and is shared by the
    threads of a process under a lock. The object pickles without its connection.
    """

    def __init__(self, root: str | os.PathLike, key: str) -> None:
        if not key or "/" in key or os.sep in key or key.startswith("."):
            raise ValueError(f"invalid fragment cache key {key!r}")
        self.root = root
        self.key = key
        self.path = Path(root) / "fragments" / f"{key}.sqlite"
        self.disabled = False
        self._connection: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_connection=None, _pid=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- the connection ----------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._connection is not None and self._pid == os.getpid():
            return self._connection
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                     check_same_thread=False)
        try:
            connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                connection.execute("PRAGMA journal_mode = WAL")  # persistent: set once per file
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            # a rowid table with the key's index: values of a few KB read 3x faster than WITHOUT ROWID's
            connection.execute("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
            connection.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                                   [("format", _FORMAT), ("version", str(FORMAT_VERSION)), ("key", self.key)])
            meta = dict(connection.execute("SELECT name, value FROM meta").fetchall())
            if meta.get("format") != _FORMAT or meta.get("version") != str(FORMAT_VERSION) \
                    or meta.get("key") != self.key:
                raise sqlite3.DatabaseError(f"a store of {meta.get('format')} version {meta.get('version')}, "
                                            f"key {meta.get('key')}")
        except BaseException:
            connection.close()
            raise
        self._connection, self._pid = connection, os.getpid()
        return connection

    def _fail(self, exc: BaseException) -> None:
        """Turn the cache off, warning once in one line."""
        if not self.disabled:
            self.disabled = True
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            warnings.warn(f"fragment cache {self.path} is unusable ({message}); fragmenting without it "
                          f"(delete the file to rebuild it)", UserWarning, stacklevel=3)
        self.close()

    def close(self) -> None:
        """Close this process's connection (a later call opens it again unless the cache is disabled)."""
        connection, self._connection = self._connection, None
        if connection is not None and self._pid == os.getpid():
            try:
                connection.close()
            except sqlite3.Error:
                pass

    # -- reading and writing ---------------------------------------------------------------------------------
    def get_many(self, keys: Iterable[str]) -> dict[str, dict[str, np.ndarray]]:
        """The stored entries among ``keys``: key -> (name -> ndarray, read-only); absent keys are left out (so
        are entries whose value does not decode)."""
        keys = list(dict.fromkeys(keys))
        if self.disabled or not keys:
            return {}
        rows: list[tuple[str, bytes]] = []
        with self._lock:
            try:
                connection = self._connect()
                for start in range(0, len(keys), _BATCH):
                    batch = keys[start:start + _BATCH]
                    rows += connection.execute(
                        f"SELECT key, value FROM entries WHERE key IN ({','.join('?' * len(batch))})",
                        batch).fetchall()
            except (sqlite3.Error, OSError) as exc:
                self._fail(exc)
                return {}
        out = {}
        for key, value in rows:
            try:
                out[key] = decode_arrays(value)
            except ValueError:
                continue  # a damaged value: a miss, recomputed and (INSERT OR IGNORE) left as it is
        return out

    def put_many(self, items: Mapping[str, Mapping[str, np.ndarray]] | Iterable[tuple[str, Mapping[str, np.ndarray]]]
                 ) -> int:
        """Store entries (key -> named arrays) in one transaction; keys already stored keep their value. Returns
        how many entries were offered (0 when the cache is off)."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        if self.disabled or not pairs:
            return 0
        encoded = [(str(k), encode_arrays(v)) for k, v in pairs]
        with self._lock:
            try:
                connection = self._connect()
                connection.execute("BEGIN IMMEDIATE")
                try:
                    connection.executemany("INSERT OR IGNORE INTO entries VALUES (?, ?)", encoded)
                    connection.execute("COMMIT")
                except BaseException:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                    raise
            except (sqlite3.Error, OSError) as exc:
                self._fail(exc)
                return 0
        return len(encoded)

    def __len__(self) -> int:
        """Entries stored (0 when the cache is off)."""
        if self.disabled:
            return 0
        with self._lock:
            try:
                return int(self._connect().execute("SELECT COUNT(*) FROM entries").fetchone()[0])
            except (sqlite3.Error, OSError) as exc:
                self._fail(exc)
                return 0


class ScorerDiskCache:
    """A scorer's in-memory per-structure cache backed by a :class:`FragmentCache`.

    The scorer keeps its own cache by SMILES and exposes it as arrays: ``disk_cache_key()``, ``in_memory(smiles)
    -> set`` (what its memory holds, marked recently used), ``cached_arrays(smiles) -> {smiles: {name: ndarray}}``
    and ``remember_arrays({smiles: {name: ndarray}}) -> set of SMILES taken`` (entries it cannot read are not).
    Disk entries are keyed by ``"<InChIKey first block> <SMILES>"``: the first block names the structure, the
    SMILES keeps apart records that share it but fragment differently (tautomers with their hydrogens on other
    atoms, isotopologues), as the scorers' memory does.

    Parameters
    ----------
    scorer : FragmentScorer or FragmentModel
    store : FragmentCache
    """

    def __init__(self, scorer: Any, store: FragmentCache) -> None:
        self.scorer = scorer
        self.store = store

    @staticmethod
    def disk_keys(inchikey14: Sequence[str], smiles: Sequence[str]) -> list[str]:
        return [f"{k or ''} {s}" for k, s in zip(inchikey14, smiles)]

    def prefetch(self, inchikey14: Sequence[str], smiles: Sequence[str]) -> dict[str, str]:
        """Load the stored entries of the structures the scorer's memory lacks into it; returns the structures
        still missing (SMILES -> disk key), for :meth:`store_new` after scoring."""
        have = self.scorer.in_memory(smiles)
        todo = {s: k for s, k in zip(smiles, self.disk_keys(inchikey14, smiles)) if s not in have}
        if not todo:
            return {}
        found = self.store.get_many(todo.values())
        by_key = {k: s for s, k in todo.items()}
        taken = self.scorer.remember_arrays({by_key[k]: arrays for k, arrays in found.items()})
        return {s: k for s, k in todo.items() if s not in taken}

    def store_new(self, missing: Mapping[str, str]) -> int:
        """Write the entries the scorer computed for ``missing`` (:meth:`prefetch`'s result); structures it could
        not fragment are left out. Returns how many were written."""
        if not missing:
            return 0
        computed = self.scorer.cached_arrays(list(missing))
        return self.store.put_many({missing[s]: arrays for s, arrays in computed.items()})
