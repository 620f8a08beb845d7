"""Candidate sources: where a query's candidate structures come from (a library by formula or mass, or
MassSpecGym-style candidate sets), as ids into a table of molecules with cache keys, tie keys and output fields."""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Protocol, Sequence

import numpy as np

from molpredict.errors import InputError

__all__ = ["CandidateSource", "LibrarySource", "SetSource", "precursor_tolerance", "neutral_mass_windows",
           "hint_mismatch", "formula_parses", "UNIT_RESOLUTION_DECIMALS", "UNIT_RESOLUTION_TOLERANCE"]

#: A precursor m/z written with this many decimals or fewer is a unit-resolution measurement (ion trap,
#: quadrupole): in MassBank, such records (RIKEN ReSpect, Keio...) are off by up to 0.4 from the exact m/z.
UNIT_RESOLUTION_DECIMALS = 2
#: ... and is matched within half a unit (m/z), the accuracy of a unit-resolution instrument.
UNIT_RESOLUTION_TOLERANCE = 0.5


def precursor_tolerance(precision: float | None) -> float:
    """The half-width (m/z) that a precursor m/z's written precision allows.

    Parameters
    ----------
    precision : float or None
        ``10**-decimals`` of the written precursor m/z (``Spectrum.precursor_mz_precision``).

    Returns
    -------
    float
        :data:`UNIT_RESOLUTION_TOLERANCE` for at most :data:`UNIT_RESOLUTION_DECIMALS` decimals, else one unit
        of the last written digit (``0.001`` for ``179.070``), 0 when unknown. Candidate selection uses the
        larger of this (scaled to the neutral mass) and the ppm window.

    Examples
    --------
    >>> precursor_tolerance(0.1), precursor_tolerance(0.01), precursor_tolerance(0.001), precursor_tolerance(None)
    (0.5, 0.5, 0.001, 0.0)
    """
    if not precision or precision <= 0:
        return 0.0
    if precision >= 0.5 * 10.0 ** -UNIT_RESOLUTION_DECIMALS:
        return UNIT_RESOLUTION_TOLERANCE
    return float(precision)


def formula_parses(formula: str) -> bool:
    """Whether ``formula`` is a molecular formula selection can use (:func:`normalize_formula` reads it); a
    spectrum's FORMULA that is not one leaves selection to the precursor mass."""
    from molpredict.chem.molecules import normalize_formula

    try:
        normalize_formula(formula)
    except InputError:
        return False
    return True


def neutral_mass_windows(spectrum: Any, adducts: Sequence[Any], options: Any) -> tuple[np.ndarray, np.ndarray, str]:
    """The neutral masses a precursor m/z stands for and the window around each, as selection by mass uses them.

    Parameters
    ----------
    spectrum : Spectrum
        With a precursor m/z.
    adducts : sequence of Adduct
    options : SelectionOptions
        ``ppm`` and ``precision_window`` are read.

    Returns
    -------
    masses : ndarray of shape (len(adducts),), float64
        The neutral mass under each adduct.
    floors : ndarray of shape (len(adducts),), float64
        The half-width (Da) the precursor's written precision allows (:func:`precursor_tolerance`, times
        ``|charge| / multiplier``; 0 with ``precision_window`` off); the window is the larger of it and the ppm one.
    window : str
        ``"<ppm> ppm"``, or ``"<tolerance> m/z"`` when the precision decided.
    """
    from molpredict.chem.molecules import neutral_mass

    masses = np.array([neutral_mass(spectrum.precursor_mz, a) for a in adducts], dtype=np.float64)
    tolerance = 0.0
    if getattr(options, "precision_window", True):
        tolerance = precursor_tolerance(getattr(spectrum, "precursor_mz_precision", None))
    floors = np.array([tolerance * abs(a.charge) / a.multiplier for a in adducts], dtype=np.float64)
    wide = floors > np.abs(masses) * options.ppm * 1e-6
    return masses, floors, f"{tolerance:g} m/z" if wide.any() else f"{options.ppm:g} ppm"


