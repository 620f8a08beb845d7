"""The FDR estimate behind ``confident_at_fdr``: its upper bound over queries sharing a rank-1 structure, the
structure bootstrap of the observed FDR, the weighting of structures, and the bound's place in the bundle."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from molpredict.identification.calibration import (FDR_Z, WEIGHTINGS, Calibrator, bootstrap_observed_fdr,
                                                   confident_at_fdr, fdr_estimates, select_calibrator,
                                                   structure_weights)


def _naive_fdr_bound(p: np.ndarray, clusters: list, z: float) -> np.ndarray:
    """Per top-j list (by decreasing p, stable): mean(1 - p) + z sqrt(sum_c E_c (n_c - E_c)) / j, from scratch."""
    order = sorted(range(len(p)), key=lambda i: -p[i])
    out = []
    for j in range(1, len(p) + 1):
        top = order[:j]
        variance = 0.0
        for c in {clusters[i] for i in top}:
            members = [i for i in top if clusters[i] == c]
            expected = sum(1.0 - p[i] for i in members)
            variance += expected * (len(members) - expected)
        out.append(sum(1.0 - p[i] for i in top) / j + z * math.sqrt(max(variance, 0.0)) / j)
    return np.array(out)


@pytest.mark.parametrize("seed", range(8))
def test_fdr_bound_equals_a_naive_per_list_computation(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    p = np.round(rng.random(n), 2)  # ties on purpose
    clusters = [f"s{c}" for c in rng.integers(0, 6, n)]
    z = float(rng.choice([0.0, 1.0, 2.5]))
    order, fdr = fdr_estimates(p, clusters, z)
    assert np.array_equal(order, np.argsort(-p, kind="stable"))
    np.testing.assert_allclose(fdr, _naive_fdr_bound(p, clusters, z), rtol=1e-12, atol=1e-12)
    # no clusters: every query its own (independent Bernoulli variance p (1 - p))
    _, alone = fdr_estimates(p, None, z)
    np.testing.assert_allclose(alone, _naive_fdr_bound(p, list(range(n)), z), rtol=1e-12, atol=1e-12)


def test_fdr_bound_by_hand():
    # p 0.9, 0.9 of structure A, then 0.8 of B: E_A = 0.2 over n_A = 2, E_B = 0.2 over 1
    p = np.array([0.8, 0.9, 0.9])
    _, fdr = fdr_estimates(p, ["B", "A", "A"], z=2.0)
    assert fdr[0] == pytest.approx(0.1 + 2.0 * math.sqrt(0.1 * 0.9))
    assert fdr[1] == pytest.approx(0.1 + 2.0 * math.sqrt(0.2 * 1.8) / 2)
    assert fdr[2] == pytest.approx(0.4 / 3 + 2.0 * math.sqrt(0.2 * 1.8 + 0.2 * 0.8) / 3)
    # the same three as independent queries: a smaller variance (0.09 + 0.09 + 0.16)
    _, alone = fdr_estimates(p, ["x", "y", "z"], z=2.0)
    assert alone[2] == pytest.approx(0.4 / 3 + 2.0 * math.sqrt(0.34) / 3)
    assert alone[2] < fdr[2]


def test_confident_at_fdr_never_cuts_inside_tied_probabilities():
    """QA: with p = 0.95 x5 and 0.80 x10 the top 6 (estimate 0.075) was reported as 6 queries at threshold 0.8,
    and ``p >= 0.8`` flagged all 15 (estimate 0.15). A threshold can give 5 or 15, and only 5 is within 10%."""
    p = np.r_[np.full(5, 0.95), np.full(10, 0.80)]
    assert confident_at_fdr(p, 0.1) == (5, 0.95)
    assert confident_at_fdr(np.full(4, 0.8), 0.1) == (0, 1.0)  # the only list, all four, is at 0.2
    rng = np.random.default_rng(0)
    for _ in range(200):
        q = rng.choice([0.99, 0.97, 0.93, 0.9, 0.85, 0.7, 0.5], size=int(rng.integers(1, 40)))
        clusters = [f"s{c}" for c in rng.integers(0, 6, q.size)]
        for z in (0.0, 1.0, 2.5):
            n, threshold = confident_at_fdr(q, 0.1, clusters, z)
            chosen = q >= threshold if n else np.zeros(q.size, dtype=bool)
            assert chosen.sum() == n
            if n:  # the reported list is itself within the bound, and the next longer list a threshold gives is not
                order = np.argsort(-q, kind="stable")
                bound = _naive_fdr_bound(q[order], np.asarray(clusters)[order], z)
                assert bound[n - 1] <= 0.1 + 1e-12
                longer = [j for j in range(n + 1, q.size + 1) if j == q.size or q[order][j] < q[order][j - 1]]
                assert all(bound[j - 1] > 0.1 for j in longer)


def test_confident_at_fdr_plain_is_unchanged_and_clusters_report_fewer():
    p = np.array([0.99, 0.95, 0.95, 0.9, 0.85, 0.8, 0.5])
    # plain: running mean(1 - p) 0.01, 0.03, 0.0367, 0.05, 0.07, 0.0917, 0.15 -> the top 6, threshold 0.8
    assert confident_at_fdr(p, 0.1) == (6, 0.8)
    assert confident_at_fdr(p, 0.1, ["a"] * 7, z=0.0) == (6, 0.8)
    # 80 queries: by structures of 10 spectra (right or wrong together) the bound is wider than by independent
    # spectra, and fewer are reported
    # (distinct probabilities: any top j is a list a threshold can give)
    p = np.r_[np.linspace(0.995, 0.985, 30), np.linspace(0.955, 0.945, 30), np.linspace(0.805, 0.795, 20)]
    by_ten = [f"s{i // 10}" for i in range(80)]
    n_ten, t_ten = confident_at_fdr(p, 0.1, by_ten, z=1.0)
    n_alone, _ = confident_at_fdr(p, 0.1, None, z=1.0)
    n_plain, _ = confident_at_fdr(p, 0.1)
    assert 0 < n_ten < n_alone < n_plain
    bound = _naive_fdr_bound(p, by_ten, 1.0)
    assert n_ten == int(np.flatnonzero(bound <= 0.1)[-1]) + 1 and t_ten == p[n_ten - 1]
    assert confident_at_fdr(np.array([]), 0.1, [], z=2.0) == (0, 1.0)
    with pytest.raises(ValueError):
        fdr_estimates(p, None, z=-1.0)
    with pytest.raises(ValueError):
        fdr_estimates(p, ["a"], z=1.0)


def _clustered_set():
    """Structure W: 20 spectra, all wrong at p 0.9; 20 structures of one spectrum each, right at p 0.95.

    Per spectrum the list at p >= 0.9 is half wrong (20 / 40); per structure 1 / 21."""
    p = np.r_[np.full(20, 0.9), np.full(20, 0.95)]
    correct = np.r_[np.zeros(20, dtype=bool), np.ones(20, dtype=bool)]
    groups = ["W"] * 20 + [f"R{i}" for i in range(20)]
    return p, correct, groups


def test_bootstrap_observed_fdr_on_a_clustered_set():
    p, correct, groups = _clustered_set()
    # asked 10%: plain reports 0.95 x20 + 0.9 x20 (mean 1 - p = 0.075); observed 50% per spectrum
    n, threshold = confident_at_fdr(p, 0.1)
    assert n == 40 and 1 - correct[p >= threshold].mean() == pytest.approx(0.5)
    w = structure_weights(groups)
    assert 1 - np.average(correct, weights=w) == pytest.approx(1 / 21)
    plain = bootstrap_observed_fdr(p, correct, groups, max_fdr=0.1, n_boot=300, seed=1)
    # every resample holds W 0, 1, 2... times among 21 draws: observed = 20 k / (20 k + (21 - k)) when reported
    k_values = np.arange(0, 22)
    allowed = set(np.round(20 * k_values / (20 * k_values + 21 - k_values), 10))
    assert all(round(o, 10) in allowed for o in plain["observed"])
    assert plain["q10"] <= plain["q50"] <= plain["q90"] <= plain["q95"]
    assert plain["q50"] > 0.3 and plain["p_above"] > 0.5
    # the bound with the rank-1 structure as cluster sees W's 20 spectra as one draw and keeps them out
    clusters = ["W"] * 20 + groups[20:]
    bound = bootstrap_observed_fdr(p, correct, groups, clusters, z=FDR_Z, max_fdr=0.1, n_boot=300, seed=1)
    assert bound["q90"] < plain["q50"]
    assert np.mean(bound["n_reported"]) < np.mean(plain["n_reported"])


def test_bootstrap_of_a_single_structure_is_the_observed_fdr():
    p = np.array([0.99, 0.98, 0.97, 0.2])
    correct = np.array([True, False, True, False])
    out = bootstrap_observed_fdr(p, correct, ["A"] * 4, n_boot=20, seed=0)
    n, t = confident_at_fdr(p, 0.1)
    expected = 1 - correct[p >= t].mean()
    assert out["observed"] == pytest.approx([expected] * 20) and out["q10"] == out["q95"] == pytest.approx(expected)
    with pytest.raises(ValueError):
        bootstrap_observed_fdr(p, correct, ["A"] * 3)


def test_structure_weights_power_moves_from_per_structure_to_per_spectrum():
    groups = ["A", "A", "A", "A", "B"]
    np.testing.assert_allclose(structure_weights(groups), [0.25] * 4 + [1.0])
    np.testing.assert_allclose(structure_weights(groups, WEIGHTINGS["sqrt_structure"]), [0.5] * 4 + [1.0])
    np.testing.assert_allclose(structure_weights(groups, 0.0), np.ones(5))


def test_select_calibrator_compares_weightings_on_a_set_where_spectrum_and_structure_differ():
    # many-spectra structures are easy (right at a moderate score), single-spectrum ones hard: fitted per
    # structure the probability of a spectrum of an easy structure is too low, and per spectrum the other way
    rng = np.random.default_rng(0)
    rows, correct, groups = [], [], []
    for s in range(60):
        n = 12 if s < 20 else 1
        for _ in range(n):
            x = rng.normal()
            rows.append([x, 0.5, math.log(5)])
            correct.append(rng.random() < (0.8 if s < 20 else 0.3))
            groups.append(f"s{s}")
    x, correct = np.array(rows), np.array(correct)
    cal, table = select_calibrator(x, correct, groups, ("top1_logit", "margin", "log_n_candidates"),
                                   feature_sets={"base": ("top1_logit", "margin", "log_n_candidates")},
                                   methods=("platt",))
    assert set(table) == {"base/platt", "base/platt/sqrt_structure"}
    assert cal.validation["weighting"] in WEIGHTINGS
    # the weighting moves the mean probability between the per-structure and the per-spectrum accuracy
    per_structure = Calibrator.fit(x, correct, structure_weights(groups), "platt").predict(x).mean()
    sqrt = Calibrator.fit(x, correct, structure_weights(groups, 0.5), "platt").predict(x).mean()
    assert per_structure < sqrt < correct.mean() + 0.02
    with pytest.raises(ValueError):
        select_calibrator(x, correct, groups, ("top1_logit", "margin", "log_n_candidates"), weightings=("x",))


def test_fdr_setting_round_trips_and_old_states_keep_the_plain_estimate():
    x = np.random.default_rng(0).normal(size=(50, 3))
    correct = x[:, 0] > 0
    cal = Calibrator.fit(x, correct, method="beta")
    cal.fdr = {"z": 2.0, "clusters": "rank1"}
    state = json.loads(json.dumps(cal.to_dict()))
    back = Calibrator.from_dict(state)
    assert back.fdr == {"z": 2.0, "clusters": "rank1"} and back.fdr_z == 2.0
    np.testing.assert_array_equal(back.predict(x), cal.predict(x))
    del state["fdr"]
    old = Calibrator.from_dict(state)
    assert old.fdr == {} and old.fdr_z == 0.0 and "fdr" not in old.to_dict()
    for bad in ({"z": -1}, {"z": "2"}, {"z": float("inf")}, {"z": 1.0, "clusters": "spectrum"}):
        with pytest.raises(ValueError):
            Calibrator.from_dict({**state, "fdr": bad})


def test_evaluate_reports_the_bound_over_rank1_structures_by_hand():
    from molpredict.identification.evaluate import calibration_report

    # 4 spectra of A all ranked A at p 0.995 (right), 4 of B all ranked X at p ~0.95 (wrong), 2 singletons at 0.9
    p = np.array([0.995] * 4 + [0.95, 0.949, 0.948, 0.947] + [0.9, 0.9])
    correct = np.array([True] * 4 + [False] * 4 + [True, True])
    ranks = {"probability": p, "n_greater": np.where(correct, 0, 1), "n_ties": np.zeros(10, dtype=np.int64),
             "found": np.ones(10, dtype=bool), "groups": ["A"] * 4 + ["B"] * 4 + ["C", "D"],
             "rank1": ["A"] * 4 + ["X"] * 4 + ["C", "D"]}
    plain = calibration_report({**ranks, "fdr_z": np.zeros(10)}, max_fdr=0.1)
    assert plain["confident_at_fdr"]["n_queries"] == 10 and plain["confident_at_fdr"]["observed_fdr"] == 0.4
    assert plain["confident_at_fdr"] == plain["confident_at_fdr_plain"]
    # sub-models with different z: the largest is used
    bound = calibration_report({**ranks, "fdr_z": np.r_[np.full(9, 0.5), 1.0]}, max_fdr=0.1)["confident_at_fdr"]
    expected = _naive_fdr_bound(p, ranks["rank1"], 1.0)
    j = int(np.flatnonzero(expected <= 0.1)[-1]) + 1
    assert bound["z"] == 1.0 and bound["n_queries"] == j and 4 < j < 8
    assert bound["observed_fdr"] == pytest.approx(round((j - 4) / j, 4))
    assert bound["estimated_fdr"] == pytest.approx(round(float(np.mean(1 - p[:j])), 4))
    # a bundle saved before the bound existed reports no fdr_z: the plain estimate
    old = calibration_report({k: v for k, v in ranks.items() if k != "rank1"}, max_fdr=0.1)
    assert old["confident_at_fdr"]["n_queries"] == 10 and old["confident_at_fdr"]["z"] == 0.0


def _sets_with_truth_first(rng: np.random.Generator, n_sets: int, low: int, high: int):
    """``n_sets`` candidate sets of ``low``..``high - 1`` entries, the truth first in each: (sizes, offsets,
    is_true)."""
    sizes = rng.integers(low, high, n_sets)
    offsets = np.r_[0, np.cumsum(sizes)]
    is_true = np.zeros(offsets[-1], dtype=bool)
    is_true[offsets[:-1]] = True
    return sizes, offsets, is_true


def test_fit_scoring_stores_the_bound_in_the_calibration():
    from molpredict.training.ranking_validation import ValidationTerms, fit_scoring

    rng = np.random.default_rng(3)
    sizes, offsets, is_true = _sets_with_truth_first(rng, 120, 3, 8)
    spectrum = rng.normal(size=offsets[-1]) + 1.5 * is_true
    data = ValidationTerms(offsets, is_true, {"spectrum": spectrum}, [f"s{i // 3}" for i in range(120)])
    _, calibrator, report = fit_scoring(data)
    assert calibrator.fdr == {"z": FDR_Z, "clusters": "rank1"} == report["calibration"]["fdr"]
    assert report["calibration"]["weighting"] in WEIGHTINGS
    _, plain, _ = fit_scoring(data, fdr_z=0.0)
    assert plain.fdr_z == 0.0


def test_fit_scoring_fits_the_fusion_on_its_queries_and_the_calibration_on_all():
    from molpredict.identification.fusion import fit_fusion_kind
    from molpredict.training.ranking_validation import ValidationTerms, fit_scoring

    rng = np.random.default_rng(5)
    sizes, offsets, is_true = _sets_with_truth_first(rng, 200, 3, 9)
    # the first 100 queries: the prior helps; the last 100 (calibration only): it misleads
    second = np.repeat(np.arange(200) >= 100, sizes)
    terms = {"spectrum": rng.normal(size=offsets[-1]) + 1.0 * is_true,
             "prior": rng.normal(size=offsets[-1]) + np.where(second, -1.0, 1.5) * is_true}
    data = ValidationTerms(offsets, is_true, terms, [f"s{i // 2}" for i in range(200)])
    mask = np.arange(200) < 100
    fusion, calibrator, _ = fit_scoring(data, fusion_kind="weights", fusion_queries=mask)
    first = data.subset(np.flatnonzero(mask))
    alone = fit_fusion_kind("weights", first.terms, first.offsets, first.is_true, metric="mrr")
    assert fusion.weights == alone.weights and fusion.weights["prior"] > 0
    assert calibrator.validation["n_queries"] == 200
    with pytest.raises(ValueError):
        fit_scoring(data, fusion_queries=np.zeros(200, dtype=bool))
