"""The ``Model`` ABC: every model scores candidates by a dot product in a d-dimensional output space.

IOKR-family models, DSOKR and the baselines all reduce decoding to

    score(x, c) = predict_coordinates(x) . candidate_coordinates(c)

where ``predict_coordinates`` maps inputs to R^d (SISOKR: coefficients over the m_y sketched training outputs;
DSOKR: the network's g(x) in the sketched eigenbasis) and ``candidate_coordinates`` maps molecules to R^d
(SISOKR: R_y K_y(train, c); DSOKR: psi~(c)). Candidate coordinates depend only on the fitted output side, so
they are computed once per (model, molecule) and cached on disk (``coordinates_key`` names that output side).
"""
from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

import numpy as np

from molpredict.component import Component
from molpredict.errors import InputError
from molpredict.specs import ComponentSpec

__all__ = ["Model", "TEXT_OUTPUT_KERNEL", "check_pairs", "CandidateSets", "ValidationData"]

#: The output kernel of text -> molecule models: the cosine of chirality-aware Morgan counts (a text hit is the
#: same stereoisomer: plain bits tie every stereoisomer with the truth). On the held-out 10% of ChEBI-20's val.tsv
#: against all 33,010 molecules SISOKR with it ranks the truth first for 8.8% of the descriptions, MRR 0.149,
#: where the chiral Gaussian-Tanimoto on bits got 0.0% / 0.055 and on counts 0.0% / 0.059.
TEXT_OUTPUT_KERNEL = "fingerprint-cosine:chiral=true"


def check_pairs(inputs: Sequence[Any], molecules: Sequence[Any], minimum: int = 1, what: str = "training") -> None:
    """Refuse (InputError) inputs and labels that do not pair one to one, or fewer than ``minimum`` pairs."""
    if len(inputs) != len(molecules):
        raise InputError(f"{len(inputs)} {what} inputs but {len(molecules)} molecules: they must pair one to one")
    if len(inputs) < minimum:
        raise InputError(f"{len(inputs)} {what} pairs: at least {minimum} needed")


