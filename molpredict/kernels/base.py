"""The ``Kernel`` ABC: fit on reference objects, transform new objects into a normalised, blocked kernel matrix.

A concrete kernel implements three small methods on *features* (whatever representation makes it fast:
sparse binned spectra, fingerprint matrices, graph lists):

- ``featurize(objects) -> features``   (``len(features) == len(objects)``)
- ``pairwise(fa, fb) -> ndarray (len(fa), len(fb))``   raw (unnormalised) kernel values
- ``self_similarity(f) -> ndarray (len(f),)``   raw k(x, x)

and the base class does the rest: remembering the reference features, computing in blocks so memory stays
bounded, and cosine normalisation ``k(a, b) / sqrt(k(a, a) k(b, b))`` when ``normalized`` is True.
Degenerate objects whose raw self-similarity is 0 (a spectrum with no peaks, an all-zero fingerprint) get
``k = 0`` with everything in :meth:`transform`, and ``k = 1`` on the diagonal of :meth:`gram` and in
:meth:`diagonal` (an object is always identical to itself). :meth:`fit`, :meth:`transform` and
:meth:`transform_features` each issue one :class:`DegenerateObjectWarning` giving how many such objects they met.

What the three methods return is checked where the base class receives it (:func:`result_problem`): ``featurize``
one row per object, ``pairwise`` exactly (len(fa), len(fb)) (numpy would broadcast a column, a row or a scalar),
``self_similarity`` exactly (len(f),) and >= 0, all finite, and for a kernel whose values are used as they are (not
normalised, no unit diagonal) at most :data:`MAX_KERNEL_VALUE` in magnitude (larger ones overflow the linear
algebra). A violation stops with one line naming the kernel by its registry name and plugin
(:func:`component_result_error`): a :class:`~molpredict.errors.PluginError` for a plugin's kernel. The cost is a
shape comparison per call and the one pass over each block (finiteness, or min and max for the magnitude).

Fitted state. Because features are what a fitted kernel keeps, a fitted kernel is saved as them:
:meth:`Kernel.get_fitted_state` writes its registry name, parameters and every fitted attribute (``fit_features_``,
``fit_diag_``, resolved parameters, sub-kernels) as arrays plus JSON, and :meth:`Kernel.from_fitted_state` rebuilds
it from them without featurising anything (the arrays are used as given, so memory-mapped ones stay mapped). A
features class takes part by being a dataclass marked :func:`saveable` (its ``compare=False`` fields are caches,
kept when small and writable); a kernel whose features are anything else (graph objects) raises
:class:`StateNotSaveable`, and a model file then keeps only its spec and landmarks, refitting it on load as before.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
import warnings
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from molpredict.component import Component
from molpredict.kernels.workers import active_row_pool

__all__ = ["Kernel", "InputKernel", "OutputKernel", "DegenerateObjectWarning", "normalize_block", "saveable",
           "StateNotSaveable", "NotRegistered", "encode_fitted", "decode_fitted", "result_problem",
           "magnitude_problem", "MAX_KERNEL_VALUE", "component_result_error", "all_degenerate_error"]


# ----------------------------------------------------------------------------------------------------------
# checks of what a component returns (kernels here; sketches and the Nystrom map use the same error)
# ----------------------------------------------------------------------------------------------------------

#: the largest magnitude of a kernel value used as it is (a kernel that is not normalised): its square summed over
#: 1e8 objects stays below float64's largest number (1.8e308), so the Gram products and eigendecompositions made of
#: such values stay finite. A plugin's kernel returning 1e300 made training fail in the eigensolver with a
#: LinAlgError naming nothing. A normalised kernel's raw values may be larger: normalisation divides them.
MAX_KERNEL_VALUE = 1e150


def result_problem(values: np.ndarray, shape: tuple[int, ...], limit: float | None = None) -> str | None:
    """What is wrong with an array a kernel method returned, or None: a shape other than ``shape`` (numpy would
    broadcast a column, a row or a scalar into the block silently), a NaN / infinite value, or (with ``limit``) a
    value larger than ``limit`` in magnitude.

    Parameters
    ----------
    values : ndarray, float64
    shape : tuple of int
        The shape the method must return, e.g. (n_rows, n_cols) for ``pairwise``, (n,) for ``self_similarity``.
    limit : float, optional
        The largest magnitude allowed (:data:`MAX_KERNEL_VALUE` for the values of a kernel that is not normalised).
    """
    if values.shape != shape:
        return f"an array of shape {values.shape} where {shape} was expected"
    if limit is None:
        if not np.isfinite(values).all():  # the one pass over the values, paid by every block
            return "NaN or infinite values"
        return None
    return magnitude_problem(values, limit)


def magnitude_problem(values: np.ndarray, limit: float = MAX_KERNEL_VALUE) -> str | None:
    """What is wrong with the magnitude of ``values``, or None: a NaN or infinite value, or a value larger than
    ``limit`` in magnitude (its products overflow: see :data:`MAX_KERNEL_VALUE`).

    Parameters
    ----------
    values : ndarray
    limit : float
    """
    if not values.size:
        return None
    # min and max (NaN propagates through both): two reductions without the boolean temporary of isfinite
    peak = max(-float(values.min()), float(values.max()))
    if not np.isfinite(peak):
        return "NaN or infinite values"
    if peak > limit:
        return (f"values up to {peak:.3g} in magnitude (more than {limit:.0e}: products of such values overflow "
                "float64); scale the kernel down or normalise it")
    return None


def _describe(component: Any, noun: str) -> tuple[str, bool]:
    """``(how an error names component, whether it is third-party code)``: a registered class by its kind, registry
    name and the plugin that registered it (``input kernel 'shaped' from plugin 'shapes' (Shaped)``), another by
    its class and module (``kernel Shaped (module my_plugin)``)."""
    cls = type(component)
    third_party = cls.__module__.split(".")[0] != "molpredict"
    if cls.__dict__.get("registry_name"):  # set by the registry on the class it loaded, not on subclasses
        try:
            from molpredict.registry import get_registry

            entry = get_registry().entry_of(cls)
            if entry is not None:
                plugin = "" if entry.provider == "molpredict" else f" from plugin {entry.provider!r}"
                return (f"{entry.kind.replace('_', ' ')} {entry.name!r}{plugin} ({cls.__name__})",
                        entry.provider != "molpredict")
        except Exception:  # naming the culprit must never hide the error being reported
            pass
    return f"{noun} {cls.__name__} (module {cls.__module__})", third_party


def all_degenerate_error(kernel: Any) -> Exception | None:
    """The error for a fitted normalised kernel whose reference objects are all degenerate (zero self-similarity:
    every kernel value among them is 0, the model trained on it constant), else None.

    Not raised by :meth:`Kernel.fit`: a sub-kernel of a combination may be degenerate on every object while the
    combination is not (``mkl``'s formula-annotation on spectra without formulas); the engine that trains on a
    kernel (:class:`~molpredict.engine.nystrom.Nystrom`) raises it. A plugin's kernel gets a
    :class:`~molpredict.errors.PluginError`, a built-in one an :class:`~molpredict.errors.InputError` (the
    training objects do not suit it).
    """
    diag = getattr(kernel, "fit_diag_", None)
    if not getattr(kernel, "normalized", False) or diag is None or not len(diag) or (np.asarray(diag) > 0).any():
        return None
    from molpredict.errors import InputError

    return component_result_error(kernel, "kernel", f"self_similarity is 0 for all {len(diag)} training objects "
                                  "(e.g. spectra without peaks): every kernel value would be 0", builtin=InputError)


def component_result_error(component: Any, noun: str, problem: str, builtin: type = RuntimeError) -> Exception:
    """The error to raise when ``component`` (a kernel or sketch; ``noun`` says which) returned something that breaks
    its contract: one line naming it, a :class:`~molpredict.errors.PluginError` (exit 3) for a plugin's component
    (or any class outside molpredict), ``builtin`` (by default ``RuntimeError``: an internal error, a bug to report)
    for a built-in one.

    Parameters
    ----------
    component : Kernel or Sketch
    noun : str
        ``"kernel"`` or ``"sketch"``, for a component the registry does not know.
    problem : str
        What it did, e.g. ``"pairwise returned NaN or infinite values"``.
    builtin : type
        The exception class for a built-in component (default: an internal error).
    """
    from molpredict.errors import PluginError

    label, third_party = _describe(component, noun)
    message = " ".join(f"{label}: {problem}".split())
    return PluginError(message) if third_party else builtin(message)


def normalize_block(raw: np.ndarray, diag_rows: np.ndarray, diag_cols: np.ndarray) -> np.ndarray:
    """Cosine-normalise a raw kernel block in place; pairs involving a zero self-similarity become 0.

    Parameters
    ----------
    raw : ndarray of shape (n_rows, n_cols)
    diag_rows : ndarray of shape (n_rows,)
    diag_cols : ndarray of shape (n_cols,)
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_r = np.where(diag_rows > 0, 1.0 / np.sqrt(diag_rows), 0.0)
        inv_c = np.where(diag_cols > 0, 1.0 / np.sqrt(diag_cols), 0.0)
    raw *= inv_r[:, None]
    raw *= inv_c[None, :]
    return raw


class DegenerateObjectWarning(UserWarning):
    """Some objects have a zero raw self-similarity (e.g. spectra without peaks): k = 0 with all others."""


def _warn_degenerate(kernel: "Kernel", n_degenerate: int, n_total: int, where: str) -> None:
    if n_degenerate:
        warnings.warn(
            f"{type(kernel).__name__}.{where}: {n_degenerate} of {n_total} objects have zero self-similarity "
            f"(e.g. spectra without peaks); their kernel value is 0 with every other object",
            DegenerateObjectWarning, stacklevel=3)


#: the fewest rows of a block that ``block_cells`` leaves
MIN_BLOCK_ROWS = 32


class Kernel(Component, ABC):
    """A positive semi-definite kernel between objects of one type.

    Fitted attributes
    -----------------
    fit_features_ : features of the reference objects
    fit_diag_ : ndarray of shape (n_fit,), raw self-similarities of the reference objects
    n_fit_ : int
    """

    #: what the kernel takes: "spectrum", "molecule" or "text"
    input_type: ClassVar[str] = "object"
    #: cosine-normalise by the raw self-similarities
    normalized: ClassVar[bool] = True
    #: rows per block in transform/gram (memory stays O(block_rows * n_fit)); an instance may override it
    block_rows: ClassVar[int] = 2048
    #: at most this many kernel values (rows x reference objects) per block, where set: the spectrum kernels'
    #: blocks of 2,048 rows against the 47,880 training spectra (784 MB a temporary) computed the same rows 1.7x
    #: slower than blocks of 250 (docs/benchmarks/train_speed_rows.md); blocks against a few thousand landmarks
    #: keep ``block_rows``
    block_cells: ClassVar[int | None] = None
    #: False for kernels that are only approximately positive semi-definite (the conformance suite then
    #: skips the eigenvalue check); may be a property when it depends on the parameters
    psd: ClassVar[bool] = True
    #: k(x, x) = 1 for every x although ``normalized`` is False (the raw kernel is normalised by construction,
    #: e.g. Tanimoto): gram's self pairs are set to exactly 1 and :meth:`diagonal` gives ones
    unit_diagonal: ClassVar[bool] = False
    #: large row requests may run on worker processes (:mod:`molpredict.kernels.workers`): the fitted kernel
    #: pickles, and its rows are Python-bound work that threads do not spread (the spectrum kernels)
    rows_in_processes: ClassVar[bool] = False

    # -- to implement ------------------------------------------------------------------------------------
    @abstractmethod
    def featurize(self, objects: Sequence[Any]) -> Any:
        """Features of ``objects`` (supports ``len`` and :meth:`take`)."""

    @abstractmethod
    def pairwise(self, fa: Any, fb: Any) -> np.ndarray:
        """Raw kernel values, ndarray of shape (len(fa), len(fb)), float64."""

    @abstractmethod
    def self_similarity(self, features: Any) -> np.ndarray:
        """Raw k(x, x) for each object, ndarray of shape (len(features),)."""

    def take(self, features: Any, index: np.ndarray | slice) -> Any:
        """Rows ``index`` of ``features`` (default: numpy / scipy.sparse indexing)."""
        return features[index]

    def _fit_data_dependent(self, features: Any) -> None:
        """Resolve data-dependent parameters (e.g. ``gamma='auto'``) from the reference features."""

    # -- provided ----------------------------------------------------------------------------------------
    def fit(self, objects: Sequence[Any]) -> "Kernel":
        """Remember the reference objects (as features)."""
        self.fit_features(self._featurize(list(objects)))
        if self.normalized:
            _warn_degenerate(self, int(np.count_nonzero(self.fit_diag_ <= 0)), self.n_fit_, "fit")
        return self

    def fit_features(self, features: Any) -> "Kernel":
        """Remember reference objects given as features (what :meth:`featurize` returns, e.g. stored ones).

        Raises
        ------
        PluginError (RuntimeError for a built-in kernel)
            ``self_similarity`` breaks its contract (see :meth:`_self_similarity`). Every object degenerate is not
            an error here (a sub-kernel of a combination may be so): see :func:`all_degenerate_error`.
        """
        self.fit_features_ = features
        self.n_fit_ = len(features)
        self.fit_diag_ = self._self_similarity(features, self.n_fit_)
        self._fit_data_dependent(self.fit_features_)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "fit_features_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(objects) first")

    # -- the checks of what the implemented methods return: one line naming the kernel (and its plugin), instead
    # of numpy broadcasting a wrong shape into a block, a NaN silently zeroing every score, or a crash far from
    # the cause. Their cost: a shape comparison per call and the finiteness pass (one read of each block).
    def _result_error(self, problem: str) -> Exception:
        return component_result_error(self, "kernel", problem)

    def _checked(self, values: Any, shape: tuple[int, ...], method: str) -> np.ndarray:
        """``values`` as a float64 array, or the error naming the kernel and ``method`` when it has another shape than
        ``shape``, a NaN or infinite value, or (a kernel whose values are used as they are: not normalised, no unit
        diagonal) a value above :data:`MAX_KERNEL_VALUE` in magnitude."""
        values = np.asarray(values, dtype=np.float64)
        raw_used = not (self.normalized or self.unit_diagonal)
        problem = result_problem(values, shape, MAX_KERNEL_VALUE if raw_used else None)
        if problem is not None:
            raise self._result_error(f"{method} returned {problem}")
        return values

    def _featurize(self, objects: list[Any]) -> Any:
        """:meth:`featurize`, checked to give one row per object (``len(features) == len(objects)``)."""
        features = self.featurize(objects)
        try:
            n = len(features)
        except TypeError:
            raise self._result_error(f"featurize returned a {type(features).__name__}, which has no len()") from None
        if n != len(objects):
            raise self._result_error(f"featurize returned {n} rows for {len(objects)} objects")
        return features

    def _self_similarity(self, features: Any, n: int) -> np.ndarray:
        """:meth:`self_similarity` of ``n`` objects, checked: shape (n,), finite and >= 0 (k(x, x) = ||phi(x)||^2;
        a negative value would be treated as a degenerate object and hide the bug)."""
        diag = self._checked(self.self_similarity(features), (n,), "self_similarity")
        if (diag < 0).any():
            raise self._result_error(f"self_similarity returned {int(np.count_nonzero(diag < 0))} negative values "
                                     f"(min {float(diag.min()):.3g}); k(x, x) must be >= 0")
        return diag

    def _block(self, fa: Any, diag_a: np.ndarray, fb: Any, diag_b: np.ndarray) -> np.ndarray:
        raw = self._checked(self.pairwise(fa, fb), (len(diag_a), len(diag_b)), "pairwise")
        return normalize_block(raw, diag_a, diag_b) if self.normalized else raw

    def _transform_features(self, features: Any, out: np.ndarray) -> int:
        """Fill ``out`` (len(features), n_fit) block by block; returns the number of degenerate rows. Within
        :func:`~molpredict.kernels.workers.rows_on_workers`, a large request of a kernel that opts in
        (:attr:`rows_in_processes`) runs on worker processes, with the same values."""
        pool = active_row_pool()
        if pool is not None and pool.wants(self, len(features)):
            n_degenerate = pool.transform_features(self, features, out)  # the workers' _rows_here counts
            if n_degenerate is not None:
                return n_degenerate
        return self._rows_here(features, out)

    def rows_per_block(self) -> int:
        """Rows computed at once against the reference objects: ``block_rows``, fewer where ``block_cells``
        bounds a block's values (at least 32)."""
        rows = int(self.block_rows)
        if self.block_cells:
            rows = min(rows, max(MIN_BLOCK_ROWS, int(self.block_cells) // max(1, int(getattr(self, "n_fit_", 1)))))
        return rows

    def _rows_here(self, features: Any, out: np.ndarray) -> int:
        """:meth:`_transform_features` in this process."""
        n = len(features)
        n_degenerate = 0
        step = self.rows_per_block()
        for start in range(0, n, step):
            stop = min(start + step, n)
            block = self.take(features, slice(start, stop))
            diag = self._self_similarity(block, stop - start)
            n_degenerate += int(np.count_nonzero(diag <= 0))
            out[start:stop] = self._block(block, diag, self.fit_features_, self.fit_diag_)
        return n_degenerate if self.normalized else 0

    def transform_features(self, features: Any) -> np.ndarray:
        """Kernel between already-featurised objects and the reference objects, shape (len(features), n_fit)."""
        self._check_fitted()
        out = np.empty((len(features), self.n_fit_), dtype=np.float64)
        _warn_degenerate(self, self._transform_features(features, out), len(features), "transform_features")
        return out

    def transform(self, objects: Sequence[Any]) -> np.ndarray:
        """Kernel between ``objects`` and the reference objects.

        Returns
        -------
        ndarray of shape (len(objects), n_fit), float64
        """
        self._check_fitted()
        objects = list(objects)
        out = np.empty((len(objects), self.n_fit_), dtype=np.float64)
        n_degenerate = 0
        for start in range(0, len(objects), self.block_rows):
            stop = min(start + self.block_rows, len(objects))
            n_degenerate += self._transform_features(self._featurize(objects[start:stop]), out[start:stop])
        _warn_degenerate(self, n_degenerate, len(objects), "transform")
        return out

    def gram(self, index: np.ndarray | None = None) -> np.ndarray:
        """Kernel among the reference objects: rows ``index`` (default all) against all of them.

        Returns
        -------
        ndarray of shape (len(index), n_fit), float64, with exact 1 on the self pairs when normalised (or
        ``unit_diagonal``).
        """
        self._check_fitted()
        rows = np.arange(self.n_fit_) if index is None else np.asarray(index, dtype=np.int64)
        out = np.empty((len(rows), self.n_fit_), dtype=np.float64)
        self._transform_features(self.take(self.fit_features_, rows), out)  # fit already warned
        if self.normalized or self.unit_diagonal:
            out[np.arange(len(rows)), rows] = 1.0
        return out

    def fit_transform(self, objects: Sequence[Any]) -> np.ndarray:
        """``fit(objects)`` then the full Gram matrix, shape (n, n)."""
        return self.fit(objects).gram()

    def diagonal(self, objects: Sequence[Any]) -> np.ndarray:
        """k(x, x) for each object, shape (len(objects),): all ones for a normalised kernel."""
        if self.normalized or self.unit_diagonal:
            return np.ones(len(objects), dtype=np.float64)
        objects = list(objects)
        return self._self_similarity(self._featurize(objects), len(objects))

    # -- fitted state (model files) ----------------------------------------------------------------------
    def get_fitted_state(self, prefix: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The fitted kernel as arrays named ``prefix.*`` plus JSON: its registry name, parameters and fitted
        attributes (``fit_features_``, ``fit_diag_``, resolved parameters such as ``gamma_``; sub-kernels of a
        combination are written the same way), so that :meth:`from_fitted_state` rebuilds it without featurising
        anything.

        Raises
        ------
        StateNotSaveable
            Some fitted attribute is not arrays, saveable features (:func:`saveable`), kernels or JSON values;
            :class:`NotRegistered` (a subclass) when the kernel's class is not registered.
        """
        self._check_fitted()
        self._fill_caches()
        arrays: dict[str, np.ndarray] = {}
        meta = self._fitted_state(prefix, arrays, {})
        return arrays, meta

    def get_fitted_attributes(self, prefix: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """:meth:`get_fitted_state` without the registry name, for a kernel whose class is at hand but not registered
        (a plugin's test): JSON ``{"params": ..., "attributes": ...}``, which :meth:`from_fitted_attributes` of the
        same class reads. What is written is exactly what a model file keeps of a registered kernel.

        Raises
        ------
        StateNotSaveable
        """
        self._check_fitted()
        self._fill_caches()
        arrays: dict[str, np.ndarray] = {}
        return arrays, self._params_and_attributes(prefix, arrays, {})

    @classmethod
    def from_fitted_attributes(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> "Kernel":
        """The kernel of class ``cls`` that :meth:`get_fitted_attributes` wrote: built from its parameters, its fitted
        attributes set as a model file's loader sets them.

        Raises
        ------
        StateNotSaveable
            The state is incomplete.
        """
        try:
            kernel = cls(**dict(meta["params"]))
        except (KeyError, TypeError) as exc:
            raise StateNotSaveable(f"fitted kernel state lacks {exc}") from None
        return _set_fitted(kernel, meta, arrays, {})

    def _fill_caches(self) -> None:
        if self.n_fit_:  # one row through transform fills the reference side's caches, which are then saved too
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DegenerateObjectWarning)
                self.transform_features(self.take(self.fit_features_, slice(0, 1)))

    def _fitted_state(self, prefix: str, arrays: dict[str, np.ndarray], memo: dict[int, str]) -> dict[str, Any]:
        kind, name = _registration(self)
        return {"kind": kind, "name": name, **self._params_and_attributes(prefix, arrays, memo)}

    def _params_and_attributes(self, prefix: str, arrays: dict[str, np.ndarray], memo: dict[int, str]
                               ) -> dict[str, Any]:
        params = self.get_params()
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in params.values()):
            raise StateNotSaveable(f"{type(self).__name__}: a parameter is not a JSON value")
        fitted = {key: value for key, value in vars(self).items() if key.endswith("_") and not key.startswith("_")}
        # kernels first (a combination's sub-kernels): rebuilding them imports their modules, which registers their
        # features classes before the combination's own features (made of theirs) are read
        order = sorted(fitted, key=lambda key: (not _holds_kernels(fitted[key]), key))
        attributes = {key: encode_fitted(fitted[key], f"{prefix}.{key}", arrays, memo) for key in order}
        return {"params": params, "attributes": attributes}

    @staticmethod
    def from_fitted_state(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> "Kernel":
        """The kernel :meth:`get_fitted_state` wrote, its arrays used as given (memory-mapped ones stay mapped).

        Raises
        ------
        StateNotSaveable
            The state is incomplete or names a features class this version does not have (refit instead).
        SpecError, PluginError
            The kernel is not registered.
        """
        return Kernel._from_fitted_state(meta, arrays, {})

    @staticmethod
    def _from_fitted_state(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], refs: dict[str, Any]
                           ) -> "Kernel":
        from molpredict.registry import create
        from molpredict.specs import ComponentSpec

        try:
            kernel = create(meta["kind"], ComponentSpec(meta["name"], dict(meta["params"])))
        except (KeyError, TypeError) as exc:
            raise StateNotSaveable(f"fitted kernel state lacks {exc}") from None
        return _set_fitted(kernel, meta, arrays, refs)


def _set_fitted(kernel: Kernel, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], refs: dict[str, Any]
                ) -> Kernel:
    """``kernel`` (built from the saved parameters) with the saved fitted attributes set."""
    try:
        attributes = meta["attributes"]
    except (KeyError, TypeError) as exc:
        raise StateNotSaveable(f"fitted kernel state lacks {exc}") from None
    for key, value in attributes.items():
        setattr(kernel, key, decode_fitted(value, arrays, refs))
    if not hasattr(kernel, "fit_features_"):
        raise StateNotSaveable("fitted kernel state has no fitted features")
    return kernel


# ----------------------------------------------------------------------------------------------------------
# fitted state: a fitted kernel as arrays + JSON (model files), so that loading re-featurises nothing
# ----------------------------------------------------------------------------------------------------------

class StateNotSaveable(TypeError):
    """A fitted kernel holds something that cannot be written as arrays and JSON (e.g. graph objects); a model
    file then keeps only its spec and landmarks, and the kernel is refitted on load."""


class NotRegistered(StateNotSaveable):
    """The kernel's class is not registered, so a model file could not name it (its state may still be saveable:
    :meth:`Kernel.get_fitted_attributes`)."""


#: features classes whose instances :func:`encode_fitted` may write, by qualified name (see :func:`saveable`)
_SAVEABLE: dict[str, type] = {}


def saveable(cls: type) -> type:
    """Class decorator: the features dataclass ``cls`` may be written in a model file and rebuilt.

    Its fields are written recursively (arrays, scipy.sparse matrices, other saveable dataclasses, kernels, lists,
    dicts with str keys, JSON scalars). Fields declared with ``compare=False`` are caches: written when they hold
    only such values and take at most twice the bytes of the other fields (a reference side's formula vocabulary,
    its peaks sorted by m/z, which the first transform would recompute), else left out and recomputed on demand.
    Loading only builds classes registered here, by name: nothing named in a file is imported.
    """
    name = cls.__qualname__
    if _SAVEABLE.get(name, cls) is not cls:
        raise TypeError(f"two saveable features classes named {name!r}")
    _SAVEABLE[name] = cls
    return cls


def encode_fitted(value: Any, name: str, arrays: dict[str, np.ndarray], memo: dict[int, str]) -> Any:
    """The JSON description of ``value``, its arrays added to ``arrays`` under names starting with ``name``.

    An object met twice (the MKL kernel's features hold its sub-kernels' features) is written once and
    referenced. Raises :class:`StateNotSaveable` for anything else than the types :func:`saveable` lists.
    """
    import scipy.sparse as sp

    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if isinstance(value, (int, float, np.generic)) and not isinstance(value, np.ndarray):
        item = value.item() if isinstance(value, np.generic) else value
        if isinstance(item, (bool, int, float)):
            return {"value": item}
        raise StateNotSaveable(f"cannot save a {type(value).__name__} value")
    if id(value) in memo:
        return {"ref": memo[id(value)]}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise StateNotSaveable(f"{name}: an object array cannot be saved without pickle")
        memo[id(value)] = name
        arrays[name] = np.ascontiguousarray(value)
        return {"array": name}
    if sp.issparse(value):
        memo[id(value)] = name
        csr = sp.csr_matrix(value)
        arrays[f"{name}.data"], arrays[f"{name}.indices"] = csr.data, csr.indices
        arrays[f"{name}.indptr"] = csr.indptr
        return {"csr": name, "shape": [int(s) for s in csr.shape]}
    if isinstance(value, Kernel):
        memo[id(value)] = name
        return {"kernel": value._fitted_state(name, arrays, memo), "at": name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and \
            _SAVEABLE.get(type(value).__qualname__) is type(value):
        memo[id(value)] = name
        fields = {f.name: encode_fitted(getattr(value, f.name), f"{name}.{f.name}", arrays, memo)
                  for f in dataclasses.fields(value) if f.compare}
        own = sum(a.nbytes for key, a in arrays.items() if key.startswith(f"{name}."))
        for f in dataclasses.fields(value):  # caches: kept when they can be written and are not large
            cached = getattr(value, f.name)
            if f.compare or cached is None or (isinstance(cached, dict) and not cached):
                continue
            trial_arrays: dict[str, np.ndarray] = {}
            trial_memo = dict(memo)
            try:
                encoded = encode_fitted(cached, f"{name}.{f.name}", trial_arrays, trial_memo)
            except StateNotSaveable:
                continue
            if sum(a.nbytes for a in trial_arrays.values()) <= 2 * own:  # not a float copy of a bit matrix
                fields[f.name] = encoded
                arrays.update(trial_arrays)
                memo.update(trial_memo)
        return {"type": type(value).__qualname__, "fields": fields, "at": name}
    if isinstance(value, (list, tuple)):
        memo[id(value)] = name
        items = [encode_fitted(v, f"{name}.{i}", arrays, memo) for i, v in enumerate(value)]
        return {"tuple" if isinstance(value, tuple) else "list": items, "at": name}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        memo[id(value)] = name
        return {"dict": {k: encode_fitted(v, f"{name}.{k}", arrays, memo) for k, v in value.items()}, "at": name}
    raise StateNotSaveable(f"{name}: cannot save a {type(value).__name__} (not a saveable features class)")


def decode_fitted(meta: Any, arrays: Mapping[str, np.ndarray], refs: dict[str, Any]) -> Any:
    """Inverse of :func:`encode_fitted`: arrays are used as given (memory-mapped ones stay mapped).

    Raises
    ------
    StateNotSaveable
        An unknown features class or a missing array (the caller refits the kernel).
    """
    try:
        if "value" in meta:
            return meta["value"]
        if "ref" in meta:
            return refs[meta["ref"]]
        if "array" in meta:
            value = refs[meta["array"]] = arrays[meta["array"]]
            return value
        if "csr" in meta:
            import scipy.sparse as sp
            name = meta["csr"]
            value = refs[name] = sp.csr_matrix(
                (arrays[f"{name}.data"], arrays[f"{name}.indices"], arrays[f"{name}.indptr"]),
                shape=tuple(meta["shape"]))
            return value
        if "kernel" in meta:
            value = refs[meta["at"]] = Kernel._from_fitted_state(meta["kernel"], arrays, refs)
            return value
        if "type" in meta:
            cls = _SAVEABLE.get(meta["type"])
            if cls is None:
                raise StateNotSaveable(f"unknown features class {meta['type']!r}")
            value = cls(**{k: decode_fitted(v, arrays, refs) for k, v in meta["fields"].items()})
            refs[meta["at"]] = value
            return value
        for kind in ("list", "tuple"):
            if kind in meta:
                items = [decode_fitted(v, arrays, refs) for v in meta[kind]]
                value = refs[meta["at"]] = items if kind == "list" else tuple(items)
                return value
        if "dict" in meta:
            value = refs[meta["at"]] = {k: decode_fitted(v, arrays, refs) for k, v in meta["dict"].items()}
            return value
    except (KeyError, TypeError, ValueError) as exc:
        raise StateNotSaveable(f"fitted kernel state is incomplete ({type(exc).__name__}: {exc})") from None
    raise StateNotSaveable(f"fitted kernel state: unknown entry {sorted(meta)!r}")



def _holds_kernels(value: Any) -> bool:
    return isinstance(value, Kernel) or (isinstance(value, (list, tuple)) and any(isinstance(v, Kernel) for v in value))


def _registration(kernel: "Kernel") -> tuple[str, str]:
    """``(kind, registry name)`` of ``kernel``'s own class (``registry_name`` is set on the class the registry loaded,
    so a subclass may inherit its parent's: the class itself is checked)."""
    from molpredict.registry import get_registry

    kinds = ("output_kernel", "input_kernel") if isinstance(kernel, OutputKernel) else ("input_kernel", "output_kernel")
    entry = get_registry().entry_of(type(kernel), kinds)
    if entry is None:
        raise NotRegistered(f"{type(kernel).__name__} is not a registered kernel")
    return entry.kind, entry.name


class InputKernel(Kernel, ABC):
    """A kernel on inputs: ``Spectrum`` records (or strings for text kernels).

    ``reads_formula``: whether its features depend on the spectrum's molecular formula (the ``formula`` metadata);
    identification then encodes a spectrum that has none once per candidate formula."""

    input_type: ClassVar[str] = "spectrum"
    reads_formula: ClassVar[bool] = False


class OutputKernel(Kernel, ABC):
    """A kernel on ``Molecule`` records. Fingerprint settings are parameters of the kernel."""

    input_type: ClassVar[str] = "molecule"
