"""Evaluation under the MassSpecGym protocol: every labelled spectrum is one query, ranked against the candidate
set of its true structure; metrics per spectrum and averaged per structure, under two tie policies, with
bootstrap intervals and the exact random-ranking expectation.

Protocol
--------
- Candidate sets are keyed by the true structure's InChIKey first block (``{query_inchikey14: [(inchikey14,
  smiles), ...]}``); a spectrum whose structure has no set, or that has no structure, is skipped and counted.
- A candidate whose SMILES RDKit cannot read (its syntax) is left out of its set (and listed under
  ``candidates_left_out``):
  it has no structure to score, and ranking it by an all-zero fingerprint would be a made-up score.
- A spectrum whose set is empty (in the file, or once such candidates are left out) is skipped, the reason naming
  the set's key.
- A spectrum whose true structure (its first block) is not in its own set is skipped and counted ("true structure
  not in its candidate set"), not scored as a miss: the protocol builds every set around its truth (MassSpecGym's
  sets hold it by construction), so such a set is a broken input, and counting it as a miss would mix a data
  error into the model's hit rate.
- Nothing evaluable (every spectrum skipped) is an :class:`~molpredict.errors.InputError` naming the reasons.
- A hit is a candidate with the true first block. The order of a set is ignored (the files put the truth first).
- A set is ranked with one candidate per first block (the first in key order): a structure listed under several
  SMILES (stereoisomers, tautomers written apart) would otherwise count several times against the truth, and the
  truth's own copies would tie with it; the random expectation counts structures too.
- Spectra cleaned down to no peaks are *kept* (the model then scores every candidate alike and the tie policy
  decides): dropping them would flatter the metrics.
- Primary numbers use the ``worst`` tie policy (ties resolved against the truth); ``average`` (the expectation
  under random tie-breaking) is reported beside them. See :mod:`molpredict.engine.decoding`.
- Intervals: percentile bootstrap (95%, seeded) resampling queries (per spectrum) or structures (per structure).
- ``kernel_loss``: the model's mean kernel loss between predictions and the true structures (when the model
  provides ``kernel_loss``), computed on the evaluated spectra.

Scoring runs in blocks of spectra (:func:`evaluate_block`) on an executor (in-process, or a Dask cluster; see
:mod:`molpredict.identification.scoring`); the metrics do not depend on which.

Text queries (:func:`evaluate_text`, pairs tables with a ``text`` model): each description is one query, ranked
against the whole library (ChEBI-20: ``molecules.tsv``) or, with candidate sets, against the set of its
structure's first block. A hit is the same molecule: the same RDKit canonical isomeric SMILES (stereo
included), not only the same first block. A query whose structure is not among its candidates is skipped and
counted. The metrics and JSON keys are those of the spectra protocol.
"""
from __future__ import annotations

import math
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from molpredict.engine.decoding import (bootstrap_ci, group_means, query_metrics, random_expectation, topk_curve,
                       true_rank_counts)
from molpredict.errors import InputError, ResourceError
from molpredict.identification.candidate_sources import SetSource
from molpredict.identification.identify import Identifier, IdentifierState, IdentifyOptions
from molpredict.io.results import json_safe
from molpredict.kernels.base import DegenerateObjectWarning
from molpredict.modelfile import ModelBundle
from molpredict.identification.scoring import Executor, InProcessExecutor, Query, chunked, shared_candidate_scores

__all__ = ["KS", "LabelledQuery", "collect_queries", "parsable_candidate_sets", "labelled_queries", "RankedBlock",
           "evaluate_block", "rank_queries", "summarize_ranks", "evaluate",
           "evaluate_text", "format_report", "plot_curves"]

KS = (1, 5, 10, 20)
K_MAX = 20


@dataclass
class LabelledQuery:
    """A spectrum with its true structure's first block (and SMILES, for the kernel loss)."""

    spectrum: Any
    inchikey14: str
    smiles: str | None


def collect_queries(spectra: Iterable[Any], source: SetSource) -> tuple[list[LabelledQuery], Counter]:
    """Spectra with a structure whose candidate set holds it; the others counted by reason (no structure, no
    set, an empty set, the truth not in its set: see the module docstring)."""
    from molpredict.chem.molecules import spectrum_structure_key  # RDKit only when there is something to parse

    skipped: Counter = Counter()
    queries = []
    parsed: dict[str, str | None] = {}
    for spectrum in spectra:
        smiles = spectrum.smiles
        ik14 = spectrum_structure_key(spectrum, parsed)
        if not ik14:
            skipped["no structure (INCHIKEY or SMILES)"] += 1
            continue
        ids = source.set_ids(ik14)
        if ids is None:
            skipped["no candidate set for the structure"] += 1
            continue
        if len(ids) == 0:
            # nothing to rank: a rank would be made up (and the random expectation divides by the set size)
            skipped[f"empty candidate set {ik14}"] += 1
            continue
        if ik14 not in source.inchikey14(ids):
            skipped["true structure not in its candidate set"] += 1
            continue
        queries.append(LabelledQuery(spectrum, ik14, smiles))
    return queries, skipped


