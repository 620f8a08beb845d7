"""The Lipschitz losses, their (sub)gradients, the sketched solver against naive exact references, non-crossing,
and the ``lipschitz`` regressor's conformance."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from molpredict.engine.lipschitz import (LossSpec, crossing_gradient, crossing_penalty, crossing_rate,
                                         epsilon_insensitive_gradient, epsilon_insensitive_loss, fit_linear,
                                         huber_gradient, huber_loss, objective, objective_gradient,
                                         pinball_gradient, pinball_loss, ridge_closed_form, square_gradient,
                                         square_loss)
from molpredict.errors import InputError, SpecError
from molpredict.models.lipschitz import SketchedLipschitzRegressor
from molpredict.registry import create
from molpredict.spectra.record import Spectrum
from molpredict.testing import check_regressor



@pytest.fixture(autouse=True)
def _float64_tensors():
    """float64 literals in this module's tests; the process-wide default is restored after each (other modules'
    networks are float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


# ----------------------------------------------------------------------------------------------------------
# losses: hand values and gradients
# ----------------------------------------------------------------------------------------------------------

def test_loss_hand_values():
    r = torch.tensor([2.0, -2.0, 0.0])
    assert torch.allclose(pinball_loss(r, 0.1), torch.tensor([0.2, 1.8, 0.0]))
    assert torch.allclose(pinball_loss(r, 0.9), torch.tensor([1.8, 0.2, 0.0]))
    assert torch.allclose(huber_loss(torch.tensor([3.0, -0.5]), kappa=1.0), torch.tensor([2.5, 0.125]))
    assert torch.allclose(epsilon_insensitive_loss(torch.tensor([0.5, -0.05, -1.0]), 0.1), torch.tensor([0.4, 0.0, 0.9]))
    assert torch.allclose(square_loss(torch.tensor([3.0])), torch.tensor([4.5]))
    # smoothed pinball (s = 1, tau = 0.1): quadratic on [-0.9, 0.1], linear shifted by tau^2 s / 2 beyond
    assert torch.allclose(pinball_loss(torch.tensor([0.05, 2.0, -2.0]), 0.1, smoothing=1.0),
                          torch.tensor([0.00125, 0.2 - 0.005, 1.8 - 0.405]))
    # the crossing penalty: only f_1 > f_2 counts
    assert float(crossing_penalty(torch.tensor([1.0, 0.0, 2.0]))) == 1.0


def test_subgradients_hand_values():
    r = torch.tensor([1.0, -1.0, 0.0])
    assert torch.equal(pinball_gradient(r, 0.25), torch.tensor([0.25, -0.75, -0.25]))
    assert torch.equal(epsilon_insensitive_gradient(torch.tensor([0.5, -0.5, 0.05]), 0.1),
                       torch.tensor([1.0, -1.0, 0.0]))
    assert torch.equal(huber_gradient(torch.tensor([3.0, -0.5, -4.0]), 2.0), torch.tensor([2.0, -0.5, -2.0]))
    assert torch.equal(crossing_gradient(torch.tensor([1.0, 0.0, 2.0])), torch.tensor([1.0, -1.0, 0.0]))


def _autograd(fn, r):
    x = r.clone().requires_grad_(True)
    fn(x).sum().backward()
    return x.grad


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_gradients_match_autograd(smoothing):
    """Away from the kinks (s = 0) and everywhere (s > 0) the analytic gradients are autograd's."""
    rng = np.random.default_rng(0)
    r = torch.tensor(rng.normal(0, 2, 400))
    if smoothing == 0:  # keep away from the kinks at 0 and +-epsilon, +-kappa
        r = r[(r.abs() > 1e-3) & ((r.abs() - 0.2).abs() > 1e-3) & ((r.abs() - 0.7).abs() > 1e-3)]
    tau = 0.3
    cases = [(lambda x: pinball_loss(x, tau, smoothing), pinball_gradient(r, tau, smoothing)),
             (lambda x: epsilon_insensitive_loss(x, 0.2, smoothing), epsilon_insensitive_gradient(r, 0.2, smoothing)),
             (lambda x: huber_loss(x, 0.7), huber_gradient(r, 0.7)),
             (square_loss, square_gradient(r))]
    for fn, grad in cases:
        assert torch.allclose(_autograd(fn, r), grad, atol=1e-12)
    F = torch.tensor(rng.normal(0, 1, (50, 4)))
    assert torch.allclose(_autograd(lambda x: crossing_penalty(x, smoothing), F), crossing_gradient(F, smoothing),
                          atol=1e-12)


