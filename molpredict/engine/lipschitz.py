"""Kernel machines for Lipschitz losses on a sketched feature map: the losses, their (sub)gradients and the solver.

The seeds' p-sparsified paper (El Ahmad, Brogat-Motte, Laforgue & d'Alché-Buc, "Fast kernel methods for generic
Lipschitz losses via p-sparsified sketches", TMLR 2023) fits

    min_{f in H^d}  (1/n) sum_i  L(y_i, f(x_i))  +  (lam / 2) ||f||^2

with f restricted to the span of the sketched training points, f = sum_j gamma_j (R k(., X))_j. With the whitened
Nystrom feature map z(x) = D^-1/2 U^T R k(x) (R K R^T = U D U^T; :class:`molpredict.engine.nystrom.Nystrom`,
which also does the decomposition trick R = A I[used]) this is exactly the linear problem

    min_{W, b}  (1/n) sum_i  L(y_i, W^T z(x_i) + b)  +  (lam / 2) ||W||_F^2        (b not penalised)

in p <= m dimensions: z(x_i) . z(x_j) = k(x_i, x_j) when R = I_n (the exact solution), the projection of K on
the sketched span otherwise. This module solves that problem for a matrix of targets Y (n, T):

- ``square``: 1/2 r^2, r = y - f (its minimiser has a closed form, :func:`ridge_closed_form`);
- ``huber``: kappa-Huber, r^2 / 2 for |r| <= kappa, kappa (|r| - kappa / 2) beyond (Lipschitz constant kappa);
- ``epsilon-insensitive``: max(|r| - epsilon, 0);
- ``pinball``: joint quantile regression at Q levels tau_1 < ... < tau_Q, sum_q rho_tau_q(y - f_q) with
  rho_tau(r) = max(tau r, (tau - 1) r), plus the non-crossing penalty
  ``crossing_weight * sum_q max(f_q - f_{q+1}, 0)`` (Sangnier, Fercoq & d'Alché-Buc, NeurIPS 2016 use the
  constraint f_q <= f_{q+1} on the training points; the penalty is its exact-penalty form: with a weight above
  the losses' Lipschitz constant, no training point crosses at the optimum).

Non-smooth losses are replaced by their Moreau envelopes with parameter ``smoothing`` (pinball becomes the
"quantile Huber" loss, epsilon-insensitive a Huber beyond epsilon, the crossing hinge a squared hinge just below 0);
``smoothing=0`` gives the losses themselves and a subgradient. The envelope is within ``smoothing / 2`` times the
squared Lipschitz constant of the loss, so the smoothed minimiser is near the exact one, and its gradient is
Lipschitz, which lets L-BFGS (``torch.optim.LBFGS``, strong Wolfe line search) solve the problem on CPU or GPU.

Every function takes and returns torch tensors (any device, float64 advised); the model that uses them is
:class:`molpredict.models.lipschitz.SketchedLipschitzRegressor`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = [
    "LOSSES",
    "pinball_loss", "pinball_gradient",
    "huber_loss", "huber_gradient",
    "epsilon_insensitive_loss", "epsilon_insensitive_gradient",
    "square_loss", "square_gradient",
    "crossing_penalty", "crossing_gradient",
    "LossSpec", "objective", "objective_gradient", "fit_linear", "ridge_start", "ridge_closed_form",
    "crossing_rate",
]

#: the losses :func:`fit_linear` knows
LOSSES = ("pinball", "huber", "epsilon-insensitive", "square")


# ----------------------------------------------------------------------------------------------------------
# scalar losses, elementwise on residuals r = y - f; gradients are d loss / d r
# ----------------------------------------------------------------------------------------------------------

def pinball_loss(residual: torch.Tensor, tau: "float | torch.Tensor", smoothing: float = 0.0) -> torch.Tensor:
    """The pinball (check) loss rho_tau(r) = max(tau r, (tau - 1) r), or its Moreau envelope.

    Parameters
    ----------
    residual : Tensor of any shape
        r = y - f.
    tau : float or Tensor broadcastable to ``residual``
        Quantile level(s) in (0, 1).
    smoothing : float
        Moreau parameter s >= 0. For s > 0: r^2 / (2 s) on [(tau - 1) s, tau s], the linear pieces shifted by
        -tau^2 s / 2 (r > tau s) and -(tau - 1)^2 s / 2 (r < (tau - 1) s) outside.

    Returns
    -------
    Tensor of the shape of ``residual``.
    """
    tau = torch.as_tensor(tau, dtype=residual.dtype, device=residual.device)
    if smoothing <= 0:
        return torch.maximum(tau * residual, (tau - 1.0) * residual)
    s = float(smoothing)
    upper, lower = tau * s, (tau - 1.0) * s
    return torch.where(residual > upper, tau * residual - tau * tau * s / 2.0,
                       torch.where(residual < lower, (tau - 1.0) * residual - (tau - 1.0) ** 2 * s / 2.0,
                                   residual * residual / (2.0 * s)))


def pinball_gradient(residual: torch.Tensor, tau: "float | torch.Tensor", smoothing: float = 0.0) -> torch.Tensor:
    """d pinball / d r: ``clip(r / s, tau - 1, tau)``; for s = 0 the subgradient tau (r > 0), tau - 1 (r < 0),
    and tau - 1/2 at r = 0 (the midpoint of the subdifferential [tau - 1, tau])."""
    tau = torch.as_tensor(tau, dtype=residual.dtype, device=residual.device)
    if smoothing <= 0:
        return torch.where(residual > 0, tau + 0.0 * residual,
                           torch.where(residual < 0, tau - 1.0 + 0.0 * residual, tau - 0.5 + 0.0 * residual))
    return torch.clamp(residual / float(smoothing), min=tau - 1.0 + 0.0 * residual, max=tau + 0.0 * residual)


def huber_loss(residual: torch.Tensor, kappa: float = 1.0) -> torch.Tensor:
    """kappa-Huber: r^2 / 2 for |r| <= kappa, kappa (|r| - kappa / 2) beyond (smooth, kappa-Lipschitz)."""
    a = residual.abs()
    return torch.where(a <= kappa, residual * residual / 2.0, kappa * (a - kappa / 2.0))


def huber_gradient(residual: torch.Tensor, kappa: float = 1.0) -> torch.Tensor:
    """d huber / d r = clip(r, -kappa, kappa)."""
    return torch.clamp(residual, -float(kappa), float(kappa))


def epsilon_insensitive_loss(residual: torch.Tensor, epsilon: float = 0.1, smoothing: float = 0.0) -> torch.Tensor:
    """max(|r| - epsilon, 0), or its Moreau envelope: u^2 / (2 s) for u = |r| - epsilon in [0, s], u - s / 2
    beyond, 0 inside the tube."""
    u = torch.clamp(residual.abs() - float(epsilon), min=0.0)
    if smoothing <= 0:
        return u
    s = float(smoothing)
    return torch.where(u <= s, u * u / (2.0 * s), u - s / 2.0)


def epsilon_insensitive_gradient(residual: torch.Tensor, epsilon: float = 0.1,
                                 smoothing: float = 0.0) -> torch.Tensor:
    """d / d r: sign(r) clip((|r| - epsilon) / s, 0, 1); for s = 0 the subgradient sign(r) outside the tube,
    0 inside (and on its edge)."""
    u = residual.abs() - float(epsilon)
    if smoothing <= 0:
        return torch.sign(residual) * (u > 0).to(residual.dtype)
    return torch.sign(residual) * torch.clamp(u / float(smoothing), 0.0, 1.0)


def square_loss(residual: torch.Tensor) -> torch.Tensor:
    """r^2 / 2."""
    return residual * residual / 2.0


def square_gradient(residual: torch.Tensor) -> torch.Tensor:
    """d / d r = r."""
    return residual.clone()


# ----------------------------------------------------------------------------------------------------------
# the non-crossing penalty on predicted quantiles
# ----------------------------------------------------------------------------------------------------------

def crossing_penalty(F: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """sum_q max(f_q - f_{q+1}, 0) over consecutive levels, per row; for s > 0 a smoothed hinge that is already
    linear (slope 1) at a gap of 0: with g = f_q - f_{q+1}, (g + s)^2 / (2 s) on [-s, 0], g + s / 2 beyond.

    Shifting the quadratic piece to the left of 0 keeps the penalty exact: with a weight above the losses'
    Lipschitz constant no crossing (g > 0) survives at the optimum, where a quadratic piece on [0, s] would let
    gaps up to s / weight through.

    Parameters
    ----------
    F : Tensor of shape (..., Q)
        Predicted quantiles, levels ascending along the last axis.
    smoothing : float

    Returns
    -------
    Tensor of shape F.shape[:-1]
    """
    gap = F[..., :-1] - F[..., 1:]
    if smoothing > 0:
        s = float(smoothing)
        u = torch.clamp(gap + s, min=0.0)
        u = torch.where(u <= s, u * u / (2.0 * s), u - s / 2.0)
    else:
        u = torch.clamp(gap, min=0.0)
    return u.sum(-1)


def crossing_gradient(F: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """d crossing_penalty / d F, shape of F (subgradient 0 at ties for s = 0)."""
    gap = F[..., :-1] - F[..., 1:]
    if smoothing > 0:
        g = torch.clamp((gap + float(smoothing)) / float(smoothing), 0.0, 1.0)
    else:
        g = (gap > 0).to(F.dtype)
    out = torch.zeros_like(F)
    out[..., :-1] += g
    out[..., 1:] -= g
    return out


# ----------------------------------------------------------------------------------------------------------
# the multi-output objective
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LossSpec:
    """A loss and its parameters.

    Attributes
    ----------
    name : {"pinball", "huber", "epsilon-insensitive", "square"}
    levels : tuple of float
        Quantile levels (pinball only), ascending in (0, 1).
    kappa : float
        kappa-Huber threshold.
    epsilon : float
        Half-width of the epsilon-insensitive tube.
    crossing_weight : float
        Weight of the non-crossing penalty (pinball only).
    smoothing : float
        Moreau parameter of the non-smooth pieces (0: exact losses, subgradients).
    """

    name: str = "pinball"
    levels: tuple = (0.1, 0.5, 0.9)
    kappa: float = 1.0
    epsilon: float = 0.1
    crossing_weight: float = 1.0
    smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ValueError(f"unknown loss {self.name!r}; valid: {', '.join(LOSSES)}")
        levels = tuple(float(t) for t in self.levels)
        if self.name == "pinball" and (not levels or any(not 0.0 < t < 1.0 for t in levels)
                                       or any(b <= a for a, b in zip(levels, levels[1:]))):
            raise ValueError(f"pinball levels must be ascending in (0, 1), got {self.levels!r}")
        object.__setattr__(self, "levels", levels)

    @property
    def n_outputs(self) -> int:
        """Q: outputs per target (the number of levels for pinball, else 1)."""
        return len(self.levels) if self.name == "pinball" else 1


def _loss_and_gradient(R: torch.Tensor, F: torch.Tensor, spec: LossSpec, with_value: bool = True
                       ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Sum over entries of the loss at residuals R = Y - F (shape (n, T, Q)) and its gradient w.r.t. F."""
    s = spec.smoothing
    if spec.name == "pinball":
        tau = torch.as_tensor(spec.levels, dtype=R.dtype, device=R.device)
        value = pinball_loss(R, tau, s).sum() if with_value else None
        grad = -pinball_gradient(R, tau, s)
        if spec.crossing_weight > 0 and F.shape[-1] > 1:
            if with_value:
                value = value + spec.crossing_weight * crossing_penalty(F, s).sum()
            grad = grad + spec.crossing_weight * crossing_gradient(F, s)
        return value, grad
    if spec.name == "huber":
        return (huber_loss(R, spec.kappa).sum() if with_value else None), -huber_gradient(R, spec.kappa)
    if spec.name == "epsilon-insensitive":
        return ((epsilon_insensitive_loss(R, spec.epsilon, s).sum() if with_value else None),
                -epsilon_insensitive_gradient(R, spec.epsilon, s))
    return (square_loss(R).sum() if with_value else None), -square_gradient(R)


