"""Kernel losses for surrogate regression in a sketched output basis: square, Huber, epsilon-insensitive l1 / l2.

Every loss is a function ``c`` of the squared RKHS distance between the prediction h(x) and the output
embedding psi_y(y). With h(x) = sum_j g_j e_j in the orthonormal sketched basis (e_j) and psi~(y) the
coordinates of the projection of psi_y(y) onto that basis, the kernel-loss expansion reads

    d2 = ||h(x) - psi_y(y)||^2 = ||g||^2 - 2 g^T psi~(y) + k_y(y, y)
       = ||g - psi~(y)||^2 + (k_y(y, y) - ||psi~(y)||^2),

the second line being the same quantity without the cancellation of the first (the bracket is the part of
psi_y(y) outside the basis: constant in g, non-negative, clamped at 0 against rounding). The residual norm is
r = sqrt(d2). The losses, with the 1/2 convention of Laforgue et al. (ICML 2020) so that Huber tends to the
square loss as delta grows:

- ``square``:  c = d2 / 2
- ``huber``:   c = d2 / 2 if r <= delta, else delta (r - delta / 2)
- ``eps-l1``:  c = max(r - epsilon, 0)
- ``eps-l2``:  c = max(r - epsilon, 0)^2 / 2

The square root is taken safely: at r = 0 the gradient of r is set to 0 (a valid subgradient), never NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from molpredict.errors import SpecError
from molpredict.specs import nested_spec, parse_spec

__all__ = [
    "squared_distance",
    "safe_sqrt",
    "square_loss",
    "huber_loss",
    "eps_l1_loss",
    "eps_l2_loss",
    "KernelLoss",
    "make_loss",
    "LOSSES",
]


def squared_distance(g: torch.Tensor, psi: torch.Tensor, kyy: torch.Tensor | float = 1.0) -> torch.Tensor:
    """Squared RKHS distance ||h(x) - psi_y(y)||^2 through the kernel-loss expansion.

    Parameters
    ----------
    g : Tensor of shape (b, p)
        Predicted coordinates in the sketched basis.
    psi : Tensor of shape (b, p)
        Coordinates psi~(y) of the targets.
    kyy : Tensor of shape (b,) or float
        k_y(y, y) of the targets (1 for a normalised kernel).

    Returns
    -------
    Tensor of shape (b,), non-negative.
    """
    kyy = torch.as_tensor(kyy, dtype=g.dtype, device=g.device)
    outside = torch.clamp(kyy - (psi * psi).sum(-1), min=0.0)
    return ((g - psi) ** 2).sum(-1) + outside


def safe_sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrt(max(x, 0)) with gradient 0 (not inf / NaN) where x <= 0.

    The double ``where`` keeps the infinite derivative of sqrt at 0 out of the backward pass: the masked
    branch is evaluated at 1, so 0 * finite = 0 reaches the input.
    """
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, torch.ones_like(x))), torch.zeros_like(x))


def square_loss(d2: torch.Tensor) -> torch.Tensor:
    """c(d2) = d2 / 2, elementwise."""
    return 0.5 * d2


def huber_loss(d2: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """c(d2) = d2 / 2 for r <= delta, delta (r - delta / 2) beyond, with r = sqrt(d2); elementwise."""
    if delta <= 0:
        raise SpecError(f"huber loss: delta must be > 0, got {delta}")
    r = safe_sqrt(d2)
    return torch.where(r <= delta, 0.5 * d2, delta * (r - 0.5 * delta))


def eps_l1_loss(d2: torch.Tensor, epsilon: float = 0.1) -> torch.Tensor:
    """c(d2) = max(r - epsilon, 0), r = sqrt(d2); elementwise."""
    if epsilon < 0:
        raise SpecError(f"eps-l1 loss: epsilon must be >= 0, got {epsilon}")
    return torch.clamp(safe_sqrt(d2) - epsilon, min=0.0)


def eps_l2_loss(d2: torch.Tensor, epsilon: float = 0.1) -> torch.Tensor:
    """c(d2) = max(r - epsilon, 0)^2 / 2, r = sqrt(d2); elementwise."""
    if epsilon < 0:
        raise SpecError(f"eps-l2 loss: epsilon must be >= 0, got {epsilon}")
    return 0.5 * torch.clamp(safe_sqrt(d2) - epsilon, min=0.0) ** 2


#: loss name -> (function of d2, its parameter names with defaults)
LOSSES: dict[str, tuple[Callable[..., torch.Tensor], dict[str, float]]] = {
    "square": (square_loss, {}),
    "huber": (huber_loss, {"delta": 1.0}),
    "eps-l1": (eps_l1_loss, {"epsilon": 0.1}),
    "eps-l2": (eps_l2_loss, {"epsilon": 0.1}),
}


@dataclass(frozen=True)
class KernelLoss:
    """A loss of the squared RKHS distance, with its parameters bound.

    Call it on (g, psi, kyy) for per-sample losses, shape (b,); :meth:`of_distance` applies it to d2 directly.
    """

    name: str
    params: tuple[tuple[str, float], ...] = ()

    def of_distance(self, d2: torch.Tensor) -> torch.Tensor:
        function, _ = LOSSES[self.name]
        return function(d2, **dict(self.params))

    def __call__(self, g: torch.Tensor, psi: torch.Tensor, kyy: torch.Tensor | float = 1.0) -> torch.Tensor:
        return self.of_distance(squared_distance(g, psi, kyy))

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v!r}" for k, v in self.params)


def make_loss(spec: "str | KernelLoss") -> KernelLoss:
    """Build a loss from a spec: ``square``, ``huber:delta=0.5``, ``eps-l1:epsilon=0.2``, ``eps-l2``.

    Raises
    ------
    SpecError
        Unknown loss name or parameter, or a parameter out of range.
    """
    if isinstance(spec, KernelLoss):
        return spec
    parsed = parse_spec(nested_spec(spec))
    if parsed.name not in LOSSES:
        raise SpecError(f"unknown loss {parsed.name!r}; valid: {', '.join(LOSSES)}")
    _, defaults = LOSSES[parsed.name]
    unknown = sorted(set(parsed.params) - set(defaults))
    if unknown:
        raise SpecError(f"loss {parsed.name!r} has no parameter(s) {', '.join(unknown)}; "
                        f"valid: {', '.join(defaults) or '(none)'}")
    params = dict(defaults)
    for key, value in parsed.params.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SpecError(f"loss {parsed.name!r}: parameter {key} must be a number, got {value!r}")
        params[key] = float(value)
    loss = KernelLoss(parsed.name, tuple(sorted(params.items())))
    loss.of_distance(torch.zeros(1, dtype=torch.float64))  # validates the ranges now, not mid-training
    return loss
