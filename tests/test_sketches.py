"""Sketch matrices: each type against its definition, the decomposed form, the conformance suite."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from molpredict.errors import ResourceError, SpecError
from molpredict.registry import create, get_registry
from molpredict.engine.sketches import (AccumulationSketch, AdaptiveSketch, GaussianSketch, IdentitySketch,
                                 PSparsifiedGaussianSketch, PSparsifiedRademacherSketch, Sketch, SubsampleSketch,
                                 bernoulli_positions, group_spread_draw, leverage_scores,
                                 make_sketch)
from molpredict.engine.linalg import truncated_eigh as pinv_factor
from molpredict.testing import check_sketch
from molpredict.testing.sketches import RBFKernel

BUILTIN_SPECS = {
    "subsample": "subsample:m=12",
    "gaussian": "gaussian:m=12",
    "p-sparsified-rademacher": "p-sparsified-rademacher:m=12",
    "p-sparsified-gaussian": "p-sparsified-gaussian:m=12,p=0.1",
    "accumulation": "accumulation:m=12,M=4",
    "adaptive": "adaptive:m=12,q=2",
}


def rbf(n: int, seed: int = 0, gamma: float = 0.3) -> RBFKernel:
    return RBFKernel(gamma=gamma).fit(np.random.default_rng(seed).normal(size=(n, 3)))


# -- conformance ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BUILTIN_SPECS))
def test_check_sketch_on_every_builtin(name):
    assert name in get_registry().names("sketch")
    report = check_sketch(create("sketch", BUILTIN_SPECS[name], seed=0), n=50, n_draws=150)
    assert report["m"] == 12 and report["n"] == 50


def test_every_registered_sketch_is_covered():
    assert set(get_registry().names("sketch")) <= set(BUILTIN_SPECS)


def test_check_sketch_on_identity_and_leverage_subsample():
    check_sketch(IdentitySketch(), n=30, n_draws=5)
    check_sketch(lambda seed: SubsampleSketch(m=10, probs="leverage", seed=seed), n=40, n_draws=150)


class _WrongScaleSketch(PSparsifiedRademacherSketch):
    """The reference code's bug: values scaled sqrt(p / m) instead of 1 / sqrt(m p)."""

    def _draw(self, n, rng, kernel):
        used, A = super()._draw(n, rng, kernel)
        p = self.probability(n)
        return used, A * p  # 1/sqrt(mp) * p = sqrt(p/m)


def test_check_sketch_catches_a_wrong_scaling():
    with pytest.raises(AssertionError, match="E\\[R\\^T R\\]"):
        check_sketch(_WrongScaleSketch(m=10, p=0.2), n=40, n_draws=50)


# -- sub-sampling ---------------------------------------------------------------------------------------------
def test_subsample_uniform_rows_are_scaled_unit_vectors():
    n, m = 100, 15
    sketch = SubsampleSketch(m=m, seed=1).fit(n)
    R = sketch.matrix()
    assert R.shape == (m, n)
    assert np.all((R != 0).sum(1) == 1)  # one entry per row
    assert np.allclose(R[R != 0], math.sqrt(n / m))
    assert len(set(np.flatnonzero(R.any(0)))) == m  # distinct columns (no replacement)
    assert np.array_equal(sketch.used_, np.flatnonzero(R.any(0)))


def test_subsample_with_m_at_least_n_is_the_identity():
    sketch = SubsampleSketch(m=50, seed=0).fit(20)
    assert sketch.m_ == 20
    assert np.array_equal(sketch.matrix(), np.eye(20))


def test_leverage_scores_equal_exact_ridge_leverage_when_the_nystrom_is_exact():
    kernel = rbf(40, gamma=0.5)
    K = kernel.gram()
    lam = 1e-3
    exact = np.diag(K @ np.linalg.inv(K + 40 * lam * np.eye(40)))
    approx = leverage_scores(kernel, lam, n_landmarks=40, rng=np.random.default_rng(0))
    assert np.allclose(approx, exact, atol=1e-8)