def hint_mismatch(spectrum: Any, adducts: Sequence[Any], formula: str, options: Any) -> str | None:
    """Why a formula hint contradicts the spectrum's precursor m/z, or None when it fits (or cannot be checked).

    The hint fits when its mass lies in the window selection by mass would use (:func:`neutral_mass_windows`)
    under one of ``adducts``. Unchecked: a spectrum without a precursor m/z, an unparsable formula (selection
    reports it), no adduct.

    Returns
    -------
    str or None
        A one-line skip reason naming the hint, its mass and the closest expected mass.
    """
    from molpredict.chem.molecules import formula_mass

    if not spectrum.precursor_mz or not adducts:
        return None
    try:
        mass = formula_mass(formula)
    except (InputError, ValueError, TypeError):
        return None
    masses, floors, window = neutral_mass_windows(spectrum, adducts, options)
    half = np.maximum(floors, np.abs(masses) * options.ppm * 1e-6)
    off = np.abs(masses - mass)
    if bool((off <= half).any()):
        return None
    best = int(np.argmin(off))
    named = adducts[best].name if len(adducts) == 1 else f"{adducts[best].name} (closest of {len(adducts)} adducts)"
    return (f"formula hint {formula} (M {mass:.4f}) does not fit precursor m/z {spectrum.precursor_mz:.4f} as "
            f"{named}: M {masses[best]:.4f} expected within {window}")


#: candidate sets whose ``one_formula`` answer a source remembers
ONE_FORMULA_MEMORY = 4096


#: what :meth:`LibrarySource.prefetch` reads: the tie-break key and the output fields
PREFETCHED_COLUMNS = ("inchikey", "inchikey14", "smiles", "formula", "name", "id")


