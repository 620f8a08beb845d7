"""Identification: rank candidate structures for each query spectrum with a model bundle.

For each spectrum, in input order:

1. Its ion mode picks the bundle's model (a spectrum whose mode has no model is skipped with that reason); the
   model's cleaning pipeline is applied (no peaks left: skipped).
2. Candidates come from a :class:`CandidateSource`: from a library by molecular formula (the spectrum's
   ``FORMULA`` or a ``--formulas`` hint; the default whenever a formula is known) or by neutral mass within a
   ppm window of the precursor m/z. When the spectrum has no usable adduct (missing, unknown, or of the other
   polarity), every default adduct of its ion mode is tried and the candidate sets are unioned; each candidate
   reports the first adduct, in the default order (most common first), that explains its mass.
3. Scoring is a dot product between the query's predicted coordinates and the candidates' coordinates, which
   come from the on-disk cache (computed once per model and molecule). Queries are processed in blocks: the
   coordinates of the union of a block's candidates are fetched once, and each group of queries sharing one
   candidate list is scored with one matrix product, so memory stays bounded by the block, never
   n_queries x n_library.

Ranking and ties: candidates are ordered by score (descending), ties broken by InChIKey (ascending), so the
same inputs always give the same table.

Text queries (a ``text`` model, see :mod:`molpredict.text_pairs`): every description is ranked against the whole
library (or the rows of the ``--source`` filter), with no formula or mass selection; :meth:`Identifier.run_text`
scores blocks of queries against the library in chunks (:func:`shared_candidate_scores`), so memory stays
bounded by a block of queries x the library, and the candidate coordinates still come from the on-disk cache.

Confidence: the score margin. For the top candidate it is its lead over the runner-up (>= 0; larger means a
clearer decision); for every other candidate it is its (negative) gap to the top candidate. It is empty when a
query has a single candidate. Scores are inner products in the output kernel's feature space, comparable
within one model.
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from .coordinates_cache import CoordinatesCache
from .decoding import margins, rank_candidates
from .errors import InputError, MolpredictError
from .modelfile import ModelBundle, SubModel

__all__ = [
    "OUTPUT_COLUMNS",
    "IdentifyOptions",
    "Skipped",
    "CandidateSource",
    "LibrarySource",
    "SetSource",
    "Query",
    "Identifier",
    "shared_candidate_scores",
    "read_formula_hints",
    "default_library_path",
    "ResultWriter",
    "output_format",
]

OUTPUT_COLUMNS = ("query_id", "rank", "score", "confidence", "smiles", "inchikey", "formula", "adduct", "name", "id",
                  "n_candidates")
OUTPUT_FORMATS = ("tsv", "csv", "json")


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` torch threads, then restore the previous setting."""
    previous = torch.get_num_threads()
    if previous == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def default_library_path() -> Path | None:
    """The shared candidate pool ``../shared/data/candidates/pool.tsv.gz`` next to the project root, if present."""
    root = Path(__file__).resolve().parents[1]
    path = root.parent / "shared" / "data" / "candidates" / "pool.tsv.gz"
    return path if path.is_file() else None


@dataclass
class IdentifyOptions:
    """Candidate selection and output settings.

    Attributes
    ----------
    by : {"formula", "mass"} or None
        None: by formula when the query has one, else by mass.
    ppm : float
        Mass window half-width (relative, parts per million of the neutral mass).
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
    """

    by: str | None = None
    ppm: float = 10.0
    sources: Sequence[str] | None = None
    top_k: int = 10
    formulas: dict[str, str] | None = None
    block_queries: int = 512
    max_block_candidates: int = 16384


@dataclass
class Skipped:
    """A query that produced no output rows, and why."""

    query_id: str
    reason: str
    file: str = ""
    record: int | None = None


@dataclass
class Query:
    """A spectrum (or, for a text model, a description) on its way through the pipeline."""

    position: int
    spectrum: Any
    mode: str
    sub: SubModel
    ids: np.ndarray                   # candidate ids in the source (ascending)
    adducts: np.ndarray | None = None  # adduct name per candidate (object array) or None
    adduct: str = ""                   # the adduct reported when ``adducts`` is None
    true_key: str | None = None        # for evaluation: the true structure's InChIKey first block