def test_smoothed_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    r = torch.tensor(rng.normal(0, 1, 200))
    h = 1e-6
    for fn in (lambda x: pinball_loss(x, 0.8, 0.2), lambda x: epsilon_insensitive_loss(x, 0.1, 0.2)):
        fd = (fn(r + h) - fn(r - h)) / (2 * h)
        grad = _autograd(fn, r)
        assert torch.allclose(fd, grad, atol=1e-5)


def test_subgradient_is_in_the_subdifferential_at_kinks():
    """At r = 0 the pinball subgradient lies in [tau - 1, tau]: both one-sided slopes bracket it."""
    for tau in (0.1, 0.5, 0.9):
        g = float(pinball_gradient(torch.tensor([0.0]), tau))
        left = float(pinball_loss(torch.tensor([0.0]), tau) - pinball_loss(torch.tensor([-1e-3]), tau)) / 1e-3
        right = float(pinball_loss(torch.tensor([1e-3]), tau) - pinball_loss(torch.tensor([0.0]), tau)) / 1e-3
        assert left - 1e-9 <= g <= right + 1e-9


@pytest.mark.parametrize("spec", [LossSpec("pinball", (0.1, 0.5, 0.9), crossing_weight=2.0, smoothing=0.1),
                                  LossSpec("huber", kappa=0.5), LossSpec("epsilon-insensitive", smoothing=0.1),
                                  LossSpec("square")])
def test_objective_gradient_matches_autograd(spec):
    rng = np.random.default_rng(2)
    Z, Y = torch.tensor(rng.normal(size=(30, 5))), torch.tensor(rng.normal(size=(30, 2)))
    Q = spec.n_outputs
    W = torch.tensor(rng.normal(size=(5, 2 * Q))).requires_grad_(True)
    b = torch.tensor(rng.normal(size=2 * Q)).requires_grad_(True)
    objective(Z, Y, W, b, spec, 0.01).backward()
    value, dW, db = objective_gradient(Z, Y, W.detach(), b.detach(), spec, 0.01)
    assert torch.allclose(value, objective(Z, Y, W.detach(), b.detach(), spec, 0.01))
    assert torch.allclose(dW, W.grad, atol=1e-12) and torch.allclose(db, b.grad, atol=1e-12)


def test_bad_loss_specs_are_refused():
    with pytest.raises(ValueError):
        LossSpec("hinge")
    with pytest.raises(ValueError):
        LossSpec("pinball", (0.5, 0.1))
    with pytest.raises(SpecError):
        SketchedLipschitzRegressor(loss="pinball", levels="0.5+1.5").loss_spec()


# ----------------------------------------------------------------------------------------------------------
# the solver against exact references
# ----------------------------------------------------------------------------------------------------------

def _gaussian_gram(X, Xb=None):
    Xb = X if Xb is None else Xb
    d = ((X[:, None, :] - Xb[None, :, :]) ** 2).sum(-1)
    return np.exp(-d / 2.0)