def parsable_candidate_sets(sets: dict[str, list[tuple[str, str]]], keys: Iterable[str]
                            ) -> tuple[dict[str, list[tuple[str, str]]], list[dict[str, str]]]:
    """The sets of ``keys`` without the candidates whose SMILES RDKit cannot parse (the other sets as they are).

    Only the sets some query needs are checked: parsing every candidate of a large file costs more than the
    evaluation of a few queries, and the other sets are never ranked. The check is RDKit's SMILES syntax (no
    sanitizing: see the comment below).

    Parameters
    ----------
    sets : dict
        ``{query_inchikey14: [(inchikey14, smiles), ...]}``.
    keys : iterable of str
        The set keys to check (the true structures of the queries).

    Returns
    -------
    sets : dict
        A copy of ``sets``, the checked ones without their unparsable candidates.
    left_out : list of dict
        ``{"set": key, "smiles": smiles}`` per candidate left out, in key order.
    """
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")  # the left-out candidates are reported, by set and SMILES
    ok: dict[str, bool] = {}
    out = dict(sets)
    left_out: list[dict[str, str]] = []
    for key in sorted(set(keys) & set(sets)):
        kept = []
        for entry in sets[key]:
            smiles = entry[1]
            if smiles not in ok:
                # The SMILES syntax only (31 us a SMILES against 190 us with sanitizing, which would add a minute
                # to a formula256 test run); one that parses but breaks valence rules still gets the all-zero
                # fingerprint, which fingerprint_matrix warns of.
                ok[smiles] = isinstance(smiles, str) and bool(smiles.strip()) and \
                    Chem.MolFromSmiles(smiles, sanitize=False) is not None
            if ok[smiles]:
                kept.append(entry)
            else:
                left_out.append({"set": key, "smiles": smiles})
        out[key] = kept
    return out, left_out


@dataclass
class RankedBlock:
    """What one block of labelled spectra produced: per evaluated query its position, ion mode, the true
    structure's counts (greater, ties, found), its number of candidates and whether it was empty after cleaning;
    and the block's accounting."""

    positions: list[int]
    modes: list[str]
    n_greater: list[int]
    n_ties: list[int]
    found: list[bool]
    n_candidates: list[int]
    empty: list[bool]
    n_queries: int
    skipped: list[Any]
    timings: dict[str, float]
    probability: list[float] = field(default_factory=list)
    views: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    rank1: list[str] = field(default_factory=list)
    fdr_z: list[float] = field(default_factory=list)


def labelled_queries(identifier: Identifier, labelled: Sequence[tuple[int, Any, str]]) -> list[Query]:
    """The queries of ``(position, spectrum, true inchikey14)`` against their candidate sets (the identifier's
    source is a :class:`SetSource`), one candidate per InChIKey first block (:meth:`SetSource.one_per_structure`):
    routed and cleaned, spectra cleaned down to no peaks kept; the others are in the identifier's skipped list."""
    source = identifier.source
    prepared: list[Query] = []
    for position, spectrum, inchikey14 in labelled:
        routed = identifier.route(spectrum, keep_empty=True)
        if routed is None:
            continue
        mode, sub, cleaned = routed
        # one candidate per first block: a structure listed under several SMILES counts once against the truth
        ids, _ = source.one_per_structure(source.set_ids(inchikey14), None)
        prepared.append(Query(position, cleaned, mode, sub, ids, true_key=inchikey14))
    return prepared


def evaluate_block(identifier: Identifier, block: Sequence[tuple[int, Any, str]]) -> RankedBlock:
    """Rank the true structure of each ``(position, spectrum, true inchikey14)`` in its candidate set by the
    identifier's ranking score (the fusion of the bundle's terms, see :mod:`molpredict.identification.evidence`), and in the same
    pass by each term alone and by the fusion without the prior (``views``). Leaves ``identifier``'s accounting
    untouched."""
    from molpredict.identification.fusion import PRIOR

    worker = identifier.fresh()
    worker.evidence.every_variant = True  # the without_prior view needs its own second pass's terms
    source = worker.source
    prepared = labelled_queries(worker, block)
    out = RankedBlock([], [], [], [], [], [], [], len(block), [], {})
    with warnings.catch_warnings():
        # Spectra cleaned down to no peaks are kept on purpose (and counted in ``n_empty_spectra``).
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        for query, result in worker.fused(prepared):
            is_true = source.inchikey14(query.ids) == query.true_key
            a, b, f = true_rank_counts(result.score, is_true)
            out.probability.append(result.probability)
            # what the FDR bound reads: the rank-1 structure (queries sharing it are right or wrong together) and
            # the z of the query's calibration (0 for bundles saved before it existed)
            out.rank1.append(str(source.inchikey14(query.ids[[int(np.argmax(result.score))]])[0])
                             if len(query.ids) else "")
            variant = worker.evidence.variant(query.sub)
            out.fdr_z.append(variant.calibrator.fdr_z if variant is not None and variant.calibrator is not None
                             else 0.0)
            # a term computed for some candidates only (a second pass's, on the first pass's top k) ranks nothing
            alternatives = {f"{name}_alone": values for name, values in result.terms.items()
                            if not np.isnan(values).any()}
            without = worker.evidence.variant(query.sub, use_prior=False) if len(result.terms) > 1 else None
            if without is not None:
                alternatives["without_prior"] = without.fusion.combine(
                    {k: v for k, v in result.terms.items() if k != PRIOR},
                    {"formula_known": 0.0 if query.window else 1.0})
            for name, values in alternatives.items():
                va, vb, _ = true_rank_counts(values, is_true)
                lists = out.views.setdefault(name, ([], []))
                lists[0].append(va)
                lists[1].append(vb)
            out.positions.append(query.position)
            out.modes.append(query.mode)
            out.n_greater.append(a)
            out.n_ties.append(b)
            out.found.append(f)
            out.n_candidates.append(len(query.ids))
            out.empty.append(query.spectrum.n_peaks == 0)
    out.skipped = worker.skipped
    out.timings = dict(worker.timings)
    return out


