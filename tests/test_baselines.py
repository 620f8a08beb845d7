"""Baselines (random, prior, fingerprint-ffn, library-knn) against hand-computed values and naive references."""
from __future__ import annotations

import numpy as np
import pytest
from rdkit import DataStructs
from rdkit.Chem import rdFingerprintGenerator

from molpredict.errors import SpecError
from molpredict.engine.decoding import query_metrics, random_expectation, true_rank_counts
from molpredict.hookspecs import hookimpl
from molpredict.kernels.base import InputKernel
from molpredict.chem.molecules import Molecule
from molpredict.models.baselines import (FingerprintFFN, LibraryKNN, PriorBaseline, RandomBaseline,
                                         unit_rows)
from molpredict.models.distinct import distinct_objects, structure_key
from molpredict.registry import Registry, get_registry, reset_registry
from molpredict.spectra.record import Spectrum

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMILES = ["CCO", "CCCO", "c1ccccc1O", "CC(=O)O", "CCN", "c1ccncc1", "OCC(O)CO", "CC(C)C"]


def spectrum(i: int, peaks: dict[float, float], precursor: float = 200.0) -> Spectrum:
    mz = np.array(sorted(peaks), dtype=float)
    return Spectrum(id=f"s{i}", mz=mz, intensities=np.array([peaks[m] for m in mz]), precursor_mz=precursor,
                    charge=1, ion_mode="positive", adduct="[M+H]+")


def molecules(smiles: list[str]) -> list[Molecule]:
    return [Molecule.from_smiles(s) for s in smiles]


def roundtrip(model):
    arrays, metadata = model.get_state()
    return type(model).from_state({k: np.array(v) for k, v in arrays.items()}, metadata)


# -- helpers ---------------------------------------------------------------------------------------------

def test_prior_similarities_are_the_registered_kernels_hand_computed():
    """The prior's similarity is a registered output kernel on its fingerprint settings: Tanimoto (1 for two
    all-zero fingerprints), cosine, Gaussian-Tanimoto with the prior's gamma, MinMax on counts."""
    a = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=np.uint8)
    b = np.array([[1, 0, 1, 0], [0, 0, 0, 0]], dtype=np.uint8)

    def similarity(kind, x, y, **params):
        kernel = PriorBaseline(similarity=kind, fp_size=4, **params)._kernel()
        return kernel.fit_features(kernel.fingerprints(y)).transform_features(kernel.fingerprints(x))

    t = similarity("tanimoto", a, b)
    np.testing.assert_allclose(t, [[1 / 3, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(similarity("cosine", a, b, counts=False)[0], [0.5, 0.0])
    np.testing.assert_allclose(similarity("gaussian-tanimoto", a, b, gamma=2.0), np.exp(-2.0 * (2 - 2 * t)))
    counts = np.array([[2.0, 1.0]], dtype=np.float32), np.array([[1.0, 3.0]], dtype=np.float32)
    np.testing.assert_allclose(similarity("tanimoto", *counts, counts=True), [[2 / 5]])  # MinMax: (1+1)/(2+3)
    with pytest.raises(SpecError, match="unknown similarity"):
        PriorBaseline(similarity="dice").fit([0], molecules(["CCO"]))


def test_unique_structures_and_unit_rows():
    mols = molecules(["CCO", "OCC", "CCN", "CCO"])
    distinct, index = distinct_objects(mols, key=structure_key)
    assert [m.smiles for m in distinct] == ["CCO", "CCN"]
    np.testing.assert_array_equal(index, [0, 0, 1, 0])
    np.testing.assert_allclose(unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]])), [[0.6, 0.8], [0.0, 0.0]])


# -- random ----------------------------------------------------------------------------------------------

