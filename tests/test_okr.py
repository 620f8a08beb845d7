"""The IOKR / SIOKR / ISOKR / SISOKR engine against naive dense formulas, on small synthetic data."""
from __future__ import annotations

import json

import numpy as np
import pytest

from molpredict.engine.device import resolve_device, resolve_dtype
from molpredict.errors import ModelFileError, ResourceError, SpecError
from molpredict.hookspecs import hookimpl
from molpredict.kernels.base import InputKernel, OutputKernel
from molpredict.component import frozen_spec
from molpredict.models.distinct import distinct_positions
from molpredict.models.distinct import split_by_structure
from molpredict.models.okr import IOKR, ISOKR, SIOKR, SISOKR, lam_grid
from molpredict.registry import Registry, create, reset_registry
from molpredict.engine.sketches import make_sketch
from molpredict.specs import parse_spec


# -- test kernels: RBF on vectors (gamma="auto" resolved at fit), linear, spectra and molecules ---------------
def _sqdist(a, b):
    return np.maximum((a ** 2).sum(1)[:, None] + (b ** 2).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


class VecRBF(InputKernel):
    input_type = "vector"
    normalized = False

    def __init__(self, gamma: float | str = 0.5) -> None:
        self.gamma = gamma

    def featurize(self, objects):
        return np.asarray([np.asarray(o, dtype=float) for o in objects]).reshape(len(objects), -1)

    def _fit_data_dependent(self, features):
        # data-dependent on purpose: a landmark-only refit would give another gamma unless it is resolved
        self.gamma_ = 1.0 / np.median(_sqdist(features, features)) if self.gamma == "auto" else float(self.gamma)

    def pairwise(self, fa, fb):
        return np.exp(-self.gamma_ * _sqdist(fa, fb))

    def self_similarity(self, features):
        return np.ones(len(features))


class VecRBFOut(VecRBF, OutputKernel):
    input_type = "vector"


class VecLinear(InputKernel):
    input_type = "vector"
    normalized = False

    def __init__(self) -> None:
        pass

    def featurize(self, objects):
        return np.asarray([np.asarray(o, dtype=float) for o in objects]).reshape(len(objects), -1)

    def pairwise(self, fa, fb):
        return fa @ fb.T

    def self_similarity(self, features):
        return (features ** 2).sum(1)


class BinnedSpectrumKernel(InputKernel):
    """Cosine of intensity histograms over 10 m/z bins (normalised by the base class)."""

    def __init__(self, width: float = 50.0) -> None:
        self.width = width

    def featurize(self, spectra):
        out = np.zeros((len(spectra), 10))
        for i, s in enumerate(spectra):
            np.add.at(out[i], np.minimum((s.mz // self.width).astype(int), 9), s.intensities)
        return out

    def pairwise(self, fa, fb):
        return fa @ fb.T

    def self_similarity(self, features):
        return (features ** 2).sum(1)


class FingerprintTanimoto(OutputKernel):
    normalized = False

    def __init__(self, size: int = 256) -> None:
        self.size = size

    def featurize(self, molecules):
        return np.asarray([m.fingerprint("morgan", 2, self.size) for m in molecules], dtype=float)

    def pairwise(self, fa, fb):
        inter = fa @ fb.T
        union = fa.sum(1)[:, None] + fb.sum(1)[None, :] - inter
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 1.0)

    def self_similarity(self, features):
        return np.ones(len(features))


class TestKernels:
    __name__ = "okr-test-kernels"

    @hookimpl
    def register_input_kernels(self, register):
        register("vec-rbf", VecRBF)
        register("vec-linear", VecLinear)
        register("binned", BinnedSpectrumKernel)

    @hookimpl
    def register_output_kernels(self, register):
        register("vec-rbf-out", VecRBFOut)
        register("fp-tanimoto", FingerprintTanimoto)


@pytest.fixture(autouse=True)
def _test_kernels():
    reset_registry(Registry(load_external=False, extra_plugins=[TestKernels()]))
    yield
    reset_registry()


# -- data and naive references ------------------------------------------------------------------------------
GX, GY = 0.15, 0.5
IN, OUT = f"vec-rbf:gamma={GX}", f"vec-rbf-out:gamma={GY}"


def make_data(n=240, n_structures=60, seed=0, noise=0.3):
    """Inputs in R^5 generated from 3-D structures; each structure labels several inputs (duplicates)."""
    rng = np.random.default_rng(seed)
    U = rng.normal(size=(n_structures, 3))
    A = rng.normal(size=(3, 5))
    idx = rng.integers(0, n_structures, size=n)
    idx[:n_structures] = np.arange(n_structures)  # every structure appears
    X = np.tanh(U[idx] @ A) + noise * rng.normal(size=(n, 5))
    return X, U[idx], U, A


def k(a, b, gamma):
    return np.exp(-gamma * _sqdist(np.asarray(a), np.asarray(b)))


def pinv(M, rtol=1e-10):
    s, V = np.linalg.eigh((M + M.T) / 2)
    keep = s > rtol * s[-1]
    return (V[:, keep] / s[keep]) @ V[:, keep].T


def naive_iokr_scores(X, Y, Xte, C, lam):
    n = len(X)
    return k(Xte, X, GX) @ np.linalg.solve(k(X, X, GX) + n * lam * np.eye(n), k(Y, C, GY))


def naive_sisokr_scores(X, Y, Xte, C, lam, Rx, Ry, weights=None):
    """Omega = K~_y^+ R_y K_y V K_x R_x^T (R_x K_x V K_x R_x^T + n lam K~_x)^+ with dense n x n matrices, V the
    objects' weights in the square loss (default the identity)."""
    n = len(X)
    Kx, Ky = k(X, X, GX), k(Y, Y, GY)
    V = np.eye(n) if weights is None else np.diag(weights)
    if weights is None and np.array_equal(Rx, np.eye(n)):
        # K_x (K_x^2 + n lam K_x)^+ = (K_x + n lam I)^-1 for an invertible K_x; the squared form loses half
        # the digits to cond(K_x)^2 in a dense pseudo-inverse
        right = np.linalg.inv(Kx + n * lam * np.eye(n))
    else:
        right = Kx @ Rx.T @ pinv(Rx @ Kx @ V @ Kx @ Rx.T + n * lam * Rx @ Kx @ Rx.T)
    omega = pinv(Ry @ Ky @ Ry.T) @ Ry @ Ky @ V @ right
    return k(Xte, X, GX) @ Rx.T @ omega.T @ Ry @ k(Y, C, GY)


def dense_sketches(model, X, Y, seed):
    """The model's R_x (m_x x n) and R_y (m_y x n): R_y = R_u acting on each molecule's first occurrence."""
    n = len(X)
    Rx = make_sketch(getattr(model, "input_sketch", None), seed=seed).fit(
        n, create("input_kernel", IN).fit(list(X))).matrix()
    first, _ = distinct_positions(list(Y))
    ku = create("output_kernel", OUT).fit([Y[i] for i in first])
    Ru = make_sketch(getattr(model, "output_sketch", None), seed=seed + 1).fit(len(first), ku).matrix()
    Ry = np.zeros((Ru.shape[0], n))
    Ry[:, first] = Ru
    return Rx, Ry


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def data():
    X, Y, U, A = make_data()
    rng = np.random.default_rng(1)
    Xte = np.tanh(rng.normal(size=(30, 3)) @ A) + 0.3 * rng.normal(size=(30, 5))
    C = rng.normal(size=(25, 3))
    return X, Y, Xte, C


# -- exactness ------------------------------------------------------------------------------------------------
def test_iokr_equals_the_naive_closed_form(data):
    X, Y, Xte, C = data
    lam = 1e-3
    model = IOKR(input_kernel=IN, output_kernel=OUT, lam=lam, device="cpu").fit(list(X), list(Y))
    assert model.n_unique_ == 60 and model.n_train_ == 240
    assert rel_err(model.score(list(Xte), list(C)), naive_iokr_scores(X, Y, Xte, C, lam)) < 1e-6


def test_sisokr_with_identity_equivalent_sketches_reproduces_iokr(data):
    X, Y, Xte, C = data
    lam = 1e-3
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch=f"subsample:m={len(X)}",
                   output_sketch="subsample:m=100000", lam=lam, device="cpu").fit(list(X), list(Y))
    assert model.rank_ == {"input": 240, "output": 60}
    assert rel_err(model.score(list(Xte), list(C)), naive_iokr_scores(X, Y, Xte, C, lam)) < 1e-6


@pytest.mark.parametrize("model_cls,input_sketch,output_sketch", [
    (SISOKR, "subsample:m=50", "p-sparsified-rademacher:m=25"),
    (SISOKR, "gaussian:m=40", "accumulation:m=20,M=4"),
    (SISOKR, "p-sparsified-gaussian:m=60", "subsample:m=30,probs=leverage"),
    (SISOKR, "adaptive:m=30", "adaptive:m=15"),
    (SIOKR, "accumulation:m=45", None),
    (ISOKR, None, "p-sparsified-gaussian:m=20"),
])
def test_sketched_models_equal_the_naive_pseudo_inverse_formula(data, model_cls, input_sketch, output_sketch):
    X, Y, Xte, C = data
    lam = 1e-3
    params = {"input_sketch": input_sketch} if input_sketch else {}
    if output_sketch:
        params["output_sketch"] = output_sketch
    model = model_cls(input_kernel=IN, output_kernel=OUT, lam=lam, device="cpu", seed=4, **params)
    model.fit(list(X), list(Y))
    Rx, Ry = dense_sketches(model, X, Y, seed=4)
    expected = naive_sisokr_scores(X, Y, Xte, C, lam, Rx, Ry)
    assert rel_err(model.score(list(Xte), list(C)), expected) < 1e-6


def test_unique_output_side_equals_the_naive_one_with_duplicates(data):
    """The model works on 60 distinct structures; the naive form uses the 240 x 240 K_y with duplicates."""
    X, Y, Xte, C = data
    lam = 1e-2
    assert len(distinct_positions(list(Y))[0]) == 60
    for model in (IOKR(input_kernel=IN, output_kernel=OUT, lam=lam, device="cpu"),
                  SIOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=70", lam=lam,
                        device="cpu")):
        model.fit(list(X), list(Y))
        assert model.n_coordinates == 60  # one coordinate per distinct structure
        Rx, _ = dense_sketches(model, X, Y, seed=0)
        naive = naive_sisokr_scores(X, Y, Xte, C, lam, Rx, np.eye(len(X)))  # R_y = I_n, K_y singular
        assert rel_err(model.score(list(Xte), list(C)), naive) < 1e-6


def test_input_landmarks_spread_over_the_structures_and_match_the_naive_formula(data):
    """``subsample:probs=groups`` on the input side: SISOKR hands the sketch each input's structure, so 60
    landmarks cover the 60 structures (a uniform draw of 60 of the 240 inputs covers ~40); the model equals the
    naive formula with that R_x."""
    X, Y, Xte, C = data
    spec = "subsample:m=60,probs=groups"
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch=spec, output_sketch="subsample:m=30",
                   lam=1e-3, device="cpu").fit(list(X), list(Y))
    _, structure = distinct_positions(list(Y))
    drawn = make_sketch(spec, seed=0).fit(len(X), create("input_kernel", IN).fit(list(X)), groups=structure)
    assert len(set(structure[drawn.used_])) == 60
    landmarks = np.array(model.input_landmarks_)
    np.testing.assert_array_equal(landmarks, X[drawn.used_])
    _, Ry = dense_sketches(model, X, Y, seed=0)
    naive = naive_sisokr_scores(X, Y, Xte, C, 1e-3, drawn.matrix(), Ry)
    assert rel_err(model.score(list(Xte), list(C)), naive) < 1e-6
    uniform = make_sketch("subsample:m=60", seed=0).fit(len(X)).used_
    assert len(set(structure[uniform])) < 55


