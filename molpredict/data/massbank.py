"""MassBank import: record-format files (a MassBank-data checkout or a release archive) to split MGF files.

Only MS2 records with a SMILES that RDKit parses and a numeric precursor m/z are kept. Each kept record becomes
one MGF entry with the fields of the shared MassBank data: ``TITLE`` (accession), ``PEPMASS``, ``CHARGE``,
``IONMODE``, ``ADDUCT`` (MassBank's precursor type, as written; empty when absent), ``NAME`` (first
``CH$NAME``), ``FORMULA``, ``SMILES`` (RDKit canonical), ``INCHIKEY`` (both computed by RDKit from the
record's SMILES), ``INSTRUMENT_TYPE``, ``COLLISION_ENERGY`` (free text), ``LICENSE``, then the ``m/z
intensity`` peak lines (the ``int.`` column as deposited).

Split
-----
Structure-disjoint: a record goes to the split of its InChIKey first block ``b`` (the 2D skeleton), decided by
``u = int(sha256(b)[:8 bytes], big-endian) / 2**64``: train when ``u < 0.8``, val when ``u < 0.9``, else test
(fractions configurable). The same structure therefore always lands in the same split, in every release.
Files: ``{train,val,test}_{pos,neg}.mgf``, and ``skipped.tsv``: each record not imported, with its file and
the reason (broken files, records lacking a field, repeated accessions: the import reports them and goes on).
"""
from __future__ import annotations

import codecs
import hashlib
import math
import os
import re
import tarfile
import time
import zipfile
import zlib
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

from molpredict.errors import InputError, MolpredictError, ResourceError

__all__ = [
    "MassBankRecord",
    "parse_record",
    "RecordFile",
    "iter_record_files",
    "split_of",
    "import_massbank",
    "release_url",
    "url_problem",
    "fetch_massbank",
    "download",
    "DEFAULT_FRACTIONS",
    "DEFAULT_RELEASE",
]

DEFAULT_FRACTIONS = (("train", 0.8), ("val", 0.1), ("test", 0.1))
DEFAULT_RELEASE = "2025.05.1"
_MODE_SUFFIX = {"positive": "pos", "negative": "neg"}


@dataclass
class MassBankRecord:
    """The fields of one MassBank record that the import uses.

    Attributes
    ----------
    accession : str
    fields : dict
        ``TAG`` or ``TAG SUBTAG`` -> list of values (``"CH$NAME"``, ``"AC$MASS_SPECTROMETRY MS_TYPE"``...).
    peaks : list of (str, str)
        ``(m/z, intensity)`` as written in the record.
    """

    accession: str
    fields: dict[str, list[str]] = field(default_factory=dict)
    peaks: list[tuple[str, str]] = field(default_factory=list)

    def first(self, key: str) -> str | None:
        values = self.fields.get(key)
        return values[0] if values else None


# Tags whose values start with a subtag (``AC$MASS_SPECTROMETRY: ION_MODE POSITIVE``).
_SUBTAGGED = {"AC$MASS_SPECTROMETRY", "AC$CHROMATOGRAPHY", "MS$FOCUSED_ION", "MS$DATA_PROCESSING", "CH$LINK",
              "SP$LINK", "AC$GENERAL", "MS$GENERAL"}


