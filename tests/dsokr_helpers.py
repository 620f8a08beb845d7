"""Synthetic components for the DSOKR / robust OKR tests: vector inputs and outputs with explicit feature maps."""
from __future__ import annotations

import numpy as np
import torch

from molpredict.engine.encoders import Encoder, mlp_layers
from molpredict.hookspecs import hookimpl
from molpredict.kernels.base import InputKernel, OutputKernel
from molpredict.registry import Registry, reset_registry


class RBFVectorKernel(OutputKernel):
    """exp(-gamma ||a - b||^2) on numeric vectors (normalised by construction)."""

    input_type = "vector"

    def __init__(self, gamma: float = 0.5) -> None:
        self.gamma = gamma

    def featurize(self, objects):
        return np.stack([np.asarray(o, dtype=np.float64) for o in objects])

    def pairwise(self, fa, fb):
        d = (fa * fa).sum(1)[:, None] + (fb * fb).sum(1)[None, :] - 2 * fa @ fb.T
        return np.exp(-float(self.gamma) * np.maximum(d, 0.0))

    def self_similarity(self, features):
        return np.ones(len(features))


class RBFInputKernel(RBFVectorKernel, InputKernel):
    input_type = "vector"


class CosineVectorKernel(OutputKernel):
    """a.b / (|a||b|): a linear kernel on normalised vectors (explicit feature map a / |a|)."""

    input_type = "vector"

    def __init__(self) -> None:
        pass

    def featurize(self, objects):
        return np.stack([np.asarray(o, dtype=np.float64) for o in objects])

    def pairwise(self, fa, fb):
        return fa @ fb.T

    def self_similarity(self, features):
        return (features * features).sum(1)


class VectorEncoder(Encoder):
    """An MLP on numeric vectors."""

    input_type = "vector"

    def __init__(self, hidden: int = 64, layers: int = 1, dropout: float = 0.0) -> None:
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout

    def fit(self, inputs, device=None):
        self.d_ = len(inputs[0])
        self.fitted_ = True
        return self

    def featurize(self, inputs):
        return np.stack([np.asarray(x, dtype=np.float32) for x in inputs])

    def to_tensor(self, features, device):
        return torch.from_numpy(features).to(device)

    def build(self, out_dim):
        return mlp_layers(self.d_, self.hidden, self.layers, self.dropout, out_dim)

    def get_state(self):
        return {}, {"d": int(self.d_)}

    def set_state(self, arrays, metadata):
        self.d_ = int(metadata["d"])
        self.fitted_ = True
        return self


class SyntheticPlugin:
    @hookimpl
    def register_output_kernels(self, register):
        register("test-rbf", RBFVectorKernel)
        register("test-cosine", CosineVectorKernel)

    @hookimpl
    def register_input_kernels(self, register):
        register("test-rbf-in", RBFInputKernel)

    @hookimpl
    def register_encoders(self, register):
        register("test-vec", VectorEncoder)


def install_synthetic_registry() -> Registry:
    registry = Registry(load_external=False, extra_plugins=[SyntheticPlugin()])
    reset_registry(registry)
    return registry


def synthetic_pairs(n: int, seed: int, d_in: int = 5, d_out: int = 3, noise: float = 0.0):
    """x ~ N(0, I), y = tanh(x A) (+ noise), A fixed: a smooth vector-valued regression problem."""
    a = np.random.default_rng(1234).normal(size=(d_in, d_out))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d_in))
    y = np.tanh(x @ a) + noise * rng.normal(size=(n, d_out))
    return list(x), [np.round(v, 8) for v in y]
