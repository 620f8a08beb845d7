"""The Nystrom feature map of a kernel on landmarks chosen by a registered sketch (one component for every model),
and the serialiser of landmark objects.

With R (m x n) a sketch of the n training objects and K~ = R K R^T = U D U^T (eigenvalues above ``rel_cutoff``
times the largest kept, rank p), the features

    f(x) = D^-1/2 U^T R k(x)  in R^p

are the coordinates of the orthogonal projection of k(x, .) onto span(R Phi), in an orthonormal basis of the
RKHS. Since R = A I[used] (see :mod:`molpredict.engine.sketches`), only the n' landmarks the sketch touches enter:
f(x) = k(x, landmarks) W with W = A^T U D^-1/2 (n' x p), the ``projection_``. Scaling R by c > 0 leaves f
unchanged. Users: the input side of the IOKR family (:mod:`molpredict.models.okr`, on torch), ``okr-robust``'s
input side, DSOKR's output basis (:class:`molpredict.models.basis.SketchedOutputBasis`, on distinct outputs) and
the ``kernel-mlp`` encoder.

Kernel fit. With ``fit_kernel_on="all"`` the kernel is fitted on all n objects (data-dependent parameters such
as ``gamma=auto`` are resolved on them, data-adaptive sketches see them, and the training features come from the
sketched rows R K without any n x n matrix); the map itself uses the kernel rebuilt from its resolved spec on the
landmarks, which is what a reloaded map has. With ``"landmarks"`` (``kernel-mlp``) only the landmarks are
featurised and the kernel is fitted on them; the sketch must then draw without the kernel (e.g. ``subsample``).
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Sequence

import numpy as np

from molpredict.lazy import lazy_module

from molpredict.component import frozen_spec
from molpredict.errors import ModelFileError, SpecError
from molpredict.engine.linalg import cut_eigenpairs, symmetric_eigh, truncated_eigh
from molpredict.kernels.base import (MAX_KERNEL_VALUE, Kernel, StateNotSaveable, all_degenerate_error,
                                     component_result_error, magnitude_problem)
from molpredict.engine.sketches import Sketch, make_sketch
from molpredict.specs import ComponentSpec, nested_spec, parse_spec

torch = lazy_module("torch")  # fitting and GPU paths only: not imported to predict

__all__ = ["Nystrom", "objects_to_state", "objects_from_state", "create_component", "restrict_kernel",
           "LazyLandmarks", "FITTED_KERNEL", "asymmetry_problem", "spectrum_problem", "magnitude_limit",
           "SYMMETRY_RTOL", "PSD_RTOL"]

#: metadata key (and array name part) of a map's fitted kernel state (:meth:`Kernel.get_fitted_state`)
FITTED_KERNEL = "fitted_kernel"

# ----------------------------------------------------------------------------------------------------------
# landmark objects in model files
# ----------------------------------------------------------------------------------------------------------

def objects_to_state(objects: Sequence[Any], prefix: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Serialise reference objects (molecules, strings, spectra or numeric vectors) without pickle.

    Molecules are written as SMILES, strings as themselves (JSON); spectra and vectors as arrays named
    ``prefix.*``.

    Returns
    -------
    arrays : dict of str to ndarray
    meta : dict
        ``{"type": "molecule" | "text" | "spectrum" | "vector" | "empty", ...}``
    """
    objects = list(objects)
    if not objects:
        return {}, {"type": "empty"}
    from molpredict.chem.molecules import Molecule
    from molpredict.spectra.record import Spectrum
    if all(isinstance(o, Molecule) for o in objects):
        return {}, {"type": "molecule", "smiles": [m.smiles for m in objects]}
    if all(isinstance(o, str) for o in objects):
        return {}, {"type": "text", "strings": [str(s) for s in objects]}
    if all(isinstance(o, Spectrum) for o in objects):
        from molpredict.io.arrays import spectra_to_arrays
        # landmark formulas are kernel input (formula-annotation); other metadata is not saved
        arrays, meta = spectra_to_arrays(objects, metadata_keys=("formula",))
        return {f"{prefix}.{k}": v for k, v in arrays.items()}, {"type": "spectrum", "spectra": meta}
    try:
        matrix = np.stack([np.asarray(o, dtype=np.float64) for o in objects])
    except (TypeError, ValueError):
        raise ModelFileError(f"cannot save reference objects of type {type(objects[0]).__name__}") from None
    return {f"{prefix}.vectors": matrix}, {"type": "vector"}