def parse_record(text: str, source: str = "<record>") -> MassBankRecord:
    """Parse the text of one MassBank record.

    Raises
    ------
    InputError
        No ``ACCESSION:`` line, or a malformed peak line.
    """
    fields: dict[str, list[str]] = {}
    peaks: list[tuple[str, str]] = []
    in_peaks = False
    accession = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if line.startswith("//"):
            break
        if in_peaks:
            if line.startswith(" "):
                parts = line.split()
                if len(parts) < 2:
                    raise InputError(f"line {lineno}: peak line needs m/z and intensity", path=source,
                                     record=accession, field="PK$PEAK")
                try:
                    float(parts[0]), float(parts[1])
                except ValueError:
                    raise InputError(f"line {lineno}: non-numeric peak {line.strip()!r}", path=source,
                                     record=accession, field="PK$PEAK") from None
                peaks.append((parts[0], parts[1]))
                continue
            in_peaks = False
        if line.startswith(" "):
            continue  # continuation of a multi-line field we do not use (PK$ANNOTATION)
        tag, sep, value = line.partition(": ")
        if not sep:
            tag, sep, value = line.partition(":")
            if not sep:
                continue
        tag, value = tag.strip(), value.strip()
        if tag == "PK$PEAK":
            in_peaks = True
            continue
        if tag == "ACCESSION":
            accession = value
        if tag in _SUBTAGGED:
            subtag, _, rest = value.partition(" ")
            tag, value = f"{tag} {subtag}", rest.strip()
        fields.setdefault(tag, []).append(value)
    if not accession:
        raise InputError("no ACCESSION line: not a MassBank record", path=source, field="ACCESSION")
    return MassBankRecord(accession, fields, peaks)


def _is_record_name(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".txt") and not base.startswith(".")


@dataclass
class RecordFile:
    """One ``*.txt`` file of a MassBank input: its text, or why it cannot hold a record.

    Attributes
    ----------
    source : str
        Where it is: the file's path, or ``archive:member``.
    name : str
        Its path relative to the input (``Contributor/MSBNK-...txt``, or the archive member): for messages.
    text : str or None
        The decoded text (UTF-8, without a byte-order mark); None when ``problem`` is set.
    problem : str or None
        Why the file cannot hold a record: ``"empty file"``, ``"binary file, not text"``, ``"UTF-16 text..."``.
    is_record : bool
        False for a readable text file without a single MassBank tag line (a README): not a record at all.
    """

    source: str
    name: str
    text: str | None
    problem: str | None = None
    is_record: bool = True


# A line that only a MassBank record has: a file with one is a (maybe broken) record, a file with none is
# documentation that happens to end in .txt.
_TAG_LINE = re.compile(r"^(?:ACCESSION|RECORD_TITLE|DATE|AUTHORS|LICENSE|COPYRIGHT|PUBLICATION|COMMENT|"
                       r"(?:CH|SP|AC|MS|PK)\$[A-Z_/]+):", re.MULTILINE)
_TEXT_BYTES = b"\t\n\f\r" + bytes(range(32, 256))
_UTF16 = "UTF-16 text (MassBank records are UTF-8: convert it, e.g. iconv -f UTF-16 -t UTF-8)"


def _decode(data: bytes) -> tuple[str | None, str | None]:
    """``(text, None)``, or ``(None, why these bytes are not the text of a record)``."""
    if not data.strip():
        return None, "empty file"
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):  # before UTF-16: FF FE starts both
        return None, "UTF-32 text (MassBank records are UTF-8)"
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None, _UTF16
    sample = data[:4096]
    if b"\x00" in sample:
        # ASCII text saved as UTF-16 without a byte-order mark: every other byte is NUL
        for half in (sample[0::2], sample[1::2]):
            if half.count(0) > 0.9 * len(half):
                return None, _UTF16
        return None, "binary file, not text"
    if len(sample.translate(None, _TEXT_BYTES)) > 0.05 * len(sample):  # what is left: control characters
        return None, "binary file, not text"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # decoding with replacement would put U+FFFD into names silently: a wrong answer, not a skip
        return None, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}; MassBank records " \
                     f"are UTF-8)"
    return text.removeprefix("\ufeff"), None


def _record_file(source: str, name: str, data: bytes) -> RecordFile:
    text, problem = _decode(data)
    if problem is not None:
        return RecordFile(source, name, None, problem)
    is_record = text.lstrip().startswith("ACCESSION:") or _TAG_LINE.search(text) is not None
    return RecordFile(source, name, text, None, is_record)


