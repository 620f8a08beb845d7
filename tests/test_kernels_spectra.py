"""Spectrum kernels (ppk, ppk-losses, cosine) against naive double-loop references, hand-computed values and the
degenerate / low-resolution cases."""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from molpredict.errors import SpecError
from molpredict.kernels.base import DegenerateObjectWarning
from molpredict.kernels.spectra import (
    DEFAULT_MZ_SIGMA,
    CosineKernel,
    PPKernel,
    PPKLossesKernel,
    PPKPairsKernel,
    binned_differences,
    estimate_mz_precision,
    pair_difference_set,
    peak_set,
    ppk_cross,
)
from molpredict.spectra.record import Spectrum

from conftest import require_shared

#: absolute tolerance against the full double sums: the kernels skip pair terms below exp(-25) ~ 1.4e-11
PRUNE_ATOL = 1e-10


# ---------------------------------------------------------------------------------------------------------
# naive references
# ---------------------------------------------------------------------------------------------------------
def _clean(s: Spectrum) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(s.mz) & np.isfinite(s.intensities) & (s.intensities > 0)
    mz, inten = s.mz[keep], s.intensities[keep]
    return mz, (inten / inten.max() if inten.size else inten)


def naive_ppk_raw(a: Spectrum, b: Spectrum, sigma: float, power: float = 0.5, int_sigma: float | None = None,
                  ppm: float | None = None, losses: bool = False) -> float:
    def peaks(s):
        mz, rel = _clean(s)
        scale = mz
        if losses:
            if s.precursor_mz is None:
                return np.empty(0), np.empty(0), np.empty(0)
            keep = mz <= s.precursor_mz - 0.5
            mz, rel = s.precursor_mz - mz[keep], rel[keep]
            scale = np.full(mz.shape, s.precursor_mz)
        return mz, rel, scale

    ma, ra, sa = peaks(a)
    mb, rb, sb = peaks(b)
    total = 0.0
    for i in range(ma.size):
        for j in range(mb.size):
            w = ra[i] ** power * rb[j] ** power
            d = ma[i] - mb[j]
            if ppm is None:
                g = math.exp(-d * d / (4 * sigma * sigma))
            else:
                si, sj = max(sigma, ppm * 1e-6 * sa[i]), max(sigma, ppm * 1e-6 * sb[j])
                g = math.sqrt(2 * si * sj / (si * si + sj * sj)) * math.exp(-d * d / (2 * (si * si + sj * sj)))
            if int_sigma is not None:
                g *= math.exp(-(ra[i] - rb[j]) ** 2 / (4 * int_sigma * int_sigma))
            total += w * g
    return total


def naive_normalized(raw, objs_a, objs_b):
    out = np.zeros((len(objs_a), len(objs_b)))
    for i, a in enumerate(objs_a):
        for j, b in enumerate(objs_b):
            kaa, kbb = raw(a, a), raw(b, b)
            out[i, j] = 0.0 if kaa <= 0 or kbb <= 0 else raw(a, b) / math.sqrt(kaa * kbb)
    return out


def naive_greedy_cosine(a: Spectrum, b: Spectrum, tol: float, power: float) -> float:
    ma, ra = _clean(a)
    mb, rb = _clean(b)
    wa, wb = ra ** power, rb ** power
    if wa.size == 0 or wb.size == 0:
        return 0.0
    cands = [(-(wa[i] * wb[j]), i, j) for i in range(ma.size) for j in range(mb.size) if abs(ma[i] - mb[j]) <= tol]
    cands.sort()
    used_a, used_b, score = set(), set(), 0.0
    for neg, i, j in cands:
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            score -= neg
    return score / math.sqrt((wa ** 2).sum() * (wb ** 2).sum())


def naive_binned_cosine(a: Spectrum, b: Spectrum, tol: float, power: float) -> float:
    def vec(s):
        mz, rel = _clean(s)
        v: dict[int, float] = {}
        for m, r in zip(mz, rel):
            v[int(math.floor(m / tol))] = v.get(int(math.floor(m / tol)), 0.0) + r ** power
        return v

    va, vb = vec(a), vec(b)
    na = math.sqrt(sum(x * x for x in va.values()))
    nb = math.sqrt(sum(x * x for x in vb.values()))
    if na == 0 or nb == 0:
        return 0.0
    return sum(x * vb.get(k, 0.0) for k, x in va.items()) / (na * nb)


