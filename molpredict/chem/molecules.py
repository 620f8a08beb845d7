"""Molecules: the ``Molecule`` record (RDKit parsing, InChIKey, formula, mass), cached fingerprints and graphs,
and the adduct table converting precursor m/z to neutral mass."""
from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from rdkit import Chem, RDLogger
from rdkit.Chem import Descriptors, MACCSkeys, rdMolDescriptors
from rdkit.Chem import rdFingerprintGenerator

from molpredict.errors import InputError, SpecError

__all__ = [
    "Molecule",
    "n_workers",
    "label_structure",
    "spectrum_structure_key",
    "fingerprint_matrix",
    "to_grakel_graph",
    "Adduct",
    "ADDUCTS",
    "DEFAULT_ADDUCTS",
    "parse_adduct",
    "adduct_composition",
    "neutral_mass",
    "precursor_mz",
    "formula_mass",
    "parse_formula",
    "normalize_formula",
    "molecular_formula",
    "ELECTRON_MASS",
    "PROTON_MASS",
    "FINGERPRINT_KINDS",
]

# RDKit writes parse failures and InChI warnings to stderr; we report failures ourselves, in one line.
RDLogger.DisableLog("rdApp.*")

#: Electron rest mass in Da (CODATA 2018).
ELECTRON_MASS = 0.000548579909065
_PERIODIC_TABLE = Chem.GetPeriodicTable()
#: Proton mass as RDKit's hydrogen mass minus the electron (consistent with ``Descriptors.ExactMolWt``).
PROTON_MASS = _PERIODIC_TABLE.GetMostCommonIsotopeMass("H") - ELECTRON_MASS

#: Fingerprint kinds understood by :meth:`Molecule.fingerprint` and :func:`fingerprint_matrix`.
FINGERPRINT_KINDS = ("morgan", "maccs", "rdkit")
_MACCS_SIZE = 167


# ----------------------------------------------------------------------------------------------------------
# Molecule
# ----------------------------------------------------------------------------------------------------------

