"""Graph kernels on molecular graphs through GraKeL: Weisfeiler-Lehman subtree (``wl-subtree``), neighbourhood
subgraph pairwise distance (``nspd``) and the core framework over WL (``core-wl``).

GraKeL kernels are fit/transform objects: :meth:`fit` fits one on the reference graphs and ``pairwise`` calls its
``transform`` (query graphs x reference graphs). Graphs are the hydrogen-suppressed RDKit graphs of
:meth:`molpredict.chem.molecules.Molecule.graph` (atoms labelled by element, bonds by bond type).

Normalisation
-------------
- WL and core-WL: GraKeL's own ``normalize=True`` (``k(x, y) / sqrt(k(x, x) k(y, y))`` with the self-similarities
  computed by GraKeL, new labels of query graphs included), so ``normalized`` is False here and the Gram
  diagonal is set to exactly 1 (``unit_diagonal``).
- NSPD: GraKeL's kernel is a sum over (radius, distance) levels of per-level cosine kernels. Its
  ``normalize=True`` divides by the number of levels of the *fitted set* and its ``fit_transform`` counts a level
  where a graph has no feature as a perfect self-match while ``transform`` counts it as 0: the two disagree on
  small molecules (a fitted graph transformed against itself scores 0.75). We therefore take GraKeL's raw
  (``normalize=False``) transform values, which are consistent, and normalise them here by the raw
  self-similarity: the number of the fitted levels at which the graph has a feature (read from a GraKeL fit on
  the graphs themselves). The result is the cosine-normalised sum of per-level cosines: PSD, unit diagonal.

Edgeless graphs
---------------
A molecule without bonds (methane ``C``, an ion ``[Na+]``) is an edgeless graph. WL handles it. GraKeL's NSPD
refuses graphs without edge labels, so for ``nspd`` such a graph gets a self-loop labelled ``"NONE"`` on each
atom: it then shares features only with other bond-less molecules of the same atoms (kernel 0 with every
molecule that has bonds, 1 with itself).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from molpredict.errors import SpecError
from molpredict.chem.molecules import Molecule
from molpredict.kernels.base import OutputKernel

__all__ = ["WLSubtreeKernel", "NSPDKernel", "CoreWLKernel", "molecule_graphs"]


def molecule_graphs(molecules: Sequence[Molecule], bond_labels: bool = True,
                    loop_edgeless: bool = False) -> list:
    """GraKeL graphs of molecules.

    Parameters
    ----------
    molecules : sequence of Molecule, length n
    bond_labels : bool
        Label edges by bond type.
    loop_edgeless : bool
        Give each atom of a bond-less molecule a self-loop labelled ``"NONE"`` (for kernels needing edges).

    Returns
    -------
    list of grakel.Graph, length n
    """
    from grakel import Graph

    graphs = []
    for mol in molecules:
        edges, node_labels, edge_labels = mol.graph(bond_labels=bond_labels)
        n_edges = sum(len(nbrs) for nbrs in edges.values())
        if loop_edgeless and n_edges == 0:
            edges = {i: {i: 1.0} for i in node_labels}
            edge_labels = {(i, i): "NONE" for i in node_labels}
        else:
            # GraKeL's Graph may mutate its inputs: hand it copies, never the molecule's cached graph
            edges = {i: dict(nbrs) for i, nbrs in edges.items()}
            node_labels = dict(node_labels)
            edge_labels = None if edge_labels is None else dict(edge_labels)
        graphs.append(Graph(edges, node_labels=node_labels, edge_labels=edge_labels))
    return graphs


@dataclass
class _Graphs:
    """A list of GraKeL graphs (a list with array indexing)."""

    graphs: list

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, index: np.ndarray | slice) -> "_Graphs":
        if isinstance(index, slice):
            return _Graphs(self.graphs[index])
        return _Graphs([self.graphs[int(i)] for i in np.asarray(index)])


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{name} must be an integer >= {minimum}, not {value!r}")


class _GrakelKernel(OutputKernel):
    """A GraKeL kernel fitted on the reference graphs; ``pairwise(query, reference)`` is its transform."""

    bond_labels: ClassVar[bool] = True
    loop_edgeless: ClassVar[bool] = False

    def _make(self) -> Any:
        """A fresh (unfitted) GraKeL kernel object."""
        raise NotImplementedError

    def featurize(self, objects: Sequence[Molecule]) -> _Graphs:
        return _Graphs(molecule_graphs(list(objects), self.bond_labels, self.loop_edgeless))

    def fit(self, objects: Sequence[Molecule]) -> "_GrakelKernel":
        objects = list(objects)
        graphs = self.featurize(objects)
        self.grakel_ = self._make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GraKeL warns about graph format conversions on every call
            self.grakel_.fit(graphs.graphs)
        self._after_grakel_fit(graphs)
        self.fit_features_ = graphs
        self.fit_diag_ = np.asarray(self.self_similarity(graphs), dtype=np.float64)
        self.n_fit_ = len(objects)
        return self

    def _after_grakel_fit(self, graphs: _Graphs) -> None:
        """Hook run after GraKeL's fit, before the reference self-similarities."""

    def pairwise(self, fa: _Graphs, fb: _Graphs) -> np.ndarray:
        if fb is not getattr(self, "fit_features_", None):
            raise ValueError(f"{type(self).__name__}.pairwise: GraKeL kernels compare graphs with the fitted "
                             "reference graphs only (fb must be fit_features_)")
        if len(fa) == 0:
            return np.zeros((0, len(fb)), dtype=np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(self.grakel_.transform(fa.graphs), dtype=np.float64)


class WLSubtreeKernel(_GrakelKernel):
    """Weisfeiler-Lehman subtree kernel (GraKeL ``WeisfeilerLehman`` over ``VertexHistogram``), ``wl-subtree``.

    Parameters
    ----------
    n_iter : int
        WL relabelling iterations.
    """

    normalized: ClassVar[bool] = False
    unit_diagonal: ClassVar[bool] = True
    bond_labels: ClassVar[bool] = False

    def __init__(self, n_iter: int = 5) -> None:
        self.n_iter = n_iter
        _check_int("n_iter", n_iter, 1)

    def _make(self) -> Any:
        from grakel.kernels import VertexHistogram, WeisfeilerLehman

        return WeisfeilerLehman(n_iter=self.n_iter, base_graph_kernel=VertexHistogram, normalize=True)

    def self_similarity(self, features: _Graphs) -> np.ndarray:
        return np.ones(len(features), dtype=np.float64)


class CoreWLKernel(WLSubtreeKernel):
    """Core framework over the WL subtree kernel (GraKeL ``CoreFramework``), ``core-wl``.

    Parameters
    ----------
    n_iter : int
        WL relabelling iterations.
    min_core : int
        Smallest core order considered (-1: all, as GraKeL).
    """

    def __init__(self, n_iter: int = 5, min_core: int = -1) -> None:
        super().__init__(n_iter=n_iter)
        self.min_core = min_core
        _check_int("min_core", min_core, -1)

    def _make(self) -> Any:
        from grakel.kernels import CoreFramework, VertexHistogram, WeisfeilerLehman

        return CoreFramework(min_core=self.min_core, normalize=True,
                             base_graph_kernel=(WeisfeilerLehman, dict(n_iter=self.n_iter,
                                                                       base_graph_kernel=VertexHistogram)))


class NSPDKernel(_GrakelKernel):
    """Neighbourhood subgraph pairwise distance kernel (GraKeL), with bond labels, ``nspd``.

    Parameters
    ----------
    r : int
        Largest neighbourhood radius.
    d : int
        Largest distance between the two neighbourhood roots.

    Normalised here (``normalized`` True), see the module docstring.
    """

    loop_edgeless: ClassVar[bool] = True

    def __init__(self, r: int = 3, d: int = 4) -> None:
        self.r = r
        self.d = d
        _check_int("r", r, 0)
        _check_int("d", d, 0)

    def _make(self) -> Any:
        from grakel.kernels import NeighborhoodSubgraphPairwiseDistance

        return NeighborhoodSubgraphPairwiseDistance(r=self.r, d=self.d, normalize=False)

    def _after_grakel_fit(self, graphs: _Graphs) -> None:
        self.fit_levels_ = frozenset(self.grakel_.X.keys())

    def self_similarity(self, features: _Graphs) -> np.ndarray:
        """Number of fitted (radius, distance) levels at which each graph has a feature, shape (n,)."""
        out = np.zeros(len(features), dtype=np.float64)
        if len(features) == 0:
            return out
        probe = self._make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe.fit(features.graphs)
        for level, matrix in probe.X.items():
            if level in self.fit_levels_:
                out += np.diff(matrix.tocsr().indptr) > 0
        return out
