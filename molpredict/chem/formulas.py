"""Fragment-formula annotation: the precursor ion formula of a spectrum, and the sub-formulas of it that explain
each fragment mass (vectorised over all sub-formulas, cached per ion formula).

Formulas are element-count vectors. Every formula also has a 64-bit *key*, ``sum_e count_e * h_e (mod 2**64)``
with a fixed pseudo-random odd 64-bit ``h_e`` per element symbol: equal formulas have equal keys, and the key is
linear, so the key of a neutral loss (precursor ion minus fragment) is the difference of the two keys. Two
distinct formulas share a key with probability ~2**-64 per pair.

Sub-formula search (meet in the middle): the C/H sub-formulas ``(c, h)`` of the ion formula are enumerated with
their masses sorted once; the sub-formulas of the other elements (N, O, P, S, halogens, Na...) are enumerated as
a (usually small) product grid. For each fragment mass and each hetero-atom part, the C/H parts within the
tolerance are found by ``searchsorted``. A C60H100 ion has 6,161 C/H parts; an N5O10S2 hetero part grid has 396
entries; nothing is ever enumerated as the full product.

Chemical filter: a fragment ion must have a ring-plus-double-bond equivalent ``RDBE = 1 + sum_e n_e (v_e - 2) / 2
>= -0.5`` (valences C/Si 4, N/P/B 3, O/S/Se 2, H/halogens/alkali 1), the usual bound for (even- or odd-electron)
ions, which rules out e.g. ``H6`` or ``CH9`` "fragments".
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from molpredict.errors import InputError
from molpredict.chem.molecules import (DEFAULT_ADDUCTS, Adduct, adduct_composition, formula_mass, parse_adduct,
                        parse_formula)

__all__ = ["VALENCE", "element_key", "formula_key", "ion_formula", "precursor_ion_formula", "SubformulaTable",
           "subformula_table", "explain_masses"]

#: valences for the RDBE bound (elements not listed: 2, i.e. no contribution)
VALENCE = {"C": 4, "Si": 4, "N": 3, "P": 3, "B": 3, "O": 2, "S": 2, "Se": 2, "H": 1, "F": 1, "Cl": 1, "Br": 1,
           "I": 1, "Na": 1, "K": 1, "Li": 1}
#: the largest hetero-atom grid searched at once (peaks x grid entries per chunk stays ~ this x peaks)
HETERO_CHUNK = 4096


@lru_cache(maxsize=None)
def element_key(symbol: str) -> np.uint64:
    """The fixed pseudo-random odd 64-bit multiplier of an element symbol (from its BLAKE2b digest)."""
    digest = hashlib.blake2b(symbol.encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little") | 1)


def formula_key(counts: dict[str, int]) -> np.uint64:
    """The 64-bit key ``sum count_e * h_e (mod 2**64)`` of an element-count dict."""
    total = 0
    for element, n in counts.items():
        total = (total + int(n) * int(element_key(element))) % (1 << 64)
    return np.uint64(total)


def ion_formula(formula: str, adduct: str | Adduct) -> dict[str, int] | None:
    """Element counts of the precursor ion ``multiplier * M + adduct changes``; None when the adduct removes atoms
    the molecule lacks (e.g. ``[M-H2O+H]+`` of a molecule without oxygen).

    Raises
    ------
    InputError
        An unparsable formula or adduct.
    """
    ion = _ion_formula(formula, adduct)
    return None if ion is None else dict(ion)  # a copy: the remembered counts stay as computed


@lru_cache(maxsize=65536)
def _ion_formula(formula: str, adduct: str | Adduct) -> tuple[tuple[str, int], ...] | None:
    """:func:`ion_formula` as a tuple of items, remembered (a batch of spectra repeats a few (formula, adduct)
    pairs: every spectrum of a structure, every featurisation of a spectrum)."""
    counts, _ = parse_formula(formula)
    multiplier, changes, _ = adduct_composition(adduct)
    ion = {e: n * multiplier for e, n in counts.items()}
    for element, n in changes.items():
        ion[element] = ion.get(element, 0) + n
    if any(n < 0 for n in ion.values()):
        return None
    return tuple((e, n) for e, n in ion.items() if n) or None


def _adduct_of(spectrum: Any, formula: str) -> Adduct | None:
    """The spectrum's adduct; when it states none (or an unknown one), the default adduct of its ion mode whose
    precursor m/z is nearest the spectrum's (first default when the precursor m/z is unknown)."""
    if spectrum.adduct:
        try:
            return parse_adduct(spectrum.adduct)
        except InputError:
            pass
    mode = spectrum.ion_mode
    if mode not in DEFAULT_ADDUCTS:
        charge = spectrum.charge
        mode = "positive" if charge is None or charge > 0 else "negative"
    candidates = DEFAULT_ADDUCTS[mode]
    prec = spectrum.precursor_mz
    if prec is None or not np.isfinite(prec):
        return candidates[0]
    mass = formula_mass(formula)
    return min(candidates, key=lambda a: abs((a.multiplier * mass + a.mass_shift) / abs(a.charge) - prec))


