"""Validation candidate sets and what is fitted on them: the score fusion's weights and the calibration.

Training chooses by how a model *ranks*, so it needs, for each validation spectrum, a candidate set in which the
true structure competes with plausible alternatives. Those come from a MassSpecGym-style candidate file
(``--val-candidates val_formula256.json``, read by
:func:`molpredict.chem.candidates.load_candidate_sets`) or are built from a library: every library structure with the
validation structure's molecular formula (``--library``), at most ``max_candidates`` of them, the truth always in.

:func:`validation_terms` scores every validation query's set with each term the fusion may weigh (the spectrum
model, the prior, the fragment scorer) as flat arrays; :func:`fit_scoring` then picks the fusion weights by the
ranking metric and fits the calibration on out-of-fold queries (two folds by structure), so the probabilities
are not judged on the same queries that chose the weights.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from molpredict.chem.candidates import in_key_order, shares_one_formula
from molpredict.chem.molecules import Molecule, n_workers
from molpredict.identification.calibration import (ALL_FEATURES, EXTRA_FEATURES, FDR_Z, SPECTRUM_FEATURES,
                                                   WEIGHTINGS, Calibrator, confident_at_fdr,
                                                   expected_calibration_error, grouped_folds, ranking_features_flat,
                                                   select_calibrator, spectrum_features, structure_weights,
                                                   top_index_flat)
from molpredict.errors import InputError
from molpredict.identification.evidence import Evidence, query_adduct
from molpredict.identification.fusion import (FRAGMENT_MODEL, FRAGMENTS, FUSION_KINDS, PRIOR, RERANK_TERMS, SPECTRUM,
                                              ScoreFusion, fit_fusion_kind, top_k_flat, true_ranks)
from molpredict.spectra.record import Spectrum

__all__ = ["candidate_sets_from_library", "ranking_candidates", "fit_submodel_scoring", "ValidationTerms",
           "validation_terms", "shared_validation_terms", "second_pass_scorers", "add_second_pass_terms",
           "choose_rerank", "fit_scoring"]


def candidate_sets_from_library(library: Any, molecules: Iterable[Any], max_candidates: int = 256,
                                seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Same-formula candidate sets for the distinct structures of ``molecules`` drawn from ``library``.

    Parameters
    ----------
    library : CandidateLibrary
    molecules : iterable of Molecule
        The validation structures (one set per distinct InChIKey first block).
    max_candidates : int
        Set size cap, the truth included; larger pools are sub-sampled (seeded).
    seed : int

    Returns
    -------
    dict
        ``{inchikey14: [(inchikey14, smiles), ...]}``, the truth first.
    """
    rng = np.random.default_rng(seed)
    ik14 = library.column("inchikey14")
    smiles = library.column("smiles")
    sets: dict[str, list[tuple[str, str]]] = {}
    for molecule in molecules:
        key = molecule.inchikey14
        if not key or key in sets or not molecule.formula:
            continue
        rows = library.select_by_formula(molecule.formula)
        rows = rows[ik14[rows] != key]
        if rows.size > max_candidates - 1:
            rows = np.sort(rng.choice(rows, size=max_candidates - 1, replace=False))
        sets[key] = [(key, molecule.smiles)] + [(str(ik14[r]), str(smiles[r])) for r in rows]
    return sets


