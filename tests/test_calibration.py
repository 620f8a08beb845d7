"""Calibration: grouped folds, structure weights, the three calibrator kinds against naive references, their
bundle round trips (old Platt state included), and grouped calibration on real validation spectra."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from molpredict.identification.calibration import (ALL_FEATURES, EXTRA_FEATURES, FEATURE_SETS, FEATURES,
                                                   PROBABILITY_RANGE, SPECTRUM_FEATURES, Calibrator,
                                                   confident_at_fdr, expected_calibration_error, grouped_folds,
                                                   log_loss, ranking_features_flat, reliability_curve,
                                                   spectrum_features, structure_weights, top_index_flat)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([f"K{i}" for i in range(25)]), min_size=1, max_size=120),
       st.integers(2, 7), st.integers(0, 10_000))
def test_grouped_folds_never_split_a_structure(groups, n_folds, seed):
    folds = grouped_folds(groups, n_folds, seed)
    assert folds.shape == (len(groups),) and folds.min() >= 0 and folds.max() < n_folds
    fold_of = {}
    for g, f in zip(groups, folds):
        assert fold_of.setdefault(g, f) == f
    # structures are dealt round-robin: fold sizes (in structures) differ by at most one
    per_fold = np.bincount([fold_of[g] for g in set(groups)], minlength=n_folds)
    assert per_fold.max() - per_fold.min() <= 1


def test_structure_weights_by_hand():
    groups = ["A", "B", "A", "C", "A", "B"]
    np.testing.assert_allclose(structure_weights(groups), [1 / 3, 1 / 2, 1 / 3, 1, 1 / 3, 1 / 2])
    # each structure weighs one: the weighted ECE of a hand example equals the per-structure computation
    p = np.array([0.9, 0.2, 0.9, 0.7, 0.9, 0.4])
    correct = np.array([1, 0, 0, 1, 1, 1], dtype=bool)
    w = structure_weights(groups)
    # bins: [0.2,0.3) B(p .2, wrong, w 1/2); [0.4,0.5) B(p .4, right, w 1/2); [0.7,0.8) C(.7, right, w 1);
    # [0.9,1] A x3 (p .9, accuracy 2/3, w 1). Total weight 3.
    expected = (0.5 / 3) * 0.2 + (0.5 / 3) * 0.6 + (1 / 3) * 0.3 + (1 / 3) * abs(0.9 - 2 / 3)
    assert expected_calibration_error(p, correct, weights=w) == pytest.approx(expected)
    curve = reliability_curve(p, correct, weights=w)
    assert [b["weight"] for b in curve] == pytest.approx([0.5, 0.5, 1.0, 1.0])
    assert log_loss(p, correct, weights=w) == pytest.approx(
        np.sum(w * -np.where(correct, np.log(p), np.log(1 - p))) / 3)
    # a weighted fit equals an unweighted fit on the data with every structure's queries collapsed to one
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    y = rng.uniform(size=400) < 1 / (1 + np.exp(-x[:, 0]))
    keys = [f"S{i}" for i in range(400)]
    repeated = np.repeat(np.arange(400), rng.integers(1, 5, size=400))
    weighted = Calibrator.fit(x[repeated], y[repeated], structure_weights([keys[i] for i in repeated]))
    once = Calibrator.fit(x, y)
    np.testing.assert_allclose(weighted.coef, once.coef, rtol=1e-4, atol=1e-5)
    assert weighted.intercept == pytest.approx(once.intercept, rel=1e-4, abs=1e-5)


def _naive_pav(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool-adjacent-violators over x-sorted distinct values: (distinct x, fitted value per distinct x)."""
    xs = np.unique(x)
    blocks = [[float(np.sum(w[x == v] * y[x == v])), float(np.sum(w[x == v])), [v]] for v in xs]
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] / blocks[i][1] > blocks[i + 1][0] / blocks[i + 1][1] + 1e-15:
            a, b = blocks[i], blocks.pop(i + 1)
            blocks[i] = [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
            i = max(i - 1, 0)
        else:
            i += 1
    fitted = {v: blk[0] / blk[1] for blk in blocks for v in blk[2]}
    return xs, np.array([fitted[v] for v in xs])


def test_isotonic_calibrator_equals_a_naive_pool_adjacent_violators():
    rng = np.random.default_rng(1)
    x = np.round(rng.normal(size=(300, 1)), 1)  # ties on purpose
    y = rng.uniform(size=300) < 1 / (1 + np.exp(-2 * x[:, 0]))
    w = rng.uniform(0.2, 1.0, size=300)
    cal = Calibrator.fit(x, y, w, method="isotonic", names=["top1_logit"])
    z = cal.linear(x)
    assert cal.coef[0] > 0  # the linear stage keeps the order of x
    xs, fitted = _naive_pav(z, y.astype(float), w)
    expected = np.clip(fitted[np.searchsorted(xs, z)], *PROBABILITY_RANGE)
    np.testing.assert_allclose(cal.predict(x), expected, atol=1e-9)
    assert fitted.min() == 0.0 and cal.predict(x).min() == PROBABILITY_RANGE[0]  # never a certainty
    assert np.all(np.diff(cal.predict(np.sort(x, axis=0))) >= -1e-12)


def test_beta_calibrator_equals_a_naive_maximum_likelihood():
    from scipy.optimize import minimize

    rng = np.random.default_rng(2)
    x = rng.normal(size=(2000, 2))
    z_true = 1.5 * x[:, 0] - 0.5 * x[:, 1]
    q = 1 / (1 + np.exp(-z_true))
    y = rng.uniform(size=2000) < q ** 2 / (q ** 2 + (1 - q) ** 0.7 * 0.8)  # a beta-shaped distortion
    cal = Calibrator.fit(x, y, method="beta", names=["top1_logit", "margin"], c=1e6)
    # naive: the first stage by direct likelihood, then a, b, c by direct likelihood on log q, -log(1 - q)
    def nll(theta, cols):
        s = cols @ theta[:-1] + theta[-1]
        return np.sum(np.logaddexp(0, -s) * y + np.logaddexp(0, s) * (~y))
    stage1 = minimize(nll, np.zeros(3), args=(x,), method="BFGS").x
    np.testing.assert_allclose(cal.coef + [cal.intercept], stage1, atol=2e-3)
    zz = x @ stage1[:2] + stage1[2]
    qq = 1 / (1 + np.exp(-zz))
    cols = np.column_stack([np.log(qq), -np.log1p(-qq)])
    beta = minimize(nll, np.zeros(3), args=(cols,), method="BFGS").x
    np.testing.assert_allclose(cal.beta, beta, atol=5e-3)
    s = cols @ beta[:2] + beta[2]
    np.testing.assert_allclose(cal.predict(x), np.clip(1 / (1 + np.exp(-s)), *PROBABILITY_RANGE), atol=1e-3)


@pytest.mark.parametrize("method", ["platt", "beta", "isotonic"])
def test_each_calibrator_kind_round_trips_through_json(method):
    rng = np.random.default_rng(3)
    names = ["top1_logit", "margin3", "entropy10", "rank1_known"]
    x = np.column_stack([rng.normal(size=500), rng.exponential(size=500), rng.uniform(0, 2, 500),
                         rng.integers(0, 2, 500)])
    y = rng.uniform(size=500) < 1 / (1 + np.exp(-(x[:, 0] - x[:, 3])))
    cal = Calibrator.fit(x, y, structure_weights([str(i % 97) for i in range(500)]), method=method, names=names)
    state = json.loads(json.dumps(cal.to_dict()))  # numbers and lists only: no pickle
    again = Calibrator.from_dict(state)
    assert again.method == method and again.features == names and again.needs == ["rank1_known"]
    np.testing.assert_array_equal(again.predict(x), cal.predict(x))
    broken = dict(state, coef=state["coef"][:-1])
    with pytest.raises(ValueError):
        Calibrator.from_dict(broken)


def test_an_old_platt_bundle_state_loads_and_gives_identical_probabilities():
    old = {"method": "platt", "features": ["top1_logit", "margin", "log_n_candidates"],
           "coef": [0.61, 0.42, -0.13], "intercept": -0.25, "validation": {"ece": 0.04}}
    cal = Calibrator.from_dict(old)
    no_names = Calibrator.from_dict({k: v for k, v in old.items() if k != "features"})
    rng = np.random.default_rng(4)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, 12, size=40))])
    fused = np.round(rng.normal(size=offsets[-1]), 1)
    x = ranking_features_flat(fused, offsets, 0.8, cal.features)
    # the previous release's formula: sigmoid(w . [logit top p, top - second, log n] + b)
    expected = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        part = np.sort(fused[a:b])[::-1]
        p = np.exp(part / 0.8) / np.exp(part / 0.8).sum()
        top = min(max(p[0], 1e-12), 1 - 1e-12)
        f = [math.log(top / (1 - top)), part[0] - part[1] if b - a > 1 else 0.0, math.log(b - a)]
        expected.append(1 / (1 + math.exp(-(np.dot(old["coef"], f) + old["intercept"]))))
    np.testing.assert_allclose(cal.predict(x), expected, rtol=1e-14)
    np.testing.assert_array_equal(no_names.predict(x), cal.predict(x))
    assert cal.to_dict()["method"] == "platt" and "isotonic" not in cal.to_dict()
    with pytest.raises(ValueError):
        Calibrator.from_dict({"method": "isotonic", "coef": [1, 0, 0], "intercept": 0})


