"""What every spectra reader shares: the skip report, opening (gzip, binary sniffing) and record ids."""
from __future__ import annotations

import gzip
import io
import logging
import math
import os
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import IO, Iterator, NamedTuple

from molpredict.errors import InputError

__all__ = ["SkipEntry", "SkipReport", "open_text", "file_stem", "parse_charge", "normalize_ion_mode",
           "parse_ms_level", "adduct_from_name", "MAX_PRECURSOR_MZ", "precursor_mz_problem", "STREAM_ERRORS",
           "stream_error", "written_decimals"]

logger = logging.getLogger("molpredict.io")

_GZIP_MAGIC = b"\x1f\x8b"
_SNIFF_BYTES = 8192
#: what :class:`_Skipper` warns about, once per file
NOT_UTF8 = "line(s) with bytes that are not UTF-8, read as U+FFFD (is the file Latin-1?)"
#: bytes that never occur in a text spectra file (C0 controls other than tab, LF, VT, FF, CR; and DEL)
_BINARY_BYTES = frozenset(set(range(0, 9)) | set(range(14, 32)) | {127})


class SkipEntry(NamedTuple):
    """One skipped record: the file, its 1-based record number in that file, why it was skipped, and its id.

    ``spectrum_id`` is the id the reader would have given the record's spectrum (its TITLE, DB#, scan id, or the
    reader's ``"<file stem>:<record>"`` fallback), so that a skipped record can be joined with the results of the
    records that were read; None where it is not known (an entry added without it). The built-in readers always
    know it: they skip a record once it has been read to its end (or to where it is cut off)."""

    path: str
    record: int
    reason: str
    spectrum_id: str | None = None


class SkipReport:
    """Collects the records a reader skipped, so that one bad record never stops a whole file.

    Readers append ``(path, record, reason, spectrum_id)`` entries (:class:`SkipEntry`); ``reason`` is a short
    category (e.g. ``"no peaks"``, ``"non-numeric peak"``) so that :meth:`summary` can count records per reason.

    Examples
    --------
    >>> report = SkipReport()
    >>> spectra = list(read_mgf("query.mgf", report=report))   # doctest: +SKIP
    >>> print(report.summary())                                 # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.entries: list[SkipEntry] = []

    def add(self, path: str | os.PathLike, record: int, reason: str, spectrum_id: str | None = None) -> None:
        """Record that ``record`` (1-based) of ``path``, whose spectrum id is ``spectrum_id`` when known, was
        skipped for ``reason``."""
        self.entries.append(SkipEntry(str(path), int(record), str(reason),
                                      None if spectrum_id is None else str(spectrum_id)))

    @property
    def count(self) -> int:
        """Number of skipped records."""
        return len(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[SkipEntry]:
        return iter(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def by_reason(self) -> dict[str, int]:
        """Skipped-record counts per reason, most frequent first."""
        return dict(Counter(e.reason for e in self.entries).most_common())

    def summary(self) -> str:
        """One line per reason, ``"<count> records skipped: <reason>"``; empty string when nothing was skipped."""
        return "\n".join(f"{n} record{'s' if n != 1 else ''} skipped: {reason}"
                         for reason, n in self.by_reason().items())

    def to_dict(self) -> dict:
        """JSON-serialisable form: ``{"count": int, "by_reason": {...}, "entries": [[path, record, reason,
        spectrum_id]]}`` (``spectrum_id`` null where unknown)."""
        return {"count": self.count, "by_reason": self.by_reason(),
                "entries": [list(e) for e in self.entries]}

    def __repr__(self) -> str:
        return f"SkipReport(count={self.count})"


def _log_skips(path: str, skipped: Counter) -> None:
    """Readers without a report still say, once per file, what they dropped."""
    if skipped:
        detail = ", ".join(f"{n} {reason}" for reason, n in skipped.most_common())
        logger.warning("%s: skipped %d record(s) (%s)", path, sum(skipped.values()), detail)


class _Skipper:
    """Routes a reader's skipped records to a :class:`SkipReport` (when given) and a per-file log line."""

    def __init__(self, path: str, report: SkipReport | None) -> None:
        self.path = path
        self.report = report
        self.counts: Counter = Counter()
        self.notes: Counter = Counter()

    def __call__(self, record: int, reason: str, spectrum_id: str | None = None) -> None:
        self.counts[reason] += 1
        if self.report is not None:
            self.report.add(self.path, record, reason, spectrum_id)

    def note(self, what: str) -> None:
        """Count a line that belongs to no record, or was not UTF-8: no record is lost over it, so it is no skip,
        but the file is not what its writer meant either, so :meth:`close` warns once per file."""
        self.notes[what] += 1

    def close(self) -> None:
        if self.report is None:
            _log_skips(self.path, self.counts)
        for what, n in self.notes.items():
            logger.warning("%s: %d %s", self.path, n, what)