def test_ridge_structure_weights_by_hand():
    from molpredict.models.okr import ridge_structure_weights
    # counts 1 and 4: count^-0.5 = 1 and 1/2, scaled so the 5 objects' weights sum to 5 (raw sum 1 + 4/2 = 3)
    np.testing.assert_allclose(ridge_structure_weights(np.array([0, 1, 1, 1, 1]), 0.5), [5 / 3, 5 / 6], rtol=1e-12)
    np.testing.assert_allclose(ridge_structure_weights(np.array([0, 1, 1, 1, 1]), 1.0), [2.5, 2.5 / 4], rtol=1e-12)
    np.testing.assert_allclose(ridge_structure_weights(np.array([2, 0, 1, 1]), 0.0), [1, 1, 1], rtol=1e-12)


def test_structure_balance_equals_the_naive_weighted_formula(data):
    """``structure_balance``: the ridge's square loss weights each object count^-balance (its structure's count);
    the model equals the naive weighted formula, balance 0 is the plain ridge bit for bit, and an exact input side
    refuses it."""
    from molpredict.models.okr import ridge_structure_weights
    X, Y, Xte, C = data
    params = dict(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=70",
                  output_sketch="subsample:m=30", lam=1e-3, device="cpu")
    model = SISOKR(structure_balance=0.5, **params).fit(list(X), list(Y))
    _, structure = distinct_positions(list(Y))
    weights = ridge_structure_weights(structure, 0.5)[structure]
    assert weights.std() > 0.1  # the structures have different counts here
    Rx, Ry = dense_sketches(model, X, Y, seed=0)
    naive = naive_sisokr_scores(X, Y, Xte, C, 1e-3, Rx, Ry, weights)
    scores = model.score(list(Xte), list(C))
    assert rel_err(scores, naive) < 1e-6
    assert rel_err(scores, naive_sisokr_scores(X, Y, Xte, C, 1e-3, Rx, Ry)) > 1e-3  # the weights change it
    plain, zero = (SISOKR(**params).fit(list(X), list(Y)),
                   SISOKR(structure_balance=0.0, **params).fit(list(X), list(Y)))
    np.testing.assert_array_equal(plain.W_, zero.W_)
    assert _roundtrip(model).structure_balance == 0.5
    with pytest.raises(SpecError, match="structure_balance must be a number in"):
        SISOKR(structure_balance=2.0)
    with pytest.raises(SpecError, match="structure_balance needs a sketched input side"):
        SISOKR(structure_balance=0.5, **dict(params, input_sketch="none")).fit(list(X), list(Y))


