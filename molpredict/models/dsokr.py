"""DSOKR: a neural network g_W: X -> R^{p_y} trained to predict coordinates in a sketched output basis.

El Ahmad, Yang, Laforgue, d'Alche-Buc (ECML 2024). The output side is a :class:`SketchedOutputBasis` (an
orthonormal basis of span(R_y K_y rows) in H_y); the network is built by an :mod:`encoder <molpredict.engine.encoders>`
(``kernel-mlp`` on input-kernel features against landmark inputs, the default; ``mlp`` on binned spectra,
``transformer`` on strings, ``text-embedding`` on text) and trained with a kernel
loss of the squared RKHS distance (:mod:`molpredict.models.losses`: square, Huber, epsilon-insensitive).
Decoding is argmax_c g_W(x)^T psi~(y_c): a dot product, so candidate coordinates are computed once per library.

Ensembles
---------
``n_members = T`` networks, each with its own sketch draw (seed + t) and its own initialisation. The combined
score of a candidate is

- ``combine="mean"``: sum_t w_t g_t(x)^T psi~_t(c) with non-negative weights summing to 1 (``member_weights=
  "uniform"``: 1/T; ``"fit"``: chosen on the validation set to minimise the kernel loss of the combined
  predictor h = sum_t w_t h_t, a quadratic in w, needing the cross-Gram matrices between the members' bases).
  This is again one dot product: :meth:`predict_coordinates` and :meth:`candidate_coordinates` concatenate the
  members' coordinates scaled by sqrt(w_t), so caching and batched scoring work unchanged.
- ``combine="max"``: max_t g_t(x)^T psi~_t(c). Not a dot product: :meth:`score` (and
  :meth:`score_coordinates`, for cached coordinates) compute it; a caller that multiplies the concatenated
  coordinates itself gets the (unweighted) sum instead.

Early stopping
--------------
With validation data, each member keeps the weights of its best epoch by ``val_metric``: ``mrr`` (the default;
decoding the validation inputs against candidate sets: the distinct validation structures unless candidates are
given as a third element of ``val``; higher is better) or ``loss`` (mean squared RKHS distance ||h(x) -
psi_y(y)||^2 on validation pairs, lower is better); training stops after ``patience`` epochs without
improvement. An encoder that offers starting points (:meth:`Encoder.warm_starts
<molpredict.engine.encoders.Encoder.warm_starts>`, e.g. ``kernel-formula``'s ridge solutions) has each scored
before the first epoch; the best start counts as epoch -1 and is kept unless an epoch beats it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from molpredict.engine.decoding import query_metrics, true_rank_counts
from molpredict.errors import ModelFileError, SpecError
from molpredict.specs import nested_spec
from molpredict.models.base import Model, check_pairs
from molpredict.models.basis import SketchedOutputBasis, distinct_objects, output_key
from molpredict.models.losses import make_loss, squared_distance

__all__ = ["DSOKR", "CandidateSets", "candidate_sets", "coordinate_metrics", "state_dict_to_arrays"]


# -- validation decoding (pure helpers, also used by sketch-size selection) -----------------------------
def _hit_key(obj: Any) -> Any:
    key = getattr(obj, "inchikey14", None)
    return key if isinstance(key, str) and key else output_key(obj)


def _stereo_hit_key(obj: Any) -> Any:
    smiles = getattr(obj, "smiles", None)  # RDKit canonical isomeric SMILES for a Molecule
    return ("smiles", smiles) if isinstance(smiles, str) else output_key(obj)


#: DSOKR's default encoder for text: a linear layer on the whitened (Nystrom) features of the TF-IDF n-gram kernel.
#: On a held-out 10% of ChEBI-20's val.tsv structures (trained on 81%, stopped early on the MRR of the other 9%) it
#: reached MRR 0.131 against all 32,556 ChEBI-20 molecules, where the MLP head on frozen MiniLM embeddings
#: (``text-embedding``) got 0.023.
TEXT_ENCODER = "kernel-mlp:input_kernel=text-ngram;layers=0;whiten=true"
#: the output basis for text covers at most this many structures
TEXT_OUTPUT_LANDMARKS = 2000

#: what makes a candidate the true structure: the InChIKey first block (MassSpecGym) or the same canonical
#: isomeric SMILES, stereo included (text -> molecule on ChEBI-20)
HIT_KEYS = {"inchikey14": _hit_key, "smiles": _stereo_hit_key}


def _pool_key(obj: Any) -> Any:
    smiles = getattr(obj, "smiles", None)
    return ("smiles", smiles) if isinstance(smiles, str) else output_key(obj)


@dataclass
class CandidateSets:
    """Candidates for a batch of queries over one pool of distinct molecules.

    Attributes
    ----------
    pool : list
        Distinct candidate molecules (score each once).
    index : list of ndarray
        For each query, the positions of its candidates in ``pool``.
    is_true : list of ndarray of bool
        For each query, which of its candidates match the true structure (see ``hit``).
    """

    pool: list
    index: list
    is_true: list


def candidate_sets(truths: Sequence[Any], candidates: Any = None, hit: str = "inchikey14") -> CandidateSets:
    """Candidate sets for queries whose true structures are ``truths``.

    Parameters
    ----------
    truths : sequence of Molecule, length n_queries
    candidates : None, sequence of Molecule, or sequence (length n_queries) of sequences of Molecule
        None: every query is ranked among the distinct true structures; a flat sequence: one shared set; a
        sequence of sequences: one set per query.
    hit : {"inchikey14", "smiles"}
        A hit is a candidate with the truth's InChIKey first block, or with its canonical isomeric SMILES.
    """
    if hit not in HIT_KEYS:
        raise SpecError(f"hit must be one of {', '.join(HIT_KEYS)}, not {hit!r}")
    hit_key = HIT_KEYS[hit]
    truths = list(truths)
    if candidates is None:
        candidates = distinct_objects(truths)[0]
    candidates = list(candidates)
    per_query = bool(candidates) and isinstance(candidates[0], (list, tuple))
    flat = [c for group in candidates for c in group] if per_query else candidates
    # pool identity by SMILES text (no InChI computation for large candidate sets); a structure written two
    # ways is merely scored twice, and hits are decided by ``hit_key`` below
    pool, inverse = distinct_objects(flat, key=_pool_key)
    key_ids: dict[Any, int] = {}
    keys = np.asarray([key_ids.setdefault(hit_key(c), len(key_ids)) for c in pool], dtype=np.int64)
    if per_query:
        if len(candidates) != len(truths):
            raise SpecError(f"{len(candidates)} candidate sets for {len(truths)} queries")
        bounds = np.cumsum([0] + [len(g) for g in candidates])
        index = [inverse[bounds[i]:bounds[i + 1]] for i in range(len(truths))]
    else:
        index = [inverse] * len(truths)
    is_true = [keys[idx] == key_ids.get(hit_key(t), -1) for idx, t in zip(index, truths)]
    return CandidateSets(pool, index, is_true)


def coordinate_metrics(predictions: np.ndarray, pool_coordinates: np.ndarray, sets: CandidateSets,
                       ks: Sequence[int] = (1, 5, 10), policy: str = "worst", scorer: Any = None
                       ) -> dict[str, float]:
    """Mean hit@k, MRR and ``rank`` (the mean rank of the truth, its set size + 1 when absent) of decoding by dot
    product (or ``scorer(P, C) -> scores``).

    Parameters
    ----------
    predictions : ndarray of shape (n_queries, d)
    pool_coordinates : ndarray of shape (len(sets.pool), d)
    sets : CandidateSets
    """
    score = scorer or (lambda p, c: p @ c.T)
    n = predictions.shape[0]
    greater, ties, found = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
    n_cand = np.asarray([len(idx) for idx in sets.index])
    shared = all(idx is sets.index[0] for idx in sets.index)
    block = 512
    for start in range(0, n, block):
        stop = min(start + block, n)
        if shared:
            scores = score(predictions[start:stop], pool_coordinates[sets.index[0]])
        for i in range(start, stop):
            row = scores[i - start] if shared else score(predictions[i:i + 1], pool_coordinates[sets.index[i]])[0]
            greater[i], ties[i], found[i] = true_rank_counts(row, sets.is_true[i])
    metrics = query_metrics(greater, ties, found, n_cand, ks=ks, policy=policy)
    out = {name: float(np.mean(values)) for name, values in metrics.items() if name != "rr"}
    out["mrr"] = float(np.mean(metrics["rr"]))
    return out


def state_dict_to_arrays(module: torch.nn.Module, prefix: str) -> dict[str, np.ndarray]:
    """A module's ``state_dict`` as numpy arrays named ``prefix.<parameter>`` (no pickle)."""
    return {f"{prefix}.{name}": value.detach().cpu().numpy().copy() for name, value in module.state_dict().items()}


