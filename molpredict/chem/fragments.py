"""In-silico fragmentation and peak explanation: break a candidate structure's bonds, match the fragment ions to
a spectrum's peaks, and score the explained intensity (a MetFrag-style, candidate-specific rescoring term).

Fragments
---------
A fragment is a connected set of heavy atoms of the structure, with the hydrogens those atoms carry in the
intact molecule. It is produced by *cleavages*: one cleavage breaks either one chain bond (a bond in no ring) or
two bonds of the same ring (a ring opens only when two of its bonds break). ``depth`` is the least number of
cleavages that detach the fragment (MetFrag's tree depth, 0 for the intact structure), ``bonds_broken`` the
number of bonds between the fragment and the rest of the molecule. Fragments of depth ``d`` are the connected
components of the intersections of ``d`` cleavage sides, so the set is enumerated with array operations over all
cleavages at once.

Ions and peaks
--------------
A singly charged fragment ion has ``m/z = fragment mass + h * m(H) + carrier`` with a hydrogen shift ``h`` in
``-max_h_shift..max_h_shift`` (rearrangements and radical cleavages move hydrogens) and a charge carrier taken
from the precursor type: ``+H`` (mass of H minus an electron) in positive mode, ``-H`` (plus an electron) in
negative mode, and the adduct's own carrier (``+Na``, ``+K``, ``+NH4``, ``+Cl``, none for ``[M]+``) when the
precursor is such an adduct. A peak is explained when an ion lies within ``max(tolerance_ppm * m/z * 1e-6,
min_tolerance_da, the spectrum's m/z precision)``; its weight is that of its best explanation:
``depth_penalty ** bonds_broken * h_shift_penalty ** |h|``, times a factor per broken bond of a harder kind
(C-C, aromatic, multiple; :data:`BOND_KINDS`). The score of a candidate is

    sum_p weight_p * w_p / sum_p w_p,   w_p = mz_p ** mz_power * intensity_p ** intensity_power

over the peaks below the precursor m/z (plus the tolerance): the fraction of the (transformed) intensity the
structure explains, in [0, 1], invariant to peak order and to the intensity scale.

Size limit
----------
A structure of more than :data:`MAX_FRAGMENT_ATOMS` heavy atoms is not fragmented: :func:`fragment_structure`
returns an empty :class:`FragmentSet` (no fragments, not even the intact structure), so it explains no peak: its
fragment score is 0 (the lowest), :meth:`FragmentScorer.explain_peaks` finds nothing, and the learnt model
(:mod:`molpredict.chem.fragment_model`) ranks it with the lowest score of the candidates scored with it. The
fragments of a chain of ``n`` atoms number ``~n^2 / 2`` at depth 2, each an ``n``-atom mask: an 800-carbon chain
took 4.7 GB, a 3,000-carbon candidate would need tens. Metabolites are below the limit: 14 of the candidate pool's
1.96 million structures are above it (glycans, lipopeptides and oligonucleotides of 3,700 to 8,700 Da, beyond the
precursor m/z of MS/MS spectra). Large rings cost more per atom (each pair of a ring's bonds is a cleavage): the
72-membered rings of archaeal tetraether lipids (about 100 heavy atoms) take 30 to 50 s and 0.5 to 0.7 GB.
"""
from __future__ import annotations

import json
import os
import re
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rdkit import Chem
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from molpredict.component import Component
from molpredict.errors import InputError, SpecError
from molpredict.chem.molecules import ELECTRON_MASS, Adduct, Molecule, parse_adduct, parse_formula
from molpredict.spectra.record import Spectrum

__all__ = [
    "scored_peaks",
    "FragmentSet",
    "FragmentScorer",
    "fragment_structure",
    "recent_fragments",
    "held_in_cache",
    "FRAGMENTATION_VERSION",
    "ion_carriers",
    "Carrier",
    "save_fragment_sets",
    "load_fragment_sets",
    "HYDROGEN_MASS",
    "BOND_KINDS",
    "MAX_FRAGMENT_ATOMS",
]

_PERIODIC_TABLE = Chem.GetPeriodicTable()
#: Mass of a hydrogen atom (Da), as RDKit's most common isotope.
HYDROGEN_MASS = float(_PERIODIC_TABLE.GetMostCommonIsotopeMass("H"))
_STORE_FORMAT = "molpredict-fragments"
_STORE_VERSION = 2
#: version of what :func:`fragment_structure` returns for a structure: bump it when its output changes, so that
#: on-disk caches of fragmentation results (:mod:`molpredict.chem.fragment_cache`) are not read any more
FRAGMENTATION_VERSION = 2   # 2: structures above MAX_FRAGMENT_ATOMS give an empty set
#: Kinds of broken bonds counted per fragment (cleaving them costs increasingly more energy, roughly).
BOND_KINDS = ("single-heteroatom", "single-carbon", "aromatic", "multiple")
#: Heavy atoms (hydrogens not counted) above which :func:`fragment_structure` does not fragment a structure and
#: returns an empty :class:`FragmentSet` (module docstring, "Size limit"). A chain of this many atoms takes about
#: 0.3 s and 120 MB to fragment to depth 2.
MAX_FRAGMENT_ATOMS = 250
# Fragment masks of one cleavage level are intersected in blocks of at most this many booleans (memory bound).
_BLOCK_BOOLS = 4_000_000
# Rows waiting in a _DistinctRows before they are deduplicated with those kept (at least).
_MERGE_ROWS = 65_536


