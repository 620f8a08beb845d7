"""The peak-formula set encoder for DSOKR (``formula-transformer``): a transformer over the peaks of a spectrum,
each read as the sub-formulas of the precursor ion that explain it (after MIST's formula transformer).

Tokens (:func:`peak_tokens`), one per peak plus one for the precursor, each a fixed-width float vector
(:data:`N_FEATURES` columns, layout in :data:`COLUMNS`):

- the precursor ion formula comes from the spectrum's ``formula`` and adduct
  (:func:`molpredict.chem.formulas.precursor_ion_formula`); the spectrum's peaks are cleaned as the spectrum kernels
  clean them (finite, positive, intensities relative to the largest) and the ``max_peaks`` most intense are kept;
- a peak token carries its m/z, relative intensity (raw, square root and log), its intensity rank, the m/z
  distance to the precursor, and up to ``explanations`` sub-formulas of the ion explaining it within
  ``max(mz_tolerance, precision / 2, ppm * 1e-6 * m/z)`` (as the ``formula-annotation`` kernel), the closest in
  mass first: per explanation the element counts of the fragment and of the neutral loss (ion minus fragment)
  over :data:`ELEMENTS` (other elements share one column), their RDBE, and the signed mass error in units of the
  tolerance and in ppm;
- a peak no sub-formula explains (or any peak of a spectrum without a formula) is a "no formula" token: type
  column ``unexplained`` set, explanation slots empty;
- the precursor token carries the ion formula's element counts (in the first fragment slot), the precursor m/z,
  the adduct (one-hot over :data:`ADDUCT_NAMES`, others share a column), the ion mode, and the collision energy
  where it parses (:func:`collision_energy`).

The network (:class:`PeakSetTransformer`) embeds each token with a two-layer MLP, runs a pre-norm
``torch.nn.TransformerEncoder`` *without positional encoding* (key padding masks hide the padding), and pools the
mean of all real token states and the precursor token's state into DSOKR's coordinates (a zero-initialised
linear head, so g(x) = 0 before training). Its output does not depend on the order of the tokens.

Not DSOKR's default: on validation (train_pos, val_pos in its formula256 sets, see
``docs/benchmarks/formula_transformer.md``) it reached hit@1 21.1% against 32.5% for SISOKR, and added to SISOKR's
score it did not help. A query without a formula gets "no formula" tokens only (encoding it once per candidate
formula is not implemented).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from molpredict.chem.formulas import VALENCE, explain_masses, precursor_ion_formula, subformula_table
from molpredict.chem.molecules import ELECTRON_MASS, parse_adduct
from molpredict.engine.encoders import Encoder
from molpredict.errors import InputError, SpecError
from molpredict.kernels.spectra import _clean_peaks, _precision_of

__all__ = ["ELEMENTS", "ADDUCT_NAMES", "COLUMNS", "N_FEATURES", "PeakTokens", "collision_energy", "peak_tokens",
           "PeakSetTransformer", "FormulaTransformerEncoder"]

#: element columns of a formula vector; any other element is counted in a last "other" column
ELEMENTS = ("C", "H", "N", "O", "P", "S", "F", "Cl", "Br", "I", "Si", "Se", "B", "Na", "K")
#: adduct one-hot columns (canonical names); any other adduct sets the last column
ADDUCT_NAMES = ("[M+H]+", "[M+Na]+", "[M+NH4]+", "[M]+", "[M-H2O+H]+", "[M+K]+", "[M-H]-", "[M+HCOO]-",
                "[M+CH3COO]-", "[M+Cl]-", "[M-H2O-H]-")
#: element counts and RDBE are divided by this (a count of 10 reads 1.0)
COUNT_SCALE = 10.0
_N_ELEM = len(ELEMENTS) + 1
_SLOT = 2 * _N_ELEM + 5  # present, error/tolerance, error ppm / 10, fragment RDBE, loss RDBE, fragment, loss


def _columns(explanations: int) -> dict[str, Any]:
    """Column layout of a token: name -> column index, or (start, stop) for a block."""
    cols: dict[str, Any] = {}
    names = ["precursor", "explained", "unexplained", "mz", "intensity", "sqrt_intensity", "log_intensity",
             "rank", "loss_mz", "has_formula", "ion_mode", "ce", "ce_normalized", "ce_known"]
    for i, name in enumerate(names):
        cols[name] = i
    at = len(names)
    cols["adduct"] = (at, at + len(ADDUCT_NAMES) + 1)
    at += len(ADDUCT_NAMES) + 1
    for s in range(explanations):
        cols[f"slot{s}"] = (at, at + _SLOT)
        at += _SLOT
    cols["width"] = at
    return cols


#: slot-relative offsets
_PRESENT, _ERR_TOL, _ERR_PPM, _RDBE_F, _RDBE_L, _FRAG, _LOSS = 0, 1, 2, 3, 4, 5, 5 + _N_ELEM
#: the layout with the default 3 explanations
COLUMNS = _columns(3)
N_FEATURES = COLUMNS["width"]

_CE_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def collision_energy(text: Any) -> tuple[float, bool] | None:
    """(energy, normalised) from free text such as ``"20"``, ``"30 eV"``, ``"35 % (nominal)"``, ``"20(NCE)"``,
    ``"10-40 eV"`` (a ramp: its mean) or ``"HCD 45"``; None when no number parses. ``normalised`` is True for
    NCE / percent values."""
    if text is None:
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return (float(text), False) if math.isfinite(text) else None
    text = str(text)
    numbers = [float(n) for n in _CE_NUMBER.findall(text.replace("-", " "))][:2]
    if not numbers:
        return None
    normalised = "%" in text or "nce" in text.lower()
    return float(np.mean(numbers)), normalised


def _element_column(element: str) -> int:
    try:
        return ELEMENTS.index(element)
    except ValueError:
        return len(ELEMENTS)


def _rdbe(counts: np.ndarray, valence: np.ndarray) -> np.ndarray:
    """RDBE ``1 + sum n_e (v_e - 2) / 2`` of count rows (..., n_elements)."""
    return 1.0 + counts @ ((valence - 2.0) / 2.0)


_VALENCE = np.array([VALENCE.get(e, 2) for e in ELEMENTS] + [2], dtype=np.float64)


@dataclass
class PeakTokens:
    """Token tables of ``n`` spectra: spectrum ``s`` owns rows ``offsets[s]:offsets[s + 1]`` of ``tokens``
    (its precursor token first, then its peaks by decreasing intensity).

    Attributes
    ----------
    offsets : ndarray of shape (n + 1,), int64
    tokens : ndarray of shape (n_tokens, width), float32
    """

    offsets: np.ndarray
    tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def take(self, index: np.ndarray) -> "PeakTokens":
        rows = np.asarray(index, dtype=np.int64)
        counts = np.diff(self.offsets)[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        entries = np.repeat(self.offsets[:-1][rows] - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        return PeakTokens(offsets, self.tokens[entries])

    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens padded to the longest spectrum: (n, L, width) float32 and the padding mask (n, L), True at
        padding."""
        counts = np.diff(self.offsets)
        width = int(counts.max(initial=1))
        x = np.zeros((len(self), width, self.tokens.shape[1]), dtype=np.float32)
        pad = np.ones((len(self), width), dtype=bool)
        row = np.repeat(np.arange(len(self)), counts)
        col = np.arange(self.tokens.shape[0]) - np.repeat(self.offsets[:-1], counts)
        x[row, col] = self.tokens
        pad[row, col] = False
        return x, pad