def test_ranking_features_against_a_per_set_loop():
    rng = np.random.default_rng(5)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, 30, size=50))])
    fused = np.round(rng.normal(size=offsets[-1]), 1)
    known = rng.integers(0, 2, size=50).astype(float)
    prior = rng.uniform(size=50)
    one_formula = rng.integers(0, 2, size=50).astype(float)
    entropy = rng.uniform(0, 3, size=50)
    x = ranking_features_flat(fused, offsets, 1.3, ALL_FEATURES, {"rank1_known": known, "rank1_prior": prior,
                                                                   "one_formula": one_formula,
                                                                   "spectral_entropy": entropy})
    top = top_index_flat(fused, offsets)
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        part = fused[a:b]
        assert top[i] == a + int(np.argmax(part))
        s = np.sort(part)[::-1]
        p = np.exp(s / 1.3) / np.exp(s / 1.3).sum()
        t = min(max(p[0], 1e-12), 1 - 1e-12)
        q = p[:10] / p[:10].sum()
        expected = {"top1_logit": math.log(t / (1 - t)), "top1_log_p": math.log(t), "top1_log_1mp": math.log1p(-t),
                    "margin": s[0] - s[min(1, len(s) - 1)], "margin3": s[0] - s[min(2, len(s) - 1)],
                    "margin5": s[0] - s[min(4, len(s) - 1)], "entropy10": -np.sum(q * np.log(q)),
                    "log_n_candidates": math.log(b - a), "rank1_known": known[i], "rank1_prior": prior[i],
                    "one_formula": one_formula[i], "spectral_entropy": entropy[i]}
        np.testing.assert_allclose(x[i], [expected[n] for n in ALL_FEATURES], atol=1e-9)
    with pytest.raises(ValueError):
        ranking_features_flat(fused, offsets, 1.0, ["rank1_known"])  # an extra feature must be supplied