def rank_queries(identifier: Identifier, queries: Sequence[LabelledQuery], executor: Executor | None = None
                 ) -> dict[str, Any]:
    """Score every query against its set; the true structure's counts (greater, ties) per query.

    Blocks of ``identifier.options.block_queries`` spectra go through ``executor`` (default in-process) as
    :func:`evaluate_block` tasks.

    Returns
    -------
    dict
        ``n_greater``, ``n_ties``, ``found``, ``n_candidates`` (arrays over evaluated queries), ``groups`` (true
        first blocks), ``ids`` (query ids), ``modes``, ``probability`` (estimated P(rank 1 is right), NaN without a
        calibration), ``views``: {name: (n_greater, n_ties)} for each term alone (``spectrum_alone``,
        ``prior_alone``, ...) and ``without_prior``, and ``routed``: (spectrum as read, smiles, mode) of each
        query for the kernel loss.
    """
    source = identifier.source
    assert isinstance(source, SetSource)
    executor = executor or InProcessExecutor()
    state = identifier if executor.in_process else IdentifierState(identifier)
    blocks = chunked(((i, lq.spectrum, lq.inchikey14) for i, lq in enumerate(queries)),
                     max(1, identifier.options.block_queries))
    bar = None
    if identifier.progress:
        from tqdm import tqdm
        bar = tqdm(total=len(queries), desc="evaluating", unit=" spectra", file=sys.stderr)
    g, t, found, n_c, groups, ids, modes, positions, probability = [], [], [], [], [], [], [], [], []
    rank1: list[str] = []
    fdr_z: list[float] = []
    views: dict[str, tuple[list[int], list[int]]] = {}
    n_empty = 0
    try:
        for block in executor.map(evaluate_block, state, blocks,
                                  on_done=(lambda r: bar.update(r.n_queries)) if bar is not None else None):
            identifier.n_queries += block.n_queries
            identifier.skipped.extend(block.skipped)
            identifier.timings.update(block.timings)
            g += block.n_greater
            t += block.n_ties
            found += block.found
            n_c += block.n_candidates
            modes += block.modes
            n_empty += sum(block.empty)
            positions += block.positions
            probability += block.probability
            rank1 += block.rank1
            fdr_z += block.fdr_z
            for name, (va, vb) in block.views.items():
                lists = views.setdefault(name, ([], []))
                lists[0].extend(va)
                lists[1].extend(vb)
    finally:
        if bar is not None:
            bar.close()
    for position in positions:
        groups.append(queries[position].inchikey14)
        ids.append(str(queries[position].spectrum.id))
    return {"n_greater": np.asarray(g, dtype=np.int64), "n_ties": np.asarray(t, dtype=np.int64),
            "found": np.asarray(found, dtype=bool), "n_candidates": np.asarray(n_c, dtype=np.int64),
            "groups": groups, "ids": ids, "modes": modes, "n_empty_spectra": n_empty,
            "probability": np.asarray(probability, dtype=np.float64),
            "rank1": rank1, "fdr_z": np.asarray(fdr_z, dtype=np.float64),
            # a view present for only some queries (e.g. a mode without a prior) is not comparable: dropped
            "views": {k: (np.asarray(v[0], dtype=np.int64), np.asarray(v[1], dtype=np.int64))
                      for k, v in views.items() if len(v[0]) == len(g)},
            "routed": [(queries[p].spectrum, queries[p].smiles, mode) for p, mode in zip(positions, modes)]}


