"""The sketched output basis: orthonormality in H_y, projection coordinates, duplicates, rank cut-off, state."""
from __future__ import annotations

import numpy as np
import pytest

from molpredict.hookspecs import hookimpl
from molpredict.kernels.base import OutputKernel
from molpredict.component import frozen_spec
from molpredict.models.basis import SketchedOutputBasis, distinct_objects
from molpredict.engine.nystrom import objects_from_state, objects_to_state
from molpredict.engine.linalg import truncated_eigh as eigh_truncated
from molpredict.registry import Registry, reset_registry


class LinearVectorKernel(OutputKernel):
    """k(a, b) = a . b on numeric vectors: an explicit feature map to test projections against."""

    normalized = False
    input_type = "vector"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def featurize(self, objects):
        return np.stack([np.asarray(getattr(o, "vec", o), dtype=np.float64) for o in objects]) * self.scale

    def pairwise(self, fa, fb):
        return fa @ fb.T

    def self_similarity(self, features):
        return (features * features).sum(1)


class Keyed:
    """An output with an identity (like a molecule's InChIKey) distinct from its features."""

    def __init__(self, key: str, vec) -> None:
        self.inchikey = key
        self.vec = np.asarray(vec, dtype=np.float64)


class _TestPlugin:
    @hookimpl
    def register_output_kernels(self, register):
        register("test-linear", LinearVectorKernel)


@pytest.fixture
def registry():
    reg = Registry(load_external=False, extra_plugins=[_TestPlugin()])
    reset_registry(reg)
    return reg


def _vectors(n, d, seed):
    return list(np.random.default_rng(seed).normal(size=(n, d)))


def _projection_gram(train, sketch_matrix, a, b):
    """<P phi(a_i), P phi(b_j)> with P the orthogonal projection onto span{sum_i R_ki phi(y_i)}."""
    phi = np.stack(train)                       # (n, d): explicit features of the linear kernel
    directions = (sketch_matrix @ phi).T        # (d, m)
    q, r = np.linalg.qr(directions)
    keep = np.abs(np.diag(r)) > 1e-10 * np.abs(np.diag(r)).max()
    q = q[:, keep]
    return (np.stack(a) @ q) @ (np.stack(b) @ q).T


def test_eigh_truncated_drops_small_and_orders():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 3))
    values, vectors = eigh_truncated(x @ x.T, 1e-10)
    assert values.shape == (3,) and vectors.shape == (6, 3)
    assert np.all(np.diff(values) <= 0)
    np.testing.assert_allclose(vectors @ np.diag(values) @ vectors.T, x @ x.T, atol=1e-10)
    assert eigh_truncated(np.zeros((3, 3)))[0].shape == (0,)


def test_symmetric_eigh_reads_the_lower_triangle_and_matches_numpy(monkeypatch):
    """The CPU path (SciPy's syevd, on one BLAS thread or all of them) against NumPy's eigh; only the lower
    triangle is read; a float32 matrix stays float32."""
    import torch

    import molpredict.engine.linalg as linalg

    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 60))
    m = x @ x.T
    expected_s, expected_v = np.linalg.eigh(m)
    upper_garbage = np.tril(m) + np.triu(np.full_like(m, 7.0), 1)
    for free in (True, False):
        monkeypatch.setattr(linalg, "_cores_free", lambda: free)
        s, v = linalg.symmetric_eigh(torch.from_numpy(upper_garbage))
        assert s.dtype == v.dtype == torch.float64
        np.testing.assert_allclose(s.numpy(), expected_s, rtol=1e-10, atol=1e-9)
        # eigenvectors up to sign: the reconstruction and the projector on the top 5
        np.testing.assert_allclose((v * s) @ v.T, m, atol=1e-8)
        np.testing.assert_allclose(v[:, -5:] @ v[:, -5:].T, expected_v[:, -5:] @ expected_v[:, -5:].T, atol=1e-8)
    s32, _ = linalg.symmetric_eigh(torch.from_numpy(m.astype(np.float32)))
    assert s32.dtype == torch.float32


def test_full_subsample_reproduces_the_kernel():
    train = _vectors(25, 40, 1)  # 25 linearly independent vectors: K has full rank
    basis = SketchedOutputBasis(LinearVectorKernel(), "subsample:m=25", seed=0).fit(train)
    assert basis.rank_ == 25
    psi = basis.sample_coordinates()
    np.testing.assert_allclose(psi @ psi.T, np.stack(train) @ np.stack(train).T, atol=1e-8)
    new = _vectors(5, 40, 2)
    # new outputs: their projection onto span(train features)
    expected = _projection_gram(train, np.eye(25), new, train)
    np.testing.assert_allclose(basis.coordinates(new) @ psi.T, expected, atol=1e-8)