class Molecule:
    """A molecular structure, built from SMILES or InChI, with lazily computed and cached representations.

    Use :meth:`from_smiles` / :meth:`from_inchi`; they raise :class:`molpredict.errors.InputError` on a
    structure RDKit cannot parse.

    The constructor itself is cheap and never parses: ``Molecule(smiles, inchikey=..., formula=...,
    monoisotopic_mass=...)`` is how candidate libraries (millions of rows) hand out records. Any attribute not
    given is computed from the SMILES on first access, and ``rdkit_mol`` is parsed only when a representation
    needs it. A SMILES given to the constructor is kept as given (libraries store RDKit canonical SMILES).
    ``inchikey14`` alone may be given (candidate sets list only the first block): hits then need no InChI
    computation, while ``inchikey`` (and so equality) is still computed on demand.

    Attributes
    ----------
    smiles : str
        RDKit canonical SMILES (isomeric).
    inchikey : str
        Full InChIKey; ``inchikey14`` is its first block (the 2D skeleton), the identity used for hits.
    formula : str
        Molecular formula as RDKit's CalcMolFormula writes it (C, H, then alphabetical; a net charge as a suffix
        such as ``+``); :func:`normalize_formula` brings any formula string to this form. Isotopes given in the
        structure are written apart (:func:`molecular_formula`: ``C15[13C]H13ClN2O``, ``C16H10[2H]3ClN2O``), so a
        labelled standard never carries its unlabelled parent's formula.
    monoisotopic_mass : float
        As RDKit's ``ExactMolWt`` (for a charged structure the electrons' mass is accounted).
    name, id, source : str or None
        Optional labels carried through to outputs.

    Notes
    -----
    Equality and hashing use the full InChIKey.
    """

    __slots__ = ("smiles", "name", "id", "source", "_inchikey", "_inchikey14", "_formula", "_mass", "_mol",
                 "_fps", "_graphs")

    def __init__(self, smiles: str, *, inchikey: str | None = None, formula: str | None = None,
                 monoisotopic_mass: float | None = None, name: str | None = None, id: str | None = None,
                 source: str | None = None, rdkit_mol: Chem.Mol | None = None,
                 inchikey14: str | None = None) -> None:
        self.smiles = smiles
        self.name = name
        self.id = id
        self.source = source
        self._inchikey = inchikey or None
        self._inchikey14 = inchikey14 or None
        self._formula = formula or None
        self._mass = None if monoisotopic_mass is None else float(monoisotopic_mass)
        self._mol = rdkit_mol
        self._fps: dict[tuple, np.ndarray] | None = None
        self._graphs: dict[bool, tuple] | None = None

    # -- constructors --------------------------------------------------------------------------------------
    @classmethod
    def from_rdkit(cls, mol: Chem.Mol, *, name: str | None = None, id: str | None = None,
                   source: str | None = None) -> Molecule:
        """Build from an RDKit ``Mol`` (computes every attribute now)."""
        smiles = Chem.MolToSmiles(mol)
        inchikey = Chem.MolToInchiKey(mol) or None
        return cls(smiles, inchikey=inchikey, formula=molecular_formula(mol),
                   monoisotopic_mass=Descriptors.ExactMolWt(mol), name=name, id=id, source=source,
                   rdkit_mol=mol)

    @classmethod
    def from_smiles(cls, smiles: str, *, name: str | None = None, id: str | None = None,
                    source: str | None = None) -> Molecule:
        """Parse a SMILES string; raises ``InputError`` (field ``smiles``) when RDKit cannot."""
        mol = _parse_smiles(smiles)
        if mol is None:
            raise InputError(f"RDKit cannot parse SMILES {_shorten(smiles)!r}", record=id, field="smiles")
        return cls.from_rdkit(mol, name=name, id=id, source=source)

    @classmethod
    def from_inchi(cls, inchi: str, *, name: str | None = None, id: str | None = None,
                   source: str | None = None) -> Molecule:
        """Parse an InChI string; raises ``InputError`` (field ``inchi``) when RDKit cannot."""
        mol = None
        if isinstance(inchi, str) and inchi.strip():
            mol = Chem.MolFromInchi(inchi.strip())
        if mol is None:
            raise InputError(f"RDKit cannot parse InChI {_shorten(inchi)!r}", record=id, field="inchi")
        return cls.from_rdkit(mol, name=name, id=id, source=source)

    # -- lazily computed identity --------------------------------------------------------------------------
    @property
    def rdkit_mol(self) -> Chem.Mol:
        """The RDKit ``Mol`` (parsed once, then cached); ``InputError`` when the SMILES is unparsable."""
        if self._mol is None:
            mol = _parse_smiles(self.smiles)
            if mol is None:
                raise InputError(f"RDKit cannot parse SMILES {_shorten(self.smiles)!r}", record=self.id,
                                 field="smiles")
            self._mol = mol
        return self._mol

    @property
    def inchikey(self) -> str:
        if self._inchikey is None:
            self._inchikey = Chem.MolToInchiKey(self.rdkit_mol) or ""
        return self._inchikey

    @property
    def inchikey14(self) -> str:
        if self._inchikey14 is None:
            self._inchikey14 = self.inchikey.split("-", 1)[0]
        return self._inchikey14

    @property
    def formula(self) -> str:
        if self._formula is None:
            self._formula = molecular_formula(self.rdkit_mol)
        return self._formula

    @property
    def monoisotopic_mass(self) -> float:
        if self._mass is None:
            self._mass = float(Descriptors.ExactMolWt(self.rdkit_mol))
        return self._mass

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Molecule):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> str:
        # InChI fails on a few exotic structures (empty key): fall back to the SMILES so they stay distinct.
        return self.inchikey or f"smiles:{self.smiles}"

    def __repr__(self) -> str:
        label = f", name={self.name!r}" if self.name else ""
        return f"Molecule({self.smiles!r}{label})"

    def __getstate__(self) -> dict[str, Any]:
        # RDKit Mols pickle, but slowly and large: ship the text, re-parse on demand.
        return {"smiles": self.smiles, "name": self.name, "id": self.id, "source": self.source,
                "_inchikey": self._inchikey, "_inchikey14": self._inchikey14, "_formula": self._formula,
                "_mass": self._mass}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in self.__slots__:
            setattr(self, key, None)
        for key, value in state.items():
            setattr(self, key, value)

    # -- representations -----------------------------------------------------------------------------------
    def fingerprint(self, kind: str = "morgan", radius: int = 2, size: int = 2048,
                    counts: bool = False, chiral: bool = False) -> np.ndarray:
        """A molecular fingerprint, cached per settings on this object.

        Parameters
        ----------
        kind : {"morgan", "maccs", "rdkit"}
            Morgan (ECFP-like, ``radius``), MACCS keys (167 bits; ``radius`` and ``size`` ignored) or RDKit's
            topological path fingerprint.
        radius : int
            Morgan radius.
        size : int
            Number of bits (folded length).
        counts : bool
            Count fingerprint instead of bits (morgan and rdkit only).
        chiral : bool
            Morgan only: atom environments include tetrahedral chirality (RDKit's ``includeChirality``), so
            that stereoisomers get different fingerprints.

        Returns
        -------
        ndarray of shape (size,) (167 for maccs)
            uint8 0/1 bits, or float32 counts. Read-only (it is the cached array).
        """
        key = _fp_key(kind, radius, size, counts, chiral)
        fp = self._fps.get(key) if self._fps else None
        return fp if fp is not None else self._keep_fingerprint(key, _fingerprint_of_mol(self.rdkit_mol, *key))

    def _keep_fingerprint(self, key: tuple, fp: np.ndarray) -> np.ndarray:
        """Cache ``fp`` (owned by this record from now on, made read-only) as the fingerprint for ``key``."""
        fp.flags.writeable = False
        if self._fps is None:
            self._fps = {}
        self._fps[key] = fp
        return fp

    def graph(self, bond_labels: bool = True) -> tuple[dict[int, dict[int, float]], dict[int, str],
                                                       dict[tuple[int, int], str] | None]:
        """The hydrogen-suppressed molecular graph in GraKeL's list form ``[edges, node_labels, edge_labels]``.

        Returns
        -------
        edges : dict[int, dict[int, float]]
            Symmetric adjacency: ``edges[i][j] == 1.0`` for every bond i-j (both directions). Every atom is a
            key, so an isolated atom (e.g. methane, ``C``) gives ``{0: {}}``.
        node_labels : dict[int, str]
            Atom index -> element symbol (``"C"``, ``"N"``...), atoms numbered as in ``rdkit_mol``.
        edge_labels : dict[tuple[int, int], str] or None
            ``(i, j)`` and ``(j, i)`` -> RDKit bond type name (``"SINGLE"``, ``"DOUBLE"``, ``"TRIPLE"``,
            ``"AROMATIC"``...); None when ``bond_labels`` is False. A molecule without bonds has ``{}`` (GraKeL
            kernels that need edge labels, e.g. NSPD, cannot use such a graph).

        The tuple can be passed to GraKeL kernels as one input item (``[*mol.graph()]``) or turned into a
        ``grakel.Graph`` with :func:`to_grakel_graph`. Cached per ``bond_labels``; do not mutate.
        """
        if self._graphs is None:
            self._graphs = {}
        graph = self._graphs.get(bond_labels)
        if graph is None:
            graph = _graph_of_mol(self.rdkit_mol, bond_labels)
            self._graphs[bond_labels] = graph
        return graph