def _broken_archive(path: Path, exc: BaseException) -> InputError:
    """The one-line error for an archive that fails part-way (its records cannot all be read)."""
    reason = " ".join(str(exc).split())
    if isinstance(exc, EOFError) or "unexpected end" in reason:
        return InputError("truncated archive: it ends before its last record (an interrupted download or copy? "
                          "get it again)", path=str(path))
    return InputError(f"corrupt archive ({reason or type(exc).__name__}): get it again", path=str(path))


def iter_record_files(path: str | os.PathLike) -> Iterator[RecordFile]:
    """Every ``*.txt`` file in a directory tree, ``.zip`` or ``.tar(.gz)`` archive, or one ``.txt`` file.

    Files are visited in sorted name order (deterministic output). A file that cannot be read as text (empty,
    binary, UTF-16, not UTF-8) comes with its ``problem`` set, so that the import reports it and goes on.

    Raises
    ------
    InputError
        ``path`` is missing, of an unknown kind, not a readable archive, or an archive that is truncated or
        corrupt part-way; a lone ``.txt`` file that is not a readable MassBank record.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or directory", path=str(path))

    if path.is_dir():
        for file in sorted(p for p in path.rglob("*.txt") if p.is_file()):
            name = file.relative_to(path).as_posix()
            try:
                data = file.read_bytes()
            except OSError as exc:
                yield RecordFile(str(file), name, None, f"unreadable ({exc.strerror or exc})")
                continue
            yield _record_file(str(file), name, data)
        return
    lower = path.name.lower()
    if lower.endswith(".zip"):
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, EOFError) as exc:
            raise InputError(f"not a readable zip archive, or a truncated one ({exc})", path=str(path)) from None
        with archive:
            for info in sorted(archive.infolist(), key=lambda i: i.filename):
                if info.is_dir() or not _is_record_name(info.filename):
                    continue
                source = f"{path}:{info.filename}"
                try:
                    data = archive.read(info)
                except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
                    # a zip's members are stored apart: one bad member does not spoil the others
                    yield RecordFile(source, info.filename, None,
                                     f"unreadable in the archive ({' '.join(str(exc).split())})")
                    continue
                yield _record_file(source, info.filename, data)
        return
    if lower.endswith((".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")):
        try:
            archive = tarfile.open(path, "r:*")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise InputError(f"not a readable tar archive ({exc})", path=str(path)) from None
        with archive:
            # A compressed tar is one stream: past a truncation or corruption no member can be read, so the
            # whole import stops (the outputs of an earlier import are left as they were).
            try:
                # A release tarball is already sorted by path; sorting members would need two passes over gzip.
                members = sorted((m for m in archive.getmembers() if m.isfile() and _is_record_name(m.name)),
                                 key=lambda m: m.name)
            except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                raise _broken_archive(path, exc) from None
            for member in members:
                try:
                    handle = archive.extractfile(member)
                    data = handle.read() if handle is not None else b""
                except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                    raise _broken_archive(path, exc) from None
                yield _record_file(f"{path}:{member.name}", member.name, data)
        return
    if lower.endswith(".txt"):
        found = _record_file(str(path), path.name, path.read_bytes())
        if found.problem is not None:
            raise InputError(f"{found.problem}: not a MassBank record file", path=str(path))
        if not found.is_record:
            raise InputError("not a MassBank record file (no ACCESSION: line first)", path=str(path))
        yield found
        return
    raise InputError("expected a directory of MassBank records, a .zip or .tar.gz archive, or a .txt record",
                     path=str(path))


def _split_records(text: str) -> Iterator[str]:
    """A file normally holds one record; tolerate several separated by ``//`` lines."""
    chunk: list[str] = []
    for line in text.splitlines():
        chunk.append(line)
        if line.startswith("//"):
            yield "\n".join(chunk)
            chunk = []
    if any(line.strip() for line in chunk):
        yield "\n".join(chunk)


def split_of(inchikey14: str, fractions: Iterable[tuple[str, float]] = DEFAULT_FRACTIONS) -> str:
    """The split of a structure: ``u = int(sha256(inchikey14)[:8], big) / 2**64`` against cumulative fractions."""
    digest = hashlib.sha256(inchikey14.encode("ascii")).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    cumulative = 0.0
    name = None
    for name, fraction in fractions:
        cumulative += fraction
        if u < cumulative:
            return name
    return name  # rounding: the last split takes the remainder