def _predict(Z: torch.Tensor, W: torch.Tensor, b: torch.Tensor, T: int, Q: int) -> torch.Tensor:
    return (Z @ W + b).reshape(Z.shape[0], T, Q)


def objective(Z: torch.Tensor, Y: torch.Tensor, W: torch.Tensor, b: torch.Tensor, spec: LossSpec,
              lam: float) -> torch.Tensor:
    """(1/n) sum_i [L(y_i, W^T z_i + b) + crossing] + lam / 2 ||W||_F^2.

    Parameters
    ----------
    Z : Tensor of shape (n, p)
        Features.
    Y : Tensor of shape (n, T)
        Targets.
    W : Tensor of shape (p, T * Q)
        Weights, output column t * Q + q for target t at level q.
    b : Tensor of shape (T * Q,)
        Intercepts (not penalised).
    spec : LossSpec
    lam : float

    Returns
    -------
    0-d Tensor
    """
    n, T = Y.shape
    F = _predict(Z, W, b, T, spec.n_outputs)
    value, _ = _loss_and_gradient(Y[:, :, None] - F, F, spec)
    return value / n + lam / 2.0 * (W * W).sum()


def objective_gradient(Z: torch.Tensor, Y: torch.Tensor, W: torch.Tensor, b: torch.Tensor, spec: LossSpec,
                       lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`objective` and its (sub)gradient: ``(value, dW (p, T * Q), db (T * Q,))``."""
    n, T = Y.shape
    F = _predict(Z, W, b, T, spec.n_outputs)
    value, G = _loss_and_gradient(Y[:, :, None] - F, F, spec)
    G = G.reshape(n, -1) / n
    return value / n + lam / 2.0 * (W * W).sum(), Z.T @ G + lam * W, G.sum(0)


def fit_linear(Z: torch.Tensor, Y: torch.Tensor, spec: LossSpec, lam: float, *, fit_intercept: bool = True,
               max_iter: int = 500, tol: float = 1e-9, init: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Minimise :func:`objective` over (W, b) by L-BFGS with a strong Wolfe line search.

    Parameters
    ----------
    Z : Tensor of shape (n, p)
        Features (the sketched feature map of the training inputs), on the device the work runs on.
    Y : Tensor of shape (n, T)
    spec : LossSpec
        Use ``smoothing > 0`` for the non-smooth losses (pinball, epsilon-insensitive): L-BFGS needs a gradient.
    lam : float
        Ridge, > 0.
    fit_intercept : bool
        False: b = 0.
    max_iter : int
        L-BFGS iterations (each one or a few objective evaluations).
    tol : float
        Stop when the gradient's largest entry or the change of the objective falls below it.
    init : (W, b), optional
        Warm start (e.g. the solution at a neighbouring ``lam``); default :func:`ridge_start`.

    Returns
    -------
    W : Tensor of shape (p, T * Q)
    b : Tensor of shape (T * Q,)
    info : dict
        ``objective`` (final value), ``n_evaluations``.
    """
    if lam <= 0:
        raise ValueError(f"lam must be positive, got {lam}")
    n, p = Z.shape
    if init is not None:
        W = init[0].detach().clone().to(Z)
        b = init[1].detach().clone().to(Z)
    else:
        W, b = ridge_start(Z, Y, spec, lam, fit_intercept)
    W.requires_grad_(True)
    b.requires_grad_(True)
    params = [W, b] if fit_intercept else [W]
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=int(max_iter), tolerance_grad=tol,
                                  tolerance_change=tol * 1e-3, history_size=20, line_search_fn="strong_wolfe")
    count = [0]

    def closure() -> torch.Tensor:
        count[0] += 1
        with torch.no_grad():
            value, dW, db = objective_gradient(Z, Y, W, b, spec, lam)
        W.grad = dW
        if fit_intercept:
            b.grad = db
        return value

    optimizer.step(closure)
    with torch.no_grad():
        final = float(objective(Z, Y, W, b, spec, lam))
    return W.detach(), b.detach(), {"objective": final, "n_evaluations": count[0]}


