"""The HTML report of an identification run: one self-contained file with structures, spectra and an index.

A :class:`Report` collects, query by query, the output rows of :meth:`molpredict.identification.identify.Identifier.run` (or of
a results file) and the spectra they came from, plus the skipped spectra and the run's parameters, and writes one
HTML file: inline CSS, inline vanilla JavaScript, inline SVG; nothing is fetched (no network, fonts or scripts).

What is stored: each distinct candidate structure once (SMILES, InChIKey, formula, name and its RDKit drawing,
``rdMolDraw2D.MolDraw2DSVG``, compacted), and per query the top-k candidates as references into that table with
their scores and margins, the spectrum's most intense peaks (m/z, relative intensity in 0..1000), the precursor
m/z and, when :mod:`molpredict.chem.fragments` is available, the peaks explained by the top candidate with their
formulas. The page renders lazily from this data: the index table shows one page of queries at a time (sortable,
filterable) and a query's detail (stick plot and candidate cards) is drawn when it is opened, so a report of
10,000 queries stays responsive. Above ``gzip_above`` bytes of JSON the data is stored gzip-compressed (base64)
and inflated by the browser (``DecompressionStream``); smaller reports keep plain JSON, readable by any tool.
"""
from __future__ import annotations

import base64
import datetime as _dt
import gzip
import html
import json
import math
import platform
import re
import warnings
from collections import deque
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from molpredict.errors import InputError
from molpredict.io.results import as_written

__all__ = ["ReportOptions", "Report", "draw_molecule_svg", "compact_svg", "decode_report_data", "run_parameters",
           "build_report_from_files", "query_groups", "versions", "reason_groups", "CANDIDATE_EXTRA_COLUMNS"]

#: optional numeric output columns shown per candidate when the results have them
CANDIDATE_EXTRA_COLUMNS = ("probability", "spectrum_score", "prior_score", "fragment_score")
_DATA_ELEMENT_ID = "report-data"
#: how the skipped table's reason starts for a record its reader could not read (``api.skipped_entries``)
_UNREADABLE = "unreadable record"


@dataclass
class ReportOptions:
    """What the report keeps.

    Attributes
    ----------
    top_k : int
        Candidates drawn per query (the first ``top_k`` rows of each query).
    max_peaks : int
        Most intense peaks kept per spectrum for the stick plot.
    title : str
    gzip_above : int
        Store the data gzip-compressed once its JSON exceeds this many bytes (0: always; -1: never).
    explain : bool
        Annotate the peaks the top candidate explains (:meth:`molpredict.chem.fragments.FragmentScorer.explain_peaks`,
        default settings) when that module is available.
    drawing_size : (int, int)
        Width and height of the structure drawings (the page scales them).
    """

    top_k: int = 5
    max_peaks: int = 200
    title: str = "molpredict identification report"
    gzip_above: int = 1 << 20
    explain: bool = True
    drawing_size: tuple[int, int] = (240, 180)


# -- structure drawings ---------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d+\.\d+")
_PATH = re.compile(r"<path(?: class='[^']*')? d='([^']*)' style='([^']*)'\s*/>")
_TEXT = re.compile(r"<text x='([^']*)' y='([^']*)'(?: class='[^']*')? style='([^']*)'\s*>([^<]*)</text>")
_ELLIPSE = re.compile(r"<ellipse [^>]*/>")


def _style(style: str) -> dict[str, str]:
    return dict(part.split(":", 1) for part in style.strip(";").split(";") if ":" in part)


def _round(text: str) -> str:
    def one(match: re.Match) -> str:
        value = round(float(match.group(0)), 1)
        return f"{value:.1f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return _NUMBER.sub(one, text)