def test_spectrum_features_are_the_entropy_of_the_normalised_intensities():
    from molpredict.spectra.record import Spectrum

    def spectrum(intensities):
        return Spectrum("s", np.arange(1.0, len(intensities) + 1.0) * 50.0, np.asarray(intensities, dtype=float))

    # by hand: two equal peaks -> log 2; four equal -> log 4; (1, 3) -> -(1/4 log 1/4 + 3/4 log 3/4);
    # one peak, no peak, zero and non-finite intensities -> what the positive peaks give
    spectra = [spectrum([5.0, 5.0]), spectrum([1.0, 1.0, 1.0, 1.0]), spectrum([1.0, 3.0]), spectrum([7.0]),
               spectrum([]), spectrum([0.0, 2.0, 2.0]), spectrum([np.nan, 4.0, 4.0]), "a text query"]
    expected = [math.log(2), math.log(4), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0, 0.0,
                math.log(2), math.log(2), 0.0]
    features = spectrum_features(spectra)
    assert set(features) == set(SPECTRUM_FEATURES)
    np.testing.assert_allclose(features["spectral_entropy"], expected, atol=1e-12)
    # it is a feature the caller supplies, and every feature set the calibration compares has a variant with it
    assert set(SPECTRUM_FEATURES) <= set(EXTRA_FEATURES)
    assert all(f"{name}+entropy" in FEATURE_SETS for name in FEATURE_SETS if "entropy" not in name)


def test_prior_is_reference_equals_a_top_similarity_of_one():
    from molpredict.chem.molecules import Molecule
    from molpredict.models.baselines import PriorBaseline

    reference = [Molecule(s) for s in ("CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CCN(CC)CC")]
    prior = PriorBaseline(top_k=1).fit(reference, reference)
    queries = [Molecule(s) for s in ("OCC", "Oc1ccccc1", "Cc1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CCCN", "CCN(CC)CC")]
    top = prior.kernel_.transform(queries).max(axis=1)  # the naive reference: the top similarity
    np.testing.assert_array_equal(prior.is_reference(queries), np.isclose(top, 1.0))
    assert prior.is_reference(queries).tolist() == [True, True, False, True, False, True]
    counts = PriorBaseline(counts=True).fit(reference, reference)
    np.testing.assert_array_equal(counts.is_reference(queries),
                                  np.isclose(counts.kernel_.transform(queries).max(axis=1), 1.0))


