"""A fingerprint likelihood head: per-bit probabilities of a candidate's fingerprint given the query.

Beside the output kernel regression (which scores a candidate by an inner product in the output feature space),
the head reads the same input features as a per-bit classifier, in the manner of CSI:FingerID (Duhrkop et al.,
PNAS 2015): a ridge regression from the whitened input features to the 0/1 bits of the training structures'
fingerprints, each bit's prediction turned into a probability by its own Platt scaling,
``p_b(x) = sigmoid(a_b yhat_b(x) + c_b)``. A candidate ``c`` with bits ``c_b`` is then scored by the
log-likelihood of its bits,

    sum_b c_b log p_b + (1 - c_b) log(1 - p_b)  =  sum_b c_b logit(p_b)  +  sum_b log(1 - p_b),

whose second sum is the same for every candidate of a query. So the head's score is linear in the candidate's
bits, ``c . l(x)`` with ``l(x) = logit p(x)``: the query side carries ``l(x)`` (scaled by the head's weight) and the
candidate side its bits, and the product with the model's own coordinates is one dot product
(:meth:`~molpredict.models.okr._OKRBase.predict_coordinates` appends ``weight * l(x)``,
:meth:`~molpredict.models.okr._OKRBase.candidate_coordinates` the bits).

Why it can add to the kernel model: the inner product weighs every bit by how strongly the regression predicts
it, the likelihood by how *reliably* it does (a bit predicted at 0.3 that is right 95% of the time when predicted
so gets a large logit; a rare bit never seen is a strong penalty on a candidate that has it). Offline, beside the
shipped positive model, it raised validation formula256 hit@1 by 1.5-2.2 points and left the real same-formula
sets level; through ``molpredict train``, with the ridge's lam chosen there too, validation kept it in both modes
(+0.0121 MRR over both kinds of sets positive, +0.0058 negative), and on test the spectrum evidence's formula256
hit@1 rose 38.0 -> 41.3 and hit@10 74.2 -> 79.5 (positive; negative 29.7 -> 32.3 and 70.7 -> 77.9)
(``docs/benchmarks/fingerprint_head.md``).

The Platt scalings are fitted on out-of-fold ridge predictions of the training spectra (folds by structure), so
the probabilities are those of structures the regression did not see; fitted on the validation spectra instead,
2,048 scalings from a few hundred structures veto every candidate with a bit that validation never showed. The
head's weight is chosen on the validation candidate sets.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["FINGERPRINT", "LOGIT_LIMIT", "platt_columns", "head_logits", "candidate_bits", "sparse_candidate_bits",
           "FingerprintHead"]

#: the fingerprint the head predicts: RDKit Morgan bits, radius 2, 2048 bits (what the output kernels read)
FINGERPRINT = {"kind": "morgan", "radius": 2, "size": 2048}
#: |logit| is capped: a bit whose Platt fit saw no positive on validation would otherwise veto a candidate alone
LOGIT_LIMIT = 20.0


def platt_columns(z: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, iterations: int = 30,
                  l2: float = 1e-3, block: int = 256, device: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """One Platt scaling per column: ``P(y[:, b] = 1) = sigmoid(a_b z[:, b] + c_b)``, by Newton's method.

    Parameters
    ----------
    z : ndarray of shape (n, k)
        Predictions (one column per bit).
    y : ndarray of shape (n, k)
        0/1 targets.
    weights : ndarray of shape (n,), optional
        Sample weights (e.g. one structure's spectra sharing one weight).
    iterations : int
    l2 : float
        Ridge on the slope (a column without variation keeps a finite slope).
    block : int
        Columns fitted together: each Newton step makes about ten (n, block) temporaries (the head's 15,000 x
        2,048 at once held about 2 GB).
    device : str or torch.device, optional
        Fit on torch on this device (float64, the same steps); None fits in numpy. On a GPU the head's 2,048
        scalings take well under a second where numpy takes about 15 s on 2 cores; on the CPU torch is slower
        than numpy (37 s), so training passes a device only when it is a GPU.

    Returns
    -------
    a, c : ndarrays of shape (k,), float64
        Slope and intercept on the original scale of ``z``.
    """
    z, y = np.asarray(z), np.asarray(y)
    w = np.ones(len(z)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = (w / w.sum() * len(z))[:, None]
    if device is None:
        def send(x: np.ndarray) -> np.ndarray:
            return np.asarray(x, dtype=np.float64)

        def back(x: np.ndarray) -> np.ndarray:
            return x
    else:  # the same steps on torch, ``block`` columns sent to the device at a time
        import torch

        device = torch.device(device)

        def send(x: np.ndarray) -> "torch.Tensor":
            return torch.as_tensor(np.asarray(x, dtype=np.float64), device=device)

        def back(x: "torch.Tensor") -> np.ndarray:
            return x.cpu().numpy()
    w = send(w)
    a, c = np.empty(z.shape[1]), np.empty(z.shape[1])
    for start in range(0, z.shape[1], block):
        part = slice(start, start + block)
        a_part, c_part = _platt_block(send(z[:, part]), send(y[:, part]), w, iterations, l2)
        a[part], c[part] = back(a_part), back(c_part)
    return a, c


def _platt_block(z: np.ndarray, y: np.ndarray, w: np.ndarray, iterations: int, l2: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`platt_columns` on columns ``z`` (n, b) with targets ``y`` and normalised weights ``w`` (n, 1).

    The arrays are numpy arrays or torch tensors (all of one kind): the steps are written in operators both share,
    with the two functions that differ (square root, clipped exponential) looked up once."""
    on_torch = not isinstance(z, np.ndarray)
    if on_torch:
        import torch

        sqrt, logistic_of_clipped = torch.sqrt, (lambda t: torch.sigmoid(torch.clamp(t, -50.0, 50.0)))
        a, c = torch.ones_like(z[0]), torch.zeros_like(z[0])
    else:
        sqrt, logistic_of_clipped = np.sqrt, (lambda t: 1.0 / (1.0 + np.exp(-np.clip(t, -50.0, 50.0))))
        a, c = np.ones(z.shape[1]), np.zeros(z.shape[1])
    mu = (w * z).sum(0) / w.sum()
    sd = sqrt((w * (z - mu) ** 2).sum(0) / w.sum()) + 1e-12
    zs = (z - mu) / sd  # standardised: one Newton step size fits every column
    for _ in range(iterations):
        q = logistic_of_clipped(a * zs + c)
        h = w * q * (1.0 - q) + 1e-12
        r = w * (q - y)
        g_a, g_c = (r * zs).sum(0) + l2 * a, r.sum(0) + l2 * c
        h_aa, h_ac, h_cc = (h * zs * zs).sum(0) + l2, (h * zs).sum(0), h.sum(0) + l2
        det = h_aa * h_cc - h_ac ** 2
        a = a - (h_cc * g_a - h_ac * g_c) / det
        c = c - (h_aa * g_c - h_ac * g_a) / det
    return a / sd, c - a * mu / sd


def head_logits(predictions: np.ndarray, slope: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """``l = clip(a yhat + c, -LOGIT_LIMIT, LOGIT_LIMIT)``, the log-odds of each bit, shape of ``predictions``."""
    return np.clip(predictions * slope + intercept, -LOGIT_LIMIT, LOGIT_LIMIT)


def candidate_bits(molecules: Sequence[Any], fingerprint: dict[str, Any] | None = None) -> np.ndarray:
    """The head's fingerprint bits of each molecule, shape (n, size), float64 0/1."""
    from molpredict.chem.molecules import fingerprint_matrix

    spec = dict(FINGERPRINT if fingerprint is None else fingerprint)
    bits = fingerprint_matrix(list(molecules), spec["kind"], radius=int(spec["radius"]), size=int(spec["size"]))
    return (np.asarray(bits) > 0).astype(np.float64)


def sparse_candidate_bits(molecules: Sequence[Any], fingerprint: dict[str, Any] | None = None,
                          chunk: int = 20000) -> "sp.csr_matrix":
    """:func:`candidate_bits` as a sparse matrix, shape (n, size), float32 0/1, built ``chunk`` molecules at a time.

    A Morgan fingerprint sets a few dozen of its 2,048 bits: the bits of training's validation candidates (val_pos:
    289,238 distinct structures) peak at 0.48 GB so, where the dense float64 matrix and its float32 copy peaked at
    6.8 GB."""
    import scipy.sparse as sp

    molecules = list(molecules)
    parts = [sp.csr_matrix(candidate_bits(molecules[start:start + chunk], fingerprint), dtype=np.float32)
             for start in range(0, len(molecules), chunk)]
    size = int(dict(FINGERPRINT if fingerprint is None else fingerprint)["size"])
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, size), dtype=np.float32)