class CandidateSource:
    """Where candidates come from: ids into a table of molecules, with keys and output fields per id."""

    def select(self, spectrum: Any, mode: str, adducts: Sequence[Any], formula: str | None
               ) -> tuple[np.ndarray, np.ndarray | None, str] | str:
        """``(ids ascending, adduct name per id or None, adduct to report)`` for one query, or a skip reason."""
        raise NotImplementedError

    def keys(self, ids: np.ndarray) -> list[str]:
        """Cache keys of candidates ``ids`` (full InChIKey, else ``smiles:<SMILES>``)."""
        raise NotImplementedError

    def tie_keys(self, ids: np.ndarray) -> np.ndarray:
        """Tie-breaking keys (InChIKey), object array of shape (len(ids),)."""
        raise NotImplementedError

    def molecules(self, ids: np.ndarray) -> list[Any]:
        """``Molecule`` records for ``ids`` (only called for candidates not yet in the cache)."""
        raise NotImplementedError

    def fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Output columns (smiles, inchikey, formula, name, id) for ``ids``."""
        raise NotImplementedError

    def inchikey14(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class LibrarySource(CandidateSource):
    """Candidates from a :class:`~molpredict.candidates.CandidateLibrary`, selected by formula or mass."""

    def __init__(self, library: Any, options: IdentifyOptions) -> None:
        self.library = library
        self.options = options
        self._allowed = None
        if options.sources:
            allowed = library.select_by_source(list(options.sources))
            self._allowed = np.zeros(len(library), dtype=bool)
            self._allowed[allowed] = True
        self._inchikey = library.column("inchikey")
        self._formula_cache: dict[str, np.ndarray] = {}
        self.has_name = library.has_column("name")
        self.has_id = library.has_column("id")

    def select(self, spectrum: Any, mode: str, adducts: Sequence[Any], formula: str | None
               ) -> tuple[np.ndarray, np.ndarray | None, str] | str:
        """``(ids, adduct per id or None, reported adduct)`` or the skip reason."""
        from .molecules import neutral_mass, normalize_formula

        if formula and self.options.by is None:
            try:
                normalize_formula(formula)
            except InputError:
                formula = None  # an unusable FORMULA field: fall back to the precursor mass
        by = self.options.by or ("formula" if formula else "mass")
        if by == "formula":
            if not formula:
                return "no formula (give --formulas or use --by mass)"
            ids = self._formula_cache.get(formula)
            if ids is None:
                try:
                    ids = self.library.select_by_formula(formula)
                except InputError:
                    return f"unparsable formula {formula!r}"
                self._formula_cache[formula] = ids
            adduct_names = None
            reported = adducts[0].name if len(adducts) == 1 else ""
        else:
            if not spectrum.precursor_mz:
                return "no precursor m/z (needed to select candidates by mass)"
            parts, names = [], []
            masses = [neutral_mass(spectrum.precursor_mz, a) for a in adducts]
            for adduct, ids_a in zip(adducts, self.library.select_by_masses(masses, self.options.ppm)):
                parts.append(ids_a)
                names.append(np.full(len(ids_a), adduct.name, dtype=object))
            if not parts:
                return "no adduct to compute a neutral mass"
            all_ids = np.concatenate(parts)
            all_names = np.concatenate(names)
            # keep, per candidate, the first adduct in the given (most-common-first) order
            ids, first = np.unique(all_ids, return_index=True)
            adduct_names = all_names[first]
            reported = ""
        if self._allowed is not None and ids.size:
            keep = self._allowed[ids]
            ids = ids[keep]
            if adduct_names is not None:
                adduct_names = adduct_names[keep]
        if ids.size == 0:
            where = f"formula {formula}" if by == "formula" else f"mass within {self.options.ppm:g} ppm"
            return f"no candidates in the library ({where})"
        return ids, adduct_names, reported

    def all_ids(self) -> np.ndarray:
        """Every usable row id (ascending): the whole library, or the rows of the ``sources`` filter."""
        if self._allowed is None:
            return np.arange(len(self.library), dtype=np.int64)
        return np.flatnonzero(self._allowed).astype(np.int64)

    def keys(self, ids: np.ndarray) -> list[str]:
        return list(self._inchikey[ids])

    def tie_keys(self, ids: np.ndarray) -> np.ndarray:
        return self._inchikey[ids]

    def molecules(self, ids: np.ndarray) -> list[Any]:
        return self.library.molecules(ids)

    def inchikey14(self, ids: np.ndarray) -> np.ndarray:
        return self.library.column("inchikey14")[ids]

    def fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        out = {"smiles": self.library.column("smiles")[ids], "inchikey": self._inchikey[ids],
               "formula": self.library.column("formula")[ids]}
        for name in ("name", "id"):
            column = self.library.column(name)
            out[name] = column[ids] if column is not None else np.full(len(ids), None, dtype=object)
        return out


class SetSource(CandidateSource):
    """Candidates from MassSpecGym-style sets ``{query inchikey14: [(inchikey14, smiles), ...]}``.

    Each query's candidates are the set of its true structure's first block. The distinct ``(inchikey14,
    smiles)`` pairs of all sets form the id table.
    """

    def __init__(self, sets: dict[str, list[tuple[str, str]]]) -> None:
        index: dict[tuple[str, str], int] = {}
        self._set_ids: dict[str, np.ndarray] = {}
        for query, entries in sets.items():
            ids = []
            for pair in entries:
                j = index.get(pair)
                if j is None:
                    j = index[pair] = len(index)
                ids.append(j)
            self._set_ids[query] = np.unique(np.asarray(ids, dtype=np.int64))
        pairs = list(index)
        self._ik14 = np.array([p[0] for p in pairs], dtype=object)
        self._smiles = np.array([p[1] for p in pairs], dtype=object)
        self._tie = np.array([f"{k}|{s}" for k, s in pairs], dtype=object)
        self.has_name = False
        self.has_id = False

    def __len__(self) -> int:
        return len(self._ik14)

    def set_ids(self, query_inchikey14: str) -> np.ndarray | None:
        return self._set_ids.get(query_inchikey14)

    def select(self, spectrum: Any, mode: str, adducts: Sequence[Any], formula: str | None
               ) -> tuple[np.ndarray, np.ndarray | None, str] | str:
        """The set of the spectrum's own structure (its INCHIKEY first block): for evaluation and benchmarks."""
        inchikey = spectrum.inchikey
        if not inchikey:
            return "no INCHIKEY (needed to pick its candidate set)"
        ids = self._set_ids.get(inchikey.split("-", 1)[0])
        if ids is None:
            return "no candidate set for the structure"
        return ids, None, adducts[0].name if len(adducts) == 1 else ""

    def keys(self, ids: np.ndarray) -> list[str]:
        return ["smiles:" + s for s in self._smiles[ids]]

    def tie_keys(self, ids: np.ndarray) -> np.ndarray:
        return self._tie[ids]

    def molecules(self, ids: np.ndarray) -> list[Any]:
        from .molecules import Molecule
        return [Molecule(s, inchikey14=k) for k, s in zip(self._ik14[ids], self._smiles[ids])]

    def inchikey14(self, ids: np.ndarray) -> np.ndarray:
        return self._ik14[ids]

    def fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        none = np.full(len(ids), None, dtype=object)
        return {"smiles": self._smiles[ids], "inchikey": self._ik14[ids], "formula": none, "name": none,
                "id": none}


