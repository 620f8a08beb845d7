"""IOKR, SIOKR, ISOKR and SISOKR: closed-form (sketched) input-output kernel regression on torch.

One engine, :class:`_OKRBase`, with an input sketch R_x (m_x x n) and an output sketch R_y (m_y x n) that may
each be the identity; the four public classes only change the defaults.

The method (El Ahmad et al., AISTATS 2024, and ``docs/METHOD.md``)
-----------------------------------------------------------------
With K~_x = R_x K_x R_x^T, K~_y = R_y K_y R_y^T, the surrogate h(x) = sum_i alpha_i(x) psi_y(y_i) has
alpha(x) = R_y^T Omega R_x k_x^x,
    Omega = K~_y^+ R_y K_y K_x R_x^T (R_x K_x^2 R_x^T + n lam K~_x)^+          (m_y x m_x).
Only B_x = R_x K_x (m_x x n) and B_y = R_y K_y (m_y x n) are needed. The engine evaluates Omega in the
equivalent, numerically stable whitened form:

- K~_x = V S V^T (eigenvalues below ``pinv_rtol`` x the largest dropped), P_x = S^-1/2 V^T (r_x x m_x), and the
  Nystrom features of the training inputs Z_x = P_x B_x (r_x x n). Because K~_x's null space is also that of
  R_x K_x^2 R_x^T, (R_x K_x^2 R_x^T + n lam K~_x)^+ = P_x^T (Z_x Z_x^T + n lam I)^-1 P_x exactly.
- Likewise K~_y = U T U^T, P_y = T^-1/2 U^T, Z_y = P_y B_y, and K~_y^+ B_y = P_y^T Z_y.
- So Omega = P_y^T  Z_y Z_x^T (Z_x Z_x^T + n lam I)^-1  P_x: a ridge regression from whitened input features
  to whitened output features, solved for a whole lam grid with one eigendecomposition of Z_x Z_x^T.
  Whitening before squaring (Z_x Z_x^T rather than P_x B_x B_x^T P_x^T) keeps the weak directions accurate.
- Without an input sketch (IOKR, ISOKR) the input part is exact ridge regression: one Cholesky factorisation of
  K_x + n lam I per lam (it is also what the formula gives: K_x (K_x^2 + n lam K_x)^+ = (K_x + n lam I)^-1 on
  the range of K_x). A Cholesky factorisation is a sequence of GEMMs and parallelises well; an n x n eigh does
  not, which matters at n = 12,000 on shared cores.
- Without an output sketch (IOKR, SIOKR) K~_y^+ K_y is the orthogonal projector onto range(K_u), which leaves
  every k_y^c unchanged (k_y^c = Phi_u phi(c) lies in that range): it is left out, so no eigendecomposition of
  K_u is needed and the coordinates are plain coefficients over the distinct training outputs.

Distinct outputs
----------------
Training labels repeat (many spectra per structure). With y_i = u_{idx[i]} for the n_u distinct molecules u
(by InChIKey), K_y = E K_u E^T (E the n x n_u indicator of idx). The output sketch R_u (m_y x n_u) is drawn
on the distinct molecules. It stands for any R_y (m_y x n) with R_y E = R_u (e.g. R_u acting on the first
occurrence of each molecule, zero columns elsewhere), for which the naive n-output formulas give exactly
K~_y = R_u K_u R_u^T and B_y = R_y E K_u E^T = (R_u K_u)[:, idx]; so Z_y = Z_u[:, idx] and
Z_y Z_x^T = Z_u (Z_x E)^T, with Z_x E the per-molecule column sums of Z_x. Without an output sketch the naive
R_y = I_n (K_y singular) and R_u = I_{n_u} project onto the same range, hence give the same scores. The tests
check both against the naive n x n forms.

Decoding as a dot product
-------------------------
score(x, c) = k_y^c^T alpha(x) = [R_y k_y^c] . [Omega R_x k_x^x], so

- ``candidate_coordinates(c)`` = K_y(c, output landmarks) A_y^T   (the m_y rows of R_y K_y(train, c));
- ``predict_coordinates(x)``   = K_x(x, input landmarks) W,  W = A_x^T Omega^T   (n'_x x m_y),

where landmarks are the training objects the sketch touches (``used_``): only those are kept.

Selecting lam and kernel parameters
-----------------------------------
The validation loss is the kernel loss ||h(x) - psi_y(y)||^2 (no decoding), from the core coordinates: with an
output sketch, h(x) = sum_j g_j(x) e_j in the orthonormal basis e = P_y R_y Psi_y, so the loss is
||g||^2 - 2 g . psi~(y) + k_y(y, y) with psi~(y) = P_y R_y k_y^y; without one, h(x) = sum_u c_u(x) psi_y(u) and
the loss is c^T K_u c - 2 c . k_u^y + k_y(y, y). Every combination of the
input-kernel grid, output-kernel grid and lam grid is scored. With ``val=None`` and more than one grid point, a
seeded fraction ``val_fraction`` of the *structures* is held out to choose, then the model is refitted on all
data with the chosen point. (Losses under different output kernels live in different spaces; comparing them is
the usual, imperfect practice.)
"""
from __future__ import annotations

import contextlib
import math
import re
import time
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.component import frozen_spec
from molpredict.engine.device import resolve_device, resolve_dtype
from molpredict.errors import InputError, ModelFileError, MolpredictError, ResourceError, SpecError
from molpredict.lazy import lazy_module
from molpredict.registry import create, get_registry
from molpredict.engine.linalg import symmetric_eigh
from molpredict.engine.nystrom import LazyLandmarks, Nystrom, objects_from_state, objects_to_state
from molpredict.kernels.base import Kernel, StateNotSaveable
from molpredict.engine.sketches import Sketch, make_sketch
from molpredict.specs import ComponentSpec, Grid, parse_spec, parse_values
from molpredict.models.base import Model, check_pairs
from molpredict.models.distinct import distinct_positions, group_size_weights, split_by_structure
from molpredict.models.fingerprint_head import FingerprintHead

torch = lazy_module("torch")  # fitting and GPU paths only: not imported to predict

__all__ = ["IOKR", "SIOKR", "ISOKR", "SISOKR"]

STATE_FORMAT = "molpredict.okr"
#: 2: landmarks written by molpredict.engine.nystrom.objects_to_state (arrays ``prefix.*``); 1 (``prefix_*``)
#: still reads
STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: metadata key (and array prefix) of the fitted kernels' state; optional, so version-2 readers without it still load
#: such a file (refitting the kernels as before)
FITTED_KERNELS = "fitted_kernels"
#: The defaults (the constructors' and so ``molpredict train``'s), chosen on the shared MassBank data (train_pos,
#: selection and scoring on val_pos with the val_formula256 candidate sets; hit@1 of the variants, all SISOKR
#: with lam chosen by validation kernel loss): ppk / m_y=1000: 19.9%; ppk / m_y=2000: 25.7%; ppk, no output
#: sketch (SIOKR, d=4669): 26.9%; ppk-losses / m_y=1000: 23.5%; count fingerprints / m_y=1000: 19.4%. So: 4000
#: sub-sampled input landmarks (the most the default 4 GB budget allows at ~47k spectra) and 2000 output
#: landmarks (near the un-sketched accuracy, at half its candidate-coordinate size).
#: Kernels (issue 12 ablation, docs/benchmarks/evidence_ablation.md; lam by validation MRR, val_formula256 hit@1 /
#: hit@10 / MRR): at m_x 2000 / m_y 1000, ppk-losses with Gaussian-Tanimoto 23.5 / 59.8 / 0.360; every input
#: kernel alone or combined is within a point of it (formula-annotation 23.8 / 61.3 / 0.363, mkl of both uniform
#: 23.6 / 60.5 / 0.361, alignment and ALIGNF weights the same); the plain Tanimoto output kernel 24.9 / 60.6 /
#: 0.373; both, mkl(ppk-losses + formula-annotation) with Tanimoto, 25.5 / 61.7 / 0.379. At these sizes, positive
#: mode: ppk-losses / Gaussian-Tanimoto 30.8 / 65.5 / 0.430, the default below 32.9 / 66.1 / 0.445 (fit 409 s
#: on 2 shared cores, the formula bags of 47k spectra take 5 CPU s); negative mode 36.8 / 75.0 / 0.505 and
#: 38.3 / 75.5 / 0.516.
#: The mass differences between fragments (``ppk-pairs``, issue 19 round four, docs/benchmarks/
#: spectrum_terms_refused.md) joined the sum after validation through the whole pipeline (`molpredict train` as
#: `make demo`, val_formula256 + val_formula, spectrum alone / fused hit@1): positive 54.6 -> 56.6 / 55.8 -> 57.4,
#: negative 54.7 -> 55.3 / 57.2 -> 57.7, for +0.11 ms of kernel rows per spectrum. On test (docs/benchmarks/
#: evidence.md, formula256 hit@1): spectrum evidence positive 36.0 -> 38.0, negative 29.5 -> 29.9.
DEFAULT_INPUT_KERNEL = "mkl:kernels=ppk-losses+formula-annotation+ppk-pairs,weights=uniform"
DEFAULT_OUTPUT_KERNEL = "tanimoto"
#: Input landmarks drawn uniformly over the training spectra. Spreading them over the structures
#: (``subsample:m=4000,probs=groups``, a uniform draw covers ~2,130 of train_pos's 4,669) raised the spectrum model's
#: MRR on val_formula256's held-out part (positive fine-tuned 0.482 -> 0.487, negative ridge 0.545 -> 0.563) but not
#: the product's validation figures over all val sets (negative spectrum MRR 0.676 -> 0.670, fused out of fold 0.700 ->
#: 0.697; positive fused 0.678 -> 0.674): an option, not the default (docs/benchmarks/input_landmarks.md).
DEFAULT_INPUT_SKETCH = "subsample:m=4000"
#: Output landmarks (issue 19): 5000, i.e. every distinct training structure of MassBank's train_pos (4,669) and
#: train_neg (3,225), which makes the output side exact there. Val (benchmarks/dsokr.py --split val --only sisokr,
#: eval part, formula256; docs/benchmarks/output_landmarks.md), hit@1 / hit@10 / MRR: positive (fine-tuned) 36.0 /
#: 67.0 / 0.479 at 2000 -> 35.3 / 69.9 / 0.482; negative (ridge) 41.5 / 76.8 / 0.543 -> 41.5 / 77.8 / 0.545: the
#: selection metric, MRR, rises in both modes. Its cost: train_pos with validation 402 -> 519 s wall on 2 cores
#: (docs/benchmarks/train_speed_output_landmarks.md) and candidate coordinates of 4,669 values instead of 2,000,
#: which identification affords since its products run in float32 (:data:`~molpredict.identification.scoring.
#: SCORING_DTYPE`; 674 spectra/s warm, docs/benchmarks/identify_speed_output_landmarks.json).
DEFAULT_OUTPUT_SKETCH = "subsample:m=5000"
DEFAULT_LAM = "1e-5|1e-4|1e-3|1e-2"
#: SISOKR's ridge weights each training spectrum by its structure's spectrum count to this power, negated
#: (:func:`ridge_structure_weights`; 0: the plain ridge)
DEFAULT_STRUCTURE_BALANCE = 0.0
#: SISOKR's ranking fine-tune (:mod:`molpredict.models.ranking_finetune`): at most this many epochs, stopped on the
#: validation ranking metric; it runs only when ``fit`` gets validation candidate sets (0: the ridge solution)
DEFAULT_RANK_EPOCHS = 3
DEFAULT_RANK_LR = 3e-4
#: ... and keeps the tuned map only if it ranks validation at least this much better (MRR, or hit@K as a fraction).
#: Training on train_neg with all of val_neg, the best check gained 0.0013 MRR (train_pos / val_pos: 0.025); on
#: held-out val_neg structures the tuned map ranked worse than the ridge (hit@1 -0.8; val_pos +3.5), see
#: docs/benchmarks/ranking_finetune.md
DEFAULT_RANK_MIN_GAIN = 0.005
#: SISOKR's fingerprint likelihood head (:mod:`molpredict.models.fingerprint_head`), on by default: fitted when
#: ``fit`` gets validation candidate sets and kept only when it ranks them better (its weight chosen there, 0 drops
#: it). Trained through `molpredict train` with its lam chosen there too, it gained 0.0121 validation MRR over both
#: kinds of sets in positive mode and 0.0058 in negative mode, both kept; on test, the spectrum evidence's formula256
#: hit@1 38.0 -> 41.3 positive and 29.7 -> 32.3 negative (docs/benchmarks/evidence.md). (An end-to-end check that once
#: failed with it assumed the learnt-ranker fusion never ranks validation below the spectrum alone in-sample; that
#: holds only for the weight grid: the ranker is fitted by likelihood and chosen out of fold.)
DEFAULT_FINGERPRINT_HEAD = True
#: the head's ridge, on the same whitened input features as the model (the regularisation is n * lam): by default
#: each of these is tried and validation chooses, with the head's weight (``head_lam=X`` fixes one). Offline on
#: val_pos 1e-5 beat 1e-4 and 1e-3 by far, at the grid's edge, so the grid reaches below it; through a training
#: positive mode chose 3e-6 and negative 1e-6, again the edge, hence 3e-7: docs/benchmarks/fingerprint_head.md
DEFAULT_HEAD_LAMS = (3e-7, 1e-6, 3e-6, 1e-5)
#: the head's weights tried on validation, in units of the typical ratio of the two scores' spreads within a set
HEAD_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
#: the candidate bits are stored scaled by this (the query side by its inverse): coordinate stores quantise a row
#: by its largest value, and Tanimoto coordinates rarely exceed 0.3, so 0/1 bits would coarsen every row
HEAD_BIT_SCALE = 0.125
#: Text -> molecule (pairs tables such as ChEBI-20): TF-IDF word 1-2-grams (no extra package; ``text-embedding``
#: needs ``pip install molpredict[text]``), the text output kernel of :data:`molpredict.models.base.TEXT_OUTPUT_KERNEL`,
#: and no sketch below the spectra defaults' sizes (a few thousand pairs fit exactly in seconds): the input side
#: is sub-sampled to 4000 landmarks only beyond 4000 pairs, the output side to 2000 beyond 2000 structures (which
#: also bounds the candidate coordinates at 2000 numbers per library molecule).
TEXT_INPUT_KERNEL = "text-ngram"
TEXT_INPUT_LANDMARKS = 4000
TEXT_OUTPUT_LANDMARKS = 2000
#: bytes of kernel rows per block in predict_coordinates / candidate_coordinates
_BLOCK_BYTES = 128 * 2**20


