"""The fragment-formula annotation kernel (``formula-annotation``): spectra compared on the bags of molecular
formulas that explain their fragments and neutral losses.

Featurisation of one spectrum (its molecular formula from the ``formula`` metadata, e.g. MGF ``FORMULA``; in
training, :func:`molpredict.training.pipeline.load_labelled` fills it in from the label structure when absent):

1. the precursor ion formula: ``multiplier * M + adduct atoms`` (:func:`molpredict.chem.formulas.precursor_ion_formula`;
   a spectrum without an adduct gets the default adduct of its ion mode nearest its precursor m/z);
2. each peak (cleaned as the other spectrum kernels do: finite, positive, intensities relative to the largest)
   is explained by the sub-formulas of the ion formula whose mass is within
   ``max(mz_tolerance, precision / 2, ppm * 1e-6 * m/z)`` (``precision``: the m/z step the file reported,
   ``Spectrum.mz_precision``, when known) of ``m/z + z * electron mass`` (fragments singly charged, with the
   precursor's charge sign) and whose RDBE is >= -0.5 (:func:`molpredict.chem.formulas.explain_masses`);
3. ``explanations="closest"`` keeps the sub-formula of smallest mass error per peak; ``"all"`` keeps every one,
   sharing the peak's weight equally among them;
4. the peak's weight ``relative intensity ** intensity_power`` goes to the fragment formula in the *fragment bag*
   and to the neutral loss (ion formula minus fragment formula) in the *loss bag*; equal formulas add up.

The kernel: ``k = (1 - loss_weight) * cos(fragment bags) + loss_weight * cos(loss bags)``, the cosine being the
normalised linear kernel on the sparse bag vectors (formulas indexed by their 64-bit keys), then renormalised
as in ``ppk-losses`` so that ``k(x, x) = 1``. It is an inner product of feature vectors: PSD.

A spectrum without a formula (or with one its adduct cannot apply to, or with no explained peak) has empty bags:
``k = 0`` with every other spectrum, 1 with itself, and a :class:`~molpredict.kernels.base.DegenerateObjectWarning`
says how many. Inside ``mkl`` such a spectrum is compared by the other kernels only (``mkl`` renormalises).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.errors import SpecError
from molpredict.chem.formulas import explain_masses, precursor_ion_formula, subformula_table
from molpredict.chem.molecules import ELECTRON_MASS
from molpredict.spectra.record import Spectrum
from molpredict.kernels.base import InputKernel, normalize_block, saveable
from molpredict.kernels.spectra import BLOCK_CELLS, _check_positive, _clean_peaks, _precision_of

__all__ = ["FormulaBags", "formula_bags", "bag_dot", "FormulaAnnotationKernel"]


@saveable
@dataclass
class FormulaBags:
    """Sparse bags of formulas of ``n`` spectra: spectrum ``s`` owns entries ``offsets[s]:offsets[s + 1]``,
    keys unique and ascending within a spectrum.

    Attributes
    ----------
    offsets : ndarray of shape (n + 1,), int64
    keys : ndarray of shape (n_entries,), uint64
        Formula keys (:func:`molpredict.chem.formulas.formula_key`).
    values : ndarray of shape (n_entries,), float64
        Summed peak weights.
    """

    offsets: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def rows(self) -> np.ndarray:
        """Spectrum index of each entry, shape (n_entries,)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.offsets))

    def take(self, index: np.ndarray | slice) -> "FormulaBags":
        rows = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index, dtype=np.int64)
        counts = np.diff(self.offsets)[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        entries = np.repeat(self.offsets[:-1][rows] - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        return FormulaBags(offsets, self.keys[entries], self.values[entries])

    def squared_norms(self) -> np.ndarray:
        """``sum values**2`` per spectrum, shape (n,)."""
        return np.bincount(self.rows, weights=self.values ** 2, minlength=len(self))

    def _reference(self) -> tuple[np.ndarray, sp.csr_matrix]:
        """Sorted distinct keys and the transposed bag matrix (n_keys, n), cached (the reference side)."""
        if "ref" not in self._cache:
            vocab = np.unique(self.keys)
            cols = np.searchsorted(vocab, self.keys)
            mat = sp.csr_matrix((self.values, (cols, self.rows)), shape=(vocab.size, len(self)))
            self._cache["ref"] = (vocab, mat)
        return self._cache["ref"]


def _bags(rows: list[np.ndarray], keys: list[np.ndarray], values: list[np.ndarray], n: int) -> FormulaBags:
    """Sum duplicate (row, key) entries and sort them into a :class:`FormulaBags`."""
    if not rows:
        return FormulaBags(np.zeros(n + 1, dtype=np.int64), np.empty(0, np.uint64), np.empty(0))
    row, key, val = np.concatenate(rows), np.concatenate(keys), np.concatenate(values)
    order = np.lexsort((key, row))
    row, key, val = row[order], key[order], val[order]
    start = np.ones(row.size, dtype=bool)
    start[1:] = (row[1:] != row[:-1]) | (key[1:] != key[:-1])
    first = np.flatnonzero(start)
    summed = np.add.reduceat(val, first) if first.size else val[:0]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(row[first], minlength=n), out=offsets[1:])
    return FormulaBags(offsets, key[first], summed)


def formula_bags(spectra: Sequence[Spectrum], *, ppm: float = 10.0, mz_tolerance: float = 0.005,
                 intensity_power: float = 0.5, explanations: str = "all",
                 min_rdbe: float | None = -0.5) -> tuple[FormulaBags, FormulaBags]:
    """Fragment and loss formula bags of spectra (see the module docstring).

    Parameters
    ----------
    spectra : sequence of Spectrum, length n
    ppm, mz_tolerance : float
        A peak is explained by sub-formulas within ``max(mz_tolerance, mz_precision / 2, ppm * 1e-6 * m/z)`` Da.
    intensity_power : float
        Peak weight = relative intensity ** intensity_power.
    explanations : {"closest", "all"}
    min_rdbe : float or None
        Smallest RDBE of a fragment formula (None: no filter).

    Returns
    -------
    fragments, losses : FormulaBags with n spectra each
    """
    # The spectra of one ion formula (a structure's spectra, mostly adjacent) are explained in one call: the search
    # is per mass, so each spectrum gets what a call of its own gives, without a call's overhead per spectrum.
    prepared: list[tuple[int, np.ndarray, np.ndarray, Any, np.ndarray, np.ndarray]] = []
    by_table: dict[int, list[int]] = {}
    for s, spectrum in enumerate(spectra):
        ion = precursor_ion_formula(spectrum)
        if ion is None:
            continue
        mz, rel = _clean_peaks(spectrum)
        if mz.size == 0:
            continue
        counts, sign = ion
        table = subformula_table(counts)
        masses = mz + sign * ELECTRON_MASS
        # m/z deposited with few decimals (0.1 Da steps for some instruments) are only that precise
        floor = max(mz_tolerance, 0.5 * _precision_of(spectrum)) if spectrum.mz_precision else mz_tolerance
        tolerance = np.maximum(floor, ppm * 1e-6 * mz)
        by_table.setdefault(id(table), []).append(len(prepared))
        prepared.append((s, mz, rel, table, masses, tolerance))
    explained: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * len(prepared)
    for members in by_table.values():
        table = prepared[members[0]][3]
        sizes = [prepared[i][1].size for i in members]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        peak, key, error = explain_masses(table, np.concatenate([prepared[i][4] for i in members]),
                                          np.concatenate([prepared[i][5] for i in members]), min_rdbe)
        bounds = np.searchsorted(peak, starts)  # ``peak`` ascends: each spectrum's explanations are one run
        for j, i in enumerate(members):
            lo, hi = bounds[j], bounds[j + 1]
            explained[i] = (peak[lo:hi] - starts[j], key[lo:hi], error[lo:hi])
    f_rows, f_keys, f_vals, l_rows, l_keys, l_vals = [], [], [], [], [], []
    for (s, mz, rel, table, _, _), (peak, key, error) in zip(prepared, explained):  # type: ignore[misc]
        if peak.size == 0:
            continue
        weight = rel ** intensity_power if intensity_power else np.ones_like(rel)
        if explanations == "closest":
            order = np.lexsort((np.abs(error), peak))
            peak, key = peak[order], key[order]
            first = np.ones(peak.size, dtype=bool)
            first[1:] = peak[1:] != peak[:-1]
            peak, key = peak[first], key[first]
            value = weight[peak]
        else:
            value = weight[peak] / np.bincount(peak, minlength=mz.size)[peak]
        row = np.full(peak.size, s, dtype=np.int64)
        f_rows.append(row)
        f_keys.append(key)
        f_vals.append(value)
        loss = table.key - key  # key of ion formula minus fragment formula (wraps modulo 2**64)
        is_loss = loss != 0
        l_rows.append(row[is_loss])
        l_keys.append(loss[is_loss])
        l_vals.append(value[is_loss])
    n = len(spectra)
    return _bags(f_rows, f_keys, f_vals, n), _bags(l_rows, l_keys, l_vals, n)


def bag_dot(a: FormulaBags, b: FormulaBags) -> np.ndarray:
    """Raw linear kernel between two sets of bags, ``<bag_i, bag_j>``, shape (len(a), len(b)); ``b``'s
    vocabulary and matrix are cached (pass the reference set as ``b``)."""
    vocab, b_t = b._reference()
    if vocab.size == 0 or a.keys.size == 0:
        return np.zeros((len(a), len(b)))
    pos = np.minimum(np.searchsorted(vocab, a.keys), vocab.size - 1)
    hit = vocab[pos] == a.keys
    a_mat = sp.csr_matrix((a.values[hit], (a.rows[hit], pos[hit])), shape=(len(a), vocab.size))
    return np.asarray((a_mat @ b_t).toarray(), dtype=np.float64)


@saveable
@dataclass
class _FormulaFeatures:
    """Fragment and loss bags of a batch of spectra, with their raw squared norms."""

    fragments: FormulaBags
    losses: FormulaBags
    diag_fragments: np.ndarray
    diag_losses: np.ndarray

    def __len__(self) -> int:
        return len(self.fragments)

    def __getitem__(self, index: np.ndarray | slice) -> "_FormulaFeatures":
        return _FormulaFeatures(self.fragments.take(index), self.losses.take(index), self.diag_fragments[index],
                                self.diag_losses[index])


class FormulaAnnotationKernel(InputKernel):
    """Cosine of fragment- and loss-formula bags (registry name ``formula-annotation``); see the module docstring.

    Parameters
    ----------
    ppm : float
        Relative m/z tolerance.
    mz_tolerance : float
        Absolute m/z tolerance (Da), the floor of the tolerance (covers m/z values deposited with 3 decimals).
    intensity_power : float
        Peak weight = relative intensity ** intensity_power (0: uniform).
    loss_weight : float in [0, 1]
        Weight of the loss-bag cosine.
    explanations : {"all", "closest"}
        All sub-formulas within tolerance sharing the peak's weight (default: on val_formula256, SISOKR m_x 2000 /
        m_y 1000, hit@1 23.8% / MRR 0.363 against 23.0% / 0.353 for the closest), or only the sub-formula of
        smallest mass error.
    """

    reads_formula = True
    rows_in_processes = True  # Python-bound rows (see molpredict.kernels.workers)
    block_cells = BLOCK_CELLS

    def __init__(self, ppm: float = 10.0, mz_tolerance: float = 0.005, intensity_power: float = 0.5,
                 loss_weight: float = 0.5, explanations: str = "all") -> None:
        self.ppm = ppm
        self.mz_tolerance = mz_tolerance
        self.intensity_power = intensity_power
        self.loss_weight = loss_weight
        self.explanations = explanations
        _check_positive("ppm", ppm)
        _check_positive("mz_tolerance", mz_tolerance)
        if isinstance(intensity_power, bool) or not isinstance(intensity_power, (int, float)) or intensity_power < 0:
            raise SpecError(f"intensity_power must be a number >= 0, not {intensity_power!r}")
        if isinstance(loss_weight, bool) or not isinstance(loss_weight, (int, float)) or not 0 <= loss_weight <= 1:
            raise SpecError(f"loss_weight must be a number in [0, 1], not {loss_weight!r}")
        if explanations not in ("closest", "all"):
            raise SpecError(f"explanations must be 'closest' or 'all', not {explanations!r}")

    def featurize(self, objects: Sequence[Spectrum]) -> _FormulaFeatures:
        fragments, losses = formula_bags(list(objects), ppm=float(self.ppm), mz_tolerance=float(self.mz_tolerance),
                                         intensity_power=float(self.intensity_power),
                                         explanations=self.explanations)
        return _FormulaFeatures(fragments, losses, fragments.squared_norms(), losses.squared_norms())

    def pairwise(self, fa: _FormulaFeatures, fb: _FormulaFeatures) -> np.ndarray:
        a = float(self.loss_weight)
        out = normalize_block(bag_dot(fa.fragments, fb.fragments), fa.diag_fragments, fb.diag_fragments)
        out *= 1.0 - a
        if a > 0:
            out += a * normalize_block(bag_dot(fa.losses, fb.losses), fa.diag_losses, fb.diag_losses)
        return out

    def self_similarity(self, features: _FormulaFeatures) -> np.ndarray:
        a = float(self.loss_weight)
        return (1.0 - a) * (features.diag_fragments > 0) + a * (features.diag_losses > 0)