def compact_svg(svg: str) -> str:
    """A smaller equivalent of an RDKit ``MolDraw2DSVG`` drawing.

    Drops the XML prolog, the header comment, the background rectangle and the per-atom/bond classes; merges the
    stroked (unfilled) paths of one colour and width into a single path; moves the shared text style to the root;
    rounds coordinates to 0.1 px. The result is a standalone ``<svg>`` element with a ``viewBox`` and no fixed
    size (the page scales it) and no ``xmlns`` (an ``<svg>`` inside HTML needs none, and the page then names no
    URL at all). Elements it does not recognise are kept as they are.
    """
    head = re.search(r"<svg[^>]*viewBox='([^']*)'[^>]*>", svg)
    if head is None:
        return svg
    body = svg[head.end():]
    body = re.sub(r"<!--.*?-->", "", body, flags=re.S)
    body = re.sub(r"<rect [^>]*/>", "", body, count=1)   # the background
    body = body.replace("</svg>", "")
    strokes: dict[tuple[str, str], list[str]] = {}
    others: list[str] = []

    def path(match: re.Match) -> str:
        d, style = match.group(1), _style(match.group(2))
        if style.get("fill", "none") == "none":
            key = (style.get("stroke", "#000000"), style.get("stroke-width", "1px").removesuffix("px"))
            strokes.setdefault(key, []).append(_round(d).replace(" L ", "L").replace("M ", "M").replace(",", " "))
        else:
            fill = style.get("fill", "#000000")
            stroke = style.get("stroke", "none")
            others.append(f"<path d='{_round(d)}' fill='{fill}' stroke='{stroke}'/>")
        return ""

    def text(match: re.Match) -> str:
        x, y, style, content = match.groups()
        s = _style(style)
        attrs = f"x='{_round(x)}' y='{_round(y)}'"
        if s.get("fill", "#000000") != "#000000":
            attrs += f" fill='{s['fill']}'"
        if s.get("text-anchor", "start") != "start":
            attrs += f" text-anchor='{s['text-anchor']}'"
        size = s.get("font-size", "").removesuffix("px")
        if size:
            attrs += f" font-size='{_round(size)}'"
        others.append(f"<text {attrs}>{content}</text>")
        return ""

    rest = _TEXT.sub(text, _PATH.sub(path, body))
    rest = _ELLIPSE.sub(lambda m: others.append(_round(m.group(0))) or "", rest)
    leftover = rest.strip()
    parts = [f"<path d='{' '.join(ds)}' stroke='{colour}' stroke-width='{width}'/>"
             for (colour, width), ds in strokes.items()]
    return (f"<svg viewBox='{head.group(1)}' fill='none' "
            f"stroke-linecap='round' font-family='sans-serif'><g>{''.join(parts)}</g>"
            f"<g stroke='none' fill='#000000'>{''.join(others)}</g>{leftover}</svg>")


def draw_molecule_svg(smiles: str, size: tuple[int, int] = (240, 180)) -> str:
    """The RDKit 2D drawing of ``smiles`` as a compact SVG (:func:`compact_svg`); a placeholder when RDKit
    cannot parse the SMILES."""
    from rdkit import Chem, rdBase
    from rdkit.Chem.Draw import rdMolDraw2D

    width, height = size
    # BlockLogs restores the logging state it found: re-enabling RDKit's logs here switched them back on for the
    # whole process, which molpredict.chem.molecules silences at import
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles) if smiles else None
    placeholder = (f"<svg viewBox='0 0 {width} {height}'><text x='50%' y='50%' text-anchor='middle' "
                   f"font-family='sans-serif' font-size='14' fill='#888'>no drawing</text></svg>")
    if mol is None:
        return placeholder
    drawer = rdMolDraw2D.MolDraw2DSVG(width, height, -1, -1, True)  # True: <text> labels, not glyph paths
    options = drawer.drawOptions()
    options.clearBackground = False
    options.bondLineWidth = 1.5
    try:
        rdMolDraw2D.PrepareAndDrawMolecule(drawer, mol)
    except (RuntimeError, ValueError):   # a structure RDKit parses but cannot lay out
        return placeholder
    drawer.FinishDrawing()
    return compact_svg(drawer.GetDrawingText())


# -- data collection -----------------------------------------------------------------------------------------

def _number(value: Any) -> float | None:
    """A finite float rounded to 5 significant digits, else None (JSON null)."""
    if value is None or value == "":
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(x):
        return None
    return float(f"{x:.5g}")


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _peaks(spectrum: Any, max_peaks: int) -> tuple[list[float], list[int]]:
    """The ``max_peaks`` most intense peaks, by m/z: (m/z rounded to 1e-4, intensity relative to the highest
    peak in 0..1000)."""
    mz = np.asarray(spectrum.mz, dtype=np.float64)
    intensity = np.asarray(spectrum.intensities, dtype=np.float64)
    keep = np.isfinite(mz) & np.isfinite(intensity) & (intensity > 0)
    mz, intensity = mz[keep], intensity[keep]
    if mz.size == 0:
        return [], []
    if mz.size > max_peaks:
        top = np.argsort(-intensity, kind="stable")[:max_peaks]
        mz, intensity = mz[top], intensity[top]
    order = np.argsort(mz, kind="stable")
    rel = np.rint(1000.0 * intensity[order] / intensity.max()).astype(int)
    return [round(float(x), 4) for x in mz[order]], [int(v) for v in rel]