def _spectrum_tokens(spectrum: Any, cols: dict[str, Any], explanations: int, max_peaks: int, ppm: float,
                     mz_tolerance: float) -> np.ndarray:
    """The token rows of one spectrum, shape (1 + n_peaks, width)."""
    mz, rel = _clean_peaks(spectrum)
    if mz.size > max_peaks:
        keep = np.sort(np.argsort(-rel, kind="stable")[:max_peaks])
        mz, rel = mz[keep], rel[keep]
    order = np.argsort(-rel, kind="stable")  # by decreasing intensity
    mz, rel = mz[order], rel[order]
    n = mz.size
    out = np.zeros((1 + n, cols["width"]), dtype=np.float32)
    prec = out[0]
    prec[cols["precursor"]] = 1.0
    precursor_mz = spectrum.precursor_mz if spectrum.precursor_mz is not None else float("nan")
    if math.isfinite(precursor_mz):
        prec[cols["mz"]] = precursor_mz / 1000.0
    mode = spectrum.ion_mode or ("negative" if (spectrum.charge or 1) < 0 else "positive")
    prec[cols["ion_mode"]] = 1.0 if mode == "positive" else -1.0
    a0, a1 = cols["adduct"]
    if spectrum.adduct:
        try:
            name = parse_adduct(spectrum.adduct).name
            prec[a0 + (ADDUCT_NAMES.index(name) if name in ADDUCT_NAMES else len(ADDUCT_NAMES))] = 1.0
        except InputError:
            prec[a1 - 1] = 1.0
    ce = collision_energy(spectrum.metadata.get("collision_energy"))
    if ce is not None:
        prec[cols["ce"]] = ce[0] / 100.0
        prec[cols["ce_normalized"]] = float(ce[1])
        prec[cols["ce_known"]] = 1.0
    peaks = out[1:]
    peaks[:, cols["mz"]] = mz / 1000.0
    peaks[:, cols["intensity"]] = rel
    peaks[:, cols["sqrt_intensity"]] = np.sqrt(rel)
    peaks[:, cols["log_intensity"]] = np.maximum(np.log(np.maximum(rel, 1e-12)), -10.0) / 10.0
    peaks[:, cols["rank"]] = np.arange(n) / max(max_peaks, 1)
    if math.isfinite(precursor_mz):
        peaks[:, cols["loss_mz"]] = (precursor_mz - mz) / 1000.0
    peaks[:, cols["unexplained"]] = 1.0
    ion = precursor_ion_formula(spectrum)
    if ion is None:
        return out
    counts, sign = ion
    ion_vec = np.zeros(_N_ELEM)
    for element, k in counts.items():
        ion_vec[_element_column(element)] += k
    s0 = cols["slot0"][0]
    prec[cols["has_formula"]] = 1.0
    prec[s0 + _PRESENT] = 1.0
    prec[s0 + _FRAG: s0 + _FRAG + _N_ELEM] = ion_vec / COUNT_SCALE
    prec[s0 + _RDBE_F] = _rdbe(ion_vec, _VALENCE) / COUNT_SCALE
    peaks[:, cols["has_formula"]] = 1.0
    if n == 0:
        return out
    table = subformula_table(counts)
    floor = max(mz_tolerance, 0.5 * _precision_of(spectrum)) if spectrum.mz_precision else mz_tolerance
    tolerance = np.maximum(floor, ppm * 1e-6 * mz)
    peak, _, error, ch, het = explain_masses(table, mz + sign * ELECTRON_MASS, tolerance, parts=True)
    if peak.size == 0:
        return out
    # the `explanations` closest sub-formulas per peak
    order = np.lexsort((np.abs(error), peak))
    peak, error, ch, het = peak[order], error[order], ch[order], het[order]
    start = np.r_[0, np.flatnonzero(np.diff(peak)) + 1]
    rank = np.arange(peak.size) - np.repeat(start, np.diff(np.r_[start, peak.size]))
    keep = rank < explanations
    peak, error, ch, het, rank = peak[keep], error[keep], ch[keep], het[keep], rank[keep]
    frag = np.zeros((peak.size, _N_ELEM))
    for j, element in enumerate(table.ch_elements):
        frag[:, _element_column(element)] += table.ch_counts[ch, j]
    for j, element in enumerate(table.het_elements):
        frag[:, _element_column(element)] += table.het_counts[het, j]
    loss = ion_vec[None, :] - frag
    _fill_slots(peaks, cols, explanations, peak, rank, error, tolerance, mz, frag, loss)
    explained = np.unique(peak)
    peaks[explained, cols["explained"]] = 1.0
    peaks[explained, cols["unexplained"]] = 0.0
    return out


