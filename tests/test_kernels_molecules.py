"""Molecule kernels (tanimoto, gaussian-tanimoto, fingerprint-cosine, wl-subtree, core-wl, nspd) against naive references on small
hand-picked SMILES sets."""
from __future__ import annotations

import collections
import math
import warnings

import networkx as nx
import numpy as np
import pytest

from molpredict.errors import SpecError
from molpredict.kernels.fingerprints import (FingerprintCosineKernel, GaussianTanimotoKernel, TanimotoKernel,
                                             cosine_fingerprints, minmax_counts, tanimoto_bits)
from molpredict.kernels.graphs import CoreWLKernel, NSPDKernel, WLSubtreeKernel
from molpredict.chem.molecules import Molecule

SMILES = [
    "CCO", "c1ccccc1O", "CC(=O)O", "CCN", "CC", "c1ccc2ccccc2c1", "OCC(O)C(O)C(O)C(O)CO", "CC(C)NCC(O)c1ccc(O)cc1",
    "C1CC1CC(C)N", "C1CCC2(CC1)CCCCC2", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "OC(=O)CCC(=O)O",
]
SINGLE_ATOM = ["C", "O", "[Na+]"]


@pytest.fixture(scope="module")
def mols() -> list[Molecule]:
    return [Molecule.from_smiles(s) for s in SMILES]


def _on_bits(fp: np.ndarray) -> set[int]:
    return set(np.flatnonzero(fp).tolist())


def naive_tanimoto(a: np.ndarray, b: np.ndarray) -> float:
    sa, sb = _on_bits(a), _on_bits(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def naive_minmax(a: np.ndarray, b: np.ndarray) -> float:
    den = float(np.maximum(a, b).sum())
    return 1.0 if den == 0 else float(np.minimum(a, b).sum()) / den


def naive_cosine(a: np.ndarray, b: np.ndarray) -> float:
    dot = sum(float(x) * float(y) for x, y in zip(a, b))
    na, nb = math.sqrt(sum(float(x) ** 2 for x in a)), math.sqrt(sum(float(y) ** 2 for y in b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return dot / (na * nb)


# ---------------------------------------------------------------------------------------------------------
# Tanimoto
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fp,params", [("morgan", dict(radius=2, size=2048)), ("morgan", dict(radius=1, size=64)),
                                       ("maccs", dict()), ("rdkit", dict(size=1024))])
def test_tanimoto_matches_set_definition(mols, fp, params):
    k = TanimotoKernel(fp=fp, **params).fit(mols[:8])
    fps = [m.fingerprint(kind=fp, radius=params.get("radius", 2), size=params.get("size", 2048)) for m in mols]
    want = np.array([[naive_tanimoto(a, b) for b in fps[:8]] for a in fps])
    np.testing.assert_allclose(k.transform(mols), want, rtol=1e-14, atol=0)
    np.testing.assert_array_equal(np.diag(k.gram()), 1.0)


@pytest.mark.parametrize("ratio", [0.0, 1e9])  # 0: always the sparse product, 1e9: always the GEMM
def test_tanimoto_sparse_and_gemm_paths_agree(mols, monkeypatch, ratio):
    import molpredict.kernels.fingerprints as mod

    monkeypatch.setattr(mod, "SPARSE_SPEED_RATIO", ratio)
    k = TanimotoKernel(size=1024).fit(mols[:7])
    fps = [m.fingerprint(size=1024) for m in mols]
    want = np.array([[naive_tanimoto(a, b) for b in fps[:7]] for a in fps])
    np.testing.assert_allclose(k.transform(mols), want, rtol=1e-14, atol=0)
    a, b = np.stack(fps[:5]), np.stack(fps[5:])
    np.testing.assert_array_equal(tanimoto_bits(a, b, "sparse"), tanimoto_bits(a, b, "gemm"))


def test_minmax_counts_matches_definition(mols):
    k = TanimotoKernel(counts=True, size=256).fit(mols)
    fps = [m.fingerprint(kind="morgan", radius=2, size=256, counts=True) for m in mols]
    assert max(fp.max() for fp in fps) > 2  # really exercises several count levels
    want = np.array([[naive_minmax(a, b) for b in fps] for a in fps])
    np.testing.assert_allclose(k.gram(), want, rtol=1e-14, atol=0)


def test_minmax_non_integer_counts():
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 3, (5, 7)) * (rng.random((5, 7)) < 0.5)
    b = rng.uniform(0, 3, (4, 7)) * (rng.random((4, 7)) < 0.5)
    b[0] = 0.0
    want = np.array([[naive_minmax(x, y) for y in b] for x in a])
    np.testing.assert_allclose(minmax_counts(a, b), want, rtol=1e-13)
    with pytest.raises(ValueError):
        minmax_counts(-a, b)