def test_square_loss_on_the_exact_feature_map_is_kernel_ridge_regression():
    """Z = V s^1/2 (Z Z^T = K): L-BFGS on the square loss = the closed form = K (K + n lam I)^-1 Y."""
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(40, 3)), rng.normal(size=(40, 2))
    K = _gaussian_gram(X)
    s, V = np.linalg.eigh(K)
    Z = torch.tensor(V * np.sqrt(np.clip(s, 0, None)))
    lam = 1e-2
    krr = K @ np.linalg.solve(K + 40 * lam * np.eye(40), Y)
    W, b = ridge_closed_form(Z, torch.tensor(Y), lam, fit_intercept=False)
    assert np.allclose((Z @ W).numpy(), krr, atol=1e-8)
    W2, b2, _ = fit_linear(Z, torch.tensor(Y), LossSpec("square"), lam, fit_intercept=False, max_iter=2000,
                           tol=1e-12)
    assert np.allclose((Z @ W2).numpy(), krr, atol=1e-6)
    assert torch.all(b2 == 0)


def _spectra(n, seed=0):
    """Spectra whose precursor m/z and peaks carry two smooth targets (for the regressor tests)."""
    rng = np.random.default_rng(seed)
    out, Y = [], []
    for i in range(n):
        mass = float(rng.uniform(150, 450))
        k = int(rng.integers(3, 9))
        mz = np.sort(rng.uniform(50, mass, k))
        out.append(Spectrum(f"s{i}", mz, rng.uniform(1, 100, k), precursor_mz=mass, ion_mode="positive",
                            mz_precision=1e-4))
        Y.append([mass / 100 + rng.normal(0, 0.1), np.sin(mass / 50) + rng.normal(0, 0.3)])
    return out, np.array(Y)


def test_exact_regressor_equals_naive_kernel_ridge_with_intercept():
    """sketch=None, square loss: predictions = k(x) a + b with a = (H K + n lam I)^-1 H y, b = mean(y - K a)."""
    spectra, Y = _spectra(50)
    kernel = "precursor:width=60"
    model = SketchedLipschitzRegressor(input_kernel=kernel, sketch=None, loss="square", lam=1e-3,
                                       max_iter=3000, device="cpu").fit(spectra, Y)
    k = create("input_kernel", kernel).fit(spectra)
    K = k.gram()
    n = len(spectra)
    H = np.eye(n) - 1.0 / n
    Ys = (Y - Y.mean(0)) / Y.std(0)
    a = np.linalg.solve(H @ K + n * 1e-3 * np.eye(n), H @ Ys)
    b = (Ys - K @ a).mean(0)
    new, _ = _spectra(10, seed=5)
    naive = (k.transform(new) @ a + b) * Y.std(0) + Y.mean(0)
    assert np.allclose(model.predict(new)[:, :, 0], naive, atol=1e-5)


def test_full_subsample_sketch_equals_the_exact_machine():
    """A sub-sampling sketch of all n points spans what the identity does: the same pinball solution."""
    spectra, Y = _spectra(40)
    params = dict(input_kernel="precursor:width=60", loss="pinball", lam=1e-3, smoothing=0.05, max_iter=2000,
                  device="cpu")
    exact = SketchedLipschitzRegressor(sketch=None, **params).fit(spectra, Y)
    full = SketchedLipschitzRegressor(sketch="subsample:m=40", **params).fit(spectra, Y)
    assert np.allclose(exact.predict(spectra), full.predict(spectra), atol=1e-4)


def test_pinball_intercept_is_the_empirical_quantile():
    """With no features (all-zero Z) the pinball solution is the level's empirical quantile per target."""
    rng = np.random.default_rng(4)
    Y = torch.tensor(rng.normal(size=(401, 2)))
    spec = LossSpec("pinball", (0.1, 0.5, 0.9), crossing_weight=0.0, smoothing=1e-4)
    W, b, _ = fit_linear(torch.zeros(401, 3), Y, spec, 1.0, max_iter=500)
    expected = np.quantile(Y.numpy(), [0.1, 0.5, 0.9], axis=0).T.ravel()
    assert np.allclose(b.numpy(), expected, atol=2e-3)