# ---------------------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------------------
def _spectra(seed: int = 0, n: int = 12) -> list[Spectrum]:
    """Random spectra plus perturbed copies (so that peaks really match), a few without precursor."""
    rng = np.random.default_rng(seed)
    base = []
    for i in range(n):
        k = int(rng.integers(1, 10))
        mz = np.sort(rng.uniform(50, 300, k))
        base.append(Spectrum(f"s{i}", mz, rng.uniform(1, 1000, k), precursor_mz=None if i % 4 == 0 else 320.0))
    copies = [Spectrum(s.id + "b", s.mz + rng.normal(0, 0.004, s.n_peaks),
                       s.intensities * rng.uniform(0.3, 3, s.n_peaks), precursor_mz=320.003)
              for s in base]
    return base + copies


HAND = [
    Spectrum("a", [100.0, 150.0], [1.0, 4.0], precursor_mz=200.0),
    Spectrum("b", [100.01, 150.0, 150.004], [2.0, 2.0, 8.0], precursor_mz=200.01),
    Spectrum("c", [99.99], [5.0], precursor_mz=None),
]


# ---------------------------------------------------------------------------------------------------------
# PPK
# ---------------------------------------------------------------------------------------------------------
def test_ppk_hand_computed_single_peaks():
    a = Spectrum("a", [100.0], [7.0])
    b = Spectrum("b", [100.01], [0.5])
    k = PPKernel(mz_sigma=0.005).fit([a])
    # one peak each: the normalised kernel is exp(-d^2 / (4 sigma^2)) = exp(-1) whatever the intensities
    assert k.transform([b])[0, 0] == pytest.approx(math.exp(-1.0), rel=1e-12)
    # with the intensity Gaussian (relative intensities are both 1)
    k = PPKernel(mz_sigma=0.005, int_sigma=0.1).fit([a])
    assert k.transform([b])[0, 0] == pytest.approx(math.exp(-1.0), rel=1e-12)


@pytest.mark.parametrize("params", [
    dict(),
    dict(intensity_power=0.0, int_sigma=0.2),
    dict(intensity_power=1.0, int_sigma=0.05, mz_sigma=0.003),
    dict(mz_sigma=0.001, ppm=20.0),
])
def test_ppk_matches_naive_double_loop(params):
    spectra = _spectra()
    sigma = params.get("mz_sigma", DEFAULT_MZ_SIGMA)
    raw = lambda a, b: naive_ppk_raw(a, b, sigma, params.get("intensity_power", 0.5), params.get("int_sigma"),
                                     params.get("ppm"))
    kernel = PPKernel(**params).fit(spectra[:15])
    want_gram = naive_normalized(raw, spectra[:15], spectra[:15])
    np.testing.assert_allclose(kernel.gram(), want_gram, rtol=1e-10, atol=PRUNE_ATOL)
    want = naive_normalized(raw, spectra[15:], spectra[:15])
    np.testing.assert_allclose(kernel.transform(spectra[15:]), want, rtol=1e-10, atol=PRUNE_ATOL)
    # raw self-similarities too (the base class normalises by them)
    np.testing.assert_allclose(kernel.fit_diag_, [raw(s, s) for s in spectra[:15]], rtol=1e-10)


def test_ppk_hand_spectra_value():
    a, b, _ = HAND
    # relative intensities a: (0.25, 1), b: (0.25, 0.25, 1); weights are their square roots
    g = lambda d: math.exp(-d * d / (4 * 0.005 ** 2))
    wa, wb = np.sqrt([0.25, 1.0]), np.sqrt([0.25, 0.25, 1.0])
    kab = wa[0] * wb[0] * g(0.01) + wa[1] * (wb[1] * g(0.0) + wb[2] * g(0.004))
    kaa = wa[0] ** 2 + wa[1] ** 2 + 2 * wa[0] * wa[1] * g(50.0)
    kbb = (wb ** 2).sum() + 2 * wb[1] * wb[2] * g(0.004)
    k = PPKernel().fit([a, b])
    assert k.gram()[0, 1] == pytest.approx(kab / math.sqrt(kaa * kbb), rel=1e-12)