@pytest.mark.parametrize("sketch", ["subsample:m=12", "gaussian:m=10", "p-sparsified-rademacher:m=10,p=0.3",
                                    "p-sparsified-gaussian:m=10,p=0.3", "accumulation:m=10,M=4",
                                    "adaptive:m=8"])
def test_coordinates_are_projections(sketch):
    train = _vectors(30, 20, 3)
    basis = SketchedOutputBasis(LinearVectorKernel(), sketch, seed=4).fit(train)
    r = basis.sketch_.matrix()
    new = _vectors(7, 20, 5)
    psi_new = basis.coordinates(new)
    psi_train = basis.sample_coordinates()
    np.testing.assert_allclose(psi_new @ psi_new.T, _projection_gram(train, r, new, new), atol=1e-8)
    np.testing.assert_allclose(psi_new @ psi_train.T, _projection_gram(train, r, new, train), atol=1e-8)
    np.testing.assert_allclose(basis.coordinates(train), psi_train, atol=1e-10)


@pytest.mark.parametrize("sketch", ["subsample:m=9", "gaussian:m=9", "p-sparsified-rademacher:m=9,p=0.3"])
def test_basis_functions_are_orthonormal(sketch):
    train = _vectors(30, 20, 6)
    basis = SketchedOutputBasis(LinearVectorKernel(), sketch, seed=7).fit(train)
    landmarks = np.stack(basis.landmarks_)
    gram = basis.projection_.T @ (landmarks @ landmarks.T) @ basis.projection_  # <e_j, e_l>
    np.testing.assert_allclose(gram, np.eye(basis.rank_), atol=1e-8)
    # and the same with the naive dense formula D^-1/2 U^T R K
    r = basis.sketch_.matrix()
    k = np.stack(train) @ np.stack(train).T
    values, vectors = eigh_truncated(r @ k @ r.T)
    naive = (k @ r.T @ vectors) / np.sqrt(values)
    np.testing.assert_allclose(naive @ naive.T, basis.sample_coordinates() @ basis.sample_coordinates().T,
                               atol=1e-8)


def test_subsample_scaling_does_not_change_coordinates():
    train = _vectors(30, 20, 8)
    basis = SketchedOutputBasis(LinearVectorKernel(), "subsample:m=10", seed=9).fit(train)
    assert not np.allclose(basis.sketch_.A_.toarray(), np.eye(10))  # scaled by sqrt(n/m)
    unscaled = np.zeros((10, 30))
    unscaled[np.arange(10), basis.landmark_index_] = 1.0
    k = np.stack(train) @ np.stack(train).T
    values, vectors = eigh_truncated(unscaled @ k @ unscaled.T)
    naive = (k @ unscaled.T @ vectors) / np.sqrt(values)
    psi = basis.sample_coordinates()
    np.testing.assert_allclose(np.abs(naive), np.abs(psi), atol=1e-8)  # same basis up to signs
    np.testing.assert_allclose(naive @ naive.T, psi @ psi.T, atol=1e-8)


def test_duplicates_are_deduplicated_and_mapped_back():
    base = _vectors(8, 5, 10)
    objects = [Keyed(f"K{i % 8}", base[i % 8]) for i in range(24)]
    basis = SketchedOutputBasis(LinearVectorKernel(), "subsample:m=100", seed=0).fit(objects)
    assert len(basis.distinct_) == 8 and basis.train_coordinates_.shape[0] == 8
    np.testing.assert_array_equal(basis.inverse_, np.arange(24) % 8)
    np.testing.assert_allclose(basis.sample_coordinates(), basis.coordinates(objects), atol=1e-10)
    distinct, inverse = distinct_objects(["b", "a", "b", "c", "a"])
    assert distinct == ["b", "a", "c"] and inverse.tolist() == [0, 1, 0, 2, 1]


def test_rank_cutoff_with_identical_outputs_under_different_keys():
    # stereoisomers with identical fingerprints: distinct keys, identical kernel rows -> K~ singular
    base = _vectors(4, 6, 11)
    objects = [Keyed(f"K{i}", base[i % 4]) for i in range(12)]
    basis = SketchedOutputBasis(LinearVectorKernel(), "subsample:m=12", seed=0).fit(objects)
    assert basis.rank_ == 4
    psi = basis.sample_coordinates()
    assert np.isfinite(psi).all()
    k = np.stack([o.vec for o in objects])
    np.testing.assert_allclose(psi @ psi.T, k @ k.T, atol=1e-8)
    # low-rank data: 30 outputs in a 5-dimensional feature space
    low = list(np.random.default_rng(12).normal(size=(30, 5)) @ np.random.default_rng(13).normal(size=(5, 9)))
    assert SketchedOutputBasis(LinearVectorKernel(), "subsample:m=20", seed=1).fit(low).rank_ == 5