# ----------------------------------------------------------------------------------------------------------
# pure helpers
# ----------------------------------------------------------------------------------------------------------

def lam_grid(lam: "float | str | Sequence[float]") -> list[float]:
    """The regularisation values named by ``lam``: a number, ``"1e-4"`` or a grid ``"1e-6|1e-4"``."""
    if isinstance(lam, str):
        parsed = parse_values(lam)
        values = list(parsed.values) if isinstance(parsed, Grid) else [parsed]
    elif isinstance(lam, (list, tuple)):
        values = list(lam)
    else:
        values = [lam]
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
            raise SpecError(f"lam must be positive numbers (a value or a grid a|b|c), got {lam!r}")
        out.append(float(v))
    return out


def gram_rows(Z: torch.Tensor, weights: torch.Tensor | None = None, block: int = 8192) -> torch.Tensor:
    """Z Z^T for a wide Z (r x n), or Z diag(weights) Z^T; on the CPU through BLAS syrk (half the flops of a GEMM).
    Weighted, the columns are scaled by sqrt(weights) ``block`` at a time (no second r x n matrix)."""
    if weights is not None:
        root = torch.sqrt(weights.to(Z.dtype))
        out = torch.zeros((Z.shape[0], Z.shape[0]), dtype=Z.dtype, device=Z.device)
        for start in range(0, Z.shape[1], block):
            out += gram_rows(Z[:, start:start + block] * root[None, start:start + block])
        return out
    if Z.device.type == "cpu" and Z.dtype in (torch.float64, torch.float32) and Z.shape[1] > 0:
        from scipy.linalg import blas
        syrk = blas.dsyrk if Z.dtype == torch.float64 else blas.ssyrk
        a = Z.contiguous().numpy()
        upper = torch.from_numpy(np.ascontiguousarray(syrk(1.0, a.T, trans=1)))
        return torch.triu(upper) + torch.triu(upper, 1).T
    return Z @ Z.T


def _to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(array), dtype=dtype, device=device)


