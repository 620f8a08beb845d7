"""okr-robust: square loss = SISOKR's closed form; Huber resists output outliers; optimisers; state round trip."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dsokr_helpers import install_synthetic_registry, synthetic_pairs
from molpredict.errors import SpecError
from molpredict.models.losses import squared_distance
from molpredict.models.robust import RobustOKR, ridge_solution

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def registry():
    return install_synthetic_registry()




def _model(**kw):
    params = dict(input_kernel="test-rbf-in:gamma=0.2", output_kernel="test-rbf:gamma=0.5",
                  input_sketch="subsample:m=60", output_sketch="gaussian:m=40", lam=1e-3, device="cpu", seed=3)
    params.update(kw)
    return RobustOKR(**params)


def _rbf(a, b, gamma):
    a, b = np.stack(a), np.stack(b)
    d = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
    return np.exp(-gamma * np.maximum(d, 0))


def _naive_sisokr_scores(x, y, x_test, candidates, rx, ry, lam):
    """S = K_x(te,tr) R_x^T Omega^T R_y K_y(tr, c), Omega from METHOD.md, dense, with rcond pseudo-inverses."""
    n = len(x)
    kx, ky = _rbf(x, x, 0.2), _rbf(y, y, 0.5)
    kx_tilde, ky_tilde = rx @ kx @ rx.T, ry @ ky @ ry.T
    omega = (np.linalg.pinv(ky_tilde, rcond=1e-10, hermitian=True) @ ry @ ky @ kx @ rx.T
             @ np.linalg.pinv(rx @ kx @ kx @ rx.T + n * lam * kx_tilde, rcond=1e-10, hermitian=True))
    return _rbf(x_test, x, 0.2) @ rx.T @ omega.T @ ry @ _rbf(y, candidates, 0.5)


@pytest.mark.parametrize("init, optimizer", [("closed-form", "lbfgs"), ("zero", "lbfgs")])
def test_square_loss_matches_closed_form_sisokr(registry, init, optimizer):
    x, y = synthetic_pairs(150, 0)
    xt, yt = synthetic_pairs(30, 1)
    model = _model(loss="square", init=init, optimizer=optimizer, max_iter=500, tol=1e-12).fit(x, y)
    rx, ry = model.input_features_.sketch_.matrix(), model.output_basis_.sketch_.matrix()
    expected = _naive_sisokr_scores(x, y, xt, yt, rx, ry, 1e-3)
    tolerance = 1e-8 if init == "closed-form" else 1e-4
    np.testing.assert_allclose(model.score(xt, yt), expected, atol=tolerance * np.abs(expected).max())


def test_square_loss_matches_the_sisokr_model(registry):
    from molpredict.models import okr

    x, y = synthetic_pairs(150, 0)
    xt, yt = synthetic_pairs(30, 1)
    specs = dict(input_kernel="test-rbf-in:gamma=0.2", output_kernel="test-rbf:gamma=0.5",
                 input_sketch="subsample:m=60,seed=5", output_sketch="gaussian:m=40,seed=6", lam=1e-3,
                 device="cpu")
    reference = okr.SISOKR(**specs).fit(x, y)
    ours = RobustOKR(loss="square", **specs).fit(x, y)
    expected = reference.score(xt, yt)
    np.testing.assert_allclose(ours.score(xt, yt), expected, atol=1e-6 * np.abs(expected).max())


def test_adam_approaches_the_square_optimum(registry):
    x, y = synthetic_pairs(150, 0)
    exact = _model(loss="square").fit(x, y)
    adam = _model(loss="square", init="zero", optimizer="adam", lr=0.05, epochs=150, batch_size=50).fit(x, y)
    assert adam.objective(x, y) < 1.05 * exact.objective(x, y)
    assert adam.history_["objective"][-1] < adam.history_["objective"][0]


def _kernel_loss(model, x, y):
    g = torch.as_tensor(model.predict_coordinates(x))
    return float(squared_distance(g, torch.as_tensor(model.output_basis_.coordinates(y)), 1.0).mean())


def test_huber_beats_square_under_output_outliers(registry):
    x, y = synthetic_pairs(300, 0)
    xt, yt = synthetic_pairs(200, 1)
    rng = np.random.default_rng(5)
    corrupted = list(y)
    for i in rng.choice(300, 90, replace=False):  # 30% of the outputs replaced by unrelated structures
        corrupted[i] = np.round(rng.normal(size=3) * 3 + 5, 8)
    common = dict(input_sketch="subsample:m=100", output_sketch="subsample:m=80")
    square = _model(loss="square", **common).fit(x, corrupted)
    huber = _model(loss="huber:delta=0.3", **common).fit(x, corrupted)
    clean_square, clean_huber = _kernel_loss(square, xt, yt), _kernel_loss(huber, xt, yt)
    assert huber.kernel_loss(xt, yt) == pytest.approx(clean_huber)
    assert clean_huber < 0.9 * clean_square
    # the robust fit minimised its own objective below the square solution it started from
    assert huber.history_["objective"][-1] < huber.history_["objective"][0]


def test_ridge_solution_is_the_minimiser():
    rng = np.random.default_rng(0)
    f, p = rng.normal(size=(40, 6)), rng.normal(size=(40, 3))
    v = ridge_solution(f, p, 0.1)
    gradient = f.T @ (f @ v - p) / 40 + 0.1 * v
    np.testing.assert_allclose(gradient, 0, atol=1e-12)


def test_state_round_trip(registry):
    x, y = synthetic_pairs(80, 0)
    model = _model(loss="eps-l1:epsilon=0.05", max_iter=20).fit(x, y)
    again = RobustOKR.from_state(*model.get_state())
    xt, yt = synthetic_pairs(10, 1)
    np.testing.assert_allclose(again.score(xt, yt), model.score(xt, yt), rtol=0, atol=1e-12)
    assert again.coordinates_key() == model.coordinates_key()
    # files written before the Nystrom component: both sides in the SketchedOutputBasis layout, no "whiten"
    arrays, metadata = model.get_state()
    for side in ("input", "output"):
        metadata[side] = {k: v for k, v in metadata[side].items() if k != "whiten"}
    older = RobustOKR.from_state(arrays, metadata)
    np.testing.assert_array_equal(older.score(xt, yt), again.score(xt, yt))


@pytest.mark.parametrize("bad", [dict(optimizer="sgd"), dict(init="random"), dict(lam=0.0), dict(loss="l3")])
def test_bad_parameters(registry, bad):
    x, y = synthetic_pairs(20, 0)
    with pytest.raises(SpecError):
        _model(**bad).fit(x, y)