def test_ppk_truncation_drops_far_pairs():
    a = Spectrum("a", [100.0], [1.0])
    b = Spectrum("b", [100.0 + 3 * 0.005], [1.0])
    assert PPKernel(truncate=10).fit([a]).transform([b])[0, 0] == pytest.approx(math.exp(-9 / 4))
    assert PPKernel(truncate=2).fit([a]).transform([b])[0, 0] == 0.0


def test_ppk_is_invariant_to_intensity_scale_and_peak_order():
    spectra = _spectra(1)
    scaled = [Spectrum(s.id, s.mz[::-1], s.intensities[::-1] * 1e6, precursor_mz=s.precursor_mz) for s in spectra]
    k = PPKernel(int_sigma=0.3).fit(spectra)
    np.testing.assert_allclose(k.transform(scaled), k.gram(), rtol=1e-12, atol=1e-14)


def test_ppk_drops_invalid_peaks():
    clean = Spectrum("c", [100.0, 120.0], [1.0, 2.0])
    dirty = Spectrum("d", [100.0, 110.0, np.nan, 120.0, 130.0], [1.0, 0.0, 5.0, 2.0, -3.0])
    k = PPKernel().fit([clean])
    assert k.transform([dirty])[0, 0] == pytest.approx(1.0, rel=1e-12)


def test_ppk_blocks_match_one_shot(monkeypatch):
    import molpredict.kernels.spectra as mod

    spectra = _spectra(2, 20)
    want = PPKernel().fit(spectra).gram()
    monkeypatch.setattr(mod, "MAX_PAIRS", 7)   # chunks of a single spectrum or a few pairs
    monkeypatch.setattr(mod, "MAX_CELLS", 30)
    got = PPKernel().fit(spectra).gram()
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------------------------------------------------
# degenerate cases
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", [PPKernel(), PPKLossesKernel(), CosineKernel(),
                                    CosineKernel(matching="greedy")], ids=repr)
def test_empty_spectrum(kernel):
    empty = Spectrum("e", [], [], precursor_mz=300.0)
    zero = Spectrum("z", [100.0, 200.0], [0.0, 0.0], precursor_mz=300.0)  # no usable peak either
    spectra = [HAND[0], empty, HAND[1], zero]
    with pytest.warns(DegenerateObjectWarning, match="2 of 4 objects") as record:
        kernel.fit(spectra)
    assert len(record) == 1
    gram = kernel.gram()
    np.testing.assert_array_equal(np.diag(gram), 1.0)
    for i in (1, 3):
        assert np.all(np.delete(gram[i], i) == 0) and np.all(np.delete(gram[:, i], i) == 0)
    np.testing.assert_array_equal(kernel.diagonal(spectra), 1.0)
    with pytest.warns(DegenerateObjectWarning, match="1 of 3 objects") as record:
        out = kernel.transform([empty, HAND[0], HAND[2]])
    assert len(record) == 1
    np.testing.assert_array_equal(out[0], 0.0)
    # the warning comes once per transform, not once per block
    kernel.block_rows = 1
    with pytest.warns(DegenerateObjectWarning, match="2 of 3 objects") as record:
        kernel.transform([empty, zero, HAND[0]])
    assert len(record) == 1


def test_no_warning_without_degenerate_spectra():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = PPKernel().fit(HAND)
        k.transform(HAND)


# ---------------------------------------------------------------------------------------------------------
# low resolution and mz_sigma="auto"
# ---------------------------------------------------------------------------------------------------------
def _low_res_pair():
    # the same two fragments recorded at 0.1 Da precision, rounded to opposite sides
    a = Spectrum("lo1", [91.1, 119.0], [1.0, 0.5], precursor_mz=150.1, mz_precision=0.1)
    b = Spectrum("lo2", [91.0, 119.1], [1.0, 0.5], precursor_mz=150.1, mz_precision=0.1)
    return a, b


