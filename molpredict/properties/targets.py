"""Property targets: the RDKit descriptors of a structure that the properties stage predicts from its spectra.

Each property is a pure function of an RDKit molecule; :func:`compute_properties` evaluates all of them for
many SMILES (each distinct SMILES once) and names the record of a SMILES RDKit cannot parse.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from rdkit import Chem, rdBase
from rdkit.Chem import Crippen, Descriptors, QED, rdMolDescriptors

from molpredict.errors import InputError

__all__ = ["Property", "PROPERTIES", "PROPERTY_NAMES", "compute_properties", "molecule_properties", "clip_to_ranges"]


@dataclass(frozen=True)
class Property:
    """One target: its column name, what it is, and how RDKit computes it."""

    name: str
    description: str
    compute: Callable[[Chem.Mol], float]
    #: the range the property can take (predictions are clipped to it)
    lower: float = float("-inf")
    upper: float = float("inf")


#: the predicted properties, in column order
PROPERTIES: tuple[Property, ...] = (
    Property("logp", "Crippen logP (octanol/water partition)", Crippen.MolLogP),
    Property("tpsa", "topological polar surface area (A^2)", rdMolDescriptors.CalcTPSA, 0.0),
    Property("mw", "average molecular weight (Da)", Descriptors.MolWt, 0.0),
    Property("hbd", "H-bond donors (Lipinski)", rdMolDescriptors.CalcNumHBD, 0.0),
    Property("hba", "H-bond acceptors (Lipinski)", rdMolDescriptors.CalcNumHBA, 0.0),
    Property("rotatable_bonds", "rotatable bonds", rdMolDescriptors.CalcNumRotatableBonds, 0.0),
    Property("rings", "rings (SSSR)", rdMolDescriptors.CalcNumRings, 0.0),
    Property("aromatic_rings", "aromatic rings", rdMolDescriptors.CalcNumAromaticRings, 0.0),
    Property("fraction_sp3", "fraction of sp3 carbons", rdMolDescriptors.CalcFractionCSP3, 0.0, 1.0),
    Property("qed", "quantitative estimate of drug-likeness (Bickerton et al. 2012)", QED.qed, 0.0, 1.0),
)
PROPERTY_NAMES: tuple[str, ...] = tuple(p.name for p in PROPERTIES)


def clip_to_ranges(F: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Predictions F (n, T, Q) clipped to each known property's range (counts >= 0, fractions in [0, 1])."""
    by_name = {p.name: p for p in PROPERTIES}
    F = np.array(F, dtype=np.float64, copy=True)
    for t, name in enumerate(names):
        if name in by_name:
            F[:, t] = np.clip(F[:, t], by_name[name].lower, by_name[name].upper)
    return F


def molecule_properties(mol: Chem.Mol) -> np.ndarray:
    """All :data:`PROPERTIES` of one RDKit molecule, shape (len(PROPERTIES),), float64."""
    return np.array([float(p.compute(mol)) for p in PROPERTIES], dtype=np.float64)


def compute_properties(smiles: Sequence[str], where: Sequence[str] | None = None) -> np.ndarray:
    """The property matrix of structures given as SMILES.

    Parameters
    ----------
    smiles : sequence of str
    where : sequence of str, optional
        How to name each structure in an error (e.g. ``"train.mgf record 12"``); default its position.

    Returns
    -------
    ndarray of shape (len(smiles), len(PROPERTIES)), float64

    Raises
    ------
    InputError
        A SMILES is empty or RDKit cannot parse it (the message names the record and the field).
    """
    cache: dict[str, np.ndarray] = {}
    out = np.empty((len(smiles), len(PROPERTIES)), dtype=np.float64)
    # BlockLogs restores the logging state it found (re-enabling RDKit's logs here switched them back on for the
    # whole process, which molpredict.chem.molecules silences at import)
    with rdBase.BlockLogs():
        for i, text in enumerate(smiles):
            key = (text or "").strip()
            if key not in cache:
                mol = Chem.MolFromSmiles(key) if key else None
                if mol is None:
                    name = where[i] if where is not None else f"structure {i + 1}"
                    raise InputError(f"{name}: field SMILES {text!r} is not a structure RDKit can parse")
                cache[key] = molecule_properties(mol)
            out[i] = cache[key]
    return out