@pytest.mark.shared
def test_grouped_calibration_on_real_validation_spectra(shared_data):
    """Real val_pos spectra and their same-formula sets, ranked by a structure prior fitted on real training
    structures: the validation structures are never training structures, so a rank 1 the prior knows is almost
    always wrong (only a fingerprint collision, e.g. a longer alkyl chain, makes it right); the grouped,
    structure-weighted calibration learns that and is calibrated out of fold per structure."""
    import itertools

    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.chem.molecules import Molecule
    from molpredict.identification.calibration import out_of_fold_probabilities
    from molpredict.io import read_spectra
    from molpredict.models.baselines import PriorBaseline
    from molpredict.training.ranking_validation import ValidationTerms, fit_scoring

    train = {}
    for s in itertools.islice(read_spectra(shared_data / "massbank" / "train_pos.mgf"), 6000):
        if s.inchikey and s.smiles:
            train.setdefault(s.inchikey[:14], s.smiles)
    prior = PriorBaseline(top_k=1).fit(list(train.values()), [Molecule(m) for m in train.values()])
    sets = load_candidate_sets(shared_data / "candidates" / "val_formula.json")
    spectra = [s for s in read_spectra(shared_data / "massbank" / "val_pos.mgf")
               if s.inchikey and len(sets.get(s.inchikey[:14], ())) >= 3]
    keys = sorted({s.inchikey[:14] for s in spectra})
    chosen = set(np.random.default_rng(0).choice(keys, size=120, replace=False))
    spectra = [s for s in spectra if s.inchikey[:14] in chosen]
    scores, known, is_true, sizes, groups = [], [], [], [], []
    per_structure = {}
    for key in sorted(chosen):
        entries = sets[key]
        molecules = [Molecule(smiles, inchikey14=k) for k, smiles in entries]
        per_structure[key] = (prior.candidate_scores(molecules), prior.is_reference(molecules),
                              np.array([k == key for k, _ in entries]))
    for s in spectra:  # every spectrum of a structure ranks its set: the correlated copies calibration must see
        key = s.inchikey[:14]
        p, k, t = per_structure[key]
        scores.append(p)
        known.append(k)
        is_true.append(t)
        sizes.append(len(p))
        groups.append(key)
    data = ValidationTerms(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), np.concatenate(is_true),
                           {"prior": np.concatenate(scores)}, groups, np.concatenate(known))
    assert len(set(groups)) == 120 and data.n_queries > 300  # several spectra per structure
    fusion, calibrator, report = fit_scoring(data, seed=0)
    cal = report["calibration"]
    assert calibrator.method in ("platt", "beta", "isotonic") and set(calibrator.features) <= set(ALL_FEATURES)
    best = min(m["log_loss"] for m in cal["compared"].values())
    assert best <= cal["log_loss_out_of_fold"] <= best * 1.005 + 1e-12  # a near-tie of the best, decided by ECE
    near = [m for m in cal["compared"].values() if m["log_loss"] <= best * 1.005 + 1e-12]
    assert max(cal["ece_out_of_fold"], cal["ece_out_of_fold_per_structure"]) == min(
        max(m["ece"], m["ece_per_structure"]) for m in near)
    # rank 1 a training structure -> wrong on validation structures, and the feature that says so is chosen
    rank1_known = np.array([per_structure[g][1][np.argmax(per_structure[g][0])] for g in groups])
    hits = np.array([per_structure[g][2][np.argmax(per_structure[g][0])] for g in groups])
    assert rank1_known.sum() >= 50 and hits[rank1_known].mean() < 0.1 < hits[~rank1_known].mean()
    assert "rank1_known" in calibrator.features
    # out of fold (folds by structure, structure-weighted): calibrated in the large and per structure
    names = list(ALL_FEATURES)
    from molpredict.training.ranking_validation import calibration_data
    x, correct, _ = calibration_data(data, fusion.combine_flat(data.terms, data.offsets), fusion.temperature)
    columns = x[:, [names.index(n) for n in calibrator.features]]
    p = out_of_fold_probabilities(columns, correct, groups, calibrator.method, calibrator.features)
    w = structure_weights(groups)
    assert abs(np.average(p, weights=w) - np.average(correct, weights=w)) < 0.05
    assert expected_calibration_error(p, correct, weights=w) < 0.1
    assert np.average(p[rank1_known], weights=w[rank1_known]) < 0.1