def _fill_slots(peaks: np.ndarray, cols: dict[str, Any], explanations: int, peak: np.ndarray, rank: np.ndarray,
                error: np.ndarray, tolerance: np.ndarray, mz: np.ndarray, frag: np.ndarray, loss: np.ndarray
                ) -> None:
    """Write explanation ``rank`` of ``peak`` into its slot of the peak token rows (in place)."""
    for s in range(explanations):
        at = np.flatnonzero(rank == s)
        if not at.size:
            continue
        p = peak[at]
        base = cols[f"slot{s}"][0]
        peaks[p, base + _PRESENT] = 1.0
        peaks[p, base + _ERR_TOL] = error[at] / tolerance[p]
        peaks[p, base + _ERR_PPM] = error[at] / mz[p] * 1e6 / 10.0
        peaks[p, base + _RDBE_F] = _rdbe(frag[at], _VALENCE) / COUNT_SCALE
        peaks[p, base + _RDBE_L] = _rdbe(loss[at], _VALENCE) / COUNT_SCALE
        peaks[p, base + _FRAG: base + _FRAG + _N_ELEM] = frag[at] / COUNT_SCALE
        peaks[p, base + _LOSS: base + _LOSS + _N_ELEM] = loss[at] / COUNT_SCALE


def peak_tokens(spectra: Sequence[Any], explanations: int = 3, max_peaks: int = 40, ppm: float = 10.0,
                mz_tolerance: float = 0.005) -> PeakTokens:
    """The tokens of spectra (see the module docstring).

    Parameters
    ----------
    spectra : sequence of Spectrum, length n
    explanations : int
        Sub-formulas kept per peak (the closest in mass first).
    max_peaks : int
        The most intense peaks kept per spectrum.
    ppm, mz_tolerance : float
        The annotation tolerance, as the ``formula-annotation`` kernel's.

    Returns
    -------
    PeakTokens with n spectra, ``width = _columns(explanations)["width"]``
    """
    cols = _columns(int(explanations))
    parts = [_spectrum_tokens(s, cols, int(explanations), int(max_peaks), float(ppm), float(mz_tolerance))
             for s in spectra]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([p.shape[0] for p in parts], out=offsets[1:])
    tokens = np.concatenate(parts) if parts else np.zeros((0, cols["width"]), dtype=np.float32)
    return PeakTokens(offsets, tokens)