def _fragment_explainer() -> Any:
    """A callable ``(spectrum, molecule, adduct) -> annotations`` from :mod:`molpredict.chem.fragments`
    (``FragmentScorer().explain_peaks``), or None when that module is not available."""
    import importlib

    try:
        fragments = importlib.import_module("molpredict.chem.fragments")  # in-silico fragmentation; optional here
    except ImportError:
        return None
    function = getattr(fragments, "explain_peaks", None)
    if function is not None:
        return function
    scorer_class = getattr(fragments, "FragmentScorer", None)
    return None if scorer_class is None else scorer_class().explain_peaks


def _explained_peaks(explain: Any, spectrum: Any, smiles: str, adduct: str) -> list[list[Any]] | None:
    """``[[m/z, relative intensity 0..1000, ion formula], ...]`` of the peaks the structure explains (``explain``
    from :func:`_fragment_explainer`), or None when annotation is not possible for this query."""
    from molpredict.errors import MolpredictError
    from molpredict.chem.molecules import Molecule

    try:
        molecule = Molecule.from_smiles(smiles)
        annotations = explain(spectrum, molecule, adduct or spectrum.adduct or None)
    except (MolpredictError, ValueError, RuntimeError):   # RDKit's errors: the page says "not available"
        return None
    if not annotations:
        return []
    top = float(np.max(spectrum.intensities)) if len(spectrum.intensities) else 1.0
    out = []
    for a in annotations:
        get = a.get if isinstance(a, dict) else (lambda key, _a=a: getattr(_a, key, None))
        mz, intensity, formula = get("mz"), get("intensity"), get("formula")
        if mz is None or not formula:
            continue
        rel = int(round(1000.0 * float(intensity) / top)) if intensity is not None and top > 0 else None
        out.append([round(float(mz), 4), rel, str(formula)])
    return out