def _group_sum(Z: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Column sums of Z (r x n) per group: (r x n_groups)."""
    out = torch.zeros((Z.shape[0], n_groups), dtype=Z.dtype, device=Z.device)
    return out.index_add_(1, index, Z)


def ridge_structure_weights(index: np.ndarray, balance: float) -> np.ndarray:
    """The square loss's weight of each distinct output's training objects: ``count^-balance``
    (:func:`~molpredict.models.distinct.group_size_weights`), scaled so that the n objects' weights average 1
    (0: every object once, the plain ridge; 1: every structure once).

    Parameters
    ----------
    index : ndarray of shape (n,), int
        The distinct output of each training object.
    balance : float
        In [0, 1].

    Returns
    -------
    ndarray of shape (n_distinct,), float64
    """
    per_object = group_size_weights(index, balance)
    out = np.zeros(int(np.max(index)) + 1, dtype=np.float64)
    out[np.asarray(index, dtype=np.int64)] = per_object * (len(per_object) / float(per_object.sum()))
    return out


#: up to this many inputs, the prediction's product runs on one BLAS thread: it reads W once either way, and
#: starting and spinning BLAS threads cost a short run 0.1 s of CPU (the product splits rows and columns, never the
#: sum, between threads: the values are the same)
_FEW_ROWS = 32


@contextlib.contextmanager
def _one_blas_thread(active: bool):
    if not active:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        yield


@contextlib.contextmanager
def _one_torch_thread(device: torch.device):
    """torch on one CPU thread: for many small products, where its OpenMP threads cost more than they give
    (ranking 862 validation sets of 256 candidates x 2000 coordinates: 0.23 s on one thread, 3.7 s on two)."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _rows_per_block(width: int) -> int:
    return max(1, min(8192, _BLOCK_BYTES // (8 * max(1, width))))


def _sparse_to_arrays(A: sp.csr_matrix, prefix: str) -> dict[str, np.ndarray]:
    A = sp.csr_matrix(A)
    return {f"{prefix}_data": A.data.astype(np.float64), f"{prefix}_indices": A.indices.astype(np.int64),
            f"{prefix}_indptr": A.indptr.astype(np.int64),
            f"{prefix}_shape": np.asarray(A.shape, dtype=np.int64)}


def _sparse_from_arrays(arrays: dict[str, np.ndarray], prefix: str) -> sp.csr_matrix:
    try:
        shape = tuple(int(v) for v in arrays[f"{prefix}_shape"])
        return sp.csr_matrix((np.asarray(arrays[f"{prefix}_data"], dtype=np.float64),
                              np.asarray(arrays[f"{prefix}_indices"]), np.asarray(arrays[f"{prefix}_indptr"])),
                             shape=shape)
    except (KeyError, ValueError) as exc:
        raise ModelFileError(f"model state: sparse array {prefix!r} is missing or inconsistent ({exc})") from None


# ----------------------------------------------------------------------------------------------------------
# one side of the regression (inputs or distinct outputs), whitened
# ----------------------------------------------------------------------------------------------------------

class _Profile:
    """Wall time per stage and per dense product (shapes, for GFLOP/s), filled while fitting.

    Stages do not nest; a stage met again (one per grid point) accumulates. Exposed as ``profile_``.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stages: dict[str, float] = {}
        self.products: list[dict[str, Any]] = []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stage(self, name: str, shape: tuple[int, int, int] | None = None, kind: str = "gemm"):
        profile = self

        class _Clock:
            def __enter__(self):
                profile._sync()
                self.start = time.perf_counter()
                return self

            def __exit__(self, *exc):
                profile._sync()
                seconds = time.perf_counter() - self.start
                profile.stages[name] = profile.stages.get(name, 0.0) + seconds
                if shape is not None:
                    profile.products.append({"name": name, "kind": kind, "shape": list(shape),
                                             "seconds": seconds})
                return False
        return _Clock()


def _exact_side(kind: str, spec: Any, objects: list[Any], profile: _Profile) -> tuple[str, Any, np.ndarray, Sketch]:
    """An un-sketched side: the kernel fitted on ``objects`` and its Gram matrix; returns (resolved spec, kernel,
    K (n x n), the identity sketch). Every object is a landmark; the kernel rebuilt from the resolved spec on them
    (what a reloaded model does) is this one."""
    side = kind.split("_")[0]
    with profile.stage(f"{side}_kernel_fit"):
        kernel = create(kind, spec).fit(objects)
    sketch = make_sketch(None).fit(len(objects))
    with profile.stage(f"{side}_sketch_rows"):
        K = sketch.sketch_rows(kernel)  # (n, n)
    return str(frozen_spec(kernel)), kernel, K, sketch


def _nystrom_side(kind: str, spec: Any, sketch_spec: Any, seed: int, objects: list[Any], device: torch.device,
                  dtype: torch.dtype, rtol: float, profile: _Profile, keep_rows: bool = False,
                  groups: np.ndarray | None = None) -> Nystrom:
    """A sketched side: the whitened Nystrom map (P = D^-1/2 U^T, Z = P R K on the device; with ``keep_rows``
    R K instead of Z), timed in ``profile``; ``groups`` (a label per object) go to the sketch's draw."""
    side = kind.split("_")[0]

    def stage(name: str, *args: Any, **kwargs: Any) -> Any:
        return profile.stage(f"{side}_{name}", *args, **kwargs)

    return Nystrom(spec, sketch_spec, rtol, seed=seed, kernel_kind=kind, keep_rows=keep_rows).fit(
        objects, device, dtype, stage, groups=groups)


class _OutputSide:
    """The distinct training outputs: a sketched side is whitened (core coordinates g = Z_u beta in R^r_y),
    an un-sketched side keeps K_u (core coordinates = the coefficients beta over the distinct outputs).

    ``beta`` (n_u x k) are always coefficients over the distinct outputs, i.e. E^T alpha.
    """

    def __init__(self, spec: Any, sketch_spec: Any, seed: int, objects: list[Any], device: torch.device,
                 dtype: torch.dtype, rtol: float, profile: _Profile) -> None:
        self.spec = spec
        self.device, self.dtype = device, dtype
        if make_sketch(sketch_spec).is_identity:
            # R_y = I: K~_y^+ K_y is the projector on range(K_u), which fixes every k_y^c; it is left out
            self.resolved_spec, self.kernel, K, self.sketch = _exact_side("output_kernel", spec, objects, profile)
            self.landmarks = objects
            self.K = _to_device(K, device, dtype)  # (n_u, n_u)
            self.Zu = self.P = None
            self.rank = int(K.shape[0])
        else:
            side = _nystrom_side("output_kernel", spec, sketch_spec, seed, objects, device, dtype, rtol, profile)
            self.resolved_spec, self.kernel, self.sketch = side.kernel_spec_, side.kernel_, side.sketch_
            self.landmarks = side.landmarks_
            self.P, self.Zu = side.whitening_, side.train_features_
            self.K = None
            self.rank = side.rank_

    @property
    def identity(self) -> bool:
        return bool(self.sketch.is_identity)

    def core(self, beta: torch.Tensor) -> torch.Tensor:
        """Core coordinates of h for coefficients ``beta`` (n_u x k) over the distinct outputs."""
        return beta if self.Zu is None else self.Zu @ beta

    def prepare_val(self, molecules: list[Any]) -> None:
        K = self.kernel.transform(molecules).T  # (n', n_val)
        if self.P is None:
            self.val_cross = _to_device(K, self.device, self.dtype)  # K_u(., y): coefficients pair with it
        else:
            self.val_cross = self.P @ _to_device(self.sketch.apply(K), self.device, self.dtype)  # psi~(y)
        self.val_diag = torch.as_tensor(self.kernel.diagonal(molecules), dtype=torch.float64, device=self.device)

    def val_loss(self, core: torch.Tensor) -> float:
        """Mean ||h(x) - psi(y)||^2 over the validation pairs, from the core coordinates (d_core x n_val)."""
        gram = core if self.K is None else self.K @ core  # whitened: the basis is orthonormal in H_y
        per = ((core * gram).sum(0) - 2.0 * (core * self.val_cross).sum(0)).to(torch.float64) + self.val_diag
        return float(per.mean())

    def to_coordinates(self) -> torch.Tensor | None:
        """The map from core coordinates to model coordinates (coefficients over R_y rows): P_y (r_y x m_y),
        or None for the identity."""
        return self.P

    def prepare_candidates(self, molecules: list[Any]) -> None:
        """The validation candidates' sketched kernel rows, one row per candidate, float32: ``R_y k_y(c)``
        (n_candidates x m_y) for a sketched side, ``k_u(c)`` (n_candidates x n_u) for an exact one. They only
        rank, and 100k candidates x 2000 columns in float64 would take 1.6 GB.

        The whitening ``P_y`` is applied on the query side in :meth:`val_ranking` (``(P_y^T g)^T R_y k_y(c)``
        equals ``g^T psi~(c)``): n_val x m_y x d_core products per grid point instead of n_candidates x m_y x
        d_core once, and rows that a candidate set gathers contiguously.
        """
        parts = []
        step = _rows_per_block(len(self.landmarks))
        for start in range(0, len(molecules), step):
            K = self.kernel.transform(molecules[start:start + step])  # (b, n')
            rows = K if self.P is None else self.sketch.apply(K.T).T  # (b, m_y): R_y k_y(c), transposed
            parts.append(torch.as_tensor(np.asarray(rows, dtype=np.float32), device=self.device))
        self.candidate_rows = torch.cat(parts, dim=0)  # (n_candidates, m_y or n_u)

    def val_ranking(self, core: torch.Tensor, candidates: Any, metric: str, return_scores: bool = False
                    ) -> float | tuple[float, np.ndarray]:
        """The ranking ``metric`` (mrr, hit@k) of the validation queries' true structures in their candidate sets,
        from the core coordinates (d_core x n_val), ties counted against the truth (its ``ranked`` sets only); with
        ``return_scores``, also the scores of every set, flat in the order of ``candidates.flat()``."""
        queries = (core if self.P is None else self.P.T @ core).T.to(torch.float32).contiguous()  # (n_val, m)
        device = queries.device

        def block(positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
            return (queries.index_select(0, torch.as_tensor(positions, device=device))
                    @ self.candidate_rows.index_select(0, torch.as_tensor(ids, device=device)).T
                    ).to(torch.float64).cpu().numpy()

        with _one_torch_thread(device):
            scores = _scores_in_sets(candidates, block)
        value = candidates.ranked_metrics(scores)[metric]
        return (value, scores) if return_scores else value

    def release_val(self) -> None:
        self.val_cross = self.val_diag = None
        self.__dict__.pop("candidate_rows", None)


def _all_molecules(objects: Sequence[Any]) -> bool:
    """Whether the outputs are molecule records (the fingerprint head reads their fingerprints)."""
    from molpredict.chem.molecules import Molecule
    return all(isinstance(o, Molecule) for o in objects)


def _scores_in_sets(candidates: Any, block: Any) -> np.ndarray:
    """The score of every candidate of every validation set, flat in the order of ``candidates.flat()``.

    ``block(positions, ids)`` scores the queries at ``positions`` against the molecules ``ids``: an ndarray of
    shape (len(positions), len(ids)). The queries that share a set (one structure's spectra) are scored in one
    call."""
    offsets, flat, _ = candidates.flat()
    scores = np.empty(len(flat), dtype=np.float64)
    by_set: dict[bytes, list[int]] = {}
    for i, ids in enumerate(candidates.sets):
        by_set.setdefault(ids.tobytes(), []).append(i)
    for members in by_set.values():
        rows = block(candidates.positions[members], candidates.sets[members[0]])
        for row, i in enumerate(members):
            scores[offsets[i]:offsets[i + 1]] = rows[row]
    return scores


#: folds (by structure) and training spectra sampled for the fingerprint head's Platt scalings
HEAD_FOLDS, HEAD_PLATT_SAMPLE = 3, 15000
#: training rows per block in the head's out-of-fold sums (float64 rows of the whitened features: ~130 MB a block)
HEAD_ROW_BLOCK = 4096
#: the head's ridge reads the whitened input coordinates whose Nystrom eigenvalue is at least this fraction of the
#: largest: at the model's own cut-off (``pinv_rtol`` 1e-10, rank 3,976 of 4,000 on train_pos) the three extra
#: near-null directions halved the head's offline gain (val formula256 MRR beside the model +0.023 -> +0.012)
HEAD_RTOL = 1e-8


def _head_directions(inp: "_WhitenedInput") -> np.ndarray:
    """The whitened input coordinates the fingerprint head reads (:data:`HEAD_RTOL`), ndarray of shape (r,), bool."""
    return inp.eigenvalues >= HEAD_RTOL * inp.eigenvalues.max()


def _head_system(inp: "_WhitenedInput", bits_u: torch.Tensor, keep: np.ndarray
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``C = Z^T V Z`` and ``Z^T V Y`` restricted to the coordinates ``keep`` (from the input side's
    eigendecomposition and per-structure sums: nothing over the n rows), (r_k, r_k) and (r_k, bits)."""
    dtype = inp.Q.dtype
    k = torch.as_tensor(np.flatnonzero(keep), device=inp.Q.device)
    Qk = inp.Q.index_select(0, k)
    C = (Qk * inp.lam_eig.to(dtype)[None, :]) @ Qk.T
    ZtY = Qk @ (inp.ZEQ.T @ bits_u)
    return (C + C.T) / 2, ZtY


def _out_of_fold_bits(inp: "_WhitenedInput", bits_u: torch.Tensor, index: torch.Tensor, lams: Sequence[float],
                      seed: int, keep: np.ndarray | None = None,
                      system: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Out-of-fold ridge predictions of the training spectra's fingerprint bits, for the head's Platt scalings.

    Folds are drawn over the structures (``HEAD_FOLDS``); a seeded sample of at most ``HEAD_PLATT_SAMPLE``
    spectra is predicted, each by the ridge fitted without its fold. Each fold's system is the full one minus the
    fold's rows, ``(C - Z_f^T Z_f + n' lam I) M_f = Z^T Y - Z_f^T Y_f`` with ``C = Q diag(lam_eig) Q^T`` from the
    input side, so a fold costs one product over its rows and one solve of order r. ``keep`` (r,) bool: the
    coordinates read (:func:`_head_directions`; default all). ``system``: :func:`_head_system`'s ``(C, Z^T Y)``
    for these ``keep`` when the caller has it (an order-r product it need not make twice). Every lam of ``lams``
    is solved from one pass over the folds' rows.

    Returns
    -------
    rows : ndarray of shape (n_sample,), int64
        The sampled training spectra.
    predictions : list of ndarray of shape (n_sample, bits), float64
        One per lam of ``lams``.
    """
    lams = [float(lam) for lam in lams]
    keep = np.ones(inp.Q.shape[0], dtype=bool) if keep is None else keep
    columns = torch.as_tensor(np.flatnonzero(keep), device=inp.Z.device)
    n = int(inp.Z.shape[0])
    rng = np.random.default_rng(seed)
    structure = index.cpu().numpy()
    fold = rng.integers(0, HEAD_FOLDS, int(structure.max()) + 1)[structure]
    rows = np.sort(rng.choice(n, min(n, HEAD_PLATT_SAMPLE), replace=False))
    dtype = inp.Q.dtype

    def features(at: torch.Tensor) -> torch.Tensor:
        """Z's rows ``at`` on the coordinates kept, (len(at), r_k): gathered a block at a time, never all of Z."""
        return inp.Z.index_select(0, at).index_select(1, columns).to(dtype)

    C, ZtY = _head_system(inp, bits_u, keep) if system is None else system
    predictions = [np.empty((len(rows), int(bits_u.shape[1]))) for _ in lams]
    eye = torch.eye(C.shape[0], dtype=dtype, device=C.device)
    for f in range(HEAD_FOLDS):
        held = torch.as_tensor(np.flatnonzero(fold == f), device=inp.Z.device)
        if held.numel() == 0 or held.numel() == n:
            continue
        # Z_f^T V Z_f and Z_f^T V Y_f summed over blocks of the fold's rows: a fold's rows at once, beside a copy of
        # Z on the kept coordinates, were about 1.5 GB on train_pos
        gram = torch.zeros_like(C)
        cross = torch.zeros_like(ZtY)
        for block in held.split(HEAD_ROW_BLOCK):
            Zb = features(block)
            Yb = bits_u.index_select(0, index.index_select(0, block))
            # the input side's system is weighted when its ridge weighs structures (structure_balance): so are
            # the folds'
            ZbV = Zb if inp.weights_u is None else \
                Zb * inp.weights_u.to(dtype)[index.index_select(0, block)][:, None]
            gram += ZbV.T @ Zb
            cross += ZbV.T @ Yb
        downdated = C - gram
        mine = np.flatnonzero(fold[rows] == f)
        for predicted, fold_lam in zip(predictions, lams):
            system = downdated + (n - held.numel()) * fold_lam * eye
            Mf = torch.linalg.solve((system + system.T) / 2, ZtY - cross)
            for start in range(0, len(mine), HEAD_ROW_BLOCK):
                part = mine[start:start + HEAD_ROW_BLOCK]
                predicted[part] = (features(torch.as_tensor(rows[part], device=inp.Z.device)) @ Mf).cpu().numpy()
    return rows, predictions


def _spread_ratio(first: np.ndarray, second: np.ndarray, offsets: np.ndarray) -> float:
    """The median over sets of std(first) / std(second) within the set (flat scores, sets by ``offsets``): the
    unit in which the second score's weight beside the first is searched (1.0 when no set has a spread)."""
    ratios = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        if b - a > 1:
            s1, s2 = float(np.std(first[a:b])), float(np.std(second[a:b]))
            if s1 > 0 and s2 > 0:
                ratios.append(s1 / s2)
    return float(np.median(ratios)) if ratios else 1.0


class _WhitenedInput:
    """A sketched input side: Z_x = P_x R_x K_x; ridge on the eigenbasis of Z_x V Z_x^T (one eigh for all lam),
    V = diag(the objects' weights) (``weights_u``: one per distinct output; None: the identity)."""

    def __init__(self, spec: Any, sketch_spec: Any, seed: int, objects: list[Any], index: torch.Tensor, n_u: int,
                 device: torch.device, dtype: torch.dtype, rtol: float, profile: _Profile,
                 keep_features: bool = False, weights_u: np.ndarray | None = None) -> None:
        # the structure of each training object: a groups-spreading sketch draws landmarks over the structures
        side = _nystrom_side("input_kernel", spec, sketch_spec, seed, objects, device, dtype, rtol, profile,
                             keep_rows=True, groups=index.cpu().numpy())
        self.resolved_spec, self.kernel, self.sketch = side.kernel_spec_, side.kernel_, side.sketch_
        self.landmarks = side.landmarks_
        self.n = len(objects)
        self.device, self.dtype = device, dtype
        self.P, B = side.whitening_, side.train_rows_  # P (r, m); B = R_x K_x (m, n): Z_x = P B is never formed
        self.eigenvalues = np.asarray(side.eigenvalues_, dtype=np.float64)  # (r,): of each whitened coordinate
        del side
        self.rank = r = int(self.P.shape[0])
        m = B.shape[0]
        # Z_x Z_x^T = P (B B^T) P^T: one syrk over n of width m, then two order-m products, where forming Z_x
        # first costs an (r x m x n) product more (half the fit's linear algebra at n = 46k, m = 4000)
        wu = None if weights_u is None else torch.as_tensor(weights_u, dtype=B.dtype, device=B.device)
        self.weights_u = wu  # one weight per distinct output (None: every object once)
        with profile.stage("input_gram_features", (m, B.shape[1], m), kind="syrk"):
            C = (self.P @ gram_rows(B, None if wu is None else wu[index]) @ self.P.T).to(torch.float64)
            C = (C + C.T) / 2
        with profile.stage("input_eigh_gram"):
            lam_eig, Q = symmetric_eigh(C)
        del C
        self.lam_eig = torch.clamp(lam_eig, min=0.0)
        self.Q = Q.to(dtype)
        with profile.stage("input_group_sum"):
            ZE = self.P @ _group_sum(B, index, n_u)  # (r, n_u): Z_x E = P (B E)
            if wu is not None:  # Z_x V E: one weight per distinct output
                ZE = ZE * wu[None, :]
        #: Z_x^T (n, r), float32, for the ranking fine-tune (None unless ``keep_features``): built in column blocks
        #: so that no second float64 n x r matrix is held beside B
        self.Z: torch.Tensor | None = None
        if keep_features:
            with profile.stage("input_features", (r, m, B.shape[1])):
                self.Z = torch.empty((B.shape[1], r), dtype=torch.float32, device=device)
                for start in range(0, B.shape[1], 8192):
                    self.Z[start:start + 8192] = (self.P @ B[:, start:start + 8192]).T.to(torch.float32)
        del B
        with profile.stage("input_rotate", (n_u, r, r)):
            self.ZEQ = ZE.T @ self.Q  # (n_u, r): (Z_x E)^T Q
        del ZE
        self.QTz: torch.Tensor | None = None
        self._F_for: _OutputSide | None = None

    def prepare_val(self, inputs: list[Any]) -> None:
        RK = self.sketch.apply(self.kernel.transform(inputs).T)  # (m, n_val)
        self.QTz = self.Q.T @ (self.P @ _to_device(RK, self.device, self.dtype))

    def _D(self, lam: float) -> torch.Tensor:
        return (1.0 / (self.lam_eig + self.n * lam)).to(self.dtype)

    def start_output(self, out: _OutputSide, profile: _Profile) -> None:
        """Precompute F = core(E^T Z_x^T) Q for one output side (d_core x r)."""
        if self._F_for is out:
            return
        if out.Zu is None:
            self.F = self.ZEQ
        else:
            with profile.stage("cross_features", (out.rank, self.ZEQ.shape[0], self.ZEQ.shape[1])):
                self.F = out.core(self.ZEQ)
        self._F_for = out

    def val_core(self, lam: float, profile: _Profile) -> torch.Tensor:
        with profile.stage("val_predict", (self.F.shape[0], self.F.shape[1], self.QTz.shape[1])):
            return (self.F * self._D(lam)[None, :]) @ self.QTz

    def core(self, lam: float) -> torch.Tensor:
        """The ridge solution in core coordinates, X = Q D F^T (r x d_core): g(x) = X^T z(x)."""
        return self.Q @ (self._D(lam)[:, None] * self.F.T)

    def val_features(self) -> torch.Tensor:
        """z of the validation inputs (r x n_val), after :meth:`prepare_val`."""
        return self.Q @ self.QTz

    def weights(self, out: _OutputSide, lam: float, profile: _Profile, core: torch.Tensor | None = None
                ) -> np.ndarray:
        """W = A_x^T P_x^T X [P_y]: (n'_x, d), X the ridge core :meth:`core` or the given one."""
        with profile.stage("build_weights", (self.Q.shape[0], self.Q.shape[1], self.F.shape[0])):
            X = self.core(lam) if core is None else core.to(self.dtype)  # (r, d_core)
            to_coords = out.to_coordinates()
            if to_coords is not None:
                X = X @ to_coords
            X = self.P.T @ X  # (m_x, d)
        return self.sketch.apply_transpose(X.to(torch.float64).cpu().numpy())

    def release_val(self) -> None:
        self.QTz = None
        self.Z = None


class _CholeskyInput:
    """An un-sketched input side (exact IOKR / ISOKR): K_x kept, one Cholesky of K_x + n lam I per lam."""

    def __init__(self, spec: Any, sketch_spec: Any, seed: int, objects: list[Any], index: torch.Tensor, n_u: int,
                 device: torch.device, dtype: torch.dtype, rtol: float, profile: _Profile) -> None:
        self.resolved_spec, self.kernel, K, self.sketch = _exact_side("input_kernel", spec, objects, profile)
        self.landmarks = objects
        self.n = len(objects)
        self.K = _to_device(K, device, torch.float64)
        del K
        self.index, self.n_u = index, n_u
        self.device, self.dtype = device, dtype
        self.rank = self.n
        self.lam: float | None = None
        self.L: torch.Tensor | None = None
        self.Kval: torch.Tensor | None = None
        self._val_beta: tuple[float, torch.Tensor] | None = None
        self.profile = profile

    def _factor(self, lam: float) -> torch.Tensor:
        if self.lam != lam:
            self.L = None  # free the previous factor first: the fit holds K and one factor
            with self.profile.stage("input_cholesky", (self.n, self.n, self.n), kind="cholesky"):
                A = self.K.clone()
                A.diagonal().add_(self.n * lam)
                L, info = torch.linalg.cholesky_ex(A, out=(A, torch.empty(0, dtype=torch.int32, device=A.device)))
            if int(info) != 0:
                raise MolpredictError(f"K_x + n lam I is not positive definite at lam={lam} (is the input kernel "
                                      "positive semi-definite?); use a larger lam")
            self.L, self.lam = L, lam
        return self.L

    def prepare_val(self, inputs: list[Any]) -> None:
        self.Kval = _to_device(self.kernel.transform(inputs).T, self.device, torch.float64)  # (n, n_val)

    def start_output(self, out: _OutputSide, profile: _Profile) -> None:
        pass

    def _beta(self, rhs: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
        alpha = torch.cholesky_solve(rhs, L)  # (n, k)
        beta = torch.zeros((self.n_u, alpha.shape[1]), dtype=alpha.dtype, device=alpha.device)
        return beta.index_add_(0, self.index, alpha)  # E^T alpha

    def val_core(self, lam: float, profile: _Profile, out: _OutputSide | None = None) -> torch.Tensor:
        if self._val_beta is None or self._val_beta[0] != lam:  # one solve per lam, shared by output sides
            self._val_beta = None
            L = self._factor(lam)
            with profile.stage("val_solve", (self.n, self.n, self.Kval.shape[1])):
                self._val_beta = (lam, self._beta(self.Kval, L).to(self.dtype))
        return out.core(self._val_beta[1])

    def weights(self, out: _OutputSide, lam: float, profile: _Profile) -> np.ndarray:
        """W = (K_x + n lam I)^-1 E M: (n, d) with M = Z_u^T P_y (whitened output) or I_{n_u}."""
        if out.Zu is None:
            rhs = torch.zeros((self.n, self.n_u), dtype=torch.float64, device=self.device)
            rhs[torch.arange(self.n, device=self.device), self.index] = 1.0
        else:
            rhs = (out.Zu.T @ out.to_coordinates()).to(torch.float64)[self.index]  # (n, m_y)
        L = self._factor(lam)
        with profile.stage("build_weights", (self.n, self.n, rhs.shape[1])):
            W = torch.cholesky_solve(rhs, L)
        return W.cpu().numpy()

    def release_val(self) -> None:
        self.Kval = self._val_beta = None


# ----------------------------------------------------------------------------------------------------------
# the engine
# ----------------------------------------------------------------------------------------------------------

class _OKRBase(Model):
    """Input-output kernel regression with optional input and output sketches (see the module docstring).

    Parameters
    ----------
    input_kernel : str
        Input kernel spec (``ppk``); ``a|b`` grids are searched on validation data.
    output_kernel : str
        Output kernel spec (``gaussian-tanimoto:gamma=auto``); grids allowed.
    input_sketch, output_sketch : str or None
        Sketch specs (``subsample:m=2000``, ``p-sparsified-rademacher:m=800``); None (or ``identity``) for no
        sketch. A sketch spec without a seed gets ``seed`` (input) or ``seed + 1`` (output).
    lam : float or str
        The ridge (the regularisation is n * lam) or a grid ``1e-6|1e-4``.
    val_fraction : float
        Fraction of structures held out to choose grid points when ``fit`` gets no ``val``.
    device : str
        ``auto``, ``cpu`` or ``cuda`` (:func:`molpredict.engine.device.resolve_device`).
    dtype : str
        Float type of the products (``float64`` or ``float32``); eigendecompositions are always float64.
    seed : int
        Seeds the sketches and the held-out split.
    max_memory_gb : float
        Refuse (ResourceError) un-sketched sides whose n x n Gram matrix (twice: the matrix and its factor)
        would exceed it, and sketched sides whose m x n sketched rows (twice: rows and features) would.
    pinv_rtol : float
        Relative eigenvalue cut-off of the pseudo-inverses K~_x^+ and K~_y^+ (sketched sides).
    select_by : {"mrr", "hit@K", "kernel-loss"}
        How grid points are compared on validation data: a ranking metric of the true structures in the
        validation candidate sets (``val`` must then be a :class:`~molpredict.models.base.ValidationData` with
        candidates; without them the kernel loss is used), or the kernel loss (no decoding).

    Fitted attributes
    -----------------
    W_ : ndarray of shape (n'_x, d)
        ``predict_coordinates(x) = k_x(x, input landmarks) @ W_``.
    output_A_ : scipy.sparse.csr_matrix of shape (d, n'_y) or None (no output sketch: d = n'_y)
    input_kernel_, output_kernel_ : Kernel fitted on the landmarks, with resolved parameters
    input_landmarks_, output_landmarks_ : list
    lam_ : float
    selection_ : dict
        ``{"source": "val" | "held-out" | "none", "points": [{"input_kernel", "output_kernel", "lam",
        "val_loss", ...}], "best": index}`` (``val_loss`` is NaN when nothing was selected).
    val_loss_ : list of float
        The validation kernel loss of each grid point, in the order of ``selection_["points"]``.
    validation_scores_ : ndarray of shape (n_candidates_total,) or None
        After a ranking-aware selection (``val`` with candidate sets): the scores the chosen grid point gave the
        validation candidates, flat in the order of ``val.candidates.flat()`` (float32 products); the fusion
        and the calibration are fitted on them instead of scoring the sets again (with the fingerprint head's
        score when the model keeps one). Not saved with the model.
    rank_ : dict
        Numerical ranks kept by the pseudo-inverses: ``{"input": r_x, "output": r_y}``.
    n_train_, n_unique_ : int
        Training pairs and distinct training outputs.
    profile_ : dict
        ``{"stages": {name: seconds}, "products": [{"name", "kind", "shape": [m, k, n], "seconds"}]}`` of the
        last fit (benchmarks/engine.py turns the products into GFLOP/s).
    """

    def __init__(self, input_kernel: str = DEFAULT_INPUT_KERNEL, output_kernel: str = DEFAULT_OUTPUT_KERNEL,
                 input_sketch: str | None = None, output_sketch: str | None = None,
                 lam: float | str = DEFAULT_LAM, val_fraction: float = 0.1, device: str = "auto",
                 dtype: str = "float64", seed: int = 0, max_memory_gb: float = 4.0,
                 pinv_rtol: float = 1e-10, select_by: str = "mrr") -> None:
        self.input_kernel = input_kernel
        self.output_kernel = output_kernel
        self.input_sketch = input_sketch
        self.output_sketch = output_sketch
        self.lam = lam
        self.val_fraction = val_fraction
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.max_memory_gb = max_memory_gb
        self.pinv_rtol = pinv_rtol
        if select_by != "kernel-loss" and select_by != "mrr" and not re.fullmatch(r"hit@[1-9][0-9]*", str(select_by)):
            raise SpecError(f"select_by must be kernel-loss, mrr or hit@K, got {select_by!r}")
        self.select_by = select_by

    @classmethod
    def train_defaults(cls, input_type: str, n_inputs: int, n_structures: int) -> dict[str, Any]:
        """For text: :data:`TEXT_INPUT_KERNEL`, the text output kernel, and sketches only beyond
        :data:`TEXT_INPUT_LANDMARKS` pairs / :data:`TEXT_OUTPUT_LANDMARKS` structures (``none`` below)."""
        params = super().train_defaults(input_type, n_inputs, n_structures)
        if input_type == "text":
            params["input_kernel"] = TEXT_INPUT_KERNEL
            params["input_sketch"] = (f"subsample:m={TEXT_INPUT_LANDMARKS}" if n_inputs > TEXT_INPUT_LANDMARKS
                                      else "none")
            params["output_sketch"] = (f"subsample:m={TEXT_OUTPUT_LANDMARKS}"
                                       if n_structures > TEXT_OUTPUT_LANDMARKS else "none")
        return params

    # -- helpers -----------------------------------------------------------------------------------------
    def _input_sketch_spec(self) -> Any:
        return getattr(self, "input_sketch", None)

    def _output_sketch_spec(self) -> Any:
        return getattr(self, "output_sketch", None)

    def _budget_bytes(self) -> float:
        return float(self.max_memory_gb) * 2**30

    def _check_memory(self, sketch_spec: Any, n: int, side: str) -> None:
        sketch = make_sketch(sketch_spec)
        if sketch.is_identity:
            # the input side holds K_x and its Cholesky factor; the output side K_u and a product of its size
            need, what = 16.0 * n * n, f"the {n} x {n} {side} Gram matrix and its factor (no {side} sketch)"
        else:
            m = sketch.m if isinstance(sketch.m, int) else n
            need, what = 16.0 * min(m, n) * n, f"the {min(m, n)} x {n} sketched {side} rows"
        if need > self._budget_bytes():
            raise ResourceError(f"{type(self).__name__}: {what} would need {need / 2**30:.1f} GB, over "
                                f"max_memory_gb={self.max_memory_gb}; use a {side} sketch (e.g. sisokr) or "
                                "raise max_memory_gb")

    def _torch(self) -> tuple[torch.device, torch.dtype]:
        return resolve_device(self.device), resolve_dtype(self.dtype)

    # -- fit ---------------------------------------------------------------------------------------------
    def fit(self, inputs: Sequence[Any], molecules: Sequence[Any],
            val: tuple[Sequence[Any], Sequence[Any]] | None = None) -> "_OKRBase":
        """Fit on inputs and their labels; choose grid parameters by validation kernel loss.

        Parameters
        ----------
        inputs : sequence of n inputs (``Spectrum`` records, or whatever the input kernel takes)
        molecules : sequence of n outputs (``Molecule`` records, or whatever the output kernel takes)
        val : (inputs, molecules), optional
            Validation pairs for the grid search; without it, when there is more than one grid point, a
            fraction ``val_fraction`` of the structures is held out to choose, then the model is refitted on
            all the data with the chosen point.
        """
        inputs, molecules = list(inputs), list(molecules)
        check_pairs(inputs, molecules, minimum=2)
        in_specs = parse_spec(self.input_kernel).expand()
        out_specs = parse_spec(self.output_kernel).expand()
        lams = lam_grid(self.lam)
        n_points = len(in_specs) * len(out_specs) * len(lams)
        device, _ = self._torch()
        profile = _Profile(device)
        ranking = None
        if val is not None:
            val_inputs, val_molecules = list(val[0]), list(val[1])
            check_pairs(val_inputs, val_molecules, what="validation")
            ranking = getattr(val, "candidates", None) if self.select_by != "kernel-loss" else None
            points, best = self._fit_grid(inputs, molecules, (val_inputs, val_molecules), in_specs, out_specs,
                                          lams, profile, ranking=ranking)
            source = "val"
        elif n_points > 1:
            train, held = split_by_structure(molecules, float(self.val_fraction), int(self.seed))
            if held.size == 0:
                raise InputError("a grid search needs validation data or at least two distinct structures")
            points, best = self._fit_grid([inputs[i] for i in train], [molecules[i] for i in train],
                                          ([inputs[i] for i in held], [molecules[i] for i in held]),
                                          in_specs, out_specs, lams, profile, build=False)
            chosen = points[best]
            self._fit_grid(inputs, molecules, None, [parse_spec(chosen["input_kernel"])],
                           [parse_spec(chosen["output_kernel"])], [chosen["lam"]], profile)
            source = "held-out"
        else:
            points, best = self._fit_grid(inputs, molecules, None, in_specs, out_specs, lams, profile)
            source = "none"
        self.selection_ = {"source": source, "points": points, "best": int(best),
                           "select_by": self.select_by if ranking is not None else "kernel-loss"}
        self.val_loss_ = [p["val_loss"] for p in points]
        self.profile_ = {"stages": profile.stages, "products": profile.products}
        return self

    def _fit_grid(self, inputs: list[Any], molecules: list[Any], val: tuple[list, list] | None,
                  in_specs: list[ComponentSpec], out_specs: list[ComponentSpec], lams: list[float],
                  profile: _Profile, build: bool = True, ranking: Any = None) -> tuple[list[dict[str, Any]], int]:
        """Fit every grid point on (inputs, molecules), score it on ``val`` (by the kernel loss, or by the ranking
        metric ``select_by`` when ``ranking`` holds the validation candidate sets); build the best one."""
        device, dtype = self._torch()
        rtol = float(self.pinv_rtol)
        n = len(inputs)
        first, index = distinct_positions(molecules)
        n_u = len(first)
        unique_mols = [molecules[i] for i in first]
        self._check_memory(self._input_sketch_spec(), n, "input")
        self._check_memory(self._output_sketch_spec(), n_u, "output")
        index_t = torch.as_tensor(index, device=device)
        input_cls = _CholeskyInput if make_sketch(self._input_sketch_spec()).is_identity else _WhitenedInput
        # the ranking fine-tune needs whitened features on both sides and validation sets to stop on
        finetune = (int(getattr(self, "rank_epochs", 0)) > 0 and ranking is not None and val is not None and build
                    and input_cls is _WhitenedInput and not make_sketch(self._output_sketch_spec()).is_identity)
        # the fingerprint likelihood head reads the chosen point's whitened features and the validation sets
        head = (bool(getattr(self, "fingerprint_head", False)) and ranking is not None and val is not None and build
                and input_cls is _WhitenedInput and _all_molecules(unique_mols))
        extra: dict[str, Any] = {"keep_features": True} if finetune or head else {}
        balance = float(getattr(self, "structure_balance", 0.0))
        if balance:
            if input_cls is not _WhitenedInput:
                raise SpecError("structure_balance needs a sketched input side (input_sketch is none)")
            extra["weights_u"] = ridge_structure_weights(index, balance)

        outputs = []
        for spec in out_specs:
            out = _OutputSide(spec, self._output_sketch_spec(), int(self.seed) + 1, unique_mols, device, dtype,
                              rtol, profile)
            if val is not None:
                with profile.stage("output_val_features"):
                    out.prepare_val(val[1])
                    if ranking is not None:
                        out.prepare_candidates(ranking.molecules)
            outputs.append(out)

        points: list[dict[str, Any]] = []
        best: dict[str, Any] | None = None
        best_loss = math.inf
        for spec in in_specs:
            inp = input_cls(spec, self._input_sketch_spec(), int(self.seed), inputs, index_t, n_u, device, dtype,
                            rtol, profile, **extra)
            if val is not None:
                with profile.stage("input_val_features"):
                    inp.prepare_val(val[0])
            losses: dict[tuple[int, int], float] = {}
            rankings: dict[tuple[int, int], float] = {}
            scores: dict[tuple[int, int], np.ndarray] = {}  # the ranked candidates' scores, per grid point
            # the Cholesky input side factors once per lam, the whitened one prepares once per output side
            order = ([(o, j) for j in range(len(lams)) for o in range(len(outputs))] if input_cls is _CholeskyInput
                     else [(o, j) for o in range(len(outputs)) for j in range(len(lams))])
            started = None
            for o, j in order:
                out = outputs[o]
                if started != o:
                    inp.start_output(out, profile)
                    started = o
                loss = math.nan
                if val is not None:
                    core = (inp.val_core(lams[j], profile, out) if input_cls is _CholeskyInput
                            else inp.val_core(lams[j], profile))
                    loss = out.val_loss(core)
                    if ranking is not None:
                        rankings[o, j], scores[o, j] = out.val_ranking(core, ranking, self.select_by,
                                                                       return_scores=True)
                    del core
                losses[o, j] = loss
            for o, out in enumerate(outputs):
                for j, lam in enumerate(lams):
                    loss = losses[o, j]
                    point = {"input_kernel": str(spec), "output_kernel": str(out.spec), "lam": lam,
                             "val_loss": loss, "input_kernel_resolved": inp.resolved_spec,
                             "output_kernel_resolved": out.resolved_spec}
                    # lower is better: the kernel loss, or minus the ranking metric
                    criterion = loss
                    if ranking is not None:
                        point[f"val_{self.select_by}"] = rankings[o, j]
                        criterion = -rankings[o, j]
                    points.append(point)
                    if best is None or criterion < best_loss:
                        best_loss = criterion if math.isfinite(criterion) else math.inf
                        best = {"index": len(points) - 1, "input": inp, "output": out, "lam": lam,
                                "scores": scores.get((o, j))}
            if not ((finetune or head) and best is not None and best["input"] is inp):
                inp.release_val()
            del inp
        if finetune:
            self._finetune(best, points[best["index"]], ranking, index_t, profile)
        if head:
            self._fit_head(best, points[best["index"]], unique_mols, index_t, ranking, profile)
        if finetune or head:
            best["input"].release_val()
        for out in outputs:
            out.release_val()
        if build:
            self._build(best, n, n_u, profile)
            # the chosen point's scores of the validation candidates, for the fusion and calibration fitted
            # after the model (transient: not part of the model's state)
            self.validation_scores_ = best.get("scores")
        return points, best["index"]

    def _finetune(self, best: dict[str, Any], point: dict[str, Any], ranking: Any, index: torch.Tensor,
                  profile: _Profile) -> None:
        """Fine-tune the chosen point's core with the ranking loss (:mod:`molpredict.models.ranking_finetune`),
        stopping on the validation ranking metric; what it did goes to ``point["finetune"]``. A kept fine-tune puts
        its core in ``best["core"]`` and its validation scores in ``best["scores"]``, and the point's ``val_loss``
        and ranking metric become the tuned model's (the ridge's are kept beside them); otherwise the ridge
        solution's entries stand as they are."""
        from molpredict.models.ranking_finetune import finetune_core
        inp, out, metric = best["input"], best["output"], self.select_by
        inp.start_output(out, profile)
        z_val = inp.val_features()  # (r_x, n_val)
        Psi = out.Zu.T.to(torch.float32).contiguous()  # (n_u, r_y): the distinct training outputs

        def evaluate(X: torch.Tensor) -> float:
            return out.val_ranking(X.to(z_val.dtype).T @ z_val, ranking, metric)

        with profile.stage("ranking_finetune"):
            X, history = finetune_core(inp.Z, index, Psi, inp.core(best["lam"]), evaluate,
                                       epochs=int(self.rank_epochs), lr=float(self.rank_lr),
                                       min_gain=float(getattr(self, "rank_min_gain", 0.0)), seed=int(self.seed))
        improved = history["best"] is not None
        point["finetune"] = {"epochs": int(self.rank_epochs), "lr": float(self.rank_lr),
                             "min_gain": float(getattr(self, "rank_min_gain", 0.0)),
                             "ridge": {"val_loss": point["val_loss"], f"val_{metric}": point.get(f"val_{metric}")},
                             "history": history, "improved": improved}
        if not improved:  # the ridge solution stays: its scores and figures were recorded by the grid
            return
        core = X.to(z_val.dtype).T @ z_val
        point[f"val_{metric}"], best["scores"] = out.val_ranking(core, ranking, metric, return_scores=True)
        point["val_loss"] = out.val_loss(core)
        best["core"] = X

    def _fit_head(self, best: dict[str, Any], point: dict[str, Any], unique_molecules: list[Any],
                  index: torch.Tensor, ranking: Any, profile: _Profile) -> None:
        """Fit the fingerprint likelihood head (:mod:`molpredict.models.fingerprint_head`) on the chosen point's
        whitened features and keep it in ``best["head"]`` when it ranks the validation sets better.

        The ridge to the bits reuses the input side's eigendecomposition. The Platt scalings are fitted on
        out-of-fold predictions of training spectra (:func:`_out_of_fold_bits`: folds by structure), so they
        describe structures the ridge did not see, and the validation sets stay free to choose the head's weight:
        ``HEAD_WEIGHTS`` times the typical ratio of the two scores' spreads, with its ridge's ``lam``
        (``DEFAULT_HEAD_LAMS`` unless ``head_lam`` fixes one), the pair with the best validation metric; the head is
        kept when that beats the model alone by at least ``rank_min_gain``.
        ``point["fingerprint_head"]`` records what was tried; a kept head's scores join ``best["scores"]`` (what
        the fusion and calibration are fitted on)."""
        from molpredict.models.fingerprint_head import (candidate_bits, head_logits, platt_columns,
                                                        sparse_candidate_bits)

        inp, metric = best["input"], self.select_by
        fixed = getattr(self, "head_lam", None)
        lams = list(DEFAULT_HEAD_LAMS) if fixed is None else [float(fixed)]
        started = time.perf_counter()
        with profile.stage("fingerprint_head"):
            bits_u = torch.as_tensor(candidate_bits(unique_molecules), dtype=inp.dtype, device=inp.device)
            keep = _head_directions(inp)
            kept_rows = torch.as_tensor(np.flatnonzero(keep), device=inp.device)
            C, ZtY = _head_system(inp, bits_u, keep)  # Z^T Y: the structures' feature sums times their bits
            eye = torch.eye(C.shape[0], dtype=C.dtype, device=C.device)
            rows, predicted = _out_of_fold_bits(inp, bits_u, index, lams, int(self.seed), keep, system=(C, ZtY))
            observed = bits_u[index[rows]].cpu().numpy()
            model_scores = np.asarray(best["scores"], dtype=np.float64)
            bits = sparse_candidate_bits(ranking.molecules)  # (n_candidates, size); dense it was the training's peak
            val_features = inp.val_features().T
            offsets = ranking.flat()[0]
            # on a GPU the Platt scalings run there, every bit at once (15,000 x 2,048 float64 steps: ~2.5 GB);
            # on the CPU numpy is faster than torch
            platt_on = ({"device": inp.device, "block": int(bits_u.shape[1])} if inp.device.type == "cuda" else {})
            per_lam: dict[str, dict[str, float]] = {}  # each lam's best weight and its validation metric
            choice: tuple[tuple[float, float, float], dict[str, Any]] | None = None
            for i, lam in enumerate(lams):
                lam_predicted, predicted[i] = predicted[i], None  # (n_sample, bits) each: freed once used
                M = torch.zeros((inp.Q.shape[0], bits_u.shape[1]), dtype=C.dtype, device=C.device)  # (r, bits)
                M[kept_rows] = torch.linalg.solve(C + inp.n * lam * eye, ZtY)  # the ridge's core
                slope, intercept = platt_columns(lam_predicted, observed, **platt_on)
                logits32 = head_logits((val_features @ M).to(torch.float64).cpu().numpy(), slope,
                                       intercept).astype(np.float32)
                head_scores = _scores_in_sets(ranking, lambda positions, ids: (bits[ids] @ logits32[positions].T).T)
                scale = _spread_ratio(model_scores, head_scores, offsets)
                tried = {str(w): float(ranking.ranked_metrics(model_scores + w * scale * head_scores)[metric])
                         for w in HEAD_WEIGHTS}
                weight = max(HEAD_WEIGHTS, key=lambda w: (tried[str(w)], -w))
                per_lam[str(lam)] = {"weight": weight, f"val_{metric}": tried[str(weight)]}
                # ties: the larger lam (the smoother ridge), then the smaller weight
                key = (tried[str(weight)], lam, -weight)
                if choice is None or key > choice[0]:
                    choice = (key, {"lam": lam, "M": M, "slope": slope, "intercept": intercept, "scale": scale,
                                    "weight": weight, "tried": tried, "head_scores": head_scores})
        chosen = choice[1]
        tried, weight, scale = chosen["tried"], chosen["weight"], chosen["scale"]
        gain = tried[str(weight)] - tried[str(0.0)]
        kept = weight > 0 and gain >= float(getattr(self, "rank_min_gain", 0.0))
        point["fingerprint_head"] = {"lam": chosen["lam"], "directions": int(keep.sum()), "scale": scale,
                                     f"val_{metric}": tried, "weight": weight, "gain": gain, "kept": kept,
                                     "lams": per_lam,
                                     "seconds": time.perf_counter() - started}
        if not kept:
            return
        M, slope, intercept = chosen["M"], chosen["slope"], chosen["intercept"]
        to_rows = inp.sketch.apply_transpose((inp.P.T @ M).to(torch.float64).cpu().numpy())  # (n'_x, bits)
        best["head"] = FingerprintHead(to_rows, slope, intercept, weight * scale, lam=chosen["lam"],
                                       bit_scale=HEAD_BIT_SCALE)
        best["scores"] = model_scores + weight * scale * chosen["head_scores"]
        point[f"val_{metric}"] = tried[str(weight)]

    def _build(self, best: dict[str, Any], n: int, n_u: int, profile: _Profile) -> None:
        inp, out = best["input"], best["output"]
        inp.start_output(out, profile)
        tuned = {"core": best["core"]} if best.get("core") is not None else {}  # the ranking fine-tune's
        self.W_ = np.ascontiguousarray(inp.weights(out, best["lam"], profile, **tuned), dtype=np.float64)
        self.head_ = best.get("head")
        self.output_A_ = None if out.identity else sp.csr_matrix(out.sketch.A_)
        self.input_kernel_ = inp.kernel
        self.output_kernel_ = out.kernel
        self.input_landmarks_ = inp.landmarks
        self.output_landmarks_ = out.landmarks
        self.input_kernel_spec_ = inp.resolved_spec
        self.output_kernel_spec_ = out.resolved_spec
        self.input_sketch_spec_ = "identity" if inp.sketch.is_identity else str(inp.sketch.to_spec())
        self.output_sketch_spec_ = "identity" if out.identity else str(out.sketch.to_spec())
        self.lam_ = float(best["lam"])
        self.n_train_ = int(n)
        self.n_unique_ = int(n_u)
        self.rank_ = {"input": inp.rank, "output": out.rank}
        self._device_cache = {}
        self._loaded_state = None

    # -- prediction --------------------------------------------------------------------------------------
    #: the fingerprint likelihood head (None: the model's own score only)
    head_: FingerprintHead | None = None

    def _check_fitted(self) -> None:
        if not hasattr(self, "W_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(inputs, molecules) first")

    @property
    def n_coordinates(self) -> int:
        """d, the dimension of the coordinates (m_y, or the number of output landmarks without a sketch), plus the
        fingerprint head's bits when the model has one."""
        self._check_fitted()
        return int(self.W_.shape[1]) + (self.head_.size if self.head_ is not None else 0)

    def _weights(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        cache = self.__dict__.setdefault("_device_cache", {})
        key = f"{device}/{dtype}"
        if key not in cache:
            cache.clear()
            cache[key] = _to_device(self.W_, device, dtype)
        return cache[key]

    def _predicts_on_torch(self) -> bool:
        """Whether :meth:`predict_coordinates` runs its product on torch: only for a ``device`` naming a GPU.

        Otherwise (``cpu``, and ``auto``) it is one BLAS product in numpy, as fast on the CPU and without importing
        torch: the kernel rows it multiplies are computed on the CPU anyway.
        """
        return str(getattr(self, "device", "cpu")).strip().lower().startswith("cuda")

    @property
    def reads_formula(self) -> bool:
        return bool(getattr(getattr(self, "input_kernel_", None), "reads_formula", False))

    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """Coefficients over the m_y sketched training outputs, shape (n_inputs, d), float64 (in blocks)."""
        return self.predict_coordinates_as(inputs, np.float64)

    def predict_coordinates_as(self, inputs: Sequence[Any], dtype: Any) -> np.ndarray:
        """:meth:`predict_coordinates` in ``dtype``; with float32 (or a float32 model) the product ``K W`` itself
        runs in float32 (the kernel rows stay float64 until then)."""
        self._check_fitted()
        inputs = list(inputs)
        d = self.W_.shape[1]
        out = np.empty((len(inputs), self.n_coordinates), dtype=dtype)
        step = _rows_per_block(self.W_.shape[0])
        if self._predicts_on_torch():
            device, torch_dtype = self._torch()
            W = self._weights(device, torch_dtype)
            for start in range(0, len(inputs), step):
                K = self.input_kernel_.transform(inputs[start:start + step])  # (b, n'_x)
                out[start:start + K.shape[0], :d] = (_to_device(K, device, torch_dtype) @ W).cpu().numpy()
                if self.head_ is not None:
                    out[start:start + K.shape[0], d:] = self.head_.query_side(K, dtype)
            return out
        narrow = np.dtype(dtype) == np.float32 or str(self.dtype) not in ("float64", "double")
        W = self._weights_float32() if narrow else self.W_
        for start in range(0, len(inputs), step):
            K = self.input_kernel_.transform(inputs[start:start + step])  # (b, n'_x)
            with _one_blas_thread(K.shape[0] <= _FEW_ROWS):
                out[start:start + K.shape[0], :d] = K.astype(W.dtype, copy=False) @ W
                if self.head_ is not None:
                    out[start:start + K.shape[0], d:] = self.head_.query_side(K, W.dtype)
        return out

    def _weights_float32(self) -> np.ndarray:
        cache = self.__dict__.setdefault("_device_cache", {})
        if "numpy/float32" not in cache:
            cache["numpy/float32"] = np.ascontiguousarray(self.W_, dtype=np.float32)
        return cache["numpy/float32"]

    def candidate_coordinates(self, molecules: Sequence[Any]) -> np.ndarray:
        """R_y k_y(train, c) for each candidate: K_y(c, output landmarks) A_y^T, shape (n_c, d), float64."""
        from molpredict.chem.molecules import remembered_fingerprints  # RDKit: not at import time

        self._check_fitted()
        molecules = list(molecules)
        n_landmarks = int(self.output_kernel_.n_fit_)
        out = np.empty((len(molecules), self.n_coordinates), dtype=np.float64)
        step = _rows_per_block(n_landmarks)
        for start in range(0, len(molecules), step):
            block = molecules[start:start + step]
            # with a head, the block's records keep the fingerprints the output kernel computes, so that the
            # head's bits (the same Morgan setting as the default Tanimoto kernel's) are not computed again
            with remembered_fingerprints(block) if self.head_ is not None else contextlib.nullcontext():
                K = self.output_kernel_.transform(block)  # (b, n'_y)
                part = out[start:start + K.shape[0]]
                part[:, :self.W_.shape[1]] = K if self.output_A_ is None else np.asarray(self.output_A_ @ K.T).T
                if self.head_ is not None:
                    part[:, self.W_.shape[1]:] = self.head_.candidate_side(block)
        return out

    def _output_gram(self) -> np.ndarray:
        """K~_y = R_y K_y R_y^T among the output landmarks, shape (d, d) (cached)."""
        cache = self.__dict__.setdefault("_device_cache", {})
        if "output_gram" not in cache:
            G = self.output_kernel_.gram()
            if self.output_A_ is not None:
                G = np.asarray(self.output_A_ @ np.asarray(self.output_A_ @ G).T)
            cache["output_gram"] = (G + G.T) / 2.0
        return cache["output_gram"]

    def kernel_loss(self, inputs: Sequence[Any], molecules: Sequence[Any]) -> float:
        """Mean kernel loss ||h(x) - psi_y(y)||^2 = c^T K~_y c - 2 c . R_y k_y^y + k_y(y, y) over the pairs."""
        inputs, molecules = list(inputs), list(molecules)
        check_pairs(inputs, molecules, what="kernel-loss")
        d = self.W_.shape[1]  # the kernel model's own coordinates (not the fingerprint head's)
        c = self.predict_coordinates(inputs)[:, :d]
        q = self.candidate_coordinates(molecules)[:, :d]
        diag = self.output_kernel_.diagonal(molecules)
        per = np.einsum("ij,ij->i", c @ self._output_gram(), c) - 2.0 * np.einsum("ij,ij->i", c, q) + diag
        return float(per.mean())

    # -- state -------------------------------------------------------------------------------------------
    input_landmarks_ = LazyLandmarks()
    output_landmarks_ = LazyLandmarks()

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays: ``W`` (n'_x, d), the input landmarks (``input_landmarks*``), the output sketch weights
        (``output_A_*``, CSR), array-valued output landmarks and the fitted kernels (``fitted_kernels.input.*``,
        ``fitted_kernels.output.*``: their features, :meth:`~molpredict.kernels.base.Kernel.get_fitted_state`);
        metadata: specs with resolved parameters, landmark SMILES under ``output``, the selection, the fitted
        kernels' JSON under ``fitted_kernels`` (``None`` for a kernel that cannot be saved so: it is refitted on its
        landmarks at load). A model loaded from a state returns that state (with the fitted kernels added when it
        lacked them), so neither saving it again nor its :meth:`coordinates_key` re-serialises the landmarks."""
        self._check_fitted()
        loaded = self.__dict__.get("_loaded_state")
        if loaded is not None:
            arrays, metadata = dict(loaded[0]), dict(loaded[1])
        else:
            arrays = {"W": np.asarray(self.W_, dtype=np.float64)}
            in_arrays, in_meta = objects_to_state(self.input_landmarks_, "input_landmarks")
            out_arrays, out_meta = objects_to_state(self.output_landmarks_, "output_landmarks")
            arrays.update(in_arrays)
            arrays.update(out_arrays)
            if self.output_A_ is not None:
                arrays.update(_sparse_to_arrays(self.output_A_, "output_A"))
            metadata = {
                "format": STATE_FORMAT,
                "version": STATE_VERSION,
                "model": self.registry_name or type(self).__name__.lower(),
                "params": self.get_params(),
                "input": {"kernel": self.input_kernel_spec_, "sketch": self.input_sketch_spec_,
                          "landmarks": in_meta},
                "output": {"kernel": self.output_kernel_spec_, "sketch": self.output_sketch_spec_,
                           "landmarks": out_meta},
                "lam": self.lam_,
                "n_train": self.n_train_,
                "n_unique": self.n_unique_,
                "rank": self.rank_,
                "selection": self.selection_,
            }
            if self.head_ is not None:
                head_arrays, metadata["head"] = self.head_.get_state("head")
                arrays.update(head_arrays)
                # the candidate coordinates end with the head's bits: part of what the coordinates key hashes
                metadata["output"]["fingerprint_head"] = self.head_.candidate_spec()
        if not metadata.get(FITTED_KERNELS):
            fitted: dict[str, Any] = {}
            for side, kernel in (("input", self.input_kernel_), ("output", self.output_kernel_)):
                try:
                    kernel_arrays, fitted[side] = kernel.get_fitted_state(f"{FITTED_KERNELS}.{side}")
                except StateNotSaveable:
                    fitted[side] = None
                    continue
                arrays.update(kernel_arrays)
            metadata[FITTED_KERNELS] = fitted
        return arrays, metadata

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "_OKRBase":
        """Rebuild a fitted model.

        The kernels come from their saved fitted state (the arrays used as given: memory-mapped ones stay mapped;
        nothing is featurised); a state without it (saved before it existed, or a kernel that cannot be saved
        so) has the kernel re-created from its resolved spec and refitted on the landmarks, and the model says so
        in ``refitted_on_load_`` (re-saving it, ``molpredict model upgrade``, makes the next load fast). The
        landmark objects are decoded on first access only.
        """
        if metadata.get("format") != STATE_FORMAT or metadata.get("version") not in READABLE_VERSIONS:
            raise ModelFileError(f"model state: unsupported format {metadata.get('format')!r} version "
                                 f"{metadata.get('version')!r} (expected {STATE_FORMAT} "
                                 f"{' or '.join(map(str, READABLE_VERSIONS))})")
        target = cls
        if cls is _OKRBase or not issubclass(cls, _OKRBase):
            target = get_registry().get("model", metadata["model"])
        params = {k: v for k, v in metadata.get("params", {}).items() if k in target.param_names()}
        model = target(**params)
        try:
            model.W_ = np.asarray(arrays["W"], dtype=np.float64)
            landmarks = {"input_landmarks_": (metadata["input"]["landmarks"], "input_landmarks"),
                         "output_landmarks_": (metadata["output"]["landmarks"], "output_landmarks")}
            model._landmark_loaders = {
                name: (lambda meta=meta, prefix=prefix: objects_from_state(arrays, meta, prefix))
                for name, (meta, prefix) in landmarks.items()}
            model.input_kernel_spec_ = metadata["input"]["kernel"]
            model.output_kernel_spec_ = metadata["output"]["kernel"]
            model.input_sketch_spec_ = metadata["input"]["sketch"]
            model.output_sketch_spec_ = metadata["output"]["sketch"]
            model.lam_ = float(metadata["lam"])
            model.n_train_ = int(metadata["n_train"])
            model.n_unique_ = int(metadata["n_unique"])
            model.rank_ = dict(metadata["rank"])
            model.selection_ = metadata.get("selection", {})
        except KeyError as exc:
            raise ModelFileError(f"model state: missing {exc}") from None
        model.val_loss_ = [p.get("val_loss") for p in model.selection_.get("points", [])]
        model.output_A_ = (None if model.output_sketch_spec_ == "identity"
                           else _sparse_from_arrays(arrays, "output_A"))
        fitted = metadata.get(FITTED_KERNELS) or {}
        model.refitted_on_load_ = []
        for side, kind in (("input", "input_kernel"), ("output", "output_kernel")):
            kernel = None
            if fitted.get(side):
                try:
                    kernel = Kernel.from_fitted_state(arrays, fitted[side])
                except StateNotSaveable:
                    kernel = None
            if kernel is None:
                kernel = create(kind, getattr(model, f"{side}_kernel_spec_")).fit(getattr(model, f"{side}_landmarks_"))
                model.refitted_on_load_.append(side)
            setattr(model, f"{side}_kernel_", kernel)
        n_input, n_output = int(model.input_kernel_.n_fit_), int(model.output_kernel_.n_fit_)
        if model.W_.shape[0] != n_input:
            raise ModelFileError(f"model state: W has {model.W_.shape[0]} rows for {n_input} input landmarks")
        width = n_output if model.output_A_ is None else model.output_A_.shape[1]
        d = n_output if model.output_A_ is None else model.output_A_.shape[0]
        if width != n_output or d != model.W_.shape[1]:
            raise ModelFileError("model state: output sketch, landmarks and W do not match")
        model.head_ = None
        if metadata.get("head"):
            try:
                model.head_ = FingerprintHead.from_state(arrays, metadata["head"], "head")
            except (KeyError, ValueError, TypeError) as exc:
                raise ModelFileError(f"model state: fingerprint head: {exc}") from None
            if model.head_.map.shape[0] != n_input:
                raise ModelFileError(f"model state: the fingerprint head has {model.head_.map.shape[0]} rows for "
                                     f"{n_input} input landmarks")
        model._device_cache = {}
        model._loaded_state = (arrays, metadata)
        return model


# ----------------------------------------------------------------------------------------------------------
# the four public models: the same engine, different defaults
# ----------------------------------------------------------------------------------------------------------

class IOKR(_OKRBase):
    """Exact input-output kernel regression (no sketch): O(n^3) fit, the accuracy reference where n allows.

    Refuses (ResourceError) when the n x n input Gram matrix would exceed ``max_memory_gb``. Parameters as in
    :class:`_OKRBase` without the sketches.
    """

    def __init__(self, input_kernel: str = DEFAULT_INPUT_KERNEL, output_kernel: str = DEFAULT_OUTPUT_KERNEL,
                 lam: float | str = DEFAULT_LAM, val_fraction: float = 0.1, device: str = "auto",
                 dtype: str = "float64", seed: int = 0, max_memory_gb: float = 4.0,
                 pinv_rtol: float = 1e-10, select_by: str = "mrr") -> None:
        super().__init__(input_kernel=input_kernel, output_kernel=output_kernel, lam=lam,
                         val_fraction=val_fraction, device=device, dtype=dtype, seed=seed,
                         max_memory_gb=max_memory_gb, pinv_rtol=pinv_rtol, select_by=select_by)
        del self.input_sketch, self.output_sketch


class SIOKR(_OKRBase):
    """Sketched-input IOKR (R_y = I): input sketch :data:`DEFAULT_INPUT_SKETCH` by default."""

    def __init__(self, input_kernel: str = DEFAULT_INPUT_KERNEL, output_kernel: str = DEFAULT_OUTPUT_KERNEL,
                 input_sketch: str | None = DEFAULT_INPUT_SKETCH, lam: float | str = DEFAULT_LAM,
                 val_fraction: float = 0.1, device: str = "auto", dtype: str = "float64", seed: int = 0,
                 max_memory_gb: float = 4.0, pinv_rtol: float = 1e-10, select_by: str = "mrr") -> None:
        super().__init__(input_kernel=input_kernel, output_kernel=output_kernel, input_sketch=input_sketch,
                         lam=lam, val_fraction=val_fraction, device=device, dtype=dtype, seed=seed,
                         max_memory_gb=max_memory_gb, pinv_rtol=pinv_rtol, select_by=select_by)
        del self.output_sketch


class ISOKR(_OKRBase):
    """Sketched-output IOKR (R_x = I): output sketch :data:`DEFAULT_OUTPUT_SKETCH` by default."""

    def __init__(self, input_kernel: str = DEFAULT_INPUT_KERNEL, output_kernel: str = DEFAULT_OUTPUT_KERNEL,
                 output_sketch: str | None = DEFAULT_OUTPUT_SKETCH, lam: float | str = DEFAULT_LAM,
                 val_fraction: float = 0.1, device: str = "auto", dtype: str = "float64", seed: int = 0,
                 max_memory_gb: float = 4.0, pinv_rtol: float = 1e-10, select_by: str = "mrr") -> None:
        super().__init__(input_kernel=input_kernel, output_kernel=output_kernel, output_sketch=output_sketch,
                         lam=lam, val_fraction=val_fraction, device=device, dtype=dtype, seed=seed,
                         max_memory_gb=max_memory_gb, pinv_rtol=pinv_rtol, select_by=select_by)
        del self.input_sketch


class SISOKR(_OKRBase):
    """Sketched-input, sketched-output IOKR: :data:`DEFAULT_INPUT_SKETCH` in, :data:`DEFAULT_OUTPUT_SKETCH` out.

    No n x n matrix is formed: the fit needs the m_x x n rows R_x K_x and the m_y x n_u rows R_y K_u.

    Parameters (beyond :class:`_OKRBase`'s)
    ----------
    rank_epochs : int
        When ``fit`` gets validation candidate sets (a :class:`~molpredict.models.base.ValidationData` with
        candidates, as ``molpredict train --val-candidates`` passes them), the chosen grid point's ridge solution
        is fine-tuned for at most this many epochs with a softmax ranking loss over the distinct training
        structures, stopped on the validation metric ``select_by`` (:mod:`molpredict.models.ranking_finetune`);
        0, or no candidate sets: the ridge solution. What it did is recorded in the chosen point of
        ``selection_`` (``finetune``: the ridge's validation loss and metric, every check).
    rank_lr : float
        Adam's learning rate of the fine-tune.
    rank_min_gain : float
        The tuned map replaces the ridge solution only if its validation metric is at least this much higher.
    structure_balance : float
        The ridge's square loss weights each training object by its structure's object count to the power
        ``-structure_balance`` (:func:`ridge_structure_weights`): 0 every spectrum once, 1 every structure once.
    fingerprint_head : bool
        On by default (``--model sisokr:fingerprint_head=false`` turns it off): with validation candidate sets,
        also fit the fingerprint likelihood head
        (:mod:`molpredict.models.fingerprint_head`) and keep it when it ranks them better; its score is added to
        the model's through the coordinates (``head_``, what it did in ``finetune``'s point as
        ``fingerprint_head``).
    head_lam : float or None
        The head's ridge regularisation (n * head_lam); None (the default): each of ``DEFAULT_HEAD_LAMS``, chosen
        on validation with the head's weight.
    """

    def __init__(self, input_kernel: str = DEFAULT_INPUT_KERNEL, output_kernel: str = DEFAULT_OUTPUT_KERNEL,
                 input_sketch: str | None = DEFAULT_INPUT_SKETCH,
                 output_sketch: str | None = DEFAULT_OUTPUT_SKETCH, lam: float | str = DEFAULT_LAM,
                 val_fraction: float = 0.1, device: str = "auto", dtype: str = "float64", seed: int = 0,
                 max_memory_gb: float = 4.0, pinv_rtol: float = 1e-10, select_by: str = "mrr",
                 rank_epochs: int = DEFAULT_RANK_EPOCHS, rank_lr: float = DEFAULT_RANK_LR,
                 rank_min_gain: float = DEFAULT_RANK_MIN_GAIN,
                 structure_balance: float = DEFAULT_STRUCTURE_BALANCE,
                 fingerprint_head: bool = DEFAULT_FINGERPRINT_HEAD, head_lam: float | None = None) -> None:
        super().__init__(input_kernel=input_kernel, output_kernel=output_kernel, input_sketch=input_sketch,
                         output_sketch=output_sketch, lam=lam, val_fraction=val_fraction, device=device,
                         dtype=dtype, seed=seed, max_memory_gb=max_memory_gb, pinv_rtol=pinv_rtol, select_by=select_by)
        self.rank_epochs = rank_epochs
        self.rank_lr = rank_lr
        self.rank_min_gain = rank_min_gain
        self.structure_balance = structure_balance
        self.fingerprint_head = fingerprint_head
        self.head_lam = head_lam
        if not isinstance(fingerprint_head, bool):
            raise SpecError(f"fingerprint_head must be true or false, got {fingerprint_head!r}")
        if head_lam is not None and (isinstance(head_lam, bool) or not isinstance(head_lam, (int, float))
                                     or not float(head_lam) > 0):
            raise SpecError(f"head_lam must be a positive number, got {head_lam!r}")
        if isinstance(structure_balance, bool) or not isinstance(structure_balance, (int, float)) \
                or not 0.0 <= float(structure_balance) <= 1.0:
            raise SpecError(f"structure_balance must be a number in [0, 1], got {structure_balance!r}")
