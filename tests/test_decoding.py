"""Ranking, tie policies and retrieval metrics against hand-computed values and brute-force references."""
from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from molpredict.engine.decoding import (bootstrap_ci, group_means, margins, query_metrics, random_expectation,
                                 rank_candidates, topk_curve, true_rank_counts)


def _metrics(scores, true_index, policy, ks=(1, 2, 3, 4, 5)):
    scores = np.asarray(scores, dtype=float)
    is_true = np.zeros(len(scores), bool)
    is_true[true_index] = True
    g, t, found = true_rank_counts(scores, is_true)
    per = query_metrics(np.array([g]), np.array([t]), np.array([found]), np.array([len(scores)]), ks=ks,
                        policy=policy)
    return {k: float(v[0]) for k, v in per.items()}


def test_true_rank_counts_hand_computed():
    assert true_rank_counts(np.array([0.9, 0.5, 0.9, 0.1]), np.array([1, 0, 0, 0], bool)) == (0, 1, True)
    assert true_rank_counts(np.array([0.5, 0.3, 0.3, 0.1, 0.3]), np.array([0, 1, 0, 0, 0], bool)) == (1, 2, True)
    assert true_rank_counts(np.array([0.5, 0.3]), np.array([0, 0], bool)) == (0, 0, False)
    # two candidates share the true first block: the better one counts, the other is not a competitor
    assert true_rank_counts(np.array([0.2, 0.8, 0.5]), np.array([1, 1, 0], bool)) == (0, 0, True)


def test_tie_policies_hand_computed():
    # true 0.9 tied with one other: worst rank 2, average rank 1.5
    w = _metrics([0.9, 0.5, 0.9, 0.1], 0, "worst")
    a = _metrics([0.9, 0.5, 0.9, 0.1], 0, "average")
    assert (w["rank"], w["hit@1"], w["hit@2"], w["rr"]) == (2.0, 0.0, 1.0, 0.5)
    assert a["rank"] == 1.5 and a["hit@1"] == 0.5 and a["hit@2"] == 1.0
    assert a["rr"] == pytest.approx((1 + 1 / 2) / 2)
    # one better, two tied: worst rank 4; average rank 3, uniform on {2, 3, 4}
    w = _metrics([0.5, 0.3, 0.3, 0.1, 0.3], 1, "worst")
    a = _metrics([0.5, 0.3, 0.3, 0.1, 0.3], 1, "average")
    assert w["rank"] == 4.0 and w["hit@3"] == 0.0 and w["hit@4"] == 1.0 and w["rr"] == 0.25
    assert a["rank"] == 3.0
    assert [a[f"hit@{k}"] for k in (1, 2, 3, 4, 5)] == pytest.approx([0, 1 / 3, 2 / 3, 1, 1])
    assert a["rr"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    # no ties: both policies agree
    assert _metrics([0.1, 0.7, 0.3], 2, "worst") == _metrics([0.1, 0.7, 0.3], 2, "average")


def test_average_policy_matches_enumeration_of_tie_breaks():
    """The average policy is the exact expectation over all orderings of tied candidates."""
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(1, 7))
        scores = rng.integers(0, 3, size=n).astype(float)  # many ties
        t_idx = int(rng.integers(0, n))
        got = _metrics(scores, t_idx, "average", ks=(1, 2, 3))
        ranks = []
        for perm in itertools.permutations(range(n)):
            # a random tie-break is a random permutation used as the secondary key
            order = sorted(range(n), key=lambda i: (-scores[i], perm[i]))
            ranks.append(order.index(t_idx) + 1)
        ranks = [Fraction(r) for r in ranks]
        m = len(ranks)
        assert got["rank"] == pytest.approx(float(sum(ranks) / m))
        assert got["rr"] == pytest.approx(float(sum(1 / r for r in ranks) / m))
        for k in (1, 2, 3):
            assert got[f"hit@{k}"] == pytest.approx(sum(r <= k for r in ranks) / m)
        worst = _metrics(scores, t_idx, "worst", ks=(1,))
        assert worst["rank"] == max(ranks)