def test_duplicate_inputs_in_the_sub_sample_do_not_break_anything():
    X, Y, _, A = make_data(n=150, n_structures=40, seed=3)
    X[75:] = X[:75]  # every input twice: K~_x is singular for any sub-sample holding both copies
    rng = np.random.default_rng(2)
    Xte, C = rng.normal(size=(10, 5)), rng.normal(size=(12, 3))
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=120",
                   output_sketch="subsample:m=30", lam=1e-3, device="cpu").fit(list(X), list(Y))
    assert model.rank_["input"] < 120  # the duplicated landmarks were cut
    scores = model.score(list(Xte), list(C))
    assert np.all(np.isfinite(scores))
    Rx, Ry = dense_sketches(model, X, Y, seed=0)
    assert rel_err(scores, naive_sisokr_scores(X, Y, Xte, C, 1e-3, Rx, Ry)) < 1e-6


def test_rank_deficient_linear_input_kernel():
    X, Y, _, _ = make_data(n=100, n_structures=30, seed=5)
    model = SISOKR(input_kernel="vec-linear", output_kernel=OUT, input_sketch="subsample:m=40",
                   output_sketch="subsample:m=20", lam=1e-4, device="cpu").fit(list(X), list(Y))
    assert model.rank_["input"] == 5  # a linear kernel in R^5
    assert np.all(np.isfinite(model.score(list(X[:5]), list(Y[:5]))))


# -- selection -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_cls,sketches", [
    (SISOKR, {"input_sketch": "subsample:m=150", "output_sketch": "p-sparsified-rademacher:m=40"}),
    (SIOKR, {"input_sketch": "subsample:m=150"}),
    (ISOKR, {"output_sketch": "p-sparsified-rademacher:m=40"}),
    (IOKR, {}),
])
def test_lam_grid_selection_picks_the_validation_minimum(model_cls, sketches):
    X, Y, U, A = make_data(n=300, n_structures=80, seed=6, noise=0.5)
    rng = np.random.default_rng(7)
    Uv = rng.normal(size=(60, 3))
    Xv = np.tanh(Uv @ A) + 0.5 * rng.normal(size=(60, 5))
    grid = "1e-9|1e-6|1e-4|1e-2|1|100"
    model = model_cls(input_kernel=IN, output_kernel=OUT, lam=grid, device="cpu", **sketches)
    model.fit(list(X), list(Y), val=(list(Xv), list(Uv)))
    losses = np.array(model.val_loss_)
    sel = model.selection_
    assert sel["source"] == "val" and len(sel["points"]) == 6
    assert sel["best"] == int(np.argmin(losses))
    assert model.lam_ == sel["points"][sel["best"]]["lam"]
    assert 0 < sel["best"] < 5  # neither the interpolating nor the constant end of the grid
    assert losses[sel["best"]] < min(losses[0], losses[-1])
    # the selection loss (whitened coordinates) equals kernel_loss (dot-product coordinates)
    assert model.kernel_loss(list(Xv), list(Uv)) == pytest.approx(losses[sel["best"]], rel=1e-8)
    # losses are genuine kernel losses: in [0, 4] for a normalised kernel, and better than predicting 0 (= 2)
    assert np.all(losses >= 0) and losses.min() < 2.0