def calibration_report(ranks: dict[str, Any], max_fdr: float = 0.1, n_bins: int = 10) -> dict[str, Any] | None:
    """ECE, the reliability curve and the queries confident at an estimated FDR <= ``max_fdr``, from
    :func:`rank_queries` output (None when no query has a probability); per spectrum, and per structure under
    ``per_structure`` (each true structure weighted once: its spectra weigh 1 / their number).

    The estimated FDR is the calibration's upper bound over queries sharing a rank-1 structure
    (:func:`~molpredict.identification.calibration.fdr_estimates` with ``ranks["fdr_z"]``, the largest over the
    queries when sub-models differ; 0, the plain mean(1 - p), for bundles saved without one): the reported queries
    are the longest top list whose bound is <= ``max_fdr``, and ``estimated_fdr`` is their mean(1 - p).
    ``confident_at_fdr_plain`` is the plain estimate's list, for comparison."""
    from molpredict.identification.calibration import (confident_at_fdr, expected_calibration_error,
                                                       reliability_curve, structure_weights)

    p = ranks.get("probability")
    known = np.isfinite(p) if p is not None else None
    if known is None or not known.any():
        return None
    correct = ((ranks["n_greater"] == 0) & (ranks["n_ties"] == 0) & ranks["found"])[known]
    p = p[known]
    groups = [g for g, k in zip(ranks["groups"], known) if k]
    rank1 = [r for r, k in zip(ranks.get("rank1") or [""] * len(known), known) if k]
    z_all = np.asarray(ranks.get("fdr_z", np.zeros(len(known))), dtype=np.float64)
    z = float(z_all[known].max()) if len(z_all) == len(known) and known.any() else 0.0
    weights = structure_weights(groups)

    def confident(z_used: float) -> dict[str, Any]:
        n_confident, threshold = confident_at_fdr(p, max_fdr, rank1, z_used)
        reported = p >= threshold if n_confident else np.zeros(len(p), dtype=bool)
        estimated = float(np.mean(1 - p[reported])) if n_confident else None

        def observed(w: np.ndarray | None) -> float | None:
            return round(float(1 - np.average(correct[reported], weights=None if w is None else w[reported])), 4) \
                if n_confident else None

        return {"max_fdr": max_fdr, "z": z_used, "n_queries": int(reported.sum()) if n_confident else 0,
                "estimated_fdr": round(estimated, 4) if estimated is not None else None,
                "observed_fdr": observed(None), "threshold": _threshold_as_written(threshold, p),
                "n_structures": len({g for g, r in zip(groups, reported) if r}),
                "observed_fdr_per_structure": observed(weights)}

    return {"ece": round(expected_calibration_error(p, correct, n_bins), 4), "n_bins": n_bins,
            "n_queries": int(known.sum()), "mean_probability": round(float(p.mean()), 4),
            "accuracy": round(float(correct.mean()), 4),
            "confident_at_fdr": confident(z), "confident_at_fdr_plain": confident(0.0),
            "reliability": reliability_curve(p, correct, n_bins),
            "per_structure": {"n_structures": len(set(groups)),
                              "ece": round(expected_calibration_error(p, correct, n_bins, weights=weights), 4),
                              "mean_probability": round(float(np.average(p, weights=weights)), 4),
                              "accuracy": round(float(np.average(correct, weights=weights)), 4),
                              "reliability": reliability_curve(p, correct, n_bins, weights=weights)}}


def _threshold_as_written(threshold: float, probability: np.ndarray) -> float:
    """``threshold`` rounded down to the fewest decimals (3 or more) that still select the same queries with
    ``p >= written``: a value rounded to nearest could exclude queries tied at the cut, and one rounded down too
    far would take in the next lower ones (QA: 0.824674 written 0.8247 selected 189 of the 205 reported)."""
    below = probability[probability < threshold]
    floor = float(below.max()) if below.size else -math.inf
    for decimals in range(3, 13):
        written = math.floor(threshold * 10 ** decimals) / 10 ** decimals
        if written > floor:
            return written
    return float(threshold)


def _rounded(x: float) -> float:
    return float(x)


def summarize_ranks(ranks: dict[str, Any], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Metrics, intervals, per-structure averages, both tie policies, random expectation and the top-k curve."""
    g, t, found, n_c = ranks["n_greater"], ranks["n_ties"], ranks["found"], ranks["n_candidates"]
    out: dict[str, Any] = {"n_queries": int(len(g)), "n_structures": len(set(ranks["groups"]))}
    for policy in ("worst", "average"):
        per = query_metrics(g, t, found, n_c, ks=KS, policy=policy)
        metrics = {f"hit@{k}": per[f"hit@{k}"] for k in KS}
        metrics["mrr"] = per["rr"]
        metrics["mean_rank"] = per["rank"]
        means = {name: _rounded(v.mean()) if len(v) else float("nan") for name, v in metrics.items()}
        ci = {name: [_rounded(x) for x in bootstrap_ci(v, n_boot=n_boot, seed=seed)] for name, v in metrics.items()}
        structure = {}
        structure_ci = {}
        for name, v in metrics.items():
            if len(v):
                by_structure, _ = group_means(v, ranks["groups"])
            else:
                by_structure = np.zeros(0)
            structure[name] = _rounded(by_structure.mean()) if len(by_structure) else float("nan")
            structure_ci[name] = [_rounded(x) for x in bootstrap_ci(by_structure, n_boot=n_boot, seed=seed)]
        block = {**means, "ci95": ci, "per_structure": {**structure, "ci95": structure_ci},
                 "curve": [_rounded(x) for x in topk_curve(g, t, found, k_max=K_MAX, policy=policy)]}
        if policy == "worst":
            out.update(block)
        else:
            out["average_ties"] = block
    out["tie_policy"] = "worst (ties count against the truth); average_ties: expectation under random tie-breaking"
    out["n_true_missing"] = int((~found).sum()) if len(found) else 0
    random = random_expectation(n_c, ks=KS, k_max=K_MAX)
    out["random"] = {k: (_rounded(v) if isinstance(v, float) else [_rounded(x) for x in v])
                     for k, v in random.items()}
    out["candidates"] = {"median": float(np.median(n_c)) if len(n_c) else None,
                         "mean": _rounded(n_c.mean()) if len(n_c) else None,
                         "max": int(n_c.max()) if len(n_c) else None}
    out["bootstrap"] = {"n_boot": n_boot, "seed": seed, "confidence": 0.95}
    return out


def _kernel_loss(identifier: Identifier, routed: list[tuple[Any, str | None, str]]) -> float | None:
    """Mean kernel loss over the evaluated queries (per ion mode, weighted by counts), on the spectra cleaned
    by each mode's pipeline (cleaning again here is cheaper than shipping cleaned spectra back from workers)."""
    from molpredict.chem.molecules import Molecule

    total, count = 0.0, 0
    by_mode: dict[str, list[tuple[Any, str]]] = {}
    for spectrum, smiles, mode in routed:
        if smiles:
            by_mode.setdefault(mode, []).append((spectrum, smiles))
    parsed: dict[str, Any] = {}
    for mode, pairs in by_mode.items():
        sub = identifier.bundle.for_mode(mode)
        if sub is None or not hasattr(sub.model, "kernel_loss"):
            return None
        cleaner = sub.cleaning_pipeline()
        spectra, molecules = [], []
        for spectrum, smiles in pairs:
            if cleaner is not None:
                spectrum = cleaner(spectrum)
            if smiles not in parsed:
                try:
                    parsed[smiles] = Molecule.from_smiles(smiles)
                except InputError:
                    parsed[smiles] = None
            if parsed[smiles] is not None:
                spectra.append(spectrum)
                molecules.append(parsed[smiles])
        if spectra:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DegenerateObjectWarning)
                total += float(sub.model.kernel_loss(spectra, molecules)) * len(spectra)
            count += len(spectra)
    return total / count if count else None