def precursor_ion_formula(spectrum: Any) -> tuple[dict[str, int], int] | None:
    """The precursor ion formula of a spectrum (its ``formula`` metadata and adduct) and the ion's charge sign;
    None when the spectrum has no (parsable) formula or the adduct does not apply to it."""
    formula = spectrum.formula
    if not formula:
        return None
    try:
        adduct = _adduct_of(spectrum, formula)
        ion = ion_formula(formula, adduct)
    except InputError:
        return None
    if ion is None:
        return None
    return ion, (1 if adduct.charge > 0 else -1)


@dataclass(frozen=True)
class SubformulaTable:
    """All sub-formulas of one ion formula, split into a C/H part (sorted by mass) and a hetero-atom part.

    Attributes
    ----------
    key : numpy.uint64
        Key of the ion formula itself.
    ch_mass : ndarray of shape (n_ch,)
        Masses of the C/H parts, ascending.
    ch_key, ch_rdbe : ndarray of shape (n_ch,)
        Their keys (uint64) and RDBE contributions ``sum n_e (v_e - 2) / 2``.
    het_mass, het_key, het_rdbe : ndarray of shape (n_het,)
        The same for the hetero-atom parts (one entry, the empty part, when the ion is pure C/H).
    ch_elements, het_elements : tuple of str
        The elements of each part.
    ch_counts : ndarray of shape (n_ch, len(ch_elements)), int64
        Element counts of the C/H parts (rows in ``ch_mass`` order).
    het_counts : ndarray of shape (n_het, len(het_elements)), int64
    """

    key: np.uint64
    ch_mass: np.ndarray
    ch_key: np.ndarray
    ch_rdbe: np.ndarray
    het_mass: np.ndarray
    het_key: np.ndarray
    het_rdbe: np.ndarray
    ch_elements: tuple = ()
    het_elements: tuple = ()
    ch_counts: np.ndarray | None = None
    het_counts: np.ndarray | None = None

    def counts(self, ch: np.ndarray, het: np.ndarray) -> list[dict[str, int]]:
        """Element-count dicts of the sub-formulas made of C/H part ``ch[i]`` and hetero part ``het[i]`` (as
        :func:`explain_masses` returns them with ``parts=True``)."""
        out = []
        for c, h in zip(np.asarray(ch), np.asarray(het)):
            counts = dict(zip(self.ch_elements, self.ch_counts[c].tolist()))
            counts.update(zip(self.het_elements, self.het_counts[h].tolist()))
            out.append({e: n for e, n in counts.items() if n})
        return out


def _counts_grid(counts: list[int]) -> np.ndarray:
    """Every count vector ``0 <= n_e <= counts_e`` in C order, shape (prod(counts + 1), len(counts))."""
    if not counts:
        return np.zeros((1, 0), dtype=np.int64)
    axes = np.meshgrid(*[np.arange(n + 1, dtype=np.int64) for n in counts], indexing="ij")
    return np.stack([a.ravel() for a in axes], axis=1)