def test_evaluate_writes_a_threshold_that_selects_the_reported_queries():
    """QA: the cut 0.824674 was written 0.8247 (the table: 0.825), which selects fewer queries than reported;
    the written threshold is rounded down only as far as no lower probability comes in."""
    from molpredict.identification.evaluate import calibration_report, format_report

    p = np.r_[np.full(6, 0.99), np.full(4, 0.824674), np.full(3, 0.8246), np.full(5, 0.2)]
    ranks = {"probability": p, "n_greater": np.zeros(p.size, dtype=np.int64),
             "n_ties": np.zeros(p.size, dtype=np.int64), "found": np.ones(p.size, dtype=bool),
             "groups": [f"S{i}" for i in range(p.size)]}
    fdr = calibration_report(ranks, max_fdr=0.1)["confident_at_fdr"]
    # top 10: mean(1 - p) = (6 * 0.01 + 4 * 0.175326) / 10 = 0.0761; top 13 = 0.0992; top 18 > 0.1
    assert fdr["n_queries"] == 13 and fdr["threshold"] == 0.824  # the next lower is 0.2: three decimals do
    assert int(np.sum(p >= fdr["threshold"])) == fdr["n_queries"]
    p2 = np.r_[np.full(6, 0.99), np.full(4, 0.824674), np.full(3, 0.8246), np.full(5, 0.01)]
    ranks = {"probability": p2, "n_greater": np.r_[np.zeros(10), np.ones(8)].astype(np.int64),
             "n_ties": np.zeros(18, dtype=np.int64), "found": np.ones(18, dtype=bool),
             "groups": [f"S{i}" for i in range(18)]}
    result = calibration_report(ranks, max_fdr=0.08)
    fdr = result["confident_at_fdr"]
    assert fdr["n_queries"] == 10 and fdr["threshold"] == 0.82467  # 0.8246 would take in the next three
    assert int(np.sum(p2 >= fdr["threshold"])) == 10
    hits = {f"hit@{k}": 0.5 for k in (1, 5, 10, 20)}
    metrics = {"n_queries": 18, **hits, "mrr": 0.5, "mean_rank": 2.0, "n_structures": 18, "n_empty_spectra": 0,
               "n_skipped": 0, "skipped": {}, "ci95": {k: [0.4, 0.6] for k in hits},
               "per_structure": {**hits, "mrr": 0.5}, "average_ties": {**hits, "mrr": 0.5},
               "random": {**hits, "mrr": 0.5}, "candidates": {"median": 18}, "calibration": result}
    text = format_report({"m": metrics})
    assert "(p >= 0.82467" in text


def test_evaluate_calibration_block_per_spectrum_and_per_structure_by_hand():
    from molpredict.identification.evaluate import calibration_report

    # structure A: three spectra, p 0.95, two right; B: one spectrum, p 0.99, wrong; C: p 0.3, right; D: NaN
    ranks = {"probability": np.array([0.95, 0.95, 0.95, 0.99, 0.3, np.nan]),
             "n_greater": np.array([0, 0, 2, 1, 0, 0]), "n_ties": np.zeros(6, dtype=np.int64),
             "found": np.ones(6, dtype=bool), "groups": ["A", "A", "A", "B", "C", "D"]}
    cal = calibration_report(ranks, max_fdr=0.1)
    assert cal["n_queries"] == 5 and cal["accuracy"] == pytest.approx(3 / 5)
    # confident at est. FDR <= 10%: 0.99, 0.95 x3 (mean 1 - p = 0.04); + 0.3 would give 0.172
    fdr = cal["confident_at_fdr"]
    assert fdr["n_queries"] == 4 and fdr["n_structures"] == 2 and fdr["estimated_fdr"] == pytest.approx(0.04)
    assert fdr["observed_fdr"] == pytest.approx(2 / 4)  # B wrong, one A wrong
    # per structure: A weighs 1 (1/3 wrong), B weighs 1 (wrong) -> (1/3 + 1) / 2
    assert fdr["observed_fdr_per_structure"] == pytest.approx(round((1 / 3 + 1) / 2, 4))
    per = cal["per_structure"]
    assert per["n_structures"] == 3 and per["accuracy"] == pytest.approx(round((2 / 3 + 0 + 1) / 3, 4))
    # bins: [0.3, 0.4): C (w 1, p .3, right); [0.9, 1]: A (w 1, p .95, acc 2/3) + B (w 1, p .99, wrong)
    expected = (1 / 3) * 0.7 + (2 / 3) * abs((0.95 + 0.99) / 2 - (2 / 3) / 2)
    assert per["ece"] == pytest.approx(round(expected, 4))
    assert cal["ece"] == pytest.approx(round(0.2 * 0.7 + 0.8 * abs((0.95 * 3 + 0.99) / 4 - 0.5), 4))
    assert [b["weight"] for b in per["reliability"]] == pytest.approx([1.0, 2.0])


