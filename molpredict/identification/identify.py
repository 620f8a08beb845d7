"""Identification: rank candidate structures for each query spectrum with a model bundle.

For each spectrum, in input order:

1. Its ion mode picks the bundle's model (a spectrum whose mode has no model is skipped with that reason); the
   model's cleaning pipeline is applied (no peaks left: skipped).
2. Candidates come from a :class:`~molpredict.identification.candidate_sources.CandidateSource`: from a library by molecular formula (the spectrum's
   ``FORMULA`` or a ``--formulas`` hint; the default whenever a formula is known) or by neutral mass within a
   ppm window of the precursor m/z. When the spectrum has no usable adduct (missing, unknown, or of the other
   polarity), every default adduct of its ion mode is tried and the candidate sets are unioned; each candidate
   reports the first adduct, in the default order (most common first), that explains its mass.
3. Scoring (:mod:`molpredict.identification.scoring`) is a dot product between the query's predicted coordinates and the
   candidates' coordinates, which come from the on-disk cache (computed once per model and molecule). Spectra
   go through in blocks (:func:`identify_block`, on an executor); inside a block the coordinates of the union
   of the candidates are fetched once, so memory stays bounded by the block, never n_queries x n_library.
4. Each query's raw model scores become its output rows (:func:`rank_rows`).

Ranking and ties: candidates are ordered by score (descending), ties broken by InChIKey (ascending), so the
same inputs always give the same table.

Text queries (a ``text`` model, see :mod:`molpredict.io.text_pairs`): every description is ranked against the whole
library (or the rows of the ``--source`` filter), with no formula or mass selection; :meth:`Identifier.run_text`
scores blocks of queries against the library in chunks (:func:`~molpredict.identification.scoring.shared_candidate_scores`), so memory stays
bounded by a block of queries x the library, and the candidate coordinates still come from the on-disk cache.

Confidence: the score margin. For the top candidate it is its lead over the runner-up (>= 0; larger means a
clearer decision); for every other candidate it is its (negative) gap to the top candidate. It is empty when a
query has a single candidate. Scores are inner products in the output kernel's feature space, comparable
within one model.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from molpredict.identification.candidate_sources import CandidateSource, formula_parses, hint_mismatch
from molpredict.engine.decoding import margins, rank_candidates
from molpredict.errors import InputError, MolpredictError
from molpredict.identification.evidence import Evidence, QueryScores, check_scoring
from molpredict.identification.fusion import FRAGMENTS, PRIOR, SPECTRUM
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.identification.scoring import (CandidateCoordinates, Executor, InProcessExecutor, Query, WorkerState, chunked,
                      bundle_stamp, content_token, library_file, load_bundle_once, load_library_once,
                      require_bundle_path, resolved_cache_root, score_queries, scored, shared_candidate_scores)
from molpredict.spectra.record import spectrum_ion_mode

__all__ = [
    "IdentifyOptions",
    "Skipped",
    "Identifier",
    "IdentifiedBlock",
    "IdentifierState",
    "identify_block",
    "rank_rows",
    "unique_ids",
    "ORIGINAL_ID",
    "read_formula_hints",
    "normalized_hint",
]


#: metadata key of a spectrum's id as read, when the run renamed it to keep query ids unique
ORIGINAL_ID = "original_id"


@dataclass
class IdentifyOptions:
    """Candidate selection and output settings.

    Attributes
    ----------
    by : {"formula", "mass"} or None
        None: by formula when the query has one, else by mass.
    ppm : float
        Mass window half-width (relative, parts per million of the neutral mass).
    precision_window : bool
        Widen the mass window to what the precursor m/z's written precision allows
        (:func:`~molpredict.identification.candidate_sources.precursor_tolerance`: half a unit for a precursor written with
        two decimals or fewer).
    sources : sequence of str or None
        Keep only library rows of these sources.
    top_k : int
        Rows per query in the output.
    formulas : dict or None
        Query id -> formula hints (override the spectrum's FORMULA).
    block_queries : int
        Queries per scoring block.
    max_block_candidates : int
        A block is flushed early once the union of its candidates reaches this size (bounds memory:
        the block holds at most this many candidate coordinate rows).
    prior : bool
        ``--prior on|off``: fuse the bundle's structure prior into the score (when the bundle has one).
    properties : PropertyBundle or None
        ``--properties MODEL``: add each query's predicted properties (median and interval) to its rows, columns
        :func:`molpredict.properties.pipeline.output_columns`.
    formula_per_candidate : bool
        A spectrum without a formula, scored by a model that reads formulas, is encoded once per (candidate
        formula, adduct) of its candidates, each candidate scored with its own (issue 19).
    """

    by: str | None = None
    ppm: float = 10.0
    precision_window: bool = True
    sources: Sequence[str] | None = None
    top_k: int = 10
    formulas: dict[str, str] | None = None
    block_queries: int = 512
    max_block_candidates: int = 16384
    prior: bool = True
    properties: Any = None
    formula_per_candidate: bool = True


@dataclass
class Skipped:
    """A query that produced no output rows, and why."""

    query_id: str
    reason: str
    file: str = ""
    record: int | None = None


def read_formula_hints(path: str | os.PathLike) -> dict[str, str]:
    """A two-column TSV ``query_id<TAB>formula`` (a header line is allowed). Formulas are normalised.

    Raises
    ------
    InputError
        Missing file, a line without two columns, or an unparsable formula (naming the line).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path=str(path))
    hints: dict[str, str] = {}
    with open(path, encoding="utf-8", errors="replace") as handle:
        for lineno, line in enumerate(handle, start=1):
            text = line.rstrip("\r\n")
            if not text.strip() or text.startswith("#"):
                continue
            cells = text.split("\t")
            # the file's lines are numbered, not its records (blank and comment lines count): say "line"
            where = f"{path}, line {lineno}"
            if len(cells) < 2:
                raise InputError("expected two tab-separated columns: query_id, formula", path=where)
            query, formula = cells[0].strip(), cells[1].strip()
            if lineno == 1 and formula.lower() in ("formula", "molecular_formula"):
                continue
            hints[query] = normalized_hint(formula, where)
    return hints