def _grid(elements: list[str], counts: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mass, key and RDBE contribution of every count vector ``0 <= n_e <= counts_e`` (C order)."""
    axes = np.meshgrid(*[np.arange(n + 1, dtype=np.int64) for n in counts], indexing="ij") if elements else []
    flat = [a.ravel() for a in axes]
    size = flat[0].size if flat else 1
    mass = np.zeros(size)
    key = np.zeros(size, dtype=np.uint64)
    rdbe = np.zeros(size)
    for element, n in zip(elements, flat):
        mass += n * formula_mass(element)
        key += n.astype(np.uint64) * element_key(element)  # wraps modulo 2**64
        rdbe += n * (VALENCE.get(element, 2) - 2) / 2.0
    return mass, key, rdbe


@lru_cache(maxsize=65536)
def _table(ion: tuple[tuple[str, int], ...]) -> SubformulaTable:
    counts = dict(ion)
    ch = [e for e in ("C", "H") if e in counts]
    het = [e for e in counts if e not in ("C", "H")]
    ch_mass, ch_key, ch_rdbe = _grid(ch, [counts[e] for e in ch])
    order = np.argsort(ch_mass, kind="stable")
    het_mass, het_key, het_rdbe = _grid(het, [counts[e] for e in het])
    return SubformulaTable(formula_key(counts), ch_mass[order], ch_key[order], ch_rdbe[order], het_mass, het_key,
                           het_rdbe, tuple(ch), tuple(het), _counts_grid([counts[e] for e in ch])[order],
                           _counts_grid([counts[e] for e in het]))


def subformula_table(ion: dict[str, int]) -> SubformulaTable:
    """The (cached) :class:`SubformulaTable` of an ion formula given as element counts."""
    return _table(tuple(sorted(ion.items())))


def explain_masses(table: SubformulaTable, masses: np.ndarray, tolerance: np.ndarray,
                   min_rdbe: float | None = -0.5, parts: bool = False) -> tuple[np.ndarray, ...]:
    """Every sub-formula of the ion whose mass is within ``tolerance`` of each of ``masses``.

    Parameters
    ----------
    table : SubformulaTable
    masses : ndarray of shape (n,)
        Neutral-formula masses to explain (a fragment ion's m/z plus / minus the electron mass for charge +1 / -1).
    tolerance : ndarray of shape (n,)
        Absolute tolerance (Da) of each mass.
    min_rdbe : float or None
        Keep sub-formulas with RDBE >= this (None: no filter).
    parts : bool
        Also return which C/H and hetero-atom part each explanation is made of (for
        :meth:`SubformulaTable.counts` and the ``ch_counts`` / ``het_counts`` tables).

    Returns
    -------
    index : ndarray of shape (k,), int64
        Which mass each explanation belongs to (ascending).
    key : ndarray of shape (k,), uint64
        Key of the explaining sub-formula.
    error : ndarray of shape (k,)
        Sub-formula mass minus the mass explained.
    ch, het : ndarray of shape (k,), int64
        Only with ``parts``: rows of ``table.ch_counts`` and ``table.het_counts``.
    """
    masses = np.asarray(masses, dtype=np.float64)
    tolerance = np.broadcast_to(np.asarray(tolerance, dtype=np.float64), masses.shape)
    idx_parts, key_parts, err_parts, ch_parts, het_parts = [], [], [], [], []
    for h0 in range(0, table.het_mass.size, HETERO_CHUNK):
        het = slice(h0, h0 + HETERO_CHUNK)
        target = masses[:, None] - table.het_mass[None, het]  # (n, n_het): mass the C/H part must have
        lo = np.searchsorted(table.ch_mass, (target - tolerance[:, None]).ravel(), side="left")
        hi = np.searchsorted(table.ch_mass, (target + tolerance[:, None]).ravel(), side="right")
        n_match = hi - lo
        total = int(n_match.sum())
        if total == 0:
            continue
        cell = np.repeat(np.arange(n_match.size, dtype=np.int64), n_match)
        ch = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(n_match) - n_match - lo, n_match)
        peak, het_i = np.divmod(cell, target.shape[1])
        het_i += h0
        keep = np.ones(total, dtype=bool)
        if min_rdbe is not None:
            keep = 1.0 + table.ch_rdbe[ch] + table.het_rdbe[het_i] >= min_rdbe
        key = table.ch_key[ch] + table.het_key[het_i]
        keep &= key != 0  # the empty formula explains nothing
        peak, ch, het_i, key = peak[keep], ch[keep], het_i[keep], key[keep]
        idx_parts.append(peak)
        key_parts.append(key)
        err_parts.append(table.ch_mass[ch] + table.het_mass[het_i] - masses[peak])
        ch_parts.append(ch)
        het_parts.append(het_i)
    if not idx_parts:
        empty = np.empty(0, np.int64)
        return (empty, np.empty(0, np.uint64), np.empty(0)) + ((empty, empty) if parts else ())
    index, key, error = np.concatenate(idx_parts), np.concatenate(key_parts), np.concatenate(err_parts)
    order = np.argsort(index, kind="stable")
    if parts:
        return index[order], key[order], error[order], np.concatenate(ch_parts)[order], \
            np.concatenate(het_parts)[order]
    return index[order], key[order], error[order]