# ----------------------------------------------------------------------------------------------------------
# Fragment sets
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FragmentSet:
    """The fragments of one structure (the intact structure first), sorted by mass after it; empty (no rows) for a
    structure above :data:`MAX_FRAGMENT_ATOMS`, which is not fragmented.

    Attributes
    ----------
    masses : ndarray of shape (n_fragments,), float64
        Neutral monoisotopic mass of each fragment (its heavy atoms and the hydrogens they carry in the intact
        structure).
    depth : ndarray of shape (n_fragments,), int8
        Least number of cleavages detaching the fragment (0 for the intact structure).
    broken_by_type : ndarray of shape (n_fragments, 4), int8
        Bonds between the fragment and the rest of the structure, by kind (columns as :data:`BOND_KINDS`:
        single bonds to a heteroatom, single C-C bonds, aromatic bonds, double or triple bonds);
        ``bonds_broken`` is their sum.
    counts : ndarray of shape (n_fragments, n_elements), int16
        Element counts (hydrogen included) per fragment, columns in the order of ``elements``.
    elements : tuple of str
        Element symbols naming the columns of ``counts``.
    atoms : ndarray of shape (n_fragments, n_heavy_atoms), bool, or None
        Which heavy atoms of the structure (RDKit indices, hydrogens removed) each fragment holds; only kept
        when asked for (:func:`fragment_structure` with ``keep_atoms=True``), never stored.
    """

    masses: np.ndarray
    depth: np.ndarray
    broken_by_type: np.ndarray
    counts: np.ndarray
    elements: tuple[str, ...]
    atoms: np.ndarray | None = None

    @property
    def n_fragments(self) -> int:
        return int(self.masses.shape[0])

    @property
    def bonds_broken(self) -> np.ndarray:
        """Bonds between each fragment and the rest, ndarray of shape (n_fragments,), int64."""
        return self.broken_by_type.sum(axis=1, dtype=np.int64)

    def formula(self, index: int, extra: Mapping[str, int] | None = None) -> str:
        """Formula of fragment ``index`` (C, H, then alphabetical, as RDKit writes it), plus ``extra`` atoms."""
        counts = {el: int(n) for el, n in zip(self.elements, self.counts[index])}
        for el, n in (extra or {}).items():
            counts[el] = counts.get(el, 0) + n
        return format_formula(counts)

    def up_to_depth(self, max_depth: int) -> FragmentSet:
        """The fragments of depth at most ``max_depth`` (the same object when nothing is dropped)."""
        keep = self.depth <= max_depth
        if keep.all():
            return self
        return FragmentSet(self.masses[keep], self.depth[keep], self.broken_by_type[keep], self.counts[keep],
                           self.elements, None if self.atoms is None else self.atoms[keep])


def format_formula(counts: Mapping[str, int]) -> str:
    """A formula string from element counts: C, H, then the other elements alphabetically (Hill-like, as
    RDKit's CalcMolFormula); zero counts left out, negative counts written as they are."""
    order = [el for el in ("C", "H") if counts.get(el)] + sorted(el for el in counts if el not in ("C", "H"))
    return "".join(el + (str(counts[el]) if counts[el] != 1 else "") for el in order if counts[el] != 0)


