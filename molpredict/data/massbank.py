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
Files: ``{train,val,test}_{pos,neg}.mgf``.
"""
from __future__ import annotations

import hashlib
import os
import re
import tarfile
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

from molpredict.errors import InputError, MolpredictError, ResourceError

__all__ = [
    "MassBankRecord",
    "parse_record",
    "iter_record_texts",
    "split_of",
    "import_massbank",
    "release_url",
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
        raise InputError("no ACCESSION line: not a MassBank record", path=source)
    return MassBankRecord(accession, fields, peaks)


def _is_record_name(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".txt") and not base.startswith(".")


def iter_record_texts(path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """``(source name, text)`` of every ``*.txt`` file in a directory tree, ``.zip`` or ``.tar(.gz)`` archive.

    Files are visited in sorted name order (deterministic output). Files that do not start like a MassBank
    record (``ACCESSION:``) are skipped silently (READMEs, lists of contributors...).
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or directory", path=str(path))

    def keep(text: str) -> bool:
        return text.lstrip("\ufeff").startswith("ACCESSION:")

    if path.is_dir():
        for file in sorted(p for p in path.rglob("*.txt") if p.is_file()):
            text = file.read_text(encoding="utf-8", errors="replace")
            if keep(text):
                yield str(file), text
        return
    name = path.name.lower()
    if name.endswith(".zip"):
        try:
            archive = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise InputError(f"not a readable zip archive ({exc})", path=str(path)) from None
        with archive:
            for info in sorted(archive.infolist(), key=lambda i: i.filename):
                if info.is_dir() or not _is_record_name(info.filename):
                    continue
                text = archive.read(info).decode("utf-8", errors="replace")
                if keep(text):
                    yield f"{path}:{info.filename}", text
        return
    if name.endswith((".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")):
        try:
            archive = tarfile.open(path, "r:*")
        except (tarfile.TarError, OSError) as exc:
            raise InputError(f"not a readable tar archive ({exc})", path=str(path)) from None
        with archive:
            # A release tarball is already sorted by path; sorting members would need two passes over gzip.
            members = sorted((m for m in archive.getmembers() if m.isfile() and _is_record_name(m.name)),
                             key=lambda m: m.name)
            for member in members:
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                text = handle.read().decode("utf-8", errors="replace")
                if keep(text):
                    yield f"{path}:{member.name}", text
        return
    if name.endswith(".txt"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not keep(text):
            raise InputError("not a MassBank record file (no ACCESSION: line first)", path=str(path))
        yield str(path), text
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


def import_massbank(path: str | os.PathLike, out_dir: str | os.PathLike,
                    fractions: Iterable[tuple[str, float]] = DEFAULT_FRACTIONS,
                    progress: bool = False) -> dict:
    """Import MassBank records into ``out_dir/{split}_{pos,neg}.mgf``.

    Parameters
    ----------
    path : str or Path
        A directory tree of ``*.txt`` records, a ``.zip`` / ``.tar.gz`` archive of them, or one record file.
    out_dir : str or Path
        Created if needed; existing split files are replaced.
    fractions : iterable of (name, fraction)
        The splits in order with their fractions (summing to 1).
    progress : bool
        Show a tqdm counter on stderr.

    Returns
    -------
    dict
        ``{"files": {name: n_spectra}, "n_records": int, "n_imported": int, "skipped": {reason: count},
        "n_structures": {split: n}, "licenses": {licence: n}}``.
    """
    fractions = tuple((str(n), float(f)) for n, f in fractions)
    total = sum(f for _, f in fractions)
    if abs(total - 1.0) > 1e-9 or any(f < 0 for _, f in fractions):
        raise InputError(f"split fractions must be non-negative and sum to 1, got {total}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [f"{split}_{suffix}.mgf" for split, _ in fractions for suffix in ("pos", "neg")]
    tmp_handles: dict[str, IO[str]] = {}
    counts: Counter = Counter()
    skipped: Counter = Counter()
    licenses: Counter = Counter()
    structures: dict[str, set] = {split: set() for split, _ in fractions}
    n_records = 0
    iterator: Iterable = iter_record_texts(path)
    if progress:
        from tqdm import tqdm
        iterator = tqdm(iterator, desc="MassBank records", unit=" files", file=__import__("sys").stderr)
    try:
        for name in names:
            tmp_handles[name] = open(out / f".{name}.tmp", "w", encoding="utf-8")
        for source, text in iterator:
            for chunk in _split_records(text):
                n_records += 1
                try:
                    record = parse_record(chunk, source)
                except InputError as exc:
                    skipped[f"unparsable record ({exc.message.split(':')[-1].strip()})"] += 1
                    continue
                result = check_record(record)
                if isinstance(result, str):
                    skipped[result] += 1
                    continue
                split = split_of(result.inchikey14, fractions)
                ion_mode, entry = record_to_mgf(record, result)
                name = f"{split}_{_MODE_SUFFIX[ion_mode]}.mgf"
                tmp_handles[name].write(entry)
                counts[name] += 1
                structures[split].add(result.inchikey14)
                licenses[_clean(record.first("LICENSE")) or "unknown"] += 1
        for name, handle in tmp_handles.items():
            handle.close()
            os.replace(out / f".{name}.tmp", out / name)
    finally:
        for name, handle in tmp_handles.items():
            if not handle.closed:
                handle.close()
            try:
                os.remove(out / f".{name}.tmp")
            except FileNotFoundError:
                pass
    if n_records == 0:
        raise InputError("no MassBank record files found (expected *.txt files starting with ACCESSION:)",
                         path=str(path))
    return {"files": {name: counts.get(name, 0) for name in names}, "n_records": n_records,
            "n_imported": sum(counts.values()), "skipped": dict(skipped.most_common()),
            "n_structures": {k: len(v) for k, v in structures.items()}, "licenses": dict(licenses.most_common()),
            "split": {"hash": "sha256(InChIKey first block), first 8 bytes big-endian / 2**64",
                      "fractions": dict(fractions)}}


def release_url(release: str = DEFAULT_RELEASE) -> str:
    """The GitHub source archive of a MassBank-data release tag (the record files of that release)."""
    release = release.strip()
    if not re.fullmatch(r"[0-9A-Za-z._-]+", release):
        raise InputError(f"invalid MassBank release name {release!r} (expected e.g. {DEFAULT_RELEASE})")
    return f"https://github.com/MassBank/MassBank-data/archive/refs/tags/{release}.tar.gz"


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
                for chunk in iter(lambda: response.read(chunk_size), b""):
                    handle.write(chunk)
                    received += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
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


def fetch_massbank(out_dir: str | os.PathLike, release: str = DEFAULT_RELEASE, keep_archive: bool = False,
                   progress: bool = True, timeout: float = 60.0, url: str | None = None) -> dict:
    """Download a MassBank-data release archive and import it into ``out_dir`` (see :func:`import_massbank`).

    The download resumes where an interrupted one stopped (:func:`download`). ``url`` replaces the GitHub
    release archive (a mirror, or a local server in tests); it must serve a ``.tar.gz`` of record files.

    Raises
    ------
    ResourceError
        The download failed (no network, unknown release...), in one line.
    InputError
        The downloaded file is not a readable archive of MassBank records (it is deleted).
    """
    url = url or release_url(release)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"MassBank-data-{release}.tar.gz"
    try:
        download(url, archive, progress=progress, timeout=timeout)
    except ResourceError as exc:
        raise ResourceError(f"{exc} (no network? download the archive elsewhere and run "
                            f"`molpredict data import-massbank ARCHIVE -o DIR`)") from None
    ok = False
    try:
        summary = import_massbank(archive, out, progress=progress)
        ok = True
    finally:
        if not (keep_archive and ok):
            try:
                os.remove(archive)
            except FileNotFoundError:
                pass
    summary["url"] = url
    return summary