def normalized_hint(formula: str, path: str, record: str | None = None) -> str:
    """A formula hint normalised (:func:`~molpredict.chem.molecules.normalize_formula`), or the one-line
    :class:`InputError` naming ``path`` (and ``record``), field formula: one rule for a hints file and a dict of
    hints given in Python."""
    from molpredict.chem.molecules import normalize_formula

    try:
        return normalize_formula(formula.strip())
    except InputError:
        raise InputError(f"unparsable formula {formula!r}", path=path, record=record, field="formula") from None


_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the first frame outside molpredict, for the function that
    calls this one and then :func:`warnings.warn`: the line of a notebook's ``molpredict.identify(...)`` call
    however deep inside the package the warning is raised (the chain differs between the API, the command line
    and a direct :class:`Identifier`, so no fixed number would do)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_ROOT):
        frame = frame.f_back
        level += 1
    return level


def _without_warning(iterator: Iterable, category: type[Warning]) -> Iterator:
    """``iterator``'s items, each computed with warnings of ``category`` ignored (a ``catch_warnings`` around the
    whole loop would also cover the caller's code between items)."""
    iterator = iter(iterator)
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category)
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item


def _usable_adducts(spectrum: Any, mode: str, sub: SubModel) -> tuple[list[Any], bool]:
    """The adducts to try: the spectrum's own when usable (known and of its polarity; written without brackets
    and charge as GNPS does, ``M+H``, it is read as the common adduct it names), else the defaults."""
    from molpredict.io.common import adduct_from_name
    from molpredict.chem.molecules import DEFAULT_ADDUCTS, parse_adduct

    if spectrum.adduct:
        try:
            adduct = parse_adduct(spectrum.adduct)
        except MolpredictError:
            named = adduct_from_name(spectrum.adduct, mode) if len(spectrum.adduct.split()) == 1 else None
            adduct = parse_adduct(named) if named else None
        if adduct is not None and adduct.ion_mode == mode:
            return [adduct], True
    names = sub.adducts or [a.name for a in DEFAULT_ADDUCTS[mode]]
    out = []
    for name in names:
        try:
            out.append(parse_adduct(name))
        except MolpredictError:
            continue
    return out, False


