"""Sketched kernel machines for Lipschitz losses (``lipschitz``): vector targets, joint quantiles, robust losses.

The regressor of the seeds' p-sparsified paper: a kernel machine f(x) = W^T z(x) + b on the whitened Nystrom map
z of any registered input kernel with landmarks drawn by any registered sketch (p-sparsified Rademacher /
Gaussian with the decomposition trick, accumulation, sub-sampling, Gaussian; ``sketch=None`` is the exact kernel
machine), trained on one of the losses of :mod:`molpredict.engine.lipschitz` (pinball over several levels with
a non-crossing penalty, kappa-Huber, epsilon-insensitive, square) by L-BFGS on torch (CPU or CUDA through
:func:`molpredict.engine.device.resolve_device`). Targets are standardised per column before training (mean 0,
standard deviation 1), so ``lam``, ``kappa``, ``epsilon`` and ``smoothing`` are in units of standard
deviations; predictions are mapped back.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from molpredict.engine.lipschitz import LOSSES, LossSpec, fit_linear, pinball_loss, huber_loss, \
    epsilon_insensitive_loss, square_loss
from molpredict.engine.nystrom import Nystrom
from molpredict.errors import InputError, ModelFileError, SpecError
from molpredict.models.regression import Regressor, check_targets
from molpredict.specs import is_no_sketch, nested_spec

__all__ = ["SketchedLipschitzRegressor", "parse_floats", "validation_loss"]

STATE_FORMAT = "molpredict-lipschitz"
STATE_VERSION = 1

#: the default input kernel: the binned cosine of the peaks, a Gaussian on the precursor m/z, one on its mass
#: defect and one on the fragments' mass-defect histograms, averaged (:mod:`molpredict.kernels.masses`; the peaks
#: say what a molecule is made of, the masses how big and how hydrogen-rich; chosen on val, see the README's
#: "Properties of unknowns")
DEFAULT_INPUT_KERNEL = "mkl:kernels=cosine+precursor+mass-defect:gamma=0.5+precursor:width=none&defect_width=0.05"


def parse_floats(value: Any, what: str) -> tuple[float, ...]:
    """``0.1+0.5+0.9`` (or a number, or a sequence) -> a tuple of floats; SpecError otherwise."""
    if isinstance(value, (int, float)):
        return (float(value),)
    items = value.split("+") if isinstance(value, str) else list(value)
    try:
        out = tuple(float(v) for v in items if str(v).strip())
    except (TypeError, ValueError):
        raise SpecError(f"{what}: expected numbers separated by '+', got {value!r}") from None
    if not out:
        raise SpecError(f"{what}: no value given")
    return out


def _join(values: Sequence[float]) -> str:
    return "+".join(f"{v:g}" for v in values)


def validation_loss(Y: np.ndarray, F: np.ndarray, spec: LossSpec) -> float:
    """The mean un-smoothed loss of predictions F (n, T, Q) at targets Y (n, T) (for pinball: averaged over
    the levels, without the crossing penalty). Used to choose hyperparameters on validation data."""
    R = torch.as_tensor(Y[:, :, None] - F)
    if spec.name == "pinball":
        return float(pinball_loss(R, torch.as_tensor(spec.levels, dtype=R.dtype)).mean())
    if spec.name == "huber":
        return float(huber_loss(R, spec.kappa).mean())
    if spec.name == "epsilon-insensitive":
        return float(epsilon_insensitive_loss(R, spec.epsilon).mean())
    return float(square_loss(R).mean())


class SketchedLipschitzRegressor(Regressor):
    """Kernel machine for a Lipschitz loss on a sketched feature map (registry name ``lipschitz``).

    Parameters
    ----------
    input_kernel : str
        Input kernel spec (nested parameters with ``;`` or ``&`` as for other models).
    sketch : str or None
        Sketch spec for the landmarks (``p-sparsified-rademacher:m=400,p=0.001``, ``subsample:m=2000``...);
        None or ``none``: the exact kernel machine (all n training inputs, an n x n eigendecomposition).
    loss : {"pinball", "huber", "epsilon-insensitive", "square"}
    levels : str or sequence of float
        Quantile levels for ``pinball`` (``"0.1+0.5+0.9"``); ignored by the other losses.
    lam : str, float or sequence of float
        Ridge; several values (``"1e-3+1e-4"``) are a grid chosen on ``val`` by the validation loss (the first
        value without ``val``).
    kappa : float
        kappa-Huber threshold (standardised units).
    epsilon : float
        epsilon-insensitive tube half-width (standardised units).
    crossing_weight : float
        Weight of the non-crossing penalty (pinball).
    smoothing : float
        Moreau smoothing of the non-smooth losses (standardised units); > 0 for L-BFGS.
    max_iter : int
        L-BFGS iterations per fit.
    rel_cutoff : float
        Relative eigenvalue cut-off of the sketched kernel matrix.
    seed : int
        Seed of the sketch.
    device : str
        ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

    Fitted attributes
    -----------------
    features_ : Nystrom
        The sketched feature map (landmarks, projection).
    W_ : ndarray of shape (p, T * Q)
    b_ : ndarray of shape (T * Q,)
    y_mean_, y_scale_ : ndarray of shape (T,)
        The standardisation of the targets.
    lam_ : float
        The ridge used (chosen on val when ``lam`` is a grid).
    n_targets_ : int
    selection_ : list of dict
        Per grid value: ``lam``, validation ``loss`` (empty without a grid and val).
    timings_ : dict
        CPU and wall seconds of the feature map and of the solver (the last fit).
    """

    def __init__(self, input_kernel: str = DEFAULT_INPUT_KERNEL, sketch: str | None = "subsample:m=2000",
                 loss: str = "pinball", levels: Any = "0.1+0.5+0.9", lam: Any = 1e-4, kappa: float = 1.0,
                 epsilon: float = 0.1, crossing_weight: float = 1.0, smoothing: float = 0.01, max_iter: int = 200,
                 rel_cutoff: float = 1e-10, seed: int = 0, device: str = "auto") -> None:
        self.input_kernel = input_kernel
        self.sketch = sketch
        self.loss = loss
        self.levels = _join(levels) if isinstance(levels, (list, tuple)) else levels
        self.lam = lam
        self.kappa = kappa
        self.epsilon = epsilon
        self.crossing_weight = crossing_weight
        self.smoothing = smoothing
        self.max_iter = max_iter
        self.rel_cutoff = rel_cutoff
        self.seed = seed
        self.device = device

    @property
    def quantiles(self) -> tuple[float, ...]:
        """The quantile levels of :meth:`predict`'s last axis (pinball, ascending), ``()`` for the other losses."""
        if self.loss != "pinball":
            return ()
        return tuple(sorted(parse_floats(self.levels, "lipschitz levels")))

    def loss_spec(self) -> LossSpec:
        """The :class:`~molpredict.engine.lipschitz.LossSpec` of the parameters (SpecError when invalid)."""
        if self.loss not in LOSSES:
            raise SpecError(f"lipschitz: loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        levels = self.quantiles if self.loss == "pinball" else (0.5,)
        try:
            return LossSpec(self.loss, levels, float(self.kappa), float(self.epsilon), float(self.crossing_weight),
                            float(self.smoothing))
        except ValueError as exc:
            raise SpecError(f"lipschitz: {exc}") from None

    # -- fitting ---------------------------------------------------------------------------------------------
    def _features(self, inputs: Sequence[Any], device: torch.device) -> torch.Tensor:
        sketch = None if is_no_sketch(self.sketch) else nested_spec(self.sketch)
        self.features_ = Nystrom(nested_spec(self.input_kernel), sketch, float(self.rel_cutoff),
                                 seed=self.seed).fit(inputs, device=device)
        Z = self.features_.train_features_.T.contiguous()
        self.features_.train_features_ = None
        return Z

    def fit(self, inputs: Sequence[Any], targets: np.ndarray,
            val: tuple[Sequence[Any], np.ndarray] | None = None) -> "SketchedLipschitzRegressor":
        """Fit on inputs and targets (n, T); with ``val`` and several ``lam`` values, choose lam on val.

        Raises
        ------
        InputError
            Targets not paired with the inputs, fewer than two pairs, non-finite targets.
        SpecError
            Invalid parameters.
        """
        from molpredict.engine.device import resolve_device

        inputs = list(inputs)
        Y = check_targets(inputs, targets)
        spec = self.loss_spec()
        grid = parse_floats(self.lam, "lipschitz lam")
        if any(not lam > 0 for lam in grid):
            raise SpecError(f"lipschitz: lam must be positive, got {self.lam!r}")
        device = resolve_device(self.device)
        self.y_mean_ = Y.mean(0)
        scale = Y.std(0)
        self.y_scale_ = np.where(scale > 0, scale, 1.0)
        Ys = torch.as_tensor((Y - self.y_mean_) / self.y_scale_, dtype=torch.float64, device=device)
        wall, cpu = time.perf_counter(), time.process_time()
        Z = self._features(inputs, device)
        self.timings_ = {"features_wall_s": time.perf_counter() - wall, "features_cpu_s": time.process_time() - cpu}
        wall, cpu = time.perf_counter(), time.process_time()
        self.n_targets_ = int(Y.shape[1])
        self.selection_: list[dict[str, float]] = []
        if val is not None and len(grid) > 1:
            val_inputs = list(val[0])
            Yv = check_targets(val_inputs, val[1], what="validation")
            if Yv.shape[1] != Y.shape[1]:
                raise InputError(f"validation targets have {Yv.shape[1]} columns, training {Y.shape[1]}")
            Zv = torch.as_tensor(self.features_.transform(val_inputs), dtype=torch.float64, device=device)
            best, init = None, None
            for lam in sorted(grid, reverse=True):  # warm starts from the most regularised solution
                W, b, _ = fit_linear(Z, Ys, spec, lam, max_iter=int(self.max_iter), init=init)
                init = (W, b)
                F = (Zv @ W + b).cpu().numpy().reshape(len(val_inputs), self.n_targets_, -1)  # standardised
                loss = validation_loss((Yv - self.y_mean_) / self.y_scale_, F, spec)
                self.selection_.append({"lam": float(lam), "loss": loss})
                if best is None or loss < best[0]:
                    best = (loss, lam, W, b)
            _, self.lam_, W, b = best
        else:
            self.lam_ = float(grid[0])
            W, b, _ = fit_linear(Z, Ys, spec, self.lam_, max_iter=int(self.max_iter))
        self.W_ = W.cpu().numpy()
        self.b_ = b.cpu().numpy()
        self.timings_.update({"solver_wall_s": time.perf_counter() - wall, "solver_cpu_s": time.process_time() - cpu})
        return self

    def _unscale(self, F: np.ndarray) -> np.ndarray:
        T = self.n_targets_
        F = F.reshape(F.shape[0], T, -1)
        return F * self.y_scale_[None, :, None] + self.y_mean_[None, :, None]

    def _check_fitted(self) -> None:
        if not hasattr(self, "W_"):
            raise RuntimeError("SketchedLipschitzRegressor is not fitted: call fit(inputs, targets) first")

    def predict(self, inputs: Sequence[Any]) -> np.ndarray:
        """Predictions, shape (n_inputs, T, Q), float64 (Q = number of levels for pinball, else 1)."""
        self._check_fitted()
        inputs = list(inputs)
        if not inputs:
            return np.zeros((0, self.n_targets_, len(self.quantiles) or 1))
        Z = self.features_.transform(inputs)
        return self._unscale(Z @ self.W_ + self.b_)

    # -- state -----------------------------------------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays ``W``, ``b``, ``y_mean``, ``y_scale`` and the feature map's ``input.*``; metadata: parameters,
        the feature map's specs, lam, the selection."""
        self._check_fitted()
        arrays, features = self.features_.get_state("input")
        arrays.update({"W": np.asarray(self.W_, dtype=np.float64), "b": np.asarray(self.b_, dtype=np.float64),
                       "y_mean": np.asarray(self.y_mean_, dtype=np.float64),
                       "y_scale": np.asarray(self.y_scale_, dtype=np.float64)})
        metadata = {"format": STATE_FORMAT, "version": STATE_VERSION,
                    "regressor": self.registry_name or "lipschitz", "params": self.get_params(),
                    "input": features, "lam": float(self.lam_), "n_targets": int(self.n_targets_),
                    "selection": list(self.selection_)}
        return arrays, metadata

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "SketchedLipschitzRegressor":
        """Rebuild a fitted regressor (the kernel refitted on the saved landmarks)."""
        if metadata.get("format") != STATE_FORMAT or metadata.get("version") != STATE_VERSION:
            raise ModelFileError(f"lipschitz state: unsupported format {metadata.get('format')!r} version "
                                 f"{metadata.get('version')!r} (expected {STATE_FORMAT} {STATE_VERSION})")
        try:
            params = {k: v for k, v in metadata["params"].items() if k in cls.param_names()}
            model = cls(**params)
            model.features_ = Nystrom.from_state(arrays, metadata["input"], "input")
            model.W_ = np.asarray(arrays["W"], dtype=np.float64)
            model.b_ = np.asarray(arrays["b"], dtype=np.float64)
            model.y_mean_ = np.asarray(arrays["y_mean"], dtype=np.float64)
            model.y_scale_ = np.asarray(arrays["y_scale"], dtype=np.float64)
            model.lam_ = float(metadata["lam"])
            model.n_targets_ = int(metadata["n_targets"])
            model.selection_ = list(metadata.get("selection", []))
        except KeyError as exc:
            raise ModelFileError(f"lipschitz state lacks {exc}") from None
        if model.W_.shape != (model.features_.dim_, model.n_targets_ * (len(model.quantiles) or 1)):
            raise ModelFileError(f"lipschitz state: W has shape {model.W_.shape}, expected "
                                 f"({model.features_.dim_}, {model.n_targets_ * (len(model.quantiles) or 1)})")
        return model