def test_all_zero_fingerprints():
    a = np.array([[0, 0, 0, 0], [1, 1, 0, 0]], dtype=np.uint8)
    b = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=np.uint8)
    np.testing.assert_array_equal(tanimoto_bits(a, b), [[1.0, 0.0, 0.0], [0.0, 0.5, 1.0]])
    np.testing.assert_array_equal(minmax_counts(a.astype(np.float32), b.astype(np.float32)),
                                  [[1.0, 0.0, 0.0], [0.0, 0.5, 1.0]])


def test_all_zero_fingerprint_molecules():
    # RDKit's path fingerprint of a single atom has no bit set (paths have at least one bond)
    mols = [Molecule.from_smiles(s) for s in ["C", "O", "CCO"]]
    assert not mols[0].fingerprint(kind="rdkit", size=512).any()
    gram = GaussianTanimotoKernel(gamma=0.7, fp="rdkit", size=512).fit(mols).gram()
    assert gram[0, 1] == 1.0  # two empty fingerprints are identical
    assert gram[0, 2] == pytest.approx(math.exp(-0.7 * 2.0))
    np.testing.assert_array_equal(np.diag(gram), 1.0)


# ---------------------------------------------------------------------------------------------------------
# Gaussian-Tanimoto
# ---------------------------------------------------------------------------------------------------------
def test_gaussian_tanimoto_fixed_gamma(mols):
    k = GaussianTanimotoKernel(gamma=0.5).fit(mols[:5])
    t = TanimotoKernel().fit(mols[:5]).transform(mols)
    np.testing.assert_allclose(k.transform(mols), np.exp(-0.5 * (2 - 2 * t)), rtol=1e-14)
    np.testing.assert_array_equal(np.diag(k.gram()), 1.0)
    np.testing.assert_array_equal(k.diagonal(mols), 1.0)


def test_gamma_auto_by_hand_on_three_molecules():
    three = [Molecule.from_smiles(s) for s in ["CCO", "CCN", "c1ccccc1O"]]
    fps = [m.fingerprint() for m in three]
    d12 = 2 - 2 * naive_tanimoto(fps[0], fps[1])
    d13 = 2 - 2 * naive_tanimoto(fps[0], fps[2])
    d23 = 2 - 2 * naive_tanimoto(fps[1], fps[2])
    k = GaussianTanimotoKernel(gamma="auto").fit(three)
    assert k.gamma_ == pytest.approx(3.0 / (d12 + d13 + d23), rel=1e-14)
    assert k.gram()[0, 1] == pytest.approx(math.exp(-k.gamma_ * d12), rel=1e-14)
    assert k.to_spec().params["gamma"] == "auto"


def test_gamma_auto_degenerate_and_unfitted():
    one = [Molecule.from_smiles("CCO")]
    assert GaussianTanimotoKernel().fit(one).gamma_ == 1.0
    assert GaussianTanimotoKernel().fit(one * 3).gamma_ == 1.0  # identical molecules: mean distance 0
    with pytest.raises(RuntimeError, match="not fitted"):
        k = GaussianTanimotoKernel()
        k.pairwise(k.featurize(one), k.featurize(one))