def test_kernel_parameter_grids_are_searched():
    X, Y, U, A = make_data(n=200, n_structures=50, seed=8)
    rng = np.random.default_rng(9)
    Uv = rng.normal(size=(30, 3))
    Xv = np.tanh(Uv @ A) + 0.3 * rng.normal(size=(30, 5))
    model = SIOKR(input_kernel="vec-rbf:gamma=0.01|0.2|auto", output_kernel=OUT, input_sketch="subsample:m=80",
                  lam="1e-4|1e-2", device="cpu").fit(list(X), list(Y), val=(list(Xv), list(Uv)))
    points = model.selection_["points"]
    assert len(points) == 6
    assert {p["input_kernel"] for p in points} == {"vec-rbf:gamma=0.01", "vec-rbf:gamma=0.2", "vec-rbf:gamma=auto"}
    best = points[model.selection_["best"]]
    assert best["val_loss"] == min(p["val_loss"] for p in points)
    # the fitted kernel carries the resolved value, never "auto"
    assert "auto" not in model.input_kernel_spec_
    assert parse_spec(model.input_kernel_spec_).params["gamma"] == pytest.approx(model.input_kernel_.gamma_)


def test_held_out_selection_without_val_refits_on_everything():
    X, Y, _, _ = make_data(n=200, n_structures=50, seed=10)
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=60",
                   output_sketch="subsample:m=25", lam="1e-6|1e-3|1", device="cpu").fit(list(X), list(Y))
    assert model.selection_["source"] == "held-out"
    assert model.n_train_ == 200 and model.n_unique_ == 50
    assert model.lam_ == model.selection_["points"][model.selection_["best"]]["lam"]
    single = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=60",
                    output_sketch="subsample:m=25", lam=model.lam_, device="cpu").fit(list(X), list(Y))
    assert single.selection_["source"] == "none"
    assert np.allclose(single.W_, model.W_)


def test_split_by_structure_keeps_structures_on_one_side():
    Y = [np.array([float(i % 7)]) for i in range(50)]
    train, held = split_by_structure(Y, 0.3, seed=0)
    assert len(train) + len(held) == 50 and len(held) > 0
    assert not {float(Y[i][0]) for i in train} & {float(Y[i][0]) for i in held}
    assert np.array_equal(split_by_structure(Y, 0.3, seed=0)[1], held)


def test_lam_grid_parsing():
    assert lam_grid("1e-6|1e-3") == [1e-6, 1e-3]
    assert lam_grid(0.5) == [0.5] and lam_grid("2") == [2.0]
    with pytest.raises(SpecError):
        lam_grid("0|1")
    with pytest.raises(SpecError):
        lam_grid("abc")


# -- state, coordinates, blocks ---------------------------------------------------------------------------------
def _roundtrip(model):
    arrays, metadata = model.get_state()
    assert all(isinstance(v, np.ndarray) for v in arrays.values())
    metadata = json.loads(json.dumps(metadata))  # must be JSON
    return type(model).from_state({k: v.copy() for k, v in arrays.items()}, metadata)


def test_save_and_reload_scores_identically_with_resolved_gamma(data):
    X, Y, Xte, C = data
    model = SISOKR(input_kernel="vec-rbf:gamma=auto", output_kernel="vec-rbf-out:gamma=auto",
                   input_sketch="subsample:m=60", output_sketch="p-sparsified-rademacher:m=30", lam=1e-3,
                   device="cpu").fit(list(X), list(Y))
    reloaded = _roundtrip(model)
    assert np.array_equal(reloaded.score(list(Xte), list(C)), model.score(list(Xte), list(C)))
    assert reloaded.coordinates_key() == model.coordinates_key()
    assert reloaded.output_kernel_.gamma_ == model.output_kernel_.gamma_
    arrays, metadata = model.get_state()
    assert {"W", "input_landmarks.vectors", "output_landmarks.vectors", "output_A_data"} <= set(arrays)
    assert metadata["output"]["sketch"].startswith("p-sparsified-rademacher")
    # a file of state version 1 (landmark arrays "prefix" / "prefix_*", "values" for text) still loads
    legacy_arrays = {k.replace(".vectors", ""): v for k, v in arrays.items()}
    legacy = json.loads(json.dumps(metadata))
    legacy["version"] = 1
    for side in ("input", "output"):
        legacy[side]["landmarks"] = {"type": "array"}
    old = SISOKR.from_state(legacy_arrays, legacy)
    assert np.array_equal(old.score(list(Xte), list(C)), model.score(list(Xte), list(C)))
    legacy["version"] = 3
    with pytest.raises(ModelFileError, match="version 3"):
        SISOKR.from_state(legacy_arrays, legacy)


def test_iokr_state_round_trip(data):
    X, Y, Xte, C = data
    model = IOKR(input_kernel=IN, output_kernel=OUT, lam=1e-3, device="cpu").fit(list(X), list(Y))
    reloaded = _roundtrip(model)
    assert isinstance(reloaded, IOKR)
    assert np.array_equal(reloaded.score(list(Xte), list(C)), model.score(list(Xte), list(C)))
    assert model.get_state()[1]["output"]["sketch"] == "identity"


