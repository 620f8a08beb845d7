"""The learnt ranker of the score fusion against naive per-set references; its choice out of fold by structure."""
from __future__ import annotations

import math

import numpy as np
import pytest

from molpredict.identification.fusion import (LearntRanker, ScoreFusion, fit_fusion_kind, fit_ranker, ranker_features,
                                              softmax_nll)
from molpredict.identification.calibration import grouped_folds as _folds
from molpredict.training.ranking_validation import ValidationTerms, choose_fusion, fit_scoring


def sets(seed=0, n_sets=60, sizes=(3, 40)):
    rng = np.random.default_rng(seed)
    size = rng.integers(sizes[0], sizes[1], size=n_sets)
    offsets = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
    is_true = np.zeros(offsets[-1], dtype=bool)
    for i in range(n_sets):
        is_true[offsets[i] + rng.integers(size[i])] = True
    return rng, offsets, is_true


def naive_features(terms, offsets, names, set_names, center, scale, pairs, context):
    """Per set, per candidate, in plain Python: z-scores (population sd; constant -> 0), products."""
    rows = []
    for i in range(len(offsets) - 1):
        a, b = offsets[i], offsets[i + 1]
        z = {}
        for t in names:
            x = np.asarray(terms[t][a:b], float) if t in terms else np.zeros(b - a)
            sd = x.std()
            z[t] = (x - x.mean()) / sd if sd > 1e-12 * max(1.0, np.abs(x).max()) else np.zeros(b - a)
        setv = {"log_size": math.log(b - a), **{k: float(v[i]) for k, v in (context or {}).items()}}
        for c in range(b - a):
            row = [z[t][c] for t in names]
            for s, m, sc in zip(set_names, center, scale):
                row += [z[t][c] * (setv[s] - m) / sc for t in names]
            if pairs:
                for j, u in enumerate(names):
                    for v in names[j:]:
                        row.append(z[u][c] * z[v][c])
            rows.append(row)
    return np.array(rows)


def test_ranker_features_equal_a_per_set_loop():
    rng, offsets, _ = sets()
    terms = {"spectrum": rng.normal(size=offsets[-1]), "prior": rng.uniform(size=offsets[-1])}
    terms["prior"][offsets[2]:offsets[3]] = 0.7  # a constant term in one set: z = 0
    context = {"formula_known": (np.arange(len(offsets) - 1) % 2).astype(float)}
    args = (("spectrum", "prior", "fragment_model"), ("log_size", "formula_known"), (2.5, 0.5), (0.8, 0.5), True)
    got, labels = ranker_features(terms, offsets, *args, context)
    np.testing.assert_allclose(got, naive_features(terms, offsets, *args, context), atol=1e-12)
    assert labels[:4] == ["spectrum", "prior", "fragment_model", "spectrum*log_size"]
    assert len(labels) == got.shape[1] == 3 + 3 * 2 + 6
    with pytest.raises(ValueError):
        ranker_features(terms, offsets, *args, None)  # formula_known not given


def naive_nll(theta, x, offsets, is_true, l2):
    losses = []
    for i in range(len(offsets) - 1):
        a, b = offsets[i], offsets[i + 1]
        if not is_true[a:b].any():
            continue
        s = x[a:b] @ theta
        p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        losses.append(-math.log(p[is_true[a:b]].sum()))
    return float(np.mean(losses)) + 0.5 * l2 * float(theta @ theta)


def test_softmax_nll_and_gradient_against_naive_and_finite_differences():
    rng, offsets, is_true = sets(1)
    is_true[offsets[5]:offsets[6]] = False  # a set without the truth is left out
    is_true[offsets[7]:offsets[7] + 2] = True  # two copies of the truth: probabilities summed
    x = rng.normal(size=(offsets[-1], 4))
    theta = rng.normal(size=4)
    loss, grad = softmax_nll(theta, x, offsets, is_true, 0.1)
    assert loss == pytest.approx(naive_nll(theta, x, offsets, is_true, 0.1), rel=1e-12)
    eps = 1e-6
    numeric = [(naive_nll(theta + eps * e, x, offsets, is_true, 0.1) - naive_nll(theta - eps * e, x, offsets, is_true,
                                                                                 0.1)) / (2 * eps) for e in np.eye(4)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)