def read_formula_hints(path: str | os.PathLike) -> dict[str, str]:
    """A two-column TSV ``query_id<TAB>formula`` (a header line is allowed). Formulas are normalised.

    Raises
    ------
    InputError
        Missing file, a line without two columns, or an unparsable formula (naming the line).
    """
    from .molecules import normalize_formula

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
            if len(cells) < 2:
                raise InputError("expected two tab-separated columns: query_id, formula", path=str(path),
                                 record=lineno)
            query, formula = cells[0].strip(), cells[1].strip()
            if lineno == 1 and formula.lower() in ("formula", "molecular_formula"):
                continue
            try:
                hints[query] = normalize_formula(formula)
            except InputError:
                raise InputError(f"unparsable formula {formula!r}", path=str(path), record=lineno,
                                 field="formula") from None
    return hints


def _usable_adducts(spectrum: Any, mode: str, sub: SubModel) -> tuple[list[Any], bool]:
    """The adducts to try: the spectrum's own when usable (known and of its polarity), else the defaults."""
    from .molecules import DEFAULT_ADDUCTS, parse_adduct

    if spectrum.adduct:
        try:
            adduct = parse_adduct(spectrum.adduct)
            if adduct.ion_mode == mode:
                return [adduct], True
        except MolpredictError:
            pass
    names = sub.adducts or [a.name for a in DEFAULT_ADDUCTS[mode]]
    out = []
    for name in names:
        try:
            out.append(parse_adduct(name))
        except MolpredictError:
            continue
    return out, False


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
        self._caches: dict[str, CoordinatesCache | None] = {}
        self._cleaners: dict[str, Any] = {}
        self.skipped: list[Skipped] = []
        self.n_queries = 0
        self.n_identified = 0
        self.n_candidates: list[int] = []
        self.timings: Counter = Counter()

    # -- per-query preparation -------------------------------------------------------------------------
    def _cleaner(self, mode: str, sub: SubModel):
        if mode not in self._cleaners:
            self._cleaners[mode] = sub.cleaning_pipeline()
        return self._cleaners[mode]

    def _skip(self, spectrum: Any, reason: str) -> None:
        self.skipped.append(Skipped(str(spectrum.id), reason))

    def route(self, spectrum: Any, keep_empty: bool = False) -> tuple[str, SubModel, Any] | None:
        """``(ion mode, sub-model, cleaned spectrum)``, or None (with a skip entry) when there is no model for
        the spectrum or nothing left after cleaning (``keep_empty`` keeps spectra cleaned down to no peaks)."""
        from .training import spectrum_ion_mode

        mode = spectrum_ion_mode(spectrum)
        if mode is None:
            self._skip(spectrum, "no ion mode (IONMODE, CHARGE or ADDUCT needed)")
            return None
        sub = self.bundle.for_mode(mode)
        if sub is None:
            self._skip(spectrum, f"no model for ion mode {mode} in the bundle")
            return None
        cleaner = self._cleaner(mode, sub)
        cleaned = cleaner(spectrum) if cleaner is not None else spectrum
        if cleaned is None:
            self._skip(spectrum, f"MS level {spectrum.ms_level} (the model takes MS{cleaner.ms_level})")
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
        if formula is None:
            formula = spectrum.formula
        selected = self.source.select(cleaned, mode, adducts, formula)
        if isinstance(selected, str):
            self._skip(spectrum, selected)
            return None
        ids, adduct_names, reported = selected
        if own:
            reported = adducts[0].name
        return Query(position, cleaned, mode, sub, ids, adduct_names, reported)

    # -- scoring -----------------------------------------------------------------------------------------
    def _cache(self, sub: SubModel) -> CoordinatesCache | None:
        key = sub.ion_mode
        if key not in self._caches:
            if self.cache_root is False:
                self._caches[key] = None
            else:
                self._caches[key] = CoordinatesCache(self.cache_root, sub.model.coordinates_key())
        return self._caches[key]

    def candidate_coordinates(self, sub: SubModel, ids: np.ndarray) -> np.ndarray:
        """Coordinates of candidates ``ids`` (ascending, unique) for ``sub``'s model, shape (len(ids), d)."""
        cache = self._cache(sub)
        t0 = time.perf_counter()
        if cache is None:
            coords = np.asarray(sub.model.candidate_coordinates(self.source.molecules(ids)), dtype=np.float64)
            self.timings["featurize_s"] += time.perf_counter() - t0
            return coords
        keys = self.source.keys(ids)
        rows = cache.rows(keys)
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            molecules = self.source.molecules(ids[missing])
            cache.ensure(molecules, sub.model.candidate_coordinates, keys=[keys[i] for i in missing])
            rows = cache.rows(keys)
            self.timings["featurize_s"] += time.perf_counter() - t0
        t1 = time.perf_counter()
        coords = cache.read(rows)
        self.timings["cache_read_s"] += time.perf_counter() - t1
        return coords

    def score_block(self, queries: list[Query]) -> list[np.ndarray]:
        """Scores of each query's candidates (aligned with ``query.ids``), for queries of one sub-model."""
        sub = queries[0].sub
        union = np.unique(np.concatenate([q.ids for q in queries]))
        coords = self.candidate_coordinates(sub, union)
        t0 = time.perf_counter()
        predicted = np.asarray(sub.model.predict_coordinates([q.spectrum for q in queries]), dtype=np.float64)
        self.timings["predict_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        out: list[np.ndarray | None] = [None] * len(queries)
        groups: dict[bytes, list[int]] = {}
        for i, q in enumerate(queries):
            groups.setdefault(q.ids.tobytes(), []).append(i)
        # The products are small (a few queries x ~256 candidates): they run in torch on one thread. numpy's
        # BLAS threads would compete with torch's still-spinning OpenMP threads (from the prediction just
        # before), and any multi-threaded small product is 10-20x slower than one thread on a busy machine.
        P = torch.from_numpy(np.ascontiguousarray(predicted))
        C = torch.from_numpy(np.ascontiguousarray(coords))
        with _torch_threads(1):
            for members in groups.values():
                ids = queries[members[0]].ids
                block = C.index_select(0, torch.from_numpy(np.searchsorted(union, ids)))
                if not sub.model.dot_product_scores:
                    scores = sub.model.score_coordinates(P[members].numpy(), block.numpy())
                    for row, i in enumerate(members):
                        out[i] = scores[row]
                elif len(members) == 1:
                    out[members[0]] = torch.mv(block, P[members[0]]).numpy()
                else:
                    scores = (P[members] @ block.T).numpy()
                    for row, i in enumerate(members):
                        out[i] = scores[row]
        self.timings["score_s"] += time.perf_counter() - t0
        return out  # type: ignore[return-value]

    def _blocks(self, queries: Iterable[Query]) -> Iterator[list[Query]]:
        block: list[Query] = []
        size = 0
        for q in queries:
            block.append(q)
            size += len(q.ids)
            if len(block) >= self.options.block_queries or size >= self.options.max_block_candidates:
                yield block
                block, size = [], 0
        if block:
            yield block

    def scored(self, queries: Iterable[Query]) -> Iterator[tuple[Query, np.ndarray]]:
        """``(query, scores)`` in input order, scoring block by block (grouped by sub-model inside a block)."""
        for block in self._blocks(queries):
            by_mode: dict[str, list[int]] = {}
            for i, q in enumerate(block):
                by_mode.setdefault(q.mode, []).append(i)
            results: list[np.ndarray | None] = [None] * len(block)
            for members in by_mode.values():
                for i, scores in zip(members, self.score_block([block[i] for i in members])):
                    results[i] = scores
            yield from zip(block, results)  # type: ignore[misc]

    # -- the identification run ----------------------------------------------------------------------------
    def run(self, spectra: Iterable[Any]) -> Iterator[dict[str, Any]]:
        """Output rows (dicts with :data:`OUTPUT_COLUMNS`) for every query, top-k per query, in input order."""
        def prepared() -> Iterator[Query]:
            iterator: Iterable = spectra
            if self.progress:
                from tqdm import tqdm
                iterator = tqdm(iterator, desc="identifying", unit=" spectra", file=sys.stderr)
            for position, spectrum in enumerate(iterator):
                self.n_queries += 1
                query = self.prepare(position, spectrum)
                if query is not None:
                    yield query

        top_k = self.options.top_k
        for query, scores in self.scored(prepared()):
            self.n_identified += 1
            n = len(query.ids)
            self.n_candidates.append(n)
            tie_keys = self.source.tie_keys(query.ids)
            order = rank_candidates(scores, tie_keys)
            conf = margins(scores[order[:2]] if n >= 2 else scores[order])
            top = order[:top_k]
            chosen = query.ids[top]
            fields = self.source.fields(chosen)
            for r, (pos, cid) in enumerate(zip(top, chosen)):
                confidence = (conf[0] if r == 0 else scores[pos] - scores[order[0]]) if n >= 2 else float("nan")
                yield {
                    "query_id": str(query.spectrum.id), "rank": r + 1, "score": float(scores[pos]),
                    "confidence": float(confidence),
                    "smiles": fields["smiles"][r], "inchikey": fields["inchikey"][r],
                    "formula": fields["formula"][r],
                    "adduct": query.adducts[pos] if query.adducts is not None else query.adduct,
                    "name": fields["name"][r], "id": fields["id"][r], "n_candidates": n,
                }

    def run_text(self, texts: Sequence[tuple[str, str]], block_queries: int = 64) -> Iterator[dict[str, Any]]:
        """Output rows for text queries ``(query_id, description)``, each ranked against every candidate of the
        source (:meth:`LibrarySource.all_ids`), top-k per query, in input order.

        Raises
        ------
        InputError
            The bundle has no text model, or the source has no candidates.
        """
        from .modelfile import TEXT_MODE

        sub = self.bundle.for_mode(TEXT_MODE)
        if sub is None:
            raise InputError(f"the model takes {self.bundle.input_type} input, not text",
                             path=str(self.bundle.path) if self.bundle.path else None)
        ids = self.source.all_ids()
        if ids.size == 0:
            raise InputError("no candidates in the library (after the --source filter)")
        tie_keys = self.source.tie_keys(ids)
        top_k = self.options.top_k
        n = len(ids)
        texts = list(texts)
        iterator: Iterable = shared_candidate_scores(self, sub, [t for _, t in texts], ids,
                                                     block_queries=block_queries)
        if self.progress:
            from tqdm import tqdm
            iterator = tqdm(iterator, total=-(-len(texts) // block_queries), desc="identifying", unit=" blocks",
                            file=sys.stderr)
        for start, scores in iterator:
            for row_index, row in enumerate(scores):
                query_id = texts[start + row_index][0]
                self.n_queries += 1
                self.n_identified += 1
                self.n_candidates.append(n)
                order = rank_candidates(row, tie_keys)
                conf = margins(row[order[:2]] if n >= 2 else row[order])
                top = order[:top_k]
                chosen = ids[top]
                fields = self.source.fields(chosen)
                for r, pos in enumerate(top):
                    confidence = (conf[0] if r == 0 else row[pos] - row[order[0]]) if n >= 2 else float("nan")
                    yield {
                        "query_id": query_id, "rank": r + 1, "score": float(row[pos]),
                        "confidence": float(confidence), "smiles": fields["smiles"][r],
                        "inchikey": fields["inchikey"][r], "formula": fields["formula"][r], "adduct": "",
                        "name": fields["name"][r], "id": fields["id"][r], "n_candidates": n,
                    }

    def summary(self) -> dict[str, Any]:
        reasons = Counter(s.reason for s in self.skipped)
        n_c = np.asarray(self.n_candidates) if self.n_candidates else np.zeros(0)
        return {"n_queries": self.n_queries, "n_identified": self.n_identified, "n_skipped": len(self.skipped),
                "skipped": dict(reasons.most_common()),
                "candidates_median": float(np.median(n_c)) if n_c.size else None,
                "candidates_max": int(n_c.max()) if n_c.size else None,
                "timings": {k: round(v, 3) for k, v in self.timings.items()}}


def shared_candidate_scores(identifier: Identifier, sub: SubModel, inputs: Sequence[Any], ids: np.ndarray,
                            block_queries: int = 64) -> Iterator[tuple[int, np.ndarray]]:
    """Scores of the same candidates ``ids`` for every input, block of inputs by block.

    The candidates are taken in chunks of ``identifier.options.max_block_candidates`` rows (coordinates from
    the identifier's cache), so memory is bounded by ``block_queries x len(ids)`` scores plus one chunk of
    coordinates, never ``n_inputs x len(ids)``.

    Parameters
    ----------
    identifier : Identifier
        Supplies the candidate coordinates (cached) and collects timings.
    sub : SubModel
    inputs : sequence
        What ``sub.model.predict_coordinates`` takes (descriptions for a text model).
    ids : ndarray of shape (n_candidates,), int64
        Candidate ids in ``identifier.source``, ascending and unique.
    block_queries : int
        Inputs per block.

    Yields
    ------
    (start, scores)
        ``scores``: ndarray of shape (block size, n_candidates), float64, for ``inputs[start:start + b]``.
    """
    inputs = list(inputs)
    ids = np.asarray(ids, dtype=np.int64)
    chunk = max(1, int(identifier.options.max_block_candidates))
    model = sub.model
    for start in range(0, len(inputs), block_queries):
        block = inputs[start:start + block_queries]
        t0 = time.perf_counter()
        predicted = np.asarray(model.predict_coordinates(block), dtype=np.float64)
        identifier.timings["predict_s"] += time.perf_counter() - t0
        scores = np.empty((len(block), len(ids)), dtype=np.float64)
        for lo in range(0, len(ids), chunk):
            coords = identifier.candidate_coordinates(sub, ids[lo:lo + chunk])
            t0 = time.perf_counter()
            if model.dot_product_scores:
                scores[:, lo:lo + chunk] = predicted @ coords.T
            else:
                scores[:, lo:lo + chunk] = model.score_coordinates(predicted, coords)
            identifier.timings["score_s"] += time.perf_counter() - t0
        yield start, scores


# -- output ------------------------------------------------------------------------------------------------

def output_format(path: str | None, fmt: str | None) -> str:
    """The output format: ``fmt`` when given, else from ``path``'s extension, else TSV."""
    if fmt:
        fmt = fmt.lower()
        if fmt not in OUTPUT_FORMATS:
            raise InputError(f"unknown output format {fmt!r} (expected tsv, csv or json)")
        return fmt
    if path and path != "-":
        suffix = Path(path).suffix.lower().lstrip(".")
        if suffix in OUTPUT_FORMATS:
            return suffix
        if suffix in ("txt", "tab"):
            return "tsv"
        raise InputError(f"cannot tell the output format from the extension {suffix!r}; use --format",
                         path=path)
    return "tsv"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value).replace("\t", " ").replace("\n", " ")


class ResultWriter:
    """Streams output rows as TSV, CSV or a JSON array of objects.

    Parameters
    ----------
    handle : text stream
    fmt : {"tsv", "csv", "json"}
    columns : sequence of str
    """

    def __init__(self, handle: IO[str], fmt: str, columns: Sequence[str] = OUTPUT_COLUMNS) -> None:
        self.handle = handle
        self.fmt = fmt
        self.columns = list(columns)
        self.n_rows = 0
        if fmt == "csv":
            self._csv = csv.writer(handle, lineterminator="\n")
            self._csv.writerow(self.columns)
        elif fmt == "tsv":
            handle.write("\t".join(self.columns) + "\n")
        else:
            handle.write("[")

    def write(self, row: dict[str, Any]) -> None:
        if self.fmt == "json":
            obj = {c: (None if isinstance(row.get(c), float) and math.isnan(row[c]) else row.get(c))
                   for c in self.columns}
            self.handle.write(("\n" if self.n_rows == 0 else ",\n") + json.dumps(obj))
        elif self.fmt == "csv":
            self._csv.writerow([_cell(row.get(c)) for c in self.columns])
        else:
            self.handle.write("\t".join(_cell(row.get(c)) for c in self.columns) + "\n")
        self.n_rows += 1

    def close(self) -> None:
        if self.fmt == "json":
            self.handle.write("\n]\n" if self.n_rows else "]\n")
        self.handle.flush()


def write_skipped(skipped: Sequence[Skipped], path: str | os.PathLike) -> None:
    """The skipped-queries report: TSV with columns query_id, file, record, reason."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("query_id\tfile\trecord\treason\n")
        for s in skipped:
            handle.write(f"{_cell(s.query_id)}\t{_cell(s.file)}\t{'' if s.record is None else s.record}\t"
                         f"{_cell(s.reason)}\n")


def score_library(bundle: ModelBundle, library: Any, cache_root: Any = None, block_size: int = 8192,
                  ion_modes: Sequence[str] | None = None, progress: bool = False,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Precompute the candidate coordinates of a whole library for each model of a bundle.

    Works through the library in blocks of ``block_size`` rows; a block whose molecules are all cached is
    skipped, and each computed block is committed before the next starts, so an interrupted run resumes where it
    stopped without losing finished blocks.

    Returns
    -------
    dict
        Per ion mode: ``{"coordinates_key", "n_rows", "n_computed", "n_blocks_computed", "time_s", "cache"}``.
    """
    say = log or (lambda message: None)
    out: dict[str, Any] = {}
    inchikeys = library.column("inchikey")
    n = len(library)
    for mode in ion_modes or bundle.ion_modes:
        sub = bundle.for_mode(mode)
        if sub is None:
            raise InputError(f"the bundle has no {mode} model", path=str(bundle.path))
        cache = CoordinatesCache(cache_root, sub.model.coordinates_key())
        say(f"{mode}: {n} library rows, {len(cache)} coordinates already cached in {cache.directory}")
        t0 = time.perf_counter()
        n_computed = n_blocks = 0
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=n, desc=f"scoring library ({mode})", unit=" molecules", file=sys.stderr)
        try:
            for start in range(0, n, block_size):
                ids = np.arange(start, min(start + block_size, n))
                keys = list(inchikeys[ids])
                missing = np.flatnonzero(cache.rows(keys) < 0)
                if missing.size:
                    molecules = library.molecules(ids[missing])
                    n_computed += cache.ensure(molecules, sub.model.candidate_coordinates,
                                               keys=[keys[i] for i in missing], block_size=block_size)
                    n_blocks += 1
                if bar is not None:
                    bar.update(len(ids))
        finally:
            if bar is not None:
                bar.close()
        out[mode] = {"coordinates_key": sub.model.coordinates_key(), "n_rows": n, "n_computed": n_computed,
                     "n_blocks_computed": n_blocks, "time_s": round(time.perf_counter() - t0, 3),
                     "cache": str(cache.directory)}
    return out
