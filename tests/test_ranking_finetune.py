"""The ranking fine-tune of a whitened core (molpredict.models.ranking_finetune)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from molpredict.models.ranking_finetune import finetune_core, ranking_loss


def _naive_loss(Z, X, Psi, target, scale):
    """Mean -log softmax of the true output's score, written out by hand."""
    total = 0.0
    for z, t in zip(Z, target):
        scores = scale * np.array([z @ X @ psi for psi in Psi])
        top = scores.max()
        total += -(scores[t] - top - np.log(np.exp(scores - top).sum()))
    return total / len(Z)


def test_ranking_loss_equals_the_softmax_cross_entropy_written_out():
    rng = np.random.default_rng(0)
    Z, X, Psi = rng.normal(size=(7, 5)), rng.normal(size=(5, 4)), rng.normal(size=(6, 4))
    target = rng.integers(0, 6, size=7)
    got = ranking_loss(torch.tensor(Z) @ torch.tensor(X), torch.tensor(Psi), torch.tensor(target),
                       torch.tensor(np.log(3.0), dtype=torch.float64))
    assert float(got) == pytest.approx(_naive_loss(Z, X, Psi, target, 3.0), rel=1e-10)


def _ranking_problem(seed: int = 0):
    """Outputs in pairs of near-twins (isomers): the ridge core fits their mean direction, the ranking fine-tune
    learns the small direction that tells each pair apart."""
    rng = np.random.default_rng(seed)
    n_u, r_x, r_y = 40, 12, 8
    base = rng.normal(size=(n_u // 2, r_y))
    twist = rng.normal(size=(1, r_y)) * 0.15
    Psi = np.vstack([base + twist, base - twist])  # twins j and j + n_u / 2
    A = rng.normal(size=(r_y, r_x))
    target = rng.integers(0, n_u, size=600)
    Z = Psi[target] @ A + 0.8 * rng.normal(size=(600, r_x))
    lam = 5.0
    X0 = np.linalg.solve(Z.T @ Z + lam * np.eye(r_x), Z.T @ Psi[target])
    return (torch.tensor(Z, dtype=torch.float32), torch.tensor(target), torch.tensor(Psi, dtype=torch.float32),
            torch.tensor(X0))


def _mrr(Z, X, Psi, target):
    scores = Z @ X @ Psi.T
    true = scores[np.arange(len(target)), target][:, None]
    return float(np.mean(1.0 / (1.0 + (scores > true).sum(1))))


def test_the_fine_tune_ranks_held_out_queries_better_than_the_ridge_and_keeps_its_best_check():
    Z, target, Psi, X0 = _ranking_problem()
    rng = np.random.default_rng(1)
    tv = rng.integers(0, Psi.shape[0], size=300)
    A = np.linalg.lstsq(Psi.numpy()[target.numpy()], Z.numpy(), rcond=None)[0]  # the generator's map, recovered
    Zv = Psi.numpy()[tv] @ A + 0.8 * rng.normal(size=(300, Z.shape[1]))
    values = []

    def evaluate(X):
        values.append(_mrr(Zv, X.double().numpy(), Psi.double().numpy(), tv))
        return values[-1]

    X, history = finetune_core(Z, target, Psi, X0, evaluate, epochs=8, lr=1e-2, batch_size=64, scale=5.0,
                               checks_per_epoch=2, patience=100, seed=0)
    assert history["init"] == pytest.approx(_mrr(Zv, X0.numpy(), Psi.double().numpy(), tv))
    assert [c["value"] for c in history["checks"]] == values[1:]
    best = max(values)
    assert best > history["init"] + 0.02  # the ranking loss helps where the ridge cannot tell twins apart
    assert evaluate(X) == pytest.approx(best)  # the returned core is the best check's
    assert X.dtype == torch.float64 and history["epochs_run"] == 8


def test_the_ridge_core_is_kept_when_no_check_improves_and_patience_stops_the_run():
    Z, target, Psi, X0 = _ranking_problem()
    calls = []

    def evaluate(X):
        calls.append(X.clone())
        return 1.0 if len(calls) == 1 else 0.5  # every fine-tuned core rates worse than the start

    X, history = finetune_core(Z, target, Psi, X0, evaluate, epochs=50, lr=1e-2, batch_size=64,
                               checks_per_epoch=2, patience=3)
    assert torch.equal(X, X0.double()) and history["best"] is None
    assert len(history["checks"]) == 3 and history["epochs_run"] == 2  # stopped after 3 checks, in epoch 2
    assert not torch.equal(calls[-1].double(), X0.double())  # the core did move: only the choice kept X0


def test_a_gain_below_min_gain_keeps_the_ridge_core():
    """The best check is reported (``best_seen``) but the ridge core is returned when it gains less than
    ``min_gain``; with a smaller ``min_gain`` the same run returns the tuned core."""
    Z, target, Psi, X0 = _ranking_problem()
    values = iter([0.5, 0.504, 0.503, 0.502, 0.501])

    def evaluate(X):
        return next(values)

    kwargs = dict(epochs=2, lr=1e-2, batch_size=64, checks_per_epoch=2, patience=100)
    X, history = finetune_core(Z, target, Psi, X0, evaluate, min_gain=0.005, **kwargs)
    assert history["best"] is None and history["best_seen"] == 0 and torch.equal(X, X0.double())
    values = iter([0.5, 0.504, 0.503, 0.502, 0.501])
    X, history = finetune_core(Z, target, Psi, X0, evaluate, min_gain=0.003, **kwargs)
    assert history["best"] == history["best_seen"] == 0 and not torch.equal(X, X0.double())