def ridge_start(Z: torch.Tensor, Y: torch.Tensor, spec: LossSpec, lam: float, fit_intercept: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A starting point for :func:`fit_linear`: the ridge solution (:func:`ridge_closed_form`) for every level,
    each pinball level's intercept shifted by that level's empirical quantile of the ridge residuals.

    The problems are convex, so the start changes only how fast L-BFGS gets there; on the ill-conditioned exact
    feature map (eigenvalues down to the cut-off) it saves most of the iterations.

    Returns
    -------
    W : Tensor of shape (p, T * Q)
    b : Tensor of shape (T * Q,)
    """
    Q = spec.n_outputs
    W, b = ridge_closed_form(Z, Y, lam, fit_intercept)
    if spec.name == "pinball" and fit_intercept:
        levels = torch.as_tensor(spec.levels, dtype=Y.dtype, device=Y.device)
        shifts = torch.quantile(Y - Z @ W - b, levels, dim=0).T  # (T, Q)
        b = (b[:, None] + shifts).reshape(-1)
    else:
        b = b.repeat_interleave(Q)
    return W.repeat_interleave(Q, dim=1).contiguous(), b.contiguous()


def ridge_closed_form(Z: torch.Tensor, Y: torch.Tensor, lam: float, fit_intercept: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The minimiser of the square loss objective: W = (Zc^T Zc + n lam I)^-1 Zc^T Yc on centred Z, Y.

    Returns ``(W (p, T), b (T,))``. A reference for tests and a warm start; positive definite for lam > 0.
    """
    n, p = Z.shape
    if fit_intercept:
        z_mean, y_mean = Z.mean(0), Y.mean(0)
        Zc, Yc = Z - z_mean, Y - y_mean
    else:
        Zc, Yc = Z, Y
    A = Zc.T @ Zc
    A.diagonal().add_(n * lam)
    W = torch.linalg.solve(A, Zc.T @ Yc)
    b = (y_mean - z_mean @ W) if fit_intercept else torch.zeros(Y.shape[1], dtype=Z.dtype, device=Z.device)
    return W, b


def crossing_rate(F: "torch.Tensor", atol: float = 1e-9) -> float:
    """The share of consecutive quantile pairs (f_q, f_{q+1}) with f_q > f_{q+1} + atol; F of shape (..., Q)."""
    F = torch.as_tensor(F)
    if F.shape[-1] < 2 or F.numel() == 0:
        return 0.0
    return float((F[..., :-1] > F[..., 1:] + atol).to(torch.float64).mean())


def levels_tuple(levels: Sequence[float]) -> tuple[float, ...]:
    """Levels as a sorted tuple of floats."""
    return tuple(sorted(float(t) for t in levels))