class PeakSetTransformer(nn.Module):
    """Token MLP, a pre-norm transformer encoder without positional encoding, and a pooled zero-initialised head.

    ``forward((x, pad))`` with x (batch, L, width) float32 and pad (batch, L) bool (True at padding) returns
    (batch, out_dim): the head applied to [mean of the real tokens' states, the precursor token's state].
    """

    def __init__(self, width: int, precursor_column: int, d_model: int, nhead: int, layers: int,
                 dim_feedforward: int, dropout: float, out_dim: int) -> None:
        super().__init__()
        self.precursor_column = int(precursor_column)
        self.embed = nn.Sequential(nn.Linear(width, d_model), nn.ReLU(), nn.Linear(d_model, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(2 * d_model)
        self.head = nn.Linear(2 * d_model, out_dim)
        nn.init.zeros_(self.head.weight)  # g(x) = 0 before training (see encoders.mlp_layers)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, pad = batch
        hidden = self.body(self.embed(x), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        is_prec = (x[..., self.precursor_column:self.precursor_column + 1] * keep)
        prec = (hidden * is_prec).sum(1) / is_prec.sum(1).clamp(min=1.0)
        return self.head(self.norm(torch.cat([mean, prec], dim=1)))


class FormulaTransformerEncoder(Encoder):
    """Peaks as sub-formula tokens, read by a small set transformer (registry name ``formula-transformer``).

    Parameters
    ----------
    explanations : int
        Sub-formulas kept per peak (closest mass first).
    max_peaks : int
        The most intense peaks kept per spectrum.
    ppm, mz_tolerance : float
        Annotation tolerance (as the ``formula-annotation`` kernel).
    d_model, nhead, layers, dim_feedforward, dropout
        Transformer size. With the defaults (d 64, 2 layers) an epoch over train_pos (46,529 spectra) took about
        40 CPU seconds on one thread, validation ranking included; d 128 about twice as long.
    """

    input_type = "spectrum"

    def __init__(self, explanations: int = 3, max_peaks: int = 40, ppm: float = 10.0, mz_tolerance: float = 0.005,
                 d_model: int = 64, nhead: int = 4, layers: int = 2, dim_feedforward: int = 128,
                 dropout: float = 0.1) -> None:
        self.explanations = explanations
        self.max_peaks = max_peaks
        self.ppm = ppm
        self.mz_tolerance = mz_tolerance
        self.d_model = d_model
        self.nhead = nhead
        self.layers = layers
        self.dim_feedforward = dim_feedforward
        self.dropout = dropout

    def _check(self) -> None:
        if int(self.explanations) < 1 or int(self.max_peaks) < 1 or int(self.layers) < 1:
            raise SpecError("formula-transformer: explanations, max_peaks and layers must be >= 1")
        if int(self.d_model) % int(self.nhead):
            raise SpecError(f"formula-transformer: d_model ({self.d_model}) must be a multiple of nhead "
                            f"({self.nhead})")

    def fit(self, inputs: Sequence[Any], device: torch.device | None = None) -> "FormulaTransformerEncoder":
        self._check()
        self.fitted_ = True
        return self

    def featurize(self, inputs: Sequence[Any]) -> PeakTokens:
        return peak_tokens(list(inputs), int(self.explanations), int(self.max_peaks), float(self.ppm),
                           float(self.mz_tolerance))

    def take(self, features: PeakTokens, index: np.ndarray) -> PeakTokens:
        return features.take(index)

    def to_tensor(self, features: PeakTokens, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x, pad = features.padded()
        return torch.from_numpy(x).to(device), torch.from_numpy(pad).to(device)

    def build(self, out_dim: int) -> nn.Module:
        self._check()
        cols = _columns(int(self.explanations))
        return PeakSetTransformer(cols["width"], cols["precursor"], int(self.d_model), int(self.nhead),
                                  int(self.layers), int(self.dim_feedforward), float(self.dropout), out_dim)

    def set_state(self, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> "FormulaTransformerEncoder":
        self._check()
        self.fitted_ = True
        return self
