"""Multiple-kernel learning (``mkl``): a weighted sum of normalised input kernels, the weights uniform or
learnt by centered kernel-target alignment (the MKL of IOKR and CSI:FingerID).

``k(x, x') = sum_i w_i k_i(x, x') / sqrt(d(x) d(x'))`` with ``d(x) = sum_i w_i [k_i(x, x) > 0]``, each ``k_i``
cosine-normalised: for two objects every kernel can compare it is exactly the weighted average; an object one
kernel cannot describe (a spectrum without a formula for ``formula-annotation``, without peaks...) is compared
by the remaining kernels only, still with ``k(x, x) = 1``. A non-negative sum of PSD kernels, rescaled by
``D^-1/2 . D^-1/2``, is PSD.

Weights (``weights=``):

- ``uniform``: ``w_i = 1 / n_kernels``;
- ``alignment``: ``w_i`` proportional to ``max(0, A(K_i, K_y))``, the centered alignment (Cortes, Mohri &
  Rostamizadeh, JMLR 2012) ``A(K, L) = <K_c, L_c>_F / (|K_c|_F |L_c|_F)``, ``K_c = H K H``, between each input
  Gram matrix and the output Gram matrix of the labels;
- ``alignf``: ALIGNF of the same paper, the weights maximising the alignment of the *combined* kernel:
  ``v = argmin_{v >= 0} v^T M v - 2 v^T a`` with ``M_ij = <K_ci, K_cj>_F``, ``a_i = <K_ci, K_y,c>_F`` (a
  non-negative least squares on the Cholesky factor of ``M``), normalised to sum 1; it discounts kernels that
  repeat each other, which the per-kernel alignment does not;
- explicit numbers ``w1+w2+...``.

The alignments are computed at :meth:`MKLKernel.fit` on a seeded sample of at most ``n_align`` fitted objects whose
structure is known, read from the spectra's own ``smiles`` metadata (the training labels; a kernel's ``fit``
only sees the inputs), with the output kernel ``target``. The fitted kernel's spec (``frozen_spec``) carries
the resolved weights and sub-kernel parameters, so a model reloaded and refitted on its landmarks never needs
labels.

Spec syntax: sub-kernels separated by ``+``, each with its own parameters separated by ``&``, weights by ``+``,
e.g. ``mkl:kernels=ppk-losses:loss_weight=0.3&ppm=5+formula-annotation+cosine,weights=alignment`` or
``weights=0.6+0.3+0.1``. (Not ``;``: a spec given as a nested parameter has every ``;`` read as ``,``, see
:func:`molpredict.specs.nested_spec`, which would split the list.) The ``target`` spec writes its parameters
with ``&`` too.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from molpredict.component import frozen_spec
from molpredict.errors import InputError, SpecError
from molpredict.specs import format_value
from molpredict.kernels.base import DegenerateObjectWarning, InputKernel, _warn_degenerate, normalize_block, saveable
from molpredict.kernels.spectra import BLOCK_CELLS, peaks_cleaned_once

__all__ = ["split_kernel_list", "centered_gram", "centered_alignment", "alignf_weights", "MKLKernel"]


def split_kernel_list(text: str) -> list[str]:
    """``"a:p=1&q=2+b+c:r=3"`` -> ``["a:p=1,q=2", "b", "c:r=3"]`` (see the module docstring).

    Raises
    ------
    SpecError
        An empty list or an empty item.
    """
    items = [part.strip() for part in str(text).split("+")]
    if not any(items):
        raise SpecError(f"mkl kernels {text!r}: no kernel given")
    if not all(items):
        raise SpecError(f"mkl kernels {text!r}: an empty kernel between '+' signs")
    return [item.replace("&", ",") for item in items]


def _nested(spec: Any) -> str:
    """A spec written for the ``kernels`` list: its parameters separated by ``&``."""
    return str(spec).replace(",", "&")


def centered_gram(K: np.ndarray) -> np.ndarray:
    """``H K H`` with ``H = I - 11^T / n``, shape (n, n)."""
    K = np.asarray(K, dtype=np.float64)
    row = K.mean(axis=0, keepdims=True)
    col = K.mean(axis=1, keepdims=True)
    return K - row - col + K.mean()


def centered_alignment(K: np.ndarray, L: np.ndarray) -> float:
    """Centered alignment ``<K_c, L_c>_F / (|K_c|_F |L_c|_F)`` of two Gram matrices (0 when either centered
    matrix is zero)."""
    Kc, Lc = centered_gram(K), centered_gram(L)
    denom = float(np.linalg.norm(Kc) * np.linalg.norm(Lc))
    return float(np.sum(Kc * Lc) / denom) if denom > 0 else 0.0


def alignf_weights(grams: Sequence[np.ndarray], target: np.ndarray) -> np.ndarray:
    """ALIGNF weights (Cortes et al. 2012): ``argmin_{v >= 0} v^T M v - 2 v^T a``, normalised to sum 1.

    Parameters
    ----------
    grams : sequence of p ndarrays of shape (n, n)
    target : ndarray of shape (n, n)

    Returns
    -------
    ndarray of shape (p,), non-negative, sum 1 (uniform when every alignment is <= 0)
    """
    centered = [centered_gram(K) for K in grams]
    Lc = centered_gram(target)
    p = len(centered)
    M = np.array([[np.sum(centered[i] * centered[j]) for j in range(p)] for i in range(p)])
    a = np.array([np.sum(Kc * Lc) for Kc in centered])
    # v^T M v - 2 v^T a = |R v - R^-T a|^2 - const with M = R^T R; a relative jitter keeps R defined
    jitter = 1e-10 * max(float(np.trace(M)), 1e-300)
    import scipy.linalg  # here: ALIGNF weights are learnt at fit only; a loaded kernel never needs scipy.linalg
    import scipy.optimize

    R = scipy.linalg.cholesky(M + jitter * np.eye(p), lower=False)
    v, _ = scipy.optimize.nnls(R, scipy.linalg.solve_triangular(R, a, trans="T"))
    total = float(v.sum())
    return v / total if total > 0 else np.full(p, 1.0 / p)


@saveable
@dataclass
class _MKLFeatures:
    """Each sub-kernel's features of a batch, with their raw self-similarities."""

    parts: list
    diags: list

    def __len__(self) -> int:
        return len(self.diags[0])