class FingerprintHead:
    """A fitted fingerprint likelihood head (see the module docstring).

    Parameters
    ----------
    map : ndarray of shape (n'_x, size)
        From the model's input kernel rows (against its input landmarks) to the ridge's bit predictions.
    slope, intercept : ndarrays of shape (size,)
        The per-bit Platt scalings.
    weight : float
        The head's weight beside the model's own score.
    fingerprint : dict
        :data:`FINGERPRINT`'s keys.
    lam : float
        The ridge's regularisation (recorded).
    bit_scale : float
        The candidate side holds ``bit_scale * bits`` and the query side ``weight * l(x) / bit_scale`` (the
        product is unchanged): a coordinate store quantises each row by its largest value, which the model's own
        coordinates set when the bits are scaled below them.
    """

    def __init__(self, map: np.ndarray, slope: np.ndarray, intercept: np.ndarray, weight: float,
                 fingerprint: dict[str, Any] | None = None, lam: float = float("nan"), bit_scale: float = 1.0
                 ) -> None:
        self.map = np.asarray(map, dtype=np.float64)
        self.slope = np.asarray(slope, dtype=np.float64)
        self.intercept = np.asarray(intercept, dtype=np.float64)
        self.weight = float(weight)
        self.fingerprint = dict(FINGERPRINT if fingerprint is None else fingerprint)
        self.lam = float(lam)
        self.bit_scale = float(bit_scale)
        if not self.bit_scale > 0:
            raise ValueError(f"fingerprint head: bit_scale must be positive, got {bit_scale!r}")
        size = int(self.fingerprint["size"])
        if self.map.ndim != 2 or self.map.shape[1] != size or self.slope.shape != (size,) \
                or self.intercept.shape != (size,):
            raise ValueError(f"fingerprint head: map {self.map.shape}, slope {self.slope.shape} and intercept "
                             f"{self.intercept.shape} do not match {size} bits")

    @property
    def size(self) -> int:
        return int(self.fingerprint["size"])

    def query_side(self, kernel_rows: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
        """``weight * l(x)`` for kernel rows (n, n'_x): the query's half of the head's score, (n, size)."""
        rows = np.asarray(kernel_rows)
        M = self._map_as(np.dtype(dtype))
        logits = head_logits(rows.astype(M.dtype, copy=False) @ M, self.slope, self.intercept)
        return (self.weight / self.bit_scale * logits).astype(dtype, copy=False)

    def _map_as(self, dtype: np.dtype) -> np.ndarray:
        """The map in ``dtype``, converted once (identify predicts in float32, block after block)."""
        if dtype == self.map.dtype:
            return self.map
        cache = self.__dict__.setdefault("_maps", {})
        if dtype not in cache:
            cache[dtype] = np.ascontiguousarray(self.map, dtype=dtype)
        return cache[dtype]

    def candidate_side(self, molecules: Sequence[Any]) -> np.ndarray:
        """``bit_scale`` times the candidates' bits, (n, size): the candidate's half of the head's score."""
        return self.bit_scale * candidate_bits(molecules, self.fingerprint)

    def candidate_spec(self) -> dict[str, Any]:
        """What determines :meth:`candidate_side` (a coordinates store's key must change with it)."""
        return {"fingerprint": dict(self.fingerprint), "bit_scale": self.bit_scale}

    # -- state ----------------------------------------------------------------------------------------------
    def get_state(self, prefix: str = "head") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {f"{prefix}.map": self.map, f"{prefix}.slope": self.slope, f"{prefix}.intercept": self.intercept}
        return arrays, {"fingerprint": dict(self.fingerprint), "weight": self.weight, "lam": self.lam,
                        "bit_scale": self.bit_scale}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any], prefix: str = "head"
                   ) -> "FingerprintHead":
        return cls(arrays[f"{prefix}.map"], arrays[f"{prefix}.slope"], arrays[f"{prefix}.intercept"],
                   metadata["weight"], metadata.get("fingerprint"), metadata.get("lam", float("nan")),
                   metadata.get("bit_scale", 1.0))
