"""Distinct outputs: the identity that finds duplicate training outputs, and the index back to them.

Kernel models build the output side on distinct structures (47,880 MassBank spectra cover ~4,100 of them), so
every model deduplicates its outputs the same way: a molecule by its full InChIKey (else its SMILES), a string
by itself, an array by its bytes.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

from molpredict.errors import InputError

__all__ = ["output_key", "structure_key", "refuse_shared_structures", "distinct_positions", "distinct_objects", "split_by_structure",
           "group_size_weights"]


def output_key(obj: Any) -> Any:
    """The identity of an output: ``("inchikey", ...)`` for a molecule, a string itself, an array's bytes.

    Raises
    ------
    TypeError
        For unhashable objects that are none of these.
    """
    if isinstance(obj, str):
        return obj
    if isinstance(obj, np.ndarray):
        return (obj.shape, obj.dtype.str, obj.tobytes())
    inchikey = getattr(obj, "inchikey", None)
    if isinstance(inchikey, str) and inchikey:
        return ("inchikey", inchikey)
    smiles = getattr(obj, "smiles", None)
    if isinstance(smiles, str):
        return ("smiles", smiles)
    if isinstance(obj, (list, tuple)):
        return output_key(np.asarray(obj, dtype=np.float64))
    try:
        hash(obj)
    except TypeError:
        raise TypeError(f"cannot tell duplicates apart for outputs of type {type(obj).__name__}") from None
    return obj


def structure_key(molecule: Any) -> str:
    """A molecule's identity up to stereochemistry: its InChIKey first block (MassSpecGym's), else its SMILES."""
    return getattr(molecule, "inchikey14", None) or f"smiles:{molecule.smiles}"


def distinct_positions(objects: Sequence[Any], key: Callable[[Any], Any] | None = None
                       ) -> tuple[list[int], np.ndarray]:
    """First occurrences of the distinct objects and the index mapping every object to its representative.

    Parameters
    ----------
    objects : sequence of length n
    key : callable, optional
        The identity of an object (default :func:`output_key`).

    Returns
    -------
    first : list of int, length n_distinct
        Position of each distinct object's first occurrence, in order of appearance.
    inverse : ndarray of shape (n,), int64
        ``objects[i]`` has the identity of ``objects[first[inverse[i]]]``.
    """
    key = key or output_key
    seen: dict[Any, int] = {}
    first: list[int] = []
    inverse = np.empty(len(objects), dtype=np.int64)
    for i, obj in enumerate(objects):
        identity = key(obj)
        j = seen.get(identity)
        if j is None:
            j = seen[identity] = len(first)
            first.append(i)
        inverse[i] = j
    return first, inverse


def distinct_objects(objects: Sequence[Any], key: Callable[[Any], Any] | None = None
                     ) -> tuple[list[Any], np.ndarray]:
    """The distinct objects (first-occurrence order) and the index back to them, as :func:`distinct_positions`.

    Returns
    -------
    distinct : list of length n_distinct
    inverse : ndarray of shape (len(objects),), int64
        ``objects[i]`` has the identity of ``distinct[inverse[i]]``.
    """
    first, inverse = distinct_positions(objects, key)
    return [objects[i] for i in first], inverse


def split_by_structure(molecules: Sequence[Any], fraction: float, seed: int,
                       key: Callable[[Any], Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train / held-out split of positions such that no structure (by ``key``, default
    :func:`output_key`) is on both sides: ``round(fraction * n_structures)`` structures held out (at least
    one, and never all).

    Returns
    -------
    train, held_out : ndarray of int64 (sorted positions); ``held_out`` is empty when there are fewer than two
    distinct structures.
    """
    first, index = distinct_positions(molecules, key)
    n_u = len(first)
    if n_u < 2:
        return np.arange(len(molecules), dtype=np.int64), np.empty(0, dtype=np.int64)
    n_out = min(n_u - 1, max(1, int(round(fraction * n_u))))
    chosen = np.random.default_rng(seed).permutation(n_u)[:n_out]
    mask = np.isin(index, chosen)
    return np.flatnonzero(~mask).astype(np.int64), np.flatnonzero(mask).astype(np.int64)


def group_size_weights(index: np.ndarray, power: float = 1.0) -> np.ndarray:
    """(1 / size of the object's group) ** ``power`` per object: 1 weighs every group 1 in total, 0 every object 1.

    Parameters
    ----------
    index : ndarray of shape (n,), int
        The group of each object, in 0 .. n_groups - 1 (e.g. :func:`distinct_positions`' index).
    power : float

    Returns
    -------
    ndarray of shape (n,), float64
    """
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    counts = np.bincount(index)
    return (1.0 / counts[index].astype(np.float64)) ** float(power)


def refuse_shared_structures(train_keys: Iterable[str], val_keys: Iterable[str],
                             what: str = "the validation spectra", path: str | None = None) -> None:
    """Raise InputError when validation spectra share structures with the training spectra (keys of one kind for
    both, e.g. :func:`~molpredict.chem.molecules.spectrum_structure_key`): what is chosen or calibrated on them
    (grid points, intervals, a score fusion and its probability) would be fitted on structures the model has
    seen, as unknowns are not. ``path`` names the validation files."""
    shared = set(train_keys) & set(val_keys)
    if shared:
        raise InputError(f"{what} share {len(shared)} structure{'s' if len(shared) > 1 else ''} with the training "
                         f"spectra (first: {sorted(shared)[0]}); validation needs other structures", path=path)
