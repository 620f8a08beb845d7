"""The fingerprint likelihood head (molpredict.models.fingerprint_head) and SISOKR with it: the Platt scalings
against a reference logistic fit, the head's ridge against a naive one in the Nystrom feature space, the score
it adds against its definition (the log-likelihood of the candidate's bits, up to a per-query constant), and the
saved model."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.optimize import minimize

from molpredict.chem.molecules import Molecule, fingerprint_matrix
from molpredict.errors import ModelFileError
from molpredict.models.base import CandidateSets, ValidationData
from molpredict.models.fingerprint_head import (LOGIT_LIMIT, FingerprintHead, candidate_bits, head_logits,
                                                platt_columns)
from molpredict.models.okr import SISOKR
from molpredict.registry import Registry, reset_registry
from tests.test_okr import TestKernels

GX = 0.02


@pytest.fixture(autouse=True)
def _test_kernels():
    reset_registry(Registry(load_external=False, extra_plugins=[TestKernels()]))
    yield
    reset_registry()


def test_platt_columns_match_a_reference_logistic_fit_per_column():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(400, 3)) * [1.0, 5.0, 0.1] + [0.0, 2.0, -1.0]
    y = (rng.random((400, 3)) < 1 / (1 + np.exp(-(z * [2.0, -0.5, 8.0] + [0.5, 0.0, 7.0])))).astype(float)
    w = rng.uniform(0.5, 2.0, 400)
    a, c = platt_columns(z, y, w, l2=0.0, iterations=50)
    for b in range(3):
        def loss(p, b=b):
            t = p[0] * z[:, b] + p[1]
            return float(np.sum(w / w.sum() * 400 * (np.logaddexp(0, t) - y[:, b] * t)))
        ref = minimize(loss, [0.0, 0.0], method="BFGS", options={"gtol": 1e-10}).x
        assert a[b] == pytest.approx(ref[0], rel=1e-4, abs=1e-5)
        assert c[b] == pytest.approx(ref[1], rel=1e-4, abs=1e-5)
    # fitted in column blocks (2 + 1 columns), each column's scaling is the same
    a2, c2 = platt_columns(z, y, w, l2=0.0, iterations=50, block=2)
    np.testing.assert_allclose(a2, a, rtol=1e-12)
    np.testing.assert_allclose(c2, c, rtol=1e-12)


def _platt_problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(300, 5)) * [1.0, 5.0, 0.1, 2.0, 1e-3]
    y = (rng.random((300, 5)) < 1 / (1 + np.exp(-(z * [2.0, -0.5, 8.0, 0.0, 1.0] + [0.5, 0.0, 3.0, -4.0, 0.0]))))
    return z, y.astype(float), rng.uniform(0.5, 2.0, 300)


def test_platt_columns_on_torch_are_the_numpy_fit():
    # what training runs on a GPU, here on the CPU: the same Newton steps in float64, blocked or not
    z, y, w = _platt_problem()
    a, c = platt_columns(z, y, w)
    for block in (2, 256):
        a_t, c_t = platt_columns(z, y, w, device="cpu", block=block)
        np.testing.assert_allclose(a_t, a, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(c_t, c, rtol=1e-10, atol=1e-12)


@pytest.mark.cuda
def test_platt_columns_on_cuda_are_the_numpy_fit():
    z, y, w = _platt_problem(1)
    a, c = platt_columns(z, y, w)
    a_t, c_t = platt_columns(z, y, w, device="cuda", block=5)
    np.testing.assert_allclose(a_t, a, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(c_t, c, rtol=1e-8, atol=1e-10)


@pytest.mark.cuda
def test_the_head_fitted_on_cuda_is_the_cpu_head():
    X, Y, val, _ = _data()
    cpu = SISOKR(fingerprint_head=True, **PARAMS).fit(X, Y, val=val)
    gpu = SISOKR(fingerprint_head=True, **{**PARAMS, "device": "cuda"}).fit(X, Y, val=val)
    # its Platt scalings ran on the GPU (every bit at once): the same head weight, and the same coordinates
    assert gpu.head_ is not None and cpu.head_ is not None
    assert gpu.head_.weight == pytest.approx(cpu.head_.weight, rel=1e-6)
    expected = cpu.predict_coordinates(X[:20])
    assert np.abs(gpu.predict_coordinates(X[:20]) - expected).max() < 1e-5 * np.abs(expected).max()


def test_a_constant_bit_gets_a_finite_capped_logit():
    z = np.random.default_rng(1).normal(size=(50, 2))
    y = np.zeros((50, 2))
    y[:, 1] = 1.0
    a, c = platt_columns(z, y)
    logits = head_logits(z, a, c)
    assert np.isfinite(a).all() and np.isfinite(c).all()
    assert (logits[:, 0] < -3).all() and (logits[:, 1] > 3).all()
    assert np.abs(logits).max() <= LOGIT_LIMIT


def _molecules() -> list[Molecule]:
    smiles = set()
    for a in ("C", "CC", "CCC", "CC(C)", "c1ccccc1", "C1CCCCC1"):
        for b in ("O", "N", "Cl", "C(=O)O", "C#N", "S", "OC"):
            for c in ("", "C", "CC", "C(O)"):
                smiles.add(a + c + b)
    mols, keys = [], set()
    for s in sorted(smiles):
        m = Molecule.from_smiles(s)
        if m.inchikey14 not in keys:
            keys.add(m.inchikey14)
            mols.append(m)
    return mols


def _data(seed: int = 0):
    """Inputs in R^64 that a fixed projection of each structure's Morgan bits generates (plus noise), several
    inputs per structure; validation structures apart, each ranked among 8 other structures."""
    mols = _molecules()
    rng = np.random.default_rng(seed)
    bits = fingerprint_matrix(mols, "morgan", radius=2, size=2048).astype(float)
    projection = rng.normal(size=(2048, 64))
    order = rng.permutation(len(mols))
    train_s, val_s = order[:90], order[90:]

    def inputs(structures, per):
        idx = np.repeat(structures, per)
        return list(np.tanh(bits[idx] @ projection / 3) + 0.05 * rng.normal(size=(len(idx), 64))), \
            [mols[i] for i in idx]

    X, Y = inputs(train_s, 3)
    Xv, Yv = inputs(val_s, 2)
    pool = [mols[i] for i in order]
    sets, truth = [], []
    for i, m in enumerate(Yv):
        own = pool.index(m)
        others = [j for j in rng.choice(len(pool), 12, replace=False) if j != own][:8]
        sets.append(np.array([own] + others))
        truth.append(np.arange(9) == 0)
    val = ValidationData(Xv, Yv, CandidateSets(pool, sets, truth, np.arange(len(Yv))))
    return X, Y, val, pool


PARAMS = dict(input_kernel=f"vec-rbf:gamma={GX}", output_kernel="tanimoto", input_sketch="subsample:m=120",
              output_sketch="subsample:m=60", lam="1e-3", device="cpu", rank_epochs=0, head_lam=1e-3)


@pytest.fixture(scope="module")
def fitted():
    reset_registry(Registry(load_external=False, extra_plugins=[TestKernels()]))
    X, Y, val, pool = _data()
    with_head = SISOKR(fingerprint_head=True, **PARAMS).fit(X, Y, val=val)
    without = SISOKR(fingerprint_head=False, **PARAMS).fit(X, Y, val=val)
    reset_registry()
    return X, Y, val, pool, with_head, without


def test_the_head_is_kept_and_its_score_is_the_log_likelihood_of_the_candidate_bits(fitted):
    X, Y, val, pool, model, plain = fitted
    point = model.selection_["points"][model.selection_["best"]]
    record = point["fingerprint_head"]
    assert record["kept"] and record["weight"] > 0 and model.head_ is not None
    head = model.head_
    assert model.n_coordinates == plain.n_coordinates + 2048
    # the kernel model is untouched: the same W, the same first coordinates
    np.testing.assert_array_equal(model.W_, plain.W_)
    Xv = list(val[0])
    # the added score is weight * sum_b c_b logit p_b: the log-likelihood of the candidate's bits minus a constant
    K = model.input_kernel_.transform(Xv)
    p = 1 / (1 + np.exp(-head_logits(K @ head.map, head.slope, head.intercept)))
    bits = candidate_bits(pool)
    loglik = bits @ np.log(p).T + (1 - bits) @ np.log(1 - p).T  # (n_pool, n_val)
    added = model.score(Xv, pool) - plain.score(Xv, pool)
    diff = added - head.weight * loglik.T  # the same constant along each query's row
    assert np.ptp(diff, axis=1).max() < 1e-6 * np.abs(added).max()
    # candidate coordinates end with the scaled bits
    coords = model.candidate_coordinates(pool[:5])
    np.testing.assert_allclose(coords[:, plain.n_coordinates:], head.bit_scale * bits[:5])
    assert head.bit_scale < 1


def test_the_heads_ridge_is_the_naive_ridge_on_the_nystrom_features(fitted):
    from molpredict.models import okr

    X, Y, val, pool, model, _ = fitted
    head = model.head_
    landmarks = model.input_landmarks_
    kernel = model.input_kernel_
    Kmm = kernel.transform(landmarks)
    s, V = np.linalg.eigh((Kmm + Kmm.T) / 2)
    keep = s > 1e-10 * s[-1]  # the model's own whitening (pinv_rtol) ...
    keep &= s >= okr.HEAD_RTOL * s[-1]  # ... of which the head reads the directions above HEAD_RTOL
    whiten = V[:, keep] / np.sqrt(s[keep])
    F = kernel.transform(X) @ whiten
    bits = candidate_bits(Y)
    M = np.linalg.solve(F.T @ F + len(X) * head.lam * np.eye(F.shape[1]), F.T @ bits)
    Fv = kernel.transform(list(val[0])) @ whiten
    naive = Fv @ M
    ours = kernel.transform(list(val[0])) @ head.map
    assert np.abs(ours - naive).max() < 1e-6 * max(1.0, np.abs(naive).max())


def test_the_head_improves_validation_ranking_and_the_scores_the_fusion_reads_include_it(fitted):
    X, Y, val, pool, model, plain = fitted
    point = model.selection_["points"][model.selection_["best"]]
    record = point["fingerprint_head"]
    assert point["val_mrr"] == pytest.approx(record["val_mrr"][str(record["weight"])])
    assert point["val_mrr"] >= record["val_mrr"]["0.0"] + model.rank_min_gain
    assert record["val_mrr"]["0.0"] == pytest.approx(plain.selection_["points"][plain.selection_["best"]]["val_mrr"])
    assert not np.allclose(model.validation_scores_, plain.validation_scores_)


def test_the_saved_model_scores_the_same_and_a_broken_head_is_refused(fitted):
    X, Y, val, pool, model, _ = fitted
    arrays, metadata = model.get_state()
    metadata = json.loads(json.dumps(metadata))
    assert metadata["output"]["fingerprint_head"]["bit_scale"] == model.head_.bit_scale
    loaded = SISOKR.from_state({k: v.copy() for k, v in arrays.items()}, metadata)
    Xv = list(val[0])
    np.testing.assert_allclose(loaded.score(Xv, pool), model.score(Xv, pool), rtol=1e-10, atol=1e-10)
    assert loaded.coordinates_key() == model.coordinates_key()
    bad = {k: (v[:-1] if k == "head.map" else v) for k, v in arrays.items()}
    with pytest.raises(ModelFileError, match="fingerprint head"):
        SISOKR.from_state(bad, metadata)


def test_without_molecule_outputs_or_when_switched_off_there_is_no_head(fitted):
    _, _, _, _, _, plain = fitted
    assert plain.head_ is None and "fingerprint_head" not in plain.selection_["points"][plain.selection_["best"]]
    with pytest.raises(Exception, match="fingerprint_head"):
        SISOKR(fingerprint_head="yes")
    with pytest.raises(Exception, match="head_lam"):
        SISOKR(head_lam=0)


def test_a_head_of_mismatched_shapes_is_refused():
    with pytest.raises(ValueError, match="do not match"):
        FingerprintHead(np.zeros((3, 2048)), np.zeros(2047), np.zeros(2048), 1.0)


def test_the_training_summary_says_what_the_head_did(fitted):
    from molpredict.training.pipeline import _head_line, _head_summary

    *_, model, plain = fitted
    said = _head_summary(model)
    record = model.selection_["points"][model.selection_["best"]]["fingerprint_head"]
    assert said["kept"] and said["with"] > said["without"] and said["weight"] == record["weight"]
    assert f"{said['without']:.4f} -> {said['with']:.4f}" in _head_line(said) and "kept" in _head_line(said)
    assert f"lam {record['lam']:g}" in _head_line(said)
    assert _head_summary(plain) is None


def _whitened_input(rng, n_u: int, n: int, r: int, k: int, weighted: bool):
    """A stand-in for SISOKR's whitened input side (Z, its eigendecomposition, per-structure sums, optional
    structure weights) over ``n`` rows of ``n_u`` structures, and 0/1 bits of the structures: what
    ``_out_of_fold_bits`` reads. Returns ``(inp, bits_u, index, Z, row_weights)``."""
    from types import SimpleNamespace

    import torch

    index = rng.integers(0, n_u, n)
    index[:n_u] = np.arange(n_u)
    Z = rng.normal(size=(n, r))
    bits_u = (rng.random((n_u, k)) < 0.3).astype(float)
    w_u = rng.uniform(0.5, 2.0, n_u) if weighted else None
    w = np.ones(n) if w_u is None else w_u[index]
    lam_eig, Q = np.linalg.eigh((Z * w[:, None]).T @ Z)
    E = np.zeros((n, n_u))
    E[np.arange(n), index] = 1.0
    ZEQ = ((Z * w[:, None]).T @ E).T @ Q
    inp = SimpleNamespace(Z=torch.as_tensor(Z, dtype=torch.float32), Q=torch.as_tensor(Q),
                          lam_eig=torch.as_tensor(lam_eig), ZEQ=torch.as_tensor(ZEQ),
                          weights_u=None if w_u is None else torch.as_tensor(w_u))
    return inp, bits_u, index, Z, w


@pytest.mark.parametrize("weighted, block", [(False, 4096), (True, 4096), (True, 7)])
def test_out_of_fold_bit_predictions_are_the_naive_ridge_fitted_without_the_fold(weighted, block, monkeypatch):
    """`_out_of_fold_bits` downdates the input side's system by a fold's rows; against a ridge solved from scratch
    on the other folds' rows (each structure's spectra in one fold), weighted rows included, and with the fold's
    rows summed in blocks of 7 (``HEAD_ROW_BLOCK``; 4096 takes each fold here in one block)."""
    import torch

    from molpredict.models import okr

    monkeypatch.setattr(okr, "HEAD_ROW_BLOCK", block)

    rng = np.random.default_rng(3)
    n, r = 200, 12
    inp, bits_u, index, Z, w = _whitened_input(rng, n_u=30, n=n, r=r, k=7, weighted=weighted)
    lam = 1e-2
    rows, (predicted,) = okr._out_of_fold_bits(inp, torch.as_tensor(bits_u), torch.as_tensor(index), [lam], seed=5)
    fold = np.random.default_rng(5).integers(0, okr.HEAD_FOLDS, len(bits_u))[index]
    Zf32 = Z.astype(np.float32).astype(np.float64)  # the features are kept in float32
    for f in range(okr.HEAD_FOLDS):
        fit = fold != f
        A = (Zf32[fit] * w[fit, None]).T @ Zf32[fit] + fit.sum() * lam * np.eye(r)
        M = np.linalg.solve(A, (Zf32[fit] * w[fit, None]).T @ bits_u[index[fit]])
        mine = fold[rows] == f
        assert mine.any()
        np.testing.assert_allclose(predicted[mine], Zf32[rows[mine]] @ M, rtol=1e-4, atol=1e-4)


def test_out_of_fold_bits_for_a_lam_grid_are_each_lam_alone():
    """One pass over the folds' rows for several lam gives each lam's predictions as its own call does."""
    import torch

    from molpredict.models import okr

    inp, bits_u, index, *_ = _whitened_input(np.random.default_rng(4), n_u=25, n=150, r=10, k=6, weighted=False)
    args = (inp, torch.as_tensor(bits_u), torch.as_tensor(index))
    rows, grid = okr._out_of_fold_bits(*args, [1e-3, 1e-1], seed=2)
    assert isinstance(grid, list) and len(grid) == 2
    for lam, predicted in zip([1e-3, 1e-1], grid):
        rows_alone, (alone,) = okr._out_of_fold_bits(*args, [lam], seed=2)
        np.testing.assert_array_equal(rows, rows_alone)
        np.testing.assert_allclose(predicted, alone, rtol=1e-12, atol=1e-12)
    assert np.abs(grid[0] - grid[1]).max() > 1e-3  # the lam matters here


def test_the_default_head_lam_is_chosen_on_validation_from_the_grid():
    """``head_lam`` None (the default): each of ``DEFAULT_HEAD_LAMS`` is fitted and scored on the validation sets;
    the kept one is the (lam, weight) pair with the best validation metric, and its figures are recorded."""
    from molpredict.models import okr

    X, Y, val, pool = _data()
    grid = (1e-4, 1e-3, 1e-2)
    params = {**PARAMS, "head_lam": None}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(okr, "DEFAULT_HEAD_LAMS", grid)
        model = SISOKR(fingerprint_head=True, **params).fit(X, Y, val=val)
    record = model.selection_["points"][model.selection_["best"]]["fingerprint_head"]
    tried = record["lams"]
    assert sorted(float(k) for k in tried) == list(grid)
    best = max(tried, key=lambda k: (tried[k]["val_mrr"], float(k)))
    assert len({t["val_mrr"] for t in tried.values()}) > 1  # the grid matters on this data
    assert record["lam"] == float(best) and record["weight"] == tried[best]["weight"]
    assert record["val_mrr"][str(record["weight"])] == tried[best]["val_mrr"]
    # the kept head is the one fitted with that lam: the fixed-lam fit reproduces it
    fixed = SISOKR(fingerprint_head=True, **{**PARAMS, "head_lam": float(best)}).fit(X, Y, val=val)
    np.testing.assert_allclose(model.head_.map, fixed.head_.map, rtol=1e-10, atol=1e-12)
    assert model.head_.lam == float(best) and model.head_.weight == pytest.approx(fixed.head_.weight)


def test_candidate_coordinates_fingerprint_each_molecule_once(fitted, monkeypatch):
    """The head's bits share the Tanimoto output kernel's Morgan setting: a cold store fill parses and
    fingerprints each candidate once, not once for the kernel and again for the head."""
    from rdkit import Chem

    import molpredict.chem.molecules as molecules

    X, Y, val, pool, model, plain = fitted
    computed = []
    from_smiles, from_mol = molecules._fingerprint_rows, molecules._fingerprint_of_mol

    def counting_smiles(chunk, key):
        computed.extend(chunk)
        return from_smiles(chunk, key)

    def counting_mol(mol, *key):
        computed.append(Chem.MolToSmiles(mol))
        return from_mol(mol, *key)

    monkeypatch.setattr(molecules, "_fingerprint_rows", counting_smiles)
    monkeypatch.setattr(molecules, "_fingerprint_of_mol", counting_mol)
    fresh = [Molecule.from_smiles(m.smiles) for m in pool[:20]]  # records with no fingerprint kept
    coords = model.candidate_coordinates(fresh)
    assert len(computed) == len(fresh)
    # the same coordinates as from records fingerprinted separately, and nothing is left kept on the records
    np.testing.assert_array_equal(coords, model.candidate_coordinates(pool[:20]))
    assert all(m._fps is None for m in fresh)
    computed.clear()
    plain.candidate_coordinates(fresh)
    assert len(computed) == len(fresh)  # without a head: once, as before


def test_sparse_candidate_bits_are_the_dense_bits_across_chunks():
    from molpredict.models.fingerprint_head import sparse_candidate_bits

    mols = _molecules()[:50]
    dense = candidate_bits(mols)
    sparse = sparse_candidate_bits(mols, chunk=7)   # 8 chunks, the last one short
    assert sparse.shape == dense.shape and sparse.dtype == np.float32
    np.testing.assert_array_equal(sparse.toarray(), dense)
    assert 0 < sparse.nnz < 0.1 * dense.size   # a fingerprint sets a few dozen of its 2,048 bits
    assert sparse_candidate_bits([]).shape == (0, 2048)
