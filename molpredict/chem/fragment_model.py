"""A learnt fragmentation model: which of a structure's in-silico fragments a spectrum shows, and the likelihood
of a spectrum's peaks under a candidate's predicted fragment ions.

Ions
----
The fragments are those :func:`molpredict.chem.fragments.fragment_structure` enumerates (chain bonds, rings opened by
two bonds, up to ``max_depth`` cleavages). An *ion* is a fragment with a hydrogen shift ``h`` in
``-max_h_shift..max_h_shift``: neutral mass ``m_f + h m(H)``, observed at ``m_f + h m(H) + carrier`` (the
carriers of :func:`molpredict.chem.fragments.ion_carriers`). A logistic model predicts, from features of the fragment
and of the bonds broken to detach it (:func:`fragment_features`, :data:`FEATURE_NAMES`) and of the shift, the
probability ``p_i`` that a spectrum of the structure shows ion ``i``. It is trained on the training spectra: an
ion is shown by a spectrum when a peak of at least ``min_relative_intensity`` of the base peak lies within the
m/z tolerance; each structure's ions are labelled with the fraction of its spectra that show them.

Score
-----
Ions with the same neutral mass (the same formula and shift) are one *group* ``g`` with
``q_g = 1 - prod_{i in g} (1 - p_i)``. The score of a candidate is

    sum_p w_p log(eps + (1 - eps) Q_p)  +  absent_weight * sum_{g matched by no peak} log(1 - q_g)

over the peaks ``p`` scored (those of at least ``min_relative_intensity``, below the precursor), ``w_p`` the
normalised peak weights (``mz ** mz_power * intensity ** intensity_power``, summing to 1), ``Q_p`` the largest
``q_g`` of a group explaining ``p`` (0 when none does, so an unexplained peak costs ``log eps``); confident
fragments that no peak shows are penalised by the second sum.

A structure too large to fragment (more than :data:`~molpredict.chem.fragments.MAX_FRAGMENT_ATOMS` heavy atoms)
has no ions. The formula would give it ``log eps`` (every peak unexplained) without any absent-ion penalty, more
than a candidate whose confident ions are missing: :meth:`FragmentModel.score` gives it the lowest score of the
candidates scored with it instead (at most ``log eps``; at most 0 without peaks), so that it never gains by not
being fragmented.
"""
from __future__ import annotations

import json
import math
import os
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rdkit import Chem

from molpredict.chem.fragments import (BOND_KINDS, FRAGMENTATION_VERSION, HYDROGEN_MASS, FragmentScorer, FragmentSet,
                                       held_in_cache, recent_fragments, scored_peaks)
from molpredict.chem.molecules import Molecule
from molpredict.component import Component
from molpredict.errors import InputError, ModelFileError, SpecError
from molpredict.spectra.record import Spectrum

__all__ = ["FEATURE_NAMES", "FEATURE_BINS", "SHIFT_INTERACTIONS", "fragment_features", "binned_features",
           "ion_features", "FragmentModel", "peak_log_likelihood", "spectra_by_structure"]

_HALOGENS = (9, 17, 35, 53)
_FORMAT = "molpredict-fragment-model"
_VERSION = 1

#: Structural features of a fragment (columns of :func:`fragment_features`).
FEATURE_NAMES = (
    "bias",
    "heavy_atoms", "heavy_fraction", "mass_100", "mass_fraction",
    "n_C", "n_H", "n_N", "n_O", "n_S", "n_P", "n_halogen",
    "aromatic_atoms", "aromatic_fraction", "ring_atoms_fraction", "dbe",
    "intact", "depth1", "depth2",
    "bonds_broken",
    *(f"broken_{k}" for k in BOND_KINDS),
    "broken_ring", "broken_chain",
    "broken_CC", "broken_CN", "broken_CO", "broken_other",
    "hetero_kept", "hetero_lost",
    "degree_kept", "degree_lost",
    "aromatic_end_kept", "aromatic_end_lost",
    "hetero_neighbours_kept",
)
_N_STRUCT = len(FEATURE_NAMES)


def _mol(molecule: Molecule | Chem.Mol | str) -> Chem.Mol:
    if isinstance(molecule, str):
        molecule = Molecule(molecule)
    mol = molecule.rdkit_mol if isinstance(molecule, Molecule) else molecule
    if mol.GetNumAtoms() and any(a.GetAtomicNum() == 1 for a in mol.GetAtoms()):
        mol = Chem.RemoveHs(mol, sanitize=False)
    return mol


