"""``benchmarks/formula_transformer.py``: its ranking metrics (ties against the truth, a set without the truth a
miss) and the per-set standardisation of the added term."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("formula_transformer")


def test_metrics_count_ties_against_the_truth(bench):
    scores = [np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0]), np.array([0.5, 2.0]), np.array([1.0, 2.0])]
    truths = [np.array([True, False, False]), np.array([True, False, False]), np.array([True, False]),
              np.array([False, False])]
    # ranks by hand: 1; 2 (a tie counts against the truth); 2; absent (a miss, reciprocal rank 0)
    out = bench.metrics(scores, truths)
    assert out["hit@1"] == 25.0 and out["hit@5"] == 75.0 and out["n"] == 4
    assert out["mrr"] == pytest.approx((1 + 0.5 + 0.5 + 0) / 4, abs=1e-4)


def test_standardised_scores_have_zero_mean_and_unit_spread_per_set(bench):
    z = bench.standardised([np.array([1.0, 2.0, 3.0]), np.array([10.0, 30.0])])
    np.testing.assert_allclose(z[0], [-1.224745, 0.0, 1.224745], atol=1e-6)
    np.testing.assert_allclose(z[1], [-1.0, 1.0])