def test_low_resolution_peaks_do_not_match_at_default_width():
    a, b = _low_res_pair()
    k = PPKernel().fit([a])
    assert k.transform([b])[0, 0] == 0.0  # 0.1 Da apart = 20 widths: beyond the pruning window


def test_auto_width_follows_reference_precision():
    a, b = _low_res_pair()
    k = PPKernel(mz_sigma="auto").fit([a, b])
    assert k.mz_sigma_ == pytest.approx(0.05)
    # peaks rounded to opposite sides (d = 0.1 = 2 sigma) score exp(-1) each; both peaks of a and b do
    w = np.sqrt([1.0, 0.5])
    g = math.exp(-1.0)
    self_ = (w ** 2).sum()  # peaks 28 Da apart do not interact
    assert k.gram()[0, 1] == pytest.approx((w ** 2 * g).sum() / self_, rel=1e-9)
    # the width is fixed at fit: the same for every later query, so the kernel stays PSD
    q = Spectrum("q", [91.05], [1.0], mz_precision=0.0001)
    assert k.transform([q]).shape == (1, 2)
    assert k.mz_sigma_ == pytest.approx(0.05)


def test_auto_width_median_precision_and_floor():
    hi = [Spectrum(f"h{i}", [100.1234], [1.0], mz_precision=1e-4) for i in range(3)]
    lo = [Spectrum("l", [100.1], [1.0], mz_precision=0.1)]
    assert PPKernel(mz_sigma="auto").fit(hi + lo).mz_sigma_ == DEFAULT_MZ_SIGMA  # median 1e-4: the floor
    assert PPKernel(mz_sigma="auto").fit(hi[:1] + lo * 3).mz_sigma_ == pytest.approx(0.05)


def test_auto_width_infers_precision_from_decimals():
    no_precision = [Spectrum("x", [91.0, 105.0], [1.0, 1.0]), Spectrum("y", [77.0], [1.0])]
    assert PPKernel(mz_sigma="auto").fit(no_precision).mz_sigma_ == pytest.approx(0.5)
    assert estimate_mz_precision(np.array([100.1234, 50.5])) == pytest.approx(1e-4)
    assert estimate_mz_precision(np.array([100.12, 50.5])) == pytest.approx(1e-2)
    assert estimate_mz_precision(np.array([100.0])) == 1.0
    assert math.isnan(estimate_mz_precision(np.array([])))


def test_auto_width_needs_fit():
    with pytest.raises(RuntimeError, match="not fitted"):
        PPKernel(mz_sigma="auto").pairwise(peak_set(HAND), peak_set(HAND))


@pytest.mark.parametrize("bad", [dict(mz_sigma=0), dict(mz_sigma="wide"), dict(int_sigma=-1.0), dict(ppm=0),
                                 dict(truncate=0)])
def test_ppk_rejects_bad_parameters(bad):
    with pytest.raises(SpecError):
        PPKernel(**bad)


# ---------------------------------------------------------------------------------------------------------
# PPK on losses
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_weight", [0.0, 0.3, 1.0])
def test_ppk_losses_matches_naive(loss_weight):
    spectra = _spectra(3)
    peaks = naive_normalized(lambda a, b: naive_ppk_raw(a, b, DEFAULT_MZ_SIGMA), spectra, spectra)
    losses = naive_normalized(lambda a, b: naive_ppk_raw(a, b, DEFAULT_MZ_SIGMA, losses=True), spectra, spectra)
    combo = (1 - loss_weight) * peaks + loss_weight * losses
    # re-normalisation for spectra without losses (no precursor): k(x, x) = (1 - w) + w [has losses]
    has_losses = np.array([naive_ppk_raw(s, s, DEFAULT_MZ_SIGMA, losses=True) > 0 for s in spectra])
    has_peaks = np.diag(peaks) > 0
    d = (1 - loss_weight) * has_peaks + loss_weight * has_losses
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.where(np.outer(d, d) > 0, combo / np.sqrt(np.outer(d, d)), 0.0)
    np.fill_diagonal(want, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)  # loss_weight=1: spectra without precursor
        got = PPKLossesKernel(loss_weight=loss_weight).fit(spectra).gram()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=PRUNE_ATOL)