#: The largest precursor m/z a reader accepts. The library is small molecules (< 2,000 Da, charge at most a few), so
#: anything above 100,000 is a unit or typing error (``1e300``, a mass in mDa), never a precursor: reading it
#: would select no candidate and turn a bad record into a silent "no match".
MAX_PRECURSOR_MZ = 100_000.0


def precursor_mz_problem(value: float, field: str, text: str) -> str | None:
    """Why a precursor m/z that a record gives is unusable, or None when it is a usable m/z.

    Parameters
    ----------
    value : float
        The m/z as read.
    field : str
        The field it was read from, for the reason (``"PEPMASS"``, ``"selected ion m/z"``).
    text : str
        The value as written, for the reason.

    Returns
    -------
    str or None
        A skip reason naming the field and value: non-finite, not positive, or above :data:`MAX_PRECURSOR_MZ`.
    """
    if not math.isfinite(value):
        return f"non-numeric {field}"
    shown = text if len(text) <= 24 else text[:21] + "..."
    if value <= 0:
        return f"{field} {shown} is not a positive m/z"
    if value > MAX_PRECURSOR_MZ:
        return f"{field} {shown} is above {MAX_PRECURSOR_MZ:.0f}, not a small-molecule precursor m/z"
    return None


#: What reading a damaged file raises mid-stream: a truncated gzip (EOFError), a corrupt one (``BadGzipFile``,
#: an OSError, or zlib.error), or a failing disk (OSError).
STREAM_ERRORS = (EOFError, OSError, zlib.error)


def stream_error(path: str | os.PathLike, exc: BaseException, records: int, unit: str = "record") -> InputError:
    """The one-line error for a file that cannot be read to its end (see :data:`STREAM_ERRORS`).

    Parameters
    ----------
    path : str or path-like
    exc : exception
        What reading raised.
    records : int
        How many whole records were read before it (they have been yielded: the error says where the file stops).
    unit : str
        What a record is called in this format (``"record"``, ``"scan"``).
    """
    where = f"after {unit} {records}" if records else f"before the first {unit}"
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, EOFError):
        what = "truncated gzip stream"
    elif isinstance(exc, (zlib.error, gzip.BadGzipFile)):
        what = "corrupt gzip stream"
    else:
        what = "read error"
    return InputError(f"{what} {where} ({detail})", path=str(path))