def _precursor(value: str | None) -> float | None:
    if not value:
        return None
    match = re.match(r"\s*([0-9]+(?:\.[0-9]*)?)", value)
    if not match:
        return None
    mz = float(match.group(1))
    return mz if mz > 0 else None


def _charge(adduct: str, ion_mode: str) -> str:
    sign = "+" if ion_mode == "positive" else "-"
    if adduct:
        from molpredict.chem.molecules import parse_adduct
        try:
            return f"{abs(parse_adduct(adduct).charge)}{sign}"
        except MolpredictError:
            pass
    return f"1{sign}"


def _clean(value: str | None) -> str:
    return " ".join((value or "").split())


def record_to_mgf(record: MassBankRecord, molecule) -> tuple[str, str]:
    """``(ion mode, MGF entry text)`` for one accepted record and its parsed ``Molecule``."""
    ion_mode = _ion_mode(record)
    adduct = _clean(record.first("MS$FOCUSED_ION PRECURSOR_TYPE"))
    precursor = record.first("MS$FOCUSED_ION PRECURSOR_M/Z")
    pepmass = _precursor(precursor)
    lines = [
        "BEGIN IONS",
        f"TITLE={record.accession}",
        f"PEPMASS={_format_mz(precursor, pepmass)}",
        f"CHARGE={_charge(adduct, ion_mode)}",
        f"IONMODE={ion_mode}",
        f"ADDUCT={adduct}",
        f"NAME={_clean(record.first('CH$NAME'))}",
        f"FORMULA={molecule.formula}",
        f"SMILES={molecule.smiles}",
        f"INCHIKEY={molecule.inchikey}",
        f"INSTRUMENT_TYPE={_clean(record.first('AC$INSTRUMENT_TYPE'))}",
        f"COLLISION_ENERGY={_clean(record.first('AC$MASS_SPECTROMETRY COLLISION_ENERGY'))}",
        f"LICENSE={_clean(record.first('LICENSE'))}",
    ]
    lines.extend(f"{mz} {intensity}" for mz, intensity in record.peaks)
    lines.append("END IONS")
    return ion_mode, "\n".join(lines) + "\n\n"


def _format_mz(text: str | None, value: float) -> str:
    token = (text or "").split()[0] if text and text.split() else ""
    try:
        if float(token) == value:
            return token  # keep the deposited precision
    except ValueError:
        pass
    return repr(value)


def _ion_mode(record: MassBankRecord) -> str | None:
    mode = (record.first("AC$MASS_SPECTROMETRY ION_MODE") or "").strip().lower()
    return {"positive": "positive", "pos": "positive", "p": "positive",
            "negative": "negative", "neg": "negative", "n": "negative"}.get(mode)


def check_record(record: MassBankRecord):
    """The record's ``Molecule``, or the reason it is not imported (a string)."""
    from molpredict.chem.molecules import Molecule

    ms_type = (record.first("AC$MASS_SPECTROMETRY MS_TYPE") or "").strip().upper()
    if ms_type != "MS2":
        return f"MS type {ms_type or 'missing'} (only MS2)"
    if _ion_mode(record) is None:
        return "no ion mode"
    if _precursor(record.first("MS$FOCUSED_ION PRECURSOR_M/Z")) is None:
        return "no precursor m/z"
    if not record.peaks:
        return "no peaks"
    smiles = (record.first("CH$SMILES") or "").strip()
    if not smiles or smiles.upper() == "N/A":
        return "no SMILES"
    try:
        molecule = Molecule.from_smiles(smiles)
    except InputError:
        return "SMILES not parsed by RDKit"
    if not molecule.inchikey:
        return "no InChIKey from RDKit"
    return molecule