def test_ppk_losses_hand_values():
    a, b, c = HAND
    # a and b share the loss 50 (200 - 150 and 200.01 - 150.0 / 150.004), their precursors differ by 0.01
    k = PPKLossesKernel(loss_weight=0.5).fit([a, b, c])
    gram = k.gram()
    peaks = PPKernel().fit([a, b, c]).gram()
    # the losses of a and b written as peak spectra (intensities follow their fragments)
    la = Spectrum("la", [200.0 - 150.0, 200.0 - 100.0], [4.0, 1.0])
    lb = Spectrum("lb", [200.01 - 150.004, 200.01 - 150.0, 200.01 - 100.01], [8.0, 2.0, 2.0])
    losses = PPKernel().fit([la]).transform([lb])[0, 0]
    assert gram[0, 1] == pytest.approx(0.5 * peaks[0, 1] + 0.5 * losses, rel=1e-10)
    # c has no precursor: k(a, c) = (0.5 k_peaks) / sqrt(1 * 0.5)
    assert gram[0, 2] == pytest.approx(0.5 * peaks[0, 2] / math.sqrt(0.5), rel=1e-12)


def test_ppk_losses_rejects_bad_weight():
    with pytest.raises(SpecError):
        PPKLossesKernel(loss_weight=1.5)


# ---------------------------------------------------------------------------------------------------------
# PPK on fragment-to-fragment differences
# ---------------------------------------------------------------------------------------------------------
def naive_pairs(s: Spectrum, top: int, lo: float, hi: float) -> list[tuple[float, float]]:
    """(difference, sqrt(I_i I_j)) for every two of the ``top`` most intense peaks, by explicit loops."""
    mz, rel = _clean(s)
    strongest = sorted(range(mz.size), key=lambda i: (-rel[i], i))[:top]
    out = []
    for a, b in itertools.combinations(strongest, 2):
        d = abs(mz[a] - mz[b])
        if lo <= d <= hi:
            out.append((d, math.sqrt(rel[a] * rel[b])))
    return out


def test_pair_differences_of_hand_annotated_peaks():
    # 100 (I 4), 118.0106 (I 1: 100 + H2O), 300 (I 2); relative intensities 1, 0.25, 0.5
    s = Spectrum("hand", [100.0, 118.0106, 300.0], [4.0, 1.0, 2.0], precursor_mz=320.0)
    p = pair_difference_set([s])
    np.testing.assert_allclose(p.mz, [18.0106, 181.9894, 200.0], rtol=0, atol=1e-9)
    np.testing.assert_allclose(p.rel_int, [math.sqrt(0.25), math.sqrt(0.125), math.sqrt(0.5)], rtol=1e-12)
    np.testing.assert_allclose(p.scale, [118.0106, 300.0, 300.0])
    # the two strongest peaks only (100 and 300), and the range's ends are kept
    only = pair_difference_set([s], top=2)
    np.testing.assert_allclose(only.mz, [200.0])
    assert pair_difference_set([s], min_diff=20.0, max_diff=199.0).mz.tolist() == [pytest.approx(181.9894)]
    # one peak, or none: no difference
    assert pair_difference_set([Spectrum("one", [100.0], [1.0])]).offsets.tolist() == [0, 0]


@pytest.mark.parametrize("params", [dict(bin_width=None),
                                    dict(bin_width=None, top=4, min_diff=5.0, max_diff=120.0, intensity_power=0.5)])
