"""Atomic file writes: a temporary file beside the target, renamed over it only once complete."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "atomic_text", "replace_atomically", "fsync_directory", "creation_mode"]


def _umask() -> int:
    """The process's umask: read from ``/proc`` where Linux shows it (setting it to read it is not thread-safe),
    else set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def creation_mode(directory: bool = False) -> int:
    """The permission bits ``open`` / ``mkdir`` would give a new file (directory) under this process's umask.

    ``tempfile.mkstemp`` / ``mkdtemp`` create theirs owner-only (0600 / 0700) whatever the umask; renamed into place,
    a model's tensors, a report or a library would stay unreadable to the group and to workers under other accounts.
    """
    return (0o777 if directory else 0o666) & ~_umask()


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_atomically(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename ``source`` over ``target`` (same file system) and make the rename durable."""
    os.replace(source, target)
    fsync_directory(Path(target).parent)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                 newline: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on a clean exit it is flushed, synced and renamed to
    ``path``, on an exception (or a kill) it is removed (or left under its temporary name), never leaving a
    half-written file under the final name.

    Parameters
    ----------
    path : str or path-like
    mode : {"w", "wb"}
    encoding, newline
        As for :func:`open` (text mode only).

    Examples
    --------
    >>> with atomic_write(tmp / "out.tsv") as handle:     # doctest: +SKIP
    ...     handle.write("a\\tb\\n")
    """
    path = Path(path)
    try:  # a file written over keeps its permissions; a new one gets the umask's, as open() would give it
        permissions = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        permissions = creation_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, permissions)
        binary = "b" in mode
        with os.fdopen(fd, mode, **({} if binary else {"encoding": encoding, "newline": newline})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        replace_atomically(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_text(path: str | os.PathLike, newline: str | None = None) -> Iterator[IO[str]]:
    """:func:`atomic_write` for a UTF-8 text file, gzip-compressed when ``path`` ends with ``.gz``."""
    if not str(path).lower().endswith(".gz"):
        with atomic_write(path, "w", newline=newline) as handle:
            yield handle
        return
    import gzip
    import io

    with atomic_write(path, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", filename="") as packed:
            with io.TextIOWrapper(packed, encoding="utf-8", newline=newline) as handle:
                yield handle