class CandidateSource:
    """Where candidates come from: ids into a table of molecules, with keys and output fields per id."""

    def select(self, spectrum: Any, mode: str, adducts: Sequence[Any], formula: str | None
               ) -> tuple[np.ndarray, np.ndarray | None, str, str] | str:
        """``(ids ascending, adduct name per id or None, adduct to report, mass window used or "")`` for one
        query, or a skip reason."""
        raise NotImplementedError

    def keys(self, ids: np.ndarray) -> list[str]:
        """Cache keys of candidates ``ids``: ``smiles:<SMILES>``, what is featurised (never a declared InChIKey:
        see :mod:`~molpredict.identification.coordinates_cache`)."""
        raise NotImplementedError

    def one_per_structure(self, ids: np.ndarray, adduct_names: np.ndarray | None
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        """``ids`` with one row per structure (and their adducts); a source whose rows are distinct returns them."""
        return ids, adduct_names

    def prefetch(self, ids: np.ndarray) -> None:
        """Read ahead what ranking a block of queries looks up per query (tie keys, output fields, formulas) for
        candidates ``ids``, the block's; the lookups then answer from it. A source whose lookups are cheap ignores
        it (the default)."""

    def tie_keys(self, ids: np.ndarray) -> np.ndarray:
        """Tie-breaking keys (InChIKey), object array of shape (len(ids),)."""
        raise NotImplementedError

    def molecules(self, ids: np.ndarray) -> list[Any]:
        """``Molecule`` records for ``ids`` (only called for candidates not yet in the cache)."""
        raise NotImplementedError

    def fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Output columns (smiles, inchikey, formula, name, id) for ``ids``."""
        raise NotImplementedError

    def inchikey14(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def one_formula(self, ids: np.ndarray) -> bool:
        """Whether candidates ``ids`` share one molecular formula (what the calibration's ``one_formula`` reads:
        a same-formula set, or a mass window where several formulas compete). The answers for the last
        :data:`ONE_FORMULA_MEMORY` sets are remembered (a structure's spectra select the same candidates)."""
        ids = np.asarray(ids, dtype=np.int64)
        memory = self.__dict__.setdefault("_one_formula_memory", OrderedDict())
        key = ids.tobytes()
        known = memory.get(key)
        if known is None:
            known = memory[key] = self._shares_one_formula(ids)
            if len(memory) > ONE_FORMULA_MEMORY:
                memory.popitem(last=False)
        else:
            memory.move_to_end(key)
        return known

    def formulas(self, ids: np.ndarray) -> np.ndarray:
        """The molecular formula of each candidate ``ids``, object array of str, None for a structure RDKit cannot
        parse (from the parsed structures, each id parsed once: the spectra of one structure share its set; a
        source with a formula column reads it instead)."""
        known: dict[int, str | None] = self.__dict__.setdefault("_formula_of", {})
        missing = [int(i) for i in np.unique(ids) if int(i) not in known]
        for i, molecule in zip(missing, self.molecules(np.asarray(missing, dtype=np.int64)) if missing else []):
            try:
                known[i] = molecule.formula
            except (InputError, ValueError, RuntimeError):
                known[i] = None
        return np.array([known[int(i)] for i in ids], dtype=object)

    def _shares_one_formula(self, ids: np.ndarray) -> bool:
        """:meth:`one_formula` computed: the candidates' structures parsed (a source with a formula column reads it
        instead)."""
        from molpredict.chem.candidates import shares_one_formula
        return shares_one_formula(self.molecules(ids))


class SelectionOptions(Protocol):
    """What a library source reads of the run's options (:class:`~molpredict.identification.identify.IdentifyOptions`
    has these fields; candidate selection needs nothing else of identification)."""

    by: str | None
    ppm: float
    precision_window: bool
    sources: Sequence[str] | None


class LibrarySource(CandidateSource):
    """Candidates from a :class:`~molpredict.chem.candidates.CandidateLibrary`, selected by formula or mass."""

    def __init__(self, library: Any, options: SelectionOptions) -> None:
        self.library = library
        self.options = options
        self._allowed = None
        if options.sources:
            allowed = library.select_by_source(list(options.sources))
            self._allowed = np.zeros(len(library), dtype=bool)
            self._allowed[allowed] = True
        self._formula_cache: dict[str, np.ndarray] = {}
        self._normalized: dict[str, str] = {}
        self._filtered_out: set[str] = set()  # formulas whose library rows the sources filter removed, all of them
        self._warned_repeats = False
        self.has_name = library.has_column("name")
        self.has_id = library.has_column("id")

    def select(self, spectrum: Any, mode: str, adducts: Sequence[Any], formula: str | None
               ) -> tuple[np.ndarray, np.ndarray | None, str, str] | str:
        """``(ids, adduct per id or None, reported adduct, mass window)`` or the skip reason.

        By mass, each adduct's neutral-mass window is the larger of ``options.ppm`` and what the precursor's
        written precision allows (:func:`precursor_tolerance`, times ``|charge| / multiplier``; unless
        ``options.precision_window`` is off); the window reported is ``"<ppm> ppm"`` or, when the precision
        decided, ``"<tolerance> m/z"``."""
        if formula and self.options.by is None and not formula_parses(formula):
            formula = None  # an unusable FORMULA field: fall back to the precursor mass
        by = self.options.by or ("formula" if formula else "mass")
        if by == "formula":
            if not formula:
                return "no formula (give --formulas or use --by mass)"
            ids = self._formula_cache.get(formula)
            if ids is None:
                try:
                    ids = self.library.select_by_formula(formula)
                except InputError:
                    return f"unparsable formula {formula!r}"
                in_library = ids.size
                ids, _ = self._allowed_only(ids, None)
                self._formula_cache[formula] = ids
                if not ids.size and in_library:
                    self._filtered_out.add(formula)
            adduct_names = None
            reported = adducts[0].name if len(adducts) == 1 else ""
            window = ""
        else:
            if not spectrum.precursor_mz:
                return "no precursor m/z (needed to select candidates by mass)"
            parts, names = [], []
            masses, floors, window = neutral_mass_windows(spectrum, adducts, self.options)
            for adduct, ids_a in zip(adducts, self.library.select_by_masses(masses, self.options.ppm, floors)):
                parts.append(ids_a)
                names.append(np.full(len(ids_a), adduct.name, dtype=object))
            if not parts:
                return "no adduct to compute a neutral mass"
            all_ids = np.concatenate(parts)
            all_names = np.concatenate(names)
            # keep, per candidate, the first adduct in the given (most-common-first) order
            ids, first = np.unique(all_ids, return_index=True)
            in_library = ids.size
            ids, adduct_names = self._allowed_only(ids, all_names[first])
            reported = ""
        if ids.size == 0:
            where = f"formula {formula}" if by == "formula" else f"mass within {window}"
            if by == "formula" and formula in self._filtered_out or by == "mass" and in_library:
                # the library has some: the --source filter removed them (saying "none in the library" sent users
                # looking for a missing structure)
                sources = list(self.options.sources or ())
                return f"no candidates from source{'s' if len(sources) > 1 else ''} {', '.join(sources)} ({where})"
            return f"no candidates in the library ({where})"
        return ids, adduct_names, reported, window

    def _allowed_only(self, ids: np.ndarray, adduct_names: np.ndarray | None
                      ) -> tuple[np.ndarray, np.ndarray | None]:
        """``ids`` (and their adducts) of the allowed sources."""
        if self._allowed is not None and ids.size:
            keep = self._allowed[ids]
            ids = ids[keep]
            adduct_names = None if adduct_names is None else adduct_names[keep]
        return ids, adduct_names

    def one_per_structure(self, ids: np.ndarray, adduct_names: np.ndarray | None
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        """One row per structure, a structure being an InChIKey first block (the identity hits use): rows that
        repeat one (stereoisomers, E/Z forms, a racemate beside its enantiomers, repeated rows) would be ranked
        against themselves (one structure at ranks 1 to 3, a zero margin, the probability cut: the calibration
        never saw such sets), so the first row in library order (of an allowed source: :meth:`select` filtered
        them) is kept and shown, with one warning naming the library. Reads the prefetched keys."""
        if ids.size < 2:
            return ids, adduct_names
        _, first = np.unique(self._take("inchikey14", ids), return_index=True)
        if first.size == ids.size:
            return ids, adduct_names
        # One molecule listed under several sources (what `candidates build` keeps, so that --source finds it)
        # is merged silently; distinct forms of one first block (stereoisomers, E/Z) are worth one warning.
        if not self._warned_repeats and np.unique(self._take("inchikey", ids)).size > first.size:
            self._warned_repeats = True
            warnings.warn(f"{self.library.path or 'the library'}: rows that share an InChIKey first block "
                          f"(stereoisomers, E/Z forms) are ranked once, as the first such row",
                          UserWarning, stacklevel=2)
        first.sort()  # ids ascend: the first row of each structure in library order
        return ids[first], None if adduct_names is None else adduct_names[first]

    def all_ids(self) -> np.ndarray:
        """Every usable row id (ascending): the whole library, or the rows of the ``sources`` filter."""
        if self._allowed is None:
            return np.arange(len(self.library), dtype=np.int64)
        return np.flatnonzero(self._allowed).astype(np.int64)

    def keys(self, ids: np.ndarray) -> list[str]:
        return list(self._take("cache_key", ids))

    def prefetch(self, ids: np.ndarray) -> None:
        """One take per column (:data:`PREFETCHED_COLUMNS`) of the unique ``ids``, kept until the next call: a
        take costs tens of microseconds whatever its size, and ranking a query took five of them. The cache keys
        (from the SMILES) are made here too, once per block."""
        from molpredict.identification.coordinates_cache import smiles_keys

        ids = np.unique(np.asarray(ids, dtype=np.int64))
        columns = {name: self.library.take(name, ids) for name in PREFETCHED_COLUMNS if self.library.has_column(name)}
        columns["cache_key"] = smiles_keys(columns["smiles"])
        self._prefetched = (ids, columns)

    def _take(self, name: str, ids: np.ndarray) -> np.ndarray | None:
        """``library.take(name, ids)``, from the prefetched rows when they hold all of ``ids``."""
        prefetched = self.__dict__.get("_prefetched")
        ids = np.asarray(ids, dtype=np.int64)
        if prefetched is not None and ids.size and name in prefetched[1]:
            known, columns = prefetched
            at = np.searchsorted(known, ids)
            if at.max() < len(known) and bool((known[at] == ids).all()):
                return columns[name][at]
        if name == "cache_key":
            from molpredict.identification.coordinates_cache import smiles_keys
            return smiles_keys(self.library.take("smiles", ids))
        return self.library.take(name, ids)

    def tie_keys(self, ids: np.ndarray) -> np.ndarray:
        return self._take("inchikey", ids)

    def molecules(self, ids: np.ndarray) -> list[Any]:
        return self.library.molecules(ids)

    def inchikey14(self, ids: np.ndarray) -> np.ndarray:
        return self._take("inchikey14", ids)

    def formulas(self, ids: np.ndarray) -> np.ndarray:
        """From the library's formula column (no parsing)."""
        return np.asarray(self._take("formula", ids), dtype=object)

    def _shares_one_formula(self, ids: np.ndarray) -> bool:
        """From the library's formula column, normalised (:func:`~molpredict.chem.molecules.normalize_formula`,
        as selection by formula reads it): ``C16H13N2OCl`` and ``C16H13ClN2O`` are one formula. Only when the
        strings differ, and each distinct string once per source."""
        formulas = self._take("formula", ids)
        if len(formulas) == 0 or bool(np.all(formulas == formulas[0])):
            return True
        return len({self._normal_formula(f) for f in set(formulas.tolist())}) == 1

    def _normal_formula(self, formula: Any) -> str:
        known = self._normalized.get(formula)
        if known is None:
            from molpredict.chem.molecules import normalize_formula
            try:
                known = normalize_formula(formula or "")
            except InputError:
                known = f"unparsed:{formula}"  # equal to nothing but itself, as the library's formula index has it
            self._normalized[formula] = known
        return known

    def fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Output columns of ``ids``, reading only those rows (:meth:`CandidateLibrary.take`), or the prefetched
        ones."""
        out = {name: self._take(name, ids) for name in ("smiles", "inchikey", "formula")}
        for name, present in (("name", self.has_name), ("id", self.has_id)):
            column = self._take(name, ids) if present else None
            out[name] = column if column is not None else np.full(len(ids), None, dtype=object)
        return out


class SetSource(CandidateSource):
    """Candidates from MassSpecGym-style sets ``{query inchikey14: [(inchikey14, smiles), ...]}``.

    Each query's candidates are the set of its true structure's first block. The distinct ``(inchikey14,
    smiles)`` pairs of all sets form the id table. A set's candidates come in key order
    (:func:`~molpredict.chem.candidates.in_key_order`), not the file's, which puts the truth first.
    """

    def __init__(self, sets: dict[str, list[tuple[str, str]]]) -> None:
        from molpredict.chem.candidates import in_key_order

        index: dict[tuple[str, str], int] = {}
        self._set_ids: dict[str, np.ndarray] = {}
        for query, entries in sets.items():
            ids = []
            for pair in in_key_order(entries):
                j = index.get(pair)
                if j is None:
                    j = index[pair] = len(index)
                ids.append(j)
            self._set_ids[query] = np.asarray(ids, dtype=np.int64)
        pairs = list(index)
        self._ik14 = np.array([p[0] for p in pairs], dtype=object)
        self._smiles = np.array([p[1] for p in pairs], dtype=object)
        self._tie = np.array([f"{k}|{s}" for k, s in pairs], dtype=object)
        self.has_name = False
        self.has_id = False

    def __len__(self) -> int:
        return len(self._ik14)

    def set_ids(self, query_inchikey14: str) -> np.ndarray | None:
        return self._set_ids.get(query_inchikey14)

    def select(self, spectrum: Any, mode: str, adducts: Sequence[Any], formula: str | None
               ) -> tuple[np.ndarray, np.ndarray | None, str] | str:
        """The set of the spectrum's own structure (its INCHIKEY first block): for evaluation and benchmarks."""
        inchikey = spectrum.inchikey
        if not inchikey:
            return "no INCHIKEY (needed to pick its candidate set)"
        ids = self._set_ids.get(inchikey.split("-", 1)[0])
        if ids is None:
            return "no candidate set for the structure"
        return ids, None, adducts[0].name if len(adducts) == 1 else "", ""

    def keys(self, ids: np.ndarray) -> list[str]:
        from molpredict.identification.coordinates_cache import smiles_keys
        return list(smiles_keys(self._smiles[ids]))

    def one_per_structure(self, ids: np.ndarray, adduct_names: np.ndarray | None
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        """One candidate per InChIKey first block (the identity hits use), the first in the set's order: a set
        listing a decoy under three SMILES counted it three times against the truth, the truth under two counted
        as a tie with itself, and the random expectation counted the copies. Remembered per set (the spectra of
        one structure share it)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size < 2:
            return ids, adduct_names
        memory = self.__dict__.setdefault("_one_per_structure", {})
        key = ids.tobytes()
        first = memory.get(key)
        if first is None:
            _, first = np.unique(self._ik14[ids], return_index=True)
            first.sort()
            memory[key] = first
        if first.size == ids.size:
            return ids, adduct_names
        return ids[first], None if adduct_names is None else adduct_names[first]

    def tie_keys(self, ids: np.ndarray) -> np.ndarray:
        return self._tie[ids]

    def molecules(self, ids: np.ndarray) -> list[Any]:
        from molpredict.chem.molecules import Molecule
        return [Molecule(s, inchikey14=k) for k, s in zip(self._ik14[ids], self._smiles[ids])]

    def inchikey14(self, ids: np.ndarray) -> np.ndarray:
        return self._ik14[ids]

    def fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        none = np.full(len(ids), None, dtype=object)
        return {"smiles": self._smiles[ids], "inchikey": self._ik14[ids], "formula": none, "name": none,
                "id": none}
