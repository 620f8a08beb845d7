"""The sketched output basis of DSOKR: an orthonormal basis of span(R_y K_y rows) in the output RKHS H_y.

With R_y (m x n) a sketch of the n distinct training outputs and K~_y = R_y K_y R_y^T = U D U^T (keeping the
eigenvalues above ``rel_cutoff`` times the largest, rank p_y), the functions

    e_j = sum_i [R_y^T U D^-1/2]_ij k_y(y_i, .),   j = 1..p_y,

are orthonormal in H_y (<e_j, e_l> = [D^-1/2 U^T K~_y U D^-1/2]_jl = delta_jl), and the coordinates of the
orthogonal projection of k_y(y, .) onto their span are

    psi~(y) = D^-1/2 U^T R_y k_y^y  in R^{p_y}.

Since R_y = A I[used], only the n' landmark outputs that the sketch touches enter: psi~(y) = k_y(y, landmarks) W
with W = A^T U D^-1/2 (n' x p_y). Scaling R_y by c > 0 leaves psi~ unchanged (D scales by c^2).

The construction is the Nystrom feature map of :mod:`molpredict.engine.nystrom` on the distinct outputs (this class adds
the deduplication and what DSOKR needs around it).

Outputs are deduplicated before sketching (many spectra share a structure): the basis is built on distinct
outputs (by InChIKey for molecules) and ``inverse_`` maps each training sample to its distinct output.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from molpredict.errors import SpecError
from molpredict.engine.nystrom import Nystrom
from molpredict.specs import ComponentSpec, nested_spec, parse_spec
from molpredict.models.distinct import distinct_objects, output_key

__all__ = ["output_key", "distinct_objects", "SketchedOutputBasis"]

#: fitted attributes a basis reads from its Nystrom map
_MAP_ATTRIBUTES = frozenset({"eigenvalues_", "rank_", "projection_", "landmark_index_", "landmarks_", "kernel_",
                             "sketch_"})


class SketchedOutputBasis:
    """Orthonormal basis of the sketched output subspace, and the coordinates of outputs in it.

    Parameters
    ----------
    output_kernel : str or Kernel
        Output kernel spec (``gaussian-tanimoto:gamma=auto``) or an unfitted kernel instance.
    output_sketch : str or Sketch
        Sketch spec (``subsample:m=1000``) or an unfitted sketch instance. A sketch spec with more rows than
        there are distinct outputs is shrunk to that number.
    rel_cutoff : float
        Relative eigenvalue cut-off of K~_y (sets the rank p_y).
    seed : int or None
        Random state of the sketch (when the spec does not set one).

    Fitted attributes
    -----------------
    distinct_ : list, the n_d distinct training outputs
    inverse_ : ndarray of shape (n,), int64, sample -> distinct output
    features_ : Nystrom, the feature map psi~ on the distinct outputs
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
                 rel_cutoff: float = 1e-10, seed: int | None = None) -> None:
        self.output_kernel = output_kernel
        self.output_sketch = output_sketch
        self.rel_cutoff = rel_cutoff
        self.seed = seed

    # -- fitting -----------------------------------------------------------------------------------------
    def _sketch_for(self, n_distinct: int) -> Any:
        if not isinstance(self.output_sketch, (str, ComponentSpec)):
            return self.output_sketch
        spec = parse_spec(nested_spec(self.output_sketch))
        params = dict(spec.params)
        if isinstance(params.get("m"), int) and params["m"] > n_distinct:
            params["m"] = n_distinct
        return ComponentSpec(spec.name, params)

    def fit(self, objects: Sequence[Any]) -> "SketchedOutputBasis":
        """Build the basis from the training outputs (duplicates allowed).

        Parameters
        ----------
        objects : sequence of Molecule (or whatever the output kernel takes), length n
        """
        objects = list(objects)
        if not objects:
            raise SpecError("cannot build an output basis from no outputs")
        self.distinct_, self.inverse_ = distinct_objects(objects)
        features = Nystrom(self.output_kernel, self._sketch_for(len(self.distinct_)), float(self.rel_cutoff),
                           seed=self.seed, kernel_kind="output_kernel").fit(self.distinct_)
        self.train_coordinates_ = features.train_features_.T.cpu().numpy()   # (n_d, p)
        features.train_features_ = None
        self._set_features(features)
        return self

    def _set_features(self, features: Nystrom) -> None:
        self.features_ = features

    def __getattr__(self, name: str) -> Any:
        # the fitted attributes of the feature map (projection_, eigenvalues_, rank_, landmarks_, kernel_, ...)
        if name in _MAP_ATTRIBUTES and "features_" in self.__dict__:
            return getattr(self.__dict__["features_"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _check_fitted(self) -> None:
        if not hasattr(self, "features_"):
            raise RuntimeError("SketchedOutputBasis is not fitted: call fit(outputs) first")

    # -- coordinates -------------------------------------------------------------------------------------
    def coordinates(self, objects: Sequence[Any]) -> np.ndarray:
        """psi~ of any outputs (candidates): k_y(y, landmarks) W.

        Returns
        -------
        ndarray of shape (len(objects), p_y), float64
        """
        self._check_fitted()
        return self.features_.transform(objects)

    def featurize(self, objects: Sequence[Any]) -> Any:
        """The output kernel's features of ``objects``, for repeated :meth:`coordinates_of_features` calls."""
        self._check_fitted()
        return self.kernel_.featurize(list(objects))

    def coordinates_of_features(self, features: Any) -> np.ndarray:
        """psi~ of already-featurised outputs (features from :meth:`featurize` of a basis whose kernel was fitted
        on the same training outputs), shape (len(features), p_y)."""
        self._check_fitted()
        return self.features_.transform_features(features)

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
        """What :meth:`coordinates` needs: arrays named ``prefix.*`` and JSON metadata (the Nystrom map's).

        The training outputs themselves are not saved (only the landmarks).
        """
        self._check_fitted()
        return self.features_.get_state(prefix)

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any], prefix: str = "output"
                   ) -> "SketchedOutputBasis":
        """Rebuild a basis that gives the same :meth:`coordinates` (the kernel refitted on the landmarks)."""
        meta = dict(meta)
        meta.setdefault("kernel_kind", "output_kernel")
        features = Nystrom.from_state(arrays, meta, prefix)
        basis = cls(features.kernel_spec_, meta.get("sketch"), features.rel_cutoff)
        basis._set_features(features)
        return basis