def rank_rows(query: Query, scores: np.ndarray | QueryScores, source: CandidateSource, top_k: int,
              query_id: str | None = None) -> list[dict[str, Any]]:
    """The output rows of one query from the scores of its candidates.

    Parameters
    ----------
    query : Query
    scores : QueryScores, or ndarray of shape (len(query.ids),), float64
        Aligned with ``query.ids``: the ranking score with its terms and probability, or a bare score vector.
    source : CandidateSource
        Supplies the tie-breaking keys and the output fields of the candidates.
    top_k : int
    query_id : str, optional
        The output's query id (default: the spectrum's id).

    Returns
    -------
    list of dict
        The top ``top_k`` candidates (score descending, ties by the source's tie key), with the columns of
        :data:`~molpredict.io.results.OUTPUT_COLUMNS`.
    """
    if not isinstance(scores, QueryScores):
        scores = QueryScores(np.asarray(scores, dtype=np.float64), {SPECTRUM: np.asarray(scores, dtype=np.float64)})
    terms, probability, scores = scores.terms, scores.probability, scores.score
    n = len(query.ids)
    order = rank_candidates(scores, source.tie_keys(query.ids))
    conf = margins(scores[order[:2]] if n >= 2 else scores[order])
    top = order[:top_k]
    chosen = query.ids[top]
    fields = source.fields(chosen)
    origin = getattr(query.spectrum, "file", None) or ""
    record = getattr(query.spectrum, "record", None)
    rows = []
    for r, (pos, cid) in enumerate(zip(top, chosen)):
        confidence = (conf[0] if r == 0 else scores[pos] - scores[order[0]]) if n >= 2 else float("nan")
        rows.append({
            "query_id": str(query.spectrum.id) if query_id is None else query_id, "file": origin,
            "record": record, "rank": r + 1, "score": float(scores[pos]), "confidence": float(confidence),
            "smiles": fields["smiles"][r], "inchikey": fields["inchikey"][r],
            "formula": fields["formula"][r],
            "adduct": query.adducts[pos] if query.adducts is not None else query.adduct,
            "name": fields["name"][r], "id": fields["id"][r], "n_candidates": n, "mass_window": query.window,
            "spectrum_score": float(terms[SPECTRUM][pos]) if SPECTRUM in terms else math.nan,
            "prior_score": float(terms[PRIOR][pos]) if PRIOR in terms else math.nan,
            "fragment_score": float(terms[FRAGMENTS][pos]) if FRAGMENTS in terms else math.nan,
            "probability": probability if r == 0 else math.nan,
        })
    return rows


@dataclass
class IdentifiedBlock:
    """What one block of spectra produced: its output rows (in input order) and its accounting."""

    rows: list[dict[str, Any]]
    skipped: list[Skipped]
    n_queries: int
    n_candidates: list[int] = field(default_factory=list)   # per identified query
    timings: dict[str, float] = field(default_factory=dict)
    n_merged: int = 0  # candidate rows merged into an earlier row of their structure (InChIKey first block)
    #: (query id, FORMULA as written) of the identified queries whose own FORMULA did not parse (selected by mass)
    unparsed_formulas: list[tuple[str, str]] = field(default_factory=list)