def objects_from_state(arrays: dict[str, np.ndarray], meta: dict[str, Any], prefix: str) -> list[Any]:
    """Inverse of :func:`objects_to_state`.

    Also reads the layout of IOKR-family files of state version 1 (arrays ``prefix_*``, ``"values"`` for text,
    type ``"array"`` with the matrix under ``prefix``).
    """
    kind = meta.get("type")
    if kind == "empty":
        return []
    if kind == "molecule":
        from molpredict.chem.molecules import Molecule
        return [Molecule.from_smiles(s) for s in meta["smiles"]]
    if kind == "text":
        return list(meta["strings"] if "strings" in meta else meta["values"])
    if kind == "spectrum":
        from molpredict.io.arrays import spectra_from_arrays
        for sep in (".", "_"):
            sub = {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + sep)}
            if sub:
                return spectra_from_arrays(sub, meta["spectra"])
        raise ModelFileError(f"model state lacks the spectra arrays {prefix}.*")
    if kind in ("vector", "array"):
        name = f"{prefix}.vectors" if kind == "vector" else prefix
        if name not in arrays:
            raise ModelFileError(f"model state lacks array {name}")
        return list(np.asarray(arrays[name], dtype=np.float64))
    raise ModelFileError(f"unknown reference object type {kind!r} in model state ({prefix})")


def create_component(kind: str, spec: Any, **overrides: Any) -> Any:
    """A registered component from a spec (nested specs with ``;`` accepted); an instance is copied as given."""
    if not isinstance(spec, (str, ComponentSpec)):
        return copy.deepcopy(spec)
    from molpredict.registry import create
    return create(kind, parse_spec(nested_spec(spec)), **overrides)


def restrict_kernel(kernel: Any, index: np.ndarray, objects: Sequence[Any] | None = None) -> Any:
    """A kernel equal to a fitted one whose reference objects are the rows ``index`` of its own.

    The fitted kernel is copied with its features sliced, keeping parameters (and vocabularies) resolved on all
    reference objects. A kernel whose ``pairwise`` does not work on sliced features (GraKeL graph kernels
    compare with the graphs their own fit saw: a wrong shape or a ``ValueError``) is instead rebuilt with its
    resolved parameters (:func:`frozen_spec` values) and fitted on ``objects``, the reference objects at
    ``index``.
    """
    kernel._check_fitted()
    index = np.asarray(index, dtype=np.int64)
    restricted = copy.copy(kernel)
    restricted.fit_features_ = kernel.take(kernel.fit_features_, index)
    restricted.fit_diag_ = np.asarray(kernel.fit_diag_)[index]
    restricted.n_fit_ = int(index.shape[0])
    if objects is None or not len(index):
        return restricted
    try:
        probe = restricted.pairwise(kernel.take(kernel.fit_features_, index[:1]), restricted.fit_features_)
        if np.shape(probe) == (1, len(index)):
            return restricted
    except ValueError:
        pass
    params = kernel.get_params()
    params.update({k: v for k, v in frozen_spec(kernel).params.items() if k in params})
    return type(kernel)(**params).fit(list(objects))