def test_ppk_pairs_matches_naive(params):
    spectra = _spectra(5)
    top = params.get("top", 30)
    lo, hi = params.get("min_diff", 12.0), params.get("max_diff", 200.0)
    power, sigma = params.get("intensity_power", 1.0), 0.007
    pairs = {s.id: naive_pairs(s, top, lo, hi) for s in spectra}

    def raw(a, b):
        return sum(wa ** power * wb ** power * math.exp(-(da - db) ** 2 / (4 * sigma * sigma))
                   for da, wa in pairs[a.id] for db, wb in pairs[b.id])

    want = naive_normalized(raw, spectra, spectra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)  # spectra with fewer than two peaks in range
        got = PPKPairsKernel(**params).fit(spectra).gram()
    np.fill_diagonal(want, np.diag(got))  # degenerate objects: the base class's own diagonal convention
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=PRUNE_ATOL)


def test_binned_differences_split_each_weight_between_two_bins():
    s = Spectrum("hand", [100.0, 118.0106, 300.0], [4.0, 1.0, 2.0])
    m = binned_differences(pair_difference_set([s]), 0.01, 12.0, 200.0).toarray()[0]
    assert m.shape == (18802,)
    # 18.0106 Da is (18.0106 - 12) / 0.01 = 601.06 bins up: 94% of its weight 0.5 in bin 601, 6% in bin 602
    assert m[601] == pytest.approx(0.5 * 0.94) and m[602] == pytest.approx(0.5 * 0.06)
    # 200 Da, the range's end, lands on bin 18800 exactly (its right neighbour gets nothing)
    assert m[18800] == pytest.approx(math.sqrt(0.5)) and m[18801] == pytest.approx(0.0, abs=1e-9)
    assert m.sum() == pytest.approx(0.5 + math.sqrt(0.125) + math.sqrt(0.5))


@pytest.mark.parametrize("params", [dict(), dict(top=4, min_diff=5.0, max_diff=120.0, intensity_power=0.5,
                                             bin_width=0.02)])