@dataclass
class ValidationTerms:
    """Every validation query's candidate set, flattened.

    Attributes
    ----------
    offsets : ndarray of shape (n_queries + 1,)
        Query ``i``'s candidates are ``offsets[i]:offsets[i+1]``.
    is_true : ndarray of shape (n_candidates_total,), bool
    terms : dict
        Term name -> raw scores, ndarray of shape (n_candidates_total,).
    groups : list of str
        The true InChIKey first block of each query (folds are drawn by structure).
    known : ndarray of shape (n_candidates_total,), bool, or None
        Whether each candidate is a structure the sub-model's prior knows (for the calibration's
        ``rank1_known``); None without a prior.
    queries : list of (Spectrum, adduct) or None
        Each query's spectrum and the adduct its candidates were matched with (None: the spectrum's own), for
        terms computed later (:func:`add_second_pass_terms`); None when not kept.
    molecules : list of Molecule or None
        Each candidate's structure (flat), likewise.
    one_formula : ndarray of shape (n_queries,), bool, or None
        Whether each query's candidates share one molecular formula (the calibration's ``one_formula``); None
        when not computed.
    strata : ndarray of shape (n_queries,), int, or None
        The collection of candidate sets each query was ranked in (the calibration is checked within each);
        None: one collection.
    spectrum_features : ndarray of shape (n_queries, len(SPECTRUM_FEATURES)), or None
        The calibration's features of each query spectrum
        (:func:`~molpredict.identification.calibration.spectrum_features`); None when not computed.
    """

    offsets: np.ndarray
    is_true: np.ndarray
    terms: dict[str, np.ndarray] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    known: np.ndarray | None = None
    queries: list[tuple[Any, Any]] | None = None
    molecules: list[Any] | None = None
    one_formula: np.ndarray | None = None
    strata: np.ndarray | None = None
    spectrum_features: np.ndarray | None = None

    @property
    def n_queries(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def concatenate(cls, parts: Sequence["ValidationTerms"]) -> "ValidationTerms":
        """The queries of several ``ValidationTerms`` (with the same terms) as one; each part without strata is
        its own stratum (a part per collection of sets)."""
        offsets = [parts[0].offsets]
        for part in parts[1:]:
            offsets.append(offsets[-1][-1] + part.offsets[1:])
        known = None if any(p.known is None for p in parts) else np.concatenate([p.known for p in parts])
        kept = all(p.queries is not None and p.molecules is not None for p in parts)
        one_formula = None if any(p.one_formula is None for p in parts) \
            else np.concatenate([p.one_formula for p in parts])
        strata, next_stratum = [], 0
        for part in parts:
            own = np.zeros(part.n_queries, dtype=np.int64) if part.strata is None else part.strata
            strata.append(own + next_stratum)
            next_stratum += int(own.max()) + 1 if len(own) else 1
        described = None if any(p.spectrum_features is None for p in parts) \
            else np.concatenate([p.spectrum_features for p in parts])
        return cls(np.concatenate(offsets), np.concatenate([p.is_true for p in parts]),
                   {k: np.concatenate([p.terms[k] for p in parts]) for k in parts[0].terms},
                   [g for p in parts for g in p.groups], known,
                   [q for p in parts for q in p.queries] if kept else None,  # type: ignore[union-attr]
                   [m for p in parts for m in p.molecules] if kept else None,  # type: ignore[union-attr]
                   one_formula, np.concatenate(strata) if strata else None, described)

    def view(self, names: Sequence[str]) -> "ValidationTerms":
        """The same queries with the terms ``names`` only."""
        return ValidationTerms(self.offsets, self.is_true, {n: self.terms[n] for n in names if n in self.terms},
                               self.groups, self.known, self.queries, self.molecules, self.one_formula,
                               self.strata, self.spectrum_features)

    def subset(self, queries: np.ndarray) -> "ValidationTerms":
        """The queries ``queries`` (indices) as their own flat arrays."""
        sizes = np.diff(self.offsets)[queries]
        flat = np.concatenate([np.arange(self.offsets[q], self.offsets[q + 1]) for q in queries]) \
            if len(queries) else np.zeros(0, dtype=np.int64)
        return ValidationTerms(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), self.is_true[flat],
                               {k: v[flat] for k, v in self.terms.items()}, [self.groups[q] for q in queries],
                               None if self.known is None else self.known[flat],
                               one_formula=None if self.one_formula is None else self.one_formula[queries],
                               strata=None if self.strata is None else self.strata[queries],
                               spectrum_features=None if self.spectrum_features is None
                               else self.spectrum_features[queries])


def validation_terms(identifier: Any, spectra: Sequence[Any], wanted: Sequence[str] = (),
                     block: int = 256) -> ValidationTerms:
    """Score every validation spectrum's candidate set with the model and the other ``wanted`` terms.

    Parameters
    ----------
    identifier : Identifier
        Over a bundle holding the sub-model, and a ``SetSource`` of the validation candidate sets.
    spectra : sequence of Spectrum
        Labelled validation spectra (their INCHIKEY picks the set); those without a set are left out.
    wanted : sequence of str
        Terms besides ``spectrum`` (the model's own score, always computed): ``prior``, ``fragments``.
    block : int
        Queries per :meth:`~molpredict.identification.evidence.Evidence.terms` call (the prior is scored once per
        block's union of candidates).

    Returns
    -------
    ValidationTerms
    """
    from molpredict.identification.evaluate import collect_queries, labelled_queries

    source = identifier.source
    labelled, _ = collect_queries(spectra, source)
    prepared = labelled_queries(identifier, [(i, lq.spectrum, lq.inchikey14) for i, lq in enumerate(labelled)])
    if not prepared:
        raise InputError("no validation spectrum has a candidate set (check --val-candidates / --library)")
    scored = list(identifier.scored(prepared))
    queries = [q for q, _ in scored]
    evidence = Evidence(identifier.coordinates, use_prior=True)
    columns: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(scored), block):
        chunk = scored[start:start + block]
        for terms in evidence.terms([q for q, _ in chunk], [s for _, s in chunk], identifier.timings,
                                    wanted=list(wanted)):
            for name, values in terms.items():
                columns.setdefault(name, []).append(values)
    sizes = [len(q.ids) for q in queries]
    sub = queries[0].sub
    all_ids = np.concatenate([q.ids for q in queries])
    known = evidence.known(sub, all_ids) if sub.prior is not None else None
    return ValidationTerms(
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        is_true=np.concatenate([source.inchikey14(q.ids) == q.true_key for q in queries]),
        terms={k: np.concatenate(v).astype(np.float64) for k, v in columns.items()},
        groups=[q.true_key for q in queries], known=known,
        queries=[(q.spectrum, query_adduct(q)) for q in queries], molecules=list(source.molecules(all_ids)),
        one_formula=np.array([source.one_formula(q.ids) for q in queries], dtype=bool),
        spectrum_features=_spectrum_feature_matrix([q.spectrum for q in queries]))