class Report:
    """Collects an identification run for :meth:`write`.

    Feed it spectra (:meth:`add_spectrum`, or wrap the spectra iterator with :meth:`watch`) and output rows
    (:meth:`add_row`, in the order :meth:`Identifier.run` yields them, or a whole query with :meth:`add_query`);
    a query's rows are matched to the first not-yet-matched spectrum with the same id. Add the skipped spectra
    (:meth:`add_skipped`) and the run's parameters (:attr:`parameters`), then :meth:`write`.

    Parameters
    ----------
    options : ReportOptions, optional
    """

    def __init__(self, options: ReportOptions | None = None) -> None:
        self.options = options or ReportOptions()
        self.parameters: dict[str, Any] = {}
        self.queries: list[dict[str, Any]] = []
        self.skipped: list[tuple[str, str, Any, str]] = []
        self._molecules: dict[str, int] = {}
        self._molecule_rows: list[list[Any]] = []
        self._pending: dict[str, deque] = {}
        self._group: list[dict[str, Any]] = []
        self._extra_columns: list[str] = []
        self._files: dict[str, int] = {}
        self._explain: Any = None   # the fragment annotator, looked up on first use (False: not available)
        self.drawing_count = 0

    # -- input -----------------------------------------------------------------------------------------------
    def add_spectrum(self, spectrum: Any) -> None:
        """Remember a spectrum until the rows of its query arrive."""
        # keyed as a results file writes the id (a TITLE's tab is a space there), so that rows read back match
        self._pending.setdefault(as_written(str(spectrum.id)), deque()).append(spectrum)

    def watch(self, spectra: Iterable[Any]) -> Iterator[Any]:
        """Yield ``spectra`` unchanged, remembering each (:meth:`add_spectrum`)."""
        for spectrum in spectra:
            self.add_spectrum(spectrum)
            yield spectrum

    def add_row(self, row: dict[str, Any]) -> None:
        """One output row; rows of one query are consecutive, rank 1 first."""
        if self._group and (str(row.get("query_id")) != str(self._group[0].get("query_id"))
                            or int(row.get("rank") or 0) <= int(self._group[-1].get("rank") or 0)):
            self._flush()
        self._group.append(row)

    def add_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.add_row(row)
        self._flush()

    def add_skipped(self, query_id: str, reason: str, file: str = "", record: Any = None) -> None:
        self.skipped.append((_text(query_id), _text(file), record, _text(reason)))

    def _flush(self) -> None:
        if self._group:
            rows, self._group = self._group, []
            self.add_query(rows)

    def _molecule(self, row: dict[str, Any]) -> int:
        smiles = _text(row.get("smiles"))
        index = self._molecules.get(smiles)
        if index is None:
            index = self._molecules[smiles] = len(self._molecule_rows)
            self._molecule_rows.append([smiles, _text(row.get("inchikey")), _text(row.get("formula")),
                                        _text(row.get("name")), draw_molecule_svg(smiles, self.options.drawing_size)])
            self.drawing_count += 1
        elif not self._molecule_rows[index][3] and row.get("name"):
            self._molecule_rows[index][3] = _text(row.get("name"))
        return index

    def add_query(self, rows: Sequence[dict[str, Any]], spectrum: Any = None) -> None:
        """One identified query: its output rows (rank order) and, when not given, the matching spectrum that
        :meth:`add_spectrum` remembered."""
        if not rows:
            return
        query_id = _text(rows[0].get("query_id"))
        if spectrum is None:
            key = as_written(query_id)
            waiting = self._pending.get(key)
            if waiting:
                spectrum = waiting.popleft()
                if not waiting:
                    del self._pending[key]
        for column in CANDIDATE_EXTRA_COLUMNS:
            if column not in self._extra_columns and any(_number(r.get(column)) is not None for r in rows):
                self._extra_columns.append(column)
        top_rows = list(rows[:self.options.top_k])
        candidates = []
        for position, row in enumerate(top_rows, start=1):
            extras: dict[str, Any] = {c: _number(row.get(c)) for c in CANDIDATE_EXTRA_COLUMNS
                                      if _number(row.get(c)) is not None}
            rank = _number(row.get("rank"))
            if rank is not None and rank != position:   # rows missing from the results: the card shows the rank
                extras["rank"] = int(rank) if rank == int(rank) else rank
            entry = [self._molecule(row), _number(row.get("score")), _number(row.get("confidence")),
                     _text(row.get("adduct"))]
            if extras:
                entry.append(extras)
            candidates.append(entry)
        n_candidates = _number(rows[0].get("n_candidates"))
        query: dict[str, Any] = {"id": query_id, "n": None if n_candidates is None else int(n_candidates),
                                 "c": candidates}
        probability = _number(rows[0].get("probability"))
        if probability is not None:
            query["p"] = probability
        properties = [[c[len("prop_"):], _number(rows[0].get(c)), _number(rows[0].get(c + "_low")),
                       _number(rows[0].get(c + "_high"))] for c in rows[0]
                      if c.startswith("prop_") and not c.endswith(("_low", "_high")) and _number(rows[0].get(c))
                      is not None]
        if properties:  # identify --properties: the query's predicted properties, median and interval
            query["props"] = properties
        file, record = _text(rows[0].get("file")), _text(rows[0].get("record"))
        if spectrum is not None:
            file = file or _text(getattr(spectrum, "file", None))
            record = record or _text(getattr(spectrum, "record", None))
        if file:
            query["f"] = self._files.setdefault(file, len(self._files))
        if record:
            query["record"] = record.removesuffix(".0")
        if spectrum is not None:
            meta = getattr(spectrum, "metadata", {}) or {}
            query["name"] = _text(meta.get("compound_name") or meta.get("name"))
            precursor = spectrum.precursor_mz
            query["mz"] = round(float(precursor), 4) if precursor and math.isfinite(precursor) else None
            query["adduct"] = _text(spectrum.adduct)
            query["mode"] = _text(spectrum.ion_mode)
            query["pk"] = list(_peaks(spectrum, self.options.max_peaks))
            true_key = _text(meta.get("inchikey"))[:14]
            if true_key:
                query["true"] = true_key
                ranks = [int(_number(r.get("rank")) or i + 1) for i, r in enumerate(rows)
                         if _text(r.get("inchikey"))[:14] == true_key]
                query["tr"] = ranks[0] if ranks else None
                if not ranks:   # not among the query's rows: ranked below the last of them, or no candidate
                    query["nr"] = max([int(_number(r.get("rank")) or i + 1) for i, r in enumerate(rows)])
            if self.options.explain and top_rows:
                if self._explain is None:
                    self._explain = _fragment_explainer() or False
                if self._explain:
                    explained = _explained_peaks(self._explain, spectrum, _text(top_rows[0].get("smiles")),
                                                 _text(top_rows[0].get("adduct")))
                    if explained is not None:
                        query["ex"] = explained
        self.queries.append(query)

    def finish(self) -> None:
        """Flush the last query's rows (called by :meth:`data`)."""
        self._flush()

    @property
    def unmatched_spectra(self) -> list[Any]:
        """Spectra given to :meth:`add_spectrum` that no query's rows claimed (usually the skipped ones)."""
        return [s for waiting in self._pending.values() for s in waiting]

    # -- output ----------------------------------------------------------------------------------------------
    def data(self) -> dict[str, Any]:
        """The JSON document the page renders (see the module docstring)."""
        self.finish()
        return {"version": 1, "title": self.options.title, "top_k": self.options.top_k,
                "extra": self._extra_columns,
                "molecules": self._molecule_rows, "files": list(self._files), "queries": self.queries,
                "n_skipped": len(self.skipped)}

    def html(self) -> str:
        """The complete report page."""
        data = json.dumps(self.data(), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        limit = self.options.gzip_above
        if limit >= 0 and len(data.encode("utf-8")) > limit:
            payload = base64.b64encode(gzip.compress(data.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")
            encoding = "gzip-base64"
        else:
            payload = data.replace("<", "\\u003c")   # no "</script>" or "<!--" inside the script element
            encoding = "json"
        template = resources.files("molpredict.report").joinpath("templates/report.html").read_text(encoding="utf-8")
        parts = {"title": html.escape(self.options.title), "summary": self._summary_html(),
                 "parameters": self._parameters_html(), "skipped": self._skipped_html(), "encoding": encoding,
                 "data": payload}
        # one pass, so that a placeholder-like text inside a part is never substituted
        return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], template)

    def write(self, path: str | Path) -> int:
        """Write the page to ``path``; returns its size in bytes."""
        text = self.html()
        from molpredict.atomic import atomic_write

        try:
            with atomic_write(path) as handle:
                handle.write(text)
        except OSError as exc:   # name the page, not the temporary file beside it that atomic_write opened
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        return len(text.encode("utf-8"))

    # -- static parts ------------------------------------------------------------------------------------------
    def _summary_html(self) -> str:
        n_identified = len(self.queries)
        n_true = sum(1 for q in self.queries if "true" in q)
        parts = [f"<b>{n_identified}</b> identified", f"<b>{len(self.skipped)}</b> skipped",
                 f"<b>{len(self._molecule_rows)}</b> distinct structures drawn"]
        if n_true:
            first = sum(1 for q in self.queries if q.get("tr") == 1)
            parts.append(f"true structure (from the spectra's INCHIKEY) ranked first for <b>{first}</b> of {n_true}")
        return " &middot; ".join(parts)

    def _parameters_html(self) -> str:
        params = dict(self.parameters)
        params.setdefault("created", _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
        params.setdefault("versions", versions())
        rows = []
        for key, value in params.items():
            if isinstance(value, (dict, list)):
                cell = f"<pre>{html.escape(json.dumps(value, indent=1, default=str))}</pre>"
            else:
                cell = html.escape(_text(value))
            rows.append(f"<tr><th>{html.escape(str(key))}</th><td>{cell}</td></tr>")
        return "<table class='params'>" + "".join(rows) + "</table>"

    def _skipped_html(self) -> str:
        if not self.skipped:
            return "<p>No spectrum was skipped.</p>"
        # grouped as identify's summary on stderr groups them; the table below keeps each query's own reason
        groups = reason_groups(self.skipped, lambda entry: entry[-1])
        head = "<ul>" + "".join(f"<li>{len(group)} &times; {html.escape(label)}</li>" for label, group in groups) \
            + "</ul>"
        rows = "".join(f"<tr><td>{html.escape(q)}</td><td>{html.escape(f)}</td>"
                       f"<td>{'' if rec is None else html.escape(str(rec))}</td><td>{html.escape(reason)}</td></tr>"
                       for q, f, rec, reason in self.skipped)
        return (head + "<table class='skipped'><thead><tr><th>query</th><th>file</th><th>record</th><th>reason</th>"
                "</tr></thead><tbody>" + rows + "</tbody></table>")


#: a skip reason's per-query detail: the formula or mass window whose candidates were looked up
_REASON_DETAIL = re.compile(r"^(?P<reason>.+) \((?P<kind>formula|mass within) (?P<value>[^()]+)\)$")


def reason_groups(entries: Iterable[Any], reason_of: Any) -> list[tuple[str, list]]:
    """``(label, entries)`` per skip reason, most frequent first (ties in first-seen order). Reasons that differ
    only by their query's formula or mass window (``no candidates in the library (formula C6H6O)``) are one group:
    a small library against a large file gives one such reason per formula, a list nobody reads. A group of one
    reason is labelled with it; of several, with how many formulas / mass windows it spans
    (``no candidates in the library (8 formulas)``). Identify's skip summary on stderr and this page's share it."""
    groups: dict[str, list] = {}
    details: dict[str, dict[str, set[str]]] = {}
    reasons: dict[str, set[str]] = {}
    for entry in entries:
        reason = reason_of(entry)
        match = _REASON_DETAIL.match(reason)
        key = match["reason"] if match else reason
        groups.setdefault(key, []).append(entry)
        reasons.setdefault(key, set()).add(reason)
        if match:
            details.setdefault(key, {}).setdefault(match["kind"], set()).add(match["value"])
    out = []
    for key, group in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        if len(reasons[key]) == 1:
            label = next(iter(reasons[key]))
        else:
            kinds = details[key]
            spans = [f"{len(kinds[kind])} {noun}{'s' if len(kinds[kind]) > 1 else ''}"
                     for kind, noun in (("formula", "formula"), ("mass within", "mass window")) if kind in kinds]
            label = f"{key} ({', '.join(spans)})"
        out.append((label, group))
    return out


def versions() -> dict[str, str]:
    """molpredict, Python, numpy, RDKit and torch versions (for the parameters table)."""
    from molpredict import __version__

    out = {"molpredict": __version__, "python": platform.python_version(), "numpy": np.__version__}
    try:
        import rdkit
        out["rdkit"] = rdkit.__version__
    except ImportError:  # pragma: no cover - rdkit is a dependency
        pass
    try:
        import torch
        out["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


# -- reading it back -------------------------------------------------------------------------------------------

def decode_report_data(page: str) -> dict[str, Any]:
    """The JSON document embedded in a report page (plain or gzip-base64), e.g. for tests and tools.

    Raises
    ------
    ValueError
        The page holds no report data element.
    """
    match = re.search(rf"<script type=\"application/json\" id=\"{_DATA_ELEMENT_ID}\" data-encoding=\"([a-z0-9-]+)\">"
                      r"(.*?)</script>", page, flags=re.S)
    if match is None:
        raise ValueError("no report data in the page")
    encoding, payload = match.group(1), match.group(2).strip()
    if encoding == "gzip-base64":
        return json.loads(gzip.decompress(base64.b64decode(payload)).decode("utf-8"))
    return json.loads(payload)


# -- whole runs ------------------------------------------------------------------------------------------------

def _rank(row: dict[str, Any]) -> float | None:
    return _number(row.get("rank"))


def query_groups(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows of a results file as queries: each query's rows together in rank order, the queries in the order
    of their first row.

    ``identify`` writes a query's rows together, rank 1 first, and numbers a repeated spectrum id (``ID#2``); a
    file sorted by another column (by score, in a spreadsheet) has them apart. A row continues the query of the
    row before it when it has the same id and a higher rank (as :meth:`Report.add_row` reads identify's rows), else
    joins the first query of its id without a row of its rank, else starts a query: two queries under one id (a
    file whose ids were not numbered) stay two.
    """
    queries: dict[str, list[tuple[list[dict[str, Any]], set]]] = {}
    order: list[list[dict[str, Any]]] = []
    previous: tuple[str, float | None, tuple[list[dict[str, Any]], set]] | None = None
    for row in rows:
        key = _text(row.get("query_id"))
        rank = _rank(row)
        same_id = queries.setdefault(key, [])
        if previous is not None and previous[0] == key and (rank is None or previous[1] is None or rank > previous[1]):
            entry = previous[2]
        else:
            entry = next((e for e in same_id if rank is None or rank not in e[1]), None)
            if entry is None:
                entry = ([], set())
                same_id.append(entry)
                order.append(entry[0])
        entry[0].append(row)
        if rank is not None:
            entry[1].add(rank)
        previous = (key, rank, entry)
    return [sorted(group, key=lambda r: (_rank(r) is None, _rank(r) or 0.0)) for group in order]


def run_parameters(bundle: Any = None, library: str | None = None, n_library: int | None = None,
                   options: Any = None, spectra: str | None = None, **extra: Any) -> dict[str, Any]:
    """The parameters table of a run: the model (path, per ion mode its registry name and components), the
    library, the candidate window (``by``, ``ppm``, ``top_k``, ``sources`` of an ``IdentifyOptions``), the
    spectra file and anything in ``extra``."""
    out: dict[str, Any] = {}
    if spectra:
        out["spectra"] = str(spectra)
    if bundle is not None:
        out["model"] = str(bundle.path) if getattr(bundle, "path", None) else "(in memory)"
        for mode, sub in bundle.models.items():
            meta = sub.metadata
            out[f"model ({mode})"] = {k: meta.get(k) for k in ("model", "params", "created") if meta.get(k)}
    if library:
        out["library"] = str(library) + ("" if n_library is None else f" ({n_library} structures)")
    if options is not None:
        by = options.by or "formula when the query has one, else mass"
        out["candidates"] = (f"by {by}" + (f"; mass window {options.ppm:g} ppm" if options.by != "formula" else "")
                             + (f"; sources {', '.join(options.sources)}" if options.sources else "")
                             + f"; top {options.top_k} rows per query")
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def build_report_from_files(results: str | Path, spectra: str | Path, output: str | Path, *,
                            skipped_path: str | Path | None = None, top_k: int = 5, title: str | None = None,
                            model_path: str | None = None, library: str | None = None,
                            fragments: bool = True) -> tuple[int, Report]:
    """``molpredict report``: the page for a results file and the spectra file it was computed from.

    Spectra are matched to the results by query id, a repeated id numbered as ``identify`` numbers it
    (``ID#2``, ...). Spectra without rows are listed as skipped, with the reason from ``skipped_path`` when it names them.

    Returns
    -------
    (int, Report)
        The page's size in bytes and the report.
    """
    from molpredict.identification.identify import unique_ids
    from molpredict.io.results import read_result_rows, read_skipped
    from molpredict.io import SkipReport, read_spectra

    options = ReportOptions(top_k=top_k, explain=fragments)
    if title:
        options.title = title
    report = Report(options)
    unreadable = SkipReport()
    for spectrum in unique_ids(read_spectra(spectra, report=unreadable)):   # the ids identify gave the queries
        report.add_spectrum(spectrum)
    for rows in query_groups(read_result_rows(results)):
        report.add_query(rows)
    report.finish()
    orphans = sum(1 for q in report.queries if "pk" not in q)
    if report.queries and orphans == len(report.queries):  # e.g. the results of another spectra file
        raise InputError(f"none of the {orphans} queries of {results} is a spectrum of this file (the query ids "
                         f"differ: were the results computed from it?)", path=str(spectra))
    if orphans:
        warnings.warn(f"{results}: {orphans} of {len(report.queries)} queries have no spectrum in {spectra} "
                      f"(drawn without one)", UserWarning, stacklevel=2)
    known = read_skipped(skipped_path) if skipped_path else []
    reasons: dict[str, deque] = {}
    for query_id, file, record, reason in known:
        report.add_skipped(query_id, reason, file, record or None)
        # An unreadable record is no spectrum read here, so its row (named by the record's id) must not stand for
        # a spectrum of the same id that the results lack.
        if query_id and not reason.startswith(_UNREADABLE):
            reasons.setdefault(query_id, deque()).append(reason)
    if not known:
        for entry in unreadable:
            report.add_skipped(entry.spectrum_id or "", f"{_UNREADABLE}: {entry.reason}", entry.path, entry.record)
    for spectrum in report.unmatched_spectra:
        waiting = reasons.get(as_written(str(spectrum.id)))
        if waiting:
            waiting.popleft()   # listed with its reason already
            continue
        report.add_skipped(str(spectrum.id), f"no rows in {Path(results).name}")
    bundle = None
    if model_path:
        from molpredict.modelfile import ModelBundle
        bundle = ModelBundle.load(model_path)
    report.parameters = run_parameters(bundle, library, spectra=str(spectra), results=str(results))
    size = report.write(output)
    return size, report