def test_calibration_benchmark_rows_say_whether_the_fdr_held():
    from conftest import load_benchmark

    bench = load_benchmark("calibration")
    cal = {"ece": 0.041, "mean_probability": 0.4, "per_structure": {"ece": 0.03},
           "confident_at_fdr": {"n_queries": 40, "n_structures": 12, "estimated_fdr": 0.098, "observed_fdr": 0.125,
                                "observed_fdr_per_structure": 0.08}}
    result = {"n_queries": 100, "n_structures": 30, "hit@1": 0.45, "calibration": cal}
    assert bench.row("positive", "mass", result) == (
        "| positive | mass | 100 / 30 | 45.0 | 40.0 | 0.041 | 0.030 | 40 / 12 | 9.8 | 12.5 | 8.0 | **no** |")
    cal["confident_at_fdr"]["observed_fdr"] = 0.11
    assert bench.row("positive", "mass", result).endswith("| 11.0 | 8.0 | yes |")


def test_the_sets_kind_is_chosen_where_it_shifts_the_accuracy_and_mends_each_kinds_calibration():
    """Planted: at equal scores, queries of sets with several formulas are right more often (logit + 1.5). The
    selection takes a feature set with ``one_formula``, and each kind's out-of-fold mean probability then
    matches its accuracy, which the best set without it cannot do."""
    from molpredict.identification.calibration import FEATURE_SETS, out_of_fold_probabilities, select_calibrator

    rng = np.random.default_rng(3)
    n_structures, per = 400, 3
    groups = [f"s{i}" for i in range(n_structures) for _ in range(per)]
    n = len(groups)
    one_formula = np.repeat(rng.integers(0, 2, n_structures), per).astype(float)
    logit = rng.normal(0, 1.5, n)
    correct = rng.random(n) < 1 / (1 + np.exp(-(logit + 1.5 * (1 - one_formula))))
    names = list(ALL_FEATURES)
    features = np.zeros((n, len(names)))
    features[:, names.index("top1_logit")] = logit
    features[:, names.index("margin")] = rng.normal(size=n)
    features[:, names.index("log_n_candidates")] = np.log(rng.integers(2, 300, n))
    features[:, names.index("one_formula")] = one_formula
    available = [*FEATURES, "one_formula"]
    calibrator, table = select_calibrator(features, correct, groups, names, available, methods=("platt",),
                                          weightings=("structure",))
    assert "one_formula" in calibrator.features
    assert "base/platt" in table and "base+one_formula/platt" in table
    for chosen in (FEATURE_SETS["base"], FEATURE_SETS["base+one_formula"]):
        p = out_of_fold_probabilities(features[:, [names.index(c) for c in chosen]], correct, groups, "platt",
                                      chosen)
        gaps = [abs(p[one_formula == k].mean() - correct[one_formula == k].mean()) for k in (0, 1)]
        if "one_formula" in chosen:
            assert max(gaps) < 0.03
        else:
            assert max(gaps) > 0.08


def test_shared_validation_terms_give_each_query_its_sets_kind():
    """The training path's validation terms (the model's kept scores) carry ``one_formula`` per query: a set of
    C3H8O isomers is one formula, a set that adds ethanol is not; two queries sharing a set share the answer."""
    from types import SimpleNamespace

    from molpredict.chem.molecules import Molecule
    from molpredict.models.base import CandidateSets, ValidationData
    from molpredict.training.ranking_validation import ValidationTerms, shared_validation_terms

    pool = [Molecule(s) for s in ("CCCO", "CC(C)O", "COCC", "CCO")]
    sets = [np.array([0, 1, 2]), np.array([0, 1, 2, 3]), np.array([0, 1, 2])]
    candidates = CandidateSets(pool, sets, [s == 0 for s in sets], positions=[0, 1, 2])
    labels = [SimpleNamespace(inchikey14=pool[0].inchikey14)] * 3
    sub = SimpleNamespace(model=SimpleNamespace(validation_scores_=np.arange(10, dtype=float)), prior=None)
    terms = shared_validation_terms(sub, ValidationData(["x0", "x1", "x2"], labels, candidates))
    assert terms.one_formula.tolist() == [True, False, True]
    assert terms.subset(np.array([1, 2])).one_formula.tolist() == [False, True]
    assert terms.strata.tolist() == [0, 0, 0]  # one collection of sets
    # the queries of sets from two collections keep their collection through subset, view and concatenate
    two = CandidateSets(pool, sets, [s == 0 for s in sets], positions=[0, 1, 2], collections=[0, 1, 1])
    terms = shared_validation_terms(sub, ValidationData(["x0", "x1", "x2"], labels, two))
    assert terms.strata.tolist() == [0, 1, 1] and terms.subset(np.array([2, 0])).strata.tolist() == [1, 0]
    assert terms.view(["spectrum"]).strata.tolist() == [0, 1, 1]
    joined = ValidationTerms.concatenate([terms, replace(terms, strata=None), terms])
    assert joined.strata.tolist() == [0, 1, 1, 2, 2, 2, 3, 4, 4]  # a part without strata is one stratum


