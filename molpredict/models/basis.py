"""The sketched output basis of DSOKR: an orthonormal basis of span(R_y K_y rows) in the output RKHS H_y.

With R_y (m x n) a sketch of the n distinct training outputs and K~_y = R_y K_y R_y^T = U D U^T (keeping the
eigenvalues above ``rel_cutoff`` times the largest, rank p_y), the functions

    e_j = sum_i [R_y^T U D^-1/2]_ij k_y(y_i, .),   j = 1..p_y,

are orthonormal in H_y (<e_j, e_l> = [D^-1/2 U^T K~_y U D^-1/2]_jl = delta_jl), and the coordinates of the
orthogonal projection of k_y(y, .) onto their span are

    psi~(y) = D^-1/2 U^T R_y k_y^y  in R^{p_y}.

Since R_y = A I[used], only the n' landmark outputs that the sketch touches enter: psi~(y) = k_y(y, landmarks) W
with W = A^T U D^-1/2 (n' x p_y). Scaling R_y by c > 0 leaves psi~ unchanged (D scales by c^2).

Outputs are deduplicated before sketching (many spectra share a structure): the basis is built on distinct
outputs (by InChIKey for molecules) and ``inverse_`` maps each training sample to its distinct output.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import ModelFileError, SpecError
from ..specs import ComponentSpec, nested_spec, parse_spec
from ..component import frozen_spec
from .distinct import distinct_objects, output_key

__all__ = [
    "eigh_truncated",
    "output_key",
    "distinct_objects",
    "frozen_spec",
    "restrict_kernel",
    "objects_to_state",
    "objects_from_state",
    "SketchedOutputBasis",
]


def eigh_truncated(matrix: np.ndarray, rel_cutoff: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of a symmetric PSD matrix above a relative cut-off, in float64, largest first.

    Parameters
    ----------
    matrix : ndarray of shape (m, m)
    rel_cutoff : float
        Eigenvalues <= ``rel_cutoff * max(eigenvalue)`` are dropped (duplicates in a sketch make the matrix
        singular; this is where that is handled).

    Returns
    -------
    eigenvalues : ndarray of shape (p,)
    eigenvectors : ndarray of shape (m, p)
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    matrix = 0.5 * (matrix + matrix.T)
    values, vectors = np.linalg.eigh(matrix)
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    top = values[0] if values.size else 0.0
    if top <= 0:
        return values[:0], vectors[:, :0]
    keep = values > rel_cutoff * top
    return values[keep], vectors[:, keep]


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


def objects_to_state(objects: Sequence[Any], prefix: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Serialise reference objects (molecules, strings, spectra or numeric vectors) without pickle.

    Molecules are written as SMILES, strings as themselves (JSON); spectra and vectors as arrays named
    ``prefix.*``.

    Returns
    -------
    arrays : dict of str to ndarray
    meta : dict
        ``{"type": "molecule" | "text" | "spectrum" | "vector", ...}``
    """
    objects = list(objects)
    if not objects:
        return {}, {"type": "empty"}
    first = objects[0]
    from ..molecules import Molecule
    from ..spectra import Spectrum
    if isinstance(first, Molecule):
        return {}, {"type": "molecule", "smiles": [m.smiles for m in objects]}
    if isinstance(first, str):
        return {}, {"type": "text", "strings": [str(s) for s in objects]}
    if isinstance(first, Spectrum):
        from ..io.arrays import spectra_to_arrays
        arrays, meta = spectra_to_arrays(objects)
        return {f"{prefix}.{k}": v for k, v in arrays.items()}, {"type": "spectrum", "spectra": meta}
    try:
        matrix = np.stack([np.asarray(o, dtype=np.float64) for o in objects])
    except (TypeError, ValueError):
        raise ModelFileError(f"cannot save reference objects of type {type(first).__name__}") from None
    return {f"{prefix}.vectors": matrix}, {"type": "vector"}


def objects_from_state(arrays: dict[str, np.ndarray], meta: dict[str, Any], prefix: str) -> list[Any]:
    """Inverse of :func:`objects_to_state`."""
    kind = meta.get("type")
    if kind == "empty":
        return []
    if kind == "molecule":
        from ..molecules import Molecule
        return [Molecule.from_smiles(s) for s in meta["smiles"]]
    if kind == "text":
        return list(meta["strings"])
    if kind == "spectrum":
        from ..io.arrays import spectra_from_arrays
        sub = {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + ".")}
        return spectra_from_arrays(sub, meta["spectra"])
    if kind == "vector":
        try:
            return list(np.asarray(arrays[f"{prefix}.vectors"], dtype=np.float64))
        except KeyError:
            raise ModelFileError(f"model state lacks array {prefix}.vectors") from None
    raise ModelFileError(f"unknown reference object type {kind!r} in model state")