def evaluate(spectra_paths: Sequence[str | Path], bundles: Sequence[tuple[str, ModelBundle]],
             sets: dict[str, list[tuple[str, str]]], cache_root: Any = None, n_boot: int = 1000, seed: int = 0,
             kernel_loss: bool = True, progress: bool = False, executor: Executor | None = None,
             prior: bool = True, formula_per_candidate: bool = True) -> dict[str, Any]:
    """Evaluate bundles on labelled spectra against candidate sets.

    Parameters
    ----------
    spectra_paths : sequence of path
        Spectra files with SMILES / INCHIKEY metadata.
    bundles : sequence of (label, ModelBundle)
    sets : dict
        From :func:`molpredict.chem.candidates.load_candidate_sets`.
    cache_root : path, False or None
        Candidate coordinates cache (see :class:`~molpredict.identification.identify.Identifier`).
    n_boot, seed : int
        Bootstrap resamples and seed.
    kernel_loss : bool
        Also compute the models' kernel loss on the queries.
    executor : Executor, optional
        Where the blocks of spectra are scored (default in-process; see :mod:`molpredict.identification.scoring`).
    prior : bool
        ``--prior on|off``: rank by the fusion with the bundle's structure prior (when it has one), or without.
    formula_per_candidate : bool
        A spectrum without a formula is encoded once per candidate formula (see
        :class:`~molpredict.identification.identify.IdentifyOptions`).

    Returns
    -------
    dict
        ``{label: metrics}`` (see :func:`summarize_ranks`), each with ``n_queries``, ``n_skipped``, ``skipped``
        (reason: count) and ``candidates_left_out`` (``{"set", "smiles"}`` per unparsable candidate left out of
        a set some query needs); undefined numbers (e.g. intervals with ``n_boot=0``) are None, as in the
        command's JSON.

    Raises
    ------
    InputError
        No spectrum could be evaluated (each without a structure, a usable set, or its truth in its set, or
        unreadable); the message gives the reasons.
    """
    from molpredict.chem.molecules import spectrum_structure_key
    from molpredict.io import SkipReport, read_spectra

    report = SkipReport()
    spectra = [s for path in spectra_paths for s in read_spectra(path, report=report)]
    parsed: dict[str, str | None] = {}
    sets, left_out = parsable_candidate_sets(sets, {spectrum_structure_key(s, parsed) for s in spectra} - {None})
    source = SetSource(sets)
    queries, skipped = collect_queries(spectra, source)
    for reason, n in report.by_reason().items():
        skipped[f"unreadable record ({reason})"] += n
    if not queries:
        raise InputError("nothing to evaluate: " + _nothing_evaluable(len(spectra), skipped),
                         path=", ".join(str(p) for p in spectra_paths))
    results: dict[str, Any] = {}
    for label, bundle in bundles:
        t0 = time.perf_counter()
        identifier = Identifier(bundle, source, IdentifyOptions(prior=prior, formula_per_candidate=formula_per_candidate),
                                cache_root=cache_root, progress=progress)
        ranks = rank_queries(identifier, queries, executor)
        metrics = summarize_ranks(ranks, n_boot=n_boot, seed=seed)
        calibration = calibration_report(ranks)
        if calibration is not None:
            metrics["calibration"] = calibration
        if ranks.get("views"):
            metrics["views"] = {name: _view_summary(ranks, counts, n_boot, seed)
                                for name, counts in ranks["views"].items()}
        model_skipped = Counter(skipped)
        for s in identifier.skipped:
            model_skipped[s.reason] += 1
        metrics["n_skipped"] = int(sum(model_skipped.values()))
        metrics["skipped"] = dict(model_skipped.most_common())
        metrics["n_empty_spectra"] = ranks["n_empty_spectra"]
        metrics["kernel_loss"] = _kernel_loss(identifier, ranks["routed"]) if kernel_loss else None
        metrics["model"] = str(bundle.path) if bundle.path else label
        metrics["candidates_left_out"] = left_out
        metrics["time_s"] = round(time.perf_counter() - t0, 3)
        metrics["timings"] = {k: round(v, 3) for k, v in identifier.timings.items()}
        results[label] = metrics
    if not any(m["n_queries"] for m in results.values()):
        reasons = Counter({r: n for m in results.values() for r, n in m["skipped"].items()})
        raise InputError("nothing to evaluate: " + _nothing_evaluable(len(spectra), reasons),
                         path=", ".join(str(p) for p in spectra_paths))
    # the command prints this as JSON, and strict parsers (jq, JSON.parse) reject NaN: undefined numbers are null
    return json_safe(results)


