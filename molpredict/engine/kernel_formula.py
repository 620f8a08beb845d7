"""The kernel model plus a peak-formula transformer on its residual (``kernel-formula``), a DSOKR encoder.

The network is g(x) = W phi(x) + T(tokens(x)):

- phi(x) are the Nystrom features of an input kernel against landmark training spectra (``kernel-mlp``'s with
  ``whiten=true``; ``mkl`` by default, the kernel ``molpredict train`` uses), and W a linear map into DSOKR's
  coordinates. W starts at the closed-form ridge solution (:func:`ridge_path`: the SIOKR fit on those features,
  one solution per ``ridge`` value, the one that ranks the validation sets best is kept) and is frozen unless
  ``freeze_kernel=false``;
- T is the peak-formula set transformer of :mod:`~molpredict.engine.formula_transformer` (one token per peak,
  sub-formulas of fragment and loss), whose head starts at zero: before training g is the kernel model, and the
  transformer learns what the kernel model's coordinates miss.

DSOKR scores the warm-started network before the first epoch, so early stopping can keep the kernel model alone
when the transformer does not improve the validation ranking.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from molpredict.engine.encoders import Encoder, landmark_features
from molpredict.engine.formula_transformer import FormulaTransformerEncoder, PeakSetTransformer, PeakTokens
from molpredict.engine.nystrom import Nystrom
from molpredict.errors import ModelFileError, SpecError

__all__ = ["KernelAndTokens", "KernelPlusPeakSet", "KernelFormulaEncoder", "ridge_path"]


@dataclass
class KernelAndTokens:
    """The two feature tables of n spectra: kernel features (n, p) float32 and their peak tokens."""

    features: np.ndarray
    tokens: PeakTokens

    def __len__(self) -> int:
        return int(self.features.shape[0])


class KernelPlusPeakSet(nn.Module):
    """g(x) = linear(phi(x)) + transformer(tokens(x)); ``forward((phi, (x, pad)))`` returns (batch, out_dim)."""

    def __init__(self, n_features: int, transformer: PeakSetTransformer, out_dim: int, freeze_kernel: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(n_features, out_dim, bias=False)
        nn.init.zeros_(self.linear.weight)
        self.linear.weight.requires_grad_(not freeze_kernel)
        self.transformer = transformer

    def forward(self, batch: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        phi, tokens = batch
        return self.linear(phi) + self.transformer(tokens)


def ridge_path(features: torch.Tensor, targets: torch.Tensor, lams: Sequence[float], block: int = 8192
               ) -> Iterator[tuple[float, torch.Tensor]]:
    """Ridge solutions W(lam) = (Phi^T Phi + n lam I)^-1 Phi^T Psi for each lam, from one eigendecomposition.

    Parameters
    ----------
    features : tensor of shape (n, p)
        Phi (any float dtype; the products are accumulated in float64 on its device, ``block`` rows at a time).
    targets : tensor of shape (n, r)
        Psi.
    lams : sequence of float, each > 0

    Yields
    ------
    (lam, W) with W of shape (r, p), float64 (a ``torch.nn.Linear`` weight).
    """
    n, p = features.shape
    gram = torch.zeros((p, p), dtype=torch.float64, device=features.device)
    cross = torch.zeros((p, targets.shape[1]), dtype=torch.float64, device=features.device)
    for start in range(0, n, block):
        phi = features[start:start + block].double()
        gram += phi.T @ phi
        cross += phi.T @ targets[start:start + block].double()
    values, vectors = torch.linalg.eigh(gram)
    projected = vectors.T @ cross
    for lam in lams:
        if not lam > 0:
            raise SpecError(f"kernel-formula: ridge values must be > 0, got {lam}")
        # n lam > 0 bounds the smallest divisor away from zero: no cut-off needed (eigenvalues of Phi^T Phi >= 0,
        # tiny negative rounding is dominated by n lam)
        yield float(lam), (vectors @ (projected / (values.clamp(min=0.0) + n * float(lam))[:, None])).T


class KernelFormulaEncoder(Encoder):
    """Kernel features with a linear map warm-started at the ridge solution, plus a peak-formula transformer.

    Parameters
    ----------
    input_kernel : str
        The kernel of the features (registry name with defaults from a model spec, or a full spec).
    n_landmarks : int
        Landmark training spectra of the Nystrom features.
    ridge : str
        The ridge values tried for the warm start, separated by ``/`` (e.g. ``1e-5/1e-4/1e-3``): each solution is
        scored on the validation data and the best kept; without validation data the first is used.
    freeze_kernel : bool
        Keep W at the warm start (train the transformer alone).
    explanations, max_peaks, ppm, mz_tolerance, d_model, nhead, layers, dim_feedforward, dropout
        The transformer and its tokens (see :class:`~molpredict.engine.formula_transformer.FormulaTransformerEncoder`).
    seed : int
        Landmark draw.
    """

    input_type = "spectrum"

    def __init__(self, input_kernel: str = "mkl", n_landmarks: int = 4000, ridge: str = "1e-5/1e-4/1e-3",
                 freeze_kernel: bool = True, explanations: int = 3, max_peaks: int = 40, ppm: float = 10.0,
                 mz_tolerance: float = 0.005, d_model: int = 64, nhead: int = 4, layers: int = 2,
                 dim_feedforward: int = 128, dropout: float = 0.1, seed: int = 0) -> None:
        self.input_kernel = input_kernel
        self.n_landmarks = n_landmarks
        self.ridge = ridge
        self.freeze_kernel = freeze_kernel
        self.explanations = explanations
        self.max_peaks = max_peaks
        self.ppm = ppm
        self.mz_tolerance = mz_tolerance
        self.d_model = d_model
        self.nhead = nhead
        self.layers = layers
        self.dim_feedforward = dim_feedforward
        self.dropout = dropout
        self.seed = seed

    def _ridge_values(self) -> list[float]:
        try:
            values = [float(v) for v in str(self.ridge).split("/") if v.strip()]
        except ValueError:
            values = []
        if not values or not all(v > 0 for v in values):
            raise SpecError(f"kernel-formula: ridge must be positive numbers separated by '/', got {self.ridge!r}")
        return values

    def _tokens(self) -> FormulaTransformerEncoder:
        """The transformer's encoder (its tokens and its network), with this encoder's parameters."""
        return FormulaTransformerEncoder(self.explanations, self.max_peaks, self.ppm, self.mz_tolerance, self.d_model,
                                         self.nhead, self.layers, self.dim_feedforward, self.dropout)

    def _check(self) -> None:
        self._ridge_values()
        try:
            self._tokens()._check()
        except SpecError as exc:  # the same checks, in this encoder's name
            raise SpecError(str(exc).replace("formula-transformer:", "kernel-formula:", 1)) from None

    def fit(self, inputs: Sequence[Any], device: torch.device | None = None) -> "KernelFormulaEncoder":
        self._check()
        self.features_ = landmark_features(self.input_kernel, self.n_landmarks, True, self.seed, inputs)
        self.fitted_ = True
        return self

    def featurize(self, inputs: Sequence[Any]) -> KernelAndTokens:
        inputs = list(inputs)
        features = np.asarray(self.features_.transform(inputs), dtype=np.float32)
        return KernelAndTokens(features, self._tokens().featurize(inputs))

    def take(self, features: KernelAndTokens, index: np.ndarray) -> KernelAndTokens:
        return KernelAndTokens(features.features[index], features.tokens.take(index))

    def to_tensor(self, features: KernelAndTokens, device: torch.device) -> tuple:
        x, pad = features.tokens.padded()
        phi = torch.from_numpy(np.ascontiguousarray(features.features, dtype=np.float32)).to(device)
        return phi, (torch.from_numpy(x).to(device), torch.from_numpy(pad).to(device))

    def build(self, out_dim: int) -> nn.Module:
        self._check()
        return KernelPlusPeakSet(self.features_.dim_, self._tokens().build(out_dim), out_dim, bool(self.freeze_kernel))

    def warm_starts(self, network: nn.Module, features: KernelAndTokens, psi: torch.Tensor, target: torch.Tensor
                    ) -> Iterator[dict[str, Any]]:
        """Load each ridge solution into ``network.linear`` in turn (see :meth:`Encoder.warm_starts`)."""
        phi = torch.from_numpy(np.ascontiguousarray(features.features)).to(psi.device)
        for lam, weight in ridge_path(phi, psi[target], self._ridge_values()):
            with torch.no_grad():
                network.linear.weight.copy_(weight.to(network.linear.weight.dtype))
            yield {"ridge": lam}

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = self.features_.get_state("encoder")
        return arrays, {"kernel_features": meta}

    def set_state(self, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "KernelFormulaEncoder":
        self._check()
        if "kernel_features" not in metadata:
            raise ModelFileError("kernel-formula encoder state lacks its landmark features")
        self.features_ = Nystrom.from_state(arrays, metadata["kernel_features"], "encoder")
        self.fitted_ = True
        return self