def _create(kind: str, spec: Any, **overrides: Any) -> Any:
    if not isinstance(spec, (str, ComponentSpec)):
        return spec  # an instance, used as given
    from ..registry import create
    spec = parse_spec(nested_spec(spec))
    return create(kind, spec, **overrides)


def _dense(matrix: Any) -> np.ndarray:
    return np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix, dtype=np.float64)


class SketchedOutputBasis:
    """Orthonormal basis of the sketched output subspace, and the coordinates of outputs in it.

    Parameters
    ----------
    output_kernel : str or Kernel
        Output kernel spec (``gaussian-tanimoto:gamma=auto``) or an unfitted kernel instance.
    output_sketch : str or Sketch
        Sketch spec (``subsample:m=1000``) or an unfitted sketch instance. A sketch with more rows than
        there are distinct outputs is shrunk to that number.
    rel_cutoff : float
        Relative eigenvalue cut-off of K~_y (sets the rank p_y).
    seed : int or None
        Random state of the sketch (when the spec does not set one).
    deduplicate : bool
        Build on distinct objects (by :func:`output_key`). False for inputs: spectra carry their structure's
        InChIKey but are not duplicates of one another.
    kernel_kind : {"output_kernel", "input_kernel"}
        Registry kind of the kernel spec. With ``input_kernel`` the same construction gives the sketched
        (Nystrom) feature map of the inputs, orthonormal in H_x.

    Fitted attributes
    -----------------
    distinct_ : list, the n_d distinct training outputs
    inverse_ : ndarray of shape (n,), int64, sample -> distinct output
    landmarks_ : list, the n' distinct outputs the sketch touches
    landmark_index_ : ndarray of shape (n',), int64, their positions in ``distinct_``
    projection_ : ndarray of shape (n', p_y), W = A^T U D^-1/2
    eigenvalues_ : ndarray of shape (p_y,), D (largest first)
    rank_ : int, p_y
    train_coordinates_ : ndarray of shape (n_d, p_y), psi~ of the distinct training outputs
    kernel_ : the output kernel with the landmarks as reference objects
    sketch_ : the fitted sketch (None after :meth:`from_state`)
    """

    def __init__(self, output_kernel: Any = "gaussian-tanimoto:gamma=auto", output_sketch: Any = "subsample:m=1000",
                 rel_cutoff: float = 1e-10, seed: int | None = None, deduplicate: bool = True,
                 kernel_kind: str = "output_kernel") -> None:
        self.output_kernel = output_kernel
        self.output_sketch = output_sketch
        self.rel_cutoff = rel_cutoff
        self.seed = seed
        self.deduplicate = deduplicate
        self.kernel_kind = kernel_kind

    # -- fitting -----------------------------------------------------------------------------------------
    def _make_sketch(self, n_distinct: int) -> Any:
        if not isinstance(self.output_sketch, (str, ComponentSpec)):
            return copy.deepcopy(self.output_sketch)
        spec = parse_spec(nested_spec(self.output_sketch))
        params = dict(spec.params)
        if isinstance(params.get("m"), int) and params["m"] > n_distinct:
            params["m"] = n_distinct
        return _create("sketch", ComponentSpec(spec.name, params), seed=self.seed)

    def fit(self, objects: Sequence[Any]) -> "SketchedOutputBasis":
        """Build the basis from the training outputs (duplicates allowed).

        Parameters
        ----------
        objects : sequence of Molecule (or whatever the output kernel takes), length n
        """
        objects = list(objects)
        if not objects:
            raise SpecError("cannot build an output basis from no outputs")
        if self.deduplicate:
            self.distinct_, self.inverse_ = distinct_objects(objects)
        else:
            self.distinct_, self.inverse_ = objects, np.arange(len(objects), dtype=np.int64)
        n_d = len(self.distinct_)
        kernel = _create(self.kernel_kind, self.output_kernel)
        kernel.fit(self.distinct_)
        sketch = self._make_sketch(n_d)
        sketch.fit(n_d, kernel=kernel)
        used = np.asarray(sketch.used_, dtype=np.int64)
        k_used = kernel.gram(used)                              # (n', n_d) = K[used, :]
        a = sketch.A_
        k_tilde = _dense(a @ _dense(a @ k_used[:, used]).T)     # A K[used, used] A^T, symmetric
        values, vectors = eigh_truncated(k_tilde, self.rel_cutoff)
        if values.size == 0:
            raise SpecError("the sketched output Gram matrix is zero: no output basis (check the output kernel)")
        self.eigenvalues_ = values
        self.rank_ = int(values.shape[0])
        self.projection_ = _dense(a.T @ (vectors / np.sqrt(values)[None, :]))   # (n', p)
        self.landmark_index_ = used
        self.landmarks_ = [self.distinct_[i] for i in used]
        self.train_coordinates_ = k_used.T @ self.projection_                   # (n_d, p)
        self.kernel_ = restrict_kernel(kernel, used, self.landmarks_)
        self.sketch_ = sketch
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "projection_"):
            raise RuntimeError("SketchedOutputBasis is not fitted: call fit(outputs) first")

    # -- coordinates -------------------------------------------------------------------------------------
    def coordinates(self, objects: Sequence[Any]) -> np.ndarray:
        """psi~ of any outputs (candidates): k_y(y, landmarks) W.

        Returns
        -------
        ndarray of shape (len(objects), p_y), float64
        """
        self._check_fitted()
        objects = list(objects)
        if not objects:
            return np.zeros((0, self.rank_))
        return self.kernel_.transform(objects) @ self.projection_

    def featurize(self, objects: Sequence[Any]) -> Any:
        """The output kernel's features of ``objects``, for repeated :meth:`coordinates_of_features` calls."""
        self._check_fitted()
        return self.kernel_.featurize(list(objects))

    def coordinates_of_features(self, features: Any) -> np.ndarray:
        """psi~ of already-featurised outputs (features from :meth:`featurize` of a basis whose kernel was fitted
        on the same training outputs), shape (len(features), p_y)."""
        self._check_fitted()
        return self.kernel_.transform_features(features) @ self.projection_

    def sample_coordinates(self) -> np.ndarray:
        """psi~ of each training sample (duplicates repeated), shape (n, p_y)."""
        self._check_fitted()
        return self.train_coordinates_[self.inverse_]

    def diagonal(self, objects: Sequence[Any]) -> np.ndarray:
        """k_y(y, y) of outputs, shape (len(objects),) (ones for a normalised kernel)."""
        self._check_fitted()
        return np.asarray(self.kernel_.diagonal(list(objects)), dtype=np.float64)

    def cross_gram(self, other: "SketchedOutputBasis") -> np.ndarray:
        """<e_j, f_l> between this basis and another on the same output kernel, shape (p_y, p_y_other)."""
        self._check_fitted()
        other._check_fitted()
        k = self.kernel_.transform(other.landmarks_)              # (n'_other, n')
        return self.projection_.T @ k.T @ other.projection_

    # -- state -------------------------------------------------------------------------------------------
    def get_state(self, prefix: str = "output") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What :meth:`coordinates` needs: arrays named ``prefix.*`` and JSON metadata.

        The training outputs themselves are not saved (only the landmarks).
        """
        self._check_fitted()
        arrays, landmarks = objects_to_state(self.landmarks_, f"{prefix}.landmarks")
        arrays[f"{prefix}.projection"] = self.projection_
        arrays[f"{prefix}.eigenvalues"] = self.eigenvalues_
        meta = {
            "kernel": str(frozen_spec(self.kernel_)),
            "sketch": str(self.sketch_.to_spec()) if self.sketch_ is not None and hasattr(self.sketch_, "to_spec")
            else str(self.output_sketch),
            "rel_cutoff": float(self.rel_cutoff),
            "kernel_kind": self.kernel_kind,
            "rank": self.rank_,
            "landmarks": landmarks,
        }
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any], prefix: str = "output"
                   ) -> "SketchedOutputBasis":
        """Rebuild a basis that gives the same :meth:`coordinates` (the kernel refitted on the landmarks)."""
        try:
            basis = cls(meta["kernel"], meta["sketch"], float(meta["rel_cutoff"]),
                        kernel_kind=meta.get("kernel_kind", "output_kernel"))
            basis.projection_ = np.asarray(arrays[f"{prefix}.projection"], dtype=np.float64)
            basis.eigenvalues_ = np.asarray(arrays[f"{prefix}.eigenvalues"], dtype=np.float64)
            landmarks_meta = meta["landmarks"]
        except KeyError as exc:
            raise ModelFileError(f"output basis state lacks {exc.args[0]!r}") from None
        basis.rank_ = int(basis.projection_.shape[1])
        basis.landmarks_ = objects_from_state(arrays, landmarks_meta, f"{prefix}.landmarks")
        if len(basis.landmarks_) != basis.projection_.shape[0]:
            raise ModelFileError(f"output basis state: {len(basis.landmarks_)} landmarks for a projection with "
                                 f"{basis.projection_.shape[0]} rows")
        basis.kernel_ = _create(basis.kernel_kind, meta["kernel"]).fit(basis.landmarks_)
        basis.landmark_index_ = np.arange(len(basis.landmarks_))
        basis.sketch_ = None
        return basis