class Identifier:
    """Runs queries through a bundle against a candidate source, in blocks, with cached coordinates.

    Parameters
    ----------
    bundle : ModelBundle
    source : CandidateSource
    options : IdentifyOptions
    cache_root : path, False or None
        Root of the coordinates cache (None: the default location; False: no disk cache, coordinates are
        computed for every block).
    progress : bool
        A tqdm bar over queries on stderr.
    """

    def __init__(self, bundle: ModelBundle, source: CandidateSource, options: IdentifyOptions | None = None,
                 cache_root: Any = None, progress: bool = False) -> None:
        self.bundle = bundle
        self.source = source
        self.options = options or IdentifyOptions()
        self.cache_root = cache_root
        self.progress = progress
        self.coordinates = CandidateCoordinates(source, cache_root)
        self.evidence = Evidence(self.coordinates, use_prior=self.options.prior)
        for sub in bundle.models.values():
            check_scoring(sub)  # unreadable fusion / calibration settings fail here, before any query
        self._cleaners: dict[str, Any] = {}
        self.skipped: list[Skipped] = []
        self.n_queries = 0
        self.n_identified = 0
        self.n_candidates: list[int] = []
        self.n_merged = 0
        self.unparsed_formulas: list[tuple[str, str]] = []
        self.timings: Counter = Counter()
        if self.options.formulas and self.options.by == "mass":
            # worded for both callers, the Python API and the command line
            warnings.warn("formula hints (formulas= / --formulas) are ignored with by='mass' / --by mass: "
                          "candidates are selected by the precursor mass", UserWarning,
                          stacklevel=user_stacklevel())

    def fresh(self) -> Identifier:
        """The same bundle, source, options and coordinates, with empty accounting (for one block's task)."""
        view = copy.copy(self)
        view.skipped = []
        view.n_queries = view.n_identified = 0
        view.n_candidates = []
        view.n_merged = 0
        view.unparsed_formulas = []
        view.timings = Counter()
        return view

    # -- per-query preparation -------------------------------------------------------------------------
    def _cleaner(self, mode: str, sub: SubModel):
        if mode not in self._cleaners:
            self._cleaners[mode] = sub.cleaning_pipeline()
        return self._cleaners[mode]

    def _skip(self, spectrum: Any, reason: str) -> None:
        self.skipped.append(Skipped(str(spectrum.id), reason, getattr(spectrum, "file", None) or "",
                                    getattr(spectrum, "record", None)))

    def route(self, spectrum: Any, keep_empty: bool = False) -> tuple[str, SubModel, Any] | None:
        """``(ion mode, sub-model, cleaned spectrum)``, or None (with a skip entry) when there is no model for
        the spectrum or nothing left after cleaning (``keep_empty`` keeps spectra cleaned down to no peaks)."""
        mode = spectrum_ion_mode(spectrum)
        if mode is None:
            self._skip(spectrum, "no ion mode (IONMODE, CHARGE or ADDUCT needed; a Spectrum's ion_mode, charge or "
                                 "adduct)")
            return None
        sub = self.bundle.for_mode(mode)
        if sub is None:
            self._skip(spectrum, f"no model for ion mode {mode} in the bundle")
            return None
        cleaner = self._cleaner(mode, sub)
        cleaned = cleaner(spectrum) if cleaner is not None else spectrum
        if cleaned is None:
            kind = spectrum.metadata.get("spectrum_type")
            what = f"spectrum type {kind!r}, MS level" if kind else "MS level"
            self._skip(spectrum, f"{what} {spectrum.ms_level} (the model takes MS{cleaner.ms_level})")
            return None
        if cleaned.n_peaks == 0 and not keep_empty:
            self._skip(spectrum, "no peaks after cleaning")
            return None
        return mode, sub, cleaned

    def prepare(self, position: int, spectrum: Any) -> Query | None:
        """Mode, model, cleaning and candidates for one spectrum (None, with a skip entry, when impossible)."""
        routed = self.route(spectrum)
        if routed is None:
            return None
        mode, sub, cleaned = routed
        adducts, own = _usable_adducts(spectrum, mode, sub)
        formula = None
        if self.options.formulas is not None:
            formula = self.options.formulas.get(str(spectrum.id))
            if formula is None and ORIGINAL_ID in spectrum.metadata:  # a repeated id, made unique
                formula = self.options.formulas.get(str(spectrum.metadata[ORIGINAL_ID]))
            if formula is not None and self.options.by != "mass":
                # A hint whose mass the precursor m/z contradicts is a wrong hint (another run's file, shifted
                # rows): ranking its candidates answered confidently with a structure of another mass. The query is
                # skipped with the reason rather than selected by mass instead: the user asked for this formula,
                # and the skip report shows each contradiction where a silent fallback would hide it.
                mismatch = hint_mismatch(cleaned, adducts, formula, self.options)
                if mismatch is not None:
                    self._skip(spectrum, mismatch)
                    return None
        unparsed = None
        if formula is None:
            formula = spectrum.formula
            if formula and self.options.by is None and not formula_parses(formula):
                # Selection by mass, as before: the precursor mass is still evidence. But the user's FORMULA was
                # meant to decide, so the run counts such spectra and says so (run_blocks warns once).
                unparsed, formula = formula, None
        selected = self.source.select(cleaned, mode, adducts, formula)
        if isinstance(selected, str):
            self._skip(spectrum, selected)
            return None
        if unparsed is not None:
            self.unparsed_formulas.append((str(spectrum.id), str(unparsed)))
        ids, adduct_names, reported, window = selected
        if own:
            reported = adducts[0].name
        return Query(position, cleaned, mode, sub, ids, adduct_names, reported, window=window)

    # -- scoring (see molpredict.identification.scoring) ------------------------------------------------------------------
    def candidate_coordinates(self, sub: SubModel, ids: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
        """Coordinates of candidates ``ids`` (in any order, repeats allowed) for ``sub``'s model, shape (len(ids), d),
        in ``dtype``, rows in the order of ``ids``."""
        return self.coordinates(sub, ids, self.timings, dtype)

    @property
    def candidate_formulas(self) -> Any:
        """What scoring reads the candidates' formulas with (``formulas(ids)``), so that a spectrum without a
        formula is encoded once per candidate formula; None with ``formula_per_candidate`` off."""
        return self.source.formulas if self.options.formula_per_candidate else None

    def score_block(self, queries: list[Query]) -> list[np.ndarray]:
        """Raw scores of each query's candidates (aligned with ``query.ids``), for queries of one sub-model."""
        return score_queries(queries, self.candidate_coordinates, self.timings, self.candidate_formulas)

    def scored(self, queries: Iterable[Query]) -> Iterator[tuple[Query, np.ndarray]]:
        """``(query, raw scores)`` in input order, scoring block by block (grouped by sub-model inside a block)."""
        return scored(queries, self.candidate_coordinates, self.timings, self.options.block_queries,
                      self.options.max_block_candidates, self.candidate_formulas)

    def fused(self, queries: Iterable[Query]) -> Iterator[tuple[Query, QueryScores]]:
        """``(query, QueryScores)`` in input order: the model's scores with the bundle's other terms (prior,
        fragments) fused and the rank-1 probability (see :mod:`molpredict.identification.evidence`)."""
        for block in chunked(self.scored(queries), max(1, self.options.block_queries)):
            out: list[QueryScores | None] = [None] * len(block)
            by_sub: dict[int, list[int]] = {}
            for i, (q, _) in enumerate(block):
                by_sub.setdefault(id(q.sub), []).append(i)
            for members in by_sub.values():
                results = self.evidence.scores([block[i][0] for i in members], [block[i][1] for i in members],
                                               self.timings)
                for i, result in zip(members, results):
                    out[i] = result
            yield from ((q, r) for (q, _), r in zip(block, out))  # type: ignore[misc]

    # -- the identification run ----------------------------------------------------------------------------
    def _absorb(self, block: IdentifiedBlock) -> None:
        self.n_queries += block.n_queries
        self.n_identified += len(block.n_candidates)
        self.n_candidates.extend(block.n_candidates)
        self.n_merged += block.n_merged
        self.unparsed_formulas.extend(block.unparsed_formulas)
        self.skipped.extend(block.skipped)
        self.timings.update(block.timings)

    def run(self, spectra: Iterable[Any], executor: Executor | None = None) -> Iterator[dict[str, Any]]:
        """Output rows (dicts with :data:`~molpredict.io.results.OUTPUT_COLUMNS`) for every query, top-k per
        query, in input order; blocks of ``options.block_queries`` spectra go through ``executor`` (default
        in-process) as :func:`identify_block` tasks."""
        for block in self.run_blocks(spectra, executor):
            yield from block.rows

    def run_blocks(self, spectra: Iterable[Any], executor: Executor | None = None, start: int = 0
                   ) -> Iterator[IdentifiedBlock]:
        """:meth:`run` block by block (the unit a resumable output commits), its accounting absorbed.

        Parameters
        ----------
        spectra : iterable of Spectrum
            The whole input, also when resuming (query ids are made unique over all of it).
        executor : Executor, optional
        start : int
            Skip the first ``start`` spectra (finished by an earlier, interrupted run).
        """
        executor = executor or InProcessExecutor()
        state = self if executor.in_process else IdentifierState(self)
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(desc="identifying", unit=" spectra", file=sys.stderr)
        numbered = enumerate(unique_ids(spectra))
        if start:
            numbered = itertools.islice(numbered, start, None)
        blocks = chunked(numbered, max(1, self.options.block_queries))
        try:
            for block in executor.map(identify_block, state, blocks,
                                      on_done=(lambda b: bar.update(b.n_queries)) if bar is not None else None):
                self._absorb(block)
                yield block
        finally:
            if bar is not None:
                bar.close()
        self.warn_unparsed_formulas()

    def warn_unparsed_formulas(self) -> None:
        """One warning for the run's spectra whose own FORMULA did not parse and which were selected by precursor
        mass instead (their rows' ``mass_window`` says by how much), naming the first."""
        if self.unparsed_formulas:
            n = len(self.unparsed_formulas)
            query, written = self.unparsed_formulas[0]
            more = f"; {n - 1} more" if n > 1 else ""
            warnings.warn(f"{n} spectr{'a' if n > 1 else 'um'} with a FORMULA that does not parse ({query} with "
                          f"FORMULA={written!r}{more}) selected candidates by precursor mass instead "
                          f"(see each row's mass_window)", UserWarning, stacklevel=user_stacklevel())

    def run_text(self, texts: Sequence[tuple], block_queries: int = 64) -> Iterator[dict[str, Any]]:
        """Output rows for text queries ``(query_id, description)`` or ``(query_id, description, file, record)``
        (:func:`molpredict.api.text_queries`), each ranked against every candidate of the source
        (:meth:`LibrarySource.all_ids`), top-k per query, in input order.

        A query the model scores alike for every candidate is skipped (:attr:`skipped`) rather than ranked: its
        rows would be the library's first InChIKeys in tie order, answers that look like any other. That is a
        description with no word (n-gram) of the model's training vocabulary, whose predicted coordinates are
        zero, as a spectrum cleaned down to no peaks is skipped rather than ranked.

        Raises
        ------
        InputError
            The bundle has no text model, or the source has no candidates.
        """
        from molpredict.kernels.base import DegenerateObjectWarning
        from molpredict.modelfile import TEXT_MODE

        sub = self.bundle.for_mode(TEXT_MODE)
        if sub is None:
            raise InputError(f"the model takes {self.bundle.input_type} input, not text",
                             path=str(self.bundle.path) if self.bundle.path else None)
        ids = self.source.all_ids()
        if ids.size == 0:
            raise InputError("no candidates in the library (after the sources= / --source filter)")
        top_k = self.options.top_k
        n = len(ids)
        texts = [tuple(t) + ("", None) if len(t) == 2 else tuple(t) for t in texts]
        iterator: Iterable = shared_candidate_scores(self.candidate_coordinates, sub, [t[1] for t in texts], ids,
                                                     self.timings, block_queries=block_queries,
                                                     chunk=self.options.max_block_candidates)
        if self.progress:
            from tqdm import tqdm
            iterator = tqdm(iterator, total=-(-len(texts) // block_queries), desc="identifying", unit=" blocks",
                            file=sys.stderr)
        # the kernel's DegenerateObjectWarning is worded for spectra and shown once per place; the skip below
        # names each such description instead
        for start, scores in _without_warning(iterator, DegenerateObjectWarning):
            for row_index, row in enumerate(scores):
                query_id, description, origin, record = texts[start + row_index][:4]
                self.n_queries += 1
                if n >= 2 and not (np.ptp(row) > 0):  # NaN compares False: skipped too
                    self.skipped.append(Skipped(query_id, "no word of the description is known to the model "
                                                          "(every candidate scores the same)", origin or "", record))
                    continue
                self.n_identified += 1
                self.n_candidates.append(n)
                query = Query(start + row_index, description, TEXT_MODE, sub, ids)
                for out in rank_rows(query, row, self.source, top_k, query_id=query_id):
                    out["file"], out["record"] = origin or "", record
                    yield out

    def summary(self) -> dict[str, Any]:
        reasons = Counter(s.reason for s in self.skipped)
        n_c = np.asarray(self.n_candidates) if self.n_candidates else np.zeros(0)
        return {"n_queries": self.n_queries, "n_identified": self.n_identified, "n_skipped": len(self.skipped),
                "skipped": dict(reasons.most_common()),
                "candidates_median": float(np.median(n_c)) if n_c.size else None,
                "candidates_max": int(n_c.max()) if n_c.size else None,
                "candidates_merged": self.n_merged,
                "formula_unparsed": len(self.unparsed_formulas),
                "timings": {k: round(v, 3) for k, v in self.timings.items()}}


class IdentifierState(WorkerState):
    """An :class:`Identifier` for workers: the bundle by path, the candidate source, the options and the cache
    root (a shared directory for every worker).

    A :class:`~molpredict.identification.candidate_sources.LibrarySource` over a library file read with
    :func:`~molpredict.identification.scoring.load_library_once` travels as its file: each worker reads the
    library itself, once per process (no pickled copy of millions of rows). The token is then a content hash
    (bundle and library files with their stamps, options, cache root): a worker that already loaded the same
    inputs for an earlier run keeps them. Any other source is scattered as it is, with a token of its own run.
    """

    def __init__(self, identifier: Identifier) -> None:
        super().__init__()
        from molpredict.identification.candidate_sources import LibrarySource

        self.bundle_path = require_bundle_path(identifier.bundle)
        self.options = identifier.options
        self.cache_root = resolved_cache_root(identifier.cache_root)
        source = identifier.source
        origin = library_file(source.library) if type(source) is LibrarySource else None
        self.library = None if origin is None else (origin, source.options)
        self.source = source if origin is None else None
        if origin is not None:
            self.token = content_token(bundle_stamp(self.bundle_path), origin, source.options, self.options,
                                       str(self.cache_root))

    def load(self) -> Identifier:
        source = self.source
        if source is None:
            from molpredict.identification.candidate_sources import LibrarySource

            (path, _, _), options = self.library
            library = load_library_once(path)
            _warm_library(library)
            source = LibrarySource(library, options)
        return Identifier(load_bundle_once(self.bundle_path), source, self.options, cache_root=self.cache_root)


def _warm_library(library: Any) -> None:
    """Build what a library builds lazily on first use (the formula and mass indexes, the string columns the
    output rows take), so that a worker does it while loading, not inside the first blocks it runs."""
    library.build_indexes()
    for name in ("inchikey", "inchikey14", "smiles", "formula", "name", "id"):
        if library.has_column(name):
            library.column(name)


def unique_ids(spectra: Iterable[Any]) -> Iterator[Any]:
    """The spectra with ids unique within the stream: a repeated id gets the suffix ``#n`` (its n-th
    occurrence: ``1``, ``1#2``, ``1#3``; GNPS files give ``SCANS=1`` to every record), the original id kept as
    ``metadata["original_id"]``. Spectra with unique ids pass unchanged (not copied)."""
    seen: set[str] = set()
    counts: Counter = Counter()
    for spectrum in spectra:
        original = str(spectrum.id)
        counts[original] += 1
        if original not in seen:
            seen.add(original)
            yield spectrum
            continue
        n = counts[original]
        while f"{original}#{n}" in seen:
            n += 1
        new_id = f"{original}#{n}"
        seen.add(new_id)
        yield dataclasses.replace(spectrum, id=new_id, metadata={**spectrum.metadata, ORIGINAL_ID: original})


def identify_block(identifier: Identifier, block: Sequence[tuple[int, Any]]) -> IdentifiedBlock:
    """Identify one block of ``(position, spectrum)``: prepare, score (raw model scores per query, from
    :mod:`molpredict.identification.scoring`), then :func:`rank_rows`. Leaves ``identifier``'s own accounting untouched."""
    worker = identifier.fresh()
    queries = [q for q in (worker.prepare(position, spectrum) for position, spectrum in block) if q is not None]
    if queries:
        worker.source.prefetch(np.concatenate([q.ids for q in queries]))
        for query in queries:  # from the prefetched keys: no read per query
            n_rows = len(query.ids)
            query.ids, query.adducts = worker.source.one_per_structure(query.ids, query.adducts)
            worker.n_merged += n_rows - len(query.ids)
    rows: list[dict[str, Any]] = []
    n_candidates: list[int] = []
    for query, scores in worker.fused(queries):
        n_candidates.append(len(query.ids))
        rows.extend(rank_rows(query, scores, worker.source, worker.options.top_k))
    if worker.options.properties is not None and rows:
        from molpredict.properties.pipeline import property_columns
        spectra = [spectrum for _, spectrum in block]
        by_id = dict(zip((str(s.id) for s in spectra), property_columns(worker.options.properties, spectra)))
        for row in rows:
            row.update(by_id.get(row["query_id"], {}))
    return IdentifiedBlock(rows, worker.skipped, len(block), n_candidates, dict(worker.timings), worker.n_merged,
                           worker.unparsed_formulas)