def test_sketch_larger_than_distinct_outputs_is_shrunk():
    train = _vectors(6, 10, 14)
    basis = SketchedOutputBasis(LinearVectorKernel(), "gaussian:m=50", seed=0).fit(train * 3)
    assert basis.sketch_.m_ == 6 and basis.rank_ == 6


def test_state_round_trip(registry):
    train = _vectors(20, 8, 15)
    basis = SketchedOutputBasis("test-linear:scale=2.0", "p-sparsified-rademacher:m=6,p=0.3", seed=3).fit(train)
    arrays, meta = basis.get_state()
    assert {a for a in arrays if ".fitted_kernel." not in a} == {"output.landmarks.vectors", "output.projection",
                                                                 "output.eigenvalues"}
    assert {"output.fitted_kernel.fit_features_", "output.fitted_kernel.fit_diag_"} <= set(arrays)
    again = SketchedOutputBasis.from_state(arrays, meta)
    assert not again.features_.refitted_on_load_
    new = _vectors(4, 8, 16)
    np.testing.assert_allclose(again.coordinates(new), basis.coordinates(new), rtol=0, atol=1e-12)
    assert meta["kernel"] == "test-linear:scale=2.0"


def test_frozen_spec_uses_resolved_parameters(registry):
    kernel = LinearVectorKernel(scale=1.0)
    kernel.scale_ = 3.5  # as a kernel would resolve "auto" at fit time
    assert str(frozen_spec(kernel)) == "test-linear:scale=3.5"


def test_objects_state_for_text_and_molecules():
    arrays, meta = objects_to_state(["ab", "c"], "x")
    assert arrays == {} and objects_from_state(arrays, meta, "x") == ["ab", "c"]
    from molpredict.chem.molecules import Molecule
    mols = [Molecule.from_smiles("CCO"), Molecule.from_smiles("c1ccccc1")]
    arrays, meta = objects_to_state(mols, "x")
    back = objects_from_state(arrays, meta, "x")
    assert [m.inchikey for m in back] == [m.inchikey for m in mols]


# -- sketch-size selection -------------------------------------------------------------------------------
def test_perfect_h_is_exact_with_the_full_basis():
    from dsokr_helpers import install_synthetic_registry
    from molpredict.models.sketch_size import perfect_h_curve
    install_synthetic_registry()
    train = [np.round(v, 8) for v in np.random.default_rng(0).normal(size=(60, 3))]
    truths = train[:20]
    rows = perfect_h_curve(train, truths, grid=[2, 60, 500], output_kernel="test-rbf:gamma=2.0",
                           candidates=train)
    assert [r["m_used"] for r in rows] == [2, 60]   # 500 > 60 distinct structures: capped and listed once
    assert rows[1]["hit@1"] == 1.0 and rows[1]["mrr"] == 1.0 and rows[1]["p_y"] <= 60
    assert rows[0]["hit@1"] < 1.0 and rows[0]["p_y"] <= 2


def test_recommend_takes_the_start_of_the_plateau():
    from molpredict.models.sketch_size import recommend
    rows = [{"m_used": 100, "hit@1": 0.20}, {"m_used": 200, "hit@1": 0.295}, {"m_used": 400, "hit@1": 0.30},
            {"m_used": 800, "hit@1": 0.301}]
    assert recommend(rows)["m"] == 200
    assert recommend(rows, tolerance=0.0)["m"] == 800
    assert recommend(rows, tolerance=0.2)["m"] == 100