class LazyLandmarks:
    """A landmarks attribute (``landmarks_``, ``input_landmarks_``...): set by ``fit``, or decoded from a loaded
    state on first access, by the loader a ``from_state`` left in the instance's ``_landmark_loaders`` under the
    attribute's name (identification needs only the fitted kernel, never the landmark objects)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, model: Any, owner: type | None = None) -> Any:
        if model is None:
            return self
        values = model.__dict__
        if self.name not in values:
            load = values.get("_landmark_loaders", {}).pop(self.name, None)
            if load is None:
                raise AttributeError(self.name)
            values[self.name] = load()
        return values[self.name]

    def __set__(self, model: Any, value: Any) -> None:
        model.__dict__[self.name] = value


# ----------------------------------------------------------------------------------------------------------
# checks of the sketched kernel matrix (the eigensolver reads only its lower triangle and the cut drops its
# negative eigenvalues: an asymmetric or indefinite kernel would otherwise train quietly into garbage)
# ----------------------------------------------------------------------------------------------------------

#: largest max|K - K^T| / max|K| of the sketched kernel matrix taken as symmetric. A float64 kernel is symmetric to
#: round-off (~1e-16); one computed in float32 (embeddings, a GPU plugin) was measured at up to 9e-7 (cosine of
#: 300-dimensional vectors, different row blocks for k(a, b) and k(b, a)): 1e-5 leaves it a margin of 10, and an
#: asymmetry this small changes what the eigensolver (reading the lower triangle) sees by less than the PSD
#: tolerance. The asymmetric kernels that break a model differ by 1e-2 and more.
SYMMETRY_RTOL = 1e-5
#: an eigenvalue below -PSD_RTOL * the largest means the kernel is not positive semi-definite. Round-off gives
#: ~1e-15 of the largest in float64 and up to 1e-7 measured in float32 (the same cosine kernel); such eigenvalues
#: are dropped by the cut as before. An indefinite kernel (a distance, a box kernel) gives 1e-2 and more.
PSD_RTOL = 1e-5
#: side of the square tiles :func:`asymmetry_problem` compares (2 MB of float64: in cache)
_SYMMETRY_TILE = 512


def asymmetry_problem(K: torch.Tensor, rtol: float = SYMMETRY_RTOL) -> str | None:
    """What makes ``K`` not symmetric, or None: ``max|K - K^T| > rtol * max|K|``.

    Parameters
    ----------
    K : Tensor of shape (m, m)
        On any device. Compared in square tiles (i, j) against (j, i)^T over the upper triangle of tiles: no second
        m x m matrix, cache-friendly (m = 4000 on one CPU thread: 45 to 70 ms where ``(K - K.T).abs().max()`` took
        340 ms, against 9 to 15 s for the eigendecomposition).
    rtol : float

    Returns
    -------
    str or None
        E.g. ``"the sketched kernel matrix (10 x 10) is not symmetric: max|K - K^T| = 0.3 max|K| ..."``.
    """
    m = int(K.shape[0])
    if m == 0:
        return None
    b = _SYMMETRY_TILE
    diffs = [(K[i:i + b, j:j + b] - K[j:j + b, i:i + b].T).abs().max() for i in range(0, m, b) for j in range(i, m, b)]
    lowest, highest = torch.aminmax(K)  # one pass, no |K| copy
    worst, scale = float(torch.stack(diffs).max()), max(float(highest), -float(lowest))
    if worst <= rtol * scale:
        return None
    return (f"the sketched kernel matrix ({m} x {m}) is not symmetric: max|K - K^T| = {worst / scale:.3g} max|K| "
            f"(tolerance {rtol:g}); k(a, b) must equal k(b, a)")


def spectrum_problem(s: torch.Tensor | np.ndarray, rtol: float = PSD_RTOL) -> str | None:
    """What makes a symmetric matrix with eigenvalues ``s`` not positive semi-definite, or None: its smallest
    eigenvalue is below ``-rtol * max(largest, 0)`` (with no positive eigenvalue, any negative one).

    Parameters
    ----------
    s : Tensor or ndarray of shape (m,)
        All the eigenvalues, ascending.
    rtol : float
    """
    if len(s) == 0:
        return None
    smallest, largest = float(s[0]), float(s[-1])
    if smallest >= -rtol * max(largest, 0.0):
        return None
    return (f"the sketched kernel matrix ({len(s)} x {len(s)}) is not positive semi-definite: smallest eigenvalue "
            f"{smallest:.3g}, largest {largest:.3g} (tolerance {rtol:g} of the largest); if the kernel is only "
            "approximately PSD, set its psd attribute to False")


def magnitude_limit(dtype: torch.dtype) -> float:
    """The largest magnitude of kernel values that products in ``dtype`` take: the power of ten at most
    ``sqrt(largest / 1e8)`` (a value squared and summed over 1e8 objects stays finite), so 1e150 in float64
    (:data:`~molpredict.kernels.base.MAX_KERNEL_VALUE`) and 1e15 in float32."""
    largest = float(torch.finfo(dtype).max)
    return min(MAX_KERNEL_VALUE, 10.0 ** np.floor(np.log10(np.sqrt(largest / 1e8))))


def _check_magnitude(values: Any, what: str, kernel: Any, limit: float = MAX_KERNEL_VALUE) -> None:
    """Raise the error naming ``kernel`` when ``values`` (ndarray or Tensor; ``what`` says which matrix) hold a
    value that the linear algebra cannot use (:func:`~molpredict.kernels.base.magnitude_problem`)."""
    if isinstance(values, torch.Tensor):  # its two extremes, computed where it is (no copy of a GPU matrix)
        values = torch.stack(torch.aminmax(values)).cpu().numpy() if values.numel() else np.zeros(0)
    problem = magnitude_problem(np.asarray(values), limit)
    if problem is not None:
        raise component_result_error(kernel, "kernel", f"{what} has {problem}")


def _eigh(K: torch.Tensor, kernel: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~molpredict.engine.linalg.symmetric_eigh` of ``K`` in float64, its failure (LAPACK's or torch's
    ``LinAlgError``: the solver did not converge) the error naming ``kernel`` rather than an internal error."""
    errors = (np.linalg.LinAlgError, torch.linalg.LinAlgError)
    try:
        return symmetric_eigh(K.to(torch.float64))
    except errors as exc:
        m = int(K.shape[0])
        raise component_result_error(kernel, "kernel", f"the eigendecomposition of the sketched kernel matrix "
                                     f"({m} x {m}) failed ({type(exc).__name__}: {exc})") from None