def _nothing_evaluable(n_read: int, skipped: Counter, what: str = "spectra") -> str:
    """Why no query was left, in one line: how many ``what`` were read and the skip reasons, commonest first."""
    text = f"{n_read} {what} read, every one skipped"
    if skipped:
        more = len(skipped) - 5
        text += (" (" + "; ".join(f"{n} {reason}" for reason, n in skipped.most_common(5))
                 + (f"; {more} more reasons" if more > 0 else "") + ")")
    return text


def _view_summary(ranks: dict[str, Any], counts: tuple[np.ndarray, np.ndarray], n_boot: int,
                  seed: int) -> dict[str, Any]:
    """Headline metrics of one alternative ranking of the same queries (a term alone, the fusion without the
    prior): hit@k, MRR and their bootstrap intervals."""
    alt = dict(ranks)
    alt["n_greater"], alt["n_ties"] = counts
    full = summarize_ranks(alt, n_boot=n_boot, seed=seed)
    out = {k: full[k] for k in ("hit@1", "hit@5", "hit@10", "hit@20", "mrr")}
    out["ci95"] = {k: full["ci95"][k] for k in ("hit@1", "hit@10", "mrr")}
    return out


def _canonical_lookup(smiles: Sequence[str], cache: dict[str, str | None]) -> list[str | None]:
    from molpredict.io.text_pairs import canonical_smiles
    out = []
    for s in smiles:
        if s not in cache:
            cache[s] = canonical_smiles(s)
        out.append(cache[s])
    return out


