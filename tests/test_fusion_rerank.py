"""The second pass of the score fusion (:class:`molpredict.identification.fusion.Rerank`): the first pass's top k of
each set re-ranked by a learnt ranker over its score and the fragmentation terms, checked against naive per-set
references, on planted data, through a bundle round trip and through identification."""
from __future__ import annotations

import math

import numpy as np
import pytest

from molpredict.identification.fusion import (FIRST_PASS, LearntRanker, Rerank, ScoreFusion, fill_missing,
                                              fit_fusion_kind, fit_rerank, ranking_metrics, top_k_flat)


def random_sets(rng, n_sets, low=1, high=12):
    sizes = rng.integers(low, high, size=n_sets)
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def test_top_k_matches_a_per_set_sort_with_ties_broken_by_position():
    rng = np.random.default_rng(0)
    offsets = random_sets(rng, 40)
    scores = rng.integers(0, 4, size=offsets[-1]).astype(float)  # many ties
    for k in (1, 3, 5, 20):
        keep, kept_offsets = top_k_flat(scores, offsets, k)
        expected = []
        for i in range(len(offsets) - 1):
            lo, hi = offsets[i], offsets[i + 1]
            order = sorted(range(lo, hi), key=lambda j: (-scores[j], j))[:k]
            assert list(keep[kept_offsets[i]:kept_offsets[i + 1]]) == order
            expected += order
        assert list(keep) == expected


def test_fill_missing_takes_the_lowest_finite_value_of_the_set():
    values = np.array([2.0, np.nan, 5.0, -np.inf, np.nan, np.nan, 1.0])
    offsets = np.array([0, 4, 6, 7])
    # set 0: lowest finite 2; set 1: nothing finite -> 0; set 2 untouched
    np.testing.assert_array_equal(fill_missing(values, offsets), [2.0, 2.0, 5.0, 2.0, 0.0, 0.0, 1.0])


def _ranker(coef):
    return LearntRanker((FIRST_PASS, "fragments"), (), (), (), False, np.asarray(coef, dtype=float))


def test_apply_reranks_the_top_k_and_keeps_the_rest_below_in_first_pass_order():
    rng = np.random.default_rng(1)
    offsets = random_sets(rng, 30, 1, 15)
    first = rng.normal(size=offsets[-1])
    fragments = rng.normal(size=offsets[-1])
    fragments[rng.random(offsets[-1]) < 0.1] = np.nan  # not computed / not scorable: the set's lowest
    rerank = Rerank(4, _ranker([0.7, 1.9]), spacing=1.3)
    out = rerank.apply_flat(first, {"fragments": fragments}, offsets)
    for i in range(len(offsets) - 1):
        lo, hi = offsets[i], offsets[i + 1]
        order = sorted(range(lo, hi), key=lambda j: (-first[j], j))
        kept, rest = order[:4], order[4:]
        # naive: z-scores within the kept candidates, the missing fragment values filled first
        f = fragments[kept]
        f = np.where(np.isfinite(f), f, np.nanmin(f) if np.isfinite(f).any() else 0.0)

        def z(v):
            sd = v.std()
            return (v - v.mean()) / sd if sd > 1e-12 * max(1.0, np.abs(v).max()) else np.zeros_like(v)

        expected = 0.7 * z(first[kept]) + 1.9 * z(f)
        np.testing.assert_allclose(out[kept], expected, rtol=1e-12, atol=1e-12)
        if rest:
            assert out[rest].max() < out[kept].min()
            # below the kept ones, in first-pass order, with first-pass gaps in units of the spacing
            np.testing.assert_allclose(np.diff(out[rest]), np.diff(first[rest]) / 1.3, rtol=1e-9, atol=1e-12)
    # entries of a second-pass term outside the top k are never read
    changed = fragments.copy()
    keep, _ = top_k_flat(first, offsets, 4)
    outside = np.setdiff1d(np.arange(offsets[-1]), keep)
    changed[outside] = 1e6
    np.testing.assert_array_equal(rerank.apply_flat(first, {"fragments": changed}, offsets), out)


def planted(rng, n_sets=300, size=40, signal=2.0):
    """Sets where the first pass puts the truth in its top 8 at a random place, and a fragment term that picks it
    out (plus noise) — what a second pass should learn to use."""
    offsets = np.arange(0, (n_sets + 1) * size, size)
    first = rng.normal(size=offsets[-1])
    is_true = np.zeros(offsets[-1], dtype=bool)
    fragments = rng.normal(size=offsets[-1])
    for i in range(n_sets):
        lo = offsets[i]
        order = np.argsort(-first[lo:lo + size], kind="stable")
        truth = lo + order[rng.integers(0, 8)]
        is_true[truth] = True
        fragments[truth] += signal
    return offsets, first, is_true, fragments