def shared_validation_terms(sub: Any, validation: Any, wanted: Sequence[str] = ()) -> ValidationTerms | None:
    """The validation terms from the model's own grid search, without scoring the validation sets again: the
    scores its chosen grid point gave every validation candidate (``sub.model.validation_scores_``, flat in the
    order of ``validation.candidates.flat()``) and the prior of each distinct candidate structure, scored once.

    The grid search, the fusion and the calibration thus share one scoring pass. None when the model kept no
    such scores (another model, no ranking-aware selection) or a term other than the prior is wanted (the
    fragment score needs each query spectrum): then use :func:`validation_terms`.

    Parameters
    ----------
    sub : SubModel
        Its model fitted with ``val=validation``.
    validation : ValidationData
        The validation inputs, their label structures and the
        :class:`~molpredict.models.base.CandidateSets` the model ranked.
    wanted : sequence of str
        Terms besides ``spectrum``.

    Returns
    -------
    ValidationTerms or None
        One query per candidate set (grouped by the label's InChIKey first block), the sets in their order.
    """
    candidates = getattr(validation, "candidates", None)
    scores = getattr(sub.model, "validation_scores_", None)
    if candidates is None or scores is None or not len(candidates) or any(w != PRIOR for w in wanted):
        return None
    offsets, flat, is_true = candidates.flat()
    if len(scores) != len(flat):
        return None
    terms = {SPECTRUM: np.asarray(scores, dtype=np.float64)}
    if PRIOR in wanted and sub.prior is not None:
        prior = np.asarray(sub.prior.candidate_coordinates(candidates.molecules), dtype=np.float64)[:, 0]
        terms[PRIOR] = prior[flat]
    known = None
    if sub.prior is not None and hasattr(sub.prior, "is_reference"):
        # which candidates the prior knows (the calibrator's rank1_known), once per distinct candidate
        known = np.asarray(sub.prior.is_reference(candidates.molecules), dtype=bool)[flat]
    labels, inputs = validation[1], validation[0]
    groups = [labels[p].inchikey14 for p in candidates.positions]
    pool = candidates.molecules
    one_formula: dict[bytes, bool] = {}  # a structure's set is shared by its spectra: checked once
    if all(isinstance(m, Molecule) for m in pool):  # other outputs (vectors, graphs) have no formula
        for members in candidates.sets:
            key = members.tobytes()
            if key not in one_formula:
                one_formula[key] = shares_one_formula(pool[j] for j in members)
    return ValidationTerms(offsets=offsets, is_true=is_true, terms=terms, groups=groups, known=known,
                           queries=[(inputs[p], None) for p in candidates.positions],
                           molecules=[pool[j] for j in flat],
                           one_formula=np.array([one_formula[m.tobytes()] for m in candidates.sets], dtype=bool)
                           if one_formula else None, strata=candidates.collections.copy(),
                           spectrum_features=_spectrum_feature_matrix([inputs[p] for p in candidates.positions]))


def _spectrum_feature_matrix(inputs: Sequence[Any]) -> np.ndarray | None:
    """:func:`~molpredict.identification.calibration.spectrum_features` of each query as columns, shape
    (n_queries, len(SPECTRUM_FEATURES)); None when the queries are not spectra (text)."""
    if not inputs or not all(isinstance(x, Spectrum) for x in inputs):
        return None
    features = spectrum_features(inputs)
    return np.column_stack([features[name] for name in SPECTRUM_FEATURES])


def second_pass_scorers(sub: Any) -> dict[str, Any]:
    """The scorers of the :data:`~molpredict.identification.fusion.RERANK_TERMS` a sub-model carries (term name ->
    ``scorer.score(spectrum, molecules, adduct)``): the fragment score from its settings, its fragmentation
    model."""
    out: dict[str, Any] = {}
    if sub.fragments is not None:
        from molpredict.chem.fragments import FragmentScorer
        out[FRAGMENTS] = FragmentScorer(**sub.fragments)
    if getattr(sub, "fragment_model", None) is not None:
        out[FRAGMENT_MODEL] = sub.fragment_model
    return out


def add_second_pass_terms(data: ValidationTerms, scorers: Mapping[str, Any], firsts: Sequence[np.ndarray], k: int,
                          log: Any = None, n_jobs: int = -1) -> ValidationTerms:
    """``data`` with the terms of ``scorers`` computed on each query's top ``k`` under any of the first-pass
    scores ``firsts`` (flat, aligned with ``data``), NaN elsewhere: what a second pass
    (:class:`~molpredict.identification.fusion.Rerank`) with ``k`` or fewer reads.

    Parameters
    ----------
    data : ValidationTerms
        With ``queries`` and ``molecules`` kept.
    scorers : mapping
        Term name -> scorer (``scorer.score(spectrum, molecules, adduct) -> ndarray``).
    firsts : sequence of ndarray of shape (n_candidates_total,)
    k : int
    log : callable, optional
    n_jobs : int
        Processes (``-1``: one per core); each takes whole structures, with fresh copies of the scorers
        (:data:`PARALLEL_MIN_CANDIDATES` or more candidates only). The terms do not depend on it.

    Returns
    -------
    ValidationTerms
    """
    if data.queries is None or data.molecules is None:
        raise ValueError("add_second_pass_terms: the validation terms kept no spectra and candidates")
    chosen = np.zeros(len(data.is_true), dtype=bool)
    for first in firsts:
        chosen[top_k_flat(first, data.offsets, k)[0]] = True
    terms = {name: np.full(len(data.is_true), np.nan) for name in scorers}
    t0 = time.perf_counter()
    # the spectra of one structure rank the same candidates: one after another, the scorers' per-structure caches
    # serve all but the first
    order = sorted(range(data.n_queries), key=lambda i: (data.groups[i], i))
    items = []
    for q in order:
        rows = data.offsets[q] + np.flatnonzero(chosen[data.offsets[q]:data.offsets[q + 1]])
        items.append((rows, *data.queries[q], [data.molecules[r] for r in rows]))
    workers = n_workers(n_jobs) if int(chosen.sum()) >= PARALLEL_MIN_CANDIDATES else 1
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        # fresh scorers (no memory caches to ship) and SMILES (cheap to send): a chunk of whole structures each
        fresh = {name: _cacheless_copy(scorer) for name, scorer in scorers.items()}
        tasks = [(fresh, [(rows, spectrum, adduct, [m.smiles for m in molecules])
                          for rows, spectrum, adduct, molecules in chunk])
                 for chunk in _structure_chunks(items, [data.groups[q] for q in order], 4 * workers)]
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for done in pool.map(_second_pass_chunk, tasks):
                for name, rows, values in done:
                    terms[name][rows] = values
    else:
        for name, rows, values in _second_pass_chunk((scorers, items)):
            terms[name][rows] = values
    if log is not None:
        log(f"  second-pass terms ({', '.join(scorers)}) on {int(chosen.sum())} candidates of {data.n_queries} "
            f"queries in {time.perf_counter() - t0:.0f} s" + (f" ({workers} processes)" if workers > 1 else ""))
    return replace(data, terms={**data.terms, **terms})