def label_structure(cache: dict[str, Any], smiles: str | None, inchi: str | None = None,
                    unparsed: str = "structure not parsed by RDKit") -> "Molecule | str":
    """The labelled structure of a training record (from its SMILES, else its InChI), parsed once per text:
    many records share a structure. A string instead says why the record is unusable (``unparsed``, or no
    InChIKey); ``cache`` maps the text to either."""
    key = smiles or inchi or ""
    molecule = cache.get(key)
    if molecule is None:
        try:
            molecule = Molecule.from_smiles(smiles) if smiles else Molecule.from_inchi(inchi)
            if not molecule.inchikey:
                molecule = "structure without InChIKey"
        except InputError:
            molecule = unparsed
        cache[key] = molecule
    return molecule


def spectrum_structure_key(spectrum: Any, parsed: dict[str, str | None] | None = None) -> str | None:
    """The identity of a labelled spectrum's true structure: its InChIKey's first block, else its SMILES parsed
    by RDKit to one (so that one structure written as two SMILES is one key); None without a usable structure.

    Parameters
    ----------
    spectrum : object with ``inchikey`` and ``smiles`` attributes (str or None)
    parsed : dict, optional
        Memo of SMILES -> key (or None): spectra of one structure share their SMILES, parsed once.
    """
    inchikey = getattr(spectrum, "inchikey", None)
    if isinstance(inchikey, str) and inchikey.split("-", 1)[0]:
        return inchikey.split("-", 1)[0]
    smiles = getattr(spectrum, "smiles", None)
    if not isinstance(smiles, str) or not smiles.strip():
        return None
    parsed = {} if parsed is None else parsed
    if smiles not in parsed:
        try:
            parsed[smiles] = Molecule.from_smiles(smiles).inchikey14 or None
        except InputError:
            parsed[smiles] = None
    return parsed[smiles]


def _shorten(text: Any, limit: int = 80) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_smiles(smiles: Any) -> Chem.Mol | None:
    if not isinstance(smiles, str) or not smiles.strip():
        return None
    return Chem.MolFromSmiles(smiles.strip())