def fragment_features(molecule: Molecule | Chem.Mol | str, fragments: FragmentSet) -> np.ndarray:
    """Features of each fragment of a structure (columns :data:`FEATURE_NAMES`).

    Parameters
    ----------
    molecule : Molecule, RDKit Mol or SMILES
        The structure ``fragments`` was cut from.
    fragments : FragmentSet
        Made with ``keep_atoms=True`` (the atom masks locate the broken bonds).

    Returns
    -------
    ndarray of shape (n_fragments, len(FEATURE_NAMES)), float64
        Counts over the fragment's heavy atoms (``n_H``: the hydrogens they carry in the intact structure), its
        mass (/100) and fractions of the intact structure's, ``dbe = C - (H + halogens)/2 + N/2 + P/2 + 1`` of the
        fragment's atoms, depth indicators, and over the broken bonds (those with one end in the fragment): by
        kind, in a ring or not, by element pair, whether the fragment keeps (``kept``) or loses (``lost``) a
        heteroatom end, the heavy-atom degrees of the kept / lost ends (summed), aromatic ends, and the heteroatom
        neighbours of the kept ends (summed).
    """
    if fragments.atoms is None:
        raise SpecError("fragment_features needs fragments made with keep_atoms=True")
    if fragments.n_fragments == 0:   # a structure not fragmented (too large)
        return np.zeros((0, _N_STRUCT))
    mol = _mol(molecule)
    atoms = fragments.atoms.astype(np.float64)                          # (n_frag, n_atoms)
    n_atoms = mol.GetNumAtoms()
    z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()])
    aromatic = np.array([a.GetIsAromatic() for a in mol.GetAtoms()], dtype=np.float64)
    in_ring = np.array([a.IsInRing() for a in mol.GetAtoms()], dtype=np.float64)
    degree = np.array([a.GetDegree() for a in mol.GetAtoms()], dtype=np.float64)
    hetero = (z != 6).astype(np.float64)
    hetero_nb = np.array([sum(n.GetAtomicNum() != 6 for n in a.GetNeighbors()) for a in mol.GetAtoms()],
                         dtype=np.float64)
    el = {e: i for i, e in enumerate(fragments.elements)}

    def count(symbol: str) -> np.ndarray:
        return fragments.counts[:, el[symbol]].astype(np.float64) if symbol in el else np.zeros(fragments.n_fragments)

    n_c, n_h, n_n, n_o, n_s, n_p = (count(s) for s in ("C", "H", "N", "O", "S", "P"))
    n_x = atoms @ np.isin(z, _HALOGENS).astype(np.float64)
    heavy = atoms.sum(axis=1)
    out = np.zeros((fragments.n_fragments, _N_STRUCT))
    col = {name: i for i, name in enumerate(FEATURE_NAMES)}
    out[:, col["bias"]] = 1.0
    out[:, col["heavy_atoms"]] = heavy
    out[:, col["heavy_fraction"]] = heavy / n_atoms
    out[:, col["mass_100"]] = fragments.masses / 100.0
    out[:, col["mass_fraction"]] = fragments.masses / fragments.masses[0]
    for name, v in (("n_C", n_c), ("n_H", n_h), ("n_N", n_n), ("n_O", n_o), ("n_S", n_s), ("n_P", n_p),
                    ("n_halogen", n_x)):
        out[:, col[name]] = v
    arom = atoms @ aromatic
    out[:, col["aromatic_atoms"]] = arom
    out[:, col["aromatic_fraction"]] = arom / np.maximum(heavy, 1)
    out[:, col["ring_atoms_fraction"]] = (atoms @ in_ring) / np.maximum(heavy, 1)
    out[:, col["dbe"]] = n_c - (n_h + n_x) / 2 + n_n / 2 + n_p / 2 + 1
    depth = fragments.depth.astype(np.int64)
    out[:, col["intact"]] = depth == 0
    out[:, col["depth1"]] = depth == 1
    out[:, col["depth2"]] = depth >= 2
    bonds = list(mol.GetBonds())
    if bonds:
        u = np.array([b.GetBeginAtomIdx() for b in bonds])
        v = np.array([b.GetEndAtomIdx() for b in bonds])
        in_u, in_v = fragments.atoms[:, u], fragments.atoms[:, v]
        broken = (in_u != in_v).astype(np.float64)                      # (n_frag, n_bonds)
        kept = np.where(in_u, u[None, :], v[None, :])                      # fragment-side end of each bond
        lost = np.where(in_u, v[None, :], u[None, :])
        out[:, col["bonds_broken"]] = broken.sum(axis=1)
        out[:, [col[f"broken_{k}"] for k in BOND_KINDS]] = fragments.broken_by_type.astype(np.float64)
        ring = np.array([b.IsInRing() for b in bonds], dtype=np.float64)
        out[:, col["broken_ring"]] = broken @ ring
        out[:, col["broken_chain"]] = broken @ (1 - ring)
        pair = np.sort(np.stack([z[u], z[v]], axis=1), axis=1)
        cc = (pair[:, 0] == 6) & (pair[:, 1] == 6)
        cn = (pair[:, 0] == 6) & (pair[:, 1] == 7)
        co = (pair[:, 0] == 6) & (pair[:, 1] == 8)
        out[:, col["broken_CC"]] = broken @ cc
        out[:, col["broken_CN"]] = broken @ cn
        out[:, col["broken_CO"]] = broken @ co
        out[:, col["broken_other"]] = broken @ ~(cc | cn | co)
        out[:, col["hetero_kept"]] = (broken * hetero[kept]).sum(axis=1)
        out[:, col["hetero_lost"]] = (broken * hetero[lost]).sum(axis=1)
        out[:, col["degree_kept"]] = (broken * degree[kept]).sum(axis=1)
        out[:, col["degree_lost"]] = (broken * degree[lost]).sum(axis=1)
        out[:, col["aromatic_end_kept"]] = (broken * aromatic[kept]).sum(axis=1)
        out[:, col["aromatic_end_lost"]] = (broken * aromatic[lost]).sum(axis=1)
        out[:, col["hetero_neighbours_kept"]] = (broken * hetero_nb[kept]).sum(axis=1)
    return out