def test_round_trip_with_spectra_and_molecules():
    from molpredict.chem.molecules import Molecule
    from molpredict.spectra.record import Spectrum
    smiles = ["CCO", "CCN", "c1ccccc1", "CC(=O)O", "CCCC", "OCC(O)CO", "c1ccncc1", "CC(C)O"]
    rng = np.random.default_rng(0)
    spectra, labels = [], []
    for i in range(40):
        j = i % len(smiles)
        mz = np.sort(rng.uniform(20, 480, size=6) + 10 * j)
        spectra.append(Spectrum(id=f"s{i}", mz=mz, intensities=rng.uniform(1, 100, size=6), precursor_mz=500.0,
                                charge=1, ion_mode="positive", adduct="[M+H]+"))
        labels.append(Molecule.from_smiles(smiles[j]))
    model = SISOKR(input_kernel="binned", output_kernel="fp-tanimoto", input_sketch="subsample:m=20",
                   output_sketch="subsample:m=5", lam=1e-2, device="cpu").fit(spectra, labels)
    assert model.n_unique_ == 8
    candidates = [Molecule.from_smiles(s) for s in smiles + ["CCCCO", "NCCO"]]
    reloaded = _roundtrip(model)
    assert np.array_equal(reloaded.score(spectra[:7], candidates), model.score(spectra[:7], candidates))
    arrays, metadata = model.get_state()
    assert len(metadata["output"]["landmarks"]["smiles"]) == 5
    assert "input_landmarks.mz" in arrays and "input_landmarks.offsets" in arrays
    # version 1 wrote the spectra arrays as "input_landmarks_*"
    legacy = json.loads(json.dumps(metadata))
    legacy["version"] = 1
    old = SISOKR.from_state({k.replace("input_landmarks.", "input_landmarks_"): v for k, v in arrays.items()},
                            legacy)
    assert np.array_equal(old.score(spectra[:7], candidates), model.score(spectra[:7], candidates))


def test_coordinates_key_depends_on_the_output_side_only(data):
    X, Y, _, _ = data
    base = dict(input_kernel=IN, output_kernel=OUT, output_sketch="p-sparsified-rademacher:m=30", device="cpu")
    a = SISOKR(input_sketch="subsample:m=50", lam=1e-3, **base).fit(list(X), list(Y))
    b = SISOKR(input_sketch="subsample:m=70", lam=1e-1, **base).fit(list(X), list(Y))
    c = SISOKR(input_sketch="subsample:m=50", lam=1e-3, seed=5, **base).fit(list(X), list(Y))
    assert a.coordinates_key() == b.coordinates_key()
    assert a.coordinates_key() != c.coordinates_key()  # another output sketch draw


def test_coordinates_are_the_dot_product_form(data):
    X, Y, Xte, C = data
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=50",
                   output_sketch="p-sparsified-rademacher:m=20", lam=1e-3, device="cpu").fit(list(X), list(Y))
    coords = model.candidate_coordinates(list(C))
    assert coords.shape == (25, 20) and model.predict_coordinates(list(Xte)).shape == (30, 20)
    # candidate coordinates are R_y K_y(train, c) (on distinct structures)
    _, Ry = dense_sketches(model, X, Y, seed=0)
    assert np.allclose(coords, (Ry @ k(Y, C, GY)).T)
    assert len(model.input_landmarks_) == 50 and len(model.output_landmarks_) == model.output_A_.shape[1]


def test_prediction_in_blocks(data, monkeypatch):
    import molpredict.models.okr as okr
    X, Y, Xte, C = data
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=50",
                   output_sketch="subsample:m=20", lam=1e-3, device="cpu").fit(list(X), list(Y))
    whole = model.score(list(Xte), list(C))
    monkeypatch.setattr(okr, "_BLOCK_BYTES", 8 * 50 * 4)  # 4 rows per block
    assert np.allclose(model.score(list(Xte), list(C)), whole, rtol=1e-12, atol=1e-14)


def test_float32_products_agree_with_float64(data):
    X, Y, Xte, C = data
    params = dict(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=50",
                  output_sketch="subsample:m=20", lam=1e-2, device="cpu")
    s64 = SISOKR(**params).fit(list(X), list(Y)).score(list(Xte), list(C))
    s32 = SISOKR(dtype="float32", **params).fit(list(X), list(Y)).score(list(Xte), list(C))
    assert rel_err(s32, s64) < 1e-3


def test_float32_prediction_product_of_a_float64_model(data):
    # identification asks for float32 coordinates (scoring.SCORING_DTYPE): the product K W runs in float32
    X, Y, Xte, C = data
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=50",
                   output_sketch="subsample:m=20", lam=1e-2, device="cpu").fit(list(X), list(Y))
    wide = model.predict_coordinates(list(Xte))
    narrow = model.predict_coordinates_as(list(Xte), np.float32)
    assert wide.dtype == np.float64 and narrow.dtype == np.float32 and narrow.shape == wide.shape
    assert rel_err(narrow.astype(np.float64), wide) < 1e-5
    np.testing.assert_array_equal(model.predict_coordinates_as(list(Xte), np.float64), wide)


# -- resources and devices -------------------------------------------------------------------------------------
def test_iokr_refuses_past_the_memory_budget(data):
    X, Y, _, _ = data
    with pytest.raises(ResourceError, match="240 x 240 input Gram"):
        IOKR(input_kernel=IN, output_kernel=OUT, lam=1e-3, max_memory_gb=1e-4).fit(list(X), list(Y))
    # the same budget is enough once the input side is sketched
    SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=10", output_sketch="subsample:m=5",
           lam=1e-3, max_memory_gb=1e-3, device="cpu").fit(list(X), list(Y))


def test_device_resolution():
    import torch
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("float32") == torch.float32 and resolve_dtype("float64") == torch.float64
    with pytest.raises(SpecError):
        resolve_device("tpu")
    with pytest.raises(SpecError):
        resolve_dtype("int8")
    if not torch.cuda.is_available():
        with pytest.raises(ResourceError, match="no CUDA device"):
            resolve_device("cuda")