def test_fit_rerank_learns_a_planted_fragment_signal_and_improves_the_ranking():
    rng = np.random.default_rng(2)
    offsets, first, is_true, fragments = planted(rng)
    rerank = fit_rerank(first, {"fragments": fragments}, offsets, is_true, k=8)
    coef = dict(zip(rerank.ranker.terms, rerank.ranker.coef))
    assert coef["fragments"] > 1.0 and abs(coef[FIRST_PASS]) < coef["fragments"]
    before = ranking_metrics(first, offsets, is_true)
    after = ranking_metrics(rerank.apply_flat(first, {"fragments": fragments}, offsets), offsets, is_true)
    assert after["hit@1"] > before["hit@1"] + 0.3
    # the truth never leaves the top 8 it was in
    assert after["hit@10"] >= before["hit@10"]


def test_fit_fusion_kind_leaves_the_fragment_terms_to_the_second_pass_and_round_trips():
    rng = np.random.default_rng(3)
    offsets, spectrum, is_true, fragments = planted(rng, n_sets=200)
    prior = rng.normal(size=offsets[-1])
    keep, _ = top_k_flat(spectrum, offsets, 16)
    partial = np.full(offsets[-1], np.nan)
    partial[keep] = fragments[keep]  # computed on the top 16 only, as training does
    terms = {"spectrum": spectrum, "prior": prior, "fragments": partial}
    for kind in ("weights", "ranker"):
        fusion = fit_fusion_kind(kind, terms, offsets, is_true, rerank_k=8)
        assert "fragments" not in fusion.weights and fusion.rerank is not None and fusion.rerank.k == 8
        assert fusion.rerank_terms == ("fragments",) and list(fusion.active()) in (["spectrum", "prior"],
                                                                                    ["spectrum"])
        fused = fusion.combine_flat(terms, offsets)
        assert ranking_metrics(fused, offsets, is_true)["mrr"] > fusion.validation["fused_first_pass"]["mrr"]
        again = ScoreFusion.from_dict(fusion.to_dict())
        np.testing.assert_array_equal(again.combine_flat(terms, offsets), fused)
        # without the second pass's terms: the first pass alone
        np.testing.assert_array_equal(again.combine_flat({"spectrum": spectrum, "prior": prior}, offsets),
                                      fusion.first_pass(terms, offsets))
        # one set through combine() equals the flat computation
        lo, hi = offsets[5], offsets[6]
        np.testing.assert_allclose(again.combine({t: v[lo:hi] for t, v in terms.items()}), fused[lo:hi],
                                   rtol=1e-12)
        top = again.rerank_candidates({t: v[lo:hi] for t, v in terms.items()})
        np.testing.assert_array_equal(np.sort(top), np.sort(top_k_flat(fusion.first_pass(terms, offsets)[lo:hi],
                                                                       np.array([0, hi - lo]), 8)[0]))


@pytest.mark.parametrize("bad", [{"k": 0}, {"spacing": -1.0}, {"terms": ["fragments"]}])
def test_a_second_pass_that_cannot_work_is_refused_when_read(bad):
    rerank = Rerank(4, _ranker([1.0, 1.0]), 1.0).to_dict()
    if "terms" in bad:
        rerank["ranker"]["terms"] = bad["terms"]
        rerank["ranker"]["coef"] = [1.0]
    else:
        rerank.update(bad)
    with pytest.raises(ValueError, match="second pass"):
        ScoreFusion.from_dict({"weights": {"spectrum": 1.0}, "temperature": 1.0, "rerank": rerank})


def test_choose_rerank_takes_an_informative_term_and_refuses_noise():
    from molpredict.training.ranking_validation import ValidationTerms, choose_rerank

    rng = np.random.default_rng(4)
    offsets, spectrum, is_true, fragments = planted(rng, n_sets=240)
    groups = [f"S{i // 2}" for i in range(len(offsets) - 1)]  # two queries per structure
    data = ValidationTerms(offsets, is_true, {"spectrum": spectrum, "fragments": fragments}, groups)
    chosen, report = choose_rerank(data, "weights", (4, 16), seed=0)
    assert chosen == (16, ("fragments",))  # the truth sits in the top 8: a top 4 misses half of it
    assert report["k=16"]["mrr"] > report["first_pass"]["mrr"] + 0.1
    assert report["k=16"]["mrr_gain"] > 2 * report["k=16"]["mrr_gain_se"] > 0
    noise = ValidationTerms(offsets, is_true, {"spectrum": spectrum, "fragments": rng.normal(size=offsets[-1])},
                            groups)
    chosen, report = choose_rerank(noise, "weights", (4, 16), seed=0)
    assert chosen is None and report["chosen"] is None
    # two terms, one informative: each alone and both are tried; the noise term alone is not eligible
    both = ValidationTerms(offsets, is_true, {"spectrum": spectrum, "fragments": rng.normal(size=offsets[-1]),
                                              "fragment_model": fragments}, groups)
    chosen, report = choose_rerank(both, "weights", (16,), seed=0)
    assert {"k=16", "k=16 fragments", "k=16 fragment_model"} <= set(report)
    assert chosen is not None and "fragment_model" in chosen[1]
    assert report["k=16 fragments"]["mrr_gain"] <= 2 * report["k=16 fragments"]["mrr_gain_se"]
