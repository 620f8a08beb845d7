"""The kernel model plus a residual peak-formula transformer (``kernel-formula``): the ridge warm start against a
naive solve, DSOKR starting at (and able to keep) that ridge fit, the frozen kernel part, and the bundle round
trip."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from molpredict.engine.kernel_formula import KernelFormulaEncoder, ridge_path
from molpredict.errors import SpecError
from test_formula_transformer import _labelled, saved_and_loaded

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENCODER = ("kernel-formula:input_kernel=ppk-losses;n_landmarks=12;ridge={ridge};d_model=16;nhead=2;layers=1;"
           "dim_feedforward=32")


def _dsokr(ridge="1e-3", **kw):
    from molpredict.models.dsokr import DSOKR
    params = dict(encoder=ENCODER.format(ridge=ridge), output_sketch="subsample:m=8", epochs=2, batch_size=8,
                  device="cpu", seed=3)
    params.update(kw)
    return DSOKR(**params)


def test_ridge_path_matches_a_naive_solve_for_each_lambda():
    rng = np.random.default_rng(0)
    phi, psi = rng.normal(size=(50, 7)), rng.normal(size=(50, 3))
    got = dict(ridge_path(torch.from_numpy(phi).float(), torch.from_numpy(psi).float(), [1e-3, 0.5], block=16))
    for lam, weight in got.items():
        naive = np.linalg.solve(phi.T @ phi + 50 * lam * np.eye(7), phi.T @ psi)  # (p, r); W is its transpose
        np.testing.assert_allclose(weight.numpy(), naive.T, rtol=1e-4, atol=1e-5)  # float32 inputs
    assert not np.allclose(got[1e-3].numpy(), got[0.5].numpy())


@pytest.mark.parametrize("ridge", ["", "0", "1e-3/-1", "a"])
def test_bad_ridge_values_are_refused(ridge):
    with pytest.raises(SpecError, match="ridge"):
        KernelFormulaEncoder(ridge=ridge)._check()


def test_transformer_settings_are_checked_in_this_encoders_name():
    with pytest.raises(SpecError, match=r"^kernel-formula: d_model \(30\) must be a multiple of nhead \(4\)"):
        KernelFormulaEncoder(d_model=30)._check()
    with pytest.raises(SpecError, match="^kernel-formula: explanations"):
        KernelFormulaEncoder(layers=0)._check()


def test_untrained_network_is_the_ridge_fit_on_the_kernel_features():
    """epochs=0: DSOKR's network is exactly the warm start, W(lam) phi(x) (the transformer's head is zero)."""
    x, y = _labelled(40, 0)
    model = _dsokr(epochs=0).fit(x, y)
    encoder, basis = model.encoder_, model.bases_[0]
    phi = encoder.featurize(x).features.astype(float)
    psi = basis.train_coordinates_[basis.inverse_]
    weight = np.linalg.solve(phi.T @ phi + len(x) * 1e-3 * np.eye(phi.shape[1]), phi.T @ psi)
    np.testing.assert_allclose(model.predict_coordinates(x[:6]), phi[:6] @ weight, rtol=1e-3, atol=1e-4)
    assert model.history_[0]["warm_starts"] == [{"ridge": 1e-3}]


def test_validation_chooses_the_start_and_training_keeps_the_kernel_part_frozen():
    x, y = _labelled(60, 1)
    model = _dsokr(ridge="1e-4/1e-1", epochs=3).fit(x[:40], y[:40], val=(x[40:], y[40:]))
    history = model.history_[0]
    starts = history["warm_starts"]
    assert [s["ridge"] for s in starts] == [1e-4, 1e-1] and all("val" in s for s in starts)
    chosen = max(starts, key=lambda s: s["val"])["ridge"]
    fresh = _dsokr(ridge=str(chosen), epochs=0).fit(x[:40], y[:40])
    # the frozen linear part is the chosen start's, whatever the epochs did to the transformer
    torch.testing.assert_close(model.networks_[0].linear.weight, fresh.networks_[0].linear.weight)
    assert history["best_epoch"] in (-1, 0, 1, 2)
    if history["best_epoch"] == -1:  # nothing ranked better than the start: the transformer is still zero
        assert float(model.networks_[0].transformer.head.weight.abs().max()) == 0.0
    else:
        assert max(history["val"]) > max(s["val"] for s in starts)


def test_unfrozen_kernel_part_moves_in_training():
    x, y = _labelled(40, 2)
    frozen = _dsokr(epochs=0).fit(x, y).networks_[0].linear.weight
    from molpredict.models.dsokr import DSOKR
    moved = DSOKR(encoder=ENCODER.format(ridge="1e-3") + ";freeze_kernel=false", output_sketch="subsample:m=8",
                  epochs=2, batch_size=8, device="cpu", seed=3).fit(x, y).networks_[0].linear.weight
    assert not torch.allclose(frozen, moved)


def test_bundle_round_trip_scores_identically(tmp_path):
    x, y = _labelled(40, 3)
    model = _dsokr().fit(x, y)
    again = saved_and_loaded(model, tmp_path)
    scores = model.score(x[:6], y[:10])
    assert np.abs(scores).max() > 0
    np.testing.assert_array_equal(again.score(x[:6], y[:10]), scores)


@pytest.mark.cuda
def test_cuda_training_reloads_on_cpu():
    from molpredict.models.dsokr import DSOKR
    x, y = _labelled(60, 4)
    model = _dsokr(ridge="1e-4/1e-2", device="cuda").fit(x[:40], y[:40], val=(x[40:], y[40:]))
    arrays, metadata = model.get_state()
    metadata["params"]["device"] = "cpu"
    again = DSOKR.from_state(arrays, metadata)
    np.testing.assert_allclose(again.score(x[:6], y), model.score(x[:6], y), atol=1e-4)