def test_models_are_components_with_json_parameters():
    for name, cls in (("iokr", IOKR), ("siokr", SIOKR), ("isokr", ISOKR), ("sisokr", SISOKR)):
        model = create("model", name)
        assert isinstance(model, cls)
        assert all(v is None or isinstance(v, (bool, int, float, str)) for v in model.get_params().values())
    assert "input_sketch" not in IOKR.param_names() and "output_sketch" not in SIOKR.param_names()
    assert SISOKR().input_sketch == "subsample:m=4000"
    assert SISOKR().output_sketch == "subsample:m=5000"


def test_resolved_kernel_spec():
    kernel = create("input_kernel", "vec-rbf:gamma=auto").fit([np.zeros(2), np.ones(2), np.arange(2.0)])
    spec = parse_spec(str(frozen_spec(kernel)))
    assert spec.name == "vec-rbf" and spec.params["gamma"] == kernel.gamma_


@pytest.mark.cuda
def test_cuda_matches_cpu(data):
    X, Y, Xte, C = data
    params = dict(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=50",
                  output_sketch="p-sparsified-rademacher:m=20", lam=1e-3)
    cpu = SISOKR(device="cpu", **params).fit(list(X), list(Y))
    gpu = SISOKR(device="cuda", **params).fit(list(X), list(Y))
    assert rel_err(gpu.score(list(Xte), list(C)), cpu.score(list(Xte), list(C))) < 1e-8


def _validation_with_decoys(A: np.ndarray, n_val: int, n_decoys: int, seed: int):
    """Validation inputs of make_data's generator (``A``) and a candidate pool: each validation structure followed
    by ``n_decoys`` perturbed copies of it. Returns (Uv (n_val, 3), Xv (n_val, 5), pool (n_val * (n_decoys + 1), 3))."""
    rng = np.random.default_rng(seed)
    Uv = rng.normal(size=(n_val, 3))
    Xv = np.tanh(Uv @ A) + 0.5 * rng.normal(size=(n_val, 5))
    pool = np.concatenate([np.vstack([u, u + 0.6 * rng.normal(size=(n_decoys, 3))]) for u in Uv])
    return Uv, Xv, pool


@pytest.mark.parametrize("model_cls,sketches", [
    (SISOKR, {"input_sketch": "subsample:m=150", "output_sketch": "p-sparsified-rademacher:m=40"}),
    (IOKR, {}),
])
def test_ranking_selection_equals_decoding_each_grid_point(model_cls, sketches):
    """select_by=mrr scores every grid point by the MRR of the truth in validation candidate sets; each recorded
    MRR must equal the MRR of a model fitted at that lam alone and decoded through ``score`` (the naive route)."""
    from molpredict.engine.decoding import ranking_metrics
    from molpredict.models.base import CandidateSets, ValidationData

    X, Y, U, A = make_data(n=300, n_structures=80, seed=6, noise=0.5)
    # candidates: each validation structure and 9 perturbed decoys of it (shared pool, truth = index 10 i)
    Uv, Xv, pool = _validation_with_decoys(A, 40, 9, seed=7)
    sets = [np.arange(10 * i, 10 * i + 10) for i in range(40)]
    truth = [np.arange(10) == 0 for _ in range(40)]
    positions = np.arange(0, 40, 2)  # only every other validation input ranks (the others have no set)
    candidates = CandidateSets(list(pool), [sets[p] for p in positions], [truth[p] for p in positions], positions)
    grid = [1e-9, 1e-4, 1e-2, 1.0]
    ridge_only = {"rank_epochs": 0} if model_cls is SISOKR else {}  # each grid point's ridge solution, as recorded
    model = model_cls(input_kernel=IN, output_kernel=OUT, lam="|".join(map(str, grid)), device="cpu",
                      select_by="mrr", **sketches, **ridge_only)
    model.fit(list(X), list(Y), val=ValidationData(list(Xv), list(Uv), candidates))
    points = model.selection_["points"]
    assert model.selection_["select_by"] == "mrr"
    naive = []
    for lam in grid:
        single = model_cls(input_kernel=IN, output_kernel=OUT, lam=lam, device="cpu", **sketches)
        single.fit(list(X), list(Y))
        scores = single.score([Xv[p] for p in positions], list(pool))
        flat = np.concatenate([scores[j, sets[p]] for j, p in enumerate(positions)])
        offsets = np.arange(0, 10 * len(positions) + 1, 10)
        naive.append(ranking_metrics(flat, offsets, np.concatenate([truth[p] for p in positions]))["mrr"])
    assert [p["val_mrr"] for p in points] == pytest.approx(naive, abs=1e-9)
    assert model.selection_["best"] == int(np.argmax(naive))
    assert len(set(np.round(naive, 6))) > 1  # the grid points rank differently: the test can tell them apart


