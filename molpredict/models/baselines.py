"""Baseline models: random ranking, a structure prior, a fingerprint-predicting MLP and a library k-NN.

Every baseline is a :class:`~molpredict.models.base.Model`, so it is trained, saved and evaluated exactly like
the kernel models, and scores candidates by ``predict_coordinates(x) . candidate_coordinates(c)``:

``random`` (:class:`RandomBaseline`)
    Every candidate gets the same score (coordinates ``[1]`` on both sides). Under the evaluation's
    ``average`` tie policy this gives exactly the expectation of a uniformly random ranking, which
    :func:`molpredict.engine.decoding.random_expectation` also computes in closed form from the candidate-set sizes.
``prior`` (:class:`PriorBaseline`)
    Never looks at the spectrum: a candidate's score is its similarity to the distinct training structures
    (mean, max or top-k mean of Tanimoto / Gaussian-Tanimoto / cosine on Morgan fingerprints). The score is a
    property of the candidate alone, so the coordinates are one-dimensional: ``[score(c)]`` for a candidate
    and ``[1]`` for every input.
``fingerprint-ffn`` (:class:`FingerprintFFN`)
    MassSpecGym's fingerprint FFN: an MLP from binned spectra to Morgan bit probabilities (BCE loss, Adam,
    early stopping on validation loss); candidates ranked by cosine between predicted probabilities and bits, or
    (``scoring=likelihood``) by the log-likelihood of their bits under those probabilities.
``library-knn`` (:class:`LibraryKNN`)
    The fingerprints of the k most similar training spectra (by an input kernel from the registry), averaged
    with similarity weights; candidates ranked by cosine with that average.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.errors import ModelFileError
from molpredict.engine.device import resolve_device
from molpredict.spectra.features import bin_spectra
from molpredict.chem.molecules import Molecule, fingerprint_matrix
from molpredict.errors import SpecError
from molpredict.specs import ComponentSpec
from molpredict.models.base import Model, check_pairs
from molpredict.models.distinct import distinct_objects, split_by_structure, structure_key

__all__ = [
    "RandomBaseline",
    "PriorBaseline",
    "FingerprintFFN",
    "LibraryKNN",
    "unit_rows",
]

_FP_PARAMS = ("fingerprint", "radius", "fp_size", "counts")
#: how ``fingerprint-ffn`` scores a candidate from its predicted bit probabilities (:class:`FingerprintFFN`)
FFN_SCORINGS = ("cosine", "likelihood")
#: ``likelihood`` reads probabilities clipped to [p, 1 - p]: a bit predicted 0 or 1 in float32 is not a veto
FFN_PROBABILITY_FLOOR = 1e-6
#: the prior's similarity -> registered output kernel
_SIMILARITY_KERNELS = {"tanimoto": "tanimoto", "gaussian-tanimoto": "gaussian-tanimoto", "cosine": "fingerprint-cosine"}


# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------

def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm (all-zero rows stay zero), float64, shape as ``matrix``."""
    matrix = np.asarray(matrix, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def _aggregate(sim: np.ndarray, top_k: int | None) -> np.ndarray:
    """Row-wise mean of the ``top_k`` largest entries (all entries when ``top_k`` is None or 0)."""
    n = sim.shape[1]
    if not top_k or top_k >= n:
        return sim.mean(axis=1)
    if top_k == 1:
        return sim.max(axis=1)
    part = np.partition(sim, n - top_k, axis=1)[:, n - top_k:]
    return part.mean(axis=1)


class _FingerprintMixin:
    """Fingerprint settings shared by the baselines that look at candidate structures."""

    fingerprint: str
    radius: int
    fp_size: int
    counts: bool

    def _fingerprints(self, molecules: Sequence[Molecule]) -> np.ndarray:
        return fingerprint_matrix(molecules, kind=self.fingerprint, radius=self.radius, size=self.fp_size,
                                  counts=self.counts)

    def _fp_metadata(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FP_PARAMS}


def _check_fitted(model: Model, attribute: str) -> None:
    if not hasattr(model, attribute):
        raise RuntimeError(f"{type(model).__name__} is not fitted: call fit(inputs, molecules) first")


def _state_params(cls: type[Model], metadata: dict[str, Any]) -> dict[str, Any]:
    params = metadata.get("params")
    if not isinstance(params, dict):
        raise ModelFileError(f"{cls.__name__} state: metadata has no 'params' table")
    return {k: v for k, v in params.items() if k in cls.param_names()}


def _check_ffn_scoring(scoring: str) -> str:
    if scoring not in FFN_SCORINGS:
        raise SpecError(f"fingerprint-ffn: scoring must be one of {', '.join(FFN_SCORINGS)}, got {scoring!r}")
    return scoring


def _require(arrays: dict[str, np.ndarray], name: str, cls: type) -> np.ndarray:
    if name not in arrays:
        raise ModelFileError(f"{cls.__name__} state: array {name!r} is missing")
    return arrays[name]


# ----------------------------------------------------------------------------------------------------------
# random
# ----------------------------------------------------------------------------------------------------------

class RandomBaseline(Model):
    """Uniformly random ranking: every candidate gets the same score.

    The ranking is random only through the evaluation's tie policy: with ``average`` (uniformly random
    tie-breaking, in expectation) the metrics equal :func:`molpredict.engine.decoding.random_expectation` of the
    candidate-set sizes exactly; with ``worst`` every query is ranked last.

    Fitted attributes
    -----------------
    n_train_ : int
    """

    def __init__(self) -> None:
        pass

    def fit(self, inputs, molecules, val=None) -> "RandomBaseline":
        check_pairs(inputs, molecules)
        self.n_train_ = len(inputs)
        return self

    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """ndarray of shape (n_inputs, 1): all ones."""
        return np.ones((len(inputs), 1), dtype=np.float64)

    def candidate_coordinates(self, molecules: Sequence[Any]) -> np.ndarray:
        """ndarray of shape (n_molecules, 1): all ones."""
        return np.ones((len(molecules), 1), dtype=np.float64)

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        _check_fitted(self, "n_train_")
        return {}, {"params": {}, "n_train": self.n_train_, "output": {"kind": "constant"}}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "RandomBaseline":
        if metadata.get("output") != {"kind": "constant"}:
            raise ModelFileError("random baseline state: not a random baseline's")
        model = cls()
        model.n_train_ = int(metadata.get("n_train", 0))
        return model


# ----------------------------------------------------------------------------------------------------------
# prior
# ----------------------------------------------------------------------------------------------------------

class PriorBaseline(_FingerprintMixin, Model):
    """A structure prior that never looks at the spectrum.

    score(c) = mean of the ``top_k`` largest similarities between candidate c and the distinct training
    structures (``top_k`` 0: all of them, i.e. the mean; 1: the nearest one). In dot-product form the
    candidate coordinates are ``[score(c)]`` and every input's coordinates ``[1]``.

    Parameters
    ----------
    similarity : {"tanimoto", "gaussian-tanimoto", "cosine"}
        The registered output kernel ``tanimoto`` (MinMax on counts), ``gaussian-tanimoto`` (with ``gamma``)
        or ``fingerprint-cosine``, on the fingerprint settings below.
    top_k : int
        How many of the most similar training structures to average (0: all).
    gamma : float
        Width of ``gaussian-tanimoto``.
    fingerprint, radius, fp_size, counts
        Fingerprint settings (:meth:`molpredict.chem.molecules.Molecule.fingerprint`).
    block_size : int
        Candidates per block (memory O(block_size * n_structures)).

    Fitted attributes
    -----------------
    train_fingerprints_ : ndarray of shape (n_structures, fp_size)
        Fingerprints of the distinct training structures (uint8 bits or float32 counts).
    n_train_ : int
    """

    def __init__(self, similarity: str = "tanimoto", top_k: int = 5, gamma: float = 1.0,
                 fingerprint: str = "morgan", radius: int = 2, fp_size: int = 2048, counts: bool = False,
                 block_size: int = 4096) -> None:
        self.similarity = similarity
        self.top_k = top_k
        self.gamma = gamma
        self.fingerprint = fingerprint
        self.radius = radius
        self.fp_size = fp_size
        self.counts = counts
        self.block_size = block_size

    def _kernel(self) -> Any:
        """The registered output kernel that gives the similarity, with this model's fingerprint settings."""
        from molpredict.registry import create
        if self.similarity not in _SIMILARITY_KERNELS:
            raise SpecError(f"prior: unknown similarity {self.similarity!r}; valid: "
                            f"{', '.join(_SIMILARITY_KERNELS)}")
        params: dict[str, Any] = {"fp": self.fingerprint, "radius": self.radius, "size": self.fp_size,
                                  "counts": self.counts}
        if self.similarity == "gaussian-tanimoto":
            params["gamma"] = float(self.gamma)
        return create("output_kernel", ComponentSpec(_SIMILARITY_KERNELS[self.similarity], params))

    def fit(self, inputs, molecules, val=None) -> "PriorBaseline":
        check_pairs(inputs, molecules)
        distinct, _ = distinct_objects(list(molecules), key=structure_key)
        self.kernel_ = self._kernel().fit(distinct)
        self.train_fingerprints_ = self.kernel_.fit_features_.matrix
        self._reference_keys = None
        self.n_train_ = len(inputs)
        return self

    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """ndarray of shape (n_inputs, 1): all ones (the spectrum is never looked at)."""
        return np.ones((len(inputs), 1), dtype=np.float64)

    def candidate_scores(self, molecules: Sequence[Molecule]) -> np.ndarray:
        """The prior score of each molecule, ndarray of shape (n_molecules,), float64."""
        _check_fitted(self, "train_fingerprints_")
        molecules = list(molecules)
        out = np.empty(len(molecules), dtype=np.float64)
        for start in range(0, len(molecules), self.block_size):
            stop = min(start + self.block_size, len(molecules))
            out[start:stop] = _aggregate(self.kernel_.transform(molecules[start:stop]), self.top_k)
        return out

    def candidate_coordinates(self, molecules: Sequence[Molecule]) -> np.ndarray:
        """ndarray of shape (n_molecules, 1): the prior score."""
        return self.candidate_scores(molecules)[:, None]

    def is_reference(self, molecules: Sequence[Molecule]) -> np.ndarray:
        """Whether each molecule is one of the reference structures as the prior sees them (its fingerprint equals
        one of theirs: its top similarity is 1), ndarray of shape (n_molecules,), bool."""
        _check_fitted(self, "train_fingerprints_")
        if getattr(self, "_reference_keys", None) is None:
            self._reference_keys = {_fingerprint_key(row) for row in np.asarray(self.train_fingerprints_)}
        rows = np.asarray(self.kernel_.featurize(list(molecules)).matrix)
        return np.array([_fingerprint_key(row) in self._reference_keys for row in rows], dtype=bool)

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        _check_fitted(self, "train_fingerprints_")
        fps = self.train_fingerprints_
        arrays = {"output_fingerprints": np.packbits(fps, axis=1) if not self.counts else fps}
        output = {**self._fp_metadata(), "similarity": self.similarity, "top_k": self.top_k,
                  "gamma": self.gamma, "n_structures": int(fps.shape[0])}
        return arrays, {"params": self.get_params(), "n_train": self.n_train_, "output": output}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "PriorBaseline":
        model = cls(**_state_params(cls, metadata))
        fps = _require(arrays, "output_fingerprints", cls)
        if not model.counts:
            fps = np.unpackbits(fps.astype(np.uint8), axis=1, count=model.fp_size)
        model.train_fingerprints_ = fps
        kernel = model._kernel()
        model.kernel_ = kernel.fit_features(kernel.fingerprints(fps))
        model.n_train_ = int(metadata.get("n_train", 0))
        return model


def _fingerprint_key(row: np.ndarray) -> bytes:
    """An exact, compact key of one fingerprint row (bits or counts): which entries are set, and their values."""
    row = np.asarray(row)
    return np.packbits(row != 0).tobytes() + np.asarray(row[row != 0], dtype=np.float32).tobytes()


# ----------------------------------------------------------------------------------------------------------
# fingerprint-ffn
# ----------------------------------------------------------------------------------------------------------

def _build_mlp(n_in: int, hidden: int, n_layers: int, n_out: int, dropout: float):
    import torch.nn as nn
    layers: list[Any] = []
    width = n_in
    for _ in range(n_layers):
        layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
        width = hidden
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


def _dense_batch(matrix: sp.csr_matrix, rows: np.ndarray, device: str):
    import torch
    return torch.from_numpy(matrix[rows].toarray()).to(device)


class FingerprintFFN(_FingerprintMixin, Model):
    """An MLP predicting Morgan fingerprint bits from a binned spectrum (MassSpecGym's fingerprint FFN).

    Inputs: :func:`molpredict.spectra.features.bin_spectra` (``bin_width``, ``max_mz``; intensities relative to the
    spectrum's largest peak raised to ``intensity_power``, summed per bin). Network:
    ``n_layers`` hidden layers of ``hidden`` units (ReLU, dropout), logits for ``fp_size`` bits; binary
    cross-entropy, Adam, mini-batches; the epoch with the lowest validation loss is kept (training stops after
    ``patience`` epochs without improvement). Validation data: ``val`` in :meth:`fit`, else ``val_fraction`` of
    the training *structures* held out. Candidates are scored (``scoring``) by the cosine between the predicted bit
    probabilities and their fingerprint bits (MassSpecGym's retrieval), or by the log-likelihood of their bits
    under the predicted probabilities, ``sum_b c_b log p_b + (1 - c_b) log(1 - p_b)``: as a dot product
    ``c . logit(p)``, the log-likelihood less ``sum_b log(1 - p_b)``, the same for every candidate of a query, so the
    ranking is the likelihood's (the fingerprint head's score, :mod:`molpredict.models.fingerprint_head`). On the
    positive validation formula256 sets the likelihood ranked the truth first for 25.6% of the spectra, the cosine
    for 17.1% (``docs/benchmarks/fingerprint_head.md``).

    Parameters
    ----------
    bin_width, max_mz : float
        Spectrum binning.
    intensity_power : float
        Power applied to relative intensities before binning. 1 by default because the training pipeline's
        cleaning already takes the square root; use 0.5 on raw spectra.
    hidden, n_layers : int
        Hidden width and number of hidden layers.
    dropout : float
    learning_rate, weight_decay : float
        Adam settings.
    batch_size, max_epochs, patience : int
    val_fraction : float
        Share of the training structures held out for early stopping when no ``val`` is given.
    scoring : {"cosine", "likelihood"}
        How a candidate is scored from the predicted probabilities (above).
    fingerprint, radius, fp_size, counts
        Target fingerprint (``counts`` must be False: the targets are bits).
    seed : int
        Seeds the initialisation, the hold-out split and the batch order.
    device : str
        ``auto``, ``cpu`` or ``cuda``.
    verbose : bool
        One line per epoch on stderr.

    Fitted attributes
    -----------------
    net_ : torch.nn.Sequential (on the CPU after fitting)
    n_train_ : int
    history_ : list of dict
        Per epoch: ``epoch``, ``train_loss``, ``val_loss``, ``seconds``.
    best_epoch_ : int
    """

    def __init__(self, bin_width: float = 1.0, max_mz: float = 1005.0, intensity_power: float = 1.0,
                 hidden: int = 512, n_layers: int = 2,
                 dropout: float = 0.2, learning_rate: float = 1e-3, weight_decay: float = 0.0,
                 batch_size: int = 256, max_epochs: int = 30, patience: int = 3, val_fraction: float = 0.1,
                 scoring: str = "cosine", fingerprint: str = "morgan", radius: int = 2, fp_size: int = 4096,
                 counts: bool = False, seed: int = 0, device: str = "auto", verbose: bool = False) -> None:
        self.bin_width = bin_width
        self.max_mz = max_mz
        self.intensity_power = intensity_power
        self.hidden = hidden
        self.n_layers = n_layers
        self.dropout = dropout
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.val_fraction = val_fraction
        self.scoring = scoring
        self.fingerprint = fingerprint
        self.radius = radius
        self.fp_size = fp_size
        self.counts = counts
        self.seed = seed
        self.device = device
        self.verbose = verbose

    def _features(self, inputs: Sequence[Any]) -> sp.csr_matrix:
        return bin_spectra(list(inputs), bin_width=self.bin_width, max_mz=self.max_mz, intensity_power=self.intensity_power)

    def _split(self, molecules: Sequence[Molecule]) -> tuple[np.ndarray, np.ndarray]:
        """Training and validation positions: ``val_fraction`` of the structures held out (all data on both
        sides when there are fewer than two structures)."""
        train, held = split_by_structure(molecules, float(self.val_fraction), int(self.seed), key=structure_key)
        return (train, held) if held.size else (train, train)

    def _mean_loss(self, net, x: sp.csr_matrix, y: np.ndarray, device: str) -> float:
        import torch
        import torch.nn.functional as F
        total = 0.0
        net.eval()
        with torch.no_grad():
            for start in range(0, x.shape[0], 4096):
                rows = np.arange(start, min(start + 4096, x.shape[0]))
                logits = net(_dense_batch(x, rows, device))
                target = torch.from_numpy(y[rows].astype(np.float32)).to(device)
                total += float(F.binary_cross_entropy_with_logits(logits, target, reduction="sum"))
        return total / (x.shape[0] * y.shape[1])

    def fit(self, inputs, molecules, val=None) -> "FingerprintFFN":
        import sys

        import torch
        import torch.nn.functional as F

        check_pairs(inputs, molecules)
        if self.counts:
            raise SpecError("fingerprint-ffn predicts bits: counts must be false")
        _check_ffn_scoring(self.scoring)
        device = resolve_device(self.device)
        rng = np.random.default_rng(self.seed)
        torch.manual_seed(self.seed)
        molecules = list(molecules)
        x_all = self._features(inputs)
        y_all = self._fingerprints(molecules)
        if val is not None:
            x_tr, y_tr = x_all, y_all
            x_va, y_va = self._features(val[0]), self._fingerprints(list(val[1]))
        else:
            tr, va = self._split(molecules)
            x_tr, y_tr, x_va, y_va = x_all[tr], y_all[tr], x_all[va], y_all[va]

        net = _build_mlp(x_all.shape[1], self.hidden, self.n_layers, y_all.shape[1], self.dropout).to(device)
        optimiser = torch.optim.Adam(net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay)
        best_loss, best_state, best_epoch, stale = math.inf, None, 0, 0
        self.history_ = []
        for epoch in range(1, self.max_epochs + 1):
            started = time.perf_counter()
            net.train()
            order = rng.permutation(x_tr.shape[0])
            running = 0.0
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                logits = net(_dense_batch(x_tr, rows, device))
                target = torch.from_numpy(y_tr[rows].astype(np.float32)).to(device)
                loss = F.binary_cross_entropy_with_logits(logits, target)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                running += loss.item() * len(rows)
            val_loss = self._mean_loss(net, x_va, y_va, device)
            record = {"epoch": epoch, "train_loss": running / len(order), "val_loss": val_loss,
                      "seconds": time.perf_counter() - started}
            self.history_.append(record)
            if self.verbose:
                print(f"fingerprint-ffn: epoch {epoch} train {record['train_loss']:.5f} "
                      f"val {val_loss:.5f} ({record['seconds']:.1f} s)", file=sys.stderr)
            if val_loss < best_loss - 1e-7:
                best_loss, best_epoch, stale = val_loss, epoch, 0
                best_state = copy.deepcopy({k: v.detach().cpu() for k, v in net.state_dict().items()})
            else:
                stale += 1
                if stale >= self.patience:
                    break
        net = net.cpu()
        net.load_state_dict(best_state)
        net.eval()
        self.net_ = net
        self.best_epoch_ = best_epoch
        self.n_train_ = len(inputs)
        return self

    def predict_proba(self, inputs: Sequence[Any]) -> np.ndarray:
        """Predicted bit probabilities, ndarray of shape (n_inputs, fp_size), float64."""
        import torch
        _check_fitted(self, "net_")
        x = self._features(inputs)
        out = np.empty((x.shape[0], self.fp_size), dtype=np.float64)
        with torch.no_grad():
            for start in range(0, x.shape[0], 4096):
                rows = np.arange(start, min(start + 4096, x.shape[0]))
                out[rows] = torch.sigmoid(self.net_(_dense_batch(x, rows, "cpu"))).double().numpy()
        return out

    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """Unit-norm predicted probabilities (``cosine``) or their log-odds ``logit(p)`` (``likelihood``), ndarray
        of shape (n_inputs, fp_size)."""
        proba = self.predict_proba(inputs)
        if _check_ffn_scoring(self.scoring) == "likelihood":
            p = np.clip(proba, FFN_PROBABILITY_FLOOR, 1.0 - FFN_PROBABILITY_FLOOR)
            return np.log(p) - np.log1p(-p)
        return unit_rows(proba)

    def candidate_coordinates(self, molecules: Sequence[Molecule]) -> np.ndarray:
        """Unit-norm fingerprint bits (``cosine``) or the 0/1 bits (``likelihood``), ndarray of shape
        (n_molecules, fp_size)."""
        bits = self._fingerprints(list(molecules))
        if _check_ffn_scoring(self.scoring) == "likelihood":
            return (np.asarray(bits) > 0).astype(np.float64)
        return unit_rows(bits)

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        _check_fitted(self, "net_")
        arrays = {f"net.{k}": v.detach().cpu().numpy().astype(np.float32)
                  for k, v in self.net_.state_dict().items()}
        metadata = {"params": self.get_params(), "n_train": self.n_train_, "best_epoch": self.best_epoch_,
                    "history": self.history_, "n_inputs": int(self.net_[0].in_features),
                    # the candidate side changes with the scoring; cosine's key stays what it was before it existed
                    "output": {**self._fp_metadata(),
                               **({} if self.scoring == "cosine" else {"scoring": self.scoring})}}
        return arrays, metadata

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "FingerprintFFN":
        import torch
        model = cls(**_state_params(cls, metadata))
        n_in = int(metadata.get("n_inputs", 0)) or int(math.ceil(model.max_mz / model.bin_width - 1e-9))
        net = _build_mlp(n_in, model.hidden, model.n_layers, model.fp_size, model.dropout)
        state = {k[len("net."):]: torch.from_numpy(np.asarray(v, dtype=np.float32))
                 for k, v in arrays.items() if k.startswith("net.")}
        try:
            net.load_state_dict(state)
        except RuntimeError as exc:
            raise ModelFileError(f"FingerprintFFN state: network weights do not match the parameters "
                                 f"({' '.join(str(exc).split())[:200]})") from exc
        net.eval()
        model.net_ = net
        model.n_train_ = int(metadata.get("n_train", 0))
        model.best_epoch_ = int(metadata.get("best_epoch", 0))
        model.history_ = list(metadata.get("history", []))
        return model


# ----------------------------------------------------------------------------------------------------------
# library-knn
# ----------------------------------------------------------------------------------------------------------

class LibraryKNN(_FingerprintMixin, Model):
    """Library search turned into a ranking: similarity-weighted mean fingerprint of the k nearest spectra.

    For an input x with kernel values k(x, x_i) to the training spectra, let N(x) be the ``k`` largest;
    the prediction is ``sum_{i in N(x)} w_i u(y_i) / sum w_i`` with ``w_i = max(k(x, x_i), 0) ** power`` and
    u(y) the unit-norm fingerprint of the training structure, then normalised to unit norm. Candidates are
    scored by cosine: their coordinates are their unit-norm fingerprints. When all k weights are zero the
    plain mean of the k fingerprints is used.

    Parameters
    ----------
    input_kernel : str
        An input-kernel spec from the registry (``ppk``, ``cosine``, ``ppk-losses:...``).
    k : int
        Number of neighbours.
    power : float
        Similarity exponent of the weights (0: plain mean).
    fingerprint, radius, fp_size, counts
        Fingerprint settings.
    block_size : int
        Inputs per kernel block (memory O(block_size * n_train)).

    Fitted attributes
    -----------------
    kernel_ : InputKernel fitted on the training inputs
    train_inputs_ : list of the training inputs (kept to save the model)
    structure_fingerprints_ : ndarray of shape (n_structures, fp_size), float64, unit rows
    structure_index_ : ndarray of shape (n_train,), int64
    """

    def __init__(self, input_kernel: str = "ppk", k: int = 10, power: float = 1.0, fingerprint: str = "morgan",
                 radius: int = 2, fp_size: int = 2048, counts: bool = False, block_size: int = 512) -> None:
        self.input_kernel = input_kernel
        self.k = k
        self.power = power
        self.fingerprint = fingerprint
        self.radius = radius
        self.fp_size = fp_size
        self.counts = counts
        self.block_size = block_size

    def _make_kernel(self):
        from molpredict.registry import create
        return create("input_kernel", self.input_kernel)

    def fit(self, inputs, molecules, val=None) -> "LibraryKNN":
        check_pairs(inputs, molecules)
        if self.k < 1:
            raise SpecError(f"library-knn: k must be >= 1, got {self.k}")
        inputs = list(inputs)
        distinct, index = distinct_objects(list(molecules), key=structure_key)
        self.kernel_ = self._make_kernel().fit(inputs)
        self.train_inputs_ = inputs
        self.structure_fingerprints_ = unit_rows(self._fingerprints(distinct))
        self.structure_index_ = index
        return self

    def neighbours(self, inputs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` most similar training inputs of each input.

        Returns
        -------
        index : ndarray of shape (n_inputs, k'), int64, with k' = min(k, n_train), most similar first
        similarity : ndarray of shape (n_inputs, k'), float64
        """
        _check_fitted(self, "kernel_")
        inputs = list(inputs)
        n_train = len(self.structure_index_)
        k = min(self.k, n_train)
        index = np.empty((len(inputs), k), dtype=np.int64)
        sims = np.empty((len(inputs), k), dtype=np.float64)
        for start in range(0, len(inputs), self.block_size):
            stop = min(start + self.block_size, len(inputs))
            kx = self.kernel_.transform(inputs[start:stop])
            top = np.argpartition(-kx, k - 1, axis=1)[:, :k] if k < n_train else np.tile(
                np.arange(n_train), (stop - start, 1))
            top_sims = np.take_along_axis(kx, top, axis=1)
            # Most similar first, ties by training index, so the neighbour list is deterministic.
            order = np.lexsort((top, -top_sims), axis=1)
            index[start:stop] = np.take_along_axis(top, order, axis=1)
            sims[start:stop] = np.take_along_axis(top_sims, order, axis=1)
        return index, sims

    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """Unit-norm weighted mean fingerprint of the neighbours, ndarray of shape (n_inputs, fp_size)."""
        index, sims = self.neighbours(inputs)
        weights = np.maximum(sims, 0.0) ** self.power if self.power else np.ones_like(sims)
        totals = weights.sum(axis=1, keepdims=True)
        weights = np.where(totals > 0, weights / np.where(totals > 0, totals, 1.0), 1.0 / sims.shape[1])
        fps = self.structure_fingerprints_[self.structure_index_[index]]  # (n_inputs, k, fp_size)
        return unit_rows(np.einsum("ik,ikd->id", weights, fps))

    def candidate_coordinates(self, molecules: Sequence[Molecule]) -> np.ndarray:
        """Unit-norm fingerprints, ndarray of shape (n_molecules, fp_size)."""
        return unit_rows(self._fingerprints(list(molecules)))

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        _check_fitted(self, "kernel_")
        from molpredict.io import spectra_to_arrays
        train_arrays, train_meta = spectra_to_arrays(self.train_inputs_)
        arrays = {f"train.{name}": value for name, value in train_arrays.items()}
        arrays["structure_fingerprints"] = self.structure_fingerprints_
        arrays["structure_index"] = self.structure_index_
        metadata = {"params": {**self.get_params(), "input_kernel": str(self.kernel_.to_spec())},
                    "n_train": len(self.train_inputs_), "train_spectra": train_meta,
                    "output": self._fp_metadata()}
        return arrays, metadata

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "LibraryKNN":
        from molpredict.io import spectra_from_arrays
        model = cls(**_state_params(cls, metadata))
        train = {name[len("train."):]: value for name, value in arrays.items() if name.startswith("train.")}
        model.train_inputs_ = spectra_from_arrays(train, metadata.get("train_spectra", {}))
        model.kernel_ = model._make_kernel().fit(model.train_inputs_)
        model.structure_fingerprints_ = np.asarray(_require(arrays, "structure_fingerprints", cls),
                                                   dtype=np.float64)
        model.structure_index_ = np.asarray(_require(arrays, "structure_index", cls), dtype=np.int64)
        return model