def interacting_data(seed=0, n_sets=300):
    """Sets in which the prior tells the truth in large sets and misleads in small ones (what fixed weights cannot
    express and a ranker with the log-size interaction can)."""
    rng = np.random.default_rng(seed)
    size = np.where(rng.uniform(size=n_sets) < 0.5, 4, 60)
    offsets = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
    n = offsets[-1]
    is_true = np.zeros(n, dtype=bool)
    spectrum, prior = rng.normal(size=n), rng.normal(size=n)
    for i in range(n_sets):
        t = offsets[i] + rng.integers(size[i])
        is_true[t] = True
        spectrum[t] += 1.0
        prior[t] += 1.5 if size[i] > 10 else -1.5
    groups = [f"s{i // 3}" for i in range(n_sets)]  # three queries per structure
    return ValidationTerms(offsets, is_true, {"spectrum": spectrum, "prior": prior}, groups)


def test_fit_ranker_learns_a_set_size_interaction_and_round_trips():
    data = interacting_data()
    ranker = fit_ranker(data.terms, data.offsets, data.is_true)
    assert ranker.set_names == ("log_size",)  # formula_known was not given; log_size varies
    labels = ranker.features(data.terms, data.offsets)[1]
    coef = dict(zip(labels, ranker.coef))
    assert coef["prior*log_size"] > 0.5 and coef["spectrum"] > 0.3
    # scores are the features times the coefficients; JSON round trip through ScoreFusion
    fusion = ScoreFusion(weights={"spectrum": 1.0, "prior": 0.5}, ranker=ranker)
    flat = fusion.combine_flat(data.terms, data.offsets)
    np.testing.assert_allclose(flat, ranker.features(data.terms, data.offsets)[0] @ ranker.coef)
    again = ScoreFusion.from_dict(fusion.to_dict())
    np.testing.assert_array_equal(again.combine_flat(data.terms, data.offsets), flat)
    a, b = data.offsets[3], data.offsets[4]
    np.testing.assert_allclose(again.combine({k: v[a:b] for k, v in data.terms.items()}), flat[a:b], atol=1e-12)
    assert set(again.active()) == {"spectrum", "prior"}
    # a fusion without a ranker (an older bundle) reads as before
    old = ScoreFusion.from_dict({"weights": {"spectrum": 1.0, "prior": 0.5}, "temperature": 2.0})
    assert old.ranker is None and "ranker" not in old.to_dict()
    bad = fusion.to_dict()
    bad["ranker"]["coef"] = bad["ranker"]["coef"][:-1]
    with pytest.raises(ValueError):
        ScoreFusion.from_dict(bad)


def test_folds_keep_each_structure_in_one_fold():
    groups = [f"s{i % 17}" for i in range(200)]
    folds = _folds(groups, 3, seed=0)
    for g in set(groups):
        assert len({int(f) for f, h in zip(folds, groups) if h == g}) == 1
    assert set(folds.tolist()) == {0, 1, 2}


def test_choose_fusion_takes_the_ranker_only_when_it_wins_out_of_fold():
    data = interacting_data()
    kind, report = choose_fusion(data, metric="mrr", seed=0)
    assert kind == "ranker" and report["ranker"]["mrr"] > report["weights"]["mrr"]
    fusion, _, summary = fit_scoring(data, metric="mrr", seed=0)
    assert fusion.ranker is not None and summary["fusion_kind"] == "ranker"
    # no interaction and few queries: the fixed weights are kept unless the ranker beats them out of fold
    rng, offsets, is_true = sets(3, n_sets=40)
    spectrum = rng.normal(size=offsets[-1]) + 1.5 * is_true
    plain = ValidationTerms(offsets, is_true, {"spectrum": spectrum, "prior": rng.normal(size=offsets[-1])},
                            [f"s{i // 2}" for i in range(40)])
    kind, report = choose_fusion(plain, metric="mrr", seed=0)
    better = report["ranker"]["mrr"] > report["weights"]["mrr"] and report["ranker"]["hit@1"] >= report["weights"]["hit@1"]
    assert kind == ("ranker" if better else "weights")
    weights_only = fit_fusion_kind("weights", plain.terms, plain.offsets, plain.is_true)
    assert weights_only.ranker is None
    with pytest.raises(ValueError):
        fit_fusion_kind("forest", plain.terms, plain.offsets, plain.is_true)
    assert isinstance(fit_fusion_kind("ranker", plain.terms, plain.offsets, plain.is_true).ranker, LearntRanker)