def test_leverage_sampling_favours_isolated_points():
    rng = np.random.default_rng(0)
    points = np.vstack([rng.normal(scale=0.01, size=(190, 2)), rng.normal(scale=5.0, size=(10, 2)) + 20.0])
    kernel = RBFKernel(gamma=1.0).fit(points)
    counts = np.zeros(200)
    for seed in range(20):
        sketch = SubsampleSketch(m=20, probs="leverage", leverage_lam=1e-4, seed=seed).fit(200, kernel)
        R = sketch.matrix()
        counts += (R != 0).sum(0)
        rows = R[R.any(1)]
        assert np.all((rows != 0).sum(1) == 1) and np.all(rows >= 0)
    # an isolated point carries far more leverage than one of 190 near-duplicates (uniform rate: 2 per point)
    assert counts[190:].mean() > 3 * counts[:190].mean()


def test_subsample_leverage_needs_the_kernel():
    with pytest.raises(ValueError, match="kernel"):
        SubsampleSketch(m=5, probs="leverage").fit(30)
    with pytest.raises(SpecError):
        SubsampleSketch(m=5, probs="magic").fit(30)


# -- Gaussian ---------------------------------------------------------------------------------------------------
def test_gaussian_entries_have_variance_one_over_m():
    sketch = GaussianSketch(m=200, seed=0).fit(300)
    R = sketch.matrix()
    assert np.array_equal(sketch.used_, np.arange(300))
    assert abs(R.mean()) < 5 / math.sqrt(R.size) / math.sqrt(200)
    assert R.var() * 200 == pytest.approx(1.0, rel=0.03)


def test_gaussian_refuses_past_the_memory_budget():
    with pytest.raises(ResourceError, match="max_memory_gb"):
        GaussianSketch(m=100_000, max_memory_gb=1.0).fit(100_000)


# -- p-sparsified ---------------------------------------------------------------------------------------------
def test_bernoulli_positions_never_materialise_the_mask():
    # a dense mask of 10^12 cells would need a terabyte; the sparse draw takes milliseconds
    positions = bernoulli_positions(10**12, 1e-9, np.random.default_rng(0))
    assert 800 < positions.size < 1200
    assert np.all(np.diff(positions) > 0) and positions[-1] < 10**12


def test_bernoulli_positions_are_bernoulli():
    rng = np.random.default_rng(1)
    hits = np.zeros(50)
    counts = []
    for _ in range(400):
        pos = bernoulli_positions(50, 0.3, rng)
        hits[pos] += 1
        counts.append(pos.size)
    assert np.all(np.abs(hits / 400 - 0.3) < 5 * math.sqrt(0.3 * 0.7 / 400))
    assert np.mean(counts) == pytest.approx(15.0, abs=5 * math.sqrt(50 * 0.21 / 400))
    assert np.array_equal(bernoulli_positions(7, 1.0, rng), np.arange(7))


def test_p_sparsified_on_a_huge_matrix_stays_sparse():
    sketch = PSparsifiedRademacherSketch(m=1000, p=1e-6, seed=0).fit(10**7)  # 10^10 cells
    assert sp.issparse(sketch.A_)
    assert sketch.A_.shape == (1000, sketch.used_.size)
    assert 9_000 < sketch.A_.nnz < 11_000


@pytest.mark.parametrize("cls", [PSparsifiedRademacherSketch, PSparsifiedGaussianSketch])
def test_p_sparsified_definition(cls):
    n, m = 400, 30
    sketch = cls(m=m, seed=2).fit(n)
    p = 20 / n  # the default
    assert sketch.probability(n) == pytest.approx(p)
    R = sketch.matrix()
    nnz = np.count_nonzero(R)
    assert abs(nnz - m * n * p) < 5 * math.sqrt(m * n * p * (1 - p))
    assert np.array_equal(sketch.used_, np.flatnonzero(R.any(0)))  # all-zero columns dropped
    if cls is PSparsifiedRademacherSketch:
        assert np.allclose(np.abs(R[R != 0]), 1 / math.sqrt(m * p))