def test_missing_truth_is_a_miss():
    per = query_metrics(np.array([0]), np.array([0]), np.array([False]), np.array([7]), ks=(1, 10),
                        policy="average")
    assert per["hit@1"][0] == 0 and per["hit@10"][0] == 0 and per["rr"][0] == 0 and per["rank"][0] == 8


def test_random_expectation_exact():
    r = random_expectation(np.array([4, 1, 20]), ks=(1, 5), k_max=3)
    assert r["hit@1"] == pytest.approx((1 / 4 + 1 + 1 / 20) / 3)
    assert r["hit@5"] == pytest.approx((1 + 1 + 5 / 20) / 3)
    h4 = 1 + 1 / 2 + 1 / 3 + 1 / 4
    h20 = sum(1 / i for i in range(1, 21))
    assert r["mrr"] == pytest.approx((h4 / 4 + 1 + h20 / 20) / 3)
    assert r["mean_rank"] == pytest.approx((2.5 + 1 + 10.5) / 3)
    assert r["curve"][0] == pytest.approx(r["hit@1"])
    # a model that scores every candidate equally gets exactly the random expectation (average policy)
    n_c = np.array([4, 1, 20])
    per = query_metrics(np.zeros(3), n_c - 1, np.ones(3, bool), n_c, ks=(1, 5), policy="average")
    assert per["hit@1"].mean() == pytest.approx(r["hit@1"])
    assert per["rr"].mean() == pytest.approx(r["mrr"])
    assert per["rank"].mean() == pytest.approx(r["mean_rank"])


def test_topk_curve_is_monotone_and_matches_query_metrics():
    g = np.array([0, 3, 10, 25, 1])
    t = np.array([0, 1, 0, 2, 4])
    found = np.array([True, True, True, True, False])
    for policy in ("worst", "average"):
        curve = topk_curve(g, t, found, k_max=20, policy=policy)
        assert np.all(np.diff(curve) >= 0)
        per = query_metrics(g, t, found, np.full(5, 30), ks=(1, 5, 20), policy=policy)
        assert curve[0] == pytest.approx(per["hit@1"].mean())
        assert curve[4] == pytest.approx(per["hit@5"].mean())
        assert curve[19] == pytest.approx(per["hit@20"].mean())


def test_rank_candidates_breaks_ties_by_key():
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.9])
    keys = ["D", "B", "A", "E", "C"]
    assert rank_candidates(scores, keys).tolist() == [1, 4, 2, 0, 3]
    assert rank_candidates(scores, keys, top_k=2).tolist() == [1, 4]
    # permuting the inputs permutes nothing in the output order of keys
    perm = np.array([3, 0, 4, 2, 1])
    order = rank_candidates(scores[perm], [keys[i] for i in perm])
    assert [keys[perm[i]] for i in order] == ["B", "C", "A", "D", "E"]
    # NaN scores go last
    assert rank_candidates(np.array([np.nan, 0.2]), ["A", "B"]).tolist() == [1, 0]


def test_margins():
    np.testing.assert_allclose(margins(np.array([0.9, 0.6, 0.5])), [0.3, -0.3, -0.4])
    assert np.isnan(margins(np.array([0.4]))[0])


def test_bootstrap_deterministic_and_sensible():
    rng = np.random.default_rng(0)
    values = (rng.random(500) < 0.3).astype(float)
    a = bootstrap_ci(values, n_boot=500, seed=7)
    b = bootstrap_ci(values, n_boot=500, seed=7)
    c = bootstrap_ci(values, n_boot=500, seed=8)
    assert a == b and a != c
    low, high = a
    assert low < values.mean() < high
    # normal approximation of the standard error of a mean of 500 Bernoulli(0.3)
    se = np.sqrt(values.mean() * (1 - values.mean()) / 500)
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert bootstrap_ci(np.ones(10), n_boot=50) == (1.0, 1.0)
    assert all(np.isnan(bootstrap_ci(np.array([]))))


def test_group_means_order_of_first_appearance():
    means, labels = group_means(np.array([1.0, 0.0, 1.0, 1.0]), ["b", "a", "b", "c"])
    assert labels.tolist() == ["b", "a", "c"]
    np.testing.assert_allclose(means, [1.0, 0.0, 1.0])