def _graph_of_mol(mol: Chem.Mol, bond_labels: bool) -> tuple:
    edges: dict[int, dict[int, float]] = {atom.GetIdx(): {} for atom in mol.GetAtoms()}
    node_labels = {atom.GetIdx(): atom.GetSymbol() for atom in mol.GetAtoms()}
    edge_labels: dict[tuple[int, int], str] | None = {} if bond_labels else None
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        edges[i][j] = 1.0
        edges[j][i] = 1.0
        if edge_labels is not None:
            label = str(bond.GetBondType())
            edge_labels[(i, j)] = label
            edge_labels[(j, i)] = label
    return edges, node_labels, edge_labels


def to_grakel_graph(mol: Molecule, bond_labels: bool = True):
    """The molecule's graph (see :meth:`Molecule.graph`) as a ``grakel.Graph``."""
    from grakel import Graph

    edges, node_labels, edge_labels = mol.graph(bond_labels=bond_labels)
    return Graph(edges, node_labels=node_labels, edge_labels=edge_labels)


# ----------------------------------------------------------------------------------------------------------
# Fingerprints
# ----------------------------------------------------------------------------------------------------------

def _fp_key(kind: str, radius: int, size: int, counts: bool, chiral: bool = False) -> tuple:
    """Normalised settings ``(kind, radius, size, counts, chiral)``, the cache key; raises ``SpecError`` on
    settings no fingerprint has."""
    kind = str(kind).lower()
    if kind not in FINGERPRINT_KINDS:
        raise SpecError(f"unknown fingerprint kind {kind!r} (known: {', '.join(FINGERPRINT_KINDS)})")
    counts, chiral = bool(counts), bool(chiral)
    if chiral and kind != "morgan":
        raise SpecError(f"chiral=true applies to Morgan fingerprints only, not {kind}")
    if kind == "maccs":
        if counts:
            raise SpecError("MACCS keys have no count version: use counts=false with fingerprint maccs")
        return ("maccs", 0, _MACCS_SIZE, False, False)
    size = int(size)
    if size < 1:
        raise SpecError(f"fingerprint size must be positive, got {size}")
    radius = int(radius) if kind == "morgan" else 0
    if kind == "morgan" and radius < 0:
        raise SpecError(f"Morgan radius must be >= 0, got {radius}")
    return (kind, radius, size, counts, chiral)


@lru_cache(maxsize=32)
def _generator(kind: str, radius: int, size: int, chiral: bool):
    # Generators are costly to build and not picklable: one per process and setting.
    if kind == "morgan":
        return rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=size, includeChirality=chiral)
    return rdFingerprintGenerator.GetRDKitFPGenerator(fpSize=size)


def _fingerprint_of_mol(mol: Chem.Mol, kind: str, radius: int, size: int, counts: bool,
                        chiral: bool) -> np.ndarray:
    if kind == "maccs":
        bits = MACCSkeys.GenMACCSKeys(mol)
        return np.frombuffer(bits.ToBitString().encode("ascii"), dtype=np.uint8) - np.uint8(48)
    generator = _generator(kind, radius, size, chiral)
    if counts:
        return generator.GetCountFingerprintAsNumPy(mol).astype(np.float32)
    return generator.GetFingerprintAsNumPy(mol).astype(np.uint8, copy=False)


def _fingerprint_rows(smiles: Sequence[str], key: tuple) -> tuple[np.ndarray, list[int]]:
    """Fingerprints of SMILES strings: (matrix, indices of the unparsable ones). Runs in worker processes."""
    dtype = np.float32 if key[3] else np.uint8
    out = np.zeros((len(smiles), key[2]), dtype=dtype)
    bad = []
    for i, s in enumerate(smiles):
        mol = _parse_smiles(s)
        if mol is None:
            bad.append(i)
        else:
            out[i] = _fingerprint_of_mol(mol, *key)
    return out, bad