def test_gamma_auto_uses_a_seeded_sample(monkeypatch, mols):
    import molpredict.kernels.fingerprints as mod

    monkeypatch.setattr(mod, "GAMMA_SAMPLE", 5)
    g0 = GaussianTanimotoKernel(seed=0).fit(mols).gamma_
    assert GaussianTanimotoKernel(seed=0).fit(mols).gamma_ == g0
    rows = np.sort(np.random.default_rng(0).choice(len(mols), 5, replace=False))
    fps = [mols[i].fingerprint() for i in rows]
    dists = [2 - 2 * naive_tanimoto(fps[i], fps[j]) for i in range(5) for j in range(i + 1, 5)]
    assert g0 == pytest.approx(1.0 / np.mean(dists), rel=1e-13)


@pytest.mark.parametrize("bad", [dict(gamma=0), dict(gamma="wide"), dict(fp="ecfp"),
                                 dict(fp="maccs", counts=True), dict(fp="rdkit", chiral=True)])
def test_fingerprint_kernels_reject_bad_parameters(bad):
    with pytest.raises(SpecError):
        GaussianTanimotoKernel(**bad)


def test_chiral_kernel_separates_stereoisomers():
    from molpredict.testing import check_kernel

    pair = [Molecule.from_smiles("C[C@H](N)C(=O)O"), Molecule.from_smiles("C[C@@H](N)C(=O)O")]
    assert GaussianTanimotoKernel(gamma=1.0).fit(pair).gram()[0, 1] == pytest.approx(1.0)
    chiral = GaussianTanimotoKernel(gamma=1.0, chiral=True).fit(pair)
    k = chiral.gram()[0, 1]
    bits = [m.fingerprint(chiral=True).astype(bool) for m in pair]
    t = (bits[0] & bits[1]).sum() / (bits[0] | bits[1]).sum()
    assert k == pytest.approx(math.exp(-1.0 * (2 - 2 * t)), rel=1e-12) and k < 1.0
    more = pair + [Molecule.from_smiles(s) for s in ("C[C@H](O)CC", "C[C@@H](O)CC", "CCO", "c1ccccc1", "CC(N)C(=O)O")]
    check_kernel(GaussianTanimotoKernel(chiral=True), more, n_sample=len(more))


def test_spec_round_trip():
    from molpredict.registry import get_registry

    k = get_registry().create("output_kernel", "gaussian-tanimoto:gamma=auto,fp=morgan,radius=2,size=4096")
    assert (k.gamma, k.fp, k.radius, k.size) == ("auto", "morgan", 2, 4096)
    assert str(k.to_spec()).startswith("gaussian-tanimoto:")


# ---------------------------------------------------------------------------------------------------------
# Fingerprint cosine
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params", [dict(), dict(radius=1, size=128), dict(counts=False, size=512),
                                    dict(chiral=True), dict(fp="rdkit", size=256)])
def test_fingerprint_cosine_matches_naive(mols, params):
    k = FingerprintCosineKernel(**params).fit(mols[:7])
    fp_args = dict(kind=params.get("fp", "morgan"), radius=params.get("radius", 2), size=params.get("size", 2048),
                   counts=params.get("counts", True), chiral=params.get("chiral", False))
    fps = [m.fingerprint(**fp_args) for m in mols]
    if fp_args["counts"]:
        assert max(fp.max() for fp in fps) > 2  # counts, not bits
    want = np.array([[naive_cosine(a, b) for b in fps[:7]] for a in fps])
    np.testing.assert_allclose(k.transform(mols), want, rtol=1e-13, atol=1e-15)
    gram = k.gram()
    np.testing.assert_array_equal(np.diag(gram), 1.0)
    np.testing.assert_allclose(gram, want[:7], rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(k.diagonal(mols), 1.0)


@pytest.mark.parametrize("ratio", [0.0, 1e9])  # 0: always the sparse product, 1e9: always the GEMM
def test_fingerprint_cosine_sparse_and_gemm_paths_agree(mols, monkeypatch, ratio):
    import molpredict.kernels.fingerprints as mod

    monkeypatch.setattr(mod, "SPARSE_SPEED_RATIO", ratio)
    fps = [m.fingerprint(size=256, counts=True) for m in mols]
    want = np.array([[naive_cosine(a, b) for b in fps[:6]] for a in fps])
    k = FingerprintCosineKernel(size=256).fit(mols[:6])
    np.testing.assert_allclose(k.transform(mols), want, rtol=1e-13, atol=1e-15)
    a, b = np.stack(fps[:5]), np.stack(fps[5:])
    np.testing.assert_allclose(cosine_fingerprints(a, b, "sparse"), cosine_fingerprints(a, b, "gemm"),
                               rtol=1e-15, atol=0)


def test_fingerprint_cosine_all_zero():
    a = np.array([[0, 0, 0, 0], [3, 1, 0, 0]], dtype=np.float32)
    b = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [6, 2, 0, 0]], dtype=np.float32)
    for method in ("auto", "sparse", "gemm"):
        got = cosine_fingerprints(a, b, method)
        np.testing.assert_allclose(got, [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 3 / math.sqrt(10), 1.0]], rtol=1e-15)
        assert got[0, 0] == 1.0 and got[1, 0] == 0.0  # exact, not merely close
    with pytest.raises(ValueError):
        cosine_fingerprints(-a, b)