def open_text(path: str | os.PathLike, kind: str) -> IO[str]:
    """Open a spectra file as text, un-gzipping transparently; refuse binary files.

    Parameters
    ----------
    path : str or path-like
    kind : str
        The format expected (for the error message), e.g. ``"MGF"``.

    Returns
    -------
    A text stream with universal newlines (CRLF read as LF), UTF-8 with undecodable bytes replaced; a
    leading UTF-8 byte-order mark (written by Windows tools) is dropped.

    Raises
    ------
    InputError
        The file does not exist, is a directory, or holds binary data (NUL or other control bytes in its
        first 8 KiB, after un-gzipping), e.g. an image.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file", path=str(path))
    if path.is_dir():
        raise InputError(f"is a directory, not an {kind} file", path=str(path))
    with open(path, "rb") as probe:
        head = probe.read(_SNIFF_BYTES)
    compressed = head[:2] == _GZIP_MAGIC
    if compressed:
        # Sniff with a decompressor that stops at the sniff size and does not want the end of the stream: a
        # truncated .gz is then refused by the reader, which can say after which record it stops.
        try:
            head = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(head, _SNIFF_BYTES)
        except zlib.error as exc:
            raise stream_error(path, exc, 0) from None
    if any(b in _BINARY_BYTES for b in head):
        raise InputError(f"not an {kind} file (binary data)", path=str(path))
    raw = gzip.open(path, "rb") if compressed else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline=None)


def written_decimals(token: str) -> int:
    """Decimal places of a number as written, in plain or exponent notation (``"224.10"`` -> 2, ``"1.25e2"`` -> 0):
    the precision a file gives a peak or precursor m/z. Raises ValueError on a malformed exponent."""
    mantissa, _, exponent = token.lower().partition("e")
    fraction = mantissa.partition(".")[2]
    return max(0, len(fraction) - (int(exponent) if exponent else 0))


def file_stem(path: str | os.PathLike) -> str:
    """The file name without its format and compression extensions (``a/b.mgf.gz`` -> ``b``)."""
    name = Path(path).name
    if name.lower().endswith(".gz"):
        name = name[:-3]
    stem = Path(name).stem
    return stem or name


def parse_charge(text: str) -> int | None:
    """A signed charge from ``"1+"``, ``"+1"``, ``"1"``, ``"2-"``, ``"-1"``...; None for ``""``/``"0"``/lists.

    Raises
    ------
    ValueError
        The text is not a charge.
    """
    s = text.strip()
    if not s:
        return None
    if " and " in s or "," in s:
        # Mascot's "2+ and 3+" (or "2+,3+") means "one of these": no single charge is known.
        return None
    sign = 1
    if s[-1] in "+-":
        sign = -1 if s[-1] == "-" else 1
        s = s[:-1]
        if s[:1] in "+-":
            raise ValueError(text)
    elif s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if not s.isdigit():
        raise ValueError(text)
    value = int(s)
    return sign * value if value else None


_ION_MODES = {"positive": "positive", "pos": "positive", "p": "positive", "+": "positive",
              "negative": "negative", "neg": "negative", "n": "negative", "-": "negative"}


def normalize_ion_mode(text: str | None) -> str | None:
    """``"Positive"``, ``"POS"``, ``"P"``, ``"+"`` -> ``"positive"`` (likewise negative); anything else -> None."""
    if not text:
        return None
    return _ION_MODES.get(text.strip().lower())


# "MS2", "ms2", "MS/MS", "MSMS", "MS-MS", "MS" (a full scan, level 1), or a bare number
_MS_LEVEL = re.compile(r"^(?:MS\s*[/-]?\s*(MS)|MS\s*(\d+)|MS|(\d+))$", re.IGNORECASE)


def parse_ms_level(text: str) -> int | None:
    """The MS level written as ``"2"``, ``"MS2"``, ``"ms2"``, ``"MS/MS"``, ``"MSMS"`` or ``"MS"`` (1);
    None for anything else (a textual spectrum type such as ``"in-source"`` or ``"GC-MS"``)."""
    match = _MS_LEVEL.match(text.strip())
    if match is None:
        return None
    tandem, ms_digits, digits = match.groups()
    if tandem:
        return 2
    if ms_digits or digits:
        return int(ms_digits or digits)
    return 1


# The last word of a compound name when it is an adduct: "M+H", "[M+H]+", "[M-H]-", "2M+Na", "M+FA-H", "[M]+"
_NAME_ADDUCT = re.compile(r"^\[?(\d*M(?:[+-]\d*[A-Za-z][A-Za-z0-9]*)*)\]?(\d*[+-]{1,2})?\*?$")


def adduct_from_name(name: str | None, ion_mode: str | None = None) -> str | None:
    """The adduct a compound name ends with (GNPS writes ``NAME=Caffeine M+H``), as a canonical name.

    matchms's convention: the name's last word is taken when it parses as an adduct. A word without a charge
    (``M+H``) gets the sign under which it is a common adduct (``[M+H]+`` yes, ``[M+H]-`` no), or the sign of
    ``ion_mode`` when both are; when that does not decide, no adduct is guessed.

    Examples
    --------
    >>> adduct_from_name("Caffeine M+H"), adduct_from_name("X [M-H]-"), adduct_from_name("Vitamin E")
    ('[M+H]+', '[M-H]-', None)
    """
    from molpredict.errors import MolpredictError
    from molpredict.chem.molecules import ADDUCTS, parse_adduct

    if not name or not name.split():
        return None
    word = name.split()[-1]
    match = _NAME_ADDUCT.match(word)
    if match is None or match.group(1) == "M" and not match.group(2):
        return None
    core, charge = match.groups()
    if charge:
        chosen = f"[{core}]{charge}"
    else:
        signed = {"positive": f"[{core}]+", "negative": f"[{core}]-"}
        known = [mode for mode, text in signed.items() if _known_adduct(text, ADDUCTS)]
        if ion_mode in known:
            chosen = signed[ion_mode]
        elif len(known) == 1:
            chosen = signed[known[0]]
        else:
            return None
    try:
        return parse_adduct(chosen).name
    except MolpredictError:
        return None


def _known_adduct(text: str, table: dict) -> bool:
    from molpredict.errors import MolpredictError
    from molpredict.chem.molecules import parse_adduct

    try:
        return parse_adduct(text).name in table
    except MolpredictError:
        return False