def test_random_is_exactly_the_random_expectation():
    sizes = np.array([1, 2, 3, 7, 10, 256])
    model = RandomBaseline().fit([spectrum(0, {50.0: 1.0})], molecules(["CCO"]))
    g, t, f = [], [], []
    for n in sizes:
        scores = model.score([spectrum(1, {60.0: 1.0})], [Molecule.from_smiles("C")] * n)[0]
        assert np.all(scores == scores[0])
        is_true = np.zeros(n, dtype=bool)
        is_true[n // 2] = True
        counts = true_rank_counts(scores, is_true)
        g.append(counts[0]), t.append(counts[1]), f.append(counts[2])
    per = query_metrics(np.array(g), np.array(t), np.array(f), sizes, policy="average")
    expected = random_expectation(sizes)
    for k in (1, 5, 10, 20):
        assert per[f"hit@{k}"].mean() == pytest.approx(expected[f"hit@{k}"], abs=1e-12)
    assert per["rr"].mean() == pytest.approx(expected["mrr"], abs=1e-12)
    # hand-computed: hit@1 = mean(1/n), MRR = mean(H_n / n)
    assert expected["hit@1"] == pytest.approx(np.mean(1.0 / sizes))
    harmonic = np.array([sum(1.0 / r for r in range(1, n + 1)) for n in sizes])
    assert expected["mrr"] == pytest.approx(np.mean(harmonic / sizes))
    reloaded = roundtrip(model)
    assert reloaded.n_train_ == 1 and reloaded.coordinates_key() == model.coordinates_key()


def test_random_is_registered():
    assert get_registry().get("model", "random") is RandomBaseline
    assert isinstance(get_registry().create("model", "prior:top_k=3"), PriorBaseline)


# -- prior -----------------------------------------------------------------------------------------------

def naive_prior(train: list[str], candidate: str, top_k: int) -> float:
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    from rdkit import Chem
    c = gen.GetFingerprint(Chem.MolFromSmiles(candidate))
    sims = sorted((DataStructs.TanimotoSimilarity(c, gen.GetFingerprint(Chem.MolFromSmiles(t))) for t in train),
                  reverse=True)
    sims = sims[:top_k] if top_k else sims
    return sum(sims) / len(sims)


@pytest.mark.parametrize("top_k", [0, 1, 2])
def test_prior_matches_naive_tanimoto(top_k):
    train = ["CCO", "CCCO", "c1ccccc1O", "CCO"]  # a repeated structure counts once
    spectra = [spectrum(i, {50.0 + i: 1.0}) for i in range(len(train))]
    model = PriorBaseline(top_k=top_k, block_size=2).fit(spectra, molecules(train))
    assert model.train_fingerprints_.shape == (3, 2048)
    cands = ["CCCCO", "c1ccccc1", "CC(=O)O", "CCO", "N#N"]
    expected = [naive_prior(train[:3], c, top_k) for c in cands]
    np.testing.assert_allclose(model.candidate_scores(molecules(cands)), expected, atol=1e-12)


def test_prior_ignores_the_spectrum():
    train_spectra = [spectrum(i, {40.0 + 10 * i: 1.0 + i}) for i in range(len(SMILES))]
    train_mols = molecules(SMILES)
    cands = molecules(["CCCCO", "c1ccccc1", "CC(=O)OC", "CCCN"])
    queries = [spectrum(100 + i, {30.0 + 7 * i: 1.0, 99.0: 0.5}) for i in range(5)]
    model = PriorBaseline().fit(train_spectra, train_mols)
    scores = model.score(queries, cands)
    assert np.all(scores == scores[0])  # every query gets the same ranking
    perm = np.random.default_rng(0).permutation(len(queries))
    np.testing.assert_array_equal(model.score([queries[i] for i in perm], cands), scores)
    # the training spectra do not matter either: shuffle them against the molecules
    shuffled = PriorBaseline().fit([train_spectra[i] for i in reversed(range(len(SMILES)))], train_mols)
    np.testing.assert_array_equal(shuffled.score(queries, cands), scores)
    reloaded = roundtrip(model)
    np.testing.assert_array_equal(reloaded.score(queries, cands), scores)
    assert reloaded.coordinates_key() == model.coordinates_key()


def test_prior_counts_roundtrip():
    spectra = [spectrum(i, {50.0: 1.0}) for i in range(3)]
    model = PriorBaseline(counts=True, similarity="gaussian-tanimoto", gamma=2.0, fp_size=512).fit(
        spectra, molecules(["CCO", "CCCCCC", "c1ccccc1"]))
    cands = molecules(["CCCC", "c1ccccc1C"])
    np.testing.assert_array_equal(roundtrip(model).candidate_coordinates(cands), model.candidate_coordinates(cands))


# -- fingerprint-ffn -------------------------------------------------------------------------------------



def ffn_data(n_per: int = 12):
    """Each structure has its own fragment m/z (jittered intensities): the map spectrum -> fingerprint is learnable."""
    rng = np.random.default_rng(1)
    structures = SMILES[:6]
    spectra, mols = [], []
    for j, smi in enumerate(structures):
        for r in range(n_per):
            peaks = {60.0 + 25 * j: 1.0, 300.0 + 11 * j: 0.3 + 0.2 * rng.random(), 10.0 + rng.integers(0, 5): 0.05}
            spectra.append(spectrum(len(spectra), peaks))
            mols.append(Molecule.from_smiles(smi))
    return spectra, mols, structures


def test_ffn_learns_and_ranks_by_cosine():
    spectra, mols, structures = ffn_data()
    model = FingerprintFFN(hidden=64, n_layers=1, fp_size=256, max_epochs=20, patience=20, dropout=0.0,
                           learning_rate=1e-2, batch_size=16, max_mz=500.0, device="cpu", seed=3)
    model.fit(spectra, mols, val=(spectra, mols))
    assert model.history_[model.best_epoch_ - 1]["val_loss"] == min(h["val_loss"] for h in model.history_)
    cands = molecules(structures)
    queries = [spectrum(900 + j, {60.0 + 25 * j: 1.0, 300.0 + 11 * j: 0.4}) for j in range(len(structures))]
    scores = model.score(queries, cands)
    assert (scores.argmax(axis=1) == np.arange(len(structures))).all()
    # dot-product form = cosine between predicted probabilities and candidate bits
    proba = model.predict_proba(queries)
    bits = np.array([m.fingerprint(size=256) for m in cands], dtype=float)
    cosine = (proba @ bits.T) / np.outer(np.linalg.norm(proba, axis=1), np.linalg.norm(bits, axis=1))
    np.testing.assert_allclose(scores, cosine, atol=1e-10)
    reloaded = roundtrip(model)
    np.testing.assert_array_equal(reloaded.score(queries, cands), scores)
    assert reloaded.best_epoch_ == model.best_epoch_


def test_ffn_likelihood_scoring_ranks_by_the_bits_log_likelihood():
    """``scoring=likelihood``: each score is the naive log-likelihood of the candidate's bits, sum over bits of
    c log p + (1 - c) log(1 - p), less a constant of the query; the network and its training are the cosine's."""
    spectra, mols, structures = ffn_data()
    params = dict(hidden=64, n_layers=1, fp_size=256, max_epochs=20, patience=20, dropout=0.0, learning_rate=1e-2,
                  batch_size=16, max_mz=500.0, device="cpu", seed=3)
    cosine = FingerprintFFN(**params).fit(spectra, mols, val=(spectra, mols))
    model = FingerprintFFN(scoring="likelihood", **params).fit(spectra, mols, val=(spectra, mols))
    cands = molecules(structures + ["CC(=O)Oc1ccccc1C(=O)O"])
    queries = [spectrum(900 + j, {60.0 + 25 * j: 1.0, 300.0 + 11 * j: 0.4}) for j in range(len(structures))]
    proba = model.predict_proba(queries)
    np.testing.assert_array_equal(proba, cosine.predict_proba(queries))
    p = np.clip(proba, 1e-6, 1 - 1e-6)
    bits = np.array([m.fingerprint(size=256) for m in cands], dtype=float)
    naive = np.array([[sum(np.log(pb) if cb else np.log(1 - pb) for pb, cb in zip(row, c)) for c in bits]
                      for row in p])
    scores = model.score(queries, cands)
    np.testing.assert_allclose(scores - scores[:, :1], naive - naive[:, :1], atol=1e-8)
    assert (scores.argmax(axis=1) == np.arange(len(structures))).all()
    # its candidate side is not the cosine's: a coordinates cache must not hand one the other's
    assert model.coordinates_key() != cosine.coordinates_key()
    reloaded = roundtrip(model)
    assert reloaded.scoring == "likelihood"
    np.testing.assert_array_equal(reloaded.score(queries, cands), scores)
    with pytest.raises(SpecError, match="scoring must be one of cosine, likelihood"):
        FingerprintFFN(scoring="dot", device="cpu").fit(spectra, mols)


def test_ffn_is_deterministic_and_holds_out_structures():
    spectra, mols, _ = ffn_data(4)
    params = dict(hidden=16, n_layers=1, fp_size=64, max_epochs=3, patience=3, max_mz=500.0, device="cpu",
                  val_fraction=0.34, seed=7)
    a = FingerprintFFN(**params).fit(spectra, mols)
    b = FingerprintFFN(**params).fit(spectra, mols)
    for (ka, va), (kb, vb) in zip(a.get_state()[0].items(), b.get_state()[0].items()):
        assert ka == kb and np.array_equal(va, vb)
    # the hold-out split is by structure: no structure on both sides
    train, held = a._split(mols)
    assert {mols[i].inchikey14 for i in train}.isdisjoint({mols[i].inchikey14 for i in held})
    assert len(held) == 2 * 4


def test_ffn_rejects_counts():
    spectra, mols, _ = ffn_data(1)
    with pytest.raises(SpecError, match="counts"):
        FingerprintFFN(counts=True, device="cpu").fit(spectra, mols)


# -- library-knn -----------------------------------------------------------------------------------------

class UnitBinKernel(InputKernel):
    """Cosine of 1-Da binned intensities (test oracle: easy to compute by hand)."""

    def __init__(self, width: float = 1.0) -> None:
        self.width = width

    def featurize(self, objects):
        out = np.zeros((len(objects), 1000))
        for i, s in enumerate(objects):
            np.add.at(out[i], (s.mz / self.width).astype(int), s.intensities)
        return out

    def pairwise(self, fa, fb):
        return fa @ fb.T

    def self_similarity(self, f):
        return np.einsum("ij,ij->i", f, f)


class _TestPlugin:
    @hookimpl
    def register_input_kernels(self, register):
        register("unit-bin", UnitBinKernel)


@pytest.fixture
def knn_registry():
    reset_registry(Registry(load_external=False, extra_plugins=[_TestPlugin()]))
    yield
    reset_registry()


def test_knn_hand_computed(knn_registry):
    train = [spectrum(0, {100.0: 1.0}), spectrum(1, {100.0: 1.0, 200.0: 1.0}), spectrum(2, {300.0: 1.0}),
             spectrum(3, {100.0: 1.0, 300.0: 1.0})]
    train_smiles = ["CCO", "CCCO", "c1ccccc1", "CCO"]
    model = LibraryKNN(input_kernel="unit-bin", k=2, fp_size=1024).fit(train, molecules(train_smiles))
    query = [spectrum(9, {100.0: 2.0})]
    index, sims = model.neighbours(query)
    # cos(q, s0) = 1; cos(q, s1) = cos(q, s3) = 1/sqrt(2) (tie: lower index first); cos(q, s2) = 0
    np.testing.assert_array_equal(index, [[0, 1]])
    np.testing.assert_allclose(sims, [[1.0, 2 ** -0.5]])
    u = unit_rows(np.array([Molecule.from_smiles(s).fingerprint(size=1024) for s in ["CCO", "CCCO"]], float))
    expected = unit_rows(((1.0 * u[0] + 2 ** -0.5 * u[1]) / (1 + 2 ** -0.5))[None])
    np.testing.assert_allclose(model.predict_coordinates(query), expected, atol=1e-12)
    cands = molecules(["CCO", "CCCO", "c1ccccc1", "CCCCCC"])
    scores = model.score(query, cands)[0]
    assert scores.argmax() == 0 and scores[2] < scores[1]
    # power 0: plain mean; k larger than the library: all of it
    flat = LibraryKNN(input_kernel="unit-bin", k=10, power=0.0, fp_size=1024).fit(train, molecules(train_smiles))
    u_all = unit_rows(np.array([m.fingerprint(size=1024) for m in molecules(train_smiles)], float))
    np.testing.assert_allclose(flat.predict_coordinates(query), unit_rows(u_all.mean(axis=0)[None]), atol=1e-12)


def test_knn_roundtrip(knn_registry):
    train = [spectrum(i, {50.0 + 13 * i: 1.0, 400.0: 0.5}) for i in range(len(SMILES))]
    model = LibraryKNN(input_kernel="unit-bin", k=3, fp_size=512).fit(train, molecules(SMILES))
    queries = [spectrum(50 + i, {50.0 + 13 * i: 1.0, 63.0 + 13 * i: 0.7}) for i in range(4)]
    cands = molecules(["CCCCO", "c1ccccc1", "CC(=O)OC", "CCCN"])
    reloaded = roundtrip(model)
    np.testing.assert_array_equal(reloaded.score(queries, cands), model.score(queries, cands))
    assert reloaded.coordinates_key() == model.coordinates_key()
    assert reloaded.kernel_.to_spec().name == "unit-bin"


def test_baselines_through_modelfile(tmp_path, knn_registry):
    from molpredict.modelfile import ModelBundle, SubModel
    train = [spectrum(i, {50.0 + 13 * i: 1.0}) for i in range(4)]
    queries = [spectrum(9, {63.0: 1.0})]
    cands = molecules(["CCCCO", "c1ccccc1"])
    small_ffn = FingerprintFFN(hidden=8, n_layers=1, fp_size=64, max_epochs=2, max_mz=200.0, device="cpu")
    for name, model in [("random", RandomBaseline()), ("prior", PriorBaseline()),
                        ("library-knn", LibraryKNN(input_kernel="unit-bin", k=2)),
                        ("fingerprint-ffn", small_ffn)]:
        model = get_registry().get("model", name)(**model.get_params())
        model.fit(train, molecules(SMILES[:4]))
        path = ModelBundle({"positive": SubModel(model, "positive")}).save(tmp_path / name)
        loaded = ModelBundle.load(path).models["positive"].model
        assert type(loaded) is type(model)
        np.testing.assert_array_equal(loaded.score(queries, cands), model.score(queries, cands))