def _check_fractions(fractions: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """The fractions as ``(name, float)`` pairs, or a one-line error naming each of them."""
    fractions = tuple((str(n), float(f)) for n, f in fractions)
    total = sum(f for _, f in fractions)
    # NaN passes every comparison unnoticed (abs(nan - 1) > tol is False): test for finite numbers first
    if any(not (math.isfinite(f) and 0.0 <= f <= 1.0) for _, f in fractions) or abs(total - 1.0) > 1e-9:
        given = ", ".join(f"{n}={f:g}" for n, f in fractions)
        raise InputError(f"split fractions {given}: each must be a number from 0 to 1 and they must sum to 1 "
                         f"(they sum to {total:g})")
    return fractions


def _parse_failure(exc: InputError) -> tuple[str, str | None]:
    """``(reason, detail)`` of a record :func:`parse_record` rejected: the reason groups, the detail locates."""
    if exc.field == "ACCESSION":
        return "no ACCESSION line", None
    if exc.field == "PK$PEAK":
        return "unparsable peak list", f"PK$PEAK {exc.message}"
    return "unparsable record", exc.message


SKIPPED_FILE = "skipped.tsv"


def _write_skipped(path: Path, skipped: list[dict]) -> None:
    """``file  record  accession  reason  detail``, one skipped record a line (the summary shows a few)."""
    columns = ("file", "record", "accession", "reason", "detail")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\t".join(columns) + "\n")
        for entry in skipped:
            cells = ("" if entry[c] is None else " ".join(str(entry[c]).split()) for c in columns)
            handle.write("\t".join(cells) + "\n")


@contextmanager
def _output_dir(out: Path) -> Iterator[Path]:
    """Create ``out`` (and missing parents) for the block; when the block fails, remove the directories created
    here, deepest first, as long as they are empty (a directory that existed before, or one holding anything,
    such as a partial download kept to resume, stays)."""
    created = []
    for directory in (out, *out.parents):
        if directory.exists() or directory.is_symlink():
            break
        created.append(directory)
    out.mkdir(parents=True, exist_ok=True)
    try:
        yield out
    except BaseException:
        for directory in created:
            try:
                directory.rmdir()
            except OSError:
                break
        raise


def import_massbank(path: str | os.PathLike, out_dir: str | os.PathLike,
                    fractions: Iterable[tuple[str, float]] = DEFAULT_FRACTIONS,
                    progress: bool = False) -> dict:
    """Import MassBank records into ``out_dir/{split}_{pos,neg}.mgf``.

    A record that cannot be imported is skipped, and listed in ``out_dir/skipped.tsv`` and in the summary:
    a file that is empty, binary, not UTF-8 or lacks its ``ACCESSION`` line, a record with an unparsable peak
    list or without what the import needs (see :func:`check_record`), and a record whose ``ACCESSION`` an
    earlier file already had (the first one is kept). Text files with no MassBank tag at all (READMEs) are not
    records: they are listed apart. The output files are replaced together at the end; after an error
    (a truncated archive) those of an earlier import are left as they were.

    Parameters
    ----------
    path : str or Path
        A directory tree of ``*.txt`` records, a ``.zip`` / ``.tar.gz`` archive of them, or one record file.
    out_dir : str or Path
        Created if needed (and removed again, when this call created it, if the import fails); existing split
        files are replaced.
    fractions : iterable of (name, fraction)
        The splits in order with their fractions: finite numbers from 0 to 1 summing to 1.
    progress : bool
        Show a tqdm counter on stderr.

    Returns
    -------
    dict
        ``{"source": str(path), "files": {name: n_spectra}, "n_records": int, "n_imported": int,
        "skipped": {reason: count}, "skipped_records": [{"file", "record", "accession", "reason", "detail"}],
        "skipped_list": str, "not_records": [file], "n_structures": {split: n}, "licenses": {licence: n}, "split": {...}}``.
        ``n_records`` counts the record files, broken ones included, and the records of files holding several;
        ``file`` is relative to ``path``, ``record`` the 1-based position in a file of several records (else
        None), ``skipped_list`` the path of ``skipped.tsv``.

    Raises
    ------
    InputError
        Bad fractions; ``path`` missing, of an unknown kind, or an archive that is unreadable, truncated or
        corrupt; no record file in it.
    """
    fractions = _check_fractions(fractions)
    if not Path(path).exists():  # before the output directory is made
        raise InputError("no such file or directory", path=str(path))
    with _output_dir(Path(out_dir)) as out:  # nothing left behind by a failed import (an earlier import's stay)
        return _import_into(path, out, fractions, progress)


def _import_into(path: str | os.PathLike, out: Path, fractions: tuple[tuple[str, float], ...],
                 progress: bool) -> dict:
    """The body of :func:`import_massbank`, once ``out`` exists."""
    names = [f"{split}_{suffix}.mgf" for split, _ in fractions for suffix in ("pos", "neg")]
    tmp_handles: dict[str, IO[str]] = {}
    counts: Counter = Counter()
    licenses: Counter = Counter()
    structures: dict[str, set] = {split: set() for split, _ in fractions}
    skipped: list[dict] = []
    not_records: list[str] = []
    first_seen: dict[str, str] = {}  # accession -> where it was first read: repeats are reported against it
    n_records = 0

    def skip(file: str, record: int | None, reason: str, accession: str | None = None,
             detail: str | None = None) -> None:
        skipped.append({"file": file, "record": record, "accession": accession, "reason": reason,
                        "detail": detail})

    iterator: Iterable[RecordFile] = iter_record_files(path)
    if progress:
        from tqdm import tqdm
        iterator = tqdm(iterator, desc="MassBank records", unit=" files", file=__import__("sys").stderr)
    try:
        for name in names:
            tmp_handles[name] = open(out / f".{name}.tmp", "w", encoding="utf-8")
        for found in iterator:
            if found.problem is not None:
                n_records += 1
                skip(found.name, None, found.problem)
                continue
            if not found.is_record:
                not_records.append(found.name)
                continue
            chunks = list(_split_records(found.text))
            for index, chunk in enumerate(chunks, start=1):
                n_records += 1
                record_no = index if len(chunks) > 1 else None
                try:
                    record = parse_record(chunk, found.source)
                except InputError as exc:
                    reason, detail = _parse_failure(exc)
                    skip(found.name, record_no, reason, exc.record if isinstance(exc.record, str) else None,
                         detail)
                    continue
                where = found.name if record_no is None else f"{found.name} record {record_no}"
                if record.accession in first_seen:
                    skip(found.name, record_no, "repeated ACCESSION, the first copy kept", record.accession,
                         f"{record.accession} is also in {first_seen[record.accession]}")
                    continue
                first_seen[record.accession] = where
                result = check_record(record)
                if isinstance(result, str):
                    skip(found.name, record_no, result, record.accession)
                    continue
                split = split_of(result.inchikey14, fractions)
                ion_mode, entry = record_to_mgf(record, result)
                name = f"{split}_{_MODE_SUFFIX[ion_mode]}.mgf"
                tmp_handles[name].write(entry)
                counts[name] += 1
                structures[split].add(result.inchikey14)
                licenses[_clean(record.first("LICENSE")) or "unknown"] += 1
        if n_records == 0:
            raise InputError("no MassBank record files found (expected *.txt files starting with ACCESSION:)",
                             path=str(path))
        _write_skipped(out / f".{SKIPPED_FILE}.tmp", skipped)
        for name, handle in tmp_handles.items():
            handle.close()
            os.replace(out / f".{name}.tmp", out / name)
        os.replace(out / f".{SKIPPED_FILE}.tmp", out / SKIPPED_FILE)
    finally:
        for name, handle in tmp_handles.items():
            if not handle.closed:
                handle.close()
        for name in [*names, SKIPPED_FILE]:
            try:
                os.remove(out / f".{name}.tmp")
            except FileNotFoundError:
                pass
    reasons = Counter(entry["reason"] for entry in skipped)
    return {"source": str(path), "files": {name: counts.get(name, 0) for name in names}, "n_records": n_records,
            "n_imported": sum(counts.values()), "skipped": dict(reasons.most_common()),
            "skipped_records": skipped, "skipped_list": str(out / SKIPPED_FILE), "not_records": not_records,
            "n_structures": {k: len(v) for k, v in structures.items()}, "licenses": dict(licenses.most_common()),
            "split": {"hash": "sha256(InChIKey first block), first 8 bytes big-endian / 2**64",
                      "fractions": dict(fractions)}}


def release_url(release: str = DEFAULT_RELEASE) -> str:
    """The GitHub source archive of a MassBank-data release tag (the record files of that release)."""
    release = release.strip()
    if not re.fullmatch(r"[0-9A-Za-z._-]+", release):
        raise InputError(f"invalid MassBank release name {release!r} (expected e.g. {DEFAULT_RELEASE})")
    return f"https://github.com/MassBank/MassBank-data/archive/refs/tags/{release}.tar.gz"


#: the URL schemes :func:`download` fetches from
_URL_SCHEMES = ("http", "https", "file")


def url_problem(url: str) -> str | None:
    """Why ``url`` is no URL to download a release archive from, or None when it is one.

    Checked before any folder is created or any connection tried, so that a mistyped ``--url`` is bad input
    (exit 2), not a failed download (exit 5) of a name that no network could resolve.

    Parameters
    ----------
    url : str

    Returns
    -------
    str or None
        A short reason: a scheme other than http, https or file, an http(s) URL without a host, a file URL
        without a path, whitespace or control characters, or what ``urllib.parse`` refuses (a bad port or IPv6
        address).
    """
    import urllib.parse

    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "it contains whitespace or control characters"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - parsed on access: a port that is not a number raises here
    except ValueError as exc:
        return " ".join(str(exc).split()) or "unparsable"
    scheme = parts.scheme.lower()
    if scheme not in _URL_SCHEMES:
        return "expected http://, https:// or file://"
    if scheme != "file" and not parts.hostname:
        return f"no host after {scheme}://"
    if scheme == "file" and not parts.path:
        return "no file path after file://"
    return None


#: bytes a download must receive every ``timeout`` seconds (see :func:`download`)
STALL_BYTES = 64 * 1024


def download(url: str, path: str | os.PathLike, progress: bool = True, timeout: float = 60.0,
             chunk_size: int = 1 << 20) -> Path:
    """Download ``url`` to ``path``, resuming an interrupted download.

    The bytes go to ``path + ".part"``; an existing part is continued with an HTTP ``Range`` request (a server
    that ignores it, answering 200, restarts the file). The part is renamed to ``path`` once complete, so
    ``path`` never holds a truncated file; after a failure the part stays for the next call to resume.

    Raises
    ------
    ResourceError
        The download failed (no network, HTTP error, short read), in one line.
    """
    import http.client
    import urllib.error
    import urllib.request

    path = Path(path)
    part = path.with_name(path.name + ".part")
    done = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": "molpredict"}
    if done:
        headers["Range"] = f"bytes={done}-"
    bar = None
    try:
        request = urllib.request.Request(url, headers=headers)
        try:
            response = urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.code != 416 or not done:
                raise
            # 416: nothing after `done`: the part is the whole file
            os.replace(part, path)
            return path
        with response:
            resumed = response.status == 206
            if done and not resumed:
                done = 0   # the server sent the whole file
            length = response.headers.get("Content-Length")
            total = done + int(length) if length and length.isdigit() else None
            if progress:
                from tqdm import tqdm
                bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, unit_divisor=1024,
                           desc=path.name, file=__import__("sys").stderr)
            with open(part, "ab" if resumed else "wb") as handle:
                received = done
                # the socket timeout fires only when nothing at all arrives: a server that trickles a byte now
                # and then would hold the download forever, so at least STALL_BYTES must come every `timeout` s
                checkpoint, checkpoint_bytes = time.monotonic(), received
                for chunk in iter(lambda: response.read1(chunk_size), b""):
                    handle.write(chunk)
                    received += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                    if received - checkpoint_bytes >= STALL_BYTES:
                        checkpoint, checkpoint_bytes = time.monotonic(), received
                    elif time.monotonic() - checkpoint > timeout:
                        raise OSError(f"stalled: less than {STALL_BYTES // 1024} KiB in {timeout:g} s after "
                                      f"{received} bytes (run again to resume)")
            if total is not None and received < total:
                raise OSError(f"connection closed after {received} of {total} bytes (run again to resume)")
        os.replace(part, path)
        return path
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        if part.is_file() and part.stat().st_size == 0:
            part.unlink()
        reason = getattr(exc, "reason", None) or exc
        kept = f"; {part.stat().st_size} bytes kept in {part} to resume" if part.is_file() else ""
        raise ResourceError(f"could not download {url}: {' '.join(str(reason).split())}{kept}") from None
    finally:
        if bar is not None:
            bar.close()