def evaluate_text(pairs_paths: Sequence[str | Path], bundles: Sequence[tuple[str, ModelBundle]],
                  library: Any = None, sets: dict[str, list[tuple[str, str]]] | None = None,
                  cache_root: Any = None, n_boot: int = 1000, seed: int = 0, kernel_loss: bool = True,
                  progress: bool = False, block_queries: int = 256) -> dict[str, Any]:
    """Evaluate text models on description/SMILES pairs (see the module docstring).

    Parameters
    ----------
    pairs_paths : sequence of path
        Pairs tables (:func:`molpredict.io.text_pairs.read_text_pairs`).
    bundles : sequence of (label, ModelBundle)
        Bundles holding a ``text`` model.
    library : CandidateLibrary, optional
        Every query is ranked against all of it.
    sets : dict, optional
        Candidate sets keyed by the true structure's first block (instead of ``library``).
    cache_root, n_boot, seed, kernel_loss, progress
        As in :func:`evaluate`.
    block_queries : int
        Queries scored together against the library.

    Returns
    -------
    dict
        ``{label: metrics}`` with the keys of :func:`evaluate` plus ``input_type`` and ``hit_definition``.

    Raises
    ------
    InputError
        Neither or both of ``library`` and ``sets``; a bundle without a text model; no pair left to evaluate.
    """
    from molpredict.identification.candidate_sources import LibrarySource
    from molpredict.modelfile import TEXT_MODE
    from molpredict.io.text_pairs import PairsReport, read_text_pairs

    if (library is None) == (sets is None):
        raise InputError("text evaluation needs either a candidate library or candidate sets")
    for label, bundle in bundles:
        if bundle.for_mode(TEXT_MODE) is None:
            raise InputError(f"the model takes {bundle.input_type} input, not text", path=label)
    report = PairsReport()
    left_out: list[dict[str, str]] = []
    structures: dict[str, Any] = {}
    pairs = [p for path in pairs_paths for p in read_text_pairs(path, report, structures)]
    skipped: Counter = Counter({f"unreadable row ({reason})": n for reason, n in report.by_reason().items()})
    canonical: dict[str, str | None] = {}
    # the candidates of each query and which of them are the truth (same canonical isomeric SMILES)
    kept: list[int] = []
    true_ids: list[np.ndarray] = []
    set_ids: list[np.ndarray] = []
    if library is not None:
        source: Any = LibrarySource(library, IdentifyOptions())
        all_ids = source.all_ids()
        ik14 = library.column("inchikey14")
        wanted = {p.molecule.inchikey14 for p in pairs}
        positions = np.flatnonzero(np.isin(ik14, np.asarray(sorted(wanted), dtype=object)))
        by_smiles: dict[str, list[int]] = {}
        for j, s in zip(positions, _canonical_lookup(list(library.column("smiles")[positions]), canonical)):
            if s is not None:
                by_smiles.setdefault(s, []).append(int(j))
        for i, pair in enumerate(pairs):
            hits = by_smiles.get(pair.molecule.smiles)
            if not hits:
                skipped["true structure not in the library"] += 1
                continue
            kept.append(i)
            true_ids.append(np.asarray(sorted(hits), dtype=np.int64))
    else:
        sets, left_out = parsable_candidate_sets(sets or {}, {p.molecule.inchikey14 for p in pairs})
        source = SetSource(sets)
        for i, pair in enumerate(pairs):
            ids = source.set_ids(pair.molecule.inchikey14)
            if ids is None:
                skipped["no candidate set for the structure"] += 1
                continue
            is_true = np.asarray([s == pair.molecule.smiles for s in
                                  _canonical_lookup(list(source._smiles[ids]), canonical)], dtype=bool)
            if not is_true.any():
                skipped["true structure (stereo included) not in its candidate set"] += 1
                continue
            kept.append(i)
            set_ids.append(ids)
            true_ids.append(ids[is_true])
    queries = [pairs[i] for i in kept]
    if not queries:
        raise InputError("nothing to evaluate: " + _nothing_evaluable(len(pairs), skipped, "pairs"),
                         path=", ".join(str(p) for p in pairs_paths))
    texts = [p.description for p in queries]
    results: dict[str, Any] = {}
    for label, bundle in bundles:
        t0 = time.perf_counter()
        sub = bundle.for_mode(TEXT_MODE)
        identifier = Identifier(bundle, source, IdentifyOptions(), cache_root=cache_root, progress=progress)
        g, t, found, n_c = [], [], [], []
        if library is not None:
            position = np.searchsorted(all_ids, np.concatenate(true_ids)) if true_ids else np.zeros(0, int)
            bounds = np.cumsum([0] + [len(x) for x in true_ids])
            iterator: Iterable = shared_candidate_scores(identifier.candidate_coordinates, sub, texts, all_ids,
                                                         identifier.timings, block_queries,
                                                         chunk=identifier.options.max_block_candidates)
            if progress:
                from tqdm import tqdm
                iterator = tqdm(iterator, total=-(-len(texts) // block_queries), desc="evaluating",
                                unit=" blocks", file=sys.stderr)
            for start, scores in iterator:
                for r, row in enumerate(scores):
                    q = start + r
                    is_true = np.zeros(len(all_ids), dtype=bool)
                    is_true[position[bounds[q]:bounds[q + 1]]] = True
                    a, b, f = true_rank_counts(row, is_true)
                    g.append(a)
                    t.append(b)
                    found.append(f)
                    n_c.append(len(all_ids))
        else:
            prepared = [Query(i, text, TEXT_MODE, sub, ids) for i, (text, ids) in enumerate(zip(texts, set_ids))]
            for query, scores in identifier.scored(prepared):
                a, b, f = true_rank_counts(scores, np.isin(query.ids, true_ids[query.position]))
                g.append(a)
                t.append(b)
                found.append(f)
                n_c.append(len(query.ids))
        ranks = {"n_greater": np.asarray(g, dtype=np.int64), "n_ties": np.asarray(t, dtype=np.int64),
                 "found": np.asarray(found, dtype=bool), "n_candidates": np.asarray(n_c, dtype=np.int64),
                 "groups": [p.molecule.smiles for p in queries]}
        metrics = summarize_ranks(ranks, n_boot=n_boot, seed=seed)
        metrics["n_skipped"] = int(sum(skipped.values()))
        metrics["skipped"] = dict(skipped.most_common())
        metrics["n_empty_spectra"] = 0
        loss = None
        if kernel_loss and queries and hasattr(sub.model, "kernel_loss"):
            loss = float(sub.model.kernel_loss(texts, [p.molecule for p in queries]))
        metrics["kernel_loss"] = loss
        metrics["model"] = str(bundle.path) if bundle.path else label
        metrics["input_type"] = "text"
        metrics["hit_definition"] = "same RDKit canonical isomeric SMILES (stereo included)"
        metrics["candidates_from"] = "library" if library is not None else "candidate sets"
        metrics["candidates_left_out"] = left_out
        metrics["time_s"] = round(time.perf_counter() - t0, 3)
        metrics["timings"] = {k: round(v, 3) for k, v in identifier.timings.items()}
        results[label] = metrics
    return json_safe(results)  # as :func:`evaluate`: null, not NaN, for undefined numbers


def _pct(x: float | None, width: int = 0, digits: int = 2) -> str:
    """A share as a percentage, or "n/a" when undefined (None or NaN), right-aligned to ``width``."""
    text = "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}%"
    return f"{text:>{width}}"


def _num(x: float | None, spec: str, width: int = 0) -> str:
    """A number in format ``spec``, or "n/a" when undefined (None or NaN), right-aligned to ``width``."""
    text = "n/a" if x is None or not math.isfinite(x) else format(x, spec)
    return f"{text:>{width}}"


def format_report(results: dict[str, Any]) -> str:
    """A compact human-readable table of :func:`evaluate`'s results."""
    lines = []
    width = max([len("model")] + [len(label) for label in results])  # whole model paths: a cut one misleads
    header = (f"{'model':<{width}} {'n':>6} {'hit@1':>7} {'hit@5':>7} {'hit@10':>7} {'hit@20':>7} {'MRR':>7} "
              f"{'rank':>7}")
    lines.append(header)
    for label, m in results.items():
        lines.append(f"{label:<{width}} {m['n_queries']:>6} " + " ".join(_pct(m[f'hit@{k}'], 7) for k in KS)
                     + f" {_num(m['mrr'], '.4f', 7)} {_num(m['mean_rank'], '.2f', 7)}")
    for label, m in results.items():
        lines.append("")
        if m.get("input_type") == "text":
            what = f"{m['n_structures']} structures; candidates from the {m.get('candidates_from', 'library')}"
        else:
            what = f"{m['n_structures']} structures; {m['n_empty_spectra']} without peaks after cleaning, kept"
        lines.append(f"{label}: {m['n_queries']} queries ({what}), {m['n_skipped']} skipped"
                     + "".join(f"; {n} {r}" for r, n in m["skipped"].items()))
        if m.get("candidates_left_out"):
            lines.append(f"  {len(m['candidates_left_out'])} candidates left out of their sets (SMILES RDKit "
                         f"cannot parse)")
        ci = m["ci95"]
        lines.append("  95% CI (per spectrum): " + ", ".join(
            f"hit@{k} [{_pct(ci[f'hit@{k}'][0])}, {_pct(ci[f'hit@{k}'][1])}]" for k in KS))
        ps = m["per_structure"]
        lines.append("  per structure: " + ", ".join(f"hit@{k} {_pct(ps[f'hit@{k}'])}" for k in KS)
                     + f", MRR {_num(ps['mrr'], '.4f')}")
        av = m["average_ties"]
        lines.append("  average tie policy: " + ", ".join(f"hit@{k} {_pct(av[f'hit@{k}'])}" for k in KS)
                     + f", MRR {_num(av['mrr'], '.4f')}")
        rnd = m["random"]
        lines.append("  random ranking: " + ", ".join(f"hit@{k} {_pct(rnd[f'hit@{k}'])}" for k in KS)
                     + f", MRR {_num(rnd['mrr'], '.4f')}; median candidates {_num(m['candidates']['median'], '.1f')}")
        if m.get("kernel_loss") is not None:
            lines.append(f"  kernel loss {m['kernel_loss']:.4f}")
        for name, v in m.get("views", {}).items():
            lines.append(f"  {name.replace('_', ' ')}: " + ", ".join(f"hit@{k} {_pct(v[f'hit@{k}'])}" for k in KS)
                         + f", MRR {_num(v['mrr'], '.4f')}")
        cal = m.get("calibration")
        if cal:
            fdr = cal["confident_at_fdr"]
            lines.append(f"  calibration: ECE {cal['ece']:.4f} ({cal['n_bins']} bins), mean probability "
                         f"{cal['mean_probability']:.3f} vs hit@1 {cal['accuracy']:.3f}; {fdr['n_queries']} queries "
                         f"confident at estimated FDR <= {fdr['max_fdr']:.0%} (p >= {fdr['threshold']:g}"
                         + (f"; upper bound, z {fdr['z']:g}" if fdr.get("z") else "") + ")"
                         + (f", observed FDR {fdr['observed_fdr']:.1%}" if fdr.get("observed_fdr") is not None else ""))
            if cal.get("per_structure"):
                per = cal["per_structure"]
                lines.append(f"  calibration per structure ({per['n_structures']} structures, each weighted once): "
                             f"ECE {per['ece']:.4f}" + (f"; observed FDR of the confident ones "
                                                         f"{fdr['observed_fdr_per_structure']:.1%}"
                                                         if fdr.get("observed_fdr_per_structure") is not None else ""))
    return "\n".join(lines)


def plot_curves(results: dict[str, Any], path: str | Path) -> None:
    """Top-k accuracy (k = 1..20) of every model, with the random expectation dashed, to a PNG file."""
    try:
        import matplotlib
    except ImportError:
        raise ResourceError("--plot needs matplotlib: pip install 'molpredict[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(1, K_MAX + 1)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, m in results.items():
        ax.plot(ks, 100 * np.asarray(m["curve"], dtype=float), marker="o", markersize=3, label=label)
    first = next(iter(results.values()), None)
    if first is not None and "curve" in first["random"]:
        ax.plot(ks, 100 * np.asarray(first["random"]["curve"], dtype=float), linestyle="--", color="grey",
                label="random")
    ax.set_xlabel("k")
    ax.set_ylabel("top-k accuracy (%)")
    ax.set_xticks([1, 5, 10, 15, 20])
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Identification: true structure within the top k")
    calibrated = {label: m["calibration"] for label, m in results.items() if m.get("calibration")}
    if calibrated:  # a reliability diagram beside the curves
        ax.figure.set_size_inches(11, 4)
        ax.set_position([0.07, 0.13, 0.4, 0.77])
        rel = fig.add_axes([0.57, 0.13, 0.4, 0.77])
        rel.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
        for label, cal in calibrated.items():
            curve = cal["reliability"]
            rel.plot([b["mean_probability"] for b in curve], [b["accuracy"] for b in curve], marker="o",
                     markersize=3, label=f"{label} (ECE {cal['ece']:.3f})")
        rel.set_xlabel("estimated P(rank 1 is right)")
        rel.set_ylabel("observed hit@1")
        rel.set_xlim(0, 1)
        rel.set_ylim(0, 1)
        rel.grid(alpha=0.3)
        rel.legend(fontsize=8)
        rel.set_title("Reliability of the probability column")
    else:
        fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