def test_p_sparsified_products_scale_as_one_over_m_p():
    n, m, p = 120, 40, 0.05
    kernel = rbf(n)
    sketch = PSparsifiedRademacherSketch(m=m, p=p, seed=3).fit(n)
    signs = np.sign(sketch.matrix())  # B * G, unscaled
    K = kernel.gram()
    assert np.allclose(sketch.sketch_gram(kernel), signs @ K @ signs.T / (m * p))
    assert np.allclose(sketch.sketch_rows(kernel), signs @ K / math.sqrt(m * p))
    # and on average the sketched trace is the trace (E[R^T R] = I): p/m would be off by (m p)^2 = 4
    traces = [np.trace(PSparsifiedRademacherSketch(m=m, p=p, seed=s).fit(n).sketch_gram(kernel))
              for s in range(60)]
    assert np.mean(traces) == pytest.approx(np.trace(K), rel=0.1)


# -- accumulation --------------------------------------------------------------------------------------------
def test_accumulation_definition():
    n, m, M = 200, 10, 5
    sketch = AccumulationSketch(m=m, M=M, seed=0).fit(n)
    R = sketch.matrix()
    unit = math.sqrt(n / m) / math.sqrt(M)
    assert np.allclose(np.round(R / unit), R / unit)  # entries are signed sums of the unit
    assert np.all((R != 0).sum(1) <= M)
    assert np.all(np.abs(R).sum(1) <= M * unit + 1e-12)
    assert sketch.used_.size <= m * M
    single = AccumulationSketch(m=m, M=1, seed=0).fit(n).matrix()
    assert np.all((single != 0).sum(1) == 1)
    assert np.allclose(np.abs(single[single != 0]), math.sqrt(n / m))  # M = 1: signed Nystrom


# -- adaptive ---------------------------------------------------------------------------------------------------
def test_adaptive_is_g_k_power_q():
    n, m = 50, 6
    kernel = rbf(n)
    K = kernel.gram()
    G = np.random.default_rng(5).standard_normal((m, n)) / math.sqrt(m)
    raw = AdaptiveSketch(m=m, q=2, orthonormalize=False, seed=5).fit(n, kernel).matrix()
    assert np.allclose(raw, G @ K @ K)
    ortho = AdaptiveSketch(m=m, q=2, seed=5).fit(n, kernel).matrix()
    assert np.allclose(ortho @ ortho.T, np.eye(m))  # orthonormal rows ...
    assert np.allclose(raw @ ortho.T @ ortho, raw)  # ... spanning the same row space


def test_adaptive_needs_the_kernel_and_refuses_past_the_budget():
    with pytest.raises(ValueError, match="kernel"):
        AdaptiveSketch(m=5).fit(30)
    with pytest.raises(ResourceError, match="all of K"):
        AdaptiveSketch(m=5, max_memory_gb=1e-6).fit(30, rbf(30))


# -- identity, helpers -----------------------------------------------------------------------------------------
def test_identity_sketch_does_no_products():
    kernel = rbf(25)
    sketch = make_sketch(None).fit(25)
    assert isinstance(sketch, IdentitySketch) and sketch.is_identity
    assert isinstance(make_sketch("identity"), IdentitySketch) and isinstance(make_sketch("none"), IdentitySketch)
    X = np.arange(50.0).reshape(25, 2)
    assert sketch.apply(X) is not None and np.shares_memory(sketch.apply(X), X)
    assert np.array_equal(sketch.sketch_rows(kernel), kernel.gram())
    assert sp.issparse(sketch.A_) and sketch.A_.nnz == 25


def test_make_sketch_fills_the_seed_unless_the_spec_sets_it():
    assert make_sketch("subsample:m=5", seed=7).seed == 7
    assert make_sketch("subsample:m=5,seed=3", seed=7).seed == 3


def test_sketch_rows_in_blocks(monkeypatch):
    import molpredict.engine.sketches as sketches
    monkeypatch.setattr(sketches, "_BLOCK_BYTES", 8 * 40 * 3)  # 3 kernel rows per block
    kernel = rbf(40)
    for sketch in (PSparsifiedGaussianSketch(m=9, p=0.2, seed=0), GaussianSketch(m=4, seed=0),
                   SubsampleSketch(m=7, seed=0)):
        sketch.fit(40)
        R = sketch.matrix()
        assert np.allclose(sketch.sketch_rows(kernel), R @ kernel.gram())
        assert np.allclose(sketch.sketch_gram(kernel), R @ kernel.gram() @ R.T)