def _h_shifts(max_h_shift: int) -> np.ndarray:
    return np.arange(-max_h_shift, max_h_shift + 1)


#: Bin edges of the one-hot encoded features (column name -> edges), so that a linear model bends.
FEATURE_BINS = {
    "heavy_fraction": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.999),
    "mass_100": (0.3, 0.5, 0.7, 0.9, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0),
    "heavy_atoms": (1.5, 2.5, 3.5, 4.5, 6.5, 8.5, 12.5, 16.5),
    "dbe": (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0),
}
#: Fragment features whose products with the hydrogen-shift one-hot are inputs too.
SHIFT_INTERACTIONS = ("bonds_broken", "intact", "heavy_fraction", "broken_ring", "hetero_kept", "hetero_lost",
                      "aromatic_fraction")


def binned_features(features: np.ndarray) -> np.ndarray:
    """One-hot bins of the :data:`FEATURE_BINS` columns of ``features`` (n_fragments, len(FEATURE_NAMES)),
    ndarray of shape (n_fragments, sum(len(edges) + 1)); bin ``j`` of a column holds ``edges[j-1] <= x <
    edges[j]``."""
    parts = []
    for name, edges in FEATURE_BINS.items():
        which = np.digitize(features[:, FEATURE_NAMES.index(name)], edges)
        parts.append((which[:, None] == np.arange(len(edges) + 1)[None, :]).astype(np.float64))
    return np.concatenate(parts, axis=1)


def ion_features(features: np.ndarray, max_h_shift: int) -> np.ndarray:
    """The model's inputs for every (fragment, hydrogen shift).

    Columns: the fragment's features (:data:`FEATURE_NAMES`), a one-hot of the shift, the products of the shift
    one-hot with the :data:`SHIFT_INTERACTIONS` features, the binned features (:func:`binned_features`), and
    their products with the shift one-hot.

    Parameters
    ----------
    features : ndarray of shape (n_fragments, len(FEATURE_NAMES))
    max_h_shift : int

    Returns
    -------
    ndarray of shape (n_fragments * n_shifts, n_inputs), float64
        Row ``f * n_shifts + s`` is fragment ``f`` with shift ``h = s - max_h_shift``.
    """
    n_s = 2 * max_h_shift + 1
    n_frag = features.shape[0]
    binned = binned_features(features)
    inter_cols = [FEATURE_NAMES.index(c) for c in SHIFT_INTERACTIONS]
    base = np.repeat(features, n_s, axis=0)
    hot = np.tile(np.eye(n_s), (n_frag, 1))
    rows = base.shape[0]
    inter = (hot[:, :, None] * base[:, None, inter_cols]).reshape(rows, -1)
    binned = np.repeat(binned, n_s, axis=0)
    inter_bins = (hot[:, :, None] * binned[:, None, :]).reshape(rows, -1)
    return np.concatenate([base, hot, inter, binned, inter_bins], axis=1)


def _structure_table(molecule: Molecule | str, max_depth: int) -> tuple[FragmentSet, np.ndarray]:
    fragments = recent_fragments(molecule, max_depth)
    return fragments, fragment_features(molecule, fragments)


def _ion_masses(fragments: FragmentSet, max_h_shift: int) -> np.ndarray:
    """Neutral mass of every (fragment, hydrogen shift), ndarray of shape (n_fragments * n_shifts,), in
    :func:`ion_features` row order."""
    shifts = _h_shifts(max_h_shift) * HYDROGEN_MASS
    return (fragments.masses[:, None] + shifts[None, :]).ravel()