def test_fingerprint_cosine_all_zero_molecules():
    # RDKit's path fingerprint of a single atom has no bit set (paths have at least one bond)
    mols = [Molecule.from_smiles(s) for s in ["C", "O", "CCO", "CCN"]]
    assert not mols[0].fingerprint(kind="rdkit", size=512, counts=True).any()
    k = FingerprintCosineKernel(fp="rdkit", size=512)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact by construction: no degenerate-object warning
        gram = k.fit(mols).gram()
        cross = k.transform(mols[:2])
    assert gram[0, 1] == 1.0 and cross[0, 1] == 1.0  # two empty fingerprints are identical
    assert np.all(gram[:2, 2:] == 0.0) and np.all(cross[:, 2:] == 0.0)
    np.testing.assert_array_equal(np.diag(gram), 1.0)
    assert 0.0 < gram[2, 3] < 1.0


@pytest.mark.parametrize("bad", [dict(fp="ecfp"), dict(fp="maccs"), dict(fp="rdkit", chiral=True)])
def test_fingerprint_cosine_rejects_bad_parameters(bad):
    with pytest.raises(SpecError):
        FingerprintCosineKernel(**bad)


def test_fingerprint_cosine_spec():
    from molpredict.registry import get_registry

    k = get_registry().create("output_kernel", "fingerprint-cosine:radius=3,size=1024,chiral=true")
    assert isinstance(k, FingerprintCosineKernel)
    assert (k.fp, k.radius, k.size, k.counts, k.chiral) == ("morgan", 3, 1024, True, True)
    assert str(k.to_spec()).startswith("fingerprint-cosine:")


# ---------------------------------------------------------------------------------------------------------
# Graph kernels
# ---------------------------------------------------------------------------------------------------------
def _nx_graph(mol: Molecule) -> nx.Graph:
    edges, labels, _ = mol.graph(bond_labels=False)
    g = nx.Graph()
    for i, label in labels.items():
        g.add_node(i, label=label)
    g.add_edges_from((i, j) for i in edges for j in edges[i])
    return g


def naive_wl_features(g: nx.Graph, n_iter: int) -> collections.Counter:
    """WL subtree features: label multisets of iterations 0..n_iter (labels of different iterations distinct)."""
    label = {v: (g.nodes[v]["label"],) for v in g.nodes}
    feats = collections.Counter((0, lab) for lab in label.values())
    for it in range(1, n_iter + 1):
        label = {v: (label[v], tuple(sorted(label[u] for u in g[v]))) for v in g.nodes}
        feats.update((it, lab) for lab in label.values())
    return feats


def _dot(a: collections.Counter, b: collections.Counter) -> float:
    return float(sum(v * b.get(k, 0) for k, v in a.items()))


def _normalize(raw: np.ndarray, diag_a: np.ndarray, diag_b: np.ndarray) -> np.ndarray:
    return raw / np.sqrt(np.outer(diag_a, diag_b))