def test_effective_dimension_matches_the_exact_trace():
    from dsokr_helpers import install_synthetic_registry
    from molpredict.models.sketch_size import effective_dimension
    install_synthetic_registry()
    train = list(np.random.default_rng(1).normal(size=(40, 3)))
    rows = effective_dimension(train, "test-rbf:gamma=0.5", lams=[1e-2, 1e-4], n_landmarks=40)
    x = np.stack(train)
    k = np.exp(-0.5 * ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    for row in rows:
        exact = np.trace(k @ np.linalg.inv(k + 40 * row["lam"] * np.eye(40)))
        assert row["d_eff"] == pytest.approx(exact, rel=1e-6)
    assert rows[0]["d_eff"] < rows[1]["d_eff"]
    approx = effective_dimension(train, "test-rbf:gamma=0.5", lams=[1e-2], n_landmarks=15)[0]
    assert approx["d_eff"] <= rows[0]["d_eff"] + 1e-9  # a Nystrom approximation never adds spectrum


def test_select_sketch_size_command(tmp_path):
    import json

    from click.testing import CliRunner
    from molpredict.cli import cli
    train = ["CCO", "CCCO", "CCCCO", "c1ccccc1", "c1ccccc1O", "c1ccccc1N", "CC(=O)O", "CCC(=O)O", "CCN", "CCCN",
             "OCC(O)CO", "CC(C)O", "CCOC", "COC", "CC=O", "C1CCCCC1"]
    (tmp_path / "train.smi").write_text("\n".join(train + ["not-a-smiles"]) + "\n")
    (tmp_path / "val.tsv").write_text("cid\tsmiles\tdescription\n1\tCCCCCO\tan alcohol\n2\tc1ccccc1C\ttoluene\n"
                                      "3\tCCCC(=O)O\tbutyric acid\n")
    out = tmp_path / "curve.json"
    result = CliRunner().invoke(cli, ["select-sketch-size", str(tmp_path / "train.smi"), "--val",
                                      str(tmp_path / "val.tsv"), "--grid", "2,4,8,16", "--json", str(out),
                                      "--plot", str(tmp_path / "curve.png"), "--landmarks", "8", "-q"])
    assert result.exit_code == 0, result.output
    assert "recommended m_y" in result.output
    data = json.loads(out.read_text())
    assert [row["m_used"] for row in data["curve"]] == [2, 4, 8, 16]
    assert data["n_queries"] == 3 and data["recommendation"]["m"] in (2, 4, 8, 16)
    assert (tmp_path / "curve.png").stat().st_size > 1000
    bad = CliRunner().invoke(cli, ["select-sketch-size", str(tmp_path / "train.smi"), "--val",
                                   str(tmp_path / "val.tsv"), "--grid", "a,b"])
    assert bad.exit_code == 2 and "--grid" in bad.output
    # values that crashed (internal errors) or printed nonsense (d_eff of a negative lam) are usage errors
    for option, value in [("--tolerance", "nan"), ("--repeats", "0"), ("--max-queries", "-3"), ("--lams", "-1"),
                          ("--landmarks", "-1")]:
        bad = CliRunner().invoke(cli, ["select-sketch-size", str(tmp_path / "train.smi"), "--val",
                                       str(tmp_path / "val.tsv"), "--grid", "2", option, value])
        assert bad.exit_code == 2 and option in bad.output and "internal error" not in bad.output, bad.output
    # what the command would change silently: an m in --sketch (the grid sets it) is refused; sizes beyond the
    # 16 distinct training structures are measured once, at 16, and said so
    bad = CliRunner().invoke(cli, ["select-sketch-size", str(tmp_path / "train.smi"), "--val",
                                   str(tmp_path / "val.tsv"), "--grid", "2", "--sketch", "subsample:m=3"])
    assert bad.exit_code == 2 and "give the sketch without m" in bad.output, bad.output
    with pytest.warns(UserWarning, match=r"--grid 20, 40: more than the 16 distinct training structures"):
        result = CliRunner().invoke(cli, ["select-sketch-size", str(tmp_path / "train.smi"), "--val",
                                          str(tmp_path / "val.tsv"), "--grid", "8,20,40", "--json", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert [row["m_used"] for row in json.loads(out.read_text())["curve"]] == [8, 16]


def test_graph_kernel_landmarks_are_refitted():
    from molpredict.chem.molecules import Molecule
    smiles = ["CCO", "CCCO", "CCCCO", "c1ccccc1", "c1ccccc1O", "CC(=O)O", "CCN", "OCC(O)CO", "CC(C)O", "COC"]
    molecules = [Molecule.from_smiles(s) for s in smiles]
    basis = SketchedOutputBasis("wl-subtree:n_iter=2", "subsample:m=4", seed=0).fit(molecules)
    new = [Molecule.from_smiles("CCCCCO"), Molecule.from_smiles("c1ccccc1C")]
    psi = basis.coordinates(new)
    assert psi.shape == (2, basis.rank_)
    np.testing.assert_allclose(basis.coordinates(molecules), basis.sample_coordinates(), atol=1e-10)
    again = SketchedOutputBasis.from_state(*basis.get_state())
    np.testing.assert_allclose(again.coordinates(new), psi, atol=1e-10)