def _group_ions(masses: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ions of equal neutral mass (to 1e-6 Da) as one group: ``(group masses sorted, q_g = 1 - prod(1 - p_i))``."""
    key = np.round(masses, 6)
    uniq, inverse = np.unique(key, return_inverse=True)
    log_miss = np.zeros(uniq.size)
    np.add.at(log_miss, inverse, np.log1p(-np.minimum(p, 1 - 1e-12)))
    return uniq, -np.expm1(log_miss)


def peak_log_likelihood(group_mass: np.ndarray, group_q: np.ndarray, mz: np.ndarray, weight: np.ndarray,
                        tolerance: np.ndarray, shifts: np.ndarray, eps: float, absent_weight: float) -> float:
    """The score of one candidate (module docstring), vectorised.

    Parameters
    ----------
    group_mass, group_q : ndarray of shape (n_groups,)
        Neutral masses (sorted ascending) and probabilities of the candidate's ion groups.
    mz, weight, tolerance : ndarray of shape (n_peaks,)
        Peaks scored, their weights (summing to 1) and m/z tolerances.
    shifts : ndarray of shape (n_carriers,)
        Carrier mass shifts (ion m/z = group mass + shift).
    eps : float
        Probability of a peak no ion explains (noise).
    absent_weight : float
        Weight of the absent-ion penalty.
    """
    if group_mass.size == 0:
        return float(weight.sum() * math.log(eps)) if mz.size else 0.0
    if mz.size == 0:
        return absent_weight * float(np.log1p(-np.minimum(group_q, 1 - 1e-12)).sum())
    target = mz[None, :] - shifts[:, None]                                 # (n_carriers, n_peaks)
    lo = np.searchsorted(group_mass, target - tolerance, side="left").ravel()
    hi = np.searchsorted(group_mass, target + tolerance, side="right").ravel()
    q_ext = np.append(group_q, 0.0)
    bounds = np.empty(2 * lo.size, dtype=np.intp)
    bounds[0::2] = lo
    bounds[1::2] = hi
    window = np.where(hi > lo, np.maximum.reduceat(q_ext, bounds)[0::2], 0.0)
    best = window.reshape(shifts.size, mz.size).max(axis=0)
    cover = np.zeros(group_mass.size + 1, dtype=np.int64)
    np.add.at(cover, lo, 1)
    np.add.at(cover, hi, -1)
    matched = np.cumsum(cover[:-1]) > 0
    peak_part = float(weight @ np.log(eps + (1 - eps) * best))
    absent = float(np.log1p(-np.minimum(group_q[~matched], 1 - 1e-12)).sum())
    return peak_part + absent_weight * absent


def _score_many(tables: Sequence[tuple[np.ndarray, np.ndarray]], mz: np.ndarray, weight: np.ndarray,
                tolerance: np.ndarray, shifts: np.ndarray, eps: float, absent_weight: float) -> np.ndarray:
    """:func:`peak_log_likelihood` of several candidates' ion groups at once: every candidate's sorted masses in
    one array, candidate ``c`` offset by ``c * spacing`` so that one searchsorted finds every (candidate,
    carrier, peak) window. ndarray of shape (len(tables),)."""
    n_cand = len(tables)
    sizes = np.array([t[0].size for t in tables])
    peak_part = np.zeros(n_cand)
    total = int(sizes.sum())
    if total == 0:
        return np.full(n_cand, float(weight.sum() * math.log(eps)) if mz.size else 0.0)
    masses = np.concatenate([t[0] for t in tables])
    q = np.concatenate([t[1] for t in tables])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    spacing = 2.0 * (float(np.abs(masses).max()) + (float(mz.max()) if mz.size else 0.0)
                     + float(np.abs(shifts).max(initial=0.0)) + (float(tolerance.max()) if mz.size else 0.0)) + 1.0
    owner = np.repeat(np.arange(n_cand), sizes)
    keys = masses + owner * spacing                                       # ascending: masses sorted per candidate
    matched = np.zeros(total, dtype=bool)
    if mz.size:
        target = (mz[None, :] - shifts[:, None])                           # (n_carriers, n_peaks)
        base = (np.arange(n_cand) * spacing)[:, None, None]
        lo = np.searchsorted(keys, base + target - tolerance, side="left").ravel()
        hi = np.searchsorted(keys, base + target + tolerance, side="right").ravel()
        q_ext = np.append(q, 0.0)
        bounds = np.empty(2 * lo.size, dtype=np.intp)
        bounds[0::2] = lo
        bounds[1::2] = hi
        window = np.where(hi > lo, np.maximum.reduceat(q_ext, bounds)[0::2], 0.0)
        best = window.reshape(n_cand, shifts.size, mz.size).max(axis=1)    # (n_cand, n_peaks)
        peak_part = np.log(eps + (1 - eps) * best) @ weight
        cover = np.zeros(total + 1, dtype=np.int64)
        np.add.at(cover, lo, 1)
        np.add.at(cover, hi, -1)
        matched = np.cumsum(cover[:-1]) > 0
    log_absent = np.where(matched, 0.0, np.log1p(-np.minimum(q, 1 - 1e-12)))
    absent = np.zeros(n_cand)
    nonempty = sizes > 0
    absent[nonempty] = np.add.reduceat(log_absent, starts[nonempty])
    out = peak_part + absent_weight * absent
    if not nonempty.all():   # not fragmented: the lowest of the others, at most explaining nothing (module docstring)
        nothing = float(weight.sum() * math.log(eps)) if mz.size else 0.0
        out[~nonempty] = min(nothing, float(out[nonempty].min()))
    return out


class FragmentModel(Component):
    """Learnt fragmentation: the probability that a spectrum shows each in-silico fragment ion of a structure,
    and the likelihood score of candidates (module docstring).

    Parameters
    ----------
    max_depth : int, default 2
    max_h_shift : int, default 2
    tolerance_ppm : float, default 20.0
    min_tolerance_da : float, default 0.01
    min_relative_intensity : float, default 0.01
        Peaks below this fraction of the base peak are neither labels nor scored.
    intensity_power, mz_power : float, default 0.5, 0.0
        Peak weights ``mz ** mz_power * intensity ** intensity_power`` (normalised to sum 1).
    eps : float, default 0.02
        Probability of a peak no ion explains.
    absent_weight : float, default 0.02
        Weight of the penalty of predicted ions no peak shows.
    C : float, default 1.0
        Inverse L2 strength of the logistic regression.
    max_ions_per_structure : int, default 4000
        Ions of one structure kept for training (a seeded sample; large structures do not dominate).
    seed : int, default 0
    cache_size : int, default 8192
        Structures whose ion groups are kept in memory.

    Attributes
    ----------
    coef_ : ndarray of shape (n_inputs,)
        Logistic weights over standardised inputs (:func:`ion_features`).
    mean_, scale_ : ndarray of shape (n_inputs,)
        Input standardisation.
    intercept_ : float
    training_ : dict
        What it was fitted on (counts, the training log-loss).
    """

    def __init__(self, max_depth: int = 2, max_h_shift: int = 2, tolerance_ppm: float = 20.0,
                 min_tolerance_da: float = 0.01, min_relative_intensity: float = 0.01, intensity_power: float = 0.5,
                 mz_power: float = 0.0, eps: float = 0.02, absent_weight: float = 0.02, C: float = 1.0,
                 max_ions_per_structure: int = 4000, negative_fraction: float = 0.2, seed: int = 0, cache_size: int = 8192) -> None:
        self.max_depth = max_depth
        self.max_h_shift = max_h_shift
        self.tolerance_ppm = tolerance_ppm
        self.min_tolerance_da = min_tolerance_da
        self.min_relative_intensity = min_relative_intensity
        self.intensity_power = intensity_power
        self.mz_power = mz_power
        self.eps = eps
        self.absent_weight = absent_weight
        self.C = C
        self.max_ions_per_structure = max_ions_per_structure
        self.negative_fraction = negative_fraction
        self.seed = seed
        self.cache_size = cache_size

    # -- peaks ----------------------------------------------------------------------------------------------
    def _scorer(self) -> FragmentScorer:
        return FragmentScorer(max_depth=self.max_depth, max_h_shift=self.max_h_shift,
                              tolerance_ppm=self.tolerance_ppm, min_tolerance_da=self.min_tolerance_da,
                              intensity_power=self.intensity_power, mz_power=self.mz_power)

    def peaks(self, spectrum: Spectrum) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(m/z, weight summing to 1, tolerance)`` of the peaks scored, sorted by m/z: positive intensity, at
        least ``min_relative_intensity`` of the base peak, below the precursor m/z (plus the tolerance)."""
        mz, weight, tolerance = scored_peaks(spectrum, self.tolerance_ppm, self.min_tolerance_da, self.mz_power,
                                             self.intensity_power, self.min_relative_intensity)
        total = float(weight.sum())
        return mz, (weight / total if total > 0 else weight), tolerance

    def carrier_shifts(self, spectrum: Spectrum, adduct: Any = None) -> np.ndarray:
        return np.array([c.mass_shift for c in self._scorer()._carriers(spectrum, adduct)])

    # -- training -------------------------------------------------------------------------------------------
    def ion_table(self, molecule: Molecule | str) -> tuple[np.ndarray, np.ndarray]:
        """``(neutral ion masses (n_ions,), inputs (n_ions, n_inputs))`` of a structure."""
        fragments, features = _structure_table(molecule, self.max_depth)
        return _ion_masses(fragments, self.max_h_shift), ion_features(features, self.max_h_shift)

    def labels(self, masses: np.ndarray, spectra: Sequence[Spectrum]) -> np.ndarray:
        """Fraction of ``spectra`` showing each ion of neutral mass ``masses``, ndarray (n_ions,)."""
        order = np.argsort(masses)
        sorted_m = masses[order]
        shown = np.zeros(masses.size)
        for spectrum in spectra:
            mz, _, tol = self.peaks(spectrum)
            hit = np.zeros(masses.size, dtype=bool)
            for shift in self.carrier_shifts(spectrum):
                lo = np.searchsorted(sorted_m, mz - shift - tol, side="left")
                hi = np.searchsorted(sorted_m, mz - shift + tol, side="right")
                cover = np.zeros(masses.size + 1, dtype=np.int64)
                np.add.at(cover, lo, 1)
                np.add.at(cover, hi, -1)
                hit |= np.cumsum(cover[:-1]) > 0
            shown[order] += hit
        return shown / max(len(spectra), 1)

    def training_data(self, by_structure: Sequence[tuple[str, Sequence[Spectrum]]]) -> tuple[np.ndarray, ...]:
        """Inputs, soft labels and structure index of the ions of each ``(smiles, spectra)``."""
        rng = np.random.default_rng(self.seed)
        xs, ys, ws, gs = [], [], [], []
        for g, (smiles, spectra) in enumerate(by_structure):
            try:
                masses, x = self.ion_table(smiles)
                y = self.labels(masses, spectra)
            except (InputError, ValueError, RuntimeError):
                continue
            if x.shape[0] > self.max_ions_per_structure:
                keep = np.sort(rng.choice(x.shape[0], self.max_ions_per_structure, replace=False))
                x, y = x[keep], y[keep]
            # Ions no spectrum shows are most of them: keep a seeded share, weighted up to stand for the rest.
            keep = (y > 0) | (rng.random(y.shape[0]) < self.negative_fraction)
            xs.append(x[keep].astype(np.float32))
            ys.append(y[keep])
            ws.append(np.where(y[keep] > 0, 1.0, 1.0 / self.negative_fraction))
            gs.append(np.full(int(keep.sum()), g))
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(ws), np.concatenate(gs)

    def fit_arrays(self, x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> "FragmentModel":
        """Fit the logistic model on inputs ``x`` (n, n_inputs), soft labels ``y`` in [0, 1] and row weights."""
        from sklearn.linear_model import LogisticRegression

        mean = x.mean(axis=0).astype(np.float64)
        scale = x.std(axis=0).astype(np.float64)
        constant = scale < 1e-12
        scale[constant] = 1.0
        mean[constant] = 0.0
        xs = ((x - mean) / scale).astype(np.float32)
        n = x.shape[0]
        weight = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64)
        xx = np.concatenate([xs, xs])
        yy = np.concatenate([np.ones(n), np.zeros(n)])
        ww = np.concatenate([y * weight, (1 - y) * weight])
        keep = ww > 0
        lr = LogisticRegression(C=self.C, max_iter=300)
        lr.fit(xx[keep], yy[keep], sample_weight=ww[keep])
        self.coef_ = lr.coef_[0].astype(np.float64)
        self.intercept_ = float(lr.intercept_[0])
        self.mean_, self.scale_ = mean, scale
        self._clear_cache()
        return self

    def fit(self, by_structure: Sequence[tuple[str, Sequence[Spectrum]]]) -> "FragmentModel":
        """Fit on ``(SMILES, its spectra)`` pairs (one per structure; :func:`spectra_by_structure`)."""
        x, y, w, _ = self.training_data(by_structure)
        if x.shape[0] == 0 or not np.any(y > 0) or not np.any(y < 1):
            raise InputError("the fragment model needs training spectra whose peaks some fragments explain")
        self.fit_arrays(x, y, w)
        self.training_ = {"n_structures": len(by_structure), "n_ions": int(x.shape[0]),
                          "mean_label": float(y.mean())}
        return self

    # -- state ----------------------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if getattr(self, "coef_", None) is None:
            raise SpecError("FragmentModel is not fitted")

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(arrays, JSON-ready fields)`` of the fitted model (what :meth:`save` writes)."""
        self._check_fitted()
        arrays = {"coef": np.asarray(self.coef_, dtype=np.float64), "mean": np.asarray(self.mean_, np.float64),
                  "scale": np.asarray(self.scale_, dtype=np.float64)}
        fields = {"format": _FORMAT, "version": _VERSION, "params": self.get_params(),
                  "intercept": float(self.intercept_), "n_inputs": int(self.coef_.shape[0]),
                  "training": dict(getattr(self, "training_", {}))}
        return arrays, fields

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], fields: dict[str, Any]) -> "FragmentModel":
        """Rebuild a fitted model from :meth:`state`'s output (raises ``ModelFileError`` when inconsistent)."""
        if fields.get("format") != _FORMAT or int(fields.get("version", 0)) > _VERSION:
            raise ModelFileError(f"not a fragment model of version <= {_VERSION}")
        try:
            model = cls(**dict(fields["params"]))
            coef, mean, scale = (np.asarray(arrays[k], dtype=np.float64) for k in ("coef", "mean", "scale"))
            intercept = float(fields["intercept"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"fragment model state is incomplete ({type(exc).__name__}: {exc})") from None
        n_inputs = ion_features(np.zeros((1, _N_STRUCT)), model.max_h_shift).shape[1]
        if not (coef.shape == mean.shape == scale.shape == (n_inputs,)) or not np.all(np.isfinite(coef)):
            raise ModelFileError(f"fragment model arrays do not match its inputs ({n_inputs})")
        model.coef_, model.mean_, model.scale_, model.intercept_ = coef, mean, scale, intercept
        model.training_ = dict(fields.get("training", {}))
        return model

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``fragment_model.npz`` (arrays) and ``fragment_model.json`` under ``directory``."""
        arrays, fields = self.state()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "fragment_model.npz", "wb") as handle:
            np.savez(handle, **arrays)
        (directory / "fragment_model.json").write_text(json.dumps(fields, indent=1))
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "FragmentModel":
        """Read what :meth:`save` wrote (``ModelFileError`` naming the directory when it cannot)."""
        directory = Path(directory)
        try:
            fields = json.loads((directory / "fragment_model.json").read_text())
            with np.load(directory / "fragment_model.npz", allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # a truncated npz is a bad zip
            raise ModelFileError(f"{directory}: unreadable fragment model ({type(exc).__name__})") from None
        try:
            return cls.from_state(arrays, fields)
        except ModelFileError as exc:
            raise ModelFileError(f"{directory}: {exc}") from None

    # -- prediction -----------------------------------------------------------------------------------------
    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Probability that a spectrum shows each ion, from inputs ``x`` (n, n_inputs); ndarray (n,)."""
        self._check_fitted()
        z = ((x - self.mean_) / self.scale_) @ self.coef_ + self.intercept_
        return 1.0 / (1.0 + np.exp(-z))

    def ion_probabilities(self, features: np.ndarray) -> np.ndarray:
        """:meth:`predict_proba` of every ion of fragments with ``features`` (n_fragments, len(FEATURE_NAMES)),
        without building :func:`ion_features`: the linear score splits into a per-fragment part, a per-shift part
        and the fragment x shift interactions, so it costs n_fragments x (features + bins) x shifts instead of
        one row of every input per ion. ndarray of shape (n_fragments * n_shifts,), in :func:`ion_features` row
        order."""
        self._check_fitted()
        n_s = 2 * self.max_h_shift + 1
        binned = binned_features(features)
        n_f, n_i, n_b = features.shape[1], len(SHIFT_INTERACTIONS), binned.shape[1]
        w = self.coef_ / self.scale_
        bounds = np.cumsum([0, n_f, n_s, n_s * n_i, n_b, n_s * n_b])
        if bounds[-1] != w.size:
            raise ModelFileError(f"fragment model: {w.size} coefficients, its inputs need {bounds[-1]}")
        w_base, w_hot, w_inter, w_bin, w_inter_bin = (w[a:b] for a, b in zip(bounds[:-1], bounds[1:]))
        inter = features[:, [FEATURE_NAMES.index(c) for c in SHIFT_INTERACTIONS]]
        z = ((features @ w_base + binned @ w_bin + (self.intercept_ - float((self.mean_ / self.scale_) @ self.coef_)))
             [:, None] + w_hot[None, :] + inter @ w_inter.reshape(n_s, n_i).T
             + binned @ w_inter_bin.reshape(n_s, n_b).T)
        return (1.0 / (1.0 + np.exp(-z))).ravel()

    # -- the per-structure cache as arrays (for the on-disk cache, :mod:`molpredict.chem.fragment_cache`) ----------
    def disk_cache_key(self) -> str:
        """The content key of the ion groups this model computes: a hash of ``coef_``, ``intercept_``, ``mean_``,
        ``scale_``, every :meth:`get_params` value, the inputs' definition (feature names, bins, interactions)
        and the versions of the model format and of the fragmentation; it changes whenever a prediction would."""
        from molpredict.chem.fragment_cache import content_key
        self._check_fitted()
        params = {"params": self.get_params(), "intercept": float(self.intercept_), "model_version": _VERSION,
                  "fragmentation": FRAGMENTATION_VERSION, "features": list(FEATURE_NAMES),
                  "bins": {k: list(v) for k, v in FEATURE_BINS.items()}, "interactions": list(SHIFT_INTERACTIONS),
                  "hydrogen_mass": HYDROGEN_MASS}
        arrays = {name: np.asarray(getattr(self, name + "_"), dtype=np.float64) for name in ("coef", "mean", "scale")}
        return content_key("fragment-model", params, arrays)

    def in_memory(self, smiles: Sequence[str]) -> set[str]:
        """The structures among ``smiles`` whose ion groups the memory cache holds (marked recently used)."""
        cache = getattr(self, "cache_", None)
        return held_in_cache(cache, smiles) if cache is not None else set()

    def cached_arrays(self, smiles: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
        """The ion groups the memory cache holds among ``smiles``, as arrays: SMILES -> ``mass``, ``q``."""
        cache = getattr(self, "cache_", None) or {}
        return {s: {"mass": cache[s][0], "q": cache[s][1]} for s in smiles if s in cache}

    def remember_arrays(self, entries: dict[str, dict[str, np.ndarray]]) -> set[str]:
        """Put ion groups given as :meth:`cached_arrays` writes them into the memory cache; returns the SMILES
        taken (none without a memory cache; an entry without the right arrays is not taken)."""
        if not self.cache_size:
            return set()
        cache = getattr(self, "cache_", None)
        if cache is None:
            cache = self.cache_ = OrderedDict()
        taken = set()
        for s, a in entries.items():
            mass, q = a.get("mass"), a.get("q")
            if mass is None or q is None or mass.ndim != 1 or q.shape != mass.shape:
                continue
            cache[s] = (mass, q)
            taken.add(s)
        while len(cache) > self.cache_size:
            cache.popitem(last=False)
        return taken

    def _clear_cache(self) -> None:
        self.cache_ = OrderedDict()

    def ion_groups(self, molecule: Molecule | str) -> tuple[np.ndarray, np.ndarray]:
        """``(group neutral masses sorted, q_g)`` of a structure (cached per SMILES)."""
        cache = getattr(self, "cache_", None)
        if cache is None:
            cache = self.cache_ = OrderedDict()
        key = molecule if isinstance(molecule, str) else molecule.smiles
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        fragments, features = _structure_table(molecule, self.max_depth)
        result = _group_ions(_ion_masses(fragments, self.max_h_shift), self.ion_probabilities(features))
        if self.cache_size:
            cache[key] = result
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return result

    def score(self, spectrum: Spectrum, molecules: Sequence[Molecule | str], adduct: Any = None) -> np.ndarray:
        """The log-likelihood score of each candidate (module docstring), all candidates in one vectorised pass.

        Parameters
        ----------
        spectrum : Spectrum
        molecules : sequence of Molecule or SMILES, length n_candidates
        adduct : str or Adduct, optional
            The precursor type (its charge carriers); the spectrum's own when None.

        Returns
        -------
        ndarray of shape (n_candidates,), float64
            ``-inf`` for a structure that cannot be parsed or fragmented; for one too large to fragment
            (:data:`~molpredict.chem.fragments.MAX_FRAGMENT_ATOMS`), the lowest score of the others (module
            docstring).
        """
        self._check_fitted()
        mz, weight, tol = self.peaks(spectrum)
        shifts = self.carrier_shifts(spectrum, adduct)
        out = np.full(len(molecules), -np.inf)
        tables, ok = [], []
        for c, m in enumerate(molecules):
            try:
                tables.append(self.ion_groups(m))
                ok.append(c)
            except (InputError, ValueError, RuntimeError):
                continue
        if not tables:
            return out
        out[ok] = _score_many(tables, mz, weight, tol, shifts, float(self.eps), float(self.absent_weight))
        return out

def spectra_by_structure(spectra: Sequence[Spectrum], molecules: Sequence[Molecule], max_structures: int | None = None,
                         seed: int = 0) -> list[tuple[str, list[Spectrum]]]:
    """Training pairs grouped by structure (InChIKey first block): ``[(SMILES, its spectra), ...]``, a seeded
    sample of at most ``max_structures`` structures (all when None), in key order."""
    groups: dict[str, tuple[str, list[Spectrum]]] = {}
    for spectrum, molecule in zip(spectra, molecules):
        key = molecule.inchikey14 or molecule.smiles
        groups.setdefault(key, (molecule.smiles, []))[1].append(spectrum)
    keys = sorted(groups)
    if max_structures is not None and len(keys) > max_structures:
        keys = sorted(np.random.default_rng(seed).choice(keys, size=max_structures, replace=False).tolist())
    return [groups[k] for k in keys]