def test_unfitted_and_mismatched_use_is_reported():
    with pytest.raises(RuntimeError, match="not fitted"):
        GaussianSketch(m=3).matrix()
    with pytest.raises(ValueError, match="40 objects"):
        GaussianSketch(m=3).fit(10).sketch_rows(rbf(40))
    with pytest.raises(SpecError):
        GaussianSketch(m=0).fit(10)


def test_pinv_factor_drops_null_directions():
    v = np.array([1.0, 1.0, 0.0]) / math.sqrt(2)
    M = np.outer(v, v) * 4 + np.diag([0, 0, 1.0])  # rank 2
    s, V = pinv_factor(M)
    assert np.allclose(s, [4.0, 1.0])
    assert np.allclose((V / s) @ V.T, np.linalg.pinv(M))


def test_sketches_are_components_with_json_parameters():
    for name, spec in BUILTIN_SPECS.items():
        sketch = create("sketch", spec)
        assert isinstance(sketch, Sketch)
        assert all(v is None or isinstance(v, (bool, int, float, str)) for v in sketch.get_params().values())
        assert str(sketch.to_spec()).startswith(name)


# -- sub-sampling spread over groups --------------------------------------------------------------------------
_GROUPS = np.repeat(np.arange(8), [1, 1, 2, 3, 4, 6, 9, 14])  # n = 40 points in 8 groups of unequal sizes


class _FixedGroupsSketch(SubsampleSketch):
    """``probs=groups`` fitted with :data:`_GROUPS` (check_sketch fits with n and the kernel only)."""

    def fit(self, n, kernel=None, groups=None):
        return super().fit(n, kernel, groups=_GROUPS)


@pytest.mark.parametrize("m", [5, 13])  # fewer draws than groups, and more
def test_check_sketch_on_group_spread_subsample(m):
    check_sketch(lambda seed: _FixedGroupsSketch(m=m, probs="groups", seed=seed), n=40, n_draws=300)


def test_group_spread_covers_every_group_before_any_gets_a_second():
    for seed in range(20):
        used = SubsampleSketch(m=13, probs="groups", seed=seed).fit(40, groups=_GROUPS).used_
        assert len(used) == 13 and len(np.unique(used)) == 13
        assert set(_GROUPS[used]) == set(range(8))  # all 8 groups, then 5 more anywhere
        used = SubsampleSketch(m=5, probs="groups", seed=seed).fit(40, groups=_GROUPS).used_
        assert len(np.unique(_GROUPS[used])) == 5  # 5 distinct groups


def _hand_inclusion(m: int) -> np.ndarray:
    """P(point i drawn) by hand for _GROUPS (8 groups, n = 40): (m / 8) / s_i under 8 draws, else one per group
    plus (m - 8) uniform draws among the 32 points left."""
    sizes = np.bincount(_GROUPS)[_GROUPS].astype(float)
    return (m / 8) / sizes if m < 8 else 1 / sizes + (1 - 1 / sizes) * (m - 8) / (40 - 8)


@pytest.mark.parametrize("m", [5, 13])
def test_group_spread_inclusion_probabilities_match_their_frequencies(m):
    p = _hand_inclusion(m)
    assert np.isclose(p.sum(), m)
    n_draws = 4000
    counts = np.zeros(40)
    for seed in range(n_draws):
        used, inclusion = group_spread_draw(_GROUPS, m, np.random.default_rng(seed))
        np.testing.assert_allclose(inclusion, p[used], rtol=1e-12)
        counts[used] += 1
    se = np.sqrt(p * (1 - p) / n_draws)  # binomial standard error of each point's frequency
    assert np.all(np.abs(counts / n_draws - p) <= 5 * se)


def test_group_spread_without_groups_is_a_uniform_draw():
    sketch = SubsampleSketch(m=15, probs="groups", seed=3).fit(100)
    assert len(sketch.used_) == 15
    np.testing.assert_allclose(sketch.A_.diagonal(), math.sqrt(100 / 15))


def test_groups_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="groups must have shape"):
        SubsampleSketch(m=5, probs="groups", seed=0).fit(40, groups=_GROUPS[:30])
    with pytest.raises(SpecError, match="probs must be"):
        SubsampleSketch(m=5, probs="strata", seed=0).fit(40)