def _checked_eigh(K: torch.Tensor, rtol: float, kernel: Any, psd: bool, stage: Callable[..., Any]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~molpredict.engine.linalg.truncated_eigh` of the sketched kernel matrix ``K`` (m, m), with its checks:
    an error naming ``kernel`` when ``K`` has a value too large for float64 (:func:`_check_magnitude`), is not
    symmetric, or (``psd``) not positive semi-definite, or when the eigensolver fails. The whole spectrum is needed
    for the PSD check and ``truncated_eigh`` returns only the kept part, so the decomposition is made here and cut by
    its rule (:func:`~molpredict.engine.linalg.cut_eigenpairs`): no second decomposition."""
    m = int(K.shape[0])
    _check_magnitude(K, f"the sketched kernel matrix ({m} x {m})", kernel)
    problem = asymmetry_problem(K)
    if problem is not None:
        raise component_result_error(kernel, "kernel", problem)
    with stage("eigh"):
        s, V = _eigh(K, kernel)  # ascending
    if psd:
        problem = spectrum_problem(s)
        if problem is not None:
            raise component_result_error(kernel, "kernel", problem)
    return cut_eigenpairs(s, V, rtol)


def _no_stage(name: str, shape: tuple[int, int, int] | None = None, kind: str = "gemm"):
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------------------
# the feature map
# ----------------------------------------------------------------------------------------------------------

class Nystrom:
    """The (whitened) Nystrom feature map of a kernel on landmarks chosen by a registered sketch.

    Parameters
    ----------
    kernel : str or Kernel
        Kernel spec (registry name and parameters; inside another spec written with ``;``) or an unfitted
        kernel instance (copied).
    sketch : str or Sketch or None
        Sketch spec (``subsample:m=2000``, ``p-sparsified-rademacher:m=800``) or instance; None / ``identity``
        for all objects. A spec without a seed gets ``seed``.
    rel_cutoff : float
        Relative eigenvalue cut-off of K~ (sets the rank p).
    seed : int or None
    kernel_kind : {"input_kernel", "output_kernel"}
        Registry kind of the kernel spec.
    whiten : bool
        False: the raw kernel values k(x, landmarks) (dimension n'), the landmarks still chosen by the sketch.
    fit_kernel_on : {"all", "landmarks"}
        See the module docstring.
    keep_rows : bool
        Keep the sketched kernel rows of the fitted objects, ``train_rows_ = R K`` (m x n), instead of their
        features ``train_features_ = whitening_ @ R K``: for a caller that needs only products of the features
        (``Z Z^T = P (R K)(R K)^T P^T`` costs half of forming Z first).

    Fitted attributes
    -----------------
    kernel_ : Kernel, fitted on the landmarks
    kernel_spec_ : str, the kernel's spec with resolved parameters
    sketch_ : Sketch (None after :meth:`from_state`)
    landmarks_ : list of the n' landmarks
    landmark_index_ : ndarray of shape (n',), int64, their positions among the fitted objects
    eigenvalues_ : ndarray of shape (p,), D (largest first; empty when not whitened)
    whitening_ : Tensor of shape (p, m), D^-1/2 U^T, on the fit's device and dtype (fit only)
    projection_ : ndarray of shape (n', p) or None (not whitened), W = A^T U D^-1/2
    rank_ : int, p (n' when not whitened)
    train_features_ : Tensor of shape (p, n) or None, f of the fitted objects (``fit_kernel_on="all"`` and
        whitened, without ``keep_rows``), on the fit's device and dtype; the caller may delete it
    train_rows_ : Tensor of shape (m, n) or None, R K of the fitted objects (with ``keep_rows``), likewise
    """

    landmarks_ = LazyLandmarks()

    def __init__(self, kernel: Any, sketch: Any = "subsample:m=2000", rel_cutoff: float = 1e-10,
                 seed: int | None = None, kernel_kind: str = "input_kernel", whiten: bool = True,
                 fit_kernel_on: str = "all", keep_rows: bool = False) -> None:
        self.kernel = kernel
        self.sketch = sketch
        self.rel_cutoff = rel_cutoff
        self.seed = seed
        self.kernel_kind = kernel_kind
        self.whiten = whiten
        self.fit_kernel_on = fit_kernel_on
        self.keep_rows = keep_rows

    # -- fitting -----------------------------------------------------------------------------------------
    def _make_sketch(self) -> Any:
        if isinstance(self.sketch, Sketch):
            return copy.deepcopy(self.sketch)
        spec = self.sketch if self.sketch is None or isinstance(self.sketch, ComponentSpec) else \
            nested_spec(self.sketch)
        return make_sketch(spec, seed=self.seed)

    def fit(self, objects: Sequence[Any], device: torch.device | None = None, dtype: torch.dtype | None = None,
            stage: Callable[..., Any] | None = None, groups: np.ndarray | None = None) -> "Nystrom":
        """Choose the landmarks among ``objects`` (length n) and build the map.

        Parameters
        ----------
        objects : sequence of what the kernel takes
        device, dtype
            Where the whitening and the training features are computed (default the CPU, float64;
            eigendecompositions in float64).
        stage : callable, optional
            ``stage(name, shape=None, kind="gemm")`` returning a context manager that times a step
            (the IOKR engine's profile); names: kernel_fit, sketch_fit, sketch_rows, landmark_kernel_fit, eigh,
            whiten.
        groups : ndarray of shape (n,), optional
            A label per object (e.g. its structure), for sketches that spread their draw over groups
            (``subsample:probs=groups``); the others ignore it.

        Raises
        ------
        PluginError (for a built-in kernel: InputError or RuntimeError)
            The kernel is 0 on every object (all self-similarities 0), or its sketched matrix is not symmetric
            (:func:`asymmetry_problem`) or, unless its ``psd`` attribute is False, not positive semi-definite
            (:func:`spectrum_problem`); the message names the kernel and its plugin.
        """
        objects = list(objects)
        if not objects:
            raise SpecError("Nystrom features: no objects to choose landmarks from")
        if self.fit_kernel_on not in ("all", "landmarks"):
            raise SpecError(f"Nystrom features: fit_kernel_on must be all or landmarks, got {self.fit_kernel_on!r}")
        stage = stage or _no_stage
        device = device or torch.device("cpu")
        dtype = torch.float64 if dtype is None else dtype
        n = len(objects)
        sketch = self._make_sketch()
        B = None
        if self.fit_kernel_on == "all":
            with stage("kernel_fit"):
                kernel = create_component(self.kernel_kind, self.kernel).fit(objects)
            error = all_degenerate_error(kernel)  # gram()'s unit diagonal would hide it: K = I, a model of nothing
            if error is not None:
                raise error
            with stage("sketch_fit"):
                sketch.fit(n, kernel, groups=groups)
            if self.whiten:
                with stage("sketch_rows"):
                    B = sketch.sketch_rows(kernel)  # (m, n) = R K
                if magnitude_limit(dtype) < MAX_KERNEL_VALUE:  # the kernel checked its values for float64 only
                    _check_magnitude(B, f"the sketched kernel rows ({B.shape[0]} x {B.shape[1]}) in {dtype}", kernel,
                                     magnitude_limit(dtype))
        else:
            if sketch.needs_kernel:
                raise SpecError(f"Nystrom features on the landmarks only need a sketch that draws without the "
                                f"kernel, not {sketch.to_spec()}")
            sketch.fit(n, groups=groups)
            kernel = None
        used = np.asarray(sketch.used_, dtype=np.int64)
        self.landmark_index_ = used
        self.landmarks_ = [objects[i] for i in used]
        with stage("landmark_kernel_fit"):
            if kernel is None:
                self.kernel_ = create_component(self.kernel_kind, self.kernel).fit(self.landmarks_)
                error = all_degenerate_error(self.kernel_)
                if error is not None:
                    raise error
            elif isinstance(self.kernel, (str, ComponentSpec)):
                self.kernel_ = create_component(self.kernel_kind, str(frozen_spec(kernel))).fit(self.landmarks_)
            else:  # an instance need not be registered: keep its fit, restricted to the landmarks
                self.kernel_ = restrict_kernel(kernel, used, self.landmarks_)
        del kernel
        self.kernel_spec_ = str(frozen_spec(self.kernel_))
        self.sketch_ = sketch
        self.train_features_ = self.train_rows_ = None
        if not self.whiten:
            self.eigenvalues_ = np.zeros(0)
            self.whitening_ = self.projection_ = None
            self.rank_ = len(used)
            return self
        K_tilde = sketch.apply_right((B[:, used] if B is not None else sketch.apply(self.kernel_.gram())))
        s, V = _checked_eigh(torch.as_tensor(K_tilde, dtype=torch.float64, device=device), float(self.rel_cutoff),
                             self.kernel_, bool(getattr(self.kernel_, "psd", True)), stage)
        if s.numel() == 0:
            raise SpecError("the sketched kernel matrix is zero (no direction to regress on): check the kernel "
                            "and the sketch")
        self.eigenvalues_ = s.cpu().numpy()
        self.rank_ = int(s.shape[0])
        self.whitening_ = (V.T * (1.0 / torch.sqrt(s))[:, None]).to(dtype)  # (p, m)
        self.projection_ = np.ascontiguousarray(
            sketch.apply_transpose(self.whitening_.to(torch.float64).cpu().numpy().T), dtype=np.float64)
        if B is not None:
            Bt = torch.as_tensor(B, dtype=dtype, device=device)
            del B
            if self.keep_rows:
                self.train_rows_ = Bt  # (m, n)
                return self
            with stage("whiten", (self.rank_, Bt.shape[0], Bt.shape[1])):
                self.train_features_ = self.whitening_ @ Bt  # (p, n)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "kernel_"):
            raise RuntimeError("Nystrom features are not fitted: call fit(objects) first")

    # -- features ----------------------------------------------------------------------------------------
    @property
    def dim_(self) -> int:
        """The number of features (p whitened, else the number of landmarks)."""
        self._check_fitted()
        return int(self.rank_)

    def transform(self, objects: Sequence[Any]) -> np.ndarray:
        """f of any objects: k(x, landmarks) W, shape (len(objects), dim_), float64."""
        self._check_fitted()
        objects = list(objects)
        if not objects:
            return np.zeros((0, self.dim_))
        values = self.kernel_.transform(objects)
        return values if self.projection_ is None else values @ self.projection_

    def transform_features(self, features: Any) -> np.ndarray:
        """f of objects already featurised by ``kernel_.featurize``, shape (len(features), dim_)."""
        self._check_fitted()
        values = self.kernel_.transform_features(features)
        return values if self.projection_ is None else values @ self.projection_

    # -- state -------------------------------------------------------------------------------------------
    def get_state(self, prefix: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays named ``prefix.*`` (landmarks, projection, eigenvalues, the fitted kernel's features under
        ``prefix.fitted_kernel``) and JSON metadata (the fitted kernel's under ``fitted_kernel``, None when it cannot
        be saved so)."""
        self._check_fitted()
        arrays, landmarks = objects_to_state(self.landmarks_, f"{prefix}.landmarks")
        if self.projection_ is not None:
            arrays[f"{prefix}.projection"] = self.projection_
            arrays[f"{prefix}.eigenvalues"] = self.eigenvalues_
        sketch = self.sketch_.to_spec() if self.sketch_ is not None else self.sketch
        meta = {"kernel": self.kernel_spec_, "sketch": str(sketch), "rel_cutoff": float(self.rel_cutoff),
                "kernel_kind": self.kernel_kind, "whiten": bool(self.whiten), "rank": self.rank_,
                "landmarks": landmarks, FITTED_KERNEL: None}
        try:
            kernel_arrays, meta[FITTED_KERNEL] = self.kernel_.get_fitted_state(f"{prefix}.{FITTED_KERNEL}")
            arrays.update(kernel_arrays)
        except (StateNotSaveable, AttributeError):  # AttributeError: a kernel not derived from Kernel
            pass
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any], prefix: str) -> "Nystrom":
        """Rebuild a map that gives the same :meth:`transform`: the kernel from its saved fitted state (nothing
        featurised; ``refitted_on_load_`` False), else refitted on the landmarks. Landmark objects are decoded on
        first access only.

        Also reads the landmark features of ``kernel-mlp`` / ``mlp`` encoders saved before this component
        (no projection saved: the whitening is recomputed from the landmarks, as it was then).
        """
        try:
            nys = cls(meta["kernel"], meta.get("sketch"), float(meta.get("rel_cutoff", 1e-10)),
                      kernel_kind=meta.get("kernel_kind", "input_kernel"), whiten=bool(meta.get("whiten", True)))
            landmarks_meta = meta["landmarks"]
        except (KeyError, TypeError) as exc:
            raise ModelFileError(f"Nystrom features state ({prefix}) lacks {exc}") from None
        nys._landmark_loaders = {"landmarks_": lambda: objects_from_state(arrays, landmarks_meta,
                                                                         f"{prefix}.landmarks")}
        nys.kernel_ = None
        if meta.get(FITTED_KERNEL):
            try:
                nys.kernel_ = Kernel.from_fitted_state(arrays, meta[FITTED_KERNEL])
            except StateNotSaveable:
                nys.kernel_ = None
        nys.refitted_on_load_ = nys.kernel_ is None
        if nys.kernel_ is None:
            nys.kernel_ = create_component(nys.kernel_kind, meta["kernel"]).fit(nys.landmarks_)
        n_landmarks = int(nys.kernel_.n_fit_)
        nys.landmark_index_ = np.arange(n_landmarks)
        nys.kernel_spec_ = str(meta["kernel"])
        nys.sketch_ = nys.whitening_ = nys.train_features_ = None
        if not nys.whiten:
            nys.projection_, nys.eigenvalues_, nys.rank_ = None, np.zeros(0), n_landmarks
            return nys
        if f"{prefix}.projection" in arrays:
            nys.projection_ = np.asarray(arrays[f"{prefix}.projection"], dtype=np.float64)
            nys.eigenvalues_ = np.asarray(arrays.get(f"{prefix}.eigenvalues", np.zeros(0)), dtype=np.float64)
        else:  # saved before the projection was: whiten K_LL of the landmarks
            s, V = truncated_eigh(nys.kernel_.gram(), nys.rel_cutoff)
            nys.projection_, nys.eigenvalues_ = V / np.sqrt(s), s
        nys.rank_ = int(nys.projection_.shape[1])
        if nys.projection_.shape[0] != n_landmarks:
            raise ModelFileError(f"Nystrom features state ({prefix}): {n_landmarks} landmarks for a "
                                 f"projection with {nys.projection_.shape[0]} rows")
        return nys
