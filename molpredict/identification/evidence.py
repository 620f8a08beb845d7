"""The evidence scored beside the spectrum model (a structure prior, fragment explanation), and how it becomes one
score and a confidence per query.

A sub-model of a bundle may carry, besides its model:

- ``prior``: a fitted structure prior (the ``prior`` model: similarity of a candidate to a reference set of
  structures, the training structures by default). Its score depends on the candidate alone, so it is cached on
  disk like any candidate coordinates;
- ``fragments``: the settings of the candidate fragmentation scorer (:mod:`molpredict.chem.fragments`), which reads each
  candidate structure against the query's peaks;
- ``fragment_model``: the learnt fragmentation model (:mod:`molpredict.chem.fragment_model`, ``train --fragments``):
  the log-likelihood of the query's peaks under each candidate's predicted fragment ions, its own term;
- ``scoring``: per variant (``with_prior``, ``without_prior``: what ``--prior on|off`` picks), the
  :class:`~molpredict.identification.fusion.ScoreFusion` of the terms and the :class:`~molpredict.identification.calibration.Calibrator` of
  the probability that rank 1 is right, both fitted on validation candidate sets at training time.

:class:`Evidence` computes the terms for a block of queries and :meth:`Evidence.fuse` turns them into a
:class:`QueryScores`. A sub-model without ``scoring`` (an older bundle, or one trained without validation
candidates) ranks by its model's own score and reports no probability.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from molpredict.errors import ModelFileError
from molpredict.identification.calibration import (SPECTRUM_FEATURES, Calibrator, ranking_features,
                                                   ranking_features_flat, spectrum_features, top_index_flat)
from molpredict.identification.fusion import FRAGMENT_MODEL, FRAGMENTS, PRIOR, SPECTRUM, ScoreFusion, top_k_flat

__all__ = ["ScoringVariant", "QueryScores", "Evidence", "WITH_PRIOR", "WITHOUT_PRIOR", "variant_name", "query_adduct"]

WITH_PRIOR, WITHOUT_PRIOR = "with_prior", "without_prior"


def variant_name(use_prior: bool) -> str:
    return WITH_PRIOR if use_prior else WITHOUT_PRIOR


@dataclass
class ScoringVariant:
    """A fusion of terms and, optionally, its calibration."""

    fusion: ScoreFusion
    calibrator: Calibrator | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fusion": self.fusion.to_dict()}
        if self.calibrator is not None:
            out["calibration"] = self.calibrator.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ScoringVariant":
        calibration = data.get("calibration")
        return cls(ScoreFusion.from_dict(data["fusion"]),
                   Calibrator.from_dict(calibration) if calibration is not None else None)


def read_scoring_variant(sub: Any, name: str) -> ScoringVariant | None:
    """The scoring variant ``name`` of a sub-model, or None when it has none.

    Raises
    ------
    ModelFileError
        The settings cannot be read by this version (a clear error naming the file and field, not a wrong score).
    """
    settings = (sub.scoring or {}).get(name)
    if not settings:
        return None
    try:
        return ScoringVariant.from_dict(settings)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        where = getattr(sub, "source", None) or f"the {sub.ion_mode} model"
        raise ModelFileError(f"{where}: field scoring.{name} is invalid ({exc})") from None


def check_scoring(sub: Any) -> None:
    """Read every scoring variant of ``sub`` once, so that unreadable settings fail before any query is scored."""
    for name in (sub.scoring or {}):
        read_scoring_variant(sub, name)


@dataclass
class QueryScores:
    """One query's candidate scores.

    Attributes
    ----------
    score : ndarray of shape (n_candidates,)
        What the candidates are ranked by: the fused score, or the model's own score without a fusion.
    terms : dict
        Term name -> raw scores, ndarray of shape (n_candidates,) (``spectrum`` always; ``prior``,
        ``fragments`` when computed).
    probability : float
        Estimated probability that the rank-1 candidate is right (NaN without a calibration).
    """

    score: np.ndarray
    terms: dict[str, np.ndarray] = field(default_factory=dict)
    probability: float = math.nan


class Evidence:
    """Computes the terms of blocks of queries and fuses them.

    Parameters
    ----------
    coordinates : CandidateCoordinates
        The candidate source's coordinates (the prior's scores are cached through it); the per-structure
        fragmentation of the fragment terms is cached on disk under its ``cache_root`` too
        (:mod:`molpredict.chem.fragment_cache`; not with ``cache_root=False`` or a remote root).
    use_prior : bool
        ``--prior on|off``: with False the prior term is neither computed nor fused, and the ``without_prior``
        variant is used.
    every_variant : bool
        Compute a second pass's terms (:attr:`ScoreFusion.rerank <molpredict.identification.fusion.ScoreFusion>`)
        for the top ``k`` of both variants, with and without the prior, so that both can be ranked from one pass
        (evaluation's ``without_prior`` view); by default only for the variant in use.
    """

    def __init__(self, coordinates: Any, use_prior: bool = True, every_variant: bool = False) -> None:
        self.coordinates = coordinates
        self.use_prior = use_prior
        self.every_variant = every_variant
        self._variants: dict[tuple[int, bool], ScoringVariant | None] = {}
        self._fragmenters: dict[int, Any] = {}
        self._known: dict[tuple[int, int], bool] = {}
        self._disk: dict[tuple[int, str], Any] = {}

    # -- settings of a sub-model ---------------------------------------------------------------------------
    def variant(self, sub: Any, use_prior: bool | None = None) -> ScoringVariant | None:
        """The fusion (and calibration) ``sub`` uses under ``use_prior`` (default: this evidence's setting), or
        None when the bundle has none."""
        with_prior = (self.use_prior if use_prior is None else use_prior) and sub.prior is not None
        key = (id(sub), with_prior)
        if key not in self._variants:
            self._variants[key] = read_scoring_variant(sub, variant_name(with_prior))
        return self._variants[key]

    def _fragmenter(self, sub: Any) -> Any:
        key = id(sub)
        if key not in self._fragmenters:
            scorer = None
            if sub.fragments is not None:
                from molpredict.chem.fragments import FragmentScorer
                scorer = FragmentScorer(**sub.fragments)
            self._fragmenters[key] = scorer
        return self._fragmenters[key]

    def wanted_terms(self, sub: Any) -> list[str]:
        """The terms worth computing for every candidate of ``sub``'s queries: those its fusion's first pass
        weighs (only the model's own score without a fusion). Training asks for each term explicitly (``wanted``
        in :meth:`terms`). A second pass's terms are computed for its top ``k`` only (:meth:`scores`)."""
        variant = self.variant(sub)
        if variant is None:
            return [SPECTRUM]
        wanted = list(variant.fusion.active())
        if self.every_variant and self.use_prior:
            other = self.variant(sub, use_prior=False)
            wanted += [t for t in (other.fusion.active() if other is not None else ()) if t not in wanted]
        return wanted

    def _scorers(self, sub: Any, names: Sequence[str]) -> dict[str, Any]:
        """The candidate-specific scorers of ``sub`` among ``names`` (each reads the query's spectrum against its
        candidates: ``scorer.score(spectrum, molecules, adduct)``)."""
        scorers = {FRAGMENTS: self._fragmenter(sub) if FRAGMENTS in names else None,
                   FRAGMENT_MODEL: getattr(sub, "fragment_model", None) if FRAGMENT_MODEL in names else None}
        return {name: scorer for name, scorer in scorers.items() if scorer is not None}

    # -- the on-disk cache of per-structure fragmentation ----------------------------------------------------
    def _disk_caches(self, scorers: Mapping[str, Any]) -> dict[str, Any]:
        """The on-disk caches of ``scorers`` (name -> :class:`~molpredict.chem.fragment_cache.ScorerDiskCache`),
        under the coordinates cache's root; none with ``cache_root=False`` or a remote root (SQLite's locks need
        a local disk)."""
        from molpredict.identification.coordinates_cache import local_directory

        root = getattr(self.coordinates, "cache_root", False)
        directory = local_directory(root) if root is not False else None
        if directory is None:
            return {}
        out = {}
        for name, scorer in scorers.items():
            key = (id(scorer), name)
            content = scorer.disk_cache_key()  # asked each time: a scorer refitted in place gets a new store
            if key not in self._disk or self._disk[key][1].store.key != content:
                from molpredict.chem.fragment_cache import FragmentCache, ScorerDiskCache
                # keep the scorer alive with its cache: an id() may be reused once its object is gone
                self._disk[key] = (scorer, ScorerDiskCache(scorer, FragmentCache(directory, content)))
            out[name] = self._disk[key][1]
        return out

    def _with_disk_cache(self, scorers: Mapping[str, Any], ids: np.ndarray, timings: Counter):
        """Load the stored fragmentation of candidates ``ids`` into ``scorers``' memory; returns the function that
        stores what the scorers computed for the others (call it after scoring them)."""
        disk = self._disk_caches(scorers)
        if not disk or not len(ids):
            return lambda: None
        t0 = time.perf_counter()
        source = self.coordinates.source
        smiles = [m.smiles for m in source.molecules(ids)]
        keys = [str(k) for k in source.inchikey14(ids)]
        missing = {name: cache.prefetch(keys, smiles) for name, cache in disk.items()}
        timings["fragment_cache_s"] += time.perf_counter() - t0

        def store() -> None:
            t1 = time.perf_counter()
            for name, cache in disk.items():
                cache.store_new(missing[name])
            timings["fragment_cache_s"] += time.perf_counter() - t1
        return store

    def _second_pass_terms(self, queries: Sequence[Any], out: list[dict[str, np.ndarray]], timings: Counter) -> None:
        """Add the second pass's terms to each query's ``out`` entry: computed for the candidates some variant's
        second pass re-ranks (its first pass's top ``k``), NaN elsewhere."""
        sub = queries[0].sub
        variants = [self.variant(sub)]
        if self.every_variant and self.use_prior:
            variants.append(self.variant(sub, use_prior=False))
        variants = [v for v in variants if v is not None and v.fusion.rerank is not None]
        names = sorted({t for v in variants for t in v.fusion.rerank_terms})
        scorers = self._scorers(sub, names)
        if not scorers:
            return
        self._candidate_terms(queries, out, scorers, self._rerank_candidates(queries, out, variants), timings)

    @staticmethod
    def _rerank_candidates(queries: Sequence[Any], out: Sequence[Mapping[str, np.ndarray]],
                           variants: Sequence[ScoringVariant]) -> list[np.ndarray]:
        """Positions (into each query's candidates) that some variant's second pass re-ranks: the union of their
        first passes' top ``k``, each first pass run once over the block's flat candidate sets (what
        :meth:`ScoreFusion.rerank_candidates` gives one set at a time). ndarray of int64 per query."""
        chosen = [np.zeros(0, dtype=np.int64) for _ in queries]
        filled = [i for i, q in enumerate(queries) if len(q.ids)]
        if not filled:
            return chosen
        offsets, flat, context = _flat_sets(queries, out, filled, set.intersection(*(set(out[i]) for i in filled)))
        tops = [top_k_flat(v.fusion.first_pass(flat, offsets, context), offsets, v.fusion.rerank.k) for v in variants]
        for j, i in enumerate(filled):
            chosen[i] = np.unique(np.concatenate([keep[kept[j]:kept[j + 1]] - offsets[j] for keep, kept in tops]))
        return chosen

    def _candidate_terms(self, queries: Sequence[Any], out: list[dict[str, np.ndarray]], scorers: Mapping[str, Any],
                         picked: Sequence[np.ndarray], timings: Counter) -> None:
        """Each candidate-specific scorer's term (it reads the query's spectrum against its candidates) for the
        candidates ``picked[i]`` (positions into query ``i``'s) of every query, NaN for the others, into ``out``.
        The stored fragmentation of a group of queries' picked candidates is read in one go before they are
        scored, what was computed written after."""
        source = self.coordinates.source
        for group in _groups_within(np.array([len(p) for p in picked]), _memory_room(scorers)):
            store = self._with_disk_cache(
                scorers, np.unique(np.concatenate([queries[i].ids[picked[i]] for i in group])), timings)
            for i in group:
                q = queries[i]
                molecules = source.molecules(q.ids[picked[i]]) if len(picked[i]) else []
                for name, scorer in scorers.items():
                    t0 = time.perf_counter()
                    values = np.full(len(q.ids), np.nan)
                    if len(molecules):
                        values[picked[i]] = np.asarray(scorer.score(q.spectrum, molecules, query_adduct(q)),
                                                       dtype=np.float64)
                    out[i][name] = values
                    timings[f"{name}_s"] += time.perf_counter() - t0
            store()

    # -- terms -----------------------------------------------------------------------------------------------
    def terms(self, queries: Sequence[Any], raw: Sequence[np.ndarray], timings: Counter,
              wanted: Sequence[str] | None = None) -> list[dict[str, np.ndarray]]:
        """The raw terms of each query of one block (queries of one sub-model).

        Parameters
        ----------
        queries : sequence of Query
        raw : sequence of ndarray
            The model's scores of each query's candidates (aligned with ``query.ids``).
        timings : Counter
            ``prior_s`` and ``fragments_s`` are added.
        wanted : sequence of str, optional
            Terms to compute (default: :meth:`wanted_terms`); unavailable ones are left out.

        Returns
        -------
        list of dict
            Per query: term name -> ndarray (len(query.ids),).
        """
        out = [{SPECTRUM: np.asarray(r, dtype=np.float64)} for r in raw]
        if not queries:
            return out
        sub = queries[0].sub
        wanted = list(wanted) if wanted is not None else self.wanted_terms(sub)
        if PRIOR in wanted and self.use_prior and sub.prior is not None:
            t0 = time.perf_counter()
            union = np.unique(np.concatenate([q.ids for q in queries]))
            prior = self.coordinates.of_model(sub.prior, union, timings)[:, 0]
            for q, terms in zip(queries, out):
                terms[PRIOR] = prior[np.searchsorted(union, q.ids)]
            timings["prior_s"] += time.perf_counter() - t0
        # the candidate-specific terms on every candidate (a fusion that weighs them in its first pass)
        scorers = self._scorers(sub, wanted)
        if scorers:
            self._candidate_terms(queries, out, scorers, [np.arange(len(q.ids)) for q in queries], timings)
        return out

    def fuse(self, query: Any, terms: Mapping[str, np.ndarray]) -> QueryScores:
        """One query's ranking score and probability from its terms."""
        variant = self.variant(query.sub)
        if variant is None:
            return QueryScores(np.asarray(terms[SPECTRUM], dtype=np.float64), dict(terms))
        # the set's kind, for a learnt ranker: candidates by formula, or from a mass window
        fused = variant.fusion.combine(terms, {"formula_known": _formula_known(query)})
        probability = math.nan
        if variant.calibrator is not None and len(fused):
            calibrator = variant.calibrator
            extra = self._rank1_features(query, fused, terms, calibrator.needs) if calibrator.needs else None
            probability = float(calibrator.predict(ranking_features(fused, variant.fusion.temperature,
                                                                    calibrator.features, extra)))
        return QueryScores(fused, dict(terms), probability)

    # -- what the calibration reads of the rank-1 candidate ----------------------------------------------------
    def known(self, sub: Any, ids: np.ndarray) -> np.ndarray:
        """Whether each candidate ``ids`` is a structure ``sub``'s prior knows (a training structure for the
        default prior: top similarity 1), ndarray of shape (len(ids),), bool; all False without a prior."""
        ids = np.asarray(ids, dtype=np.int64)
        prior = sub.prior
        if prior is None or not hasattr(prior, "is_reference") or not len(ids):
            return np.zeros(len(ids), dtype=bool)
        distinct, inverse = np.unique(ids, return_inverse=True)
        missing = [int(i) for i in distinct if (id(sub), int(i)) not in self._known]
        if missing:
            flags = prior.is_reference(self.coordinates.source.molecules(np.asarray(missing, dtype=np.int64)))
            self._known.update({(id(sub), i): bool(f) for i, f in zip(missing, flags)})
        return np.array([self._known[(id(sub), int(i))] for i in distinct], dtype=bool)[inverse]

    def _rank1_features(self, query: Any, fused: np.ndarray, terms: Mapping[str, np.ndarray],
                        needs: Sequence[str]) -> dict[str, float]:
        """The calibration features of the rank-1 candidate (``rank1_known``, ``rank1_prior``) and of the set
        (``one_formula``) of one query."""
        block = self._rank1_features_flat([query], fused, np.array([0, len(fused)]), [terms], needs)
        return {name: float(values[0]) for name, values in block.items()}

    def _rank1_features_flat(self, queries: Sequence[Any], fused: np.ndarray, offsets: np.ndarray,
                             terms: Sequence[Mapping[str, np.ndarray]], needs: Sequence[str]
                             ) -> dict[str, np.ndarray]:
        """:meth:`_rank1_features` of queries of one sub-model at once, each an ndarray of shape (n_queries,),
        from their flat fused scores (``offsets``: (n_queries + 1,)). Whether the rank-1 structures are known is
        asked once for the block (a prior featurises its unseen candidates together, not one by one)."""
        tops = top_index_flat(fused, offsets) - np.asarray(offsets[:-1], dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        if "rank1_known" in needs:
            top_ids = np.array([q.ids[t] for q, t in zip(queries, tops)], dtype=np.int64)
            out["rank1_known"] = self.known(queries[0].sub, top_ids).astype(np.float64) if len(queries) \
                else np.zeros(0)
        if "rank1_prior" in needs:
            out["rank1_prior"] = np.array([float(t[PRIOR][top]) if PRIOR in t else 0.0 for t, top in zip(terms, tops)],
                                          dtype=np.float64)
        if "one_formula" in needs:
            out["one_formula"] = np.array([float(self.coordinates.source.one_formula(q.ids)) for q in queries],
                                          dtype=np.float64)
        wanted = [name for name in SPECTRUM_FEATURES if name in needs]
        if wanted:  # the query spectrum as the model cleaned it, as validation described its queries
            described = spectrum_features([q.spectrum for q in queries])
            out.update({name: described[name] for name in wanted})
        return out

    def scores(self, queries: Sequence[Any], raw: Sequence[np.ndarray], timings: Counter) -> list[QueryScores]:
        """:meth:`terms` (and a second pass's terms on its top ``k``) then :meth:`fuse`, for one block of queries
        of one sub-model."""
        terms = self.terms(queries, raw, timings)
        if queries:
            self._second_pass_terms(queries, terms, timings)
        return self.fuse_block(queries, terms)

    def fuse_block(self, queries: Sequence[Any], terms: Sequence[Mapping[str, np.ndarray]]) -> list[QueryScores]:
        """:meth:`fuse` of a block of queries of one sub-model at once: the fusion and the calibration run once
        over the flat concatenation of their candidate sets (the functions training fits them with), which gives
        what :meth:`fuse` gives one query at a time, without its per-query overhead. Queries without candidates,
        or whose terms differ from the others', go through :meth:`fuse`."""
        variant = self.variant(queries[0].sub) if queries else None
        if variant is None:
            return [self.fuse(q, t) for q, t in zip(queries, terms)]
        names = set(terms[0])
        batched = [i for i, t in enumerate(terms) if len(t[SPECTRUM]) and set(t) == names]
        alone = set(range(len(queries))) - set(batched)
        out: list[QueryScores | None] = [self.fuse(queries[i], terms[i]) if i in alone else None
                                         for i in range(len(queries))]
        if not batched:
            return out  # type: ignore[return-value]
        offsets, flat, context = _flat_sets(queries, terms, batched, names)
        fused = variant.fusion.combine_flat(flat, offsets, context)
        probability = np.full(len(batched), math.nan)
        calibrator = variant.calibrator
        if calibrator is not None:
            extra = None
            if calibrator.needs:
                extra = self._rank1_features_flat([queries[i] for i in batched], fused, offsets,
                                                  [terms[i] for i in batched], calibrator.needs)
            features = ranking_features_flat(fused, offsets, variant.fusion.temperature, calibrator.features, extra)
            probability = np.asarray(calibrator.predict(features), dtype=np.float64)
        for j, i in enumerate(batched):
            out[i] = QueryScores(fused[offsets[j]:offsets[j + 1]].copy(), dict(terms[i]), float(probability[j]))
        return out  # type: ignore[return-value]


def _formula_known(query: Any) -> float:
    """The set's kind a learnt ranker reads: 1 for candidates selected by formula, 0 for a mass window."""
    return 0.0 if getattr(query, "window", "") else 1.0


def _flat_sets(queries: Sequence[Any], terms: Sequence[Mapping[str, np.ndarray]], members: Sequence[int],
               names: Iterable[str]) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The candidate sets of ``queries[members]`` as the flat arrays the fusion reads: ``(offsets (n_sets + 1,),
    term name -> (n_total,) for ``names``, {"formula_known": (n_sets,)})``; every member has candidates."""
    offsets = np.concatenate([[0], np.cumsum([len(queries[i].ids) for i in members])]).astype(np.int64)
    flat = {name: np.concatenate([np.asarray(terms[i][name], dtype=np.float64) for i in members]) for name in names}
    return offsets, flat, {"formula_known": np.array([_formula_known(queries[i]) for i in members])}


def _memory_room(scorers: Mapping[str, Any]) -> int:
    """Candidates whose fragmentation one group of queries may load into the scorers' memory caches: half the
    smallest cache, so that what was loaded is not dropped before it is read."""
    sizes = [int(getattr(s, "cache_size", 0) or 0) for s in scorers.values()]
    return max(1, min(sizes, default=0) // 2)


def _groups_within(sizes: np.ndarray, room: int) -> list[list[int]]:
    """Consecutive groups of indices whose ``sizes`` sum to at most ``room`` (a larger item alone)."""
    groups: list[list[int]] = []
    total = room + 1
    for i, size in enumerate(sizes.tolist()):
        if total + size > room:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += size
    return groups


def query_adduct(query: Any) -> str | None:
    """The adduct the query was matched with (its own, or the first candidate's when it had to try several)."""
    if query.adduct:
        return query.adduct
    if query.adducts is not None and len(query.adducts):
        return str(query.adducts[0])
    return query.spectrum.adduct