def test_spectral_entropy_reaches_the_calibration_from_validation_and_at_identify_alike():
    """Validation terms over spectra carry each query spectrum's entropy through subset, view and concatenate,
    and the calibration's features offer it; at identify time the evidence gives a query the same value from its
    spectrum. Queries that are not spectra (text) have none, and it is not offered."""
    from types import SimpleNamespace

    from molpredict.chem.molecules import Molecule
    from molpredict.identification.evidence import Evidence
    from molpredict.models.base import CandidateSets, ValidationData
    from molpredict.spectra.record import Spectrum
    from molpredict.training.ranking_validation import ValidationTerms, calibration_data, shared_validation_terms

    pool = [Molecule(s) for s in ("CCCO", "CC(C)O", "COCC")]
    sets = [np.array([0, 1, 2])] * 3
    candidates = CandidateSets(pool, sets, [s == 0 for s in sets], positions=[0, 1, 2])
    labels = [SimpleNamespace(inchikey14=pool[0].inchikey14)] * 3
    spectra = [Spectrum("a", np.array([50.0, 60.0]), np.array([1.0, 1.0])),
               Spectrum("b", np.array([50.0]), np.array([3.0])),
               Spectrum("c", np.array([50.0, 60.0, 70.0, 80.0]), np.array([2.0, 2.0, 2.0, 2.0]))]
    expected = [math.log(2), 0.0, math.log(4)]
    sub = SimpleNamespace(model=SimpleNamespace(validation_scores_=np.array([3.0, 1, 0, 0, 1, 3, 1, 3, 0])),
                          prior=None)
    terms = shared_validation_terms(sub, ValidationData(spectra, labels, candidates))
    np.testing.assert_allclose(terms.spectrum_features[:, 0], expected)
    np.testing.assert_allclose(terms.subset(np.array([2, 0])).spectrum_features[:, 0], [expected[2], expected[0]])
    np.testing.assert_allclose(terms.view(["spectrum"]).spectrum_features[:, 0], expected)
    joined = ValidationTerms.concatenate([terms, terms])
    np.testing.assert_allclose(joined.spectrum_features[:, 0], expected * 2)
    features, correct, available = calibration_data(terms, terms.terms["spectrum"], 1.0)
    assert "spectral_entropy" in available and correct.tolist() == [True, False, False]
    np.testing.assert_allclose(features[:, ALL_FEATURES.index("spectral_entropy")], expected)
    # identify: the same value from each query's (cleaned) spectrum
    queries = [SimpleNamespace(spectrum=x, ids=np.arange(3)) for x in spectra]
    offsets = np.array([0, 3, 6, 9])
    got = Evidence(None)._rank1_features_flat(queries, np.zeros(9), offsets, [{}] * 3, ["spectral_entropy"])
    np.testing.assert_allclose(got["spectral_entropy"], expected)
    # text queries: no spectrum features, and the calibration does not offer them
    text = shared_validation_terms(sub, ValidationData(["x0", "x1", "x2"], labels, candidates))
    assert text.spectrum_features is None
    assert "spectral_entropy" not in calibration_data(text, text.terms["spectrum"], 1.0)[2]


def test_log_loss_excess_by_hand():
    """Two structures: s1 (two spectra) and s2 (one). Excess per structure = mean over its spectra of the log-loss
    difference; the excess is their mean, the standard error their sd / sqrt(2)."""
    from molpredict.identification.calibration import log_loss_excess

    p = np.array([0.5, 0.8, 0.25])
    q = np.array([0.5, 0.5, 0.5])
    correct = np.array([True, False, True])
    groups = ["s1", "s1", "s2"]
    d1 = (-np.log(0.5) + np.log(0.5) - np.log(0.2) + np.log(0.5)) / 2  # s1: (0 + log(0.5/0.2)) / 2
    d2 = -np.log(0.25) + np.log(0.5)
    excess, se = log_loss_excess(p, q, correct, groups)
    assert excess == pytest.approx((d1 + d2) / 2)
    assert se == pytest.approx(abs(d1 - d2) / 2)  # sd of two values / sqrt(2) = |a - b| / 2
    w = structure_weights(groups)
    assert excess == pytest.approx(log_loss(p, correct, w) - log_loss(q, correct, w))
    assert log_loss_excess(p[:1], q[:1], correct[:1], groups[:1]) == (0.0, 0.0)