def _load_state_dict(module: torch.nn.Module, arrays: dict[str, np.ndarray], prefix: str) -> None:
    state = {name[len(prefix) + 1:]: torch.from_numpy(np.array(value)) for name, value in arrays.items()
             if name.startswith(prefix + ".")}
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelFileError(f"network weights {prefix}.* do not fit the architecture: "
                             f"{' '.join(str(exc).split())[:300]}") from None


class DSOKR(Model):
    """Deep sketched output kernel regression.

    Parameters
    ----------
    encoder : str
        Encoder spec (``kernel-mlp:layers=0;whiten=true``, ``mlp``, ``mlp:hidden=512,layers=3``, ``transformer``,
        ``text-embedding``; inside a model spec write the encoder's own parameters with ``;``). The default, a
        linear layer on the Nystrom features of the ``ppk-losses`` kernel against 4,000 training spectra, ranked
        best on MassBank's validation data (hit@1 32.4% on val_formula256 against 30.7% for SISOKR and 20.9% for
        the binned-spectrum ``mlp``; hidden layers on the kernel features did worse, see benchmarks/dsokr.py).
    output_kernel : str
        Output kernel spec.
    output_sketch : str
        Output sketch spec (sets m_y); shrunk to the number of distinct training structures when larger.
    loss : str
        ``square`` (default), ``huber:delta=...``, ``eps-l1:epsilon=...``, ``eps-l2:epsilon=...``.
    lr, epochs, batch_size, weight_decay
        Adam settings. (On all 47,880 positive MassBank spectra the binned-spectrum ``mlp`` takes about 75 s an
        epoch on 2 busy CPU cores; the default linear layer on kernel features ranks best after 1-2 epochs.)
    warmup : int
        Optimiser steps over which the learning rate rises linearly from lr / warmup to lr (0: none). The
        post-norm ``transformer`` needs it for learning rates above ~1e-3 (QM9 with lr=3e-3 and no warm-up
        diverged to the mean predictor).
    patience : int
        Early stopping (with validation data): epochs without improvement before stopping.
    val_metric : {"auto", "loss", "mrr"}
        ``auto`` is ``mrr``: on MassBank and ChEBI-20 the kernel loss kept epochs that ranked worse (MassBank
        val_formula256 hit@1: the binned ``mlp`` 20.9% stopped by the loss; the default encoder 32.4% stopped by the
        MRR among the distinct validation structures, the same as by the MRR in the formula candidate sets).
    n_members : int
        Ensemble size T (independent sketch draws and initialisations).
    combine : {"mean", "max"}
    member_weights : {"uniform", "fit"}
        Weights of ``combine="mean"``; ``fit`` needs validation data.
    rel_cutoff : float
        Relative eigenvalue cut-off of the output basis.
    device : {"auto", "cpu", "cuda"}
    seed : int
    rank_epochs : int
        After the training with ``loss`` (and its early stopping), each member is fine-tuned for at most this many
        epochs with the softmax ranking loss over the distinct training structures
        (:func:`molpredict.models.ranking_finetune.fit_ranking`, checked three times an epoch), keeping the state
        that ranks the validation candidate sets best (the network before the fine-tune included); it needs
        validation data ranked by MRR (``val_metric`` ``auto`` or ``mrr``). 0: no fine-tune.
    rank_lr : float
        Adam's learning rate of the fine-tune.

    Fitted attributes
    -----------------
    encoder_ : Encoder
    bases_ : list of SketchedOutputBasis, one per member
    networks_ : list of torch.nn.Module
    weights_ : ndarray of shape (T,)
    history_ : list of dict per member (``train_loss``, ``val``, ``best_epoch``)
    """

    def __init__(self, encoder: str = "kernel-mlp:layers=0;whiten=true",
                 output_kernel: str = "gaussian-tanimoto:gamma=auto", output_sketch: str = "subsample:m=2000",
                 loss: str = "square", lr: float = 1e-3, epochs: int = 30, batch_size: int = 128,
                 weight_decay: float = 0.0, warmup: int = 0, patience: int = 5, val_metric: str = "auto",
                 n_members: int = 1, combine: str = "mean", member_weights: str = "uniform",
                 rel_cutoff: float = 1e-10, device: str = "auto", seed: int = 0, rank_epochs: int = 0,
                 rank_lr: float = 3e-4) -> None:
        self.encoder = encoder
        self.output_kernel = output_kernel
        self.output_sketch = output_sketch
        self.loss = loss
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.warmup = warmup
        self.patience = patience
        self.val_metric = val_metric
        self.n_members = n_members
        self.combine = combine
        self.member_weights = member_weights
        self.rel_cutoff = rel_cutoff
        self.device = device
        self.seed = seed
        self.rank_epochs = rank_epochs
        self.rank_lr = rank_lr

    @classmethod
    def train_defaults(cls, input_type: str, n_inputs: int, n_structures: int) -> dict[str, Any]:
        """For text: :data:`TEXT_ENCODER`, the text output kernel, and an output basis on at most
        :data:`TEXT_OUTPUT_LANDMARKS` structures (all of them below)."""
        params = super().train_defaults(input_type, n_inputs, n_structures)
        if input_type == "text":
            params["encoder"] = TEXT_ENCODER
            params["output_sketch"] = f"subsample:m={max(1, min(TEXT_OUTPUT_LANDMARKS, n_structures))}"
        return params

    # -- helpers -----------------------------------------------------------------------------------------
    def _check_params(self) -> None:
        if self.combine not in ("mean", "max"):
            raise SpecError(f"dsokr: combine must be mean or max, got {self.combine!r}")
        if self.member_weights not in ("uniform", "fit"):
            raise SpecError(f"dsokr: member_weights must be uniform or fit, got {self.member_weights!r}")
        if self.val_metric not in ("auto", "loss", "mrr"):
            raise SpecError(f"dsokr: val_metric must be auto, loss or mrr, got {self.val_metric!r}")
        if int(self.n_members) < 1 or int(self.epochs) < 0 or int(self.batch_size) < 1 or int(self.warmup) < 0:
            raise SpecError("dsokr: n_members and batch_size must be >= 1, epochs and warmup >= 0")
        make_loss(nested_spec(self.loss))

    def _device(self) -> torch.device:
        from molpredict.engine.device import resolve_device
        return resolve_device(self.device)

    def _forward(self, network: torch.nn.Module, features: Any, device: torch.device, block: int = 1024
                 ) -> torch.Tensor:
        """Network outputs for a whole feature table, in eval mode, float32 on ``device``."""
        network.eval()
        outs = []
        n = len(features) if not hasattr(features, "shape") else features.shape[0]
        with torch.no_grad():
            for start in range(0, n, block):
                index = np.arange(start, min(start + block, n))
                outs.append(network(self.encoder_.to_tensor(self.encoder_.take(features, index), device)))
        if not outs:
            return torch.zeros((0, 0), device=device)
        return torch.cat(outs).float()

    @staticmethod
    def _n(features: Any) -> int:
        return features.shape[0] if hasattr(features, "shape") else len(features)

    # -- training ----------------------------------------------------------------------------------------
    def fit(self, inputs: Sequence[Any], molecules: Sequence[Any],
            val: tuple | None = None) -> "DSOKR":
        """Train the members.

        Parameters
        ----------
        inputs : sequence of Spectrum or str, length n
        molecules : sequence of Molecule, length n
        val : (inputs, molecules) or (inputs, molecules, candidates), optional
            Validation data for early stopping and member weights; ``candidates`` as in :func:`candidate_sets`.
        """
        self._check_params()
        inputs, molecules = list(inputs), list(molecules)
        check_pairs(inputs, molecules)
        if self.member_weights == "fit" and val is None:
            raise SpecError("dsokr: member_weights=fit needs validation data")
        device = self._device()
        loss_fn = make_loss(nested_spec(self.loss))
        from molpredict.registry import create
        self.encoder_ = create("encoder", nested_spec(self.encoder)).fit(inputs, device=device)
        features = self.encoder_.featurize(inputs)
        val_data = self._prepare_val(val) if val is not None else None

        self.bases_, self.networks_, self.history_ = [], [], []
        for t in range(int(self.n_members)):
            member_seed = int(self.seed) * 1000 + t
            basis = SketchedOutputBasis(nested_spec(self.output_kernel), nested_spec(self.output_sketch),
                                        float(self.rel_cutoff), seed=member_seed).fit(molecules)
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(member_seed)
                network, history = self._train_member(basis, features, molecules, val_data, loss_fn, device,
                                                      member_seed)
            self.bases_.append(basis)
            self.networks_.append(network)
            self.history_.append(history)
        self.device_ = str(device)
        if self.member_weights == "fit" and int(self.n_members) > 1:
            self.weights_ = self._fit_weights(val_data, device)
        else:
            self.weights_ = np.full(int(self.n_members), 1.0 / int(self.n_members))
        return self

    def _prepare_val(self, val: tuple) -> dict[str, Any]:
        if len(val) not in (2, 3):
            raise SpecError("dsokr: val must be (inputs, molecules) or (inputs, molecules, candidates)")
        v_inputs, v_molecules = list(val[0]), list(val[1])
        if len(v_inputs) != len(v_molecules) or not v_inputs:
            raise SpecError(f"dsokr: {len(v_inputs)} validation inputs for {len(v_molecules)} outputs")
        metric = "mrr" if self.val_metric == "auto" else self.val_metric
        data = {"features": self.encoder_.featurize(v_inputs), "molecules": v_molecules, "metric": metric}
        if metric == "mrr":
            data["sets"] = candidate_sets(v_molecules, val[2] if len(val) == 3 else None)
        return data

    def _val_score(self, g: torch.Tensor, basis: SketchedOutputBasis, val: dict, cache: dict) -> float:
        """Higher is better: -kernel loss, or MRR."""
        if val["metric"] == "loss":
            if "psi" not in cache:
                cache["psi"] = torch.as_tensor(basis.coordinates(val["molecules"]), dtype=torch.float32,
                                               device=g.device)
                cache["kyy"] = torch.as_tensor(basis.diagonal(val["molecules"]), dtype=torch.float32,
                                               device=g.device)
            return -float(squared_distance(g, cache["psi"], cache["kyy"]).mean())
        if "pool" not in cache:
            cache["pool"] = basis.coordinates(val["sets"].pool)
        return coordinate_metrics(g.double().cpu().numpy(), cache["pool"], val["sets"])["mrr"]

    def _train_member(self, basis: SketchedOutputBasis, features: Any, molecules: list, val: dict | None,
                      loss_fn: Any, device: torch.device, seed: int) -> tuple[torch.nn.Module, dict]:
        network = self.encoder_.build(basis.rank_).to(device)
        psi = torch.as_tensor(basis.train_coordinates_, dtype=torch.float32, device=device)  # distinct outputs
        kyy = torch.as_tensor(basis.diagonal(basis.distinct_), dtype=torch.float32, device=device)
        target = torch.as_tensor(basis.inverse_, device=device)
        optimizer = torch.optim.Adam(network.parameters(), lr=float(self.lr), weight_decay=float(self.weight_decay))
        warmup = int(self.warmup)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup)
                                                     if warmup else 1.0)
        rng = np.random.default_rng(seed)
        n = self._n(features)
        history: dict[str, Any] = {"rank": basis.rank_, "train_loss": [], "val": [], "best_epoch": None}
        best, best_state, waited, cache = -np.inf, None, 0, {}
        starts = []
        for start in self.encoder_.warm_starts(network, features, psi, target):
            if val is None:
                starts.append(start)
                break  # the first start, nothing to choose with
            score = self._val_score(self._forward(network, val["features"], device), basis, val, cache)
            starts.append({**start, "val": score if val["metric"] == "mrr" else -score})
            if score > best:  # best_epoch -1: the start itself, kept unless an epoch ranks better
                best, history["best_epoch"] = score, -1
                best_state = {k: v.detach().clone() for k, v in network.state_dict().items()}
        if starts:
            history["warm_starts"] = starts
            if best_state is not None:
                network.load_state_dict(best_state)
        for epoch in range(int(self.epochs)):
            network.train()
            order = rng.permutation(n)
            total = 0.0
            for start in range(0, n, int(self.batch_size)):
                index = order[start:start + int(self.batch_size)]
                x = self.encoder_.to_tensor(self.encoder_.take(features, index), device)
                j = target[torch.as_tensor(index, device=device)]
                loss = loss_fn(network(x), psi[j], kyy[j]).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                total += float(loss.detach()) * len(index)
            history["train_loss"].append(total / n)
            if val is None:
                continue
            score = self._val_score(self._forward(network, val["features"], device), basis, val, cache)
            history["val"].append(score if val["metric"] == "mrr" else -score)
            if score > best:
                best, waited, history["best_epoch"] = score, 0, epoch
                best_state = {k: v.detach().clone() for k, v in network.state_dict().items()}
            else:
                waited += 1
                if waited >= int(self.patience):
                    break
        if best_state is not None:
            network.load_state_dict(best_state)
        history["val_metric"] = None if val is None else val["metric"]
        if int(self.rank_epochs) > 0 and val is not None and val["metric"] == "mrr":
            history["ranking"] = self._rank_member(network, basis, features, psi, target, val, cache, device, seed)
        network.eval()
        return network, history

    def _rank_member(self, network: torch.nn.Module, basis: SketchedOutputBasis, features: Any, psi: torch.Tensor,
                     target: torch.Tensor, val: dict, cache: dict, device: torch.device, seed: int) -> dict:
        """The ranking fine-tune of a trained member (in place); its history."""
        from molpredict.models.ranking_finetune import fit_ranking

        def predict(index: torch.Tensor) -> torch.Tensor:
            network.train()
            return network(self.encoder_.to_tensor(self.encoder_.take(features, index.cpu().numpy()), device))

        def evaluate() -> float:
            return self._val_score(self._forward(network, val["features"], device), basis, val, cache)

        def snapshot() -> dict:
            return {k: v.detach().clone() for k, v in network.state_dict().items()}

        start = snapshot()
        best, history = fit_ranking(list(network.parameters()), predict, psi, target, self._n(features), evaluate,
                                    snapshot, epochs=int(self.rank_epochs), lr=float(self.rank_lr),
                                    batch_size=int(self.batch_size), seed=seed)
        # the best check's state, or the trained member's when no check ranked better (undo the steps)
        network.load_state_dict(best if best is not None else start)
        return history

    def _loss_terms(self, gs: list[np.ndarray], psis: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """G (T, T) and b (T,) with mean ||sum_t w_t h_t(x) - psi_y(y)||^2 = w^T G w - 2 w^T b + mean k_y(y, y).

        G_st = mean_i g_s(x_i)^T C_st g_t(x_i), C_st = [<e^s_j, e^t_l>] the cross-Gram of the members' bases;
        b_t = mean_i g_t(x_i)^T psi~_t(y_i).
        """
        T = len(gs)
        G = np.zeros((T, T))
        for s in range(T):
            for t in range(s, T):
                # (g_s C) . g_t row by row, one GEMM (C = I for a member with itself): the three-operand einsum
                # this replaces does not use BLAS and took minutes for MassBank's 3-member ensemble
                left = gs[s] if s == t else gs[s] @ self.bases_[s].cross_gram(self.bases_[t])
                G[s, t] = G[t, s] = float(np.mean(np.sum(left * gs[t], axis=1)))
        b = np.array([float(np.mean(np.sum(g * p, axis=1))) for g, p in zip(gs, psis)])
        return G, b

    def _fit_weights(self, val: dict, device: torch.device) -> np.ndarray:
        """Simplex weights minimising the validation kernel loss of h = sum_t w_t h_t (a quadratic in w)."""
        from scipy.optimize import minimize
        T = len(self.networks_)
        gs = [self._forward(net, val["features"], device).double().cpu().numpy() for net in self.networks_]
        G, b = self._loss_terms(gs, [basis.coordinates(val["molecules"]) for basis in self.bases_])
        result = minimize(lambda w: w @ G @ w - 2 * w @ b, np.full(T, 1.0 / T),
                          jac=lambda w: 2 * G @ w - 2 * b, method="SLSQP", bounds=[(0.0, 1.0)] * T,
                          constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0}])
        w = np.clip(result.x, 0.0, None)
        return w / w.sum()

    def kernel_loss(self, inputs: Sequence[Any], molecules: Sequence[Any]) -> float:
        """Mean ||h(x) - psi_y(y)||^2 of the weighted-mean predictor h = sum_t w_t h_t on labelled pairs."""
        self._check_fitted()
        molecules = list(molecules)
        gs = self.member_predictions(inputs)
        G, b = self._loss_terms(gs, [basis.coordinates(molecules) for basis in self.bases_])
        kyy = float(np.mean(self.bases_[0].diagonal(molecules)))
        return float(self.weights_ @ G @ self.weights_ - 2 * self.weights_ @ b + kyy)

    def _check_fitted(self) -> None:
        if not hasattr(self, "networks_"):
            raise RuntimeError("DSOKR is not fitted: call fit(inputs, molecules) first")

    # -- prediction --------------------------------------------------------------------------------------
    def member_predictions(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """g_t(x) for every member, each of shape (n_inputs, p_t), float64."""
        self._check_fitted()
        inputs = list(inputs)
        if not inputs:
            return [np.zeros((0, b.rank_)) for b in self.bases_]
        device = torch.device(self.device_)
        features = self.encoder_.featurize(inputs)
        return [self._forward(net, features, device).double().cpu().numpy() for net in self.networks_]

    def _scales(self) -> np.ndarray:
        return np.sqrt(self.weights_) if self.combine == "mean" else np.ones(len(self.networks_))

    def predict_coordinates(self, inputs: Sequence[Any]) -> np.ndarray:
        """Concatenated sqrt(w_t) g_t(x), shape (n_inputs, sum_t p_t)."""
        parts = self.member_predictions(inputs)
        return np.concatenate([s * p for s, p in zip(self._scales(), parts)], axis=1)

    def candidate_coordinates(self, molecules: Sequence[Any]) -> np.ndarray:
        """Concatenated sqrt(w_t) psi~_t(c), shape (n_molecules, sum_t p_t)."""
        self._check_fitted()
        molecules = list(molecules)
        parts = [b.coordinates(molecules) for b in self.bases_]
        return np.concatenate([s * p for s, p in zip(self._scales(), parts)], axis=1)

    @property
    def dot_product_scores(self) -> bool:
        """``combine="mean"`` scores by the dot product of the concatenated coordinates; ``"max"`` does not."""
        return self.combine == "mean"

    def score_coordinates(self, predictions: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Scores from :meth:`predict_coordinates` and :meth:`candidate_coordinates` outputs.

        Returns
        -------
        ndarray of shape (n_inputs, n_candidates): the dot product for ``mean``, the max over members for ``max``.
        """
        if self.combine == "mean":
            return predictions @ candidates.T
        bounds = np.cumsum([0] + [b.rank_ for b in self.bases_])
        return np.max(np.stack([predictions[:, a:z] @ candidates[:, a:z].T
                                for a, z in zip(bounds[:-1], bounds[1:])]), axis=0)

    def validation_metrics(self, inputs: Sequence[Any], molecules: Sequence[Any], candidates: Any = None
                           ) -> dict[str, float]:
        """Mean hit@1/5/10 and MRR of decoding labelled inputs (candidates as in :func:`candidate_sets`)."""
        sets = candidate_sets(list(molecules), candidates)
        return coordinate_metrics(self.predict_coordinates(inputs), self.candidate_coordinates(sets.pool), sets,
                                  scorer=self.score_coordinates)

    # -- state -------------------------------------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        self._check_fitted()
        arrays, encoder_meta = self.encoder_.get_state()
        arrays = dict(arrays)
        members = []
        for t, (basis, network) in enumerate(zip(self.bases_, self.networks_)):
            basis_arrays, basis_meta = basis.get_state(prefix=f"output.{t}")
            arrays.update(basis_arrays)
            arrays.update(state_dict_to_arrays(network, f"network.{t}"))
            members.append(basis_meta)
        params = {k: v for k, v in self.get_params().items()}
        metadata = {
            "params": params,
            "encoder": {"spec": nested_spec(self.encoder), "state": encoder_meta},
            "output": {"members": members, "weights": [float(w) for w in self.weights_], "combine": self.combine},
            "history": self.history_,
        }
        return arrays, metadata

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "DSOKR":
        from molpredict.registry import create
        try:
            model = cls(**metadata["params"])
            output = metadata["output"]
            encoder_meta = metadata["encoder"]
        except (KeyError, TypeError) as exc:
            raise ModelFileError(f"dsokr state is incomplete or foreign: {exc}") from None
        model.encoder_ = create("encoder", encoder_meta["spec"]).set_state(arrays, encoder_meta["state"])
        model.bases_, model.networks_ = [], []
        for t, basis_meta in enumerate(output["members"]):
            basis = SketchedOutputBasis.from_state(arrays, basis_meta, prefix=f"output.{t}")
            network = model.encoder_.build(basis.rank_)
            _load_state_dict(network, arrays, f"network.{t}")
            network.eval()
            model.bases_.append(basis)
            model.networks_.append(network)
        model.weights_ = np.asarray(output["weights"], dtype=np.float64)
        model.history_ = metadata.get("history", [])
        from molpredict.engine.device import resolve_device
        from molpredict.errors import ResourceError
        try:
            device = resolve_device(model.device)
        except ResourceError:  # trained on a GPU, reloaded where there is none
            device = torch.device("cpu")
        model.networks_ = [net.to(device) for net in model.networks_]
        model.device_ = str(device)
        return model