def _component_labels(alive: np.ndarray, u: np.ndarray, v: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Connected-component labels of many subgraphs of one graph at once (one sparse block-diagonal graph).

    Parameters
    ----------
    alive : ndarray of shape (n_graphs, n_edges), bool
        Which edges each subgraph keeps.
    u, v : ndarray of shape (n_edges,), int
        Edge end points.
    nodes : ndarray of shape (n_graphs, n_nodes), bool
        Which nodes each subgraph keeps (edges need both ends kept).

    Returns
    -------
    ndarray of shape (n_graphs, n_nodes), int64
        Labels unique over all subgraphs (two nodes share one iff same subgraph and connected); -1 for dropped
        nodes.
    """
    n_graphs = alive.shape[0]
    n_nodes = nodes.shape[1]
    alive = alive & nodes[:, u] & nodes[:, v]
    graph_of, edge = np.nonzero(alive)
    src = graph_of * n_nodes + u[edge]
    dst = graph_of * n_nodes + v[edge]
    size = n_graphs * n_nodes
    adjacency = coo_matrix((np.ones(src.shape[0], dtype=np.int8), (src, dst)), shape=(size, size))
    _, labels = connected_components(adjacency, directed=False)
    labels = labels.reshape(n_graphs, n_nodes).astype(np.int64)
    labels[~nodes] = -1
    return labels


def _unique_rows(masks: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct row of a boolean matrix (in first-occurrence order)."""
    if masks.shape[0] == 0:
        return np.zeros(0, dtype=np.intp)
    return _unique_packed(np.packbits(masks, axis=1))


def _unique_packed(packed: np.ndarray) -> np.ndarray:
    """:func:`_unique_rows` of bit-packed rows (uint8, as ``np.packbits(masks, axis=1)``)."""
    if packed.shape[0] == 0:
        return np.zeros(0, dtype=np.intp)
    packed = np.ascontiguousarray(packed)
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
    _, first = np.unique(keys, return_index=True)
    return np.sort(first)


class _DistinctRows:
    """The distinct rows of a stream of boolean blocks, in order of first occurrence (what concatenating the blocks
    and keeping each row's first occurrence gives), held bit-packed and deduplicated as they come (whenever the rows
    waiting outnumber those kept): memory follows the distinct rows, not every row produced (a macrocycle's ring
    openings intersect into millions of repeated atom sets)."""

    def __init__(self, n_cols: int) -> None:
        self.n_cols = n_cols
        self.kept = np.zeros((0, (n_cols + 7) // 8), dtype=np.uint8)
        self.waiting: list[np.ndarray] = []
        self.n_waiting = 0

    def add(self, rows: np.ndarray) -> None:
        if rows.shape[0] == 0:
            return
        packed = np.packbits(rows, axis=1)
        packed = packed[_unique_packed(packed)]
        self.waiting.append(packed)
        self.n_waiting += packed.shape[0]
        if self.n_waiting >= max(self.kept.shape[0], _MERGE_ROWS):
            self._merge()

    def _merge(self) -> None:
        if self.waiting:
            merged = np.concatenate([self.kept, *self.waiting])
            self.kept = merged[_unique_packed(merged)]
            self.waiting, self.n_waiting = [], 0

    def rows(self) -> np.ndarray:
        """The distinct rows, ndarray of shape (n_distinct, n_cols), bool."""
        self._merge()
        return np.unpackbits(self.kept, axis=1, count=self.n_cols).view(bool)


def _split_components(masks: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The connected components (as node masks) of each node mask's induced subgraph; empty masks dropped; in
    order of (mask, lowest node), each component once (its first occurrence), computed in blocks of masks."""
    block = max(1, _BLOCK_BOOLS // max(1, masks.shape[1], u.shape[0]))
    if masks.shape[0] <= block:
        return _split_block(masks, u, v)
    out = _DistinctRows(masks.shape[1])
    for start in range(0, masks.shape[0], block):
        out.add(_split_block(masks[start:start + block], u, v))
    return out.rows()


def _split_block(masks: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """:func:`_split_components` of one block of masks (components numbered by connected_components' labels, in
    order of their lowest node in the block-diagonal graph)."""
    masks = masks[masks.any(axis=1)]
    if masks.shape[0] == 0:
        return masks
    labels = _component_labels(np.ones((masks.shape[0], u.shape[0]), dtype=bool), u, v, masks)
    _, atom = np.nonzero(masks)
    _, piece = np.unique(labels[masks], return_inverse=True)
    out = np.zeros((int(piece.max()) + 1, masks.shape[1]), dtype=bool)
    out[piece, atom] = True
    return out


def _cleavage_sides(mol: Chem.Mol, u: np.ndarray, v: np.ndarray, n_atoms: int) -> tuple[np.ndarray, np.ndarray]:
    """One side (the part holding the first end of the first bond) of every cleavage of the structure.

    A cleavage is a chain bond, or a pair of bonds of the same smallest ring whose removal disconnects the
    structure (two bonds of one ring of a fused system may not). Returns the sides, ndarray of shape
    (n_cleavages, n_atoms), bool, and whether each cleavage is a chain bond, ndarray of shape (n_cleavages,).
    """
    n_bonds = u.shape[0]
    chain = [b.GetIdx() for b in mol.GetBonds() if not b.IsInRing()]
    pairs: set[tuple[int, int]] = set()
    for ring in mol.GetRingInfo().BondRings():
        ring = sorted(ring)
        pairs.update((a, b) for i, a in enumerate(ring) for b in ring[i + 1:])
    cuts = [(b, b) for b in chain] + sorted(pairs)
    if not cuts:
        return np.zeros((0, n_atoms), dtype=bool), np.zeros(0, dtype=bool)
    first = np.array([c[0] for c in cuts])
    second = np.array([c[1] for c in cuts])
    alive = np.ones((len(cuts), n_bonds), dtype=bool)
    rows = np.arange(len(cuts))
    alive[rows, first] = False
    alive[rows, second] = False
    labels = _component_labels(alive, u, v, np.ones((len(cuts), n_atoms), dtype=bool))
    side_label = labels[rows, u[first]]
    separated = side_label != labels[rows, v[first]]
    return (labels == side_label[:, None])[separated], (first == second)[separated]


def _bond_kind(bond: Chem.Bond) -> int:
    """Column of :data:`BOND_KINDS` for an RDKit bond."""
    if bond.GetIsAromatic() or bond.GetBondType() == Chem.BondType.AROMATIC:
        return 2
    if bond.GetBondType() != Chem.BondType.SINGLE:
        return 3
    carbon = bond.GetBeginAtom().GetAtomicNum() == 6 and bond.GetEndAtom().GetAtomicNum() == 6
    return 1 if carbon else 0


#: fragment sets (atoms kept) of the structures fragmented last, shared by the scorers that read one candidate
#: after another (the fragment score and the learnt fragmentation model fragment it once between them)
_RECENT: OrderedDict = OrderedDict()
_RECENT_SIZE = 512


def recent_fragments(molecule: Molecule | str, max_depth: int) -> FragmentSet:
    """:func:`fragment_structure` with ``keep_atoms=True``, remembered for the last few hundred structures
    (by SMILES and depth) in this process. Raises ``InputError`` for a SMILES RDKit cannot parse."""
    if isinstance(molecule, str):
        molecule = Molecule(molecule)
    key = (molecule.smiles, int(max_depth))
    hit = _RECENT.get(key)
    if hit is not None:
        _RECENT.move_to_end(key)
        return hit
    result = _RECENT[key] = fragment_structure(molecule, max_depth, keep_atoms=True)
    while len(_RECENT) > _RECENT_SIZE:
        _RECENT.popitem(last=False)
    return result


def held_in_cache(cache: OrderedDict, keys: Iterable[str]) -> set[str]:
    """The ``keys`` a least-recently-used cache holds, marked as recently used (a scorer's memory of structures,
    asked before its disk store is read)."""
    held = {k for k in keys if k in cache}
    for k in held:
        cache.move_to_end(k)
    return held


def fragment_structure(molecule: Molecule | Chem.Mol | str, max_depth: int = 2, keep_atoms: bool = False
                       ) -> FragmentSet:
    """All fragments of a structure up to ``max_depth`` cleavages (see the module docstring).

    Parameters
    ----------
    molecule : Molecule, RDKit Mol or SMILES
    max_depth : int, default 2
        Cleavages per fragment (0: the intact structure only).
    keep_atoms : bool, default False
        Keep each fragment's heavy-atom mask (for :meth:`FragmentScorer.explain_peaks`).

    Returns
    -------
    FragmentSet
        The intact structure first, then the fragments by increasing mass; each distinct atom set once, with
        the least depth that reaches it. Empty (``n_fragments == 0``, no intact structure either) for a structure
        of more than :data:`MAX_FRAGMENT_ATOMS` heavy atoms, which is not fragmented (module docstring).
    """
    if max_depth < 0:
        raise SpecError(f"max_depth must be >= 0, got {max_depth}")
    if isinstance(molecule, str):
        molecule = Molecule(molecule)
    mol = molecule.rdkit_mol if isinstance(molecule, Molecule) else molecule
    if mol.GetNumAtoms() and any(a.GetAtomicNum() == 1 for a in mol.GetAtoms()):
        mol = Chem.RemoveHs(mol, sanitize=False)
    n_atoms = mol.GetNumAtoms()
    if n_atoms == 0:
        raise InputError("a structure without atoms cannot be fragmented", field="smiles")
    symbols = [a.GetSymbol() for a in mol.GetAtoms()]
    elements = tuple(sorted(set(symbols) | {"H"}, key=lambda s: (s != "C", s != "H", s)))
    if n_atoms > MAX_FRAGMENT_ATOMS:
        return FragmentSet(np.zeros(0), np.zeros(0, dtype=np.int8), np.zeros((0, len(BOND_KINDS)), dtype=np.int8),
                           np.zeros((0, len(elements)), dtype=np.int16), elements,
                           np.zeros((0, n_atoms), dtype=bool) if keep_atoms else None)
    element_index = {el: i for i, el in enumerate(elements)}
    atom_counts = np.zeros((n_atoms, len(elements)), dtype=np.int64)
    atom_mass = np.zeros(n_atoms)
    for atom in mol.GetAtoms():
        i = atom.GetIdx()
        n_h = atom.GetTotalNumHs()
        atom_counts[i, element_index[atom.GetSymbol()]] += 1
        atom_counts[i, element_index["H"]] += n_h
        isotope = atom.GetIsotope()
        heavy = (_PERIODIC_TABLE.GetMassForIsotope(atom.GetAtomicNum(), isotope) if isotope
                 else _PERIODIC_TABLE.GetMostCommonIsotopeMass(atom.GetAtomicNum()))
        atom_mass[i] = heavy + n_h * HYDROGEN_MASS
    bonds = mol.GetBonds()
    u = np.array([b.GetBeginAtomIdx() for b in bonds], dtype=np.int64)
    v = np.array([b.GetEndAtomIdx() for b in bonds], dtype=np.int64)

    whole = np.ones((1, n_atoms), dtype=bool)
    found = [whole]
    found_depth = [np.zeros(1, dtype=np.int8)]
    if max_depth >= 1 and u.size:
        sides, is_chain = _cleavage_sides(mol, u, v, n_atoms)
        # A connected fragment meets a chain-bond side in one connected piece (or none): only intersections with
        # the sides of ring openings (two bonds) need their components found.
        chain_sides = np.concatenate([sides[is_chain], ~sides[is_chain]])
        ring_sides = np.concatenate([sides[~is_chain], ~sides[~is_chain]])
        frontier = whole
        seen = whole
        for depth in range(1, max_depth + 1):
            if frontier.shape[0] == 0 or sides.shape[0] == 0:
                break
            parts = []
            for group, split in ((chain_sides, False), (ring_sides, True)):
                if group.shape[0] == 0:
                    continue
                produced = _DistinctRows(n_atoms)   # the distinct intersections, in order of first occurrence
                block = max(1, _BLOCK_BOOLS // max(1, group.shape[0] * n_atoms))
                for start in range(0, frontier.shape[0], block):
                    produced.add((frontier[start:start + block, None, :] & group[None, :, :]).reshape(-1, n_atoms))
                inter = produced.rows()
                parts.append(_split_components(inter, u, v) if split else inter[inter.any(axis=1)])
            pieces = np.concatenate(parts)
            pieces = pieces[_unique_rows(pieces)]
            # Keep only atom sets not reached at a lower depth.
            stacked = np.concatenate([seen, pieces])
            first = _unique_rows(stacked)
            new = pieces[first[first >= seen.shape[0]] - seen.shape[0]]
            if new.shape[0] == 0:
                break
            found.append(new)
            found_depth.append(np.full(new.shape[0], depth, dtype=np.int8))
            seen = np.concatenate([seen, new])
            frontier = new
    atoms = np.concatenate(found)
    depth = np.concatenate(found_depth)
    kind = np.zeros((u.shape[0], len(BOND_KINDS)), dtype=np.int64)
    kind[np.arange(u.shape[0]), [_bond_kind(b) for b in bonds]] = 1
    # one product for the masses (BLAS rounds a row alike only within one call: blocks could reorder equal masses);
    # the integer products in blocks of rows (they widen the masks to 8-byte numbers)
    masses = atoms @ atom_mass
    counts = np.empty((atoms.shape[0], len(elements)), dtype=np.int16)
    broken_by_type = np.empty((atoms.shape[0], len(BOND_KINDS)), dtype=np.int8)
    block = max(1, _BLOCK_BOOLS // max(1, n_atoms, u.shape[0]))
    for start in range(0, atoms.shape[0], block):
        rows = atoms[start:start + block]
        counts[start:start + block] = rows.astype(np.int64) @ atom_counts
        broken_by_type[start:start + block] = (rows[:, u] != rows[:, v]).astype(np.int64) @ kind
    order = np.concatenate([[0], 1 + np.argsort(masses[1:], kind="stable")])
    return FragmentSet(masses[order], depth[order], broken_by_type[order], counts[order], elements,
                       atoms[order] if keep_atoms else None)


# ----------------------------------------------------------------------------------------------------------
# Charge carriers
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Carrier:
    """How a fragment ion carries its charge: ``m/z = fragment mass + mass_shift`` (single charge).

    Attributes
    ----------
    label : str
        E.g. ``"+H"``, ``"-H"``, ``"+Na"``, ``""`` (the structure's own charge, ``[M]+``).
    mass_shift : float
        Atoms gained minus atoms lost, minus ``charge`` electron masses.
    atoms : dict
        The atoms gained (positive) or lost (negative), for formulas.
    charge : int
        +1 or -1.
    """

    label: str
    mass_shift: float
    atoms: tuple[tuple[str, int], ...]
    charge: int


_PROTON = Carrier("+H", HYDROGEN_MASS - ELECTRON_MASS, (("H", 1),), 1)
_DEPROTON = Carrier("-H", -HYDROGEN_MASS + ELECTRON_MASS, (("H", -1),), -1)
_SINGLE_TERM = re.compile(r"^\[M([+-])([A-Z][A-Za-z0-9]*)?\]([+-])$")


def ion_carriers(adduct: str | Adduct | None, ion_mode: str | None = None) -> list[Carrier]:
    """The charge carriers of singly charged fragment ions of a precursor of type ``adduct``.

    ``+H`` in positive mode and ``-H`` in negative mode always; besides, a precursor that holds its charge on
    one added (or no) group keeps it in fragments: ``[M+Na]+`` -> ``+Na``, ``[M+NH4]+`` -> ``+NH4``,
    ``[M+Cl]-`` -> ``+Cl``, ``[M]+`` -> none. Precursors that lost a neutral (``[M-H2O+H]+``) or hold
    several charges give only the mode's proton carrier. With no adduct, ``ion_mode`` decides.

    Raises
    ------
    InputError
        When neither an adduct nor an ion mode is known, or the adduct is not understood.
    """
    if adduct is None or (isinstance(adduct, str) and not adduct.strip()):
        if ion_mode not in ("positive", "negative"):
            raise InputError("neither the adduct nor the ion mode is known: cannot form fragment ions",
                             field="adduct")
        return [_PROTON if ion_mode == "positive" else _DEPROTON]
    parsed = parse_adduct(adduct)
    default = _PROTON if parsed.charge > 0 else _DEPROTON
    carriers = [default]
    match = _SINGLE_TERM.match(parsed.name) if parsed.multiplier == 1 and abs(parsed.charge) == 1 else None
    if parsed.name in ("[M]+", "[M]-") or (parsed.multiplier == 1 and abs(parsed.charge) == 1
                                           and parsed.name.startswith("[M]")):
        carriers.append(Carrier("", -parsed.charge * ELECTRON_MASS, (), parsed.charge))
    elif match and match.group(1) == "+" and match.group(2):
        try:
            atoms, _ = parse_formula(match.group(2))
        except InputError:
            atoms = None
        if atoms is not None and atoms != {"H": 1}:
            carriers.append(Carrier("+" + match.group(2), parsed.mass_shift, tuple(sorted(atoms.items())),
                                    parsed.charge))
    return carriers


# ----------------------------------------------------------------------------------------------------------
# Storage
# ----------------------------------------------------------------------------------------------------------

def save_fragment_sets(path: str | os.PathLike, fragment_sets: Mapping[str, FragmentSet], max_depth: int) -> Path:
    """Write fragment sets keyed by InChIKey first block to one ``.npz`` of ragged arrays.

    Layout: ``keys`` (n,), ``offsets`` (n + 1,) int64 into the concatenated ``masses`` (float64), ``depth`` and
    ``broken_by_type`` (total, 4) int8, ``counts`` (total, n_elements) int16 over the union ``elements``, and ``meta``
    (a JSON string: format, version, max_depth). Every array is fixed-width, so the file converts to zarr or
    Arrow column by column. Atom masks are not stored.
    """
    keys = list(fragment_sets)
    elements = sorted({el for fs in fragment_sets.values() for el in fs.elements},
                      key=lambda s: (s != "C", s != "H", s))
    column = {el: i for i, el in enumerate(elements)}
    sizes = np.array([fragment_sets[k].n_fragments for k in keys], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    counts = np.zeros((int(offsets[-1]), len(elements)), dtype=np.int16)
    for k, start in zip(keys, offsets[:-1].tolist()):
        fs = fragment_sets[k]
        counts[start:start + fs.n_fragments, [column[el] for el in fs.elements]] = fs.counts

    def cat(name: str, dtype: Any) -> np.ndarray:
        parts = [getattr(fragment_sets[k], name) for k in keys]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    def cat2(name: str) -> np.ndarray:
        parts = [getattr(fragment_sets[k], name) for k in keys]
        return np.concatenate(parts).astype(np.int8) if parts else np.zeros((0, len(BOND_KINDS)), dtype=np.int8)

    meta = {"format": _STORE_FORMAT, "version": _STORE_VERSION, "max_depth": int(max_depth)}
    path = Path(path)
    with open(path, "wb") as handle:
        np.savez_compressed(handle, keys=np.array(keys, dtype=str), offsets=offsets, masses=cat("masses", np.float64),
                            depth=cat("depth", np.int8), broken_by_type=cat2("broken_by_type"), counts=counts,
                            elements=np.array(elements, dtype=str), meta=np.array(json.dumps(meta)))
    return path


def load_fragment_sets(path: str | os.PathLike) -> tuple[dict[str, FragmentSet], int]:
    """Read what :func:`save_fragment_sets` wrote: ``(fragment sets by InChIKey first block, max_depth)``.

    Raises ``InputError`` naming the file when it is not such a file (or a newer version).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("fragment store not found", path=str(path))
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        meta = json.loads(str(arrays["meta"]))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # a truncated npz is a bad zip
        raise InputError(f"not a fragment store ({type(exc).__name__})", path=str(path)) from None
    if meta.get("format") != _STORE_FORMAT or int(meta.get("version", 0)) != _STORE_VERSION:
        raise InputError(f"not a fragment store of version {_STORE_VERSION}", path=str(path))
    offsets = arrays["offsets"]
    elements = tuple(str(e) for e in arrays["elements"])
    out = {}
    for i, key in enumerate(arrays["keys"].tolist()):
        a, b = int(offsets[i]), int(offsets[i + 1])
        counts = arrays["counts"][a:b]
        used = np.flatnonzero(counts.any(axis=0))
        out[key] = FragmentSet(arrays["masses"][a:b], arrays["depth"][a:b], arrays["broken_by_type"][a:b],
                               counts[:, used], tuple(elements[j] for j in used))
    return out, int(meta["max_depth"])


# ----------------------------------------------------------------------------------------------------------
# The scorer
# ----------------------------------------------------------------------------------------------------------

def scored_peaks(spectrum: Spectrum, tolerance_ppm: float, min_tolerance_da: float, mz_power: float,
                 intensity_power: float, min_relative_intensity: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The peaks a fragment score reads: ``(m/z, weight, tolerance)``, each of shape (n_kept,), sorted by m/z.

    Kept: positive intensity, at least ``min_relative_intensity`` of the base peak, m/z at most the precursor's
    plus the tolerance. The weight is ``mz ** mz_power * intensity ** intensity_power`` (not normalised); the
    tolerance ``max(mz * tolerance_ppm * 1e-6, min_tolerance_da, the spectrum's m/z precision)``.

    Raises
    ------
    InputError
        A non-finite m/z or intensity, or a negative intensity (naming the record and field).
    """
    if not isinstance(spectrum, Spectrum):
        raise TypeError(f"expected a Spectrum, got {type(spectrum).__name__}")
    mz, intensity = spectrum.mz, spectrum.intensities
    if not (np.all(np.isfinite(mz)) and np.all(np.isfinite(intensity))) or np.any(intensity < 0):
        raise InputError("peaks must have finite m/z and non-negative intensities", record=spectrum.id,
                         field="peaks")
    floor = max(float(min_tolerance_da), float(spectrum.mz_precision or 0.0))
    tolerance = np.maximum(mz * (tolerance_ppm * 1e-6), floor)
    keep = intensity > 0
    if min_relative_intensity > 0 and keep.any():
        keep &= intensity >= min_relative_intensity * float(intensity.max())
    if spectrum.precursor_mz is not None:
        keep &= mz <= spectrum.precursor_mz + tolerance
    order = np.argsort(mz[keep], kind="stable")
    mz, intensity, tolerance = mz[keep][order], intensity[keep][order], tolerance[keep][order]
    return mz, mz ** float(mz_power) * intensity ** float(intensity_power), tolerance


class FragmentScorer(Component):
    """Scores candidate structures by the spectrum intensity their in-silico fragments explain.

    The defaults are the best settings found on validation (MassBank val_pos against val_formula256, 600
    seeded queries, coordinate ascent on MRR; ``benchmarks/fragments.py --search``).

    Parameters
    ----------
    max_depth : int, default 2
        Cleavages per fragment (a chain bond, or two bonds of one ring).
    max_h_shift : int, default 2
        Hydrogen shifts ``-max_h_shift..max_h_shift`` tried on every fragment ion.
    tolerance_ppm : float, default 20.0
    min_tolerance_da : float, default 0.01
        Floor of the m/z tolerance; the spectrum's reported m/z precision raises it further.
    intensity_power : float, default 1.0
        Peak weight ``mz ** mz_power * intensity ** intensity_power`` (0.5: square root).
    mz_power : float, default 0.5
        Weighs heavier peaks more (their explanations are more specific; MetFrag weighs by m/z too).
    depth_penalty : float, default 0.25
        Multiplies an explanation's weight once per bond broken (MetFrag penalises by bond dissociation
        energy); 1.0 disables it.
    carbon_bond_penalty, aromatic_bond_penalty, multiple_bond_penalty : float, default 0.5, 1.0, 0.25
        Further factors per broken single C-C, aromatic, and double or triple bond (a single bond to a
        heteroatom, the easiest to cleave, has none): a rough bond-energy scale.
    h_shift_penalty : float, default 0.5
        Multiplies an explanation's weight once per hydrogen shifted.
    h_shift_per_bond : bool, default False
        Allow at most one hydrogen shift per broken bond (as MetFrag does; none for the intact structure).
    cache_size : int, default 8192
        Fragment sets kept in memory (least recently used dropped first).

    Attributes
    ----------
    store_ : dict
        Precomputed fragment sets by InChIKey first block (:meth:`load_fragments`), consulted before computing.
    """

    def __init__(self, max_depth: int = 2, max_h_shift: int = 2, tolerance_ppm: float = 20.0,
                 min_tolerance_da: float = 0.01, intensity_power: float = 1.0, mz_power: float = 0.5,
                 depth_penalty: float = 0.25, carbon_bond_penalty: float = 0.5, aromatic_bond_penalty: float = 1.0,
                 multiple_bond_penalty: float = 0.25, h_shift_penalty: float = 0.5, h_shift_per_bond: bool = False,
                 cache_size: int = 8192) -> None:
        self.max_depth = max_depth
        self.max_h_shift = max_h_shift
        self.tolerance_ppm = tolerance_ppm
        self.min_tolerance_da = min_tolerance_da
        self.intensity_power = intensity_power
        self.mz_power = mz_power
        self.depth_penalty = depth_penalty
        self.carbon_bond_penalty = carbon_bond_penalty
        self.aromatic_bond_penalty = aromatic_bond_penalty
        self.multiple_bond_penalty = multiple_bond_penalty
        self.h_shift_penalty = h_shift_penalty
        self.h_shift_per_bond = h_shift_per_bond
        self.cache_size = cache_size

    # -- fragments -----------------------------------------------------------------------------------------
    def _check_params(self) -> None:
        checks = [("max_depth", self.max_depth >= 0), ("max_h_shift", self.max_h_shift >= 0),
                  ("tolerance_ppm", self.tolerance_ppm >= 0), ("min_tolerance_da", self.min_tolerance_da >= 0),
                  ("intensity_power", self.intensity_power >= 0), ("mz_power", self.mz_power >= 0),
                  ("depth_penalty", 0 <= self.depth_penalty <= 1),
                  ("carbon_bond_penalty", 0 <= self.carbon_bond_penalty <= 1),
                  ("aromatic_bond_penalty", 0 <= self.aromatic_bond_penalty <= 1),
                  ("multiple_bond_penalty", 0 <= self.multiple_bond_penalty <= 1),
                  ("h_shift_penalty", 0 <= self.h_shift_penalty <= 1), ("cache_size", self.cache_size >= 0)]
        for name, ok in checks:
            if not ok:
                raise SpecError(f"FragmentScorer: bad {name}={getattr(self, name)!r}")

    def _cache(self) -> OrderedDict:
        cache = getattr(self, "cache_", None)
        if cache is None:
            cache = self.cache_ = OrderedDict()
        return cache

    def fragments(self, molecule: Molecule | str) -> FragmentSet:
        """The fragment set of a structure up to ``max_depth`` (from the store, the cache, or computed now).

        Raises ``InputError`` for a SMILES RDKit cannot parse.
        """
        self._check_params()
        if isinstance(molecule, str):
            molecule = Molecule(molecule)
        cache = self._cache()
        key = molecule.smiles
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        store = getattr(self, "store_", None)
        stored = store.get(molecule.inchikey14) if store else None
        if stored is not None:
            result = stored.up_to_depth(self.max_depth)
        else:  # the atom masks stay with the shared copy: this cache keeps what scoring reads
            shared = recent_fragments(molecule, self.max_depth)
            result = FragmentSet(shared.masses, shared.depth, shared.broken_by_type, shared.counts, shared.elements)
        if self.cache_size:
            cache[key] = result
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return result

    # -- the per-structure cache as arrays (for the on-disk cache, :mod:`molpredict.chem.fragment_cache`) ----------
    def disk_cache_key(self) -> str:
        """The content key of the fragment sets this scorer computes: they depend on ``max_depth`` alone (and on
        :data:`FRAGMENTATION_VERSION`)."""
        from molpredict.chem.fragment_cache import content_key
        return content_key("fragment-sets", {"max_depth": int(self.max_depth),
                                             "fragmentation": FRAGMENTATION_VERSION})

    def in_memory(self, smiles: Iterable[str]) -> set[str]:
        """The structures among ``smiles`` whose fragment sets the memory cache holds (marked recently used)."""
        return held_in_cache(self._cache(), smiles)

    def cached_arrays(self, smiles: Iterable[str]) -> dict[str, dict[str, np.ndarray]]:
        """The fragment sets the memory cache holds among ``smiles``, as arrays: SMILES -> ``masses``, ``depth``,
        ``broken_by_type``, ``counts``, ``elements`` (unicode)."""
        cache = self._cache()
        out = {}
        for s in smiles:
            fs = cache.get(s)
            if fs is not None:
                out[s] = {"masses": fs.masses, "depth": fs.depth, "broken_by_type": fs.broken_by_type,
                          "counts": fs.counts, "elements": np.array(fs.elements, dtype=str)}
        return out

    def remember_arrays(self, entries: Mapping[str, Mapping[str, np.ndarray]]) -> set[str]:
        """Put fragment sets given as :meth:`cached_arrays` writes them into the memory cache; returns the SMILES
        taken (none without a memory cache; an entry without the right arrays is not taken)."""
        if not self.cache_size:
            return set()
        cache = self._cache()
        taken = set()
        for s, a in entries.items():
            try:
                masses, depth = np.asarray(a["masses"]), np.asarray(a["depth"])
                broken, counts = np.asarray(a["broken_by_type"]), np.asarray(a["counts"])
                elements = tuple(str(e) for e in np.asarray(a["elements"]).ravel())
            except (KeyError, TypeError, ValueError):
                continue
            n = masses.shape[0] if masses.ndim == 1 else -1
            if (n < 0 or depth.shape != (n,) or broken.shape != (n, len(BOND_KINDS))
                    or counts.shape != (n, len(elements))):
                continue
            cache[s] = FragmentSet(masses, depth, broken, counts, elements)
            taken.add(s)
        while len(cache) > self.cache_size:
            cache.popitem(last=False)
        return taken

    def save_fragments(self, path: str | os.PathLike, molecules: Iterable[Molecule | str]) -> Path:
        """Fragment every structure (once per InChIKey first block) and write them with
        :func:`save_fragment_sets`, so that a library is fragmented once."""
        sets: dict[str, FragmentSet] = {}
        for molecule in molecules:
            molecule = Molecule(molecule) if isinstance(molecule, str) else molecule
            if molecule.inchikey14 not in sets:
                sets[molecule.inchikey14] = self.fragments(molecule)
        return save_fragment_sets(path, sets, self.max_depth)

    def load_fragments(self, path: str | os.PathLike) -> FragmentScorer:
        """Use the fragment sets stored at ``path`` (made with at least this ``max_depth``) before computing."""
        sets, depth = load_fragment_sets(path)
        if depth < self.max_depth:
            raise InputError(f"fragment store holds depth <= {depth}, this scorer needs {self.max_depth}",
                             path=str(path))
        store = getattr(self, "store_", None) or {}
        store.update(sets)
        self.store_ = store
        return self

    def fragment_weights(self, fragments: FragmentSet) -> np.ndarray:
        """Weight of each fragment's explanations before hydrogen shifts: the product over its broken bonds of
        ``depth_penalty`` times the bond kind's factor. ndarray of shape (n_fragments,)."""
        return self._broken_bond_weights(fragments.broken_by_type)

    def _broken_bond_weights(self, broken_by_type: np.ndarray) -> np.ndarray:
        """:meth:`fragment_weights` of the rows of a ``broken_by_type`` array (n, 4), shape (n,)."""
        per_kind = float(self.depth_penalty) * np.array(
            [1.0, self.carbon_bond_penalty, self.aromatic_bond_penalty, self.multiple_bond_penalty], dtype=float)
        counts = np.asarray(broken_by_type, dtype=np.intp)
        if counts.size == 0:
            return np.ones(counts.shape[0])
        # the counts are a few small integers: a table of powers, looked up, instead of a float power per entry
        powers = per_kind[:, None] ** np.arange(int(counts.max()) + 1, dtype=np.float64)[None, :]  # (4, max + 1)
        weight = powers[0, counts[:, 0]]
        for kind in range(1, counts.shape[1]):
            weight = weight * powers[kind, counts[:, kind]]
        return weight

    # -- ions and peaks ------------------------------------------------------------------------------------
    def _shifts(self, carriers: Sequence[Carrier]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(mass shifts, weights, h shift, carrier index) of every (carrier, hydrogen shift) combination."""
        h = np.arange(-self.max_h_shift, self.max_h_shift + 1)
        shifts = np.array([c.mass_shift for c in carriers])[:, None] + h[None, :] * HYDROGEN_MASS
        weights = np.broadcast_to(float(self.h_shift_penalty) ** np.abs(h), shifts.shape)
        carrier_index = np.broadcast_to(np.arange(len(carriers))[:, None], shifts.shape)
        return (shifts.ravel(), weights.ravel(), np.broadcast_to(h, shifts.shape).ravel(), carrier_index.ravel())

    def _peaks(self, spectrum: Spectrum) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(m/z, intensity weight, tolerance) of the peaks scored, sorted by m/z."""
        return scored_peaks(spectrum, self.tolerance_ppm, self.min_tolerance_da, self.mz_power, self.intensity_power)

    def _carriers(self, spectrum: Spectrum, adduct: str | Adduct | None) -> list[Carrier]:
        if not isinstance(spectrum, Spectrum):
            raise TypeError(f"expected a Spectrum, got {type(spectrum).__name__}")
        try:
            return ion_carriers(adduct if adduct is not None else spectrum.adduct, spectrum.ion_mode)
        except InputError as exc:
            raise InputError(exc.message, record=spectrum.id, field="adduct") from None

    def _peak_weights(self, spectrum: Spectrum, fragment_sets: Sequence[FragmentSet], carriers: Sequence[Carrier]
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Best explanation weight of every (candidate, peak), shape (n_candidates, n_peaks), and the peaks'
        intensity weights (n_peaks,)."""
        mz, peak_weight, tolerance = self._peaks(spectrum)
        n_cand, n_peaks = len(fragment_sets), mz.shape[0]
        sizes = np.array([fs.n_fragments for fs in fragment_sets], dtype=np.int64)
        if n_cand == 0 or n_peaks == 0 or not sizes.any():  # an empty set (not fragmented) explains nothing
            return np.zeros((n_cand, n_peaks)), peak_weight
        shifts, shift_weight, h_of, _ = self._shifts(carriers)
        # All candidates' (mass-sorted) fragments in one array, candidate c offset by c * spacing so that one
        # searchsorted finds every (candidate, shift, peak) window at once.
        masses = np.concatenate([fs.masses for fs in fragment_sets])
        broken = np.concatenate([fs.broken_by_type for fs in fragment_sets])  # one pass over every candidate's rows
        bonds = broken.sum(axis=1, dtype=np.int64)
        base_weight = self._broken_bond_weights(broken)
        spacing = 2.0 * (max(float(masses.max()), float(mz.max())) + float(np.abs(shifts).max())
                         + float(tolerance.max())) + 1.0
        owner = np.repeat(np.arange(n_cand), sizes)
        keys = masses + owner * spacing
        # The intact structure sits first in each block, out of mass order: sort once (cheap, nearly sorted).
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        bonds = bonds[order]
        base_weight = base_weight[order]
        target = mz[None, :] - shifts[:, None]                                    # (n_shifts, n_peaks)
        base = (np.arange(n_cand) * spacing)[:, None, None]
        lo = np.searchsorted(keys, (base + target - tolerance), side="left")    # (n_cand, n_shifts, n_peaks)
        hi = np.searchsorted(keys, (base + target + tolerance), side="right")
        window_max = np.zeros(lo.shape)
        h_size = np.abs(h_of)
        for size in np.unique(h_size):
            # Max fragment weight over each window [lo, hi): reduceat over interleaved bounds (the appended 0 is
            # the sentinel for windows ending at the array's end; empty windows are masked out). A shift of
            # |h| hydrogens needs |h| broken bonds when ``h_shift_per_bond``.
            weight = base_weight
            if self.h_shift_per_bond:
                weight = np.where(bonds >= size, weight, 0.0)
            weight = np.append(weight, 0.0)
            sel = h_size == size
            group_lo, group_hi = lo[:, sel, :].ravel(), hi[:, sel, :].ravel()
            bounds = np.empty(2 * group_lo.shape[0], dtype=np.intp)
            bounds[0::2] = group_lo
            bounds[1::2] = group_hi
            group = np.maximum.reduceat(weight, bounds)[0::2]
            window_max[:, sel, :] = np.where(group_hi > group_lo, group, 0.0).reshape(n_cand, -1, n_peaks)
        return (window_max * shift_weight[None, :, None]).max(axis=1), peak_weight

    def score(self, spectrum: Spectrum, molecules: Sequence[Molecule | str], adduct: str | Adduct | None = None
              ) -> np.ndarray:
        """Fraction of the spectrum's (transformed) intensity each candidate's fragments explain.

        Parameters
        ----------
        spectrum : Spectrum
        molecules : sequence of Molecule or SMILES, length n_candidates
        adduct : str or Adduct, optional
            The precursor type; the spectrum's ``adduct`` (else its ion mode) when None.

        Returns
        -------
        ndarray of shape (n_candidates,), float64, in [0, 1]
            0 for every candidate when no peak is scored, and for a structure too large to fragment
            (:data:`MAX_FRAGMENT_ATOMS`).
        """
        self._check_params()
        carriers = self._carriers(spectrum, adduct)
        fragment_sets = [self.fragments(m) for m in molecules]
        weights, peak_weight = self._peak_weights(spectrum, fragment_sets, carriers)
        total = float(peak_weight.sum())
        if total <= 0:
            return np.zeros(len(fragment_sets))
        return weights @ peak_weight / total

    def explain_peaks(self, spectrum: Spectrum, molecule: Molecule | str, adduct: str | Adduct | None = None
                      ) -> list[dict[str, Any]]:
        """The peaks a structure explains, with the fragment that explains each best (for reports).

        Parameters
        ----------
        spectrum : Spectrum
        molecule : Molecule or SMILES
        adduct : str or Adduct, optional
            As in :meth:`score`.

        Returns
        -------
        list of dict, by increasing m/z, one per explained peak:
            ``mz`` (float), ``intensity`` (float, as in the spectrum), ``formula`` (the ion's formula with its
            charge, e.g. ``"C7H7O+"``), ``fragment_formula`` (the neutral substructure as cut), ``smiles`` (the
            substructure's SMILES), ``bonds_broken`` (int), ``depth`` (int), ``h_shift`` (int), ``carrier``
            (e.g. ``"+H"``), ``ion_mz`` (float, the fragment ion's m/z), ``error_ppm`` (float, ``(mz - ion_mz) /
            ion_mz * 1e6``), ``weight`` (float: the explanation's weight in the score). Empty for a structure
            too large to fragment (:data:`MAX_FRAGMENT_ATOMS`).
        """
        self._check_params()
        molecule = Molecule(molecule) if isinstance(molecule, str) else molecule
        carriers = self._carriers(spectrum, adduct)
        fragments = fragment_structure(molecule, self.max_depth, keep_atoms=True)
        mol = molecule.rdkit_mol
        if any(a.GetAtomicNum() == 1 for a in mol.GetAtoms()):
            mol = Chem.RemoveHs(mol, sanitize=False)
        mz, _, tolerance = self._peaks(spectrum)
        shifts, shift_weight, h_of, carrier_of = self._shifts(carriers)
        ion_mz = fragments.masses[:, None] + shifts[None, :]                      # (n_fragments, n_shifts)
        bonds = fragments.bonds_broken[:, None]
        weight = self.fragment_weights(fragments)[:, None] * shift_weight[None, :]
        if self.h_shift_per_bond:
            weight = np.where(bonds >= np.abs(h_of)[None, :], weight, 0.0)
        intensity_of = dict(zip(spectrum.mz.tolist(), spectrum.intensities.tolist()))
        out = []
        for peak_mz, tol in zip(mz.tolist(), tolerance.tolist()):
            error = ion_mz - peak_mz
            match = (np.abs(error) <= tol) & (weight > 0)
            if not match.any():
                continue
            # Best weight first, then the smallest mass error.
            candidates = np.argwhere(match)
            score = np.array([(-weight[f, s], abs(error[f, s])) for f, s in candidates],
                             dtype=[("w", float), ("e", float)])
            f, s = candidates[np.argsort(score, order=("w", "e"))[0]]
            carrier = carriers[int(carrier_of[s])]
            h = int(h_of[s])
            extra: dict[str, int] = {"H": h}
            for el, n in carrier.atoms:
                extra[el] = extra.get(el, 0) + n
            atoms = np.flatnonzero(fragments.atoms[f]).tolist()
            out.append({
                "mz": float(peak_mz),
                "intensity": float(intensity_of.get(peak_mz, 0.0)),
                "formula": fragments.formula(int(f), extra) + ("+" if carrier.charge > 0 else "-"),
                "fragment_formula": fragments.formula(int(f)),
                "smiles": Chem.MolFragmentToSmiles(mol, atoms, canonical=True),
                "bonds_broken": int(fragments.bonds_broken[f]),
                "depth": int(fragments.depth[f]),
                "h_shift": h,
                "carrier": carrier.label,
                "ion_mz": float(ion_mz[f, s]),
                "error_ppm": float(-error[f, s] / ion_mz[f, s] * 1e6),
                "weight": float(weight[f, s]),
            })
        return out