def test_binned_ppk_pairs_matches_naive(params):
    spectra = _spectra(6)
    top, width = params.get("top", 30), params.get("bin_width", 0.01)
    lo, hi = params.get("min_diff", 12.0), params.get("max_diff", 200.0)
    power = params.get("intensity_power", 1.0)

    def vector(s):
        v = {}
        for d, w in naive_pairs(s, top, lo, hi):
            x = (d - lo) / width
            b = math.floor(x)
            v[b] = v.get(b, 0.0) + w ** power * (1 - (x - b))
            v[b + 1] = v.get(b + 1, 0.0) + w ** power * (x - b)
        return v

    vectors = {s.id: vector(s) for s in spectra}
    want = naive_normalized(lambda a, b: sum(w * vectors[b.id].get(k, 0.0) for k, w in vectors[a.id].items()),
                            spectra, spectra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        got = PPKPairsKernel(**params).fit(spectra).gram()
    np.fill_diagonal(want, np.diag(got))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bin_width", [0.01, None])
def test_ppk_pairs_reads_steps_that_do_not_move_with_the_whole_spectrum(bin_width):
    """A spectrum and its copy shifted by 22 Da (the same fragments as another adduct) share no peak, yet the
    same steps between fragments: ``ppk`` sees nothing in common, ``ppk-pairs`` sees the same spectrum."""
    a = Spectrum("h", [91.054, 119.049, 137.060, 165.055], [3.0, 10.0, 4.0, 6.0], precursor_mz=183.07)
    b = Spectrum("na", a.mz + 21.982, a.intensities, precursor_mz=205.05)
    assert PPKernel().fit([a, b]).gram()[0, 1] < 1e-12
    # (the binned map puts the shifted differences a rounding error apart in the same two bins)
    assert PPKPairsKernel(bin_width=bin_width).fit([a, b]).gram()[0, 1] == pytest.approx(1.0, abs=1e-9)
    # and another set of steps between the same kind of fragments is told apart
    c = Spectrum("other", [91.054, 105.070, 137.060, 151.076], [3.0, 10.0, 4.0, 6.0], precursor_mz=183.07)
    assert PPKPairsKernel(bin_width=bin_width).fit([a, c]).gram()[0, 1] < 0.5


@pytest.mark.parametrize("bad", [dict(top=1), dict(top=2.5), dict(min_diff=0), dict(min_diff=50, max_diff=20),
                                 dict(mz_sigma=-1), dict(bin_width=0), dict(bin_width="wide")])
def test_ppk_pairs_rejects_bad_parameters(bad):
    with pytest.raises(SpecError):
        PPKPairsKernel(**bad)


# ---------------------------------------------------------------------------------------------------------
# cosine
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("power", [0.5, 1.0])
def test_binned_cosine_matches_naive(power):
    spectra = _spectra(4)
    k = CosineKernel(tolerance=0.01, intensity_power=power).fit(spectra[:14])
    want = np.array([[naive_binned_cosine(a, b, 0.01, power) for b in spectra[:14]] for a in spectra])
    got = k.transform(spectra)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert k.psd


@pytest.mark.parametrize("power", [0.5, 1.0, 0.0])
def test_greedy_cosine_matches_sequential_greedy(power):
    spectra = _spectra(5) + [
        # crowded peaks: many candidate pairs per peak, ties (power 0: all products equal)
        Spectrum("x", [100.0, 100.004, 100.008, 100.012], [1.0, 3.0, 2.0, 3.0]),
        Spectrum("y", [100.002, 100.006, 100.010], [3.0, 1.0, 2.0]),
        Spectrum("z", [100.005, 100.0051], [2.0, 2.0]),
    ]
    k = CosineKernel(tolerance=0.01, matching="greedy", intensity_power=power).fit(spectra)
    want = np.array([[naive_greedy_cosine(a, b, 0.01, power) for b in spectra] for a in spectra])
    got = k.transform(spectra)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert not k.psd


def test_greedy_cosine_is_one_to_one():
    # two query peaks both within tolerance of one reference peak: only one may match it
    a = Spectrum("a", [100.0, 100.008], [1.0, 1.0])
    b = Spectrum("b", [100.004], [1.0])
    k = CosineKernel(tolerance=0.01, matching="greedy", intensity_power=1.0).fit([b])
    assert k.transform([a])[0, 0] == pytest.approx(1.0 / math.sqrt(2.0))


def test_cosine_rejects_bad_matching():
    with pytest.raises(SpecError):
        CosineKernel(matching="hungarian")


def test_ppk_cross_with_reversed_roles_is_transpose():
    pa, pb = peak_set(_spectra(6)[:9]), peak_set(_spectra(6)[9:])
    np.testing.assert_allclose(ppk_cross(pa, pb, 0.005), ppk_cross(pb, pa, 0.005).T, rtol=1e-13)


# ---------------------------------------------------------------------------------------------------------
# real data
# ---------------------------------------------------------------------------------------------------------
def test_ppk_on_massbank_matches_naive():
    path = require_shared("massbank", "val_pos.mgf")
    from molpredict.io import read_mgf

    spectra = list(itertools.islice(read_mgf(path), 400))
    pick = [spectra[i] for i in range(0, 400, 25)]  # 16 spectra, several of one compound
    k = PPKernel().fit(spectra)
    got = k.transform(pick)
    cols = [0, 1, 2, 3, 50, 100, 200]
    raw = lambda a, b: naive_ppk_raw(a, b, DEFAULT_MZ_SIGMA)
    want = naive_normalized(raw, pick, [spectra[c] for c in cols])
    np.testing.assert_allclose(got[:, cols], want, rtol=1e-9, atol=1e-12)
    # same-compound spectra (consecutive MassBank accessions) are far more similar than random pairs
    gram = k.gram()
    assert np.median(np.diag(gram, 1)) > 5 * np.median(gram)


@pytest.mark.parametrize("spec", ["ppk:mz_sigma=auto,int_sigma=0.2,intensity_power=0",
                                  "ppk-losses:loss_weight=0.25,ppm=10", "cosine:matching=greedy,tolerance=0.02"])
def test_spec_round_trip(spec):
    from molpredict.registry import get_registry

    registry = get_registry()
    kernel = registry.create("input_kernel", spec)
    again = registry.create("input_kernel", str(kernel.to_spec()))
    assert type(again) is type(kernel) and again.get_params() == kernel.get_params()
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in kernel.get_params().values())