def test_scored_only_sets_are_scored_but_do_not_choose_the_grid_point():
    """Sets flagged not ``ranked`` (the calibration's mass-window sets) get scores in the grid's one pass, equal to
    the model's own decoding, while each grid point's metric is the one of the ranked sets alone."""
    from molpredict.engine.decoding import ranking_metrics
    from molpredict.models.base import CandidateSets, ValidationData

    X, Y, U, A = make_data(n=300, n_structures=80, seed=6, noise=0.5)
    Uv, Xv, pool = _validation_with_decoys(A, 20, 7, seed=9)
    ranked_sets = [np.arange(8 * p, 8 * p + 8) for p in range(20)]
    # scored-only sets: the truth among the decoys of another structure (an easy set), for the first 10 inputs
    extra_sets = [np.r_[8 * p, np.arange(8 * ((p + 1) % 20) + 1, 8 * ((p + 1) % 20) + 8)] for p in range(10)]
    sets = ranked_sets + extra_sets
    truth = [np.arange(8) == 0 for _ in sets]
    positions = np.r_[np.arange(20), np.arange(10)]
    ranked = np.r_[np.ones(20, bool), np.zeros(10, bool)]
    params = dict(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=150",
                  output_sketch="p-sparsified-rademacher:m=40", lam="1e-6|1e-3|1e-1", device="cpu", rank_epochs=0)
    both = SISOKR(**params).fit(list(X), list(Y), val=ValidationData(
        list(Xv), list(Uv), CandidateSets(list(pool), sets, truth, positions, ranked)))
    alone = SISOKR(**params).fit(list(X), list(Y), val=ValidationData(
        list(Xv), list(Uv), CandidateSets(list(pool), ranked_sets, truth[:20], np.arange(20))))
    assert [p["val_mrr"] for p in both.selection_["points"]] == \
        pytest.approx([p["val_mrr"] for p in alone.selection_["points"]], abs=1e-12)
    scores = both.score(list(Xv), list(pool))
    naive = np.concatenate([scores[q, s] for q, s in zip(positions, sets)])
    assert rel_err(both.validation_scores_, naive) < 1e-5
    offsets = np.arange(0, 8 * 20 + 1, 8)
    with_extra = ranking_metrics(naive, np.arange(0, 8 * 30 + 1, 8), np.concatenate(truth))["mrr"]
    best = both.selection_["points"][both.selection_["best"]]["val_mrr"]
    assert ranking_metrics(naive[:160], offsets, np.concatenate(truth[:20]))["mrr"] == pytest.approx(best, abs=1e-5)
    assert abs(with_extra - best) > 1e-3  # counting the scored-only sets would give another metric
    with pytest.raises(ValueError):
        CandidateSets(list(pool), sets, truth, positions, np.zeros(30, bool))


def test_select_by_rejects_unknown_metrics():
    with pytest.raises(SpecError):
        SISOKR(select_by="accuracy")


def test_validation_scores_are_the_chosen_points_decoding():
    """The grid search keeps the scores its chosen grid point gave the validation candidates
    (``validation_scores_``, flat in the order of ``CandidateSets.flat()``): they must equal the fitted model's own
    scores (``score``, the decoding identification uses) up to the float32 of the grid's products, rank the truth
    as the recorded metric says, and be what the fusion is fitted on (shared_validation_terms)."""
    from molpredict.engine.decoding import ranking_metrics
    from molpredict.models.base import CandidateSets, ValidationData
    from molpredict.modelfile import SubModel
    from molpredict.training.ranking_validation import shared_validation_terms

    X, Y, U, A = make_data(n=300, n_structures=80, seed=6, noise=0.5)
    Uv, Xv, pool = _validation_with_decoys(A, 30, 7, seed=8)
    positions = np.arange(0, 30, 3)
    sets = [np.arange(8 * p, 8 * p + 8) for p in positions]
    truth = [np.arange(8) == 0 for _ in positions]
    candidates = CandidateSets(list(pool), sets, truth, positions)
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=150",
                   output_sketch="p-sparsified-rademacher:m=40", lam="1e-6|1e-3|1e-1", device="cpu")
    val = ValidationData(list(Xv), list(Uv), candidates)
    model.fit(list(X), list(Y), val=val)
    offsets, flat, is_true = candidates.flat()
    kept = model.validation_scores_
    assert kept.shape == flat.shape
    scores = model.score([Xv[p] for p in positions], list(pool))
    naive = np.concatenate([scores[j, s] for j, s in enumerate(sets)])
    assert rel_err(kept, naive) < 1e-5
    best = model.selection_["points"][model.selection_["best"]]
    assert ranking_metrics(kept, offsets, is_true)["mrr"] == pytest.approx(best["val_mrr"], abs=1e-12)

    class Labels:  # the labels' InChIKey first blocks group the queries (folds by structure)
        def __init__(self, u):
            self.inchikey14 = f"S{int(np.argmin(np.abs(Uv - u).sum(1)))}"

    sub = SubModel(model=model, ion_mode="positive", cleaning=None, adducts=[])
    terms = shared_validation_terms(sub, ValidationData(list(Xv), [Labels(u) for u in Uv], candidates))
    np.testing.assert_array_equal(terms.offsets, offsets)
    np.testing.assert_array_equal(terms.is_true, is_true)
    np.testing.assert_array_equal(terms.terms["spectrum"], kept)
    assert terms.groups == [f"S{p}" for p in positions]
    assert terms.one_formula is None  # vector outputs have no formula: the calibration cannot read the set's kind
    # no scores kept (no ranking-aware selection) or the fragment term wanted: the caller scores the sets itself
    assert shared_validation_terms(sub, val, ["fragments"]) is None
    plain = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=150", lam="1e-3", device="cpu")
    plain.fit(list(X), list(Y), val=(list(Xv), list(Uv)))
    assert getattr(plain, "validation_scores_", None) is None


@pytest.mark.cuda
def test_cuda_validation_scores_match_cpu():
    """The shared validation pass on a GPU: the kept candidate scores equal the CPU fit's (float32 products)."""
    from molpredict.models.base import CandidateSets, ValidationData

    X, Y, U, A = make_data(n=300, n_structures=80, seed=6, noise=0.5)
    rng = np.random.default_rng(9)
    Uv = rng.normal(size=(20, 3))
    Xv = np.tanh(Uv @ A) + 0.5 * rng.normal(size=(20, 5))
    pool = np.concatenate([np.vstack([u, u + 0.6 * rng.normal(size=(5, 3))]) for u in Uv])
    candidates = CandidateSets(list(pool), [np.arange(6 * i, 6 * i + 6) for i in range(20)],
                               [np.arange(6) == 0 for _ in range(20)])
    params = dict(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=150",
                  output_sketch="p-sparsified-rademacher:m=40", lam="1e-4|1e-2",
                  rank_epochs=0)  # the grid's pass; the fine-tune's own GPU test is below
    cpu = SISOKR(device="cpu", **params).fit(list(X), list(Y), val=ValidationData(list(Xv), list(Uv), candidates))
    gpu = SISOKR(device="cuda", **params).fit(list(X), list(Y), val=ValidationData(list(Xv), list(Uv), candidates))
    assert gpu.selection_["best"] == cpu.selection_["best"]
    assert rel_err(gpu.validation_scores_, cpu.validation_scores_) < 1e-5


