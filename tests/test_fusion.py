"""Score fusion and calibrated confidence against naive per-set references and hand-computed values."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from molpredict.identification.calibration import (Calibrator, confident_at_fdr, expected_calibration_error, ranking_features,
                                    ranking_features_flat)
from molpredict.identification.fusion import (ScoreFusion, fit_fusion, ranking_metrics, softmax_within_sets, standardize,
                               standardize_within_sets, true_ranks)


def random_sets(seed=0, n_sets=40, max_size=30):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_size, size=n_sets)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    is_true = np.zeros(offsets[-1], dtype=bool)
    for i in range(n_sets):
        is_true[offsets[i] + rng.integers(sizes[i])] = True
    return rng, offsets, is_true


def naive_rank(scores, truth):
    """Worst-case rank: 1 + number of non-true candidates scoring >= the best true one (size + 1 if absent)."""
    if not truth.any():
        return len(scores) + 1
    best = scores[truth].max()
    return 1 + int(np.sum((scores >= best) & ~truth))


def test_standardize_within_sets_equals_the_per_set_loop():
    rng, offsets, _ = random_sets()
    scores = rng.normal(size=offsets[-1]) * rng.uniform(0.1, 10)
    scores[offsets[3]:offsets[4]] = 2.5  # a constant set
    flat = standardize_within_sets(scores, offsets)
    for i in range(len(offsets) - 1):
        part = scores[offsets[i]:offsets[i + 1]]
        ref = np.zeros_like(part) if np.ptp(part) == 0 else (part - part.mean()) / part.std()
        np.testing.assert_allclose(flat[offsets[i]:offsets[i + 1]], ref, atol=1e-12)
        np.testing.assert_allclose(standardize(part), ref, atol=1e-12)
    assert not flat[offsets[3]:offsets[4]].any()


def test_true_ranks_counts_ties_against_the_truth_and_handles_copies_and_absence():
    scores = np.array([0.5, 0.5, 0.1, 0.9, 0.3, 0.9, 0.2, 0.2])
    offsets = np.array([0, 3, 6, 8])
    truth = np.array([True, False, False, False, True, True, False, False])
    # set 0: truth 0.5 tied with 0.5 -> rank 2; set 1: copies 0.3 and 0.9 -> best 0.9, tie with 0.9 -> 2;
    # set 2: no truth -> size + 1 = 3
    assert true_ranks(scores, offsets, truth).tolist() == [2, 2, 3]
    rng, offsets, truth = random_sets(seed=1)
    scores = np.round(rng.normal(size=offsets[-1]), 1)  # many ties
    expected = [naive_rank(scores[a:b], truth[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
    assert true_ranks(scores, offsets, truth).tolist() == expected
    metrics = ranking_metrics(scores, offsets, truth)
    assert metrics["mrr"] == pytest.approx(np.mean(1 / np.array(expected)))
    assert metrics["hit@5"] == pytest.approx(np.mean(np.array(expected) <= 5))


def test_softmax_within_sets_sums_to_one_per_set():
    rng, offsets, _ = random_sets(seed=2)
    p = softmax_within_sets(rng.normal(size=offsets[-1]) * 50, offsets, temperature=0.7)
    np.testing.assert_allclose(np.add.reduceat(p, offsets[:-1]), 1.0, atol=1e-12)


def test_fit_fusion_picks_the_grid_point_with_the_best_mrr():
    rng, offsets, truth = random_sets(seed=3, n_sets=80)
    n = offsets[-1]
    # the spectrum term is noisy evidence, the prior another, independent one: together they rank best
    spectrum = truth * 1.0 + rng.normal(scale=1.0, size=n)
    prior = truth * 1.0 + rng.normal(scale=1.5, size=n)
    noise = rng.normal(size=n)
    grid = (0.0, 0.5, 1.0, 2.0)
    terms = {"spectrum": spectrum, "prior": prior, "fragments": noise}
    fusion = fit_fusion(terms, offsets, truth, metric="mrr", grid=grid)
    z = {k: standardize_within_sets(v, offsets) for k, v in terms.items()}
    best, best_w = -1.0, None
    for wp, wf in itertools.product(grid, repeat=2):  # naive brute force, same tie rule: first strict maximum
        mrr = ranking_metrics(z["spectrum"] + wp * z["prior"] + wf * z["fragments"], offsets, truth)["mrr"]
        if mrr > best + 1e-12:
            best, best_w = mrr, (wp, wf)
    assert (fusion.weights["prior"], fusion.weights["fragments"]) == best_w
    assert fusion.weights["prior"] > 0
    assert fusion.validation["fused"]["mrr"] == pytest.approx(best)
    assert best > fusion.validation["spectrum_alone"]["mrr"]
    # the temperature maximises the truth's likelihood: no better at nearby temperatures
    fused = fusion.combine_flat(terms, offsets)

    def loglik(t):
        p = softmax_within_sets(fused, offsets, t)
        return np.log(p[truth]).sum()
    assert loglik(fusion.temperature) >= max(loglik(fusion.temperature * 0.8), loglik(fusion.temperature * 1.25))


def test_fusion_combine_matches_combine_flat_and_round_trips():
    rng, offsets, _ = random_sets(seed=4)
    terms = {"spectrum": rng.normal(size=offsets[-1]), "prior": rng.normal(size=offsets[-1])}
    fusion = ScoreFusion(weights={"spectrum": 1.0, "prior": 0.7}, temperature=1.3)
    flat = fusion.combine_flat(terms, offsets)
    for a, b in zip(offsets[:-1], offsets[1:]):
        np.testing.assert_allclose(fusion.combine({k: v[a:b] for k, v in terms.items()}), flat[a:b], atol=1e-12)
    again = ScoreFusion.from_dict(fusion.to_dict())
    assert again.weights == fusion.weights and again.temperature == fusion.temperature
    # a weighted term that is missing (--prior off) counts as zero
    np.testing.assert_allclose(fusion.combine({"spectrum": terms["spectrum"][:5]}),
                               standardize(terms["spectrum"][:5]))
    with pytest.raises(ValueError):
        ScoreFusion.from_dict({"weights": {"spectrum": float("nan")}})
    with pytest.raises(ValueError):
        ScoreFusion.from_dict({"weights": {"spectrum": 1.0}, "temperature": 0})


def test_ranking_features_equal_a_per_set_computation():
    rng, offsets, _ = random_sets(seed=5)
    fused = np.round(rng.normal(size=offsets[-1]), 1)
    flat = ranking_features_flat(fused, offsets, temperature=0.9)
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        part = np.sort(fused[a:b])[::-1]
        p = np.exp(part / 0.9) / np.exp(part / 0.9).sum()
        top = min(max(p[0], 1e-12), 1 - 1e-12)
        expected = [math.log(top / (1 - top)), part[0] - part[1] if b - a > 1 else 0.0, math.log(b - a)]
        np.testing.assert_allclose(flat[i], expected, atol=1e-9)
        np.testing.assert_allclose(ranking_features(fused[a:b], 0.9), expected, atol=1e-9)


def test_expected_calibration_error_by_hand():
    p = np.array([0.05, 0.15, 0.12, 0.95, 0.91, 1.0])
    correct = np.array([0, 1, 0, 1, 1, 0], dtype=bool)
    # bins: [0,.1): {0.05 -> 0}; [.1,.2): {0.15 -> 1, 0.12 -> 0}; [.9,1]: {0.95, 0.91, 1.0 -> 1, 1, 0}
    expected = (1 / 6) * 0.05 + (2 / 6) * abs(0.135 - 0.5) + (3 / 6) * abs((0.95 + 0.91 + 1.0) / 3 - 2 / 3)
    assert expected_calibration_error(p, correct) == pytest.approx(expected)


def test_confident_at_fdr_by_hand():
    p = np.array([0.99, 0.95, 0.9, 0.7, 0.2])
    # running mean of 1 - p: 0.01, 0.03, 0.0533, 0.115, ... -> three queries at FDR <= 0.1
    assert confident_at_fdr(p, 0.1) == (3, 0.9)
    assert confident_at_fdr(np.array([0.5, 0.4]), 0.1) == (0, 1.0)


def test_calibrator_recovers_a_known_logistic_link_and_round_trips():
    rng = np.random.default_rng(6)
    features = np.column_stack([rng.normal(size=4000), rng.exponential(size=4000), np.log(rng.integers(2, 300, 4000))])
    true_p = 1 / (1 + np.exp(-(1.2 * features[:, 0] + 0.8 * features[:, 1] - 0.5 * features[:, 2] + 0.3)))
    correct = rng.uniform(size=4000) < true_p
    cal = Calibrator.fit(features, correct, c=100.0)
    np.testing.assert_allclose(cal.coef, [1.2, 0.8, -0.5], atol=0.2)
    assert np.abs(cal.predict(features) - true_p).mean() < 0.03
    assert cal.validation["ece"] < 0.03
    again = Calibrator.from_dict(cal.to_dict())
    np.testing.assert_array_equal(again.predict(features), cal.predict(features))
    with pytest.raises(ValueError):
        Calibrator.from_dict({"method": "isotonic", "coef": [1, 0, 0], "intercept": 0})
    # one class only: a constant rate, no crash
    constant = Calibrator.fit(features[:10], np.ones(10, dtype=bool))
    assert np.all(constant.predict(features[:3]) > 0.9)


def test_validation_sets_from_a_library_and_ranking_candidates():
    from molpredict.chem.candidates import CandidateLibrary
    from molpredict.chem.molecules import Molecule
    from molpredict.training.ranking_validation import candidate_sets_from_library, ranking_candidates

    isomers = ["CC(=O)Nc1ccc(O)cc1", "CC(=O)Nc1cccc(O)c1", "CC(=O)Nc1ccccc1O", "COC(=O)c1ccc(N)cc1"]  # C8H9NO2
    other = ["CCO", "OCC(O)CO"]
    library = CandidateLibrary.from_smiles(isomers[1:] + other)  # the first isomer is not in the library
    val = [Molecule.from_smiles(s) for s in (isomers[0], isomers[0], "CCO")]
    sets = candidate_sets_from_library(library, val)
    truth = val[0].inchikey14
    assert list(sets) == [truth, val[2].inchikey14]
    assert sets[truth][0] == (truth, val[0].smiles)  # the truth first, added although the library lacks it
    assert {k for k, _ in sets[truth][1:]} == {Molecule.from_smiles(s).inchikey14 for s in isomers[1:]}
    assert len(sets[val[2].inchikey14]) == 1  # ethanol: no isomer in the library
    capped = candidate_sets_from_library(library, val[:1], max_candidates=2, seed=3)
    assert len(capped[truth]) == 2 and capped[truth][0][0] == truth
    candidates = ranking_candidates(val, [{truth: sets[truth]}])
    assert candidates.positions.tolist() == [0, 1]  # ethanol's spectrum has no set: it does not rank
    assert len(candidates.molecules) == 4 and np.array_equal(candidates.sets[0], candidates.sets[1])
    assert [candidates.molecules[j].inchikey14 == truth for j in candidates.sets[0]] == \
        candidates.is_true[0].tolist()
    assert candidates.is_true[0].sum() == 1
    # two collections: every input with a set ranks once per collection
    twice = ranking_candidates(val, [{truth: sets[truth]}, {truth: sets[truth][:2]}])
    assert twice.positions.tolist() == [0, 1, 0, 1] and len(twice.sets[2]) == 2 and len(twice.molecules) == 4
    assert twice.collections.tolist() == [0, 0, 1, 1]  # each set knows the collection it came from
    scored_only = ranking_candidates(val, [{truth: sets[truth]}], [{truth: sets[truth][:3]}])
    assert scored_only.collections.tolist() == [0, 0, 1, 1] and scored_only.ranked.tolist() == [True, True,
                                                                                                 False, False]


def test_candidate_order_does_not_give_the_truth_away_where_scores_tie():
    # The set files put the truth first, and a second pass keeps a set's top k by score with ties by position.
    # With every first-pass score tied (a spectrum cleaned down to no peaks, ranked without the prior), the
    # kept candidates must not depend on where the file puts the truth: both sources order a set by candidate
    # key. Here the truth's key sorts last, so a tied top 2 never holds it (by file order it always did).
    from molpredict.chem.molecules import Molecule
    from molpredict.identification.candidate_sources import SetSource
    from molpredict.identification.fusion import top_k_flat
    from molpredict.training.ranking_validation import ranking_candidates

    isomers = [Molecule(s) for s in ("CC(=O)Nc1ccc(O)cc1", "CC(=O)Nc1cccc(O)c1", "CC(=O)Nc1ccccc1O",
                                     "COC(=O)c1ccc(N)cc1", "Nc1ccc(cc1)C(=O)OC")]
    pairs = sorted({(m.inchikey14, m.smiles) for m in isomers})
    truth = pairs[-1]
    truth_molecule = next(m for m in isomers if m.inchikey14 == truth[0])
    for entries in ([truth] + pairs[:-1], pairs[:-1] + [truth], list(reversed(pairs))):
        sets = {truth[0]: entries}
        source = SetSource(sets)
        ids = source.set_ids(truth[0])
        assert list(zip(source.inchikey14(ids), source.fields(ids)["smiles"])) == pairs
        candidates = ranking_candidates([truth_molecule], [sets])
        assert [(m.inchikey14, m.smiles) for m in (candidates.molecules[j] for j in candidates.sets[0])] == pairs
        assert candidates.is_true[0].tolist() == [p == truth for p in pairs]
        keep, _ = top_k_flat(np.zeros(len(pairs)), np.array([0, len(pairs)]), 2)
        assert not candidates.is_true[0][keep].any()