class Model(Component, ABC):
    """A fitted mapping from inputs to output coordinates, and from molecules to the same coordinates."""

    #: what the model takes when no ``input_kernel`` / ``encoder`` parameter says otherwise
    default_input_type: ClassVar[str] = "spectrum"

    @property
    def input_type(self) -> str:
        """What the model takes (``spectrum`` or ``text``): the input type of the registered component its
        ``input_kernel`` (else ``encoder``) parameter names, else :attr:`default_input_type`.

        A model may override this with a class attribute. Worked out through
        :meth:`molpredict.registry.Registry.input_type`, the one place that resolves component input types.
        """
        from molpredict.registry import get_registry
        params = self.get_params()
        for kind in ("input_kernel", "encoder"):
            value = params.get(kind)
            if isinstance(value, (str, ComponentSpec)):
                found = get_registry().input_type(kind, value)
                if found is not None:
                    return str(found)
        return self.default_input_type

    @classmethod
    def train_defaults(cls, input_type: str, n_inputs: int, n_structures: int) -> dict[str, Any]:
        """Parameters ``molpredict train`` gives the model where the user set none, for training data of
        ``input_type`` with ``n_inputs`` inputs and ``n_structures`` distinct structures.

        The constructor's defaults are the model's defaults for spectra (this returns nothing for them);
        a model that also takes text returns what it needs for text here. The base gives a model with an
        ``output_kernel`` parameter :data:`TEXT_OUTPUT_KERNEL` for text.
        """
        if input_type == "text" and "output_kernel" in cls.param_names():
            return {"output_kernel": TEXT_OUTPUT_KERNEL}
        return {}

    @abstractmethod
    def fit(self, inputs: Sequence[Any], molecules: Sequence[Any],
            val: tuple[Sequence[Any], Sequence[Any]] | None = None) -> "Model":
        """Train on inputs (``Spectrum`` records or strings) and their ``Molecule`` labels.

        ``val`` = (val_inputs, val_molecules) selects grid parameters by validation kernel loss.
        """

    @abstractmethod
    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """ndarray of shape (n_inputs, d), float64."""

    @property
    def reads_formula(self) -> bool:
        """Whether the prediction of a spectrum depends on its molecular formula (an input kernel that reads it):
        identification then encodes a spectrum without one once per candidate formula."""
        return False

    def predict_coordinates_as(self, inputs: Sequence[Any], dtype: Any) -> np.ndarray:
        """:meth:`predict_coordinates` in ``dtype``, shape (n_inputs, d): identification scores with float32
        (:data:`~molpredict.identification.scoring.SCORING_DTYPE`). A model whose last product can itself run
        in a narrower type overrides this (it halves that product's time); the base casts the float64 result."""
        return np.asarray(self.predict_coordinates(inputs), dtype=dtype)

    @abstractmethod
    def candidate_coordinates(self, molecules: Sequence[Any]) -> np.ndarray:
        """ndarray of shape (n_molecules, d), float64."""

    @property
    def dot_product_scores(self) -> bool:
        """True when :meth:`score_coordinates` is the plain dot product (callers may then use their own products).

        A model whose scores are not a dot product of the two coordinate vectors (e.g. a max-combined ensemble)
        returns False, and every caller scores through :meth:`score_coordinates`.
        """
        return True

    def score_coordinates(self, predictions: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Scores from :meth:`predict_coordinates` and :meth:`candidate_coordinates` outputs.

        Parameters
        ----------
        predictions : ndarray of shape (n_inputs, d)
        candidates : ndarray of shape (n_candidates, d)

        Returns
        -------
        ndarray of shape (n_inputs, n_candidates); higher is better.
        """
        return predictions @ candidates.T

    def score(self, inputs: Sequence[Any], candidates: Sequence[Any]) -> np.ndarray:
        """Scores of every candidate for every input, shape (n_inputs, n_candidates); higher is better."""
        return self.score_coordinates(self.predict_coordinates(inputs), self.candidate_coordinates(candidates))

    @abstractmethod
    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The fitted state: (named arrays, JSON-serialisable metadata). No pickled objects."""

    @classmethod
    @abstractmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "Model":
        """Rebuild a fitted model from :meth:`get_state`'s output."""

    def coordinates_key(self) -> str:
        """A content hash of everything that determines :meth:`candidate_coordinates` (the cache key).

        A fitted kernel's saved state (``fitted_kernel``/``fitted_kernels`` entries and their arrays) is left out:
        it is what the kernel spec and landmarks, which are hashed, determine, so a bundle re-saved with it
        (``molpredict model upgrade``) keeps its cached coordinates."""
        arrays, metadata = self.get_state()
        digest = hashlib.sha256()
        digest.update(json.dumps(_without_fitted_kernels(metadata.get("output", metadata)), sort_keys=True,
                                 default=str).encode())
        for name in sorted(arrays):
            if name.startswith("output") and not set(name.split(".")) & _FITTED_KERNEL_KEYS:
                digest.update(name.encode())
                digest.update(np.ascontiguousarray(arrays[name]).tobytes())
        return digest.hexdigest()[:32]


#: state entries holding a fitted kernel's saved features (see :meth:`Model.coordinates_key`)
_FITTED_KERNEL_KEYS = frozenset({"fitted_kernel", "fitted_kernels"})


def _without_fitted_kernels(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_fitted_kernels(v) for k, v in value.items() if k not in _FITTED_KERNEL_KEYS}
    return value


class CandidateSets:
    """Validation candidate sets for ranking-aware selection: one set of candidate structures per validation input.

    Parameters
    ----------
    molecules : sequence of Molecule
        The distinct candidate structures of all sets.
    sets : sequence of ndarray
        Per validation input, indices into ``molecules`` (its candidate set).
    is_true : sequence of ndarray
        Per validation input, a bool per entry of its set: the true structure (InChIKey first block).
    positions : sequence of int, optional
        The validation input each set belongs to (default: set i to input i); inputs without a set do not rank.
    ranked : sequence of bool, optional
        Per set, whether it counts in the ranking metric that chooses grid points (default all). A set that does
        not is still scored (e.g. mass-window sets that only the calibration is fitted on).
    collections : sequence of int, optional
        Per set, the collection of sets it was drawn from (default all 0): e.g. formula256, real same-formula and
        mass-window sets, whose calibration is checked each on its own.
    """

    def __init__(self, molecules: Sequence[Any], sets: Sequence[np.ndarray], is_true: Sequence[np.ndarray],
                 positions: Sequence[int] | None = None, ranked: Sequence[bool] | None = None,
                 collections: Sequence[int] | None = None) -> None:
        if len(sets) != len(is_true):
            raise ValueError("CandidateSets: sets and is_true must have one entry per set")
        self.molecules = list(molecules)
        self.sets = [np.asarray(s, dtype=np.int64) for s in sets]
        self.is_true = [np.asarray(t, dtype=bool) for t in is_true]
        self.positions = np.arange(len(self.sets)) if positions is None else np.asarray(positions, dtype=np.int64)
        if self.positions.shape != (len(self.sets),):
            raise ValueError("CandidateSets: one position per set")
        if any(s.shape != t.shape or s.size == 0 for s, t in zip(self.sets, self.is_true)):
            raise ValueError("CandidateSets: every set must be non-empty, with one is_true flag per entry")
        self.ranked = np.ones(len(self.sets), dtype=bool) if ranked is None else np.asarray(ranked, dtype=bool)
        if self.ranked.shape != (len(self.sets),) or not self.ranked.any():
            raise ValueError("CandidateSets: one ranked flag per set, at least one set ranked")
        self.collections = np.zeros(len(self.sets), dtype=np.int64) if collections is None \
            else np.asarray(collections, dtype=np.int64)
        if self.collections.shape != (len(self.sets),):
            raise ValueError("CandidateSets: one collection per set")

    def __len__(self) -> int:
        return len(self.sets)

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets (n_sets + 1,), candidate indices (n_total,), is_true (n_total,))`` of all sets, flattened."""
        sizes = [len(s) for s in self.sets]
        return (np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), np.concatenate(self.sets),
                np.concatenate(self.is_true))

    def ranked_metrics(self, scores: np.ndarray) -> dict[str, float]:
        """The ranking metrics (:func:`~molpredict.engine.decoding.ranking_metrics`) of the ``ranked`` sets, from
        ``scores`` flat in the order of :meth:`flat`."""
        from molpredict.engine.decoding import ranking_metrics

        offsets, _, is_true = self.flat()
        if self.ranked.all():
            return ranking_metrics(scores, offsets, is_true)
        sizes = np.diff(offsets)
        keep = np.repeat(self.ranked, sizes)
        kept_offsets = np.concatenate([[0], np.cumsum(sizes[self.ranked])]).astype(np.int64)
        return ranking_metrics(np.asarray(scores)[keep], kept_offsets, is_true[keep])


class ValidationData(tuple):
    """``(inputs, molecules)`` validation pairs, optionally with candidate sets for ranking-aware selection.

    It is a 2-tuple, so every model that takes ``val=(inputs, molecules)`` takes it unchanged; models that select
    by a ranking metric read :attr:`candidates`.
    """

    candidates: "CandidateSets | None"

    def __new__(cls, inputs: Sequence[Any], molecules: Sequence[Any],
                candidates: "CandidateSets | None" = None) -> "ValidationData":
        obj = super().__new__(cls, (list(inputs), list(molecules)))
        if candidates is not None and len(candidates) and (candidates.positions.min() < 0
                                                           or candidates.positions.max() >= len(obj[0])):
            raise ValueError(f"ValidationData: candidate set positions out of range for {len(obj[0])} inputs")
        obj.candidates = candidates
        return obj