def test_the_crossing_penalty_removes_crossings():
    """Close levels in the interpolation regime cross when fitted independently; the penalty removes it."""
    rng = np.random.default_rng(5)
    Z, Y = torch.tensor(rng.normal(size=(80, 60))), torch.tensor(rng.normal(size=(80, 1)))
    levels = (0.45, 0.5, 0.55)
    free = LossSpec("pinball", levels, crossing_weight=0.0, smoothing=0.01)
    tied = LossSpec("pinball", levels, crossing_weight=5.0, smoothing=0.01)
    Zt = torch.tensor(rng.normal(size=(200, 60)))
    W, b, _ = fit_linear(Z, Y, free, 1e-4, max_iter=2000)
    crossed = crossing_rate((Zt @ W + b).reshape(200, 1, 3))
    W, b, _ = fit_linear(Z, Y, tied, 1e-4, max_iter=2000)
    assert crossed > 0.1
    assert crossing_rate((Z @ W + b).reshape(80, 1, 3)) == 0.0
    assert crossing_rate((Zt @ W + b).reshape(200, 1, 3)) < crossed / 3


@pytest.mark.parametrize("sketch", ["p-sparsified-rademacher:m=15,p=0.05", "p-sparsified-gaussian:m=15,p=0.05",
                                    "accumulation:m=15,M=3", "gaussian:m=15", "subsample:m=15", None])
def test_every_sketch_fits_with_the_decomposition_trick(sketch):
    """Only the columns a sketch touches become landmarks (R = A I[used]); predictions are finite."""
    spectra, Y = _spectra(40)
    model = SketchedLipschitzRegressor(input_kernel="precursor:width=60", sketch=sketch, lam=1e-3, max_iter=50,
                                       device="cpu").fit(spectra, Y)
    assert len(model.features_.landmarks_) == len(model.features_.landmark_index_) <= 40
    if sketch and sketch.startswith("p-sparsified"):
        assert len(model.features_.landmarks_) < 40
    assert np.all(np.isfinite(model.predict(spectra[:5])))


def test_lam_grid_is_chosen_on_validation():
    spectra, Y = _spectra(60)
    val, Yv = _spectra(30, seed=9)
    model = SketchedLipschitzRegressor(input_kernel="precursor:width=60", sketch="subsample:m=20",
                                       lam="1e-1+1e-3", max_iter=100, device="cpu").fit(spectra, Y, val=(val, Yv))
    assert [s["lam"] for s in model.selection_] == [0.1, 0.001]
    assert model.lam_ == min(model.selection_, key=lambda s: s["loss"])["lam"]


def test_regressor_input_errors():
    spectra, Y = _spectra(10)
    with pytest.raises(InputError):
        SketchedLipschitzRegressor(input_kernel="precursor").fit(spectra, Y[:-1])
    with pytest.raises(SpecError):
        SketchedLipschitzRegressor(input_kernel="precursor", loss="hinge").fit(spectra, Y)
    with pytest.raises(SpecError):
        SketchedLipschitzRegressor(input_kernel="precursor", lam="-1").fit(spectra, Y)


@pytest.mark.parametrize("loss", ["pinball", "huber", "epsilon-insensitive", "square"])
def test_lipschitz_regressor_conformance(loss):
    spectra, Y = _spectra(30)
    check_regressor(create("regressor", f"lipschitz:loss={loss},sketch=subsample:m=12,max_iter=40,device=cpu",
                           input_kernel="mkl:kernels=cosine+precursor,weights=0.5+0.5"), spectra, Y)


def test_check_regressor_catches_a_broken_state():
    class Forgetful(SketchedLipschitzRegressor):
        def get_state(self):
            arrays, meta = super().get_state()
            arrays["W"] = arrays["W"] * 0
            return arrays, meta

    spectra, Y = _spectra(20)
    with pytest.raises(AssertionError, match="save -> load"):
        check_regressor(Forgetful(input_kernel="precursor", sketch="subsample:m=10", max_iter=20, device="cpu"),
                        spectra, Y)