def test_the_ranking_fine_tune_ranks_validation_better_and_decodes_as_it_recorded():
    """SISOKR's ranking fine-tune (``rank_epochs``): the chosen point's recorded MRR is the fine-tuned model's
    own decoding (``score``) of the validation sets, no lower than the ridge solution's (kept beside it), and
    higher here; ``validation_scores_`` are that model's scores; the saved model decodes the same; without
    validation candidate sets nothing is fine-tuned (the ridge solution, bit for bit)."""
    from molpredict.engine.decoding import ranking_metrics
    from molpredict.models.base import CandidateSets, ValidationData

    X, Y, U, A = make_data(n=300, n_structures=80, seed=6, noise=0.5)
    Uv, Xv, pool = _validation_with_decoys(A, 40, 9, seed=7)
    sets = [np.arange(10 * i, 10 * i + 10) for i in range(40)]
    truth = [np.arange(10) == 0 for _ in range(40)]
    val = ValidationData(list(Xv), list(Uv), CandidateSets(list(pool), sets, truth, np.arange(40)))
    params = dict(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=150", output_sketch="subsample:m=40",
                  lam="1e-4|1e-2", device="cpu", rank_lr=1e-2)
    ridge = SISOKR(rank_epochs=0, **params).fit(list(X), list(Y), val=val)
    tuned = SISOKR(rank_epochs=5, **params).fit(list(X), list(Y), val=val)
    point = tuned.selection_["points"][tuned.selection_["best"]]
    ridge_point = ridge.selection_["points"][ridge.selection_["best"]]
    assert "finetune" not in ridge_point
    assert point["finetune"]["ridge"]["val_mrr"] == pytest.approx(ridge_point["val_mrr"], abs=1e-12)
    assert point["val_mrr"] > ridge_point["val_mrr"] + 0.01 and point["finetune"]["improved"]
    scores = tuned.score(list(Xv), list(pool))
    naive = np.concatenate([scores[i, s] for i, s in enumerate(sets)])
    assert rel_err(tuned.validation_scores_, naive) < 1e-5
    offsets = np.arange(0, 401, 10)
    assert ranking_metrics(naive, offsets, np.concatenate(truth))["mrr"] == pytest.approx(point["val_mrr"], abs=1e-6)
    assert point["val_loss"] == pytest.approx(tuned.kernel_loss(list(Xv), list(Uv)), rel=1e-6)
    assert not np.allclose(tuned.W_, ridge.W_)
    loaded = _roundtrip(tuned)  # JSON metadata, the fine-tune's history included
    assert loaded.rank_epochs == 5 and loaded.selection_["points"][loaded.selection_["best"]]["finetune"]
    assert rel_err(loaded.score(list(Xv), list(pool)), scores) < 1e-10
    # what `molpredict train` says of it
    from molpredict.training.pipeline import _finetune_line, _finetune_summary
    said = _finetune_summary(tuned)
    assert said["kept"] and said["ridge"] == pytest.approx(ridge_point["val_mrr"], abs=1e-12)
    assert said["best"] == pytest.approx(point["val_mrr"], abs=1e-6)
    assert f"{said['ridge']:.4f} -> {said['best']:.4f}" in _finetune_line(said) and "kept" in _finetune_line(said)
    strict = SISOKR(rank_epochs=5, rank_min_gain=1.0, **params).fit(list(X), list(Y), val=val)
    np.testing.assert_array_equal(strict.W_, ridge.W_)  # no check gains 1.0 of MRR: the ridge solution stands
    assert not _finetune_summary(strict)["kept"] and "not kept" in _finetune_line(_finetune_summary(strict))
    assert _finetune_summary(ridge) is None
    no_sets = SISOKR(rank_epochs=5, **params).fit(list(X), list(Y), val=(list(Xv), list(Uv)))
    plain = SISOKR(rank_epochs=0, **params).fit(list(X), list(Y), val=(list(Xv), list(Uv)))
    np.testing.assert_array_equal(no_sets.W_, plain.W_)


@pytest.mark.cuda
def test_cuda_ranking_fine_tune_decodes_as_it_recorded():
    """The fine-tune on a GPU (its features, outputs and Adam steps there): the recorded validation MRR is the
    fitted model's own decoding, and no lower than the ridge solution's."""
    from molpredict.engine.decoding import ranking_metrics
    from molpredict.models.base import CandidateSets, ValidationData

    X, Y, U, A = make_data(n=300, n_structures=80, seed=6, noise=0.5)
    Uv, Xv, pool = _validation_with_decoys(A, 40, 9, seed=7)
    sets = [np.arange(10 * i, 10 * i + 10) for i in range(40)]
    truth = [np.arange(10) == 0 for _ in range(40)]
    val = ValidationData(list(Xv), list(Uv), CandidateSets(list(pool), sets, truth, np.arange(40)))
    model = SISOKR(input_kernel=IN, output_kernel=OUT, input_sketch="subsample:m=150",
                   output_sketch="subsample:m=40", lam="1e-4|1e-2", device="cuda", rank_epochs=5,
                   rank_lr=1e-2).fit(list(X), list(Y), val=val)
    point = model.selection_["points"][model.selection_["best"]]
    assert point["val_mrr"] >= point["finetune"]["ridge"]["val_mrr"]
    scores = model.score(list(Xv), list(pool))
    naive = np.concatenate([scores[i, s] for i, s in enumerate(sets)])
    assert ranking_metrics(naive, np.arange(0, 401, 10), np.concatenate(truth))["mrr"] == \
        pytest.approx(point["val_mrr"], abs=1e-5)