#: fewer second-pass candidates than this are scored in-process (starting processes costs seconds)
PARALLEL_MIN_CANDIDATES = 20_000


def _second_pass_chunk(task: tuple[Mapping[str, Any], Sequence[tuple]]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Score ``(rows, spectrum, adduct, molecules)`` items with every scorer: ``[(term, rows, values), ...]``."""
    scorers, items = task
    out = []
    for rows, spectrum, adduct, molecules in items:
        for name, scorer in scorers.items():
            out.append((name, rows, np.asarray(scorer.score(spectrum, molecules, adduct), dtype=np.float64)))
    return out


def _cacheless_copy(scorer: Any) -> Any:
    """The same scorer without its per-structure memory: rebuilt from its fitted state, or from its parameters
    when it has none."""
    if hasattr(scorer, "state") and hasattr(type(scorer), "from_state"):
        return type(scorer).from_state(*scorer.state())
    return type(scorer)(**scorer.get_params())


def _structure_chunks(items: Sequence[tuple], groups: Sequence[str], n_chunks: int) -> list[list[tuple]]:
    """``items`` (sorted by structure) cut into about ``n_chunks`` runs of similar candidate counts, never
    between two items of one structure (a structure's candidates are then fragmented in one process only)."""
    sizes = np.array([len(item[0]) for item in items], dtype=np.float64)
    target = sizes.sum() / max(n_chunks, 1)
    chunks: list[list[tuple]] = [[]]
    filled = 0.0
    for i, item in enumerate(items):
        if filled >= target and groups[i] != groups[i - 1]:
            chunks.append([])
            filled = 0.0
        chunks[-1].append(item)
        filled += sizes[i]
    return [c for c in chunks if c]


def structure_sample(spectra: Sequence[Any], max_structures: int, seed: int = 0) -> list[Any]:
    """The spectra of a seeded sample of at most ``max_structures`` distinct structures (InChIKey first block)."""
    keys = sorted({s.inchikey.split("-", 1)[0] for s in spectra if s.inchikey})
    if len(keys) <= max_structures:
        return list(spectra)
    chosen = set(np.random.default_rng(seed).choice(keys, size=max_structures, replace=False).tolist())
    return [s for s in spectra if s.inchikey and s.inchikey.split("-", 1)[0] in chosen]


def calibration_data(data: ValidationTerms, fused: np.ndarray, temperature: float
                     ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Every calibration feature (:data:`~molpredict.identification.calibration.ALL_FEATURES`) of each query under
    the fused scores ``fused`` (flat, aligned with ``data``), whether its rank 1 is right, and the features
    available at prediction time (``rank1_prior`` needs the prior term, ``rank1_known`` the prior,
    ``one_formula`` the sets' kinds, ``data.one_formula``)."""
    top = top_index_flat(fused, data.offsets)
    available = [n for n in ALL_FEATURES if n not in EXTRA_FEATURES]
    extra = {name: np.zeros(len(top)) for name in EXTRA_FEATURES}
    if data.one_formula is not None:
        extra["one_formula"] = data.one_formula.astype(np.float64)
        available.append("one_formula")
    if data.known is not None:
        extra["rank1_known"] = data.known[top].astype(np.float64)
        available.append("rank1_known")
    if PRIOR in data.terms:
        extra["rank1_prior"] = np.asarray(data.terms[PRIOR], dtype=np.float64)[top]
        available.append("rank1_prior")
    if data.spectrum_features is not None:
        for column, name in enumerate(SPECTRUM_FEATURES):
            extra[name] = np.asarray(data.spectrum_features[:, column], dtype=np.float64)
            available.append(name)
    features = ranking_features_flat(fused, data.offsets, temperature, ALL_FEATURES, extra)
    return features, true_ranks(fused, data.offsets, data.is_true) == 1, available


def choose_fusion(data: ValidationTerms, metric: str = "mrr", seed: int = 0, n_folds: int = 3
                  ) -> tuple[str, dict[str, Any]]:
    """Fixed weights or a learnt ranker: each fitted on ``n_folds - 1`` folds of structures and ranked on the
    last, both ways round; the ranker is chosen only when its out-of-fold ``metric`` is higher and its hit@1 is
    not lower.

    Returns
    -------
    kind : {"weights", "ranker"}
    report : dict
        JSON-ready out-of-fold metrics of each kind (``n_folds``, ``weights``, ``ranker``, ``chosen``).
    """
    data = data.view([t for t in data.terms if t not in RERANK_TERMS])  # the first pass's terms
    folds = grouped_folds(data.groups, n_folds, seed)
    report: dict[str, Any] = {"n_folds": n_folds}
    for kind in FUSION_KINDS:
        ranks = []
        for k in range(n_folds):
            train_q, test_q = np.flatnonzero(folds != k), np.flatnonzero(folds == k)
            if not len(train_q) or not len(test_q):
                continue
            tr, te = data.subset(train_q), data.subset(test_q)
            fusion = fit_fusion_kind(kind, tr.terms, tr.offsets, tr.is_true, metric=metric)
            ranks.append(true_ranks(fusion.combine_flat(te.terms, te.offsets), te.offsets, te.is_true))
        if not ranks:
            return "weights", {**report, "chosen": "weights"}
        r = np.concatenate(ranks)
        report[kind] = {"mrr": float(np.mean(1.0 / r)), **{f"hit@{j}": float(np.mean(r <= j)) for j in (1, 5, 10)}}
    w, r = report["weights"], report["ranker"]
    chosen = "ranker" if r[metric] > w[metric] + 1e-9 and r["hit@1"] >= w["hit@1"] else "weights"
    report["chosen"] = chosen
    return chosen, report


#: second-pass sizes tried on validation (:func:`choose_rerank`); the largest bounds the candidates fragmented
RERANK_SIZES = (16, 32)


def choose_rerank(data: ValidationTerms, kind: str, ks: Sequence[int], metric: str = "mrr", seed: int = 0,
                  n_folds: int = 3, z: float = 2.0) -> tuple[tuple[int, tuple[str, ...]] | None, dict[str, Any]]:
    """Whether (over how many candidates, with which terms) a second pass re-ranks the first pass's top ``k``
    with the :data:`~molpredict.identification.fusion.RERANK_TERMS` of ``data``: the first pass alone and with
    each ``k`` of ``ks`` and each non-empty subset of those terms, fitted on ``n_folds - 1`` folds of structures
    and ranked on the last, both ways round.

    A setting is eligible only when its out-of-fold gain in MRR over the first pass exceeds ``z`` standard errors
    (queries of one structure taken as one draw: they rise or fall together) and its hit@1 is not lower; of
    several, the best by ``metric``. A term that carries nothing then gets no second pass by chance.

    Returns
    -------
    chosen : (k, terms) or None
        None: no second pass.
    report : dict
        JSON-ready out-of-fold metrics (``first_pass``; ``k=<k>`` for both terms, ``k=<k> <term>`` for one, each
        with its ``mrr_gain`` and ``mrr_gain_se``; ``chosen``: the label or None).
    """
    folds = grouped_folds(data.groups, n_folds, seed)
    first_terms = [t for t in data.terms if t not in RERANK_TERMS]
    later = [t for t in data.terms if t in RERANK_TERMS]
    subsets = [tuple(later)] + ([(t,) for t in later] if len(later) > 1 else [])
    settings = {"first_pass": None}
    for k in ks:
        for terms in subsets:
            settings[f"k={k}" + ("" if terms == tuple(later) else " " + "+".join(terms))] = (int(k), terms)
    ranks = {label: np.zeros(data.n_queries) for label in settings}
    scored = np.zeros(data.n_queries, dtype=bool)
    for fold in range(n_folds):
        train_q, test_q = np.flatnonzero(folds != fold), np.flatnonzero(folds == fold)
        if not len(train_q) or not len(test_q):
            continue
        tr, te = data.subset(train_q), data.subset(test_q)
        for label, setting in settings.items():
            k, terms = setting if setting is not None else (None, ())
            fusion = fit_fusion_kind(kind, tr.view([*first_terms, *terms]).terms, tr.offsets, tr.is_true,
                                     metric=metric, rerank_k=k)
            ranks[label][test_q] = true_ranks(fusion.combine_flat(te.terms, te.offsets), te.offsets, te.is_true)
        scored[test_q] = True
    report: dict[str, Any] = {"n_folds": n_folds, "z": float(z)}
    if not scored.any():
        return None, {**report, "chosen": None}
    groups = np.asarray(data.groups, dtype=object)[scored]
    _, cluster = np.unique(groups, return_inverse=True)
    base_rr = 1.0 / ranks["first_pass"][scored]
    for label in settings:
        r = ranks[label][scored]
        report[label] = {"mrr": float(np.mean(1.0 / r)), **{f"hit@{j}": float(np.mean(r <= j)) for j in (1, 5, 10)}}
        if label != "first_pass":
            diff = 1.0 / r - base_rr
            sums = np.bincount(cluster, weights=diff - diff.mean())
            report[label]["mrr_gain"] = float(diff.mean())
            report[label]["mrr_gain_se"] = float(np.sqrt(np.sum(sums ** 2)) / len(diff))
    base, chosen = report["first_pass"], None
    for label in settings:
        r = report[label]
        if label != "first_pass" and r["mrr_gain"] > z * r["mrr_gain_se"] and r["hit@1"] >= base["hit@1"] and (
                chosen is None or r[metric] > report[chosen][metric]):
            chosen = label
    report["chosen"] = chosen
    return (settings[chosen] if chosen is not None else None), report


def fit_scoring(data: ValidationTerms, metric: str = "mrr", seed: int = 0, n_folds: int = 5,
                fusion_kind: str | None = None, fdr_z: float = FDR_Z, fusion_queries: np.ndarray | None = None,
                weightings: Sequence[str] = tuple(WEIGHTINGS), rerank_ks: Sequence[int] = ()
                ) -> tuple[ScoreFusion, Calibrator, dict[str, Any]]:
    """Fusion weights on all validation queries; calibration on out-of-fold fused scores.

    The fusion is refitted on each fold's complement (folds by structure) to score the fold, so every query gets
    calibration features from a fusion that never saw its structure. The calibrator (feature set and method:
    Platt, beta or isotonic) is then chosen by structure-weighted out-of-fold log-loss and refitted on all of
    them, each structure weighted once (:func:`~molpredict.identification.calibration.select_calibrator`).

    Parameters
    ----------
    data : ValidationTerms
    metric : str
        Ranking metric the weights maximise (``mrr``, ``hit@1``...).
    seed : int
        Seeds the folds.
    n_folds : int
        Folds (by structure) for the out-of-fold calibration data.
    fusion_kind : {"weights", "ranker"}, optional
        How the terms are combined; None: chosen by :func:`choose_fusion` when there are several terms.
    fdr_z : float
        The ``z`` of the FDR upper bound the calibrator carries (:attr:`Calibrator.fdr`, see
        :func:`~molpredict.identification.calibration.fdr_estimates`): what ``evaluate`` reports as the estimated
        FDR of its confident queries. Default :data:`~molpredict.identification.calibration.FDR_Z`, chosen on
        validation; 0: the plain estimate mean(1 - p).
    fusion_queries : ndarray of shape (n_queries,), bool, optional
        The queries the fusion is fitted on (default all); the calibration is fitted on every query (e.g. the
        fusion on same-formula sets, the calibration also on mass-window sets, where it is used as well).
    weightings : sequence of str
        The weightings of structures the calibrators compared are fitted with
        (:data:`~molpredict.identification.calibration.WEIGHTINGS`).
    rerank_ks : sequence of int
        Sizes of the second pass tried (:func:`choose_rerank`) when ``data`` holds
        :data:`~molpredict.identification.fusion.RERANK_TERMS` (computed on the first pass's top candidates,
        :func:`add_second_pass_terms`); those terms are dropped when no second pass is chosen.

    Returns
    -------
    fusion : ScoreFusion
    calibrator : Calibrator
    report : dict
        JSON-ready: the fusion's validation metrics, the out-of-fold metrics, the calibrators compared, ECE (per
        spectrum and per structure) and FDR counts.
    """
    choice: dict[str, Any] = {}
    fusion_mask = np.ones(data.n_queries, dtype=bool) if fusion_queries is None \
        else np.asarray(fusion_queries, dtype=bool)
    if fusion_mask.shape != (data.n_queries,) or not fusion_mask.any():
        raise ValueError("fit_scoring: fusion_queries must be one bool per query, not all False")
    fusion_data = data if fusion_mask.all() else data.subset(np.flatnonzero(fusion_mask))
    first_terms = [t for t in data.terms if t not in RERANK_TERMS]
    if fusion_kind is None:
        fusion_kind, choice = choose_fusion(fusion_data, metric, seed) if len(first_terms) > 1 else ("weights", {})
    rerank_k, rerank_choice = None, {}
    if rerank_ks and len(first_terms) < len(data.terms):
        chosen_rerank, rerank_choice = choose_rerank(fusion_data, fusion_kind, rerank_ks, metric, seed)
        if chosen_rerank is not None:
            rerank_k, rerank_terms = chosen_rerank
    # the second pass's terms that are not used are dropped
    kept = [*first_terms, *(rerank_terms if rerank_k is not None else ())]
    data, fusion_data = data.view(kept), fusion_data.view(kept)
    fusion = fit_fusion_kind(fusion_kind, fusion_data.terms, fusion_data.offsets, fusion_data.is_true, metric=metric,
                             rerank_k=rerank_k)
    if fusion.rerank is not None:
        fusion.rerank.validation = rerank_choice
    folds = grouped_folds(data.groups, n_folds, seed)
    features = np.zeros((data.n_queries, len(ALL_FEATURES)))
    correct = np.zeros(data.n_queries, dtype=bool)
    available: list[str] = []
    out_of_fold = np.zeros(data.n_queries, dtype=bool)
    for k in range(n_folds):
        train_q, test_q = np.flatnonzero((folds != k) & fusion_mask), np.flatnonzero(folds == k)
        if not len(train_q) or not len(test_q):
            continue
        tr, te = data.subset(train_q), data.subset(test_q)
        fold_fusion = fit_fusion_kind(fusion_kind, tr.terms, tr.offsets, tr.is_true, metric=metric,
                                      rerank_k=rerank_k)
        features[test_q], correct[test_q], available = calibration_data(
            te, fold_fusion.combine_flat(te.terms, te.offsets), fold_fusion.temperature)
        out_of_fold[test_q] = True
    fused = fusion.combine_flat(data.terms, data.offsets)
    in_sample, hits, available_all = calibration_data(data, fused, fusion.temperature)
    if not out_of_fold.all():  # one structure only: no out-of-fold data, calibrate in-sample
        features, correct, available = in_sample, hits, available_all
    calibrator, table = select_calibrator(features, correct, data.groups, ALL_FEATURES, available,
                                          n_folds=n_folds, seed=seed + 1, weightings=weightings,
                                          strata=data.strata)
    calibrator.fdr = {"z": float(fdr_z), "clusters": "rank1"}
    columns = [ALL_FEATURES.index(n) for n in calibrator.features]
    probability = calibrator.predict(in_sample[:, columns])
    n_confident, threshold = confident_at_fdr(probability, 0.1)
    weights = structure_weights(data.groups)
    chosen = calibrator.validation
    report = {
        "metric": metric, "n_queries": data.n_queries, "n_structures": len(set(data.groups)),
        "weights": fusion.weights, "fusion_kind": fusion_kind, **({"fusion_choice": choice} if choice else {}),
        **({"rerank_choice": rerank_choice} if rerank_choice else {}),
        "temperature": fusion.temperature, "fused": fusion.validation["fused"],
        **{k: v for k, v in fusion.validation.items() if k.endswith("_alone")},
        "out_of_fold_hit@1": float(np.mean(correct)),
        "calibration": {"method": calibrator.method, "features": list(calibrator.features),
                        "feature_set": chosen.get("feature_set"), "weighting": chosen.get("weighting"),
                        "selected_by": chosen.get("selected_by"),
                        "ece_out_of_fold": chosen.get("ece"),
                        "ece_out_of_fold_per_structure": chosen.get("ece_per_structure"),
                        "ece_out_of_fold_per_stratum": chosen.get("ece_per_stratum"),
                        "log_loss_out_of_fold": chosen.get("log_loss"),
                        "observed_fdr_out_of_fold": chosen.get("observed_fdr"),
                        "ece_in_sample": expected_calibration_error(probability, hits),
                        "ece_in_sample_per_structure": expected_calibration_error(probability, hits,
                                                                                  weights=weights),
                        "n_bins": 10, "confident_at_fdr_0.1": n_confident, "threshold": threshold,
                        "fdr": dict(calibrator.fdr),
                        "compared": table},
    }
    return fusion, calibrator, report


def ranking_candidates(molecules: Sequence[Any], collections: Sequence[Mapping[str, Sequence[tuple[str, str]]]],
                       scored_only: Sequence[Mapping[str, Sequence[tuple[str, str]]]] = ()) -> Any:
    """:class:`~molpredict.models.base.CandidateSets` for validation labels ``molecules``: for each collection of
    sets, one set per input whose structure has a set there (an input may rank once per collection), or None
    when no input has one. The sets of the ``scored_only`` collections follow, not ``ranked``: the model scores
    them in the same pass, for the calibration alone. Each set records the collection it came from
    (``collections``: its index among ``collections`` then ``scored_only``). A set's candidates come in key
    order (:func:`~molpredict.chem.candidates.in_key_order`), not the file's, which puts the truth first."""
    from molpredict.models.base import CandidateSets
    from molpredict.chem.molecules import Molecule

    index: dict[tuple[str, str], int] = {}
    pool: list[Any] = []
    chosen, truth, positions, ranked, drawn_from = [], [], [], [], []
    for n_collection, sets in enumerate([*collections, *scored_only]):
        per_structure: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        for position, molecule in enumerate(molecules):
            key = molecule.inchikey14
            if key not in per_structure:
                per_structure[key] = None
                entries = sets.get(key)
                if entries:
                    ids = []
                    for pair in in_key_order(entries):
                        j = index.get(pair)
                        if j is None:
                            j = index[pair] = len(pool)
                            pool.append(Molecule(pair[1], inchikey14=pair[0]))
                        ids.append(j)
                    per_structure[key] = (np.asarray(ids, dtype=np.int64),
                                          np.array([pool[j].inchikey14 == key for j in ids], dtype=bool))
            found = per_structure[key]
            if found is not None:
                chosen.append(found[0])
                truth.append(found[1])
                positions.append(position)
                ranked.append(n_collection < len(collections))
                drawn_from.append(n_collection)
    if not any(ranked):
        return None
    return CandidateSets(pool, chosen, truth, positions, ranked, drawn_from)


def fit_submodel_scoring(sub: Any, val_spectra: Sequence[Any],
                         collections: Sequence[Mapping[str, Sequence[tuple[str, str]]]], metric: str = "mrr",
                         seed: int = 0, log: Any = None, max_structures: int | None = None,
                         cache_root: Any = False, validation: Any = None,
                         calibration_collections: Sequence[Mapping[str, Sequence[tuple[str, str]]]] = ()
                         ) -> dict[str, Any]:
    """Fit ``sub``'s fusion and calibration, with and without its prior, on validation candidate sets (every
    validation spectrum ranks once per collection of sets).

    Sets ``sub.scoring`` (see :mod:`molpredict.identification.evidence`) and returns the JSON-ready report (per
    variant).
    ``max_structures`` bounds the cost (the fragment score fragments every candidate): the spectra of a seeded
    sample of that many validation structures are used (all when None). ``cache_root``: where candidate
    coordinates are cached (False: nowhere, the default at training time).
    ``validation``: the :class:`~molpredict.models.base.ValidationData` the model was fitted with; when its grid
    search kept its candidates' scores, those are the spectrum term (:func:`shared_validation_terms`: one scoring
    pass for the grid, the fusion and the calibration) and ``val_spectra`` / ``collections`` are not scored again.
    ``calibration_collections``: more collections of sets (e.g. mass-window sets) whose queries the calibration
    is fitted on but not the fusion (:func:`fit_scoring`'s ``fusion_queries``).
    """
    from molpredict.identification.candidate_sources import SetSource
    from molpredict.identification.evidence import WITH_PRIOR, WITHOUT_PRIOR, ScoringVariant
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.modelfile import ModelBundle

    say = log or (lambda message: None)
    bundle = ModelBundle({sub.ion_mode: sub})
    # every candidate gets the first pass's terms; the fragmentation terms go to a second pass over its top k
    wanted = [PRIOR] * (sub.prior is not None)
    second = second_pass_scorers(sub)
    if max_structures is not None:
        val_spectra = structure_sample(val_spectra, max_structures, seed)
    def scored(collections_: Sequence[Mapping[str, Sequence[tuple[str, str]]]]) -> list[ValidationTerms]:
        return [validation_terms(Identifier(bundle, SetSource(dict(sets)), IdentifyOptions(), cache_root=cache_root),
                                 val_spectra, wanted) for sets in collections_]

    data = shared_validation_terms(sub, validation, wanted) if max_structures is None else None
    fusion_queries = None
    if data is not None and not validation.candidates.ranked.all():
        # the model's pass scored the calibration-only sets too (ranking_candidates' scored_only): not ranked
        fusion_queries = validation.candidates.ranked
    else:
        if data is None:
            data = ValidationTerms.concatenate(scored(collections))
        if calibration_collections:
            extra = scored(calibration_collections)
            fusion_queries = np.r_[np.ones(data.n_queries, dtype=bool),
                                   np.zeros(sum(part.n_queries for part in extra), dtype=bool)]
            data = ValidationTerms.concatenate([data, *extra])
    variants = [(variant, names) for variant, names in ((WITH_PRIOR, list(data.terms)),
                                                        (WITHOUT_PRIOR, [n for n in data.terms if n != PRIOR]))
                if variant != WITH_PRIOR or PRIOR in data.terms]
    kinds: dict[str, str | None] = {variant: None for variant, _ in variants}
    choices: dict[str, dict[str, Any]] = {}
    if second:
        # the candidates a second pass would re-rank: each variant's first-pass top k (fitted on the fusion's sets)
        fusion_data = data if fusion_queries is None else data.subset(np.flatnonzero(fusion_queries))
        firsts = []
        for variant, names in variants:
            kinds[variant], choices[variant] = choose_fusion(fusion_data.view(names), metric, seed) \
                if len(names) > 1 else ("weights", {})
            first = fit_fusion_kind(kinds[variant], fusion_data.view(names).terms, fusion_data.offsets,
                                    fusion_data.is_true, metric=metric)
            firsts.append(first.combine_flat(data.view(names).terms, data.offsets))
        data = add_second_pass_terms(data, second, firsts, max(RERANK_SIZES), log=say)
    scoring, report = {}, {}
    # the fusion's metrics are on its own sets (calibration-only sets are scored, not ranked for it)
    n_fusion = data.n_queries if fusion_queries is None else int(np.count_nonzero(fusion_queries))
    for variant, names in variants:
        view = data.view([*names, *second])
        fusion, calibrator, variant_report = fit_scoring(view, metric=metric, seed=seed, fusion_kind=kinds[variant],
                                                         fusion_queries=fusion_queries, rerank_ks=RERANK_SIZES)
        if choices.get(variant):  # the fusion kind was chosen above, before the second pass's terms
            variant_report["fusion_choice"] = choices[variant]
        scoring[variant] = ScoringVariant(fusion, calibrator).to_dict()
        report[variant] = variant_report
        fused, cal = variant_report["fused"], variant_report["calibration"]
        say(f"  {sub.ion_mode} {variant.replace('_', ' ')}: "
            + ("learnt ranker over " + ", ".join(fusion.ranker.terms) if fusion.ranker is not None else
               "weights " + ", ".join(f"{k} {v:g}" for k, v in fusion.weights.items()))
            + (f", re-ranking its top {fusion.rerank.k} with " + ", ".join(fusion.rerank.terms)
               if fusion.rerank is not None else "")
            + f"; validation hit@1 {100 * fused['hit@1']:.1f}%, hit@10 {100 * fused['hit@10']:.1f}%, "
              f"MRR {fused['mrr']:.3f} ({n_fusion} queries); calibration {cal['method']} on "
              f"{cal['feature_set']}, ECE (out of fold) {cal['ece_out_of_fold']:.3f}, per structure "
              f"{cal['ece_out_of_fold_per_structure']:.3f}")
    sub.scoring = scoring
    return report
