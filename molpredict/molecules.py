"""Molecules: the ``Molecule`` record (RDKit parsing, InChIKey, formula, mass), cached fingerprints and graphs,
and the adduct table converting precursor m/z to neutral mass."""
from __future__ import annotations

__all__ = ["Molecule"]


class Molecule:
    """A molecular structure, built from SMILES or InChI, with lazily computed and cached representations.

    Use :meth:`from_smiles` / :meth:`from_inchi`; they raise :class:`molpredict.errors.InputError` on a
    structure RDKit cannot parse.

    Attributes
    ----------
    smiles : str
        RDKit canonical SMILES (isomeric).
    inchikey : str
        Full InChIKey; ``inchikey14`` is its first block (the 2D skeleton), the identity used for hits.
    formula : str
        Molecular formula of the neutral molecule (Hill order, as RDKit's CalcMolFormula).
    monoisotopic_mass : float
    """