def test_calibrators_are_chosen_by_their_worst_calibrated_stratum_among_near_ties():
    """Planted: queries of mass-window sets (stratum 1) are right more often at equal scores (logit + 0.6), too
    little for 150 structures to tell the two feature sets apart by log-loss (near-ties: within 2 standard errors
    over structures of the best). Without strata the selection takes the calibrator without the set's kind (its
    ECE over all queries is lower: right on average, off in each stratum); with them, the one whose worst
    per-stratum ECE is lowest, with the set's kind; the table records the rule's inputs."""
    from molpredict.identification.calibration import log_loss_excess, out_of_fold_probabilities, select_calibrator

    rng = np.random.default_rng(5)
    n_structures, per = 150, 3
    groups = [f"s{i}" for i in range(n_structures) for _ in range(per)]
    n = len(groups)
    stratum = np.repeat(rng.integers(0, 2, n_structures), per)
    logit = rng.normal(0, 1.5, n)
    correct = rng.random(n) < 1 / (1 + np.exp(-(logit + 0.6 * stratum)))
    names = list(ALL_FEATURES)
    features = np.zeros((n, len(names)))
    features[:, names.index("top1_logit")] = logit
    features[:, names.index("margin")] = rng.normal(size=n)
    features[:, names.index("log_n_candidates")] = np.log(rng.integers(2, 300, n))
    features[:, names.index("one_formula")] = 1 - stratum
    sets = {"base": FEATURES, "base+one_formula": (*FEATURES, "one_formula")}
    kwargs = dict(feature_sets=sets, methods=("platt", "isotonic"), weightings=("structure",))
    cal, table = select_calibrator(features, correct, groups, names, strata=stratum, **kwargs)
    assert all(len(row["ece_per_stratum"]) == 2 for row in table.values())
    best = min(table, key=lambda k: table[k]["log_loss"])
    for key, row in table.items():  # the near-tie flag is the documented rule
        chosen = sets[key.split("/")[0]]
        p = out_of_fold_probabilities(features[:, [names.index(c) for c in chosen]], correct, groups,
                                      key.split("/")[1], chosen, seed=0)
        q_best = out_of_fold_probabilities(features[:, [names.index(c) for c in sets[best.split("/")[0]]]],
                                           correct, groups, best.split("/")[1], sets[best.split("/")[0]], seed=0)
        excess, se = log_loss_excess(p, q_best, correct, groups)
        assert row["near_tie"] == (excess <= max(0.005 * table[best]["log_loss"], 2 * se) + 1e-12)
        for k in (0, 1):
            assert row["ece_per_stratum"][k] == pytest.approx(expected_calibration_error(p[stratum == k],
                                                                                         correct[stratum == k]))
    worst = {k: max(v["ece_per_structure"], *v["ece_per_stratum"]) for k, v in table.items() if v["near_tie"]}
    key = f"{cal.validation['feature_set']}/{cal.method}"
    assert worst[key] == min(worst.values())
    assert key == "base+one_formula/platt" and table["base/platt"]["near_tie"]
    assert table["base/platt"]["ece"] < table[key]["ece"]  # over all queries the other one looks better
    # one stratum: the per-stratum ECE is the ECE over all queries, and the choice is the other near-tie
    without, one = select_calibrator(features, correct, groups, names, **kwargs)
    assert all(row["ece_per_stratum"] == [pytest.approx(row["ece"])] for row in one.values())
    assert f"{without.validation['feature_set']}/{without.method}" == "base/platt"
    # a stratum too small to check on its own is not: ten queries of a third kind are left out of the worst ECE
    few = stratum.copy()
    few[:10] = 2
    tiny, tiny_table = select_calibrator(features, correct, groups, names, strata=few, min_stratum=100, **kwargs)
    assert all(len(v["ece_per_stratum"]) == 3 for v in tiny_table.values())
    worst = {k: max(v["ece_per_structure"], *v["ece_per_stratum"][:2]) for k, v in tiny_table.items() if v["near_tie"]}
    assert worst[f"{tiny.validation['feature_set']}/{tiny.method}"] == min(worst.values())
    # no stratum large enough: the ECE per structure alone decides among the near-ties
    alone, alone_table = select_calibrator(features, correct, groups, names, strata=stratum, min_stratum=10**6,
                                           **kwargs)
    ties = {k: v["ece_per_structure"] for k, v in alone_table.items() if v["near_tie"]}
    assert ties[f"{alone.validation['feature_set']}/{alone.method}"] == min(ties.values())
    with pytest.raises(ValueError, match="one stratum per query"):
        select_calibrator(features, correct, groups, names, strata=stratum[:-1], **kwargs)