def _check_archive(path: Path, url: str) -> None:
    """Raise a one-line :class:`InputError` naming ``url`` unless ``path`` starts like a (compressed) tar."""
    with open(path, "rb") as handle:
        head = handle.read(512)
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return
    start = head.lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html", b"<?xml")) or b"<html" in start:
        got = "got an HTML page"   # a login, error or mirror index page served with status 200
    elif not head:
        got = "got an empty file"
    else:
        got = f"got {path.stat().st_size} bytes that are not a .tar.gz"
    raise InputError(f"not a MassBank release archive ({got}; is the URL right?)", path=url)


def fetch_massbank(out_dir: str | os.PathLike, release: str = DEFAULT_RELEASE, keep_archive: bool = False,
                   progress: bool = True, timeout: float = 60.0, url: str | None = None) -> dict:
    """Download a MassBank-data release archive and import it into ``out_dir`` (see :func:`import_massbank`).

    The download resumes where an interrupted one stopped (:func:`download`). ``url`` replaces the GitHub
    release archive (a mirror, or a local server in tests); it must serve a ``.tar.gz`` of record files.
    ``out_dir`` is created if needed; after a failure it is removed again when this call created it and nothing
    is in it (a partial download kept to resume stays).

    Raises
    ------
    ResourceError
        The download failed (no network, unknown release...), in one line.
    InputError
        ``url`` is not a URL to download from (:func:`url_problem`; before anything is created or fetched), or
        the downloaded file is not a readable archive of MassBank records (it is deleted; the error names the
        URL, not the deleted file).
    """
    url = url or release_url(release)
    problem = url_problem(url)
    if problem:  # bad input, before anything is created or fetched
        raise InputError(f"not a URL to download from ({problem}): {url!r}")
    with _output_dir(Path(out_dir)) as out:  # no empty directory left behind (a partial download to resume is)
        return _fetch_into(out, url, release, keep_archive, progress, timeout)


def _fetch_into(out: Path, url: str, release: str, keep_archive: bool, progress: bool, timeout: float) -> dict:
    """The body of :func:`fetch_massbank`, once ``out`` exists."""
    archive = out / f"MassBank-data-{release}.tar.gz"
    try:
        download(url, archive, progress=progress, timeout=timeout)
    except ResourceError as exc:
        raise ResourceError(f"{exc} (no network? download the archive elsewhere and run "
                            f"`molpredict data import-massbank ARCHIVE -o DIR`)") from None
    ok = False
    try:
        _check_archive(archive, url)
        summary = import_massbank(archive, out, progress=progress)
        ok = True
    except InputError as exc:
        if exc.path != str(archive):
            raise
        # the archive is deleted below: name what the user gave instead
        raise InputError(exc.message, path=url, record=exc.record, field=exc.field) from None
    finally:
        if not (keep_archive and ok):
            try:
                os.remove(archive)
            except FileNotFoundError:
                pass
    summary["url"] = summary["source"] = url
    return summary
