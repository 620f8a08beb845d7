"""Ranking fine-tune of a linear map into a whitened output basis (issue 19: "tell isomers apart").

A sketched OKR model scores a candidate c for a query x by ``z(x)^T X psi(c)``: ``z`` the whitened input features
(r_x), ``psi`` the whitened output coordinates (r_y), X (r_x x r_y) the ridge solution. The ridge fits the
coordinates of the true structure in least squares, which spends its capacity on every direction of the output
space alike; identification only needs the true structure to score above the others. The fine-tune starts from
the ridge solution and minimises the softmax cross-entropy of each training spectrum's true structure among all
distinct training structures,

    loss_i = -log softmax_u( s * z_i^T X psi_u )[u_i],      s > 0 learnt (log-parametrised),

by Adam on mini-batches. Early stopping on a validation ranking metric, checked a few times per epoch, keeps the
best core seen, the ridge solution included: on validation data the fine-tune never ranks worse than the ridge.

On MassBank val_pos (formula256 sets, the eval part of ``benchmarks/dsokr.py --split val``) this moved the linear
map on the default kernels from hit@1 29.8 / MRR 0.424 to 34.6 / 0.472 in two epochs; adding 32 same-formula
structures from the candidate pool as extra negatives per structure changed nothing (the thin real pool adds few
isomers beyond the 4,669 training structures), so the softmax runs over the training structures only.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from molpredict.lazy import lazy_module

torch = lazy_module("torch")

__all__ = ["finetune_core", "fit_ranking", "ranking_loss"]


def ranking_loss(G: Any, Psi: Any, target: Any, log_scale: Any) -> Any:
    """Mean softmax cross-entropy of the true outputs among all distinct training outputs.

    Parameters
    ----------
    G : Tensor of shape (b, r_y)
        Predicted coordinates of a batch (``Z @ X`` for a linear core, a network's output for DSOKR).
    Psi : Tensor of shape (n_u, r_y)
        Coordinates of the distinct training outputs in the same basis.
    target : Tensor of shape (b,), int64
        Each row's output, a row of ``Psi``.
    log_scale : Tensor, scalar
        log s, the inverse temperature of the softmax.
    """
    return torch.nn.functional.cross_entropy(G @ Psi.T * log_scale.exp(), target)


def finetune_core(Z: Any, target: Any, Psi: Any, X0: Any, evaluate: Callable[[Any], float], *, epochs: int,
                  lr: float, batch_size: int = 256, scale: float = 20.0, checks_per_epoch: int = 3,
                  patience: int = 3, min_gain: float = 0.0, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """Fine-tune the core ``X0`` with :func:`ranking_loss`, keeping the core that ``evaluate`` rates best.

    Parameters
    ----------
    Z : Tensor of shape (n, r_x), float32
        Whitened input features of the training samples (on the device the fine-tune runs on).
    target : Tensor of shape (n,), int64
        Each sample's distinct output.
    Psi : Tensor of shape (n_u, r_y), float32
    X0 : Tensor of shape (r_x, r_y)
        The starting core (the ridge solution).
    evaluate : callable
        ``evaluate(X) -> float``, higher is better (a validation ranking metric); called on ``X0`` first, then
        ``checks_per_epoch`` times per epoch.
    epochs : int
        At most this many passes over the training samples.
    lr : float
        Adam's learning rate.
    batch_size : int
    scale : float
        The softmax's starting inverse temperature s (learnt from there).
    checks_per_epoch : int
    patience : int
        Stop after this many checks without improvement.
    min_gain : float
        Keep a fine-tuned core only if it rates at least this much above ``X0``; otherwise return ``X0`` (a gain
        within the noise of the validation metric is not worth changing the model).
    seed : int
        Seeds the sample order.

    Returns
    -------
    X : Tensor of shape (r_x, r_y), float64
        The best core (``X0`` itself when no check improved on it by ``min_gain``).
    history : dict
        ``{"init": value of X0, "checks": [{"epoch", "step", "loss", "scale", "value"}], "best": index into
        checks of the returned core or None (X0), "best_seen": the best check's index, "epochs_run"}``.
    """
    X = torch.nn.Parameter(X0.to(device=Z.device, dtype=torch.float32).clone())
    best, history = fit_ranking([X], lambda index: Z.index_select(0, index) @ X, Psi, target, int(Z.shape[0]),
                                lambda: float(evaluate(X.detach())), lambda: X.detach().to(torch.float64).clone(),
                                epochs=epochs, lr=lr, batch_size=batch_size, scale=scale,
                                checks_per_epoch=checks_per_epoch, patience=patience, seed=seed)
    history["best_seen"] = history["best"]
    if best is None or history["checks"][history["best"]]["value"] < history["init"] + float(min_gain):
        history["best"] = None
        return X0.detach().to(torch.float64).clone(), history
    return best, history


def fit_ranking(parameters: Sequence[Any], predict: Callable[[Any], Any], Psi: Any, target: Any, n: int,
                evaluate: Callable[[], float], snapshot: Callable[[], Any], *, epochs: int, lr: float,
                batch_size: int = 256, scale: float = 20.0, checks_per_epoch: int = 3, patience: int = 3,
                seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """The Adam loop of the ranking fine-tune, for any differentiable predictor.

    Parameters
    ----------
    parameters : sequence of Tensor
        What Adam moves (a core X; a network's parameters).
    predict : callable
        ``predict(index) -> G`` (b, r_y): the predicted coordinates of the training samples ``index`` (a Tensor of
        positions on ``target``'s device), with gradients.
    Psi, target
        As in :func:`finetune_core`; ``n`` is the number of training samples.
    evaluate : callable
        ``evaluate() -> float`` of the current parameters (higher is better); called first, then
        ``checks_per_epoch`` times per epoch.
    snapshot : callable
        ``snapshot()``: a copy of the current parameters, kept for the best check.

    Returns
    -------
    best : the best check's snapshot, or None when no check beat the start
    history : dict
        ``{"init", "checks": [{"epoch", "step", "loss", "scale", "value"}], "best", "epochs_run"}``.
    """
    device = target.device
    log_scale = torch.nn.Parameter(torch.tensor(float(np.log(scale)), device=device))
    optimizer = torch.optim.Adam(list(parameters) + [log_scale], lr=float(lr))
    best_value = float(evaluate())
    best = None
    history: dict[str, Any] = {"init": best_value, "checks": [], "best": None, "epochs_run": 0}
    steps = max(1, -(-int(n) // int(batch_size)))
    check_at = set(np.unique(np.linspace(0, steps, int(checks_per_epoch) + 1)[1:].round().astype(int)).tolist())
    rng = np.random.default_rng(seed)
    waited = 0
    for epoch in range(int(epochs)):
        order = torch.as_tensor(rng.permutation(int(n)), device=device)
        total, seen = 0.0, 0
        for step in range(1, steps + 1):
            index = order[(step - 1) * int(batch_size): step * int(batch_size)]
            loss = ranking_loss(predict(index), Psi, target.index_select(0, index), log_scale)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(index)
            seen += len(index)
            if step not in check_at:
                continue
            value = float(evaluate())
            history["checks"].append({"epoch": epoch, "step": step, "loss": total / seen,
                                      "scale": float(log_scale.detach().exp()), "value": value})
            if value > best_value:
                best_value, waited, best = value, 0, snapshot()
                history["best"] = len(history["checks"]) - 1
            else:
                waited += 1
                if waited >= int(patience):
                    history["epochs_run"] = epoch + 1
                    return best, history
        history["epochs_run"] = epoch + 1
    return best, history