@pytest.mark.parametrize("n_iter", [1, 3])
def test_wl_subtree_matches_naive(mols, n_iter):
    all_mols = mols + [Molecule.from_smiles(s) for s in SINGLE_ATOM]
    feats = [naive_wl_features(_nx_graph(m), n_iter) for m in all_mols]
    raw = np.array([[_dot(a, b) for b in feats[:9]] for a in feats])
    diag = np.array([_dot(f, f) for f in feats])
    k = WLSubtreeKernel(n_iter=n_iter).fit(all_mols[:9])
    np.testing.assert_allclose(k.transform(all_mols), _normalize(raw, diag, diag[:9]), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.diag(k.gram()), 1.0)


def test_core_wl_matches_naive(mols):
    """Core framework: the sum over k = 0..max core of the WL kernel on the k-cores, then normalised."""
    all_mols = mols + [Molecule.from_smiles(s) for s in SINGLE_ATOM]
    graphs = [_nx_graph(m) for m in all_mols]
    max_core = max(max(nx.core_number(g).values(), default=0) for g in graphs)
    assert max_core >= 2  # rings give 2-cores

    def feats(g, k):
        return naive_wl_features(nx.k_core(g, k) if k > 0 else g, 2)

    per_core = [[feats(g, k) for k in range(max_core + 1)] for g in graphs]
    raw = np.array([[sum(_dot(a[k], b[k]) for k in range(max_core + 1)) for b in per_core] for a in per_core])
    diag = np.diag(raw)
    k = CoreWLKernel(n_iter=2).fit(all_mols)
    np.testing.assert_allclose(k.gram(), _normalize(raw, diag, diag), rtol=1e-12, atol=1e-14)


def test_nspd_agrees_with_grakel_when_every_level_is_populated():
    """For molecules with features at every (radius, distance) level, GraKeL's fit_transform is right."""
    from grakel.kernels import NeighborhoodSubgraphPairwiseDistance

    from molpredict.kernels.graphs import molecule_graphs

    big = [Molecule.from_smiles(s) for s in ["CCCCCCCCCC", "CCCCCCCC(=O)O", "OCCCCCCCCN", "CCOCCOCCOCC",
                                              "CC(C)CCCC(C)CCCC(C)C"]]
    k = NSPDKernel(r=2, d=3).fit(big)
    ref = NeighborhoodSubgraphPairwiseDistance(r=2, d=3, normalize=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ref.fit_transform(molecule_graphs(big))
    assert len(k.fit_levels_) == 3 * 4 and np.all(k.fit_diag_ == 12)
    np.testing.assert_allclose(k.gram(), want, rtol=1e-12)


def test_nspd_small_molecules_are_consistent(mols):
    """GraKeL scores a small fitted molecule 0.75 against itself on transform; ours is 1 on both paths."""
    k = NSPDKernel().fit(mols)
    np.testing.assert_allclose(np.diag(k.transform(mols)), 1.0, rtol=1e-12)
    gram = k.gram()
    np.testing.assert_allclose(gram, gram.T, atol=1e-14)
    assert np.linalg.eigvalsh(gram)[0] > -1e-10


def test_graph_kernels_on_single_atom_molecules(mols):
    singles = [Molecule.from_smiles(s) for s in SINGLE_ATOM + ["C"]]
    for kernel in (WLSubtreeKernel(), CoreWLKernel(), NSPDKernel()):
        kernel.fit(mols + singles)
        gram = kernel.gram()
        n = len(mols)
        # methane vs methane (two records): identical graphs
        assert gram[n, n + 3] == pytest.approx(1.0, rel=1e-12)
        # different single atoms share nothing
        assert gram[n, n + 1] == 0.0 and gram[n, n + 2] == 0.0
        np.testing.assert_array_equal(np.diag(gram), 1.0)
    # NSPD: bond-less molecules share no feature with molecules that have bonds
    assert np.all(NSPDKernel().fit(mols).transform(singles) == 0.0)


def test_graph_kernel_parameters():
    with pytest.raises(SpecError):
        WLSubtreeKernel(n_iter=0)
    with pytest.raises(SpecError):
        NSPDKernel(r=-1)
    with pytest.raises(SpecError):
        CoreWLKernel(min_core=-2)
