"""Robust sketched OKR (``okr-robust``): a kernel model trained by gradient descent with a robust kernel loss.

Both sides are sketched as in SISOKR. The input side gives the orthonormal (Nystrom) feature map
f(x) = D_x^-1/2 U_x^T R_x k_x^x in R^{r_x} (the input counterpart of DSOKR's output basis), the output side the
basis (e_j) and coordinates psi~(y) in R^{p_y}. The model is linear in f:

    h(x) = sum_j g_j(x) e_j,   g(x) = V^T f(x),   V in R^{r_x x p_y},

i.e. g(x) = W^T k_x(x, landmarks) with W = A_x^T U_x D_x^-1/2 V, and the Hilbert-Schmidt (trace) norm of the
operator is ||V||_F^2 = tr(W^T K~_x W) (thesis eq. 5.16). It minimises

    (1/n) sum_i c(||h(x_i) - psi_y(y_i)||^2) + (lam / 2) ||V||_F^2

with c a loss of :mod:`molpredict.models.losses` (square, Huber, epsilon-insensitive), by L-BFGS (full batch,
float64, strong-Wolfe line search; the default) or Adam (mini-batches). With the square loss (c = d2 / 2) the
minimiser is the ridge solution V = (F^T F + n lam I)^-1 F^T Psi, which equals SISOKR's estimator for the same
sketches and lam; ``init="closed-form"`` starts every loss there (the robust losses are convex in V, so this only
speeds things up).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from molpredict.errors import ModelFileError, SpecError
from molpredict.specs import nested_spec, parse_spec
from molpredict.models.base import Model, check_pairs
from molpredict.engine.nystrom import Nystrom
from molpredict.models.basis import SketchedOutputBasis
from molpredict.models.losses import make_loss

__all__ = ["RobustOKR", "ridge_solution"]


def ridge_solution(features: np.ndarray, targets: np.ndarray, lam: float) -> np.ndarray:
    """argmin_V (1/(2n)) ||F V - Psi||_F^2 + (lam/2) ||V||_F^2 = (F^T F + n lam I)^-1 F^T Psi.

    Parameters
    ----------
    features : ndarray of shape (n, r)
    targets : ndarray of shape (n, p)
    lam : float

    Returns
    -------
    ndarray of shape (r, p)
    """
    n, r = features.shape
    gram = features.T @ features
    gram[np.diag_indices(r)] += n * lam
    return np.linalg.solve(gram, features.T @ targets)


class RobustOKR(Model):
    """Sketched kernel regression into DSOKR's output basis, with a robust loss and gradient-based training.

    Parameters
    ----------
    input_kernel, output_kernel : str
        Kernel specs.
    input_sketch, output_sketch : str
        Sketch specs (m_x, m_y). A spec without a seed gets ``seed`` (input) or ``seed + 1`` (output), as SISOKR.
    loss : str
        ``square``, ``huber:delta=...`` (default ``huber:delta=0.5``), ``eps-l1:epsilon=...``, ``eps-l2:...``.
    lam : float
        Regularisation (the objective uses lam / 2 with a mean loss: the same scale as SISOKR's n * lam).
    optimizer : {"lbfgs", "adam"}
    max_iter : int
        L-BFGS iterations.
    lr, epochs, batch_size
        Adam settings (``lr`` is also L-BFGS's step scale, 1 recommended there).
    init : {"closed-form", "zero"}
        Starting point: the square-loss ridge solution, or V = 0.
    tol : float
        L-BFGS tolerance on the gradient and on changes.
    rel_cutoff : float
        Relative eigenvalue cut-off of both sketched Gram matrices.
    device : {"auto", "cpu", "cuda"}
    seed : int

    Fitted attributes
    -----------------
    input_features_ : Nystrom, the input feature map f
    output_basis_ : SketchedOutputBasis
    V_ : ndarray of shape (r_x, p_y)
    history_ : dict (objective values)
    """

    def __init__(self, input_kernel: str = "ppk", output_kernel: str = "gaussian-tanimoto:gamma=auto",
                 input_sketch: str = "subsample:m=2000", output_sketch: str = "subsample:m=1000",
                 loss: str = "huber:delta=0.5", lam: float = 1e-4, optimizer: str = "lbfgs", max_iter: int = 200,
                 lr: float = 1.0, epochs: int = 50, batch_size: int = 1024, init: str = "closed-form",
                 tol: float = 1e-9, rel_cutoff: float = 1e-10, device: str = "auto", seed: int = 0) -> None:
        self.input_kernel = input_kernel
        self.output_kernel = output_kernel
        self.input_sketch = input_sketch
        self.output_sketch = output_sketch
        self.loss = loss
        self.lam = lam
        self.optimizer = optimizer
        self.max_iter = max_iter
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.init = init
        self.tol = tol
        self.rel_cutoff = rel_cutoff
        self.device = device
        self.seed = seed

    def _sketch_spec(self, spec: str, seed: int) -> str:
        parsed = parse_spec(nested_spec(spec))
        params = dict(parsed.params)
        params.setdefault("seed", seed)
        return str(type(parsed)(parsed.name, params))

    # -- training ----------------------------------------------------------------------------------------
    def fit(self, inputs: Sequence[Any], molecules: Sequence[Any], val: tuple | None = None) -> "RobustOKR":
        """Fit on (input, molecule) pairs; ``val`` is accepted for API compatibility and not used."""
        if self.optimizer not in ("lbfgs", "adam"):
            raise SpecError(f"okr-robust: optimizer must be lbfgs or adam, got {self.optimizer!r}")
        if self.init not in ("closed-form", "zero"):
            raise SpecError(f"okr-robust: init must be closed-form or zero, got {self.init!r}")
        if float(self.lam) <= 0:
            raise SpecError(f"okr-robust: lam must be > 0, got {self.lam}")
        loss_fn = make_loss(nested_spec(self.loss))
        inputs, molecules = list(inputs), list(molecules)
        check_pairs(inputs, molecules)
        from molpredict.engine.device import resolve_device
        device = resolve_device(self.device)

        self.input_features_ = Nystrom(nested_spec(self.input_kernel),
                                       self._sketch_spec(self.input_sketch, int(self.seed)),
                                       float(self.rel_cutoff), kernel_kind="input_kernel").fit(inputs)
        self.output_basis_ = SketchedOutputBasis(nested_spec(self.output_kernel),
                                                 self._sketch_spec(self.output_sketch, int(self.seed) + 1),
                                                 float(self.rel_cutoff)).fit(molecules)
        features = self.input_features_.train_features_.T.cpu().numpy()      # (n, r_x)
        self.input_features_.train_features_ = None
        targets = self.output_basis_.sample_coordinates()                      # (n, p_y)
        kyy = self.output_basis_.diagonal(self.output_basis_.distinct_)[self.output_basis_.inverse_]
        lam = float(self.lam)
        if self.init == "closed-form":
            v0 = ridge_solution(features, targets, lam)
        else:
            v0 = np.zeros((features.shape[1], targets.shape[1]))
        if loss_fn.name == "square" and self.init == "closed-form":
            self.V_, self.history_ = v0, {"objective": [], "iterations": 0, "closed_form": True}
            return self
        F = torch.as_tensor(features, dtype=torch.float64, device=device)
        P = torch.as_tensor(targets, dtype=torch.float64, device=device)
        K = torch.as_tensor(kyy, dtype=torch.float64, device=device)
        V = torch.tensor(v0, dtype=torch.float64, device=device, requires_grad=True)

        def objective(index: torch.Tensor | None = None) -> torch.Tensor:
            if index is None:
                f, p, k = F, P, K
            else:
                f, p, k = F[index], P[index], K[index]
            return loss_fn(f @ V, p, k).mean() + 0.5 * lam * (V * V).sum()

        def current() -> float:
            with torch.no_grad():
                return float(objective())

        history: dict[str, Any] = {"objective": [current()], "closed_form": False}
        if self.optimizer == "lbfgs":
            opt = torch.optim.LBFGS([V], lr=float(self.lr), max_iter=int(self.max_iter),
                                    tolerance_grad=float(self.tol), tolerance_change=float(self.tol) * 1e-3,
                                    history_size=20, line_search_fn="strong_wolfe")

            def closure() -> torch.Tensor:
                opt.zero_grad()
                value = objective()
                value.backward()
                return value

            opt.step(closure)
            history["iterations"] = int(opt.state[V].get("n_iter", 0))
        else:
            opt = torch.optim.Adam([V], lr=float(self.lr))
            gen = torch.Generator().manual_seed(int(self.seed))
            n = F.shape[0]
            for _ in range(int(self.epochs)):
                order = torch.randperm(n, generator=gen).to(device)
                for start in range(0, n, int(self.batch_size)):
                    opt.zero_grad()
                    value = objective(order[start:start + int(self.batch_size)])
                    value.backward()
                    opt.step()
                history["objective"].append(current())
            history["iterations"] = int(self.epochs)
        history["objective"].append(current())
        self.V_ = V.detach().cpu().numpy()
        self.history_ = history
        return self

    def objective(self, inputs: Sequence[Any], molecules: Sequence[Any]) -> float:
        """The training objective (mean loss + (lam/2) ||V||_F^2) on any labelled pairs."""
        self._check_fitted()
        g = torch.as_tensor(self.predict_coordinates(inputs))
        psi = torch.as_tensor(self.output_basis_.coordinates(molecules))
        kyy = torch.as_tensor(self.output_basis_.diagonal(molecules))
        loss = make_loss(nested_spec(self.loss))(g, psi, kyy).mean()
        return float(loss) + 0.5 * float(self.lam) * float((self.V_ ** 2).sum())

    def kernel_loss(self, inputs: Sequence[Any], molecules: Sequence[Any]) -> float:
        """Mean ||h(x) - psi_y(y)||^2 on labelled pairs."""
        from molpredict.models.losses import squared_distance
        self._check_fitted()
        molecules = list(molecules)
        g = torch.as_tensor(self.predict_coordinates(inputs))
        psi = torch.as_tensor(self.output_basis_.coordinates(molecules))
        return float(squared_distance(g, psi, torch.as_tensor(self.output_basis_.diagonal(molecules))).mean())

    def _check_fitted(self) -> None:
        if not hasattr(self, "V_"):
            raise RuntimeError("RobustOKR is not fitted: call fit(inputs, molecules) first")

    # -- prediction --------------------------------------------------------------------------------------
    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """g(x) = V^T f(x), shape (n_inputs, p_y)."""
        self._check_fitted()
        return self.input_features_.transform(inputs) @ self.V_

    def candidate_coordinates(self, molecules: Sequence[Any]) -> np.ndarray:
        """psi~(c), shape (n_molecules, p_y)."""
        self._check_fitted()
        return self.output_basis_.coordinates(list(molecules))

    # -- state -------------------------------------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        self._check_fitted()
        arrays, input_meta = self.input_features_.get_state("input")
        output_arrays, output_meta = self.output_basis_.get_state(prefix="output")
        arrays.update(output_arrays)
        arrays["V"] = self.V_
        metadata = {"params": self.get_params(), "input": input_meta, "output": output_meta,
                    "history": self.history_}
        return arrays, metadata

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "RobustOKR":
        try:
            model = cls(**metadata["params"])
            model.input_features_ = Nystrom.from_state(arrays, metadata["input"], "input")
            model.output_basis_ = SketchedOutputBasis.from_state(arrays, metadata["output"], prefix="output")
            model.V_ = np.asarray(arrays["V"], dtype=np.float64)
        except (KeyError, TypeError) as exc:
            raise ModelFileError(f"okr-robust state is incomplete or foreign: {exc}") from None
        model.history_ = metadata.get("history", {})
        return model