def n_workers(n_jobs: int | None) -> int:
    """Processes for ``n_jobs`` (joblib's convention: ``-1`` every core this process may run on, ``-2`` all but
    one; None or 0: one), at most the cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    if n_jobs is None or n_jobs == 0:
        return 1
    return max(1, cores + 1 + n_jobs) if n_jobs < 0 else min(int(n_jobs), cores)


#: the record sets :func:`remembered_fingerprints` keeps fingerprints on (ids of the records), innermost last
_REMEMBERED: list[set[int]] = []


@contextmanager
def remembered_fingerprints(molecules: Iterable[Any]) -> Iterator[None]:
    """Within the block, :func:`fingerprint_matrix` keeps the fingerprints it computes for these records on them
    (as :meth:`Molecule.fingerprint` does); on exit they are dropped again.

    For one large transient set that several kernels featurise with the same settings (training's validation
    candidates: the model's output kernel, the prior's scores and its reference test), so that each structure
    is parsed and fingerprinted once. Costs ``size`` bytes per record and setting while the block runs.
    """
    records = [m for m in molecules if isinstance(m, Molecule)]
    fresh = [m for m in records if m._fps is None]
    ids = {id(m) for m in records}
    _REMEMBERED.append(ids)
    try:
        yield
    finally:
        _REMEMBERED.remove(ids)
        for m in fresh:
            m._fps = None


def _remember(molecule: Any, key: tuple, row: np.ndarray) -> None:
    """Keep ``row`` as ``molecule``'s fingerprint for ``key`` when a :func:`remembered_fingerprints` block
    names it."""
    if isinstance(molecule, Molecule) and any(id(molecule) in ids for ids in _REMEMBERED):
        molecule._keep_fingerprint(key, np.array(row))  # a copy: the caller owns the matrix


def fingerprint_matrix(molecules: Iterable[Molecule | str], kind: str = "morgan", radius: int = 2,
                       size: int = 2048, counts: bool = False, n_jobs: int = 1,
                       chunk_size: int = 2000, chiral: bool = False) -> np.ndarray:
    """Fingerprints of many molecules, one row each (the batch version of :meth:`Molecule.fingerprint`).

    Parameters
    ----------
    molecules : iterable of Molecule or str
        Records or SMILES strings. A record's cached fingerprint or parsed ``rdkit_mol`` is reused; nothing is
        cached on the records (batches can be millions of transient candidates).
    kind, radius, size, counts, chiral
        As in :meth:`Molecule.fingerprint`.
    n_jobs : int
        Worker processes (SMILES strings are shipped to them); ``-1`` uses all cores, ``1`` runs inline.
    chunk_size : int
        SMILES per worker task.

    Returns
    -------
    ndarray of shape (n_molecules, size)
        uint8 bits or float32 counts. An unparsable molecule gives an all-zero row; their number is reported
        with a ``RuntimeWarning``, never an exception.
    """
    key = _fp_key(kind, radius, size, counts, chiral)
    molecules = list(molecules)
    n = len(molecules)
    out = np.zeros((n, key[2]), dtype=np.float32 if key[3] else np.uint8)
    todo_index: list[int] = []
    todo_smiles: list[str] = []
    n_bad = 0
    for i, m in enumerate(molecules):
        if isinstance(m, Molecule):
            cached = m._fps.get(key) if m._fps else None
            if cached is not None:
                out[i] = cached
                continue
            if m._mol is not None:
                out[i] = _fingerprint_of_mol(m._mol, *key)
                if _REMEMBERED:
                    _remember(m, key, out[i])
                continue
            todo_index.append(i)
            todo_smiles.append(m.smiles)
        else:
            todo_index.append(i)
            todo_smiles.append(m)
    workers = n_workers(n_jobs)
    if todo_smiles:
        chunks = [todo_smiles[s:s + chunk_size] for s in range(0, len(todo_smiles), chunk_size)]
        if workers > 1 and len(chunks) > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=min(workers, len(chunks))) as pool:
                results = list(pool.map(_fingerprint_rows, chunks, [key] * len(chunks)))
        else:
            results = [_fingerprint_rows(chunk, key) for chunk in chunks]
        index = np.asarray(todo_index, dtype=np.int64)
        start = 0
        for rows, bad in results:
            out[index[start:start + len(rows)]] = rows
            n_bad += len(bad)
            start += len(rows)
        if _REMEMBERED:
            for i in todo_index:
                _remember(molecules[i], key, out[i])
    if n_bad:
        warnings.warn(f"fingerprint_matrix: {n_bad} of {n} molecules could not be parsed by RDKit; "
                      "their rows are all zero", RuntimeWarning, stacklevel=2)
    return out


# ----------------------------------------------------------------------------------------------------------
# Formulas
# ----------------------------------------------------------------------------------------------------------

def molecular_formula(mol: Chem.Mol) -> str:
    """The molecular formula of an RDKit ``Mol`` as RDKit's ``CalcMolFormula`` writes it, isotopes given in the
    structure written apart in brackets (``[13CH3]...`` gives ``C15[13C]H13ClN2O``, ``[2H]`` gives ``[2H]3``, not
    ``D3``).

    Without them a labelled standard (diazepam-13C, 285.075 Da) would be filed under its parent's formula and be
    ranked for the parent's spectrum by formula; written apart, it matches no query formula (:func:`parse_formula`
    refuses the brackets) and is reached only by its own mass."""
    return rdMolDescriptors.CalcMolFormula(mol, True, False)  # separateIsotopes, abbreviateHIsotopes off


_FORMULA_TOKEN = re.compile(r"([A-Z][a-z]?)(\d*)")
# Charges as RDKit writes them ("+", "-", "+2") or repeated signs ("++"); "2+" is not accepted because
# "C2H3O2-" would be ambiguous.
_CHARGE_SUFFIX = re.compile(r"(?:([+-])(\d+)|([+-]+))$")


@lru_cache(maxsize=None)
def _element_mass(symbol: str) -> float | None:
    try:
        number = _PERIODIC_TABLE.GetAtomicNumber(symbol)
    except (RuntimeError, ValueError):
        return None
    if number <= 0 or _PERIODIC_TABLE.GetElementSymbol(number) != symbol:
        return None
    return float(_PERIODIC_TABLE.GetMostCommonIsotopeMass(symbol))


def parse_formula(text: str) -> tuple[dict[str, int], int]:
    """Element counts and net charge of a formula such as ``"C8H10N4O2"``, ``"OH2"`` or ``"C4H12N+"``.

    Elements may repeat (``"CH3COOH"``); a trailing ``+``, ``-2`` (RDKit's form) or ``--`` gives the charge. Raises
    ``InputError`` (field ``formula``) on anything else.
    """
    if not isinstance(text, str):
        raise InputError(f"not a formula: {text!r}", field="formula")
    body = text.strip()
    charge = 0
    match = _CHARGE_SUFFIX.search(body)
    if match:
        if match.group(1):
            charge = int(match.group(2)) * (1 if match.group(1) == "+" else -1)
        else:
            signs = match.group(3)
            if set(signs) != {signs[0]}:
                raise InputError(f"bad charge in formula {text!r}", field="formula")
            charge = len(signs) * (1 if signs[0] == "+" else -1)
        body = body[:match.start()]
    counts: dict[str, int] = {}
    pos = 0
    for token in _FORMULA_TOKEN.finditer(body):
        if token.start() != pos:
            break
        symbol, number = token.group(1), token.group(2)
        if _element_mass(symbol) is None:
            raise InputError(f"unknown element {symbol!r} in formula {text!r}", field="formula")
        counts[symbol] = counts.get(symbol, 0) + (int(number) if number else 1)
        pos = token.end()
    if pos != len(body) or not body:
        raise InputError(f"cannot parse formula {text!r}", field="formula")
    return {k: v for k, v in counts.items() if v != 0}, charge


def formula_mass(formula: str) -> float:
    """Monoisotopic mass (Da) of a formula string; a charge suffix removes / adds electrons (as RDKit does)."""
    counts, charge = parse_formula(formula)
    return float(sum(_element_mass(el) * n for el, n in counts.items()) - charge * ELECTRON_MASS)


def _hill(counts: dict[str, int], charge: int = 0) -> str:
    first = [e for e in ("C", "H") if e in counts]
    order = first + sorted(e for e in counts if e not in ("C", "H"))
    text = "".join(el + (str(counts[el]) if counts[el] != 1 else "") for el in order)
    if charge:
        text += ("+" if charge > 0 else "-") + ("" if abs(charge) == 1 else str(abs(charge)))
    return text


def normalize_formula(text: str) -> str:
    """The formula in RDKit's order: C, then H, then the other elements alphabetically, e.g. ``"OH2" -> "H2O"``,
    ``"CH3COOH" -> "C2H4O2"``, ``"NaCl" -> "ClNa"``.

    This is the Hill order for every formula with carbon; without carbon RDKit (and so this function) still puts
    H first (``"H3N"``, where strict Hill writes ``"H3N"`` too but ``"CoH8N6O4"`` rather than ``"H8CoN6O4"``).
    Following RDKit makes normalised strings equal to ``Molecule.formula`` for every structure. A charge suffix
    is kept as RDKit writes it (``"C4H12N+"``, ``"C14H30N2O4+2"``).
    """
    counts, charge = parse_formula(text)
    return _hill(counts, charge)


# ----------------------------------------------------------------------------------------------------------
# Adducts
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Adduct:
    """A precursor ion type: ``m/z = (multiplier * M + mass_shift) / |charge|``.

    Attributes
    ----------
    name : str
        Canonical name, e.g. ``"[M+H]+"``.
    charge : int
        Signed charge (``+1``, ``-1``, ``+2``...).
    mass_shift : float
        Mass added to ``multiplier * M`` (Da): atoms gained minus atoms lost, minus ``charge`` electron masses.
    multiplier : int
        How many molecules M the ion holds (2 for ``[2M+H]+``).
    """

    name: str
    charge: int
    mass_shift: float
    multiplier: int = 1

    @property
    def ion_mode(self) -> str:
        return "positive" if self.charge > 0 else "negative"

    def __str__(self) -> str:
        return self.name


# Abbreviations met in adduct names (MassBank, GNPS, MS-DIAL).
_ADDUCT_GROUPS = {"FA": "CH2O2", "HAC": "C2H4O2", "ACN": "C2H3N", "MEOH": "CH4O", "TFA": "C2HF3O2",
                  "DMSO": "C2H6OS", "ISOPROP": "C3H8O"}
_ADDUCT_SYNTAX = re.compile(r"^\[(\d*)M((?:[+-][^+\-\]]+)*)\](\d*)([+-]+)([*.]?)$")
_ADDUCT_TERM = re.compile(r"([+-])(\d*)([^+-]+)")


def _adduct_from_text(text: str) -> Adduct | None:
    """Compute an adduct from its written composition (``[nM+A-B]z+``); None when the syntax is not that."""
    compact = "".join(text.split())
    # Radical marks may stand on either side of the charge: [M]+* and [M]*+ and [M]+.
    compact = re.sub(r"\]([*.])([+-]+|\d+[+-])$", r"]\2\1", compact)
    match = _ADDUCT_SYNTAX.match(compact)
    if not match:
        return None
    multiplier = int(match.group(1) or 1)
    signs = match.group(4)
    if set(signs) != {signs[0]} or (match.group(3) and len(signs) > 1):
        return None
    charge = (int(match.group(3)) if match.group(3) else len(signs)) * (1 if signs[0] == "+" else -1)
    if charge == 0 or multiplier == 0:
        return None
    shift = 0.0
    for term in _ADDUCT_TERM.finditer(match.group(2)):
        sign, count, group = term.groups()
        formula = _ADDUCT_GROUPS.get(group.upper(), group)
        try:
            mass = formula_mass(formula)
        except InputError:
            return None
        shift += (1 if sign == "+" else -1) * int(count or 1) * mass
    shift -= charge * ELECTRON_MASS
    return Adduct(name=compact, charge=charge, mass_shift=shift, multiplier=multiplier)


def _table() -> tuple[dict[str, Adduct], dict[str, str]]:
    canonical = ["[M+H]+", "[M+Na]+", "[M+K]+", "[M+NH4]+", "[M]+", "[M]+*", "[M+2H]2+", "[M-H2O+H]+",
                 "[M+H-NH3]+", "[M-H]-", "[M-2H]2-", "[M+Cl]-", "[M+HCOO]-", "[M+CH3COO]-", "[M+CH3COOH-H]-",
                 "[2M+H]+", "[2M+Na]+", "[2M-H]-", "[M+Li]+", "[M-2H2O+H]+", "[M]-"]
    aliases = {"[M+2H]++": "[M+2H]2+", "[M+H-H2O]+": "[M-H2O+H]+", "[M+FA-H]-": "[M+HCOO]-",
               "[M+HCO2]-": "[M+HCOO]-", "[M-H+HCOOH]-": "[M+HCOO]-",
               "[M+HCOOH-H]-": "[M+HCOO]-", "[M+Hac-H]-": "[M+CH3COOH-H]-", "[M+HAc-H]-": "[M+CH3COOH-H]-",
               "[M+CH3CO2]-": "[M+CH3COO]-", "[M-2H]--": "[M-2H]2-", "[M]*+": "[M]+*", "[M]+.": "[M]+*",
               "[M+H]1+": "[M+H]+", "[M-H]1-": "[M-H]-", "[M+NH4]1+": "[M+NH4]+", "[M+Na]1+": "[M+Na]+"}
    table = {}
    for name in canonical:
        adduct = _adduct_from_text(name)
        assert adduct is not None, name
        table[name] = adduct
    for alias, target in aliases.items():
        if target not in table:
            table[target] = _adduct_from_text(target)
    return table, aliases


#: Known adducts by canonical name (other names parse through :func:`parse_adduct` too).
ADDUCTS, _ALIASES = _table()
_LOOKUP = {name.upper(): name for name in ADDUCTS}
_LOOKUP.update({alias.upper(): target for alias, target in _ALIASES.items()})

#: The adducts tried for a spectrum that states none, per ion mode.
DEFAULT_ADDUCTS: dict[str, list[Adduct]] = {
    "positive": [ADDUCTS[n] for n in ("[M+H]+", "[M+Na]+", "[M+NH4]+", "[M]+")],
    "negative": [ADDUCTS[n] for n in ("[M-H]-", "[M+HCOO]-", "[M+CH3COO]-", "[M+Cl]-")],
}


def parse_adduct(text: str | Adduct) -> Adduct:
    """The :class:`Adduct` named by ``text`` (whitespace-tolerant, case-insensitive for table names).

    Table names and their aliases (``[M+2H]++``, ``[M+H-H2O]+``, ``[M+FA-H]-``, ``[M+Hac-H]-``...) map to the
    canonical entry. Any other name of the form ``[nM+A-B...]z+`` (``A``, ``B`` formulas with optional counts,
    or FA/Hac/ACN/MeOH/TFA/DMSO) is computed exactly from its composition, e.g. ``[M-H-CO2]-``. Anything else
    raises ``InputError`` naming the string: an adduct is never guessed.
    """
    if isinstance(text, Adduct):
        return text
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"empty or invalid adduct {text!r}", field="adduct")
    compact = "".join(text.split())
    name = _LOOKUP.get(compact.upper())
    if name is not None:
        return ADDUCTS[name]
    adduct = _adduct_from_text(compact)
    if adduct is None:
        raise InputError(f"unknown adduct {text!r} (expected e.g. [M+H]+, [M-H]-, [M+Na]+)", field="adduct")
    return adduct


def adduct_composition(adduct: str | Adduct) -> tuple[int, dict[str, int], int]:
    """What an adduct does to the molecular formula: ``(multiplier, atom changes, charge)``.

    ``[M+H]+`` gives ``(1, {"H": 1}, 1)``, ``[M-H2O+H]+`` gives ``(1, {"H": -1, "O": -1}, 1)``, ``[2M+Na]+`` gives
    ``(2, {"Na": 1}, 1)``. The ion formula is ``multiplier * M + changes`` with ``charge`` electrons removed
    (added when negative). Raises ``InputError`` (field ``adduct``) as :func:`parse_adduct` does.
    """
    name = parse_adduct(adduct).name
    match = _ADDUCT_SYNTAX.match(re.sub(r"\]([*.])([+-]+|\d+[+-])$", r"]\2\1", name))
    if match is None:  # every parsed adduct name has the [nM+A-B]z+ syntax
        raise InputError(f"adduct {name!r} has no written composition", field="adduct")
    changes: dict[str, int] = {}
    for term in _ADDUCT_TERM.finditer(match.group(2)):
        sign, count, group = term.groups()
        counts, _ = parse_formula(_ADDUCT_GROUPS.get(group.upper(), group))
        for element, n in counts.items():
            changes[element] = changes.get(element, 0) + (1 if sign == "+" else -1) * int(count or 1) * n
    return int(match.group(1) or 1), {k: v for k, v in changes.items() if v}, parse_adduct(adduct).charge


def neutral_mass(precursor_mz: float | np.ndarray, adduct: str | Adduct) -> float | np.ndarray:
    """Monoisotopic mass M of the neutral molecule giving ``precursor_mz`` as ``adduct``.

    Inverse of :func:`precursor_mz`: ``M = (|z| * m/z - mass_shift) / multiplier``. Works elementwise on arrays.
    """
    a = parse_adduct(adduct)
    mz = np.asarray(precursor_mz, dtype=np.float64) if isinstance(precursor_mz, np.ndarray) else float(precursor_mz)
    return (abs(a.charge) * mz - a.mass_shift) / a.multiplier


def precursor_mz(neutral_mass: float | np.ndarray, adduct: str | Adduct) -> float | np.ndarray:
    """The m/z of ``adduct`` of a neutral molecule of monoisotopic mass ``neutral_mass``:
    ``(multiplier * M + mass_shift) / |z|``. Works elementwise on arrays."""
    a = parse_adduct(adduct)
    m = np.asarray(neutral_mass, dtype=np.float64) if isinstance(neutral_mass, np.ndarray) else float(neutral_mass)
    return (a.multiplier * m + a.mass_shift) / abs(a.charge)