class MKLKernel(InputKernel):
    """Weighted sum of normalised input kernels (registry name ``mkl``); see the module docstring.

    Parameters
    ----------
    kernels : str
        Sub-kernel specs separated by ``+`` (their parameters by ``&``).
    weights : str or float
        ``"uniform"``, ``"alignment"``, ``"alignf"``, or the weights ``"w1+w2+..."`` (non-negative, not all 0).
    target : str
        Output kernel spec used for the alignments (parameters separated by ``&``).
    n_align : int
        Largest number of objects the alignments are computed on.
    seed : int
        Seed of that sample.

    Fitted attributes
    -----------------
    kernels_ : str
        The sub-kernel specs with their data-dependent parameters resolved.
    weights_ : str
        The weights used, ``"w1+w2+..."`` (summing to 1).
    subkernels_ : list of fitted Kernel
    alignments_ : list of float or None
        Centered alignment of each sub-kernel with the target (when learnt).
    """

    def __init__(self, kernels: str = "ppk-losses+formula-annotation+ppk-pairs", weights: Any = "uniform",
                 target: str = "gaussian-tanimoto", n_align: int = 1000, seed: int = 0) -> None:
        self.kernels = kernels
        self.weights = weights
        self.target = target
        self.n_align = n_align
        self.seed = seed
        self._specs = split_kernel_list(kernels)
        if isinstance(n_align, bool) or not isinstance(n_align, int) or n_align < 4:
            raise SpecError(f"n_align must be an integer >= 4, not {n_align!r}")
        self._fixed = self._parse_weights(weights)

    def _parse_weights(self, weights: Any) -> np.ndarray | None:
        if weights in ("uniform", "alignment", "alignf"):
            return np.full(len(self._specs), 1.0 / len(self._specs)) if weights == "uniform" else None
        try:
            values = np.array([float(w) for w in str(format_value(weights)).split("+")], dtype=np.float64)
        except ValueError:
            raise SpecError(f"mkl weights must be uniform, alignment, alignf or numbers w1+w2+..., not "
                            f"{weights!r}") from None
        if values.size != len(self._specs) or np.any(~np.isfinite(values)) or np.any(values < 0) or not values.sum() > 0:
            raise SpecError(f"mkl weights {weights!r}: need {len(self._specs)} non-negative numbers, not all 0")
        return values / values.sum()

    @property
    def psd(self) -> bool:  # type: ignore[override]
        return all(getattr(k, "psd", True) for k in getattr(self, "subkernels_", []))

    #: the sub-kernels' blocks are computed together, as one block of this kernel
    block_cells = BLOCK_CELLS

    @property
    def rows_in_processes(self) -> bool:  # type: ignore[override]
        """Whether every fitted sub-kernel's rows may run on worker processes (then the sum's may)."""
        subkernels = getattr(self, "subkernels_", [])
        return bool(subkernels) and all(getattr(k, "rows_in_processes", False) for k in subkernels)

    @property
    def reads_formula(self) -> bool:  # type: ignore[override]
        """Whether one of the fitted kernels reads the spectrum's formula."""
        return any(getattr(k, "reads_formula", False) for k in getattr(self, "subkernels_", []))

    # -- fitting -----------------------------------------------------------------------------------------
    def fit(self, objects: Sequence[Any]) -> "MKLKernel":
        from molpredict.registry import create

        objects = list(objects)
        self.subkernels_ = []
        with peaks_cleaned_once():  # the sub-kernels featurise the same spectra: each is cleaned once
            for spec in self._specs:
                kernel = create("input_kernel", spec)
                with warnings.catch_warnings():  # reported once below, for the combination
                    warnings.simplefilter("ignore", DegenerateObjectWarning)
                    kernel.fit(objects)
                self.subkernels_.append(kernel)
        self.kernels_ = "+".join(_nested(frozen_spec(k)) for k in self.subkernels_)
        self.alignments_ = None
        w = self._fixed if self._fixed is not None else self._learn_weights(objects)
        self.weights_vector_ = w
        self.weights_ = "+".join(repr(float(x)) for x in w)
        self.fit_features_ = _MKLFeatures([k.fit_features_ for k in self.subkernels_],
                                          [k.fit_diag_ for k in self.subkernels_])
        self.fit_diag_ = self.self_similarity(self.fit_features_)
        self.n_fit_ = len(objects)
        _warn_degenerate(self, int(np.count_nonzero(self.fit_diag_ <= 0)), self.n_fit_, "fit")
        return self

    def _learn_weights(self, objects: list[Any]) -> np.ndarray:
        from molpredict.chem.molecules import Molecule
        from molpredict.registry import create

        labelled = [i for i, o in enumerate(objects) if getattr(o, "smiles", None)]
        rng = np.random.default_rng(int(self.seed))
        if len(labelled) > self.n_align:
            labelled = sorted(rng.choice(labelled, self.n_align, replace=False).tolist())
        molecules, rows = [], []
        for i in labelled:
            try:
                molecules.append(Molecule.from_smiles(objects[i].smiles))
                rows.append(i)
            except InputError:
                continue
        if len(rows) < 4:
            raise SpecError(f"mkl weights={self.weights}: need at least 4 fitted objects with a structure "
                            f"(smiles metadata) to learn the weights, got {len(rows)}")
        sample = [objects[i] for i in rows]
        target = create("output_kernel", str(self.target).replace("&", ",")).fit(molecules).gram()
        grams = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateObjectWarning)
            for kernel in self.subkernels_:
                grams.append(create("input_kernel", str(frozen_spec(kernel))).fit(sample).gram())
        self.alignments_ = [centered_alignment(K, target) for K in grams]
        if self.weights == "alignf":
            return alignf_weights(grams, target)
        a = np.maximum(np.array(self.alignments_), 0.0)
        return a / a.sum() if a.sum() > 0 else np.full(len(grams), 1.0 / len(grams))

    def _check_fitted(self) -> None:
        if not hasattr(self, "subkernels_"):
            raise RuntimeError("MKLKernel is not fitted: call fit(objects) first")

    # -- the kernel template -----------------------------------------------------------------------------
    def featurize(self, objects: Sequence[Any]) -> _MKLFeatures:
        self._check_fitted()
        objects = list(objects)
        with peaks_cleaned_once():  # the sub-kernels read the same spectra: each is cleaned once
            parts = [k._featurize(objects) for k in self.subkernels_]
        # each sub-kernel's results checked as the base class checks a kernel's own, the error naming that sub-kernel
        diags = [k._self_similarity(p, len(objects)) for k, p in zip(self.subkernels_, parts)]
        return _MKLFeatures(parts, diags)

    def take(self, features: _MKLFeatures, index: np.ndarray | slice) -> _MKLFeatures:
        return _MKLFeatures([k.take(p, index) for k, p in zip(self.subkernels_, features.parts)],
                            [d[index] for d in features.diags])

    def pairwise(self, fa: _MKLFeatures, fb: _MKLFeatures) -> np.ndarray:
        out = np.zeros((len(fa), len(fb)), dtype=np.float64)
        for w, kernel, pa, pb, da, db in zip(self.weights_vector_, self.subkernels_, fa.parts, fb.parts, fa.diags,
                                             fb.diags):
            if w == 0:
                continue
            # the sum is computed here, not by the sub-kernel's _block: its block of another shape would broadcast
            raw = kernel._checked(kernel.pairwise(pa, pb), (len(da), len(db)), "pairwise")
            out += w * (normalize_block(raw, da, db) if kernel.normalized else raw)
        return out

    def self_similarity(self, features: _MKLFeatures) -> np.ndarray:
        total = np.zeros(len(features), dtype=np.float64)
        for w, kernel, d in zip(self.weights_vector_, self.subkernels_, features.diags):
            total += w * ((d > 0) if kernel.normalized else d)
        return total
